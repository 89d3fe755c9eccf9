"""The persistent JAX compilation cache: on by default, so a second run of a shape compiles nothing.

The directory is, in order: the value passed in (the ``--jax_cache_dir`` flag), ``$WANJAX_JAX_CACHE_DIR``,
a directory already configured for JAX (``$JAX_COMPILATION_CACHE_DIR`` or ``jax.config``), else
``<wanjax cache>/jax`` (see :func:`wanjax.pipeline.hub.cache_root`). ``off`` (or ``none``) disables it.
Every program is cached, however small or quick to compile.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax

from wanjax.io.paths import cache_root

ENV_VAR = "WANJAX_JAX_CACHE_DIR"
OFF = ("off", "none", "")


def resolve_cache_dir(directory: str | Path | None = None) -> Path | None:
    """The cache directory to use (``None``: disabled)."""
    if directory is None:
        directory = os.environ.get(ENV_VAR)
    if directory is None:
        configured = jax.config.jax_compilation_cache_dir
        return Path(configured) if configured else cache_root() / "jax"
    if str(directory).strip().lower() in OFF:
        return None
    return Path(directory).expanduser()


def enable_compilation_cache(directory: str | Path | None = None) -> Path | None:
    """Turn the persistent compilation cache on (see the module docstring); returns its directory.

    JAX reads the setting when it first compiles; call this before any computation.
    """
    path = resolve_cache_dir(directory)
    if path is None:
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return path
