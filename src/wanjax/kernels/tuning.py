"""Block sizes of the TPU kernels: defaults and the tune cache written by ``wanjax tune-attention``.

The cache is a small JSON file, ``{device_kind: {shape_key: [bq, bkv, bkv_compute, bkv_compute_in]}}``:
``$WANJAX_ATTENTION_TUNE_FILE``, else ``<wanjax cache>/attention_tuning.json``. :func:`lookup` reads
each path once per process and keeps its table (:func:`store` refreshes it; a file another process
rewrites is seen by the next process). An absent or unreadable file is an empty cache; one that
cannot be written is reported (a :class:`~wanjax.io.paths.CacheWarning`), never an error.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from pathlib import Path

from wanjax.chips import Blocks, attention_blocks
from wanjax.io.atomic import write_text
from wanjax.io.paths import cache_root, warn_unwritable
from wanjax.target import current_target


def default_blocks(kind: str, backend: str) -> Blocks:
    """The blocks ``backend`` gets on device ``kind`` when none are tuned or given (:mod:`wanjax.chips`)."""
    return attention_blocks(kind, backend)


def tune_file() -> Path:
    """Where the tune cache lives."""
    env = os.environ.get("WANJAX_ATTENTION_TUNE_FILE")
    return Path(env).expanduser() if env else cache_root() / "attention_tuning.json"


def device_kind() -> str:
    """The build target's device kind (the tune cache's key)."""
    return current_target().device_kind


def shape_key(backend: str, q_len: int, k_len: int, head_dim: int, dtype: str) -> str:
    """Cache key of one attention problem (batch and head counts only change the parallel grid extent)."""
    return f"{backend}:q{q_len}_k{k_len}_d{head_dim}_{dtype}"


def read_cache(path: Path | None = None) -> dict[str, dict[str, list[int]]]:
    """The cache's contents; an absent or unreadable file is an empty cache."""
    path = tune_file() if path is None else path
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@functools.cache
def _table(path: Path) -> Mapping[str, dict[str, list[int]]]:
    """The cache at ``path``, read once (a memo keyed by path; :func:`store` clears it)."""
    return read_cache(path)


def lookup(key: str, kind: str, path: Path | None = None) -> Blocks:
    """Tuned blocks for ``key`` on device ``kind``, else the kind's :func:`default_blocks`."""
    found = _table((tune_file() if path is None else path).expanduser()).get(kind, {}).get(key)
    if isinstance(found, list) and len(found) == 4 and all(isinstance(x, int) for x in found):
        return tuple(found)  # type: ignore[return-value]
    return default_blocks(kind, key.partition(":")[0])


def store(key: str, kind: str, blocks: Blocks, path: Path | None = None) -> Path | None:
    """Record ``blocks`` for ``key`` on ``kind`` (atomic rewrite of the file); returns its path, or
    ``None`` when it cannot be written (with a :class:`~wanjax.io.paths.CacheWarning`)."""
    path = tune_file() if path is None else path
    data = read_cache(path)
    data.setdefault(kind, {})[key] = list(blocks)
    try:
        write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n")
        _table.cache_clear()
    except OSError as err:
        kept = (
            "the tuned blocks are not kept: give --tune_file or $WANJAX_ATTENTION_TUNE_FILE a writable path"
        )
        warn_unwritable(path, "the attention tune cache", err, kept)
        return None
    return path
