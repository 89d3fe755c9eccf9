"""A cache that cannot be written never stops a run: one warning naming the folder, where it came
from and the fix, then the run goes on without it (the JAX compilation cache, the attention tune
cache) or with a temporary folder (the demo model).

Folders are made unwritable by putting them under a regular file (``ENOTDIR``), which holds for
root too."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import pytest

from wanjax.chips import DEFAULT_BLOCKS
from wanjax.io.paths import CacheWarning, locate_cache_root, scratch_dir, writable_dir
from wanjax.kernels import tuning
from wanjax.pipeline.demo import demo_model_dir, is_demo_model
from wanjax.runtime import child_compile
from wanjax.runtime.jax_cache import enable_compilation_cache, resolve_cache_dir

JAX_SETTINGS = (
    "jax_enable_compilation_cache",
    "jax_compilation_cache_dir",
    "jax_persistent_cache_min_entry_size_bytes",
    "jax_persistent_cache_min_compile_time_secs",
)
CACHE_VARIABLES = (
    "WANJAX_CACHE",
    "XDG_CACHE_HOME",
    "WANJAX_JAX_CACHE_DIR",
    "JAX_COMPILATION_CACHE_DIR",
    "WANJAX_ATTENTION_TUNE_FILE",
)
TINY_RUN = ("--prompt", "a cat", "--frames", "1", "--height", "32", "--width", "32")
TINY_RUN += ("--num_inference_steps", "1", "--dtype", "float32")


@pytest.fixture
def blocked(tmp_path) -> Path:
    """A folder that cannot be created: its parent is a regular file."""
    parent = tmp_path / "a_file"
    parent.write_text("")
    return parent / "cache"


@pytest.fixture
def jax_config():
    """JAX's process-wide cache settings, restored after the test (nothing is compiled meanwhile)."""
    saved = {name: getattr(jax.config, name) for name in JAX_SETTINGS}
    yield
    for name, value in saved.items():
        jax.config.update(name, value)


@pytest.fixture
def clean_env(monkeypatch):
    for name in CACHE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_writable_dir_is_created_and_left_clean(tmp_path, recwarn):
    folder = tmp_path / "a" / "b"
    assert writable_dir(folder, "the test cache", "never mind")
    assert folder.is_dir() and not list(folder.iterdir())
    assert not recwarn.list


def test_unwritable_dir_warns_once_naming_it(blocked):
    with pytest.warns(CacheWarning) as caught:
        assert not writable_dir(blocked, "the test cache (from $X)", "going on without it")
    assert [str(w.message) for w in caught] == [
        f"the test cache (from $X) is not writable: {blocked} (Not a directory); going on without it"
    ]


def test_an_existing_read_only_dir_is_caught(tmp_path, monkeypatch):
    """An existing folder passes ``mkdir``; the temporary file is what finds it read-only (patched in:
    root writes in any folder that is not on a read-only mount)."""

    def read_only(**kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), kwargs["dir"])

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", read_only)
    with pytest.warns(CacheWarning, match="Read-only file system"):
        assert not writable_dir(tmp_path, "the test cache", "going on without it")


def test_no_home_directory_means_a_temporary_cache(clean_env):
    def no_home(cls):
        raise RuntimeError("Could not determine home directory.")

    clean_env.setattr(Path, "home", classmethod(no_home))
    with pytest.warns(CacheWarning, match=r"no home directory.*set \$WANJAX_CACHE"):
        assert locate_cache_root() == (scratch_dir(), "$HOME")


@pytest.mark.parametrize(
    ("variable", "source", "subfolder"),
    [
        ("WANJAX_JAX_CACHE_DIR", "$WANJAX_JAX_CACHE_DIR", ""),
        ("WANJAX_CACHE", "$WANJAX_CACHE", "jax"),
        ("XDG_CACHE_HOME", "$XDG_CACHE_HOME", "wanjax/jax"),
        ("HOME", "$HOME", ".cache/wanjax/jax"),
    ],
)
def test_the_jax_cache_dir_and_its_source(clean_env, jax_config, tmp_path, variable, source, subfolder):
    jax.config.update("jax_compilation_cache_dir", None)
    clean_env.setenv(variable, str(tmp_path))
    assert resolve_cache_dir() == (tmp_path / subfolder, source)
    assert resolve_cache_dir(tmp_path / "flag") == (tmp_path / "flag", "--jax_cache_dir")
    assert resolve_cache_dir("off") == (None, "--jax_cache_dir")


def test_a_jax_configured_dir_names_its_variable(clean_env, jax_config, tmp_path):
    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    assert resolve_cache_dir() == (tmp_path, "jax.config")
    clean_env.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path))
    assert resolve_cache_dir() == (tmp_path, "$JAX_COMPILATION_CACHE_DIR")


