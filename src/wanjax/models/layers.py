"""Shared primitives: linear layers, norms, activations and the Wan 3D rotary embedding.

Conventions: params are plain dicts of arrays; a linear layer is ``{"kernel": (in, out), "bias": (out,)}``.
Matmuls take low-precision inputs and accumulate in float32 (``preferred_element_type``), rounding
once at the end, which is what the reference's oneDNN/cuBLAS kernels do and what runs fastest on
AMX/MXU/tensor cores. Norm statistics are always computed in float32. ``precision`` (see
:mod:`wanjax.kernels.precision`) sets how float32 operands are multiplied; it is ignored for 16-bit ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from wanjax.kernels.precision import Precision, lax_precision

Params = dict


def matmul(x: jax.Array, w: jax.Array, precision: Precision = "highest") -> jax.Array:
    """``x @ w`` with float32 accumulation; float32 inputs at ``precision`` (default: exact, also on TPU)."""
    return jnp.matmul(x, w, preferred_element_type=jnp.float32, precision=lax_precision(precision, x.dtype))


def linear(
    x: jax.Array, p: Params, out_dtype: jnp.dtype | None = None, precision: Precision = "highest"
) -> jax.Array:
    """``x @ kernel + bias``, accumulated in float32, returned in ``out_dtype`` (default: x's dtype)."""
    y = matmul(x.astype(p["kernel"].dtype), p["kernel"], precision)
    if "bias" in p:
        y = y + p["bias"].astype(jnp.float32)
    return y.astype(out_dtype or x.dtype)


def layer_norm(
    x: jax.Array, eps: float, scale: jax.Array | None = None, bias: jax.Array | None = None
) -> jax.Array:
    """LayerNorm over the last axis in float32 (biased variance), optionally affine; returns float32."""
    x = x.astype(jnp.float32)
    mean = jnp.mean(x, axis=-1, keepdims=True)
    centered = x - mean
    var = jnp.mean(jnp.square(centered), axis=-1, keepdims=True)
    y = centered * jax.lax.rsqrt(var + eps)
    if scale is not None:
        y = y * scale.astype(jnp.float32)
    if bias is not None:
        y = y + bias.astype(jnp.float32)
    return y


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """``torch.nn.RMSNorm``: all math in float32 (weight included), rounded once to x's dtype."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
    return (y * scale.astype(jnp.float32)).astype(x.dtype)


def gelu_tanh(x: jax.Array) -> jax.Array:
    """GELU with the tanh approximation, evaluated in float32."""
    return jax.nn.gelu(x.astype(jnp.float32), approximate=True).astype(x.dtype)


def silu(x: jax.Array) -> jax.Array:
    return jax.nn.silu(x.astype(jnp.float32)).astype(x.dtype)


# ----------------------------------------------------------------------------------------------
# Sinusoidal timestep embedding and 3D RoPE


def _timestep_frequencies(half: int, max_period: float = 10000.0) -> np.ndarray:
    exponent = np.float32(-math.log(max_period)) * np.arange(half, dtype=np.float32)
    return np.exp(exponent / np.float32(half)).astype(np.float32)


def timestep_embedding(timestep: jax.Array, dim: int) -> jax.Array:
    """diffusers ``Timesteps(dim, flip_sin_to_cos=True, downscale_freq_shift=0)``: [cos, sin], float32."""
    args = timestep.astype(jnp.float32)[:, None] * _timestep_frequencies(dim // 2)[None, :]
    emb = jnp.concatenate([jnp.cos(args), jnp.sin(args)], axis=-1)
    if dim % 2:
        emb = jnp.pad(emb, ((0, 0), (0, 1)))
    return emb


def rope_axis_dims(head_dim: int) -> tuple[int, int, int]:
    """Rotary dims per axis (t, h, w): h and w get ``2*(d//6)`` each, t the rest (44/42/42 for 128)."""
    hw = 2 * (head_dim // 6)
    return head_dim - 2 * hw, hw, hw


def _rope_axis_angles(dim: int, max_len: int, theta: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin of ``p * theta^(-2i/dim)`` for positions < max_len; float64 math, float32 result."""
    inv = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    angles = np.outer(np.arange(max_len, dtype=np.float64), inv)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def rope_tables(grid: tuple[int, int, int], head_dim: int, max_len: int) -> tuple[jax.Array, jax.Array]:
    """Per-token cos/sin of the Wan 3D RoPE, shape ``(L, head_dim // 2)`` in float32.

    Tokens are ordered row-major over (frame, row, column); rotation pairs ``[0, t/2)`` follow the
    frame index, the next ``h/2`` the row and the last ``w/2`` the column. Only the small per-axis
    tables are constants; the full table is broadcast inside the program.
    """
    cos_parts, sin_parts = [], []
    for axis, (size, dim) in enumerate(zip(grid, rope_axis_dims(head_dim), strict=True)):
        cos, sin = _rope_axis_angles(dim, max_len)
        shape = [1, 1, 1, dim // 2]
        shape[axis] = size
        full = (*grid, dim // 2)
        cos_parts.append(jnp.broadcast_to(jnp.asarray(cos[:size]).reshape(shape), full))
        sin_parts.append(jnp.broadcast_to(jnp.asarray(sin[:size]).reshape(shape), full))
    length = grid[0] * grid[1] * grid[2]
    cos = jnp.concatenate(cos_parts, axis=-1).reshape(length, head_dim // 2)
    sin = jnp.concatenate(sin_parts, axis=-1).reshape(length, head_dim // 2)
    return cos, sin


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate interleaved pairs ``(x[2i], x[2i+1])`` of ``x (B, L, H, D)`` by the per-token angles."""
    pairs = x.astype(jnp.float32).reshape(*x.shape[:-1], -1, 2)
    x1, x2 = pairs[..., 0], pairs[..., 1]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    out = jnp.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
    return out.reshape(x.shape).astype(x.dtype)


def scan_layers(
    body: Callable[[jax.Array, Params], jax.Array], carry: jax.Array, layers: Params
) -> jax.Array:
    """``carry = body(carry, layer_params)`` for each layer of the stacked ``layers`` (``lax.scan``).

    On CPU, XLA upcasts a bf16/f16 operand of the per-layer dynamic-slice to float32 and hoists that
    conversion out of the loop, so every call would convert all stacked weights (a float32 copy of
    the model). There the 16-bit leaves cross the loop as uint16 bit patterns, bitcast back (free).
    """
    dtypes = jax.tree.map(lambda a: a.dtype, layers)

    def packed(a: jax.Array) -> jax.Array:
        is_half = jnp.issubdtype(a.dtype, jnp.floating) and a.dtype.itemsize == 2
        return jax.lax.bitcast_convert_type(a, jnp.uint16) if is_half else a

    def step(c: jax.Array, p: Params) -> tuple[jax.Array, None]:
        p = jax.tree.map(lambda a, dt: a if a.dtype == dt else jax.lax.bitcast_convert_type(a, dt), p, dtypes)
        return body(c, p), None

    if jax.default_backend() == "cpu":
        layers = jax.tree.map(packed, layers)
    return jax.lax.scan(step, carry, layers)[0]
