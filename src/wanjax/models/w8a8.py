"""W8A8 int8 matmuls (``--activations_dtype int8`` with ``--weights_dtype int8``): the DiT blocks'
attention projections (self and cross: q, k, v, out, the image keys and values) and FFN linears
multiply ``int8 x int8 -> int32``.

The formula is torchao's ``Int8DynamicActivationInt8WeightConfig`` (and qwix's symmetric int8): the
kernel per output channel as it is stored (:mod:`wanjax.io.quant`: ``scale = absmax / 127.5``,
values in ``[-128, 127]``); each token of the input (a row) by its own absmax the same way, inside
the program (dynamic: nothing calibrated); the product of the int8 values accumulated in int32 (exact),
converted to float32 and multiplied by the token's scale, then by the channel's. Embeddings,
modulation, norms, the output head, the VACE hint projections and the text and image encoders stay
weight-only (or in the model dtype).

One place decides (:func:`int8_matmuls`): ``int8`` asks for it, a float dtype keeps the weight-only
path, ``auto`` is int8 where the build target multiplies int8 faster than bf16
(:attr:`wanjax.target.Target.multiplies_int8`: TPU v5e, v6e, v5p; NVIDIA GPUs of compute capability
8.x) and weight-only elsewhere (the CPU, where XLA's int8 dot measured slower than bf16: BENCHMARKS.md).
The forward marks the kernels it multiplies so (:func:`marked_blocks`, a static flag of the leaf:
the params stay the same arrays), and :func:`wanjax.models.layers.matmul` reads the flag.

Why not qwix (``qwix.quantize_model``, PyPI 0.1.8): it quantises Flax modules by intercepting their
``dot_general`` calls, and its arrays (``QArray``) are Flax structs, so it needs Flax at run time and
a module to intercept; wanjax's layers are pure functions over explicit params pytrees whose kernels
are quantised on the host as they are read. Its numerics for this case are the few lines below.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from wanjax.errors import ConfigError
from wanjax.io.gguf_kernel import GGUFKernel
from wanjax.io.quant import INT8, LIMITS, QMAX, QuantizedKernel, quantize
from wanjax.io.quantizable import KEPT_GGUF
from wanjax.target import Target, current_target

AUTO = "auto"
INT8_ACTIVATIONS = "int8"
ACTIVATIONS_DTYPES = (AUTO, INT8_ACTIVATIONS, "bfloat16", "float32")
# the int8 weights W8A8 multiplies: 8-bit int8 kernels, or GGUF blocks requantised per channel
W8A8_WEIGHTS = ("int8", KEPT_GGUF)
# the block params whose kernels multiply in int8 (attention projections and the FFN)
W8A8_PARTS = ("attn1", "attn2", "ffn")
_EPS = float(np.finfo(np.float32).eps)  # torchao's least scale
# how near -127.5 steps a value is taken for the tie: ~250 ulps of 127.5, far above a recomputed
# producer's rounding, far below any other element's distance from the row's absmax in practice
_TIE = 2.0**-9


def check_activations(name: str, weights: str, what: str = "activations_dtype") -> None:
    """ConfigError naming ``what`` (e.g. ``--activations_dtype``) for an unknown name, or for ``int8``
    without int8 weights to multiply."""
    if name not in ACTIVATIONS_DTYPES:
        raise ConfigError(f"unknown {what} {name!r}; use one of {', '.join(ACTIVATIONS_DTYPES)}")
    if name == INT8_ACTIVATIONS and weights not in W8A8_WEIGHTS:
        flag = "--weights_dtype" if what.startswith("--") else "weights_dtype"
        raise ConfigError(
            f"{what} int8 multiplies int8 weights, and the weights are {weights}; add {flag} int8 "
            f"(or leave {what} at auto)"
        )


def int8_matmuls(name: str, weights: str, target: Target | None = None) -> bool:
    """Whether the blocks' matmuls run W8A8 for ``--activations_dtype name`` with ``--weights_dtype
    weights`` on ``target`` (default: the build target): ``int8`` yes, a float dtype no, ``auto``
    where int8 weights meet a target that multiplies int8 faster than bf16."""
    check_activations(name, weights)
    if name == AUTO:
        return weights == "int8" and (target or current_target()).multiplies_int8
    return name == INT8_ACTIVATIONS


def activations_name(int8: bool, dtype: Any) -> str:
    """What the blocks' matmuls multiply, for records and reports: ``int8`` or the model dtype's name."""
    return INT8_ACTIVATIONS if int8 else jnp.dtype(dtype).name


def marked_blocks(blocks: Any, int8: bool) -> Any:
    """The stacked block params ``blocks`` with the kernels of :data:`W8A8_PARTS` flagged W8A8 (int8
    :class:`QuantizedKernel` and :class:`GGUFKernel` leaves; others are left as they are) when ``int8``."""
    if not int8:
        return blocks

    def mark(leaf: Any) -> Any:
        if isinstance(leaf, GGUFKernel) or (isinstance(leaf, QuantizedKernel) and leaf.values.dtype == INT8):
            return dataclasses.replace(leaf, w8a8=True)
        return leaf

    is_kernel = lambda x: isinstance(x, QuantizedKernel | GGUFKernel)  # noqa: E731
    return {k: jax.tree.map(mark, v, is_leaf=is_kernel) if k in W8A8_PARTS else v for k, v in blocks.items()}


def quantize_rows(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(values, scale)`` of ``x (..., in)`` per row (token): int8 values and float32 scales
    ``(..., 1)``, ``x ≈ values * scale`` (torchao's dynamic symmetric per-token quantisation).

    The scale is a true division, as torchao's (XLA would multiply by the rounded reciprocal of a
    constant divisor, an ulp off). A row's absmax element lies on a tie, ±127.5 steps, which float32
    arithmetic breaks by the last bit (torchao: 78% -128, 22% -127 on Gaussian rows; a one-step
    change of a row's largest element, ~1e-3 of a small layer's output, from any float32-level change
    of the input, e.g. another mesh's summation order). Here it is broken as exact arithmetic does,
    half to even: 127.5 -> 127 (128 clipped), -127.5 -> -128, for every value within :data:`_TIE` of
    it: XLA recomputes ``x``'s producer (a norm, the modulation) inside the absmax's fusion and the
    rounding's, whose code may round an ulp apart (at LLVM -O0 it does), so the element cannot be
    found by equality with the absmax."""
    x32 = x.astype(jnp.float32)
    absmax = jnp.max(jnp.abs(x32), axis=-1, keepdims=True)
    qmax = jax.lax.optimization_barrier(jnp.full(absmax.shape, QMAX[INT8], jnp.float32))
    scale = jnp.maximum(absmax / qmax, np.float32(_EPS))
    steps = x32 * (np.float32(1) / scale)
    values = jnp.clip(jnp.round(steps), *LIMITS[INT8])
    values = jnp.where(steps <= np.float32(-QMAX[INT8] + _TIE), LIMITS[INT8][0], values)
    return values.astype(jnp.int8), scale


def int8_matmul(x: jax.Array, values: jax.Array, scale: jax.Array) -> jax.Array:
    """``x @ (values * scale)`` in float32 for an int8 kernel ``values (in, out)`` with per-channel
    ``scale``: ``x`` quantised per token, ``int8 x int8 -> int32``, then the token's scale, then the
    channel's (torchao's order)."""
    xq, row_scale = quantize_rows(x)
    y = jnp.matmul(xq, values, preferred_element_type=jnp.int32)
    return (y.astype(jnp.float32) * row_scale) * scale


def w8a8_matmul(x: jax.Array, kernel: QuantizedKernel | GGUFKernel) -> jax.Array:
    """:func:`int8_matmul` of a flagged kernel: an int8 one as stored; GGUF blocks dequantised and
    requantised per output channel inside the program by the host's rule (a second rounding; GGUF's
    block scales run along the input axis, which an int8 dot cannot apply)."""
    if isinstance(kernel, GGUFKernel):
        values, scale = quantize(kernel.dequantize(jnp.float32), INT8, jnp)
    else:
        values, scale = kernel.values, kernel.scale
    return int8_matmul(x, values, scale if scale.ndim == 1 else jnp.expand_dims(scale, -2))
