"""Shared primitives: linear layers, norms, activations and the Wan 3D rotary embedding.

Conventions: params are plain dicts of arrays; a linear layer is ``{"kernel": (in, out), "bias": (out,)}``.
Matmuls take low-precision inputs and accumulate in float32 (``preferred_element_type``), rounding
once at the end, which is what the reference's oneDNN/cuBLAS kernels do and what runs fastest on
AMX/MXU/tensor cores. Norm statistics are always computed in float32. ``precision`` (see
:mod:`wanjax.kernels.precision`) sets how float32 operands are multiplied; it is ignored for 16-bit ones.

A kernel may be 8-bit (:class:`~wanjax.io.quant.QuantizedKernel`, ``--weights_dtype int8|fp8``): the
matmul dequantises it (:func:`quantized_matmul`); or GGUF blocks (:class:`~wanjax.io.gguf_kernel.GGUFKernel`,
``--weights_dtype gguf``), dequantised to the model dtype where the matmul reads them. A kernel
flagged ``w8a8`` multiplies int8 x int8 (:mod:`wanjax.models.w8a8`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from wanjax.io.gguf_kernel import GGUFKernel
from wanjax.io.quant import FP8, QMAX, QuantizedKernel
from wanjax.kernels.common import Platform
from wanjax.kernels.precision import Precision, lax_precision
from wanjax.models.w8a8 import w8a8_matmul
from wanjax.target import current_target

Params = dict
Kernel = jax.Array | QuantizedKernel | GGUFKernel


def matmul(x: jax.Array, w: Kernel, precision: Precision = "highest") -> jax.Array:
    """``x @ w`` with float32 accumulation; float32 inputs at ``precision`` (default: exact, also on TPU).
    An 8-bit ``w`` goes through :func:`quantized_matmul`; GGUF blocks are dequantised first; a kernel
    flagged W8A8 multiplies int8 x int8 (:func:`~wanjax.models.w8a8.w8a8_matmul`)."""
    if isinstance(w, QuantizedKernel | GGUFKernel) and w.w8a8:
        return w8a8_matmul(x, w)
    if isinstance(w, QuantizedKernel):
        return quantized_matmul(x, w, precision)
    if isinstance(w, GGUFKernel):
        w = w.dequantize()
    return jnp.matmul(x, w, preferred_element_type=jnp.float32, precision=lax_precision(precision, x.dtype))


def linear(
    x: jax.Array, p: Params, out_dtype: jnp.dtype | None = None, precision: Precision = "highest"
) -> jax.Array:
    """``x @ kernel + bias``, accumulated in float32, returned in ``out_dtype`` (default: x's dtype).
    ``x`` is cast to the kernel's dtype first (an 8-bit kernel's: the model dtype it stands for)."""
    y = matmul(x.astype(p["kernel"].dtype), p["kernel"], precision)
    if "bias" in p:
        y = y + p["bias"].astype(jnp.float32)
    return y.astype(out_dtype or x.dtype)


def quantized_matmul(
    x: jax.Array, kernel: QuantizedKernel, precision: Precision = "highest", platform: Platform | None = None
) -> jax.Array:
    """``x @ kernel`` for an 8-bit kernel, in float32: ``(x @ values) * scale``. The scale is per output
    channel, so it commutes with the matmul and is applied to its float32 result.

    Weight-only (every platform for int8; fp8 where the hardware does not multiply it): the values
    are converted to x's dtype inside the program (exact: int8 and e4m3 fit in bf16) and multiplied
    as :func:`matmul` does. An fp8 kernel on a platform that multiplies e4m3 natively
    (:func:`native_fp8`; ``platform``: the build target's unless given) multiplies in fp8: each row of
    ``x`` (a token) is scaled by its absmax to e4m3's range and rounded to e4m3, the product
    accumulates in float32 and both scales are applied to it.
    """
    scale = kernel.scale if kernel.ndim == 2 else jnp.expand_dims(kernel.scale, -2)
    if kernel.values.dtype == FP8 and native_fp8(platform):
        return _fp8_matmul(x, kernel.values) * scale
    values = kernel.values.astype(x.dtype)
    y = jnp.matmul(x, values, preferred_element_type=jnp.float32, precision=lax_precision(precision, x.dtype))
    return y * scale


def _fp8_matmul(x: jax.Array, values: jax.Array) -> jax.Array:
    """``x @ values`` with x rounded to e4m3 per row (absmax scaling) and both operands e4m3."""
    x32 = x.astype(jnp.float32)
    absmax = jnp.max(jnp.abs(x32), axis=-1, keepdims=True)
    row_scale = jnp.where(absmax > 0, absmax / QMAX[FP8], 1.0)
    xq = jnp.clip(x32 / row_scale, -QMAX[FP8], QMAX[FP8]).astype(FP8)
    return jnp.matmul(xq, values, preferred_element_type=jnp.float32) * row_scale


_TPU_GENERATION = re.compile(r"TPU\D*(\d+)")


def native_fp8(platform: Platform | None = None, device_kind: str | None = None) -> bool:
    """Whether the matrix units multiply float8_e4m3fn natively: an NVIDIA GPU of compute capability
    9.0 or more (Hopper, Blackwell) or a TPU of generation 7 or later (``device_kind``, e.g.
    ``TPU7x``). Defaults: the build target's platform and device kind; pass both to ask about
    another one (tests simulate platforms so)."""
    if platform is None:
        platform, device_kind = Platform.detect(), current_target().device_kind
    if platform.name == "gpu":
        return platform.cuda is not None and platform.cuda >= (9, 0)
    if platform.name == "tpu":
        found = _TPU_GENERATION.search(device_kind or "")
        return found is not None and int(found.group(1)) >= 7
    return False


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


def gelu(x: jax.Array) -> jax.Array:
    """Exact (erf) GELU, evaluated in float32."""
    return jax.nn.gelu(x.astype(jnp.float32), approximate=False).astype(x.dtype)


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
    body: Callable[[jax.Array, Params], jax.Array],
    carry: jax.Array,
    layers: Params,
    start: int = 0,
    stop: int | None = None,
) -> jax.Array:
    """``carry = body(carry, layer_params)`` for each layer of the stacked ``layers`` (``lax.scan``);
    ``start``/``stop``: only layers ``start .. stop-1`` (a loop over their indices, the weights
    sliced in place, never a copy of the sub-stack).

    On CPU, XLA upcasts a bf16/f16 (or float8) operand of the per-layer dynamic-slice to a wider
    float and hoists that conversion out of the loop, so every call would convert all stacked weights
    (a float32 copy of the model). There the 16-bit and 8-bit float leaves cross the loop as uint16 /
    uint8 bit patterns, bitcast back (free).
    """
    dtypes = jax.tree.map(lambda a: a.dtype, layers)
    n = jax.tree.leaves(layers)[0].shape[0]
    stop = n if stop is None else stop

    def packed(a: jax.Array) -> jax.Array:
        bits = {2: jnp.uint16, 1: jnp.uint8}.get(jnp.dtype(a.dtype).itemsize)
        is_narrow = jnp.issubdtype(a.dtype, jnp.floating) and bits is not None
        return jax.lax.bitcast_convert_type(a, bits) if is_narrow else a

    def unpacked(p: Params) -> Params:
        return jax.tree.map(
            lambda a, dt: a if a.dtype == dt else jax.lax.bitcast_convert_type(a, dt), p, dtypes
        )

    if current_target().platform == "cpu":
        layers = jax.tree.map(packed, layers)
    if (start, stop) == (0, n):
        return jax.lax.scan(lambda c, p: (body(c, unpacked(p)), None), carry, layers)[0]

    def indexed(c: jax.Array, i: jax.Array) -> tuple[jax.Array, None]:
        p = jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, i, keepdims=False), layers)
        return body(c, unpacked(p)), None

    return jax.lax.scan(indexed, carry, jnp.arange(start, stop, dtype=jnp.int32))[0]
