"""Building blocks of the Wan 2.1 causal 3D VAE, channel-last (``[B, T, H, W, C]``), one chunk at a time.

Every function maps one chunk of frames plus the causal cache of the frames before it to the chunk's
output plus the updated cache. The cache is a flat dict ``{site name: (frame, frame)}`` of separate
``(B, H, W, C)`` frames (a one-frame step then reads them directly, no concatenation); a missing
entry means "nothing before this chunk" (zero frames), which is how the first chunk runs.

Cache rules (diffusers ``feat_cache``, exact): a causal 3x3x3 conv sees its input with the last two
frames of everything before it in front (zeros at the start) and keeps the last two frames of that
concatenation; ``upsample3d``'s ``time_conv`` skips the first chunk entirely (frame 0 stays one
frame and is not cached); ``downsample3d``'s stride-2 ``time_conv`` keeps one frame and skips the
first chunk. Norms, attention and the 2-D convs are per frame.

Convolutions accumulate in float32 and run at full float32 precision for float32 activations.
Weights are stored in their own dtype and cast to the activation dtype at use.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from wanjax.kernels.attention import attention
from wanjax.models.layers import Params
from wanjax.models.vae.config import Layer

_FLOAT32 = np.dtype(np.float32)

Frames = tuple[jax.Array, ...]  # one cache entry: the frames before a chunk, each (B, H, W, C)
Cache = dict[str, Frames]  # cache site name -> frames
CONV_IMPLS = ("taps", "conv3d")
UPSAMPLE_IMPLS = ("subpixel", "repeat")


@dataclasses.dataclass(frozen=True)
class Numerics:
    """How a chunk is computed: activation dtype and the convolution formulation (static under jit).

    ``conv``: ``taps`` runs a 3x3x3 causal conv as three 2-D convs over frames (one per temporal tap,
    frames folded into the batch), which XLA:CPU runs ~2x faster than its 3-D convolution;
    ``conv3d`` is a plain ``conv_general_dilated``. ``upsample``: ``subpixel`` runs nearest-x2 +
    3x3 conv as four 2x2 convs on the low-resolution input (2.25x fewer FLOPs, no upsampled copy);
    ``repeat`` upsamples then convolves, as the reference does. ``owed_cache``: with ``taps``,
    causal convs whose owed partial sums are no larger than their input frames cache those sums
    (see :func:`causal_conv3d`); without it only convs with fewer outputs than inputs do.
    ``lowres_cache``: with ``taps`` and one-frame steps (:meth:`for_steps`), a residual block right
    after a spatial x2 upsampling below the output resolution keeps its conv1's two past frames as
    the upsampling's low-resolution inputs when that is smaller, and recomputes them (see
    :func:`caches_lowres_input`).
    """

    dtype: jnp.dtype = _FLOAT32
    conv: str = "taps"
    upsample: str = "subpixel"
    owed_cache: bool = True
    lowres_cache: bool = True

    def for_steps(self, frames: int) -> Numerics:
        """These numerics for steps of ``frames`` video frames: the low-resolution recompute (speed
        traded for memory) only runs with one-frame steps (more frames per step trade the other way)."""
        return dataclasses.replace(self, lowres_cache=self.lowres_cache and frames == 1)

    @property
    def precision(self) -> lax.Precision | None:
        return lax.Precision.HIGHEST if self.dtype == jnp.float32 else None


# ----------------------------------------------------------------------------------------------
# Primitives


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


def rms_norm(x: jax.Array, gamma: jax.Array) -> jax.Array:
    """``WanRMS_norm``: ``x / max(||x||_2, 1e-12) * sqrt(C) * gamma`` over channels (normalised in f32)."""
    x32 = x.astype(jnp.float32)
    norm = jnp.sqrt(channel_sum(x32 * x32))
    normalized = (x32 / jnp.maximum(norm, 1e-12)).astype(x.dtype)
    scale = jnp.asarray(math.sqrt(x.shape[-1]), x.dtype)
    return normalized * scale * gamma.astype(x.dtype)


def silu(x: jax.Array) -> jax.Array:
    return jax.nn.silu(x.astype(jnp.float32)).astype(x.dtype)


def norm_silu(x: jax.Array, gamma: jax.Array) -> jax.Array:
    return silu(rms_norm(x, gamma))


def per_frame(fn: Callable[[jax.Array], jax.Array], x: jax.Array) -> jax.Array:
    """``fn`` (an image op on ``(N, H, W, C)``) applied to every frame of ``x (B, T, H, W, C)``,
    frames folded into the batch."""
    y = fn(x.reshape(-1, *x.shape[2:]))
    return y.reshape(*x.shape[:2], *y.shape[1:])


def matmul(x: jax.Array, w: jax.Array, nm: Numerics) -> jax.Array:
    """``x @ w`` over the channel axis, float32 result."""
    return jnp.matmul(x, w.astype(x.dtype), precision=nm.precision, preferred_element_type=jnp.float32)


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
    return lax.conv_general_dilated(
        x,
        kernel.astype(x.dtype),
        (stride, stride),
        tuple(padding),
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
        precision=nm.precision,
        preferred_element_type=jnp.float32,
    )


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


def conv3d_causal(prev: Frames | None, x: jax.Array, kernel: jax.Array, nm: Numerics) -> jax.Array:
    """3x3x3 conv over ``concat(prev, x)`` (two frames in front, ``None``: zeros), valid in time,
    zero-padded by 1 in H and W. Returns float32 ``(B, T, H, W, O)`` without bias."""
    t = x.shape[1]
    if nm.conv == "conv3d":
        return lax.conv_general_dilated(
            frame_window(prev, x, 0, t + 2, 2),
            kernel.astype(x.dtype),
            (1, 1, 1),
            ((0, 0), (1, 1), (1, 1)),
            dimension_numbers=("NDHWC", "DHWIO", "NDHWC"),
            precision=nm.precision,
            preferred_element_type=jnp.float32,
        )
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
        y, new = conv3d_causal(cache, x, kernel, nm), last_frames(cache, x, 2)
        y = y if residual is None else y + residual.astype(jnp.float32)
    return (y + p["bias"].astype(jnp.float32)).astype(x.dtype), new


def caches_owed_sums(c_in: int, c_out: int, nm: Numerics) -> bool:
    """Whether a ``c_in -> c_out`` causal conv caches owed float32 partial sums (with ``taps``):
    when they take fewer bytes than two input frames, or as many and ``nm.owed_cache``."""
    owed_bytes, input_bytes = c_out * _FLOAT32.itemsize, c_in * np.dtype(nm.dtype).itemsize
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


def upsample_conv(x: jax.Array, p: Params, nm: Numerics) -> jax.Array:
    """Per frame: nearest x2 upsampling then 3x3 conv (padding 1): ``(N, h, w, C) -> (N, 2h, 2w, O)``."""
    kernel = p["kernel"]
    if nm.upsample == "repeat":
        up = jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2)
        y = conv2d(up, kernel, nm)
    else:
        y = _subpixel_upsample_conv(x, kernel, nm)
    return (y + p["bias"].astype(jnp.float32)).astype(x.dtype)


def _subpixel_upsample_conv(x: jax.Array, kernel: jax.Array, nm: Numerics) -> jax.Array:
    """Nearest-x2 + 3x3 conv as four 2x2 convs on the low-resolution input (one per output phase).

    Output pixel ``(2i+a, 2j+b)`` reads upsampled rows ``2i+a-1 .. 2i+a+1``, i.e. low-res rows
    ``i-1, i`` (a=0; kernel rows 0 | 1+2) or ``i, i+1`` (a=1; kernel rows 0+1 | 2); same for columns.
    """
    n, h, w, _ = x.shape
    k = after(kernel.astype(jnp.float32), x)  # merged per step, not hoisted out of the loops and kept
    merge = {0: ((0,), (1, 2)), 1: ((0, 1), (2,))}  # phase -> kernel taps summed into each 2x2 tap
    pads = {0: (1, 0), 1: (0, 1)}
    phases = []
    for a in (0, 1):
        row = []
        for b in (0, 1):
            k_rows = jnp.stack([sum(k[r] for r in rows) for rows in merge[a]])  # (2, 3, C, O)
            k2 = jnp.stack([sum(k_rows[:, c] for c in cols) for cols in merge[b]], axis=1)  # (2, 2, C, O)
            row.append(conv2d(x, k2.astype(kernel.dtype), nm, padding=(pads[a], pads[b])))
        phases.append(jnp.stack(row, axis=3))  # (N, h, w, 2[b], O)
    y = jnp.stack(phases, axis=2)  # (N, h, 2[a], w, 2[b], O)
    return y.reshape(n, 2 * h, 2 * w, -1)


def caches_lowres_input(c_low: int, c_in: int, c_out: int, nm: Numerics) -> bool:
    """Whether the ``c_in -> c_out`` conv1 of a residual block right after a spatial x2 upsampling
    (of ``c_low`` channels) caches the upsampling's two past low-resolution inputs instead of two
    frames or owed sums at full resolution, recomputing upsampling, norm1 and SiLU of both every
    step (two upsampling convs more per frame): when that takes fewer bytes (a low-resolution frame
    has a quarter of the pixels). :func:`run_layers` asks only below the output resolution: there
    the recompute's own full-resolution frames would outweigh the saving. The real decoder's two
    such blocks keep 23 MiB less at 240x416, for ~4% more FLOPs."""
    if not (nm.lowres_cache and nm.conv == "taps"):
        return False
    itemsize = np.dtype(nm.dtype).itemsize
    usual = c_out * _FLOAT32.itemsize if caches_owed_sums(c_in, c_out, nm) else c_in * itemsize
    return c_low * itemsize < 4 * usual


def _lowres_history(hist: Frames | None, u: jax.Array) -> Frames:
    """The new low-resolution cache ``(u_a, u_b, m_a, m_b)`` after the frames ``u``: the last two
    low-resolution frames and their masks (0: the zero padding before frame 0, 1: a real frame)."""
    zero, one = jnp.zeros((), jnp.float32), jnp.ones((), jnp.float32)
    if hist is None:
        frames = [(jnp.zeros_like(u[:, 0]), zero)] * 2
    else:
        frames = [(hist[0], hist[2]), (hist[1], hist[3])]
    frames += [(u[:, i], one) for i in range(u.shape[1])]
    (u_a, m_a), (u_b, m_b) = frames[-2:]
    return u_a, u_b, m_a, m_b


def _conv1_lowres(
    a: jax.Array,
    hist: Frames | None,
    past: Callable[[jax.Array, jax.Array, jax.Array | None], jax.Array],
    kernel: jax.Array,
    nm: Numerics,
) -> jax.Array:
    """:func:`conv3d_causal` of ``a`` whose two past frames are recomputed by
    ``past(u, mask, after_this)`` from the low-resolution cache ``hist`` (``None``: zeros). With one
    frame, each past frame is recomputed only once the tap before it has run, so at most one is
    alive at a time."""
    if hist is None or a.shape[1] > 1:
        prev = None if hist is None else (past(hist[0], hist[2], None), past(hist[1], hist[3], None))
        return conv3d_causal(prev, a, kernel, nm)
    out = per_frame(lambda f: conv2d(f, kernel[2], nm), a)
    for kt in (1, 0):  # the order of conv3d_causal's taps
        frame = past(hist[kt], hist[2 + kt], out)
        out = out + conv2d(frame, kernel[kt], nm)[:, None]
    return out


# ----------------------------------------------------------------------------------------------
# Modules


def residual_block(
    p: Params,
    layer: Layer,
    x: jax.Array,
    cache: Cache,
    new: Cache,
    nm: Numerics,
    lowres: tuple[jax.Array, Params] | None = None,
) -> jax.Array:
    """``WanResidualBlock``. ``lowres``: ``(u, upsampling params)`` when ``x`` is the per-frame
    x2 upsampling of ``u`` (see :func:`caches_lowres_input`)."""
    site1, site2 = layer.cache_sites
    shortcut = pointwise(x, p["conv_shortcut"], nm) if layer.dim_in != layer.dim_out else x
    gamma1 = p["norm1"]
    if caches_owed_sums(layer.dim_out, layer.dim_out, nm):
        # conv2 folds the shortcut into its owed sum (below); norm1 waits for that sum, so ``x``
        # is retired before conv1 instead of being kept through it (one frame less at the peak)
        gamma1 = after(gamma1, owed_with_residual(cache.get(site2), shortcut)[0])
    a = norm_silu(x, gamma1)
    if lowres is not None and caches_lowres_input(lowres[0].shape[-1], layer.dim_in, layer.dim_out, nm):
        u, p_up = lowres

        def past(u_frame: jax.Array, mask: jax.Array, after_this: jax.Array | None) -> jax.Array:
            up = p_up if after_this is None else {**p_up, "kernel": after(p_up["kernel"], after_this)}
            return norm_silu(upsample_conv(u_frame, up, nm), p["norm1"]) * mask.astype(a.dtype)

        h = _conv1_lowres(a, cache.get(site1), past, p["conv1"]["kernel"], nm)
        h = (h + p["conv1"]["bias"].astype(jnp.float32)).astype(a.dtype)
        new[site1] = _lowres_history(cache.get(site1), u)
    else:
        h, new[site1] = causal_conv3d(a, cache.get(site1), p["conv1"], nm)
    h, new[site2] = causal_conv3d(norm_silu(h, p["norm2"]), cache.get(site2), p["conv2"], nm, shortcut)
    return h


def attention_block(p: Params, x: jax.Array, nm: Numerics) -> jax.Array:
    """Single-head self-attention over the pixels of each frame."""
    qkv = pointwise(rms_norm(x, p["norm"]), p["to_qkv"], nm)

    def frames(f: jax.Array) -> jax.Array:  # (N, h, w, 3C) -> (N, h, w, C); one head, L = h*w
        n, h, w, c3 = f.shape
        q, k, v = (f.reshape(n, h * w, 3, 1, c3 // 3)[:, :, i] for i in range(3))
        return attention(q, k, v).reshape(n, h, w, c3 // 3)

    return pointwise(per_frame(frames, qkv), p["proj"], nm) + x


def upsample(p: Params, x: jax.Array, nm: Numerics) -> jax.Array:
    """``WanResample``'s spatial x2 upsampling (all of upsample2d; upsample3d's second half)."""
    return per_frame(lambda f: upsample_conv(f, p["resample"], nm), x)


@dataclasses.dataclass(frozen=True)
class LazyFrames:
    """``length`` frames made on demand: ``make(start, count)`` gives frames ``[start, start + count)``
    (``start`` may be traced), so a loop over them never holds them all."""

    length: int
    make: Callable[[jax.Array | int, int], jax.Array]


def time_doubling(
    p: Params, layer: Layer, x: jax.Array, cache: Cache, new: Cache, first: bool, nm: Numerics
) -> jax.Array | LazyFrames:
    """upsample3d's temporal half: each frame becomes two, except in the first chunk (the reference's
    "Rep" rule: frame 0 is neither doubled nor cached). Frame ``2j + s`` is output channels
    ``[sC, (s+1)C)`` of a (3, 1, 1) ``time_conv`` at input frame ``j``; the doubled frames are
    returned as :class:`LazyFrames`, each computed alone from the input frames (and the two cached
    ones, which stay alive meanwhile) with those channels of the kernel."""
    (site,) = layer.cache_sites
    if first:
        new[site] = zero_frames(x, 2)
        return x
    prev = cache[site]
    new[site] = last_frames(prev, x, 2)
    c = x.shape[-1]
    frames = (*prev, *(x[:, i] for i in range(x.shape[1])))
    stacked = jnp.stack(frames, axis=1) if x.shape[1] > 1 else None
    kernel, bias = p["time_conv"]["kernel"].astype(x.dtype), p["time_conv"]["bias"].astype(jnp.float32)

    def make(start: jax.Array | int, count: int) -> jax.Array:
        out = []
        for f in range(count):
            j, half = (start + f) // 2, (start + f) % 2
            k = lax.dynamic_slice_in_dim(kernel, half * c, c, axis=2)
            y = lax.dynamic_slice_in_dim(bias, half * c, c)
            for kt in range(3):  # the order of time_conv's taps
                window = (
                    frames[kt] if stacked is None else lax.dynamic_index_in_dim(stacked, j + kt, 1, False)
                )
                y = y + matmul(window, k[kt], nm)
            out.append(y.astype(x.dtype))
        return jnp.stack(out, axis=1)

    return LazyFrames(2 * x.shape[1], make)


def downsample(
    p: Params, layer: Layer, x: jax.Array, cache: Cache, new: Cache, first: bool, nm: Numerics
) -> jax.Array:
    """``WanResample`` downsample2d/downsample3d (pad right/bottom by 1, 3x3 stride-2 conv)."""
    conv = functools.partial(
        conv2d, kernel=p["resample"]["kernel"], nm=nm, stride=2, padding=((0, 1), (0, 1))
    )
    y = per_frame(conv, x) + p["resample"]["bias"].astype(jnp.float32)
    x = y.astype(x.dtype)
    if layer.kind == "down3d":
        (site,) = layer.cache_sites
        new[site] = last_frames((), x, 1)
        if not first:  # first chunk: cache its (single) frame, no time conv
            return time_conv(cache[site], x, p["time_conv"], nm, stride=2)
    return x


def head(p: Params, layer: Layer, x: jax.Array, cache: Cache, new: Cache, nm: Numerics) -> jax.Array:
    """``norm_out`` -> SiLU -> ``conv_out``."""
    (site,) = layer.cache_sites
    y, new[site] = causal_conv3d(norm_silu(x, p["norm_out"]), cache.get(site), p["conv_out"], nm)
    return y


def at_output_resolution(layers: Sequence[Layer]) -> bool:
    """Whether ``layers`` (the rest of a plan) end with the decoder's head and upsample no more."""
    return bool(layers) and layers[-1].kind == "head" and not any(lay.kind.startswith("up") for lay in layers)


