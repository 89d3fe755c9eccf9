"""wanjax's cache folder, and what a cache that cannot be written does: it never stops a run.

The folder (:func:`cache_root`) holds the built-in demo model, the JAX compilation cache and the
attention tune cache. A cache that cannot be written is reported as a :class:`CacheWarning` naming
the folder and the fix (:func:`writable_dir`, :func:`warn_unwritable`), and the run goes on without
it, or with a temporary folder removed at exit (:func:`scratch_dir`). Every cache and environment
variable wanjax uses is listed in ``docs/environment.md``.
"""

from __future__ import annotations

import functools
import os
import tempfile
import warnings
from pathlib import Path


class CacheWarning(UserWarning):
    """A cache could not be written; the run goes on without it. Each is issued from one line here,
    so Python's default filter shows a repeated one once."""


def locate_cache_root() -> tuple[Path, str]:
    """wanjax's cache folder and the setting that chose it: ``$WANJAX_CACHE``, else
    ``$XDG_CACHE_HOME/wanjax``, else ``$HOME/.cache/wanjax`` (with no home directory at all:
    :func:`scratch_dir`, with a warning)."""
    for variable, subfolder in (("WANJAX_CACHE", ""), ("XDG_CACHE_HOME", "wanjax")):
        if os.environ.get(variable):
            return Path(os.environ[variable]).expanduser() / subfolder, f"${variable}"
    try:
        return Path.home() / ".cache" / "wanjax", "$HOME"
    except RuntimeError:  # $HOME unset and no passwd entry
        warnings.warn(
            CacheWarning(
                "no home directory ($HOME is unset and this user has no passwd entry): caches are kept in "
                "a temporary folder for this run only; set $WANJAX_CACHE to a writable folder to keep them"
            ),
            stacklevel=1,
        )
        return scratch_dir(), "$HOME"


def cache_root() -> Path:
    """wanjax's cache folder (see :func:`locate_cache_root`)."""
    return locate_cache_root()[0]


def scratch_dir() -> Path:
    """A temporary folder of this process's own, removed at exit: the stand-in for an unwritable cache."""
    return Path(_scratch().name)


@functools.cache
def _scratch() -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix="wanjax-")  # kept by the cache; removed at exit


def writable_dir(path: Path, what: str, then: str) -> bool:
    """Whether ``path`` is a folder this process can write in: created if absent, then tried with a
    temporary file. If not, :func:`warn_unwritable` says so."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".wanjax-probe-"):
            pass
    except OSError as err:
        warn_unwritable(path, what, err, then)
        return False
    return True


def warn_unwritable(path: Path, what: str, err: OSError, then: str) -> None:
    """Warn (a :class:`CacheWarning`) that ``what`` (a cache, and where its folder came from) could not
    write ``path`` (``err``), and ``then``: what the run does instead, and the fix."""
    reason = err.strerror or type(err).__name__
    warnings.warn(CacheWarning(f"{what} is not writable: {path} ({reason}); {then}"), stacklevel=1)
