"""Shared fixtures: tiny reference models built with diffusers and saved in the diffusers layout."""

from __future__ import annotations

import gc
import os

from helpers.processes import USERS_EMITTER, users_emitter_flags, with_test_compile_flags

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The tiny models' programs take most of the suite's time to compile: the suite and the processes it
# starts compile the CPU code at LLVM -O0 and with XLA's elemental fusion emitter (the programs'
# operations unchanged). Measured: -O0 12-26% less time on the fast path and the VAE and TPU
# compile-target files; the elemental emitter half the compile seconds of tests/test_vae22.py again.
# A flag already in XLA_FLAGS keeps its value.
os.environ["XLA_FLAGS"] = with_test_compile_flags(os.environ.get("XLA_FLAGS", ""))
# Eight CPU devices in this process, so mesh tests need no subprocess (read when the backend starts,
# below); the processes the tests start get the caller's XLA_FLAGS back.
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8"

import jax
import pytest
import torch
from helpers.models import TINY_DIT, save_transformer

from wanjax.runtime import jax_cache

assert jax.device_count() == 8, "jax's backend started before XLA_FLAGS was set"
os.environ["XLA_FLAGS"] = os.environ["XLA_FLAGS"].removesuffix(" --xla_force_host_platform_device_count=8")
if not os.environ["XLA_FLAGS"]:
    del os.environ["XLA_FLAGS"]
torch.set_num_threads(max(1, os.cpu_count() or 1))
# The references' modules (torch, diffusers, transformers, jax: ~500,000 objects) live to the end:
# frozen out of the cycle collector's reach, a full collection costs milliseconds instead of a
# quarter of a second (measured: 25 s of the fast path's 255 were the collections below).
gc.collect()
gc.freeze()


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """After each test module, the programs it compiled are dropped: one process holding every
    program of the suite runs out of memory mappings for LLVM's JIT code (vm.max_map_count, 65530:
    "LLVM compilation error: Cannot allocate memory", then an abort). What survives is frozen, so the
    next module's collection scans only what that module made (the fast path's peak memory and
    mappings measured unchanged)."""
    yield
    from wanjax.models.vae.programs import clear_programs

    clear_programs()
    jax.clear_caches()
    gc.collect()
    gc.freeze()


@pytest.fixture(scope="session")
def suite_jax_cache(tmp_path_factory):
    """One persistent JAX compilation cache for the whole session: both workers, and the processes
    the tests start (``$WANJAX_JAX_CACHE_DIR``), so a program the suite compiled once is read back
    instead of compiled again in another module or process. The commands the tests run leave
    ``--jax_cache_dir`` at its default, so they compile through it too; a test about the cache sets
    its own."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "jax_cache"
    folder.mkdir(exist_ok=True)
    os.environ.setdefault(jax_cache.ENV_VAR, str(folder))
    return folder


@pytest.fixture(autouse=True)
def _compile_through_the_suite_cache(suite_jax_cache):
    """Each test starts with the session's cache on in this process (a command a test ran in this
    process may have turned it off or moved it)."""
    jax_cache.enable_compilation_cache(suite_jax_cache)


@pytest.fixture(autouse=True)
def _commands_see_one_device(request, monkeypatch):
    """A command a test runs in this process picks its mesh as on a one-device host (a user's CPU),
    not over the eight devices this process has for the mesh tests: those name their mesh, or are
    marked ``all_devices`` to get the command's automatic mesh over all eight."""
    if request.node.get_closest_marker("all_devices") is None:
        from wanjax.jobs import opening

        monkeypatch.setattr(opening, "device_count", lambda: 1)


@pytest.fixture(autouse=True)
def _users_emitter(request, monkeypatch):
    """A test marked ``bit_for_bit`` compiles with XLA's fusion emitters, as a user's run does: it
    compares two programs' bits, which the elemental emitter of the suite's other tests may round
    differently in the last bit. Its programs are compiled afresh and dropped after it."""
    if request.node.get_closest_marker("bit_for_bit") is None:
        yield
        return
    from jax._src import compiler

    get_compile_options = compiler.get_compile_options

    def with_users_emitter(*args, env_options_overrides=None, **kwargs):
        overrides = {USERS_EMITTER: True, **(env_options_overrides or {})}
        return get_compile_options(*args, env_options_overrides=overrides, **kwargs)

    from wanjax.models.vae.programs import clear_programs

    clear_programs()
    jax.clear_caches()
    monkeypatch.setattr(compiler, "get_compile_options", with_users_emitter)
    monkeypatch.setenv("XLA_FLAGS", users_emitter_flags())  # and the processes it starts
    yield
    clear_programs()
    jax.clear_caches()


@pytest.fixture(autouse=True)
def _work_in_a_temporary_folder(tmp_path_factory, monkeypatch):
    """Each test runs in its own empty working folder: an output a run names by default (a timestamped
    mp4 and record) lands there, never in the checkout."""
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


@pytest.fixture(scope="session")
def tiny_transformer_dir(tmp_path_factory):
    """A tiny diffusers transformer saved to disk, with its torch model."""
    root = tmp_path_factory.mktemp("tiny_dit")
    model = save_transformer(root, seed=0, **TINY_DIT)
    return root, model


@pytest.fixture(scope="module")
def demo_env(tmp_path_factory):
    """WANJAX_CACHE pointing at a fresh folder (one per test module), so the demo model is generated there."""
    cache = tmp_path_factory.mktemp("wanjax_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANJAX_CACHE", str(cache))
        yield cache


@pytest.fixture(scope="session")
def postgres():
    """A private PostgreSQL server on 127.0.0.1 (:class:`helpers.postgres.PostgresServer`), started
    by the first test that asks for it."""
    from helpers.postgres import PostgresServer

    server = PostgresServer()
    yield server
    server.stop()


@pytest.fixture
def postgres_url(postgres):
    """A new empty database of :func:`postgres`."""
    import uuid

    return postgres.database(f"test_{uuid.uuid4().hex}")


@pytest.fixture(params=["sqlite", "postgresql"])
def store_and_fake_engine(tmp_path, request):
    """A job store (SQLite, or a PostgreSQL replica's) and a controllable engine
    (:class:`helpers.serve_fakes.FakeEngine`): a worker's bookkeeping without a model."""
    from helpers.serve_fakes import FakeEngine

    from wanjax.server.sqlite_store import SqliteJobStore

    if request.param == "sqlite":
        store = SqliteJobStore(tmp_path / "store")
    else:
        from wanjax.server.postgres_store import PostgresJobStore

        store = PostgresJobStore(request.getfixturevalue("postgres_url"), tmp_path / "store")
    yield store, FakeEngine(tmp_path)
    store.close()


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    """A T5-style tokenizer folder as the Wan repos hold it (:func:`helpers.tokenizer.make_tokenizer_dir`)."""
    from helpers.tokenizer import make_tokenizer_dir

    return make_tokenizer_dir(tmp_path_factory.mktemp("tok") / "tokenizer")


@pytest.fixture(scope="session")
def tiny_pipeline_dir(tmp_path_factory, tokenizer_dir):
    """A tiny random diffusers WanPipeline (UniPC, CFG) saved in the diffusers layout, shared by the
    parity tests (read-only: a test that writes files puts them elsewhere)."""
    from helpers.pipelines import build_tiny_pipeline

    root = tmp_path_factory.mktemp("wan_pipeline")
    build_tiny_pipeline(root, tokenizer_dir)
    return root
