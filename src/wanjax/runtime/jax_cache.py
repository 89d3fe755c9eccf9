"""The persistent JAX compilation cache, so a second run of a shape compiles nothing.

It is JAX's process-wide configuration, so it is turned on only when asked: by the CLI (every
command, unless ``--jax_cache_dir off``) or ``WanPipeline.from_pretrained(jax_cache_dir=...)``;
:func:`enable_compilation_cache` then sets ``jax_enable_compilation_cache``,
``jax_compilation_cache_dir``, ``jax_persistent_cache_min_entry_size_bytes`` (-1) and
``jax_persistent_cache_min_compile_time_secs`` (0). Nothing else in wanjax changes this process's
``jax.config`` (a compile child sets its own, see :mod:`wanjax.runtime.child_compile`).

The directory is, in order: the value passed in (the ``--jax_cache_dir`` flag), ``$WANJAX_JAX_CACHE_DIR``,
a directory already configured for JAX (``$JAX_COMPILATION_CACHE_DIR`` or ``jax.config``), else
``<wanjax cache>/jax`` (see :func:`wanjax.io.paths.cache_root`). ``off`` (or ``none``) disables it.
A URL (``gs://bucket/jax`` on a TPU VM) is handed to JAX as it is.
Every program is cached, however small or quick to compile.

A directory that cannot be written never stops a run: it is reported once (a
:class:`~wanjax.io.paths.CacheWarning` naming it and the setting it came from) and the cache stays
off. Should an entry fail to be written later, JAX itself warns and goes on (unless
``jax_raise_persistent_cache_errors`` is set).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import jax
from jax.experimental.compilation_cache.compilation_cache import reset_cache

from wanjax.io.paths import locate_cache_root, writable_dir

ENV_VAR = "WANJAX_JAX_CACHE_DIR"
JAX_ENV_VAR = "JAX_COMPILATION_CACHE_DIR"
OFF = ("off", "none", "")
FIX = (
    f"running without it: give a writable folder (--jax_cache_dir, ${ENV_VAR} or $WANJAX_CACHE) "
    "or --jax_cache_dir off"
)


def is_remote(directory: str | Path) -> bool:
    """A URL such as ``gs://bucket/jax`` (JAX reads and writes it through its own file layer)."""
    return "://" in str(directory)


def resolve_cache_dir(directory: str | Path | None = None) -> tuple[Path | str | None, str]:
    """The cache directory to use (``None``: disabled; a remote URL stays a string, since a ``Path``
    would fold its ``//``) and the setting it came from (``--jax_cache_dir`` for ``directory``, else a
    variable's name with its ``$`` or ``jax.config``)."""
    source = "--jax_cache_dir"
    if directory is None:
        directory, source = os.environ.get(ENV_VAR), f"${ENV_VAR}"
    if directory is None:
        configured = jax.config.jax_compilation_cache_dir
        if configured:
            source = f"${JAX_ENV_VAR}" if os.environ.get(JAX_ENV_VAR) else "jax.config"
            return (configured if is_remote(configured) else Path(configured)), source
        root, source = locate_cache_root()
        return root / "jax", source
    if str(directory).strip().lower() in OFF:
        return None, source
    if is_remote(directory):
        return str(directory).strip(), source
    return Path(directory).expanduser(), source


def enable_compilation_cache(directory: str | Path | None = None) -> Path | str | None:
    """Turn the persistent compilation cache on (see the module docstring); returns its directory
    (``None``: off, as asked or because it cannot be written; a remote URL is passed to JAX as it is,
    unchecked: JAX warns and goes on if it cannot write there).

    It holds from the next compile on, also in a process that has compiled with another setting.
    """
    path, source = resolve_cache_dir(directory)
    local = path is not None and not is_remote(path)
    if local and not writable_dir(path, f"the JAX compilation cache (from {source})", FIX):
        path = None
    if path is not None:
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    _set_cache(path is not None, None if path is None else str(path))
    return path


@contextlib.contextmanager
def persistent_cache_off() -> Iterator[None]:
    """JAX's persistent compilation cache off for a block, then as it was."""
    was = _cache_setting()
    _set_cache(False, None)
    try:
        yield
    finally:
        _set_cache(*was)


def _cache_setting() -> tuple[bool, str | None]:
    return jax.config.jax_enable_compilation_cache, jax.config.jax_compilation_cache_dir


def _set_cache(enabled: bool, directory: str | None) -> None:
    """The cache on in ``directory`` (``None``: the one configured) or off, from the next compile on.
    JAX settles whether and where it caches at a process's first compile and keeps to that (jax 0.10:
    off or another folder later still reads and writes the first): a change starts it afresh."""
    was = _cache_setting()
    jax.config.update("jax_enable_compilation_cache", enabled)
    if directory is not None:
        jax.config.update("jax_compilation_cache_dir", directory)
    if _cache_setting() != was:
        reset_cache()
