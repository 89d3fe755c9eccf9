"""The library leaves process-wide state alone: no ``jax.config`` value and no environment variable
changes on import, on ``from_pretrained`` or in a run, unless asked (the compilation cache); every
environment variable the code reads is named in ``docs/environment.md``."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.experimental.compilation_cache.compilation_cache import reset_cache

from wanjax import WanPipeline
from wanjax.runtime import child_compile
from wanjax.runtime.jax_cache import enable_compilation_cache, persistent_cache_off

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "wanjax"
PAGE = ROOT / "docs" / "environment.md"
ENV_SHAPE = re.compile(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+$")  # WANJAX_CACHE, XLA_FLAGS, ...


@pytest.fixture
def jax_config():
    """``jax.config`` as it was, restored after the test (and JAX's persistent cache started afresh)."""
    saved = dict(jax.config.values)
    yield saved
    for name, value in saved.items():
        if jax.config.values.get(name) != value:
            jax.config.update(name, value)
    reset_cache()


def changed(before: dict, after: dict) -> dict:
    return {
        k: (before.get(k), after.get(k))
        for k in before.keys() | after.keys()
        if before.get(k) != after.get(k)
    }


def test_importing_wanjax_changes_nothing():
    """Every module imported in a fresh process: jax.config and the environment as they were."""
    code = """
import os, pkgutil, importlib, jax
config, env = dict(jax.config.values), dict(os.environ)
import wanjax
for m in pkgutil.walk_packages(wanjax.__path__, "wanjax."):
    if not m.name.endswith("__main__"):  # the CLI entry point runs the command
        try:
            importlib.import_module(m.name)
        except ImportError:  # an optional extra (serve) not installed
            pass
assert dict(jax.config.values) == config, "jax.config changed"
assert dict(os.environ) == env, "os.environ changed"
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.slow
def test_from_pretrained_and_a_run_leave_jax_config_and_the_environment_alone(
    demo_env, jax_config, monkeypatch
):
    env = dict(os.environ)
    pipe = WanPipeline.from_pretrained("demo")
    assert changed(jax_config, dict(jax.config.values)) == {}
    pipe.vae.compile_in_child = True  # the compile child too (on the CPU; at any size)
    built, compile_in_child = [], child_compile.compile_in_child
    monkeypatch.setattr(
        child_compile, "compile_in_child", lambda *a: built.append(a[0]) or compile_in_child(*a)
    )
    video = pipe("a cat", num_inference_steps=2, height=32, width=48, num_frames=5, progress=False)
    assert video.frames.shape == (1, 5, 32, 48, 3) and built
    assert changed(jax_config, dict(jax.config.values)) == {}
    assert dict(os.environ) == env


def test_the_compilation_cache_is_opt_in(demo_env, jax_config, tmp_path):
    for leave in (None, False):
        WanPipeline.from_pretrained("demo", jax_cache_dir=leave)
        assert changed(jax_config, dict(jax.config.values)) == {}
    WanPipeline.from_pretrained("demo", jax_cache_dir=tmp_path / "jax")
    assert jax.config.jax_enable_compilation_cache
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "jax")
    WanPipeline.from_pretrained("demo", jax_cache_dir="off")
    assert not jax.config.jax_enable_compilation_cache


def test_the_cache_turned_off_or_moved_after_a_compile_is_off_or_moved(jax_config, tmp_path):
    """JAX settles its cache at a process's first compile; wanjax's setting holds from the next on."""

    def entries(folder: Path) -> int:
        return len(list(folder.glob("jit_*")))

    first, second = tmp_path / "first", tmp_path / "second"
    enable_compilation_cache(first)
    jax.jit(lambda x: x + 1)(np.ones(3))
    assert entries(first) == 1
    enable_compilation_cache("off")
    jax.jit(lambda x: x + 2)(np.ones(3))
    assert entries(first) == 1
    enable_compilation_cache(second)
    jax.jit(lambda x: x + 3)(np.ones(3))
    with persistent_cache_off():
        jax.jit(lambda x: x + 4)(np.ones(3))
    jax.jit(lambda x: x + 5)(np.ones(3))
    assert (entries(first), entries(second)) == (1, 2)


def variables_read() -> dict[str, set[str]]:
    """Each environment variable the code names, and the modules naming it: every ``WANJAX_*`` and
    ``HF_*`` word, every ``$NAME`` in a docstring or message, and, in a module that reads
    ``os.environ``/``getenv``, every string constant shaped like a variable's name (``$A``, one
    letter, is a tokenizer template's)."""
    found: dict[str, set[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text()
        names = set(re.findall(r"\b(?:WANJAX|HF)_[A-Z0-9_]+", text)) | set(
            re.findall(r"\$([A-Z][A-Z0-9_]+)", text)
        )
        if re.search(r"\b(environ|getenv)\b", text):
            constants = (n.value for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Constant))
            names |= {c for c in constants if isinstance(c, str) and ENV_SHAPE.match(c)}
        for name in names:
            found.setdefault(name, set()).add(str(path.relative_to(SRC)))
    return found


def test_every_environment_variable_is_documented():
    found = variables_read()
    assert {"WANJAX_CACHE", "WANJAX_JAX_CACHE_DIR", "WANJAX_ATTENTION_TUNE_FILE", "XLA_FLAGS"} <= found.keys()
    page = PAGE.read_text()
    missing = {name: sorted(where) for name, where in found.items() if f"`{name}`" not in page}
    assert not missing, f"name these in {PAGE.relative_to(ROOT)} (read in): {missing}"
