"""GGUF's quantised blocks dequantised by JAX on the devices: the ``gguf`` package's NumPy formulas
(``gguf.quants``, 0.19), written for ``jax.numpy`` over any leading axes.

A block of ``block`` values is stored in ``size`` bytes (``gguf.GGML_QUANT_SIZES``): float16 scales
and packed integers. :func:`dequantize` takes an array of blocks ``(..., n, size)`` (uint8) and gives
``(..., n * block)`` float32, each value computed by the same float32 operations in the same order as
``gguf.quants.dequantize``, so the two agree bit for bit (``tests/test_gguf_kernel.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import gguf
import jax
import jax.numpy as jnp
from jax import lax

QK_K = 256  # the K-quants' super-block
_Q = gguf.GGMLQuantizationType


def _split(blocks: jax.Array, *sizes: int) -> list[jax.Array]:
    """The byte fields of each block, in order (the last takes the rest)."""
    out, start = [], 0
    for size in sizes:
        out.append(blocks[..., start : start + size])
        start += size
    out.append(blocks[..., start:])
    return out


def _f16(b: jax.Array) -> jax.Array:
    """Two little-endian bytes ``(..., 2)`` as one float16, in float32 ``(..., 1)``."""
    return lax.bitcast_convert_type(b, jnp.float16).astype(jnp.float32)[..., None]


def _shifted(b: jax.Array, shifts: list[int], group: int) -> jax.Array:
    """``b (..., k * group)`` as ``(..., k, len(shifts), group)``, each copy shifted right by its amount."""
    lead = b.shape[:-1]
    b = b.reshape(*lead, -1, 1, group)
    return b >> jnp.asarray(shifts, b.dtype).reshape(len(shifts), 1)


def _int8(b: jax.Array) -> jax.Array:
    return lax.bitcast_convert_type(b, jnp.int8)


def _q8_0(blocks: jax.Array) -> jax.Array:
    d, x = _split(blocks, 2)
    return _int8(x).astype(jnp.float32) * _f16(d)


def _q4_0(blocks: jax.Array) -> jax.Array:
    d, qs = _split(blocks, 2)
    q = (_shifted(qs, [0, 4], 16) & 0x0F).reshape(*qs.shape[:-1], 32)
    return _f16(d) * (q.astype(jnp.int8) - jnp.int8(8)).astype(jnp.float32)


def _q4_1(blocks: jax.Array) -> jax.Array:
    d, m, qs = _split(blocks, 2, 2)
    q = (_shifted(qs, [0, 4], 16) & 0x0F).reshape(*qs.shape[:-1], 32).astype(jnp.float32)
    return _f16(d) * q + _f16(m)


def _q5_bits(qh: jax.Array, qs: jax.Array) -> jax.Array:
    """The 32 five-bit values of a Q5_0/Q5_1 block: low nibbles of ``qs``, fifth bits of ``qh``."""
    lead = qs.shape[:-1]
    high = lax.bitcast_convert_type(qh, jnp.uint32)[..., None] >> jnp.arange(32, dtype=jnp.uint32)
    low = (_shifted(qs, [0, 4], 16) & 0x0F).reshape(*lead, 32)
    return low | ((high & 1).astype(jnp.uint8) << 4)


def _q5_0(blocks: jax.Array) -> jax.Array:
    d, qh, qs = _split(blocks, 2, 4)
    return _f16(d) * (_q5_bits(qh, qs).astype(jnp.int8) - jnp.int8(16)).astype(jnp.float32)


def _q5_1(blocks: jax.Array) -> jax.Array:
    d, m, qh, qs = _split(blocks, 2, 2, 4)
    return _f16(d) * _q5_bits(qh, qs).astype(jnp.float32) + _f16(m)


def _q2_k(blocks: jax.Array) -> jax.Array:
    scales, qs, d, dmin = _split(blocks, QK_K // 16, QK_K // 4, 2)
    lead = blocks.shape[:-1]
    dl = (_f16(d) * (scales & 0xF).astype(jnp.float32)).reshape(*lead, QK_K // 16, 1)
    ml = (_f16(dmin) * (scales >> 4).astype(jnp.float32)).reshape(*lead, QK_K // 16, 1)
    q = (_shifted(qs, [0, 2, 4, 6], 32) & 3).reshape(*lead, QK_K // 16, 16).astype(jnp.float32)
    return (dl * q - ml).reshape(*lead, QK_K)


def _q3_k(blocks: jax.Array) -> jax.Array:
    hmask, qs, scales, d = _split(blocks, QK_K // 8, QK_K // 4, 12)
    lead = blocks.shape[:-1]
    low = (_shifted(scales[..., :8], [0, 4], 8)).reshape(*lead, 16)
    high = (_shifted(scales[..., 8:], [0, 2, 4, 6], 4)).reshape(*lead, 16)
    sc = (low & 0x0F) | ((high & 0x03) << 4)
    sc = (sc.astype(jnp.int8) - jnp.int8(32)).astype(jnp.float32)
    dl = (_f16(d) * sc).reshape(*lead, 16, 1)
    ql = _shifted(qs, [0, 2, 4, 6], 32).reshape(*lead, 16, QK_K // 16) & 3
    qh = (_shifted(hmask, list(range(8)), 32).reshape(*lead, 16, QK_K // 16) & 1) ^ 1
    q = (ql.astype(jnp.int8) - (qh << 2).astype(jnp.int8)).astype(jnp.float32)
    return (dl * q).reshape(*lead, QK_K)


def _k_scale_min(scales: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The eight 6-bit scales and mins of a Q4_K/Q5_K super-block (12 packed bytes)."""
    lead = scales.shape[:-1]
    s = scales.reshape(*lead, 3, 4)
    d, m, m_d = s[..., 0, :], s[..., 1, :], s[..., 2, :]
    sc = jnp.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mins = jnp.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mins


