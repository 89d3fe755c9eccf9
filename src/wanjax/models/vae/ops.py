"""Primitives of the Wan 2.1 and 2.2 VAEs, channel-last (``[B, T, H, W, C]``): numerics settings, the
channel L2 norm, pointwise and 2-D convolutions, and the frame bookkeeping of the causal cache.

Convolutions and matmuls take their operands in the activation dtype and accumulate in float32;
float32 ones run at ``Numerics.precision`` (see :mod:`wanjax.kernels.precision`). Weights are stored
in their own dtype and cast to the activation dtype at use.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from wanjax.kernels.precision import Precision, lax_precision
from wanjax.models.layers import Params, silu

FLOAT32 = np.dtype(np.float32)

# one cache entry: the frames before a chunk, each (B, H, W, C); or what stands for them (owed
# sums, low-resolution frames, a ring of frames and its free slot: see causal_conv and upsampling)
Frames = tuple[jax.Array, ...]
Cache = dict[str, Frames]  # cache site name -> frames
CONV_IMPLS = ("taps", "conv3d", "ring")
ACCELERATOR_CONV = "ring"  # the formulation GPUs and TPUs run (see default_conv)
UPSAMPLE_IMPLS = ("subpixel", "repeat")
FIRST_FRAME_IMPLS = ("alone", "scan")


@dataclasses.dataclass(frozen=True)
class Numerics:
    """How a chunk is computed: activation dtype and the convolution formulation (static under jit).

    ``conv``: ``taps`` runs a 3x3x3 causal conv as three 2-D convs over frames (one per temporal tap,
    frames folded into the batch), which XLA:CPU runs ~2x faster than its 3-D convolution;
    ``conv3d`` is a plain ``conv_general_dilated``. ``upsample``: ``subpixel`` runs nearest-x2 +
    3x3 conv as four 2x2 convs on the low-resolution input (2.25x fewer FLOPs, no upsampled copy);
    ``repeat`` upsamples then convolves, as the reference does. ``owed_cache``: with ``taps``,
    causal convs whose owed partial sums are no larger than their input frames cache those sums
    (see :func:`~wanjax.models.vae.causal_conv.causal_conv3d`); without it only convs with fewer
    outputs than inputs do.
    ``lowres_cache``: with ``taps`` and one-frame steps (:meth:`for_steps`), a residual block right
    after a spatial x2 upsampling below the output resolution keeps its conv1's two past frames as
    the upsampling's low-resolution inputs when that is smaller, and recomputes them (see
    :func:`~wanjax.models.vae.upsampling.caches_lowres_input`).
    ``precision``: how float32 operands are multiplied (``highest | high | default``).
    ``f32_conv_output``: a convolution of 16-bit operands returns float32 from the convolution
    itself (``preferred_element_type``); without it the convolution returns the activation dtype
    and is widened after. Both accumulate in float32; see :func:`f32_conv_output` for the platforms.
    ``first_frame``: how the decoder's first latent frame runs with one frame per step: ``alone``,
    a program part of its own before the scan (the decoder's layers compiled twice), or ``scan``,
    the scan's first step from a zero cache (once); see :func:`default_first_frame`.
    """

    dtype: jnp.dtype = FLOAT32
    conv: str = "taps"
    upsample: str = "subpixel"
    owed_cache: bool = True
    lowres_cache: bool = True
    precision: Precision = "highest"
    f32_conv_output: bool = True
    first_frame: str = "alone"

    def for_steps(self, frames: int) -> Numerics:
        """These numerics for steps of ``frames`` video frames: the low-resolution recompute (speed
        traded for memory) only runs with one-frame steps (more frames per step trade the other way)."""
        return dataclasses.replace(self, lowres_cache=self.lowres_cache and frames == 1)

    @property
    def lax_precision(self) -> lax.Precision | None:
        """The ``precision=`` of this chunk's convolutions and matmuls (None for 16-bit operands)."""
        return lax_precision(self.precision, self.dtype)


def default_conv(platform: str) -> str:
    """The causal convolutions' formulation on ``platform`` (``Numerics.conv``).

    CPUs run ``taps``: XLA:CPU's 2-D convolutions are ~2x faster than its 3-D one, and the owed-sum
    caches halve the float32 program (3.59 vs 5.79 GiB at 832x480, BENCHMARKS.md). Accelerators
    run one 3-D convolution per conv (cuDNN / the MXU take it whole) over the ``ring`` cache: per
    one-frame step a conv site then writes one frame, where the concatenated window writes three
    and shifts the cache by one more (XLA:CPU's buffer plan of the 832x480 float32 decode: 13
    one-frame copies and 13 three-frame concatenations gone, 5.92 vs 5.79 GiB).
    """
    return "taps" if platform.lower() == "cpu" else ACCELERATOR_CONV


def default_first_frame(platform: str) -> str:
    """How the decoder's first latent frame runs on ``platform`` (``Numerics.first_frame``).

    TPUs decode it in the scan's first step (``scan``): the TPU compiler's time and code go with the
    layers a program holds, and decoding the first frame apart held every layer twice (the 5B's
    decode at 1280x704: 32.4 -> 18.0 s of compile, 65 -> 34 MiB of code per chip; BENCHMARKS.md).
    CPUs and GPUs keep it ``alone``: XLA:CPU compiles the decode in seconds either way and keeps
    39 MiB more of it in the scan at 240x416 (917 -> 956 MiB), and on GPUs ``scan`` is not measured.
    """
    return "scan" if platform.lower() == "tpu" else "alone"


def f32_conv_output(platform: str) -> bool:
    """Whether convolutions of 16-bit operands on ``platform`` return float32 directly.

    XLA's GPU compiler runs no mixed-precision convolution: its ``FloatNormalization`` pass
    (``ConvBfloat16Support::SupportsMixedPrecisions`` is false for convolutions) widens the bf16
    operands of a ``bf16 x bf16 -> f32`` convolution to float32, and cuDNN then runs a float32 (TF32)
    kernel on twice the bytes. So on GPUs they return bf16 (cuDNN accumulates bf16 convolutions in
    float32 all the same) and are widened after. CPUs (which convolve in float32 whatever the
    inputs) and TPUs (whose MXU takes bf16 and accumulates in float32) keep the float32 result.
    """
    return platform.lower() not in ("gpu", "cuda", "rocm")


def channel_sum(x: jax.Array) -> jax.Array:
    """Sum over the last axis in one fixed order, as elementwise adds of halves (then of the odd
    remainder's columns in turn). XLA:CPU's reduce picks its summation order by the shape of the
    other axes, so a reduce would make a frame's result depend on how many frames run with it."""
    while x.shape[-1] % 2 == 0:
        half = x.shape[-1] // 2
        x = x[..., :half] + x[..., half:]
    total = x[..., :1]
    for i in range(1, x.shape[-1]):
        total = total + x[..., i : i + 1]
    return total


def l2_normalize(x: jax.Array, gamma: jax.Array) -> jax.Array:
    """``WanRMS_norm`` (an L2 normalisation, not ``torch.nn.RMSNorm``): ``x / max(||x||_2, 1e-12)
    * sqrt(C) * gamma`` over channels (normalised in f32)."""
    x32 = x.astype(jnp.float32)
    norm = jnp.sqrt(channel_sum(x32 * x32))
    normalized = (x32 / jnp.maximum(norm, 1e-12)).astype(x.dtype)
    scale = jnp.asarray(math.sqrt(x.shape[-1]), x.dtype)
    return normalized * scale * gamma.astype(x.dtype)


def norm_silu(x: jax.Array, gamma: jax.Array) -> jax.Array:
    return silu(l2_normalize(x, gamma))


def per_frame(fn: Callable[[jax.Array], jax.Array], x: jax.Array) -> jax.Array:
    """``fn`` (an image op on ``(N, H, W, C)``) applied to every frame of ``x (B, T, H, W, C)``,
    frames folded into the batch."""
    y = fn(x.reshape(-1, *x.shape[2:]))
    return y.reshape(*x.shape[:2], *y.shape[1:])


def matmul(x: jax.Array, w: jax.Array, nm: Numerics) -> jax.Array:
    """``x @ w`` over the channel axis, float32 result."""
    return jnp.matmul(x, w.astype(x.dtype), precision=nm.lax_precision, preferred_element_type=jnp.float32)


def pointwise(x: jax.Array, p: Params, nm: Numerics) -> jax.Array:
    """1x1(x1) convolution = ``x @ kernel + bias`` over the channel axis of ``(B, T, H, W, C)``."""
    return (matmul(x, p["kernel"], nm) + p["bias"].astype(jnp.float32)).astype(x.dtype)


def conv2d(
    x: jax.Array,
    kernel: jax.Array,
    nm: Numerics,
    *,
    stride: int = 1,
    padding: Sequence[tuple[int, int]] = ((1, 1), (1, 1)),
) -> jax.Array:
    """Per-image 2-D convolution of ``(N, H, W, C)`` with an ``(kh, kw, C, O)`` kernel; float32 result."""
    return convolution(x, kernel, nm, (stride, stride), padding, ("NHWC", "HWIO", "NHWC"))


def convolution(
    x: jax.Array,
    kernel: jax.Array,
    nm: Numerics,
    strides: Sequence[int],
    padding: Sequence[tuple[int, int]],
    dimension_numbers: tuple[str, str, str],
) -> jax.Array:
    """``lax.conv_general_dilated`` with both operands in ``x``'s dtype, float32 accumulation and
    result (see ``Numerics.f32_conv_output``), float32 operands at ``nm.precision``."""
    f32_out = nm.f32_conv_output or x.dtype == jnp.float32
    y = lax.conv_general_dilated(
        x,
        kernel.astype(x.dtype),
        tuple(strides),
        tuple(padding),
        dimension_numbers=dimension_numbers,
        precision=nm.lax_precision,
        preferred_element_type=jnp.float32 if f32_out else None,
    )
    return y.astype(jnp.float32)


def zero_frames(x: jax.Array, n: int) -> Frames:
    return tuple(jnp.zeros((x.shape[0], *x.shape[2:]), x.dtype) for _ in range(n))


def last_frames(prev: Frames | None, x: jax.Array, n: int) -> Frames:
    """The last ``n`` frames of ``concat(prev, x)`` as separate arrays (``None``: zero frames)."""
    t = x.shape[1]
    if t < n and prev is None:
        prev = zero_frames(x, n - t)
    prev = prev or ()
    return (*prev[max(len(prev) - (n - t), 0) :], *(x[:, i] for i in range(max(t - n, 0), t)))


def frame_window(prev: Frames | None, x: jax.Array, start: int, length: int, n_prev: int) -> jax.Array | None:
    """Frames ``[start, start + length)`` of ``concat(prev, x)`` as one ``(B, length, H, W, C)`` array,
    where ``prev`` holds ``n_prev`` frames (``None``: zeros). ``None`` if the window is all zeros."""
    lo, hi = max(start - n_prev, 0), start + length - n_prev
    if prev is None:
        if hi <= 0:
            return None
        prev = zero_frames(x, n_prev)
    parts = [f[:, None] for f in prev[start : start + length]]
    if hi > lo:
        parts.append(x[:, lo:hi])
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=1)


def after(w: jax.Array, x: jax.Array) -> jax.Array:
    """``w`` made data-dependent on ``x`` (plus ``0 * x[0]``), so XLA cannot run the op reading
    ``w`` before ``x`` exists. Used on the small kernels of convolutions over cached frames, which
    would otherwise all be hoisted to the start of a step, each holding a full-frame output."""
    return w + (x.reshape(-1)[0] * 0).astype(w.dtype)
