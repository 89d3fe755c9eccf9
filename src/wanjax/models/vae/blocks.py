"""Modules of the Wan 2.1 and 2.2 causal 3D VAEs, channel-last (``[B, T, H, W, C]``), one chunk at a
time.

Every function maps one chunk of frames plus the causal cache of the frames before it to the chunk's
output plus the updated cache. The cache is a flat dict ``{site name: (frame, frame)}`` of separate
``(B, H, W, C)`` frames (a one-frame step then reads them directly, no concatenation); a missing
entry means "nothing before this chunk" (zero frames), which is how the first chunk runs.

Cache rules (diffusers ``feat_cache``, exact): a causal 3x3x3 conv sees its input with the last two
frames of everything before it in front (zeros at the start) and keeps the last two frames of that
concatenation; ``upsample3d``'s ``time_conv`` skips the first chunk entirely (frame 0 stays one
frame and is not cached); ``downsample3d``'s stride-2 ``time_conv`` keeps one frame and skips the
first chunk. Norms, attention and the 2-D convs are per frame. The Wan 2.2 residual blocks' shortcuts
(:mod:`~wanjax.models.vae.shortcuts`) keep no cache: ``AvgDown3D`` pads each chunk in front to whole
frame pairs (only the first chunk, one frame, needs it), and the first chunk keeps the last of the
frames a temporal ``DupUp3D`` makes of its one frame. The other primitives are in
:mod:`~wanjax.models.vae.ops`, :mod:`~wanjax.models.vae.causal_conv` and
:mod:`~wanjax.models.vae.upsampling`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jax import lax

from wanjax.kernels.attention import attention
from wanjax.models.layers import Params
from wanjax.models.vae.causal_conv import caches_owed_sums, causal_conv3d, owed_with_residual, time_conv
from wanjax.models.vae.config import Layer
from wanjax.models.vae.ops import (
    Cache,
    Numerics,
    after,
    conv2d,
    l2_normalize,
    last_frames,
    matmul,
    norm_silu,
    per_frame,
    pointwise,
    zero_frames,
)
from wanjax.models.vae.shortcuts import avg_down, dup_space, dup_time, dup_up
from wanjax.models.vae.upsampling import caches_lowres_input, conv1_lowres, lowres_history, upsample_conv


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

        h = conv1_lowres(a, cache.get(site1), past, p["conv1"]["kernel"], nm)
        h = (h + p["conv1"]["bias"].astype(jnp.float32)).astype(a.dtype)
        new[site1] = lowres_history(cache.get(site1), u)
    else:
        h, new[site1] = causal_conv3d(a, cache.get(site1), p["conv1"], nm)
    h, new[site2] = causal_conv3d(norm_silu(h, p["norm2"]), cache.get(site2), p["conv2"], nm, shortcut)
    return h


def attention_block(p: Params, x: jax.Array, nm: Numerics) -> jax.Array:
    """Single-head self-attention over the pixels of each frame, with the ``xla`` backend: the VAE's
    programs are split over the mesh by XLA's partitioner, which cannot split a Pallas kernel (the real
    VAEs' 384-dim head takes ``xla`` on every platform anyway)."""
    qkv = pointwise(l2_normalize(x, p["norm"]), p["to_qkv"], nm)

    def frames(f: jax.Array) -> jax.Array:  # (N, h, w, 3C) -> (N, h, w, C); one head, L = h*w
        n, h, w, c3 = f.shape
        q, k, v = (f.reshape(n, h * w, 3, 1, c3 // 3)[:, :, i] for i in range(3))
        return attention(q, k, v, backend="xla", precision=nm.precision).reshape(n, h, w, c3 // 3)

    return pointwise(per_frame(frames, qkv), p["proj"], nm) + x


def upsample(p: Params, x: jax.Array, nm: Numerics) -> jax.Array:
    """``WanResample``'s spatial x2 upsampling (all of upsample2d; upsample3d's second half)."""
    return per_frame(lambda f: upsample_conv(f, p["resample"], nm), x)


FrameArrays = jax.Array | tuple[jax.Array, ...]  # frames on axis 1: one array, or several in step


@dataclasses.dataclass(frozen=True)
class LazyFrames:
    """``length`` frames made on demand: ``make(start, count)`` gives frames ``[start, start + count)``
    (``start`` may be traced), so a loop over them never holds them all. The frames are an array, or
    a tuple of arrays with the same frames (see :func:`time_doubling`). ``real(start)``: whether the
    one-frame step at ``start`` is a frame at all (``None``: every frame is); a step that is not is
    skipped, leaving the cache as it was and giving zeros (the first latent frame decoded by the
    scan's body, see :func:`time_doubling`)."""

    length: int
    make: Callable[[jax.Array | int, int], FrameArrays]
    real: Callable[[jax.Array], jax.Array] | None = None


def frame_count(x: FrameArrays | LazyFrames) -> int:
    """Number of frames of ``x``."""
    return x.length if isinstance(x, LazyFrames) else jax.tree.leaves(x)[0].shape[1]


def time_doubling(
    p: Params,
    layer: Layer,
    x: jax.Array,
    cache: Cache,
    new: Cache,
    first: bool | jax.Array,
    nm: Numerics,
    shortcut: tuple[Layer, jax.Array] | None = None,
) -> FrameArrays | LazyFrames:
    """upsample3d's temporal half: each frame becomes two, except in the first chunk (the reference's
    "Rep" rule: frame 0 is neither doubled nor cached). Frame ``2j + s`` is output channels
    ``[sC, (s+1)C)`` of a (3, 1, 1) ``time_conv`` at input frame ``j``; the doubled frames are
    returned as :class:`LazyFrames`, each computed alone from the input frames (and the two cached
    ones, which stay alive meanwhile) with those channels of the kernel.

    ``shortcut``: the ``dup_up3d`` layer of a Wan 2.2 residual up block and the block's input; each
    frame then comes with :func:`~wanjax.models.vae.shortcuts.dup_time` of its input frame at its
    phase ``s`` (``(frames, shortcut frames)``), which the next segment adds after the spatial half.
    The first chunk keeps the last of the frames ``DupUp3D`` makes of its one frame (the
    reference's ``first_chunk``).

    ``first`` may be traced (a one-frame chunk, decoded by the same program whatever the chunk):
    the two frames are then made as always, except that in the first chunk the first is no frame
    (:attr:`LazyFrames.real`) and the second is ``x`` itself, with ``DupUp3D``'s last phase; the
    cache stays zeros."""
    (site,) = layer.cache_sites
    if first is True:
        new[site] = zero_frames(x, 2)
        if shortcut is None:
            return x
        dup, block_in = shortcut
        return x, dup_time(block_in, dup, dup.factors[0] - 1)
    prev = cache[site]
    new[site] = last_frames(prev, x, 2)
    passes = first is not False  # traced: in the first chunk, x itself is the second frame
    if passes:
        if x.shape[1] != 1:
            raise ValueError("a traced first chunk has one frame")
        new[site] = tuple(jnp.where(first, jnp.zeros_like(f), f) for f in new[site])
    c = x.shape[-1]
    frames = (*prev, *(x[:, i] for i in range(x.shape[1])))
    stacked = jnp.stack(frames, axis=1) if x.shape[1] > 1 else None
    kernel, bias = p["time_conv"]["kernel"].astype(x.dtype), p["time_conv"]["bias"].astype(jnp.float32)

    def make_one(j: jax.Array | int, half: jax.Array | int) -> jax.Array:
        k = lax.dynamic_slice_in_dim(kernel, half * c, c, axis=2)
        y = lax.dynamic_slice_in_dim(bias, half * c, c)
        for kt in range(3):  # the order of time_conv's taps
            window = frames[kt] if stacked is None else lax.dynamic_index_in_dim(stacked, j + kt, 1, False)
            y = y + matmul(window, k[kt], nm)
        y = y.astype(x.dtype)
        return jnp.where(first, x[:, 0], y) if passes else y

    def make(start: jax.Array | int, count: int) -> FrameArrays:
        phases = [((start + f) // 2, (start + f) % 2) for f in range(count)]
        out = jnp.stack([make_one(j, half) for j, half in phases], axis=1)
        if shortcut is None:
            return out
        dup, block_in = shortcut
        shortcut_frames = [
            dup_time(lax.dynamic_index_in_dim(block_in, j, 1), dup, half) for j, half in phases
        ]
        return out, jnp.concatenate(shortcut_frames, axis=1)

    real = (lambda start: jnp.logical_not(first) | (start % 2 == 1)) if passes else None
    return LazyFrames(2 * x.shape[1], make, real)


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
    params: Params,
    layers: Sequence[Layer],
    x: jax.Array,
    cache: Cache,
    first: bool | jax.Array,
    nm: Numerics,
    carried: jax.Array | None = None,
) -> tuple[jax.Array, Cache]:
    """Run ``layers`` in order on one chunk; returns the output and the caches of their sites.

    A ``skip`` layer keeps its input for the shortcut layer that closes its residual block; a
    ``dup_up3d`` adds ``carried`` instead, the temporal half of its shortcut that
    :func:`time_doubling` made with the frames (its block began in the segment before)."""
    new: Cache = {}
    lowres = None  # (input, params) of the spatial upsampling that made x, when it did
    block_in = carried  # what the next shortcut layer adds its shortcut of
    for i, layer in enumerate(layers):
        p = params.get(layer.name)
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
        elif layer.kind == "skip":
            block_in = x
        elif layer.kind in ("avg_down3d", "avg_down2d", "avg_channels"):
            x = x + avg_down(block_in, layer)
        elif layer.kind == "dup_up2d":
            x = x + dup_up(block_in, layer)
        elif layer.kind == "dup_up3d":
            x = x + dup_space(block_in, layer)
        else:  # up3d / up_time: split into segments by the decoder (see time_doubling)
            raise ValueError(f"run_layers cannot run a {layer.kind!r} layer")
        lowres = upsampled
    return x, new


def in_steps(
    fn: Callable[[FrameArrays, Cache], tuple[jax.Array, Cache]],
    x: FrameArrays | LazyFrames,
    cache: Cache,
    frames: int,
) -> tuple[jax.Array, Cache]:
    """``fn`` (frames, cache -> output, new cache) over ``x (B, T, ...)`` (or a tuple of such arrays
    taken in step, or :class:`LazyFrames`, made one step at a time) in steps of ``frames`` frames (a
    ``lax.scan``, ``fn`` traced once), the cache carried from step to step: exact, and memory bounded
    by one step. ``frames`` must divide ``T``. Returns the output and all of ``cache`` updated with
    what ``fn`` wrote. Looping, ``cache`` must already hold every entry ``fn`` writes (the first
    chunk, which creates them, never runs here in pieces).
    """
    lazy = isinstance(x, LazyFrames)
    t = frame_count(x)
    real = x.real if lazy else None
    if t <= frames and real is None:
        y, new = fn(x.make(0, t) if lazy else x, cache)
        return y, {**cache, **new}
    if t % frames or (real is not None and frames != 1):
        raise ValueError(f"{frames} frames per step do not divide a chunk of {t} frames (or skip one)")
    n = t // frames
    if lazy:
        steps, take = jnp.arange(n), lambda i: x.make(i * frames, frames)
    else:
        split = lambda a: jnp.moveaxis(a.reshape(a.shape[0], n, frames, *a.shape[2:]), 1, 0)  # noqa: E731
        steps, take = jax.tree.map(split, x), lambda xs: xs

    def run(state: Cache, xs: FrameArrays) -> tuple[Cache, jax.Array]:
        y, new = fn(take(xs), state)
        return {**state, **new}, y

    def step(state: Cache, xs: FrameArrays) -> tuple[Cache, jax.Array]:
        if real is None:
            return run(state, xs)
        skip = lambda state, xs: (state, jax.tree.map(lambda o: jnp.zeros(o.shape, o.dtype), out))  # noqa: E731
        out = jax.eval_shape(run, state, xs)[1]
        return lax.cond(real(xs), run, skip, state, xs)

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