def run_layers(
    params: Params, layers: Sequence[Layer], x: jax.Array, cache: Cache, first: bool, nm: Numerics
) -> tuple[jax.Array, Cache]:
    """Run ``layers`` in order on one chunk; returns the output and the caches of their sites."""
    new: Cache = {}
    lowres = None  # (input, params) of the spatial upsampling that made x, when it did
    for i, layer in enumerate(layers):
        p = params[layer.name]
        upsampled = None
        if layer.kind == "conv":
            x, new[layer.name] = causal_conv3d(x, cache.get(layer.name), p, nm)
        elif layer.kind == "res":
            x = residual_block(p, layer, x, cache, new, nm, lowres)
        elif layer.kind == "attn":
            x = attention_block(p, x, nm)
        elif layer.kind == "up2d":
            if not at_output_resolution(layers[i + 1 :]):
                upsampled = (x, p["resample"])
            x = upsample(p, x, nm)
        elif layer.kind in ("down2d", "down3d"):
            x = downsample(p, layer, x, cache, new, first, nm)
        elif layer.kind == "head":
            x = head(p, layer, x, cache, new, nm)
        else:  # up3d / up_time: split into segments by the decoder (see time_doubling)
            raise ValueError(f"run_layers cannot run a {layer.kind!r} layer")
        lowres = upsampled
    return x, new


