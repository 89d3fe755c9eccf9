"""Causal convolutions over time of the Wan 2.1 and 2.2 VAEs: the 3x3x3 ``WanCausalConv3d`` (with the
cache of input frames, or of the partial sums owed to the next frames) and the ``(3, 1, 1)`` time conv
of the 3-D resamplers.

A causal 3x3x3 conv sees its input with the last two frames of everything before it in front (zeros
at the start) and keeps the last two frames of that concatenation (diffusers ``feat_cache``, exact).
With the ``ring`` formulation the cache is a three-frame ring buffer instead, the new frame written
into it in place (see :func:`conv3d_ring`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from wanjax.models.layers import Params
from wanjax.models.vae.ops import (
    FLOAT32,
    Frames,
    Numerics,
    after,
    conv2d,
    convolution,
    frame_window,
    last_frames,
    matmul,
    per_frame,
)


def conv3d_causal(prev: Frames | None, x: jax.Array, kernel: jax.Array, nm: Numerics) -> jax.Array:
    """3x3x3 conv over ``concat(prev, x)`` (two frames in front, ``None``: zeros), valid in time,
    zero-padded by 1 in H and W. Returns float32 ``(B, T, H, W, O)`` without bias."""
    t = x.shape[1]
    if nm.conv in ("conv3d", "ring"):
        return _conv3d_valid_in_time(frame_window(prev, x, 0, t + 2, 2), kernel, nm)
    out = None
    for kt in (2, 1, 0):  # one 2-D conv per temporal tap, frames folded into the batch
        window = frame_window(prev, x, kt, t, 2)
        if window is None:
            continue
        k = kernel[kt] if kt + t > 2 else after(kernel[kt], x)  # taps on cached frames only: keep order
        y = per_frame(lambda f, k=k: conv2d(f, k, nm), window)
        out = y if out is None else out + y
    return out


def causal_conv3d(
    x: jax.Array, cache: Frames | None, p: Params, nm: Numerics, residual: jax.Array | None = None
) -> tuple[jax.Array, Frames]:
    """``WanCausalConv3d`` (3x3x3, padding 1) on a chunk, plus ``residual`` if given; returns
    (output, new 2-frame cache).

    Only time is padded explicitly (the cache, or two zero frames, in front); H and W are padded by
    the convolution itself.
    """
    kernel = p["kernel"]
    if caches_owed_sums(*kernel.shape[-2:], nm):
        y, new = _conv3d_output_side(cache, x, kernel, nm, residual)
    else:
        if nm.conv == "ring":
            y, new = conv3d_ring(cache, x, kernel, nm)
        else:
            y, new = conv3d_causal(cache, x, kernel, nm), last_frames(cache, x, 2)
        y = y if residual is None else y + residual.astype(jnp.float32)
    return (y + p["bias"].astype(jnp.float32)).astype(x.dtype), new


def conv3d_ring(
    ring: Frames | None, x: jax.Array, kernel: jax.Array, nm: Numerics
) -> tuple[jax.Array, Frames]:
    """:func:`conv3d_causal` with the cache as ``(buffer, free)``: a ``(B, 3, H, W, C)`` ring of
    frames holding the last two at slots ``free + 1`` and ``free + 2`` (mod 3; ``None``: zeros), and
    the slot the next frame goes into. A one-frame step writes its frame into the free slot in place
    and convolves the whole ring with the kernel's temporal taps rotated to the slots' order: no
    window is concatenated and no cached frame moves, where ``conv3d`` copies three frames into a
    window and shifts its cache by one. A longer step gathers the two frames in order as ``conv3d``
    does and leaves its last two in slots 0 and 1. Returns float32 ``(B, T, H, W, O)`` without bias."""
    b, t, h, w, c = x.shape
    if ring is None:
        buffer, free = jnp.zeros((b, 3, h, w, c), x.dtype), jnp.zeros((), jnp.int32)
    else:
        buffer, free = ring
    if t == 1:
        buffer = lax.dynamic_update_slice_in_dim(buffer, x, free, axis=1)
        taps = (jnp.arange(3) - free + 2) % 3  # slot s holds frame t - 2 + taps[s]
        return _conv3d_valid_in_time(buffer, jnp.take(kernel, taps, axis=0), nm), (buffer, (free + 1) % 3)
    prev = tuple(lax.dynamic_index_in_dim(buffer, (free + k) % 3, 1, keepdims=False) for k in (1, 2))
    last = jnp.stack(last_frames(prev, x, 2), axis=1)
    buffer = lax.dynamic_update_slice_in_dim(buffer, last, 0, axis=1)
    return conv3d_causal(prev, x, kernel, nm), (buffer, jnp.full((), 2, jnp.int32))


def _conv3d_valid_in_time(window: jax.Array, kernel: jax.Array, nm: Numerics) -> jax.Array:
    """The 3x3x3 conv of a ``(B, T + 2, H, W, C)`` window: valid in time, zero-padded by 1 in H and W."""
    dims = ("NDHWC", "DHWIO", "NDHWC")
    return convolution(window, kernel, nm, (1, 1, 1), ((0, 0), (1, 1), (1, 1)), dims)


def caches_owed_sums(c_in: int, c_out: int, nm: Numerics) -> bool:
    """Whether a ``c_in -> c_out`` causal conv caches owed float32 partial sums (with ``taps``):
    when they take fewer bytes than two input frames, or as many and ``nm.owed_cache``."""
    owed_bytes, input_bytes = c_out * FLOAT32.itemsize, c_in * np.dtype(nm.dtype).itemsize
    return nm.conv == "taps" and (owed_bytes < input_bytes or (nm.owed_cache and owed_bytes == input_bytes))


def _conv3d_output_side(
    cache: Frames | None, x: jax.Array, kernel: jax.Array, nm: Numerics, residual: jax.Array | None
) -> tuple[jax.Array, Frames]:
    """The causal conv with the cache on the output side: each input frame goes through all three
    temporal taps (``q_k = conv2d(x_t, kernel[k])``), and the cache holds the two float32 partial
    sums owed to the next frames (``O`` channels) instead of two input frames (``C``). Used when
    that is no larger (``conv_out``'s 96 -> 3, and every C -> C conv in float32): besides the
    smaller cache, each new cache entry is a fresh sum rather than a shifted input frame, which
    lets XLA update the loop carry in place instead of keeping old and new caches at once.

    ``y_t = q2_t + (q1_{t-1} + q0_{t-2})``; cache ``(q1_{-1} + q0_{-2}, q0_{-1})``, zeros at the start.
    """
    b, t, h, w, c = x.shape
    o = kernel.shape[-1]
    owed, owed_next = owed_with_residual(cache, residual)
    conv = lambda frames, k: per_frame(lambda f: conv2d(f, k, nm), frames)  # noqa: E731
    if 3 * o <= c:  # few outputs: all three taps in one conv
        taps = jnp.moveaxis(kernel, 0, 3).reshape(3, 3, c, 3 * o)  # (kh, kw, C, [kt, O])
        q = conv(x, taps).reshape(b, t, h, w, 3, o)
        q0, q1, q2 = q[..., 0, :], q[..., 1, :], q[..., 2, :]
    else:  # one conv per tap (a 3 O-wide conv runs at half the speed on XLA:CPU), in order:
        # each runs once the old sum its output replaces has been read (so it can take its place
        # in the loop carry), and the next layer waits for the last (so ``x`` dies at once)
        q2 = conv(x, kernel[2])
        q1 = conv(x, after(kernel[1], q2[:, 0] if owed is None else q2[:, 0] + owed))
        q0 = conv(x, after(kernel[0], q1[:, 0] if owed_next is None else q1[:, 0] + owed_next))
    ys = []
    for i in range(t):  # frame by frame, so the sums are formed alike whatever the chunk
        if i and residual is not None:
            r = residual[:, i].astype(jnp.float32)
            owed = r if owed is None else owed + r
        ys.append(q2[:, i] if owed is None else q2[:, i] + owed)
        owed, owed_next = q1[:, i] if owed_next is None else add_in_place(q1[:, i], owed_next), q0[:, i]
    return after(jnp.stack(ys, axis=1), owed_next), (owed, owed_next)


def owed_with_residual(cache: Frames | None, residual: jax.Array | None) -> tuple[jax.Array | None, ...]:
    """An owed-sum cache's ``(owed, owed_next)`` (``None``: zeros) with ``residual``'s first frame
    folded into the sum owed to that frame: the residual then need not be kept until the conv."""
    owed, owed_next = cache if cache is not None else (None, None)
    if residual is not None:
        r = residual[:, 0].astype(jnp.float32)
        owed = r if owed is None else add_in_place(owed, r)
    return owed, owed_next


def add_in_place(acc: jax.Array, x: jax.Array) -> jax.Array:
    """``acc + x`` written over ``acc``'s buffer: as two in-place dynamic-update-slices of row halves
    (a whole-array one would be simplified to a plain add, which needs a new buffer), each reading
    the rows it updates from the latest ``acc``."""
    mid = acc.shape[1] // 2
    if mid == 0:
        return acc + x
    start = (0,) * acc.ndim
    acc = lax.dynamic_update_slice(acc, acc[:, :mid] + x[:, :mid], start)
    return lax.dynamic_update_slice(acc, acc[:, mid:] + x[:, mid:], (0, mid, *start[2:]))


def time_conv(prev: Frames | None, x: jax.Array, p: Params, nm: Numerics, stride: int) -> jax.Array:
    """``(3, 1, 1)`` conv over ``concat(prev, x)`` in time (valid, given stride): pointwise matmuls."""
    n_prev = 1 if stride == 2 else 2
    t_out = (n_prev + x.shape[1] - 3) // stride + 1
    kernel = p["kernel"].astype(x.dtype)  # (3, C, O)
    out = p["bias"].astype(jnp.float32)
    for k in range(3):
        length = stride * (t_out - 1) + 1
        window = frame_window(prev, x, k, length, n_prev)
        if window is None:
            continue
        w = kernel[k] if k + length > n_prev else after(kernel[k], x)
        out = out + matmul(window[:, ::stride], w, nm)
    return out.astype(x.dtype)
