"""Tensor references that stand for part of a stored tensor, or for it in another shape: what a
:class:`~wanjax.io.key_layouts.KeyLayout`'s ``views`` give for tensors a layout stores fused or
reshaped (Wan's CLIP stores q/k/v as one ``to_qkv`` tensor, its embeddings with a batch axis).

Each has the reference interface :meth:`~wanjax.io.checkpoint.LeafSource.read` uses (``shape``,
``dtype``, ``ref[index]`` with a slice per dimension, ``array()``) and reads from the stored reference
only the slice it is asked for, where the shapes allow.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Protocol

import numpy as np

from wanjax.io.checkpoint import Index


class Readable(Protocol):
    """A tensor reference: a file's tensor, or a view of one."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> np.dtype: ...

    def __getitem__(self, index: Index, /) -> np.ndarray: ...

    def array(self) -> np.ndarray: ...


def _whole(index: Index, ndim: int) -> Index:
    """``index`` with ``slice(None)`` for the dimensions it leaves out."""
    return (*index, *(slice(None),) * (ndim - len(index)))


def _as_slice(rows: range) -> slice:
    """The slice that selects ``rows`` of an axis (``range(n)[s]`` back to a slice)."""
    if not rows:
        return slice(0, 0)
    return slice(rows.start, rows.stop if rows.stop >= 0 else None, rows.step)


@dataclasses.dataclass(frozen=True)
class RowsRef:
    """Rows ``start:stop`` (of the first axis) of a stored tensor: one of the projections a fused
    tensor concatenates."""

    ref: Readable
    start: int
    stop: int

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.stop <= self.ref.shape[0]:
            raise ValueError(f"rows {self.start}:{self.stop} of a tensor of shape {tuple(self.ref.shape)}")

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.stop - self.start, *self.ref.shape[1:])

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.ref.dtype)

    def __getitem__(self, index: Index) -> np.ndarray:
        rows, *rest = _whole(index, len(self.shape))
        return self.ref[(_as_slice(range(self.start, self.stop)[rows]), *rest)]

    def array(self) -> np.ndarray:
        return self[()]


def _sizes(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(n for n in shape if n != 1)


@dataclasses.dataclass(frozen=True)
class ReshapedRef:
    """A stored tensor in another shape of the same size (an embedding without its batch axis). When
    the two shapes differ only by axes of size 1, a slice is read as the same slice of the stored
    tensor; otherwise from the whole tensor."""

    ref: Readable
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if math.prod(self.shape) != math.prod(self.ref.shape):
            raise ValueError(f"a tensor of shape {tuple(self.ref.shape)} cannot be read as {self.shape}")

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.ref.dtype)

    def __getitem__(self, index: Index) -> np.ndarray:
        index = _whole(index, len(self.shape))
        wanted = tuple(len(range(n)[s]) for n, s in zip(self.shape, index, strict=True))
        if _sizes(self.shape) != _sizes(tuple(self.ref.shape)) or 0 in wanted:
            return self.array()[index]
        kept = iter(s for n, s in zip(self.shape, index, strict=True) if n != 1)
        stored = tuple(slice(None) if n == 1 else next(kept) for n in self.ref.shape)
        return self.ref[stored].reshape(wanted)

    def array(self) -> np.ndarray:
        return self.ref.array().reshape(self.shape)