def in_steps(
    fn: Callable[[jax.Array, Cache], tuple[jax.Array, Cache]],
    x: jax.Array | LazyFrames,
    cache: Cache,
    frames: int,
) -> tuple[jax.Array, Cache]:
    """``fn`` (frames, cache -> output, new cache) over ``x (B, T, ...)`` (or :class:`LazyFrames`,
    made one step at a time) in steps of ``frames`` frames (a ``lax.scan``, ``fn`` traced once), the
    cache carried from step to step: exact, and memory bounded by one step. ``frames`` must divide
    ``T``. Returns the output and all of ``cache`` updated with what ``fn`` wrote. Looping,
    ``cache`` must already hold every entry ``fn`` writes (the first chunk, which creates them,
    never runs here in pieces).
    """
    lazy = isinstance(x, LazyFrames)
    t = x.length if lazy else x.shape[1]
    if t <= frames:
        y, new = fn(x.make(0, t) if lazy else x, cache)
        return y, {**cache, **new}
    if t % frames:
        raise ValueError(f"{frames} frames per step do not divide a chunk of {t} frames")
    n = t // frames
    if lazy:
        steps, take = jnp.arange(n), lambda i: x.make(i * frames, frames)
    else:
        steps, take = jnp.moveaxis(x.reshape(x.shape[0], n, frames, *x.shape[2:]), 1, 0), lambda xs: xs

    def step(state: Cache, xs: jax.Array) -> tuple[Cache, jax.Array]:
        y, new = fn(take(xs), state)
        return {**state, **new}, y

    state, ys = lax.scan(step, cache, steps)
    ys = jnp.moveaxis(ys, 0, 1)
    return ys.reshape(ys.shape[0], n * ys.shape[2], *ys.shape[3:]), state


def run_layers_in_steps(
    params: Params,
    layers: Sequence[Layer],
    x: jax.Array,
    cache: Cache,
    first: bool,
    nm: Numerics,
    frames: int,
) -> tuple[jax.Array, Cache]:
    """:func:`run_layers` over ``x`` in steps of ``frames`` frames (:func:`in_steps`), bounding memory."""
    return in_steps(lambda xs, c: run_layers(params, layers, xs, c, first, nm), x, cache, frames)
