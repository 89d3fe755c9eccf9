"""A block-sparse self-attention mask, static and hashable: which key blocks each query block sees.

:class:`BlockMask` holds a host bool table ``(ceil(L / block), ceil(L / block))`` over a sequence of
``length`` tokens: query ``i`` attends to key ``j`` when ``table[i // block, j // block]``. It is a
static part of a program (a field of :class:`~wanjax.kernels.attention.AttentionSpec`, hashed by its
bytes), so every backend reads it when tracing: ``xla`` gathers each query block's kept key blocks
(:meth:`BlockMask.kept_blocks`), the splash kernels skip the empty blocks of its element mask
(:meth:`BlockMask.elements`). ``q_offset`` is the first local query's position: under the all-gather
form of sequence parallelism each device attends its own rows (:meth:`BlockMask.shard`).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

__all__ = ["BlockMask"]


@dataclasses.dataclass(frozen=True, eq=False)
class BlockMask:
    """``table[a, b]``: queries of block ``a`` see keys of block ``b`` (``block`` tokens each) over a
    sequence of ``length`` tokens; local queries start at ``q_offset``. Equal by value."""

    table: np.ndarray
    block: int
    length: int
    q_offset: int = 0

    def __post_init__(self) -> None:
        table = np.array(self.table, dtype=bool)
        blocks = -(-self.length // self.block)
        if table.shape != (blocks, blocks):
            raise ValueError(
                f"a block mask of {self.length} tokens in blocks of {self.block} is "
                f"({blocks}, {blocks}), got {table.shape}"
            )
        table.flags.writeable = False
        object.__setattr__(self, "table", table)

    @functools.cached_property
    def _key(self) -> tuple:
        return (self.table.tobytes(), self.block, self.length, self.q_offset)

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BlockMask) and self._key == other._key

    def __repr__(self) -> str:
        return (
            f"BlockMask(length={self.length}, block={self.block}, q_offset={self.q_offset}, "
            f"density={self.density:.4f})"
        )

    @property
    def density(self) -> float:
        """The kept fraction of the table's blocks."""
        return float(self.table.mean())

    def shard(self, index: int, count: int) -> BlockMask:
        """The mask of the ``index``-th of ``count`` equal query shards (its rows, at their offset)."""
        if self.length % count:
            raise ValueError(f"{self.length} tokens do not split into {count} query shards")
        return dataclasses.replace(self, q_offset=self.q_offset + index * (self.length // count))

    def rows(self, q_len: int) -> np.ndarray:
        """The table's row index of each of ``q_len`` local queries (past the end: the last row)."""
        return np.minimum((self.q_offset + np.arange(q_len)) // self.block, self.table.shape[0] - 1)

    def elements(self, q_len: int, k_len: int | None = None) -> np.ndarray:
        """The element mask ``(q_len, k_len)`` of ``q_len`` local queries (``k_len``: default the
        length; keys past the length are masked)."""
        k_len = self.length if k_len is None else k_len
        cols = np.arange(k_len) // self.block
        valid = np.arange(k_len) < self.length
        return self.table[self.rows(q_len)][:, np.minimum(cols, self.table.shape[1] - 1)] & valid

    def coarse(self, q_len: int, k_len: int) -> np.ndarray:
        """The table over ``q_len`` local queries (a multiple of ``block``, starting on a block
        boundary) and ``k_len`` keys in blocks: ``(q_len / block, k_len / block)``, keys past the
        length masked, queries past the end as the last row."""
        rows = self.rows(q_len)[:: self.block]
        starts = np.arange(0, k_len, self.block)
        cols = np.minimum(starts // self.block, self.table.shape[1] - 1)
        return self.table[rows][:, cols] & (starts < self.length)[None, :]

    def kept_blocks(self, q_len: int, q_block: int) -> tuple[np.ndarray, np.ndarray]:
        """``(indices, counts)`` for local query blocks of ``q_block`` tokens: the key blocks any of
        the block's queries sees, ascending, padded with the last kept index to the largest count
        (``indices (n_q_blocks, max_count)``), and how many each block has (``counts``)."""
        rows = self.rows(-(-q_len // q_block) * q_block).reshape(-1, q_block)
        kept = [np.flatnonzero(self.table[np.unique(r)].any(axis=0)) for r in rows]
        counts = np.array([len(k) for k in kept], np.int32)
        indices = np.zeros((len(kept), max(1, counts.max())), np.int32)
        for i, k in enumerate(kept):
            indices[i, : len(k)] = k
            indices[i, len(k) :] = k[-1] if len(k) else 0
        return indices, counts
