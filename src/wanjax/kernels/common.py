"""Helpers shared by the attention kernels: padding, block fitting, interpret mode."""

from __future__ import annotations

import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp

from wanjax.errors import ConfigError

LANES = 128  # TPU vector lane width: kernel blocks and padded head dims are multiples of it
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)  # finite, so fully masked tiles give no NaN


class InterpretModeWarning(UserWarning):
    """A TPU kernel runs in Pallas interpret mode (no TPU here): correct but slow, for testing."""


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def pad_axis(x: jax.Array, axis: int, size: int) -> jax.Array:
    """Zero-pad ``x`` at the end of ``axis`` up to ``size``."""
    pad = size - x.shape[axis]
    if pad <= 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths)


def head_major(x: jax.Array, length: int, dim: int) -> jax.Array:
    """``(B, L, H, D)`` -> ``(B*H, length, dim)``, zero-padded along L and D."""
    b, _, h, _ = x.shape
    x = x.transpose(0, 2, 1, 3).reshape(b * h, x.shape[1], x.shape[3])
    return pad_axis(pad_axis(x, 1, length), 2, dim)


def from_head_major(x: jax.Array, batch: int, length: int, dim: int) -> jax.Array:
    """``(B*H, L', D')`` -> ``(B, length, H, dim)``, dropping padding."""
    x = x[:, :length, :dim]
    return x.reshape(batch, -1, length, dim).transpose(0, 2, 1, 3)


def check_block(name: str, value: int, multiple: int = LANES) -> None:
    if value <= 0 or value % multiple:
        raise ConfigError(f"attention block size {name}={value} must be a positive multiple of {multiple}")


def fit_blocks(
    q_len: int, k_len: int, bq: int, bkv: int, bkv_compute: int, bkv_compute_in: int
) -> tuple[int, int, int, int]:
    """Validated block sizes shrunk to the problem: ``bkv_compute_in | bkv_compute | bkv``.

    Requested sizes must be multiples of 128 and nest (``bkv % bkv_compute == 0``, ...); blocks
    longer than the (128-rounded) sequence are cut down, keeping the nesting.
    """
    for name, value in (
        ("bq", bq),
        ("bkv", bkv),
        ("bkv_compute", bkv_compute),
        ("bkv_compute_in", bkv_compute_in),
    ):
        check_block(name, value)
    if bkv % bkv_compute or bkv_compute % bkv_compute_in:
        raise ConfigError(
            f"attention blocks must nest: bkv={bkv} a multiple of bkv_compute={bkv_compute}, "
            f"itself a multiple of bkv_compute_in={bkv_compute_in}"
        )
    k_round = round_up(k_len, LANES)
    bkv_compute_in = min(bkv_compute_in, k_round)
    bkv_compute = round_up(min(bkv_compute, k_round), bkv_compute_in)
    bkv = round_up(min(bkv, k_round), bkv_compute)
    return min(bq, round_up(q_len, LANES)), bkv, bkv_compute, bkv_compute_in


class AttentionProblem(NamedTuple):
    """A TPU kernel's inputs: ``(B, L, H, D)`` arrays, the score scale, the four block sizes
    ``(bq, bkv, bkv_compute, bkv_compute_in)`` and an optional local window."""

    q: jax.Array
    k: jax.Array
    v: jax.Array
    scale: float
    blocks: tuple[int, int, int, int]
    window_size: int | None = None


class Padding(NamedTuple):
    """A kernel problem's block sizes and the lengths it is padded to."""

    blocks: tuple[int, int, int, int]
    q_pad: int
    k_pad: int
    d_pad: int


def pad_to_blocks(q: jax.Array, k: jax.Array, blocks: tuple[int, int, int, int]) -> Padding:
    """Fit ``blocks`` to ``(B, L, H, D)`` queries/keys; pad lengths to whole blocks, D to the lanes."""
    q_len, k_len, dim = q.shape[1], k.shape[1], q.shape[3]
    bq, bkv, bkv_compute, bkv_compute_in = fit_blocks(q_len, k_len, *blocks)
    return Padding(
        (bq, bkv, bkv_compute, bkv_compute_in),
        round_up(q_len, bq),
        round_up(k_len, bkv),
        round_up(dim, LANES),
    )


def use_interpret(backend: str) -> bool:
    """True (with a warning) when a TPU kernel must run in Pallas interpret mode."""
    if jax.default_backend() == "tpu":
        return False
    warnings.warn(
        f"attention backend {backend!r} is a TPU kernel; on {jax.default_backend()} it runs in Pallas "
        "interpret mode, which is for testing only (slow)",
        InterpretModeWarning,
        stacklevel=4,
    )
    return True
