"""Helpers shared by the attention kernels: padding, block fitting, interpret mode, and what choosing
a backend looks at (:class:`Platform`, :class:`AttentionShape`)."""

from __future__ import annotations

import dataclasses
import re
import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from wanjax.errors import ConfigError
from wanjax.kernels.precision import Precision, lax_precision
from wanjax.target import current_target

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
    ``(bq, bkv, bkv_compute, bkv_compute_in)``, an optional local window and an optional block mask
    (a :class:`~wanjax.kernels.block_mask.BlockMask`)."""

    q: jax.Array
    k: jax.Array
    v: jax.Array
    scale: float
    blocks: tuple[int, int, int, int]
    window_size: int | None = None
    block_mask: Any = None


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
    """True (with a warning) when a TPU kernel must run in Pallas interpret mode: the target is no TPU."""
    target = current_target()
    if not target.interprets_pallas:
        return False
    warnings.warn(
        f"attention backend {backend!r} is a TPU kernel; on {target.platform} it runs in Pallas "
        "interpret mode, which is for testing only (slow)",
        InterpretModeWarning,
        stacklevel=4,
    )
    return True


@dataclasses.dataclass(frozen=True)
class Platform:
    """The device the attention backends are chosen for: JAX's platform ``name`` (``cpu``, ``gpu``,
    ``tpu``) and, on NVIDIA GPUs, the CUDA compute capability ``cuda`` (``(9, 0)``: H100), ``None``
    elsewhere (ROCm GPUs included). :meth:`detect` reads the build target's; tests pass a simulated one."""

    name: str
    cuda: tuple[int, int] | None = None

    @classmethod
    def detect(cls) -> Platform:
        """The platform of the target programs are built for (:func:`~wanjax.target.current_target`)."""
        target = current_target()
        return cls(target.platform, target.cuda)


_LABEL = re.compile(
    r"attention_(?P<backend>\w+?)_B(?P<batch>\d+)_Lq(?P<q_len>\d+)_Lk(?P<k_len>\d+)_H(?P<heads>\d+)"
    r"_D(?P<head_dim>\d+)_(?P<dtype>[a-z]+\d*)(?:_W(?P<window>\d+))?"
)


@dataclasses.dataclass(frozen=True)
class AttentionShape:
    """What choosing an attention backend looks at: one call's head dim, dtype (a NumPy name, e.g.
    ``"bfloat16"``; any dtype-like is accepted), sizes (``None``: not known yet, e.g. in a pre-flight
    check) and local ``window`` (self-attention only; ``None``: global)."""

    head_dim: int
    dtype: str
    batch: int | None = None
    q_len: int | None = None
    k_len: int | None = None
    heads: int | None = None
    window: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "dtype", jnp.dtype(self.dtype).name)

    @classmethod
    def of(cls, q: jax.Array, k: jax.Array, window_size: int | None = None) -> AttentionShape:
        """The shape of ``attention(q, k, v)`` over ``(B, L, H, D)`` arrays; a window applies to
        self-attention (``Lq == Lk``) only, cross-attention stays global."""
        batch, q_len, heads, head_dim = q.shape
        window = window_size if q_len == k.shape[1] else None
        return cls(head_dim, q.dtype, batch, q_len, k.shape[1], heads, window)

    def label(self, backend: str) -> str:
        """``attention_<backend>_B.._Lq.._Lk.._H.._D.._<dtype>[_W..]``: the named scope each attention
        call runs in (it names the call's ops in profiles and jaxprs; :meth:`parse` reads it back)."""
        sizes = (self.batch, self.q_len, self.k_len, self.heads)
        if any(n is None for n in sizes):
            raise ValueError(f"a label needs every size, got {self}")
        b, lq, lk, h = sizes
        window = "" if self.window is None else f"_W{self.window}"
        return f"attention_{backend}_B{b}_Lq{lq}_Lk{lk}_H{h}_D{self.head_dim}_{self.dtype}{window}"

    @classmethod
    def parse(cls, text: str) -> list[tuple[str, AttentionShape]]:
        """Every ``(backend, shape)`` :meth:`label` wrote in ``text`` (e.g. a jaxpr equation's name stack)."""
        found = []
        for m in _LABEL.finditer(text):
            sizes = {k: int(m[k]) for k in ("batch", "q_len", "k_len", "heads", "head_dim")}
            window = None if m["window"] is None else int(m["window"])
            found.append((m["backend"], cls(dtype=m["dtype"], window=window, **sizes)))
        return found


def einsum_f32(spec: str, a: jax.Array, b: jax.Array, precision: Precision) -> jax.Array:
    """``jnp.einsum`` accumulating in float32, float32 inputs at ``precision``."""
    return jnp.einsum(
        spec, a, b, preferred_element_type=jnp.float32, precision=lax_precision(precision, a.dtype)
    )


def blocks_of(x: jax.Array, size: int) -> jax.Array:
    """``(..., L, D)`` -> ``(ceil(L/size), ..., size, D)``, zero-padded at the end."""
    pad = -x.shape[-2] % size
    if pad:
        x = jnp.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, pad), (0, 0)])
    x = x.reshape(*x.shape[:-2], x.shape[-2] // size, size, x.shape[-1])
    return jnp.moveaxis(x, -3, 0)
