"""Atomic file output: write to a temporary name in the target directory, rename when complete.

An interrupted run (crash, Ctrl-C) leaves the previous file intact and no partial file behind; a
full disk is :class:`~wanjax.errors.DiskFull`, naming the folder and the file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

from wanjax.errors import DiskFull

_FULL = {errno.ENOSPC: "is full", errno.EDQUOT: "is over its quota"}  # the disk of the folder ...


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; it replaces ``path`` only if the block succeeds.
    Out of space (ENOSPC, EDQUOT, whichever write raised it): :class:`DiskFull`, the temporary file
    removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = path.parent / f".{path.stem}.{secrets.token_hex(6)}{path.suffix}.tmp"
    try:
        # Created with 0o666 minus the umask, as a plain open() would (mkstemp would give 0o600).
        os.close(os.open(tmp_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
        yield tmp_path
        os.replace(tmp_path, path)
    except OSError as e:
        if isinstance(e, DiskFull) or e.errno not in _FULL:
            raise
        full = DiskFull(
            f"the disk of {path.parent} {_FULL[e.errno]}: {path.name} was not written and nothing of it "
            "was kept; free space there, or write to another disk"
        )
        full.errno = e.errno  # (a strerror or filename would replace the message in str())
        raise full from e
    finally:
        tmp_path.unlink(missing_ok=True)


def write_text(path: str | Path, text: str) -> Path:
    """Atomically write ``text`` to ``path``."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)
