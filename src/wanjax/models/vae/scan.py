"""Chunked, static-shape decode and encode of the Wan 2.1 and 2.2 VAEs as a ``lax.scan`` (pure
functions; the config, numerics and chunking are static).

Time runs as a ``lax.scan`` over fixed-size chunks of latent frames (``decode_chunk``) or groups of 4
video frames (``encode_chunk``) with the causal cache as a fixed-shape carry; the first latent frame /
video frame is its own chunk, as in the reference. Inputs are padded to whole chunks and outputs
trimmed, so the scan body has one shape whatever the video length, and memory does not grow with the
number of frames beyond the output. Inside a chunk the work still goes one latent frame (decoder) /
group of 4 frames (encoder) at a time, and each decoder segment after a temporal upsampling runs in
steps of ``frames_per_step`` video frames scaled to its frame rate (one frame by default), inside the
steps of the segment before it; the encoder's layers before its first temporal downsampling (before
the Wan 2.2 residual block holding it) likewise.
Every operation thus has the same shape whatever the chunk size, so chunk sizes give bit-identical
results, and only a few frames of activations are alive at any resolution. Results equal the
reference's per-frame loop (whole-sequence causal convolutions with its first-frame rules) up to
float32 rounding.

Memory of the Wan 2.1 decode at 240x416: 280 MiB of float32 decoder weights and a 917 MiB program:
807 MiB of causal cache (two frames, two owed partial sums, or two low-resolution frames to recompute
from, at each of the 32 cache sites: the state the reference keeps) and ~110 MiB of scratch (three
full-resolution frames of activations at the peak, one frame at each lower resolution); XLA's
packing of them loses almost nothing. Each causal conv runs its taps in an order that lets XLA
write the new owed sums and the folded-in residual straight into the loop carry
(:func:`~wanjax.models.vae.causal_conv.add_in_place`), the doubled frames of a temporal upsampling
are made one step at a time (:class:`~wanjax.models.vae.blocks.LazyFrames`), and each chunk writes
its frames straight into the output.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from wanjax.errors import ConfigError
from wanjax.models.layers import Params
from wanjax.models.vae.blocks import (
    FrameArrays,
    frame_count,
    in_steps,
    run_layers,
    run_layers_in_steps,
    time_doubling,
)
from wanjax.models.vae.config import Layer, VAEConfig, decoder_plan, encoder_plan
from wanjax.models.vae.ops import Cache, Numerics, pointwise

__all__ = [
    "decode_first",
    "decode_frames",
    "decode_latents",
    "decode_next",
    "decoder_chunk",
    "encode_frames",
    "encoder_chunk",
    "first_in_scan",
    "parse_chunk",
    "uncounted",
    "zero_cache",
]

Tallied = tuple[jax.Array, jax.Array]  # frames on an axis, and a count per frame (or their total)


def uncounted(frames: jax.Array) -> Tallied:
    """``frames`` (time on axis 1) with a zero count per frame."""
    return frames, jnp.zeros(frames.shape[1], jnp.int32)


def _decoder_segments(cfg: VAEConfig) -> list[tuple[Layer, ...]]:
    """The decoder plan cut after the temporal half of every ``up3d`` (each then continues as
    ``up2d``): frame rate is constant within a segment and doubles from one segment to the next."""
    segments: list[tuple[Layer, ...]] = [()]
    for layer in decoder_plan(cfg):
        if layer.kind == "up3d":
            time_half = dataclasses.replace(layer, kind="up_time", dim_out=layer.dim_in)
            segments[-1] += (time_half,)
            segments.append((dataclasses.replace(layer, kind="up2d"),))
        else:
            segments[-1] += (layer,)
    return segments


def _carried_shortcut(segment: tuple[Layer, ...]) -> Layer | None:
    """The ``dup_up3d`` shortcut ``segment`` adds right after its first layer (the spatial half of
    the temporal upsampling that began it): its block, and so its input, began in the segment before."""
    return next((layer for layer in segment[:2] if layer.kind == "dup_up3d"), None)


def _block_start(layers: tuple[Layer, ...]) -> int:
    """Index of the last ``skip`` in ``layers``: where the residual block they end in began."""
    return max(i for i, layer in enumerate(layers) if layer.kind == "skip")


def decoder_chunk(
    params: Params,
    cfg: VAEConfig,
    z: jax.Array,
    cache: Cache,
    first: bool | jax.Array,
    nm: Numerics,
    frames: int,
) -> tuple[jax.Array, Cache]:
    """VAE latents of one chunk ``(B, t, h, w, z)`` -> decoded frames (unclamped, patches for the
    Wan 2.2 VAE) and new caches. ``first``: whether the chunk begins the video; traced, the chunk
    is one latent frame and ``cache`` is full (see :func:`decode_latents`).

    Each segment after a temporal upsampling runs in steps of ``frames`` video frames scaled to its
    frame rate (at least one frame), inside the steps of the segment before it: the activations
    alive at once stay a few frames at every resolution, whatever the chunk. A Wan 2.2 residual
    block ending in a temporal upsampling hands its input's ``DupUp3D`` shortcut (its temporal half,
    frame by frame) to the next segment with the doubled frames."""
    segments = _decoder_segments(cfg)
    rates = [2**i for i in range(len(segments))]  # frames per latent frame in each segment

    def run(i: int, x: FrameArrays, cache: Cache) -> tuple[jax.Array, Cache]:
        x, carried = x if isinstance(x, tuple) else (x, None)
        if i + 1 == len(segments):
            return run_layers(params, segments[i], x, cache, first, nm, carried)
        *body, doubling = segments[i]
        dup = _carried_shortcut(segments[i + 1])
        cut = len(body) if dup is None else _block_start(tuple(body))
        y, new = run_layers(params, body[:cut], x, cache, first, nm, carried)
        shortcut = None
        if dup is not None:  # the block's input kept for its shortcut, then the block
            shortcut = (dup, y)
            y, block_new = run_layers(params, body[cut + 1 :], y, cache, first, nm)
            new.update(block_new)
        y = time_doubling(params[doubling.name], doubling, y, cache, new, first, nm, shortcut)
        step = math.gcd(frame_count(y), max(1, frames * rates[i + 1] // rates[-1]))
        return in_steps(lambda xs, c: run(i + 1, xs, c), y, {**cache, **new}, step)

    return run(0, pointwise(z, params["post_quant_conv"], nm), cache)


def _encoder_split(plan: tuple[Layer, ...]) -> int:
    """Where the encoder's layers stop running in steps of video frames: at its first temporal
    downsampling, or at the start of the residual block it is in (whose shortcut averages pairs of
    frames, so needs the block's input for the whole chunk)."""
    split = next((i for i, layer in enumerate(plan) if layer.kind == "down3d"), len(plan))
    open_block = None
    for i, layer in enumerate(plan[:split]):
        if layer.kind == "skip":
            open_block = i
        elif layer.is_shortcut:  # the block is closed
            open_block = None
    return split if open_block is None else open_block


def encoder_chunk(
    params: Params, cfg: VAEConfig, video: jax.Array, cache: Cache, first: bool, nm: Numerics, frames: int
) -> tuple[jax.Array, Cache]:
    """Video frames (patches for the Wan 2.2 VAE) of one chunk -> encoder output (``2 z`` channels,
    before ``quant_conv``), caches."""
    plan = encoder_plan(cfg)
    split = _encoder_split(plan)
    x, new = run_layers_in_steps(params, plan[:split], video, cache, first, nm, frames)
    x, new_rest = run_layers(params, plan[split:], x, cache, first, nm)
    return x, {**new, **new_rest}


def _scan_chunks(
    step: Callable[[Cache, jax.Array, jax.Array], tuple[Cache, Tallied]],
    cache: Cache,
    x: jax.Array,
    chunk: int,
    head: Tallied | None,
    per_chunk: int,
    kept: tuple[int, int],
    axis: int = 1,
) -> Tallied:
    """Scan ``step(cache, chunk's frames, chunk index)`` over ``x (B, t, ...)`` in chunks of ``chunk``
    frames (padded at the end, which causality makes harmless). The output is ``head`` (if any)
    followed by every chunk's ``per_chunk`` output frames along ``axis``, cut to its frames
    ``[kept[0], kept[1])``: each chunk is written into that one buffer as the scan goes (no stacked
    copy to concatenate and rearrange afterwards). Each output comes with counts per frame along
    ``axis``; the total over the frames kept is returned with the output (see :func:`decode_frames`)."""
    b, t = x.shape[:2]
    n = -(-t // chunk)
    x = jnp.pad(x, ((0, 0), (0, n * chunk - t)) + ((0, 0),) * (x.ndim - 2))
    steps = jnp.moveaxis(x.reshape(b, n, chunk, *x.shape[2:]), 1, 0)
    head_len = 0 if head is None else head[0].shape[axis]
    like = head[0] if head is not None else jax.eval_shape(step, cache, steps[0], jnp.int32(0))[1][0]
    shape = list(like.shape)
    shape[axis] = head_len + n * per_chunk
    out = jnp.zeros(shape, like.dtype)
    total = jnp.int32(0)
    if head is not None:
        out = jax.lax.dynamic_update_slice_in_dim(out, head[0], 0, axis)
        total = jnp.sum(head[1][kept[0] :], dtype=jnp.int32)

    def write(carry: tuple[Cache, jax.Array, jax.Array, jax.Array], xs: tuple) -> tuple[tuple, None]:
        state, buf, start, total = carry
        state, (y, counts) = step(state, *xs)
        buf = jax.lax.dynamic_update_slice_in_dim(buf, y, start, axis)
        frame = start + jnp.arange(per_chunk)
        inside = (frame >= kept[0]) & (frame < kept[1])  # not the padding's frames, nor skipped ones
        return (state, buf, start + per_chunk, total + jnp.sum(jnp.where(inside, counts, 0))), None

    carry = (cache, out, jnp.int32(head_len), total)
    (_, out, _, total), _ = jax.lax.scan(write, carry, (steps, jnp.arange(n, dtype=jnp.int32)))
    return jax.lax.slice_in_dim(out, kept[0], kept[1], axis=axis), total


def decode_frames(
    params: Params,
    cfg: VAEConfig,
    vae_latents: jax.Array,
    finish: Callable[[jax.Array], Tallied],
    *,
    nm: Numerics,
    chunk: int | None,
    frames: int,
    time_axis: int = 1,
) -> Tallied:
    """Channel-last VAE latents ``(B, T', h, w, z)`` -> ``finish(frames)`` for ``1 + r (T' - 1)`` frames
    (the decoder's output: patches for the Wan 2.2 VAE, see
    :func:`~wanjax.models.vae.postprocess.unpatchify`).

    ``finish`` (clamp, post-processing, the output's layout, with time on ``time_axis``) runs inside
    each chunk, which writes its result straight into the output; it returns that and a count per
    frame (e.g. of non-finite values), returned summed over the output's frames. ``chunk``: latent
    frames per scan step (``None``: all in one step).

    The first latent frame is decoded alone first (:func:`decode_first`), then ``chunk`` at a time;
    or, where :func:`first_in_scan`, it is the scan's first step, decoded by the same code as the
    others from a zero cache (:func:`decode_latents`): the program then holds the decoder once, not
    twice.
    """
    z = vae_latents.astype(nm.dtype)
    t, r = z.shape[1], cfg.temporal_factor
    out_len = cfg.num_frames(t)
    if first_in_scan(nm, frames):
        chunk = t if chunk is None else min(chunk, t)

        def step(carry: Cache, zs: jax.Array, index: jax.Array) -> tuple[Cache, Tallied]:
            y, new = decode_latents(params, cfg, carry, zs, index == 0, nm=nm)
            return new, finish(y)

        # the first latent frame's one frame is its chunk's r-th (the ones before it are skipped)
        cache = zero_cache(params, cfg, z[:, :1], nm)
        return _scan_chunks(step, cache, z, chunk, None, r * chunk, (r - 1, r - 1 + out_len), time_axis)
    head, cache = decode_first(params, cfg, z[:, :1], finish, nm=nm, frames=frames)
    if t == 1:
        y, counts = head
        return y, jnp.sum(counts, dtype=jnp.int32)
    chunk = t - 1 if chunk is None else min(chunk, t - 1)

    def step_after(carry: Cache, zs: jax.Array, index: jax.Array) -> tuple[Cache, Tallied]:
        out, new = decode_next(params, cfg, carry, zs, finish, nm=nm, frames=frames)
        return new, out

    return _scan_chunks(step_after, cache, z[:, 1:], chunk, head, r * chunk, (0, out_len), time_axis)


def first_in_scan(nm: Numerics, frames: int) -> bool:
    """Whether the first latent frame is decoded by the scan's body (``Numerics.first_frame`` is
    ``scan``, with one frame per step: a step is then a whole frame or skipped whole)."""
    return nm.first_frame == "scan" and frames == 1


def zero_cache(params: Params, cfg: VAEConfig, z0: jax.Array, nm: Numerics) -> Cache:
    """The decoder's causal cache before the first latent frame ``z0``: the cache the first frame
    leaves (its shapes), all zeros ("nothing before": zero frames, owed sums and masks, an empty ring)."""
    nm = nm.for_steps(1)
    shapes = jax.eval_shape(lambda p, z: decoder_chunk(p, cfg, z, {}, True, nm, 1)[1], params, z0)
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def decode_latents(
    params: Params, cfg: VAEConfig, cache: Cache, zs: jax.Array, first: jax.Array, *, nm: Numerics
) -> tuple[jax.Array, Cache]:
    """The latent frames ``zs (B, c, h, w, z)`` after those ``cache`` has seen, one at a time with one
    video frame per step: their ``r c`` frames (unfinished) and the cache after them. ``first``
    (traced): whether ``zs`` begin the video (``cache`` then zeros, see :func:`zero_cache`); their
    first latent frame then gives one frame, the last of its ``r``, the others zeros."""
    nm = nm.for_steps(1)

    def one(carry: tuple[Cache, jax.Array], z1: jax.Array) -> tuple[tuple[Cache, jax.Array], jax.Array]:
        cache, is_first = carry
        y, new = decoder_chunk(params, cfg, z1[:, None], cache, is_first, nm, 1)
        return ({**cache, **new}, jnp.zeros_like(is_first)), y

    if zs.shape[1] == 1:
        (cache, _), y = one((cache, first), zs[:, 0])
        return y, cache
    (cache, _), ys = jax.lax.scan(one, (cache, first), jnp.moveaxis(zs, 1, 0))
    ys = jnp.moveaxis(ys, 0, 1)
    return ys.reshape(ys.shape[0], -1, *ys.shape[3:]), cache


def decode_first(
    params: Params,
    cfg: VAEConfig,
    z0: jax.Array,
    finish: Callable[[jax.Array], Tallied],
    *,
    nm: Numerics,
    frames: int,
) -> tuple[Tallied, Cache]:
    """The first latent frame ``(B, 1, h, w, z)`` (in the numerics' dtype) decoded alone:
    ``finish(frames)`` and the causal cache after it (:func:`decode_frames`' first step)."""
    y0, cache = decoder_chunk(params, cfg, z0, {}, True, nm.for_steps(frames), frames)
    return finish(y0), cache


def decode_next(
    params: Params,
    cfg: VAEConfig,
    cache: Cache,
    zs: jax.Array,
    finish: Callable[[jax.Array], Tallied],
    *,
    nm: Numerics,
    frames: int,
) -> tuple[Tallied, Cache]:
    """The latent frames ``zs (B, c, h, w, z)`` that follow those ``cache`` has seen: ``finish`` of
    their ``r c`` frames and the cache after them (one step of :func:`decode_frames`' scan; the same
    operations whatever ``c``, so decoding in such parts gives its frames bit for bit)."""
    latent_step = math.gcd(zs.shape[1], max(1, frames // cfg.temporal_factor))
    video_step = math.gcd(frames, cfg.temporal_factor * latent_step)
    nm = nm.for_steps(frames)
    decode_step = lambda z1, c: decoder_chunk(params, cfg, z1, c, False, nm, video_step)  # noqa: E731
    y, new = in_steps(decode_step, zs, cache, latent_step)
    return finish(y), new


def encode_frames(
    params: Params, cfg: VAEConfig, video: jax.Array, *, nm: Numerics, chunk: int | None, frames: int
) -> jax.Array:
    """Channel-last video ``(B, T, H, W, C)`` (patches for the Wan 2.2 VAE, see
    :func:`~wanjax.models.vae.postprocess.patchify`) -> posterior mean ``(B, T', h, w, z)`` (VAE latents).

    Frame 0 is encoded alone, then groups of 4 frames, ``chunk`` groups per scan step (``None``: all);
    frames after the last complete group are dropped, as in the reference.
    """
    x = video.astype(nm.dtype)
    groups = (x.shape[1] - 1) // 4
    y, cache = encoder_chunk(params, cfg, x[:, :1], {}, True, nm, frames)
    if groups:
        chunk = groups if chunk is None else min(chunk, groups)
        group_step = math.gcd(chunk, max(1, frames // 4))
        video_step = math.gcd(frames, 4 * group_step)

        def step(carry: Cache, xs: jax.Array, index: jax.Array) -> tuple[Cache, Tallied]:
            encode_step = lambda x1, c: encoder_chunk(params, cfg, x1, c, False, nm, video_step)  # noqa: E731
            out, new = in_steps(encode_step, xs, carry, 4 * group_step)
            return new, uncounted(out)

        per_chunk, out_len = (4 * n // cfg.temporal_factor for n in (chunk, groups))
        y, _ = _scan_chunks(
            step, cache, x[:, 1 : 1 + 4 * groups], 4 * chunk, uncounted(y), per_chunk, (0, 1 + out_len)
        )
    z = cfg.z_dim
    quant = params["quant_conv"]
    mean = pointwise(y, {"kernel": quant["kernel"][:, :z], "bias": quant["bias"][:z]}, nm)
    return mean


def parse_chunk(value: int | str | None, name: str) -> int | None:
    """A chunk-size option: a positive integer (or its digits), or ``"all"``/``None`` (-> ``None``)."""
    if value is None or value == "all":
        return None
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer or 'all', got {value!r}")
    return value