def _k_scaled(d: jax.Array, dmin: jax.Array, scales: jax.Array, q: jax.Array) -> jax.Array:
    """``d·sc·q - dmin·m`` per 32 values of a Q4_K/Q5_K super-block."""
    lead = scales.shape[:-1]
    sc, mins = _k_scale_min(scales)
    dl = (_f16(d) * sc.astype(jnp.float32)).reshape(*lead, -1, 1)
    dm = (_f16(dmin) * mins.astype(jnp.float32)).reshape(*lead, -1, 1)
    return (dl * q - dm).reshape(*lead, QK_K)


def _q4_k(blocks: jax.Array) -> jax.Array:
    d, dmin, scales, qs = _split(blocks, 2, 2, 12)
    q = (_shifted(qs, [0, 4], 32) & 0x0F).reshape(*blocks.shape[:-1], -1, 32).astype(jnp.float32)
    return _k_scaled(d, dmin, scales, q)


def _q5_k(blocks: jax.Array) -> jax.Array:
    d, dmin, scales, qh, qs = _split(blocks, 2, 2, 12, QK_K // 8)
    lead = blocks.shape[:-1]
    ql = (_shifted(qs, [0, 4], 32) & 0x0F).reshape(*lead, -1, 32)
    high = (_shifted(qh, list(range(8)), 32) & 1).reshape(*lead, -1, 32)
    return _k_scaled(d, dmin, scales, (ql | (high << 4)).astype(jnp.float32))


def _q6_k(blocks: jax.Array) -> jax.Array:
    ql, qh, scales, d = _split(blocks, QK_K // 2, QK_K // 4, QK_K // 16)
    lead = blocks.shape[:-1]
    dl = (_f16(d) * _int8(scales).astype(jnp.float32)).reshape(*lead, QK_K // 16, 1)
    low = (_shifted(ql, [0, 4], 64) & 0x0F).reshape(*lead, -1, 32)
    high = (_shifted(qh, [0, 2, 4, 6], 32) & 0x03).reshape(*lead, -1, 32)
    q = ((low | (high << 4)).astype(jnp.int8) - jnp.int8(32)).reshape(*lead, QK_K // 16, -1)
    return (dl * q.astype(jnp.float32)).reshape(*lead, QK_K)


DEQUANTIZERS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "Q8_0": _q8_0,
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q2_K": _q2_k,
    "Q3_K": _q3_k,
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
}


def block_shape(qtype: str) -> tuple[int, int]:
    """``(values, bytes)`` per block of a GGML type."""
    block, size = gguf.GGML_QUANT_SIZES[_Q[qtype]]
    return int(block), int(size)


def dequantize(blocks: jax.Array, qtype: str) -> jax.Array:
    """Blocks ``(..., n, size)`` uint8 of type ``qtype`` -> their values ``(..., n * block)`` float32."""
    values = DEQUANTIZERS[qtype](blocks)
    return values.reshape(*blocks.shape[:-2], -1)