def test_an_unwritable_jax_cache_is_turned_off(clean_env, jax_config, tmp_path, blocked):
    assert enable_compilation_cache(tmp_path / "jax") == tmp_path / "jax"
    assert jax.config.jax_enable_compilation_cache and child_compile.executable_store() is not None
    clean_env.setenv("WANJAX_JAX_CACHE_DIR", str(blocked))
    with pytest.warns(CacheWarning) as caught:
        assert enable_compilation_cache() is None
    (warning,) = caught
    assert f"(from $WANJAX_JAX_CACHE_DIR) is not writable: {blocked}" in str(warning.message)
    assert "--jax_cache_dir off" in str(warning.message)
    assert not jax.config.jax_enable_compilation_cache and child_compile.executable_store() is None


def test_an_unwritable_tune_cache_is_read_as_empty_and_not_stored(blocked):
    path = blocked / "tune.json"
    assert tuning.lookup("key", "kind", path) == DEFAULT_BLOCKS
    with pytest.warns(CacheWarning, match=r"attention tune cache is not writable.*--tune_file"):
        assert tuning.store("key", "kind", (1, 2, 3, 4), path) is None


def test_an_unwritable_cache_gets_a_temporary_demo_model(blocked):
    with pytest.warns(CacheWarning, match=r"the wanjax cache is not writable.*set \$WANJAX_CACHE"):
        found = demo_model_dir(blocked)
    assert found.parent == scratch_dir() and is_demo_model(found)
    written = (found / "model_index.json").stat().st_mtime_ns
    with pytest.warns(CacheWarning):
        assert demo_model_dir(blocked) == found
    assert (found / "model_index.json").stat().st_mtime_ns == written  # generated once per process


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flags", "variables", "expected"),
    [
        (
            ["--jax_cache_dir", "{blocked}"],
            {},
            ["the JAX compilation cache (from --jax_cache_dir) is not writable: {blocked} ("],
        ),
        (
            [],
            {"WANJAX_JAX_CACHE_DIR": "{blocked}"},
            ["the JAX compilation cache (from $WANJAX_JAX_CACHE_DIR) is not writable: {blocked} ("],
        ),
        (
            [],
            {"WANJAX_CACHE": "{blocked}"},
            [
                "the JAX compilation cache (from $WANJAX_CACHE) is not writable: {blocked}/jax (",
                "the wanjax cache is not writable: {blocked} (",
            ],
        ),
        (
            [],
            {"HOME": "{blocked}", "WANJAX_CACHE": None},
            [
                "the JAX compilation cache (from $HOME) is not writable: {blocked}/.cache/wanjax/jax (",
                "the wanjax cache is not writable: {blocked}/.cache/wanjax (",
            ],
        ),
    ],
    ids=["--jax_cache_dir", "WANJAX_JAX_CACHE_DIR", "WANJAX_CACHE", "HOME"],
)
def test_generate_runs_with_one_warning_per_unwritable_cache(
    demo_env, tmp_path, blocked, flags, variables, expected
):
    """The whole command, in a process of its own (JAX's settings are process-wide): exit 0, the video
    written, and stderr holds one warning line per cache, naming where its folder came from."""
    env = {k: v for k, v in os.environ.items() if k not in CACHE_VARIABLES}
    env.update(JAX_PLATFORMS="cpu", WANJAX_CACHE=str(demo_env))  # the demo model, once per module
    for name, value in variables.items():
        if value is None:
            del env[name]
        else:
            env[name] = value.format(blocked=blocked)
    output = tmp_path / "out.mp4"
    args = ["generate", "--model", "demo", *TINY_RUN, "--output_video", str(output)]
    args += [flag.format(blocked=blocked) for flag in flags]
    result = subprocess.run(
        [sys.executable, "-m", "wanjax.cli", *args], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert output.stat().st_size > 0
    warnings = [line for line in result.stderr.splitlines() if line.startswith("wanjax: warning:")]
    assert len(warnings) == len(expected), result.stderr
    for line, needle in zip(warnings, expected, strict=True):
        assert needle.format(blocked=blocked) in line, line


@pytest.mark.parametrize("source", ["flag", "variable"])
def test_a_remote_jax_cache_url_is_kept_as_it_is(clean_env, jax_config, monkeypatch, source):
    """``gs://bucket/jax`` (a TPU VM's usual cache) reaches JAX unchanged: a Path would fold ``//``."""
    url = "gs://my-bucket/wanjax/jax"
    if source == "variable":
        monkeypatch.setenv("WANJAX_JAX_CACHE_DIR", url)
    assert enable_compilation_cache(url if source == "flag" else None) == url
    assert jax.config.jax_compilation_cache_dir == url and jax.config.jax_enable_compilation_cache
    assert child_compile.executable_store() is None  # serialized executables stay local-only
    monkeypatch.delenv("WANJAX_JAX_CACHE_DIR", raising=False)
    assert resolve_cache_dir() == (url, "jax.config")


def test_the_compile_child_gets_this_process_device_count():
    """XLA_FLAGS is read once, when JAX starts: the child is told the device count this process has
    (a program built for 8 CPU devices is compiled for 8), replacing any count the flags name."""
    flags = child_compile.child_xla_flags("--xla_cpu_foo=1 --xla_force_host_platform_device_count=2", 8)
    assert flags == "--xla_cpu_foo=1 --xla_force_host_platform_device_count=8"
    assert child_compile.child_xla_flags("", 1) == "--xla_force_host_platform_device_count=1"
