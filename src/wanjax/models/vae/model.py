"""The Wan 2.1 causal 3D VAE (``AutoencoderKLWan``): chunked, static-shape decode and encode.

Two latent conventions, never to be mixed up:

* **VAE latents** (``vae_latents``): what diffusers' ``vae.decode`` takes and ``vae.encode`` returns.
* **Normalised latents** (``normalized_latents``): what the transformer denoises and produces,
  ``(vae_latents - latents_mean) / latents_std`` per channel.

:class:`WanVAE` ``.decode`` takes VAE latents (diffusers' convention) and returns float video;
``.decode_uint8`` takes normalised latents (the transformer's output), de-normalises them as the
reference pipeline does (``latents / (1 / std) + mean``) and returns ``uint8 [B, T, H, W, 3]`` frames
computed on the device; ``.encode`` returns the posterior mean as VAE latents.

Time runs as a ``lax.scan`` over fixed-size chunks of latent frames (``decode_chunk``) or groups of 4
video frames (``encode_chunk``) with the causal cache as a fixed-shape carry; the first latent frame /
video frame is its own chunk, as in the reference. Inputs are padded to whole chunks and outputs
trimmed, so the scan body has one shape whatever the video length, and memory does not grow with the
number of frames beyond the output. Inside a chunk the work still goes one latent frame (decoder) /
group of 4 frames (encoder) at a time, and each decoder segment after a temporal upsampling runs in
steps of ``frames_per_step`` video frames scaled to its frame rate (one frame by default), inside the
steps of the segment before it; the encoder's layers before its first temporal downsampling likewise.
Every operation thus has the same shape whatever the chunk size, so chunk sizes give bit-identical
results, and only a few frames of activations are alive at any resolution. Results equal the
reference's per-frame loop (whole-sequence causal convolutions with its first-frame rules) up to
float32 rounding.

Compilation: each input shape gets one program (the scan's trip count is static); its size,
compile time (~4-5 s on CPU for the real VAE) and memory do not depend on the number of frames.
On the CPU, programs for frames of 256x256 pixels and more are compiled in a short-lived child
process and loaded from their serialized executables (:mod:`wanjax.runtime.child_compile`), which keeps
the ~100 MiB the compiler leaves behind out of this process; the executables are kept beside the
persistent compilation cache, so the next run compiles nothing.
Memory at 240x416: 280 MiB of float32 decoder weights and a 917 MiB program: 807 MiB of causal
cache (two frames, two owed partial sums, or two low-resolution frames to recompute from, at each
of the 32 cache sites: the state the reference keeps) and ~110 MiB of scratch (three
full-resolution frames of activations at the peak, one frame at each lower resolution); XLA's
packing of them loses almost nothing. Each causal conv runs its taps in an order that lets XLA
write the new owed sums and the folded-in residual straight into the loop carry
(:func:`~wanjax.models.vae.blocks.add_in_place`), the doubled frames of a temporal upsampling are
made one step at a time (:class:`~wanjax.models.vae.blocks.LazyFrames`), and each chunk writes its
frames straight into the output.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from wanjax.errors import ConfigError
from wanjax.io.checkpoint import (
    REPLICATED,
    LeafSource,
    ShardingFn,
    abstract_params,
    check_checkpoint,
    first_device,
    load_params,
)
from wanjax.io.component import Component
from wanjax.models.config import parse_dtype
from wanjax.models.layers import Params
from wanjax.models.vae.blocks import (
    CONV_IMPLS,
    UPSAMPLE_IMPLS,
    Cache,
    LazyFrames,
    Numerics,
    in_steps,
    pointwise,
    run_layers,
    run_layers_in_steps,
    time_doubling,
)
from wanjax.models.vae.config import Layer, VAEConfig, decoder_plan, encoder_plan
from wanjax.runtime import child_compile

__all__ = ["Tiling", "VAEConfig", "WanVAE", "checkpoint_spec", "load_vae"]

# ----------------------------------------------------------------------------------------------
# Checkpoint layout (PyTorch conv weights -> channel-last kernels, NumPy views only)


def _conv3d_kernel(a: np.ndarray) -> np.ndarray:
    return a.transpose(2, 3, 4, 1, 0)  # (O, I, kt, kh, kw) -> (kt, kh, kw, I, O)


def _conv2d_kernel(a: np.ndarray) -> np.ndarray:
    return a.transpose(2, 3, 1, 0)  # (O, I, kh, kw) -> (kh, kw, I, O)


def _time_kernel(a: np.ndarray) -> np.ndarray:
    return a[:, :, :, 0, 0].transpose(2, 1, 0)  # (O, I, 3, 1, 1) -> (3, I, O)


def _pointwise_kernel(a: np.ndarray) -> np.ndarray:
    return a.reshape(a.shape[0], a.shape[1]).T  # (O, I, 1, 1[, 1]) -> (I, O)


def _vector(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1)  # RMS gamma (C, 1, 1[, 1]) -> (C,)


# The VAE's (small) weights are replicated on every device.
def _conv(name: str, shape: tuple[int, ...], layout: Callable[[np.ndarray], np.ndarray]) -> Params:
    return {
        "kernel": LeafSource((f"{name}.weight",), shape, layout, axes=REPLICATED),
        "bias": LeafSource((f"{name}.bias",), (shape[0],), axes=REPLICATED),
    }


def _gamma(name: str, dim: int, images: bool = False) -> LeafSource:
    return LeafSource((f"{name}.gamma",), (dim, 1, 1) if images else (dim, 1, 1, 1), _vector, axes=REPLICATED)


def _layer_spec(layer: Layer) -> Params:
    name, d_in, d_out = layer.name, layer.dim_in, layer.dim_out
    if layer.kind == "conv":
        return _conv(name, (d_out, d_in, 3, 3, 3), _conv3d_kernel)
    if layer.kind == "res":
        spec = {
            "norm1": _gamma(f"{name}.norm1", d_in),
            "conv1": _conv(f"{name}.conv1", (d_out, d_in, 3, 3, 3), _conv3d_kernel),
            "norm2": _gamma(f"{name}.norm2", d_out),
            "conv2": _conv(f"{name}.conv2", (d_out, d_out, 3, 3, 3), _conv3d_kernel),
        }
        if d_in != d_out:
            spec["conv_shortcut"] = _conv(f"{name}.conv_shortcut", (d_out, d_in, 1, 1, 1), _pointwise_kernel)
        return spec
    if layer.kind == "attn":
        return {
            "norm": _gamma(f"{name}.norm", d_in, images=True),
            "to_qkv": _conv(f"{name}.to_qkv", (3 * d_in, d_in, 1, 1), _pointwise_kernel),
            "proj": _conv(f"{name}.proj", (d_in, d_in, 1, 1), _pointwise_kernel),
        }
    if layer.kind == "head":
        return {
            "norm_out": _gamma(name.replace("conv_out", "norm_out"), d_in),
            "conv_out": _conv(name, (d_out, d_in, 3, 3, 3), _conv3d_kernel),
        }
    spec = {"resample": _conv(f"{name}.resample.1", (d_out, d_in, 3, 3), _conv2d_kernel)}
    if layer.kind == "up3d":
        spec["time_conv"] = _conv(f"{name}.time_conv", (2 * d_in, d_in, 3, 1, 1), _time_kernel)
    elif layer.kind == "down3d":
        spec["time_conv"] = _conv(f"{name}.time_conv", (d_in, d_in, 3, 1, 1), _time_kernel)
    return spec


def checkpoint_spec(cfg: VAEConfig, part: str = "all") -> Params:
    """Spec tree (module name -> params) of the ``decoder`` (+ ``post_quant_conv``), the ``encoder``
    (+ ``quant_conv``), or ``all``. Module names are the checkpoint prefixes."""
    z = cfg.z_dim
    spec: Params = {}
    if part in ("decoder", "all"):
        spec["post_quant_conv"] = _conv("post_quant_conv", (z, z, 1, 1, 1), _pointwise_kernel)
        spec.update({layer.name: _layer_spec(layer) for layer in decoder_plan(cfg)})
    if part in ("encoder", "all"):
        spec["quant_conv"] = _conv("quant_conv", (2 * z, 2 * z, 1, 1, 1), _pointwise_kernel)
        spec.update({layer.name: _layer_spec(layer) for layer in encoder_plan(cfg)})
    return spec


VAE = Component(
    "vae",
    config=VAEConfig,
    weight_stems=("diffusion_pytorch_model", "model"),
    spec=lambda cfg, names: checkpoint_spec(cfg),
)


# ----------------------------------------------------------------------------------------------
# Chunked decode / encode (pure functions; cfg, numerics and chunking are static)


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


def _decoder_chunk(
    params: Params, cfg: VAEConfig, z: jax.Array, cache: Cache, first: bool, nm: Numerics, frames: int
) -> tuple[jax.Array, Cache]:
    """VAE latents of one chunk ``(B, t, h, w, z)`` -> decoded frames (unclamped) and new caches.

    Each segment after a temporal upsampling runs in steps of ``frames`` video frames scaled to its
    frame rate (at least one frame), inside the steps of the segment before it: the activations
    alive at once stay a few frames at every resolution, whatever the chunk."""
    segments = _decoder_segments(cfg)
    rates = [2**i for i in range(len(segments))]  # frames per latent frame in each segment

    def run(i: int, x: jax.Array, cache: Cache) -> tuple[jax.Array, Cache]:
        if i + 1 == len(segments):
            return run_layers(params, segments[i], x, cache, first, nm)
        *body, doubling = segments[i]
        y, new = run_layers(params, body, x, cache, first, nm)
        y = time_doubling(params[doubling.name], doubling, y, cache, new, first, nm)
        length = y.length if isinstance(y, LazyFrames) else y.shape[1]
        step = math.gcd(length, max(1, frames * rates[i + 1] // rates[-1]))
        return in_steps(lambda xs, c: run(i + 1, xs, c), y, {**cache, **new}, step)

    return run(0, pointwise(z, params["post_quant_conv"], nm), cache)


def _encoder_chunk(
    params: Params, cfg: VAEConfig, video: jax.Array, cache: Cache, first: bool, nm: Numerics, frames: int
) -> tuple[jax.Array, Cache]:
    """Video frames of one chunk -> encoder output (``2 z`` channels, before ``quant_conv``), caches."""
    plan = encoder_plan(cfg)
    split = next((i for i, layer in enumerate(plan) if layer.kind == "down3d"), len(plan))
    x, new = run_layers_in_steps(params, plan[:split], video, cache, first, nm, frames)
    x, new_rest = run_layers(params, plan[split:], x, cache, first, nm)
    return x, {**new, **new_rest}


def _scan_chunks(
    step: Callable[[Cache, jax.Array], tuple[Cache, jax.Array]],
    cache: Cache,
    x: jax.Array,
    chunk: int,
    head: jax.Array,
    per_chunk: int,
    out_len: int,
    axis: int = 1,
) -> jax.Array:
    """Scan ``step`` over ``x (B, t, ...)`` in chunks of ``chunk`` frames (padded at the end, which
    causality makes harmless). The output is ``head`` followed by every chunk's ``per_chunk``
    output frames along ``axis``, trimmed to ``out_len`` frames after ``head``: each chunk is
    written into that one buffer as the scan goes (no stacked copy to concatenate and rearrange
    afterwards)."""
    b, t = x.shape[:2]
    n = -(-t // chunk)
    x = jnp.pad(x, ((0, 0), (0, n * chunk - t)) + ((0, 0),) * (x.ndim - 2))
    steps = jnp.moveaxis(x.reshape(b, n, chunk, *x.shape[2:]), 1, 0)
    shape = list(head.shape)
    shape[axis] += n * per_chunk
    out = jax.lax.dynamic_update_slice_in_dim(jnp.zeros(shape, head.dtype), head, 0, axis)

    def write(carry: tuple[Cache, jax.Array, jax.Array], xs: jax.Array) -> tuple[tuple, None]:
        state, buf, start = carry
        state, y = step(state, xs)
        return (state, jax.lax.dynamic_update_slice_in_dim(buf, y, start, axis), start + per_chunk), None

    start = jnp.asarray(head.shape[axis], jnp.int32)
    (_, out, _), _ = jax.lax.scan(write, (cache, out, start), steps)
    return jax.lax.slice_in_dim(out, 0, head.shape[axis] + out_len, axis=axis)


def decode_frames(
    params: Params,
    cfg: VAEConfig,
    vae_latents: jax.Array,
    finish: Callable[[jax.Array], jax.Array],
    *,
    nm: Numerics,
    chunk: int | None,
    frames: int,
    time_axis: int = 1,
) -> jax.Array:
    """Channel-last VAE latents ``(B, T', h, w, z)`` -> ``finish(frames)`` for ``1 + r (T' - 1)`` frames.

    ``finish`` (clamp, post-processing, the output's layout, with time on ``time_axis``) runs inside
    each chunk, which writes its result straight into the output. ``chunk``: latent frames per
    scan step after the first (``None``: all in one step).
    """
    z = vae_latents.astype(nm.dtype)
    t = z.shape[1]
    nm = nm.for_steps(frames)
    y0, cache = _decoder_chunk(params, cfg, z[:, :1], {}, True, nm, frames)
    if t == 1:
        return finish(y0)
    chunk = t - 1 if chunk is None else min(chunk, t - 1)
    latent_step = math.gcd(chunk, max(1, frames // cfg.temporal_factor))
    video_step = math.gcd(frames, cfg.temporal_factor * latent_step)

    def step(carry: Cache, zs: jax.Array) -> tuple[Cache, jax.Array]:
        decode_step = lambda z1, c: _decoder_chunk(params, cfg, z1, c, False, nm, video_step)  # noqa: E731
        y, new = in_steps(decode_step, zs, carry, latent_step)
        return new, finish(y)

    r = cfg.temporal_factor
    return _scan_chunks(step, cache, z[:, 1:], chunk, finish(y0), r * chunk, r * (t - 1), time_axis)


def encode_frames(
    params: Params, cfg: VAEConfig, video: jax.Array, *, nm: Numerics, chunk: int | None, frames: int
) -> jax.Array:
    """Channel-last video ``(B, T, H, W, C)`` -> posterior mean ``(B, T', h, w, z)`` (VAE latents).

    Frame 0 is encoded alone, then groups of 4 frames, ``chunk`` groups per scan step (``None``: all);
    frames after the last complete group are dropped, as in the reference.
    """
    x = video.astype(nm.dtype)
    groups = (x.shape[1] - 1) // 4
    y, cache = _encoder_chunk(params, cfg, x[:, :1], {}, True, nm, frames)
    if groups:
        chunk = groups if chunk is None else min(chunk, groups)
        group_step = math.gcd(chunk, max(1, frames // 4))
        video_step = math.gcd(frames, 4 * group_step)

        def step(carry: Cache, xs: jax.Array) -> tuple[Cache, jax.Array]:
            encode_step = lambda x1, c: _encoder_chunk(params, cfg, x1, c, False, nm, video_step)  # noqa: E731
            out, new = in_steps(encode_step, xs, carry, 4 * group_step)
            return new, out

        per_chunk, out_len = (4 * n // cfg.temporal_factor for n in (chunk, groups))
        y = _scan_chunks(step, cache, x[:, 1 : 1 + 4 * groups], 4 * chunk, y, per_chunk, out_len)
    z = cfg.z_dim
    quant = params["quant_conv"]
    mean = pointwise(y, {"kernel": quant["kernel"][:, :z], "bias": quant["bias"][:z]}, nm)
    return mean


@dataclasses.dataclass(frozen=True)
class Tiling:
    """Spatial tiling of the decode, as diffusers' ``enable_tiling()`` (sizes in pixels).

    Latent tiles of ``size // 8`` start every ``stride // 8`` latents (the last ones clipped at the
    border); each is decoded on its own, with its own causal cache, over all frames. In raster order
    each tile's first ``size - stride`` pixel rows are blended with the (already blended) tile above,
    ``row[y] = above[y - blend] * (1 - y / blend) + row[y] * (y / blend)``, then its first columns
    likewise with the tile to its left; then it is cropped to ``stride x stride`` and the mosaic to
    the frame size. Used only when the frame is larger than ``size`` in either dimension. Numbers
    equal diffusers' tiled decode; they are not equal to an untiled decode (seams are blended, and
    each tile sees zero padding at its borders). Memory: one tile's decode plus every tile's float
    frames until they are blended (about twice the float video), so it grows with the length.
    """

    size: int = 256
    stride: int = 192

    def __post_init__(self) -> None:
        if not 0 < self.stride <= self.size:
            raise ConfigError(f"tiling needs 0 < stride <= size, got size={self.size}, stride={self.stride}")

    @classmethod
    def parse(cls, text: str) -> Tiling:
        """``"SIZE"`` or ``"SIZE:STRIDE"`` in pixels; the stride defaults to three quarters of the
        size (256 -> 192, diffusers' default)."""
        size, colon, stride = text.partition(":")
        if not size.isdigit() or (colon and not stride.isdigit()):
            raise ConfigError(f"tiling must be SIZE or SIZE:STRIDE in pixels (e.g. 256:192), got {text!r}")
        return cls(int(size), int(stride) if stride else int(size) * 3 // 4)

    def check_stride(self, spatial_factor: int) -> None:
        """Raise unless the stride is at least one latent pixel (``spatial_factor`` pixels)."""
        if self.stride < spatial_factor:
            raise ConfigError(
                f"stride {self.stride} is less than one latent pixel ({spatial_factor} pixels); "
                f"use a stride of at least {spatial_factor}"
            )


def _blend(before: jax.Array, tile: jax.Array, axis: int, extent: int) -> jax.Array:
    """diffusers ``blend_v``/``blend_h``: ramp ``tile``'s first ``extent`` rows/columns from the end
    of ``before`` into its own, along ``axis``."""
    extent = min(before.shape[axis], tile.shape[axis], extent)
    if extent == 0:
        return tile
    y = np.arange(extent, dtype=np.float64)
    shape = [1] * tile.ndim
    shape[axis] = extent
    keep = (1 - y / extent).astype(np.float32).reshape(shape)
    take = (y / extent).astype(np.float32).reshape(shape)
    head = jax.lax.slice_in_dim(before, before.shape[axis] - extent, before.shape[axis], axis=axis)
    first = jax.lax.slice_in_dim(tile, 0, extent, axis=axis)
    blended = (head * keep + first * take).astype(tile.dtype)
    return jnp.concatenate([blended, jax.lax.slice_in_dim(tile, extent, tile.shape[axis], axis=axis)], axis)


def decode_frames_tiled(
    params: Params,
    cfg: VAEConfig,
    vae_latents: jax.Array,
    *,
    nm: Numerics,
    chunk: int | None,
    frames: int,
    tiling: Tiling,
) -> jax.Array:
    """:func:`decode_frames` (unclamped float frames) through :class:`Tiling`. Tiles of one shape
    run one after another under ``lax.map``, so each tile shape is compiled once."""
    h, w = vae_latents.shape[2:4]
    scale = cfg.spatial_factor
    size, stride = tiling.size // scale, tiling.stride // scale
    grid = [(i, j) for i in range(0, h, stride) for j in range(0, w, stride)]
    groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for i, j in grid:
        groups.setdefault((min(size, h - i), min(size, w - j)), []).append((i, j))
    decoded: dict[tuple[int, int], jax.Array] = {}
    for (th, tw), starts in groups.items():
        tiles = jnp.stack([vae_latents[:, :, i : i + th, j : j + tw] for i, j in starts])
        outs = jax.lax.map(
            lambda z: decode_frames(params, cfg, z, lambda v: v, nm=nm, chunk=chunk, frames=frames), tiles
        )
        decoded.update({start: outs[n] for n, start in enumerate(starts)})
    blend = tiling.size - tiling.stride
    rows = []
    for i in range(0, h, stride):
        row = []
        for j in range(0, w, stride):
            tile = decoded[(i, j)]
            if i > 0:
                tile = _blend(decoded[(i - stride, j)], tile, 2, blend)
            if j > 0:
                tile = _blend(decoded[(i, j - stride)], tile, 3, blend)
            decoded[(i, j)] = tile  # later neighbours blend with the blended, uncropped tile
            row.append(tile[:, :, : tiling.stride, : tiling.stride])
        rows.append(jnp.concatenate(row, axis=3))
    return jnp.concatenate(rows, axis=2)[:, :, : h * scale, : w * scale]


def _decode_any(
    params: Params,
    cfg: VAEConfig,
    z: jax.Array,
    finish: Callable[[jax.Array], jax.Array],
    time_axis: int,
    *,
    nm: Numerics,
    chunk: int | None,
    frames: int,
    tiling: Tiling | None,
) -> jax.Array:
    """Channel-last VAE latents -> ``finish(frames)`` (time on ``time_axis``), tiled when ``tiling``
    applies to this size."""
    size = None if tiling is None else tiling.size // cfg.spatial_factor
    if size is None or (z.shape[2] <= size and z.shape[3] <= size):
        return decode_frames(params, cfg, z, finish, nm=nm, chunk=chunk, frames=frames, time_axis=time_axis)
    video = decode_frames_tiled(params, cfg, z, nm=nm, chunk=chunk, frames=frames, tiling=tiling)
    return finish(video)


def denormalize_latents(cfg: VAEConfig, normalized_latents: jax.Array) -> jax.Array:
    """Transformer-space ``(B, z, T', h, w)`` -> VAE latents, exactly as the reference pipeline:
    ``latents / (1 / std) + mean`` in float32."""
    mean, inv_std = _latent_stats(cfg)
    return normalized_latents.astype(jnp.float32) / inv_std + mean


def normalize_latents(cfg: VAEConfig, vae_latents: jax.Array) -> jax.Array:
    """VAE latents ``(B, z, T', h, w)`` -> transformer space: ``(latents - mean) * (1 / std)``."""
    mean, inv_std = _latent_stats(cfg)
    return (vae_latents.astype(jnp.float32) - mean) * inv_std


def _latent_stats(cfg: VAEConfig) -> tuple[np.ndarray, np.ndarray]:
    shape = (1, cfg.z_dim, 1, 1, 1)
    mean = np.asarray(cfg.latents_mean, np.float32).reshape(shape)
    inv_std = (np.float32(1.0) / np.asarray(cfg.latents_std, np.float32)).reshape(shape)
    return mean, inv_std


def clamp(video: jax.Array) -> jax.Array:
    return jnp.clip(video, -1.0, 1.0)


def to_uint8(video: jax.Array) -> jax.Array:
    """Clamped video in [-1, 1] -> uint8, as diffusers' post-processing:
    ``round(clamp(v * 0.5 + 0.5, 0, 1) * 255)`` in float32."""
    v = jnp.clip(video.astype(jnp.float32) * 0.5 + 0.5, 0.0, 1.0)
    return jnp.round(v * 255.0).astype(jnp.uint8)


def _to_channels_last(x: jax.Array) -> jax.Array:
    return jnp.moveaxis(x, 1, -1)


def _to_channels_first(x: jax.Array) -> jax.Array:
    return jnp.moveaxis(x, -1, 1)


def decode(
    params: Params,
    cfg: VAEConfig,
    vae_latents: jax.Array,
    *,
    nm: Numerics,
    chunk: int | None,
    frames: int,
    tiling: Tiling | None = None,
) -> jax.Array:
    """diffusers ``vae.decode``: VAE latents ``(B, z, T', h, w)`` -> video ``(B, 3, T, H, W)`` in [-1, 1]."""
    z = _to_channels_last(vae_latents)
    finish = lambda v: _to_channels_first(clamp(v))  # noqa: E731
    return _decode_any(params, cfg, z, finish, 2, nm=nm, chunk=chunk, frames=frames, tiling=tiling)


def decode_uint8(
    params: Params,
    cfg: VAEConfig,
    normalized_latents: jax.Array,
    *,
    nm: Numerics,
    chunk: int | None,
    frames: int,
    tiling: Tiling | None = None,
) -> jax.Array:
    """Transformer output ``(B, z, T', h, w)`` -> ``uint8 (B, T, H, W, 3)`` frames, all on the device."""
    z = _to_channels_last(denormalize_latents(cfg, normalized_latents))
    finish = lambda v: to_uint8(clamp(v))  # noqa: E731
    return _decode_any(params, cfg, z, finish, 1, nm=nm, chunk=chunk, frames=frames, tiling=tiling)


def encode(
    params: Params, cfg: VAEConfig, video: jax.Array, *, nm: Numerics, chunk: int | None, frames: int
) -> jax.Array:
    """diffusers ``vae.encode(video).latent_dist.mean``: ``(B, 3, T, H, W)`` in [-1, 1] -> VAE latents."""
    mean = encode_frames(params, cfg, _to_channels_last(video), nm=nm, chunk=chunk, frames=frames)
    return _to_channels_first(mean)


# ----------------------------------------------------------------------------------------------
# Loading and the callable model


def compiler_options() -> dict[str, Any] | None:
    """Per-program XLA options: on CPU, the memory-minimising scheduler (XLA's default orders
    independent full-frame convolutions for concurrency and keeps several frames' worth of outputs
    alive at once; this one lowers the chunk's peak by hundreds of MiB at 480p)."""
    if jax.default_backend() == "cpu":
        return {
            "xla_cpu_scheduler_type": "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED",
            "xla_cpu_copy_insertion_use_region_analysis": True,  # fewer loop-carry copies of the cache
        }
    return None


@functools.cache
def _jitted(name: str) -> Callable[..., jax.Array]:
    """The jitted entry point; compiled programs are shared by every WanVAE with the same settings."""
    fn = {"decode": decode, "decode_uint8": decode_uint8, "encode": encode}[name]
    static = ("cfg", "nm", "chunk", "frames") + (("tiling",) if name != "encode" else ())
    return jax.jit(fn, static_argnames=static, compiler_options=compiler_options())


_INPUT = {"decode": "vae_latents", "decode_uint8": "normalized_latents", "encode": "video"}

# Frames this large (pixels) have their programs compiled in a child process by default: there the
# decode's own memory is hundreds of MiB and the ~1.5 s a child costs is small beside its run time.
CHILD_COMPILE_MIN_PIXELS = 256 * 256


def _signature(tree: Any) -> tuple[Any, tuple[tuple[Any, ...], ...]]:
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((a.shape, jnp.dtype(a.dtype), getattr(a, "sharding", None)) for a in leaves)


def _unplaced(signature: Any) -> Any:
    """A :func:`_signature` without shardings (leaves on the default device)."""
    treedef, leaves = signature
    return treedef, tuple((shape, dtype, None) for shape, dtype, _ in leaves)


def lower_program(
    name: str, statics: tuple[tuple[str, Any], ...], params_sig: Any, x_sig: Any
) -> tuple[jax.stages.Lowered, dict[str, Any]]:
    """The program ``name`` for weights and input of these signatures (see :func:`_signature`),
    lowered, and the compiler options it compiles with."""
    treedef, leaves = params_sig
    params = jax.tree.unflatten(treedef, [jax.ShapeDtypeStruct(s, d, sharding=sh) for s, d, sh in leaves])
    x = jax.ShapeDtypeStruct(x_sig[0], x_sig[1], sharding=x_sig[2])
    lowered = _jitted(name).lower(params, **{_INPUT[name]: x}, **dict(statics))
    return lowered, compiler_options() or {}


@functools.lru_cache(maxsize=64)
def _compiled(
    name: str, statics: tuple[tuple[str, Any], ...], params_sig: Any, x_sig: Any, in_child: bool
) -> Any:
    """Compile one program ahead of its first run (shared by every WanVAE with the same settings),
    in a child process if ``in_child`` (falling back to this one), then hand the freed heap back to
    the OS before the program allocates its own."""
    compiled = None
    if in_child:
        try:
            compiled = child_compile.compile_in_child(
                f"{__name__}:lower_program", name, statics, params_sig, x_sig
            )
        except child_compile.ChildCompileError as err:
            warnings.warn(f"{err}; compiling in this process instead", RuntimeWarning, stacklevel=2)
    if compiled is None:
        compiled = lower_program(name, statics, params_sig, x_sig)[0].compile()
    release_free_heap()
    return compiled


def release_free_heap() -> None:
    """``malloc_trim(0)`` where glibc provides it: XLA's compiler frees ~200 MiB on the real VAE that
    glibc would otherwise keep mapped (and counted in the process's memory) for the whole run."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class _Weights:
    """A part's weights, or a function reading them on first use, and what programs are compiled
    for: their abstract tree if given (so compiling needs no weights), else the weights."""

    def __init__(self, source: Callable[[], Params] | Params | None, like: Params | None):
        self._source, self._like = source, like

    @functools.cached_property
    def value(self) -> Params:
        if self._source is None:
            raise ConfigError("this WanVAE was built without encoder weights")
        return self._source() if callable(self._source) else self._source

    @property
    def like(self) -> Params:
        return self.value if self._like is None else self._like


def parse_chunk(value: int | str | None, name: str) -> int | None:
    """A chunk-size option: a positive integer (or its digits), or ``"all"``/``None`` (-> ``None``)."""
    if value is None or value == "all":
        return None
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer or 'all', got {value!r}")
    return value


class WanVAE:
    """A loaded Wan 2.1 VAE. See the module docstring for the two latent conventions.

    * ``decode(vae_latents)``: ``(B, z, T', h, w)`` VAE latents (diffusers' ``vae.decode`` input)
      -> float video ``(B, 3, 1 + 4 (T'-1), H, W)`` in [-1, 1], in the activation dtype.
    * ``decode_uint8(normalized_latents)``: the transformer's output -> ``uint8 (B, T, H, W, 3)``.
    * ``encode(video)``: ``(B, 3, T, H, W)`` in [-1, 1] -> posterior mean ``(B, z, T', h, w)``
      (VAE latents; :meth:`normalize_latents` maps them to the transformer's space).

    Each method is compiled once per input shape. ``params`` and ``encoder_params`` are the weights
    or functions that read them on first use; with their abstract trees (``params_like``,
    ``encoder_like``: shapes, dtypes, shardings) a program is compiled before the weights it needs
    are read, so they take the heap the compiler freed (``load_vae`` does this).
    ``tiling`` (a :class:`Tiling`) decodes large frames in blended spatial tiles, as diffusers'
    ``enable_tiling()``. ``compile_in_child``: compile programs in a short-lived child process
    (:mod:`wanjax.runtime.child_compile`), which keeps the compiler's leftover heap (~100 MiB for the
    real VAE) out of this one; ``None`` (default): for frames of at least
    :data:`CHILD_COMPILE_MIN_PIXELS` pixels. Only on the CPU backend in one process, for unsharded
    inputs; a failing child falls back to compiling here (with a warning).
    """

    def __init__(
        self,
        cfg: VAEConfig,
        params: Callable[[], Params] | Params,
        dtype: Any = jnp.float32,
        *,
        params_like: Params | None = None,
        encoder_params: Callable[[], Params] | Params | None = None,
        encoder_like: Params | None = None,
        decode_chunk: int | str | None = 1,
        encode_chunk: int | str | None = 1,
        frames_per_step: int = 1,
        conv: str = "auto",
        upsample: str = "subpixel",
        tiling: Tiling | None = None,
        compile_in_child: bool | None = None,
    ):
        if conv == "auto":
            conv = "taps" if jax.default_backend() == "cpu" else "conv3d"
        if conv not in CONV_IMPLS:
            raise ConfigError(f"unknown conv formulation {conv!r}; use one of auto, {', '.join(CONV_IMPLS)}")
        if upsample not in UPSAMPLE_IMPLS:
            raise ConfigError(
                f"unknown upsample formulation {upsample!r}; use one of {', '.join(UPSAMPLE_IMPLS)}"
            )
        if isinstance(frames_per_step, bool) or not isinstance(frames_per_step, int) or frames_per_step < 1:
            raise ConfigError(f"frames_per_step must be a positive integer, got {frames_per_step!r}")
        self.cfg = cfg
        self._weights = {
            "decoder": _Weights(params, params_like),
            "encoder": _Weights(encoder_params, encoder_like),
        }
        self.dtype = jnp.dtype(dtype)
        self.numerics = Numerics(self.dtype, conv, upsample)
        self.decode_chunk = parse_chunk(decode_chunk, "decode_chunk")
        self.encode_chunk = parse_chunk(encode_chunk, "encode_chunk")
        if tiling is not None:
            try:
                tiling.check_stride(cfg.spatial_factor)
            except ConfigError as e:
                raise ConfigError(f"tiling {e}") from None
        self.frames_per_step = frames_per_step
        self.compile_in_child = compile_in_child
        opts = {"cfg": cfg, "nm": self.numerics, "frames": frames_per_step}
        self.tiling = tiling
        dec = {"chunk": self.decode_chunk, "tiling": tiling, **opts}
        enc = {"chunk": self.encode_chunk, **opts}
        self._statics = {
            name: tuple(sorted(kw.items()))
            for name, kw in (("decode", dec), ("decode_uint8", dec), ("encode", enc))
        }

    @property
    def params(self) -> Params:
        """The decoder's weights (read now if not yet)."""
        return self._weights["decoder"].value

    @property
    def encoder_params(self) -> Params:
        """The encoder's weights (read now if not yet)."""
        return self._weights["encoder"].value

    def decode(self, vae_latents: jax.Array) -> jax.Array:
        """VAE latents (diffusers ``vae.decode`` convention) -> float video ``(B, 3, T, H, W)``."""
        self._check_latents(vae_latents)
        return self._run("decode", vae_latents)

    def decode_uint8(self, normalized_latents: jax.Array) -> jax.Array:
        """Normalised latents (transformer output) -> ``uint8 (B, T, H, W, 3)`` frames."""
        self._check_latents(normalized_latents)
        return self._run("decode_uint8", normalized_latents)

    def encode(self, video: jax.Array) -> jax.Array:
        """Video ``(B, 3, T, H, W)`` in [-1, 1] -> posterior mean ``(B, z, T', h, w)`` (VAE latents)."""
        shape = tuple(video.shape)
        if len(shape) != 5 or shape[1] != self.cfg.in_channels or shape[2] < 1:
            raise ConfigError(f"video must be (B, {self.cfg.in_channels}, T, H, W), got {shape}")
        if any(layer.kind == "attn" and "down_blocks" in layer.name for layer in encoder_plan(self.cfg)):
            # diffusers 0.42 (and the original Wan code) crash when encoding with attention blocks
            # in down_blocks, so there is no reference to be exact against.
            raise ConfigError(
                f"attn_scales={list(self.cfg.attn_scales)} puts attention in the encoder's down_blocks, "
                "which the reference cannot run; encoding such a checkpoint is not supported"
            )
        return self._run("encode", video)

    def lower(self, method: str, x: jax.Array | jax.ShapeDtypeStruct) -> jax.stages.Lowered:
        """The program ``method`` (``decode``, ``decode_uint8`` or ``encode``) runs for inputs shaped
        like ``x``; ``.compile().memory_analysis()`` gives its memory before running anything."""
        return _jitted(method).lower(
            self._part(method).like, **{_INPUT[method]: x}, **dict(self._statics_for(method, x))
        )

    def compile(self, method: str, x: jax.Array) -> jax.stages.Compiled:
        """The compiled program ``method`` runs for ``x`` (compiled on first use, then cached);
        e.g. ``vae.compile("decode_uint8", latents).memory_analysis()``."""
        x = jnp.asarray(x)
        statics = self._statics_for(method, x)
        params_sig, x_sig = _signature(self._part(method).like), (x.shape, x.dtype, x.sharding)
        in_child = self._compiles_in_child(method, x, params_sig)
        if in_child:  # one device: the default placement, which the child has too
            params_sig, x_sig = _unplaced(params_sig), (x.shape, x.dtype, None)
        return _compiled(method, statics, params_sig, x_sig, in_child)

    def _compiles_in_child(self, method: str, x: jax.Array, params_sig: Any) -> bool:
        """Whether ``method``'s program for ``x`` is compiled in a child process (see
        ``compile_in_child``): only for programs on the first device of a one-process CPU run."""
        if self.compile_in_child is False or not child_compile.available():
            return False
        first = jax.devices()[0]
        shardings = [x.sharding, *(sh for _, _, sh in params_sig[1])]
        if any(sh is not None and sh.device_set != {first} for sh in shardings):
            return False
        if self.compile_in_child:
            return True
        h, w = x.shape[-2:]
        scale = 1 if method == "encode" else self.cfg.spatial_factor**2
        return h * w * scale >= CHILD_COMPILE_MIN_PIXELS

    def _part(self, method: str) -> _Weights:
        return self._weights["encoder" if method == "encode" else "decoder"]

    def _statics_for(self, method: str, x: jax.Array | jax.ShapeDtypeStruct) -> tuple[tuple[str, Any], ...]:
        """The static arguments for ``x``: split over several devices, the causal convs keep input
        frames (the owed-sum cache saves memory on one device but costs more under the SPMD
        partitioner's halo exchanges)."""
        statics = self._statics[method]
        sharding = getattr(x, "sharding", None)
        if sharding is None or len(sharding.device_set) == 1:
            return statics
        nm = dataclasses.replace(self.numerics, owed_cache=False)
        return tuple((k, nm if k == "nm" else v) for k, v in statics)

    def _run(self, method: str, x: jax.Array) -> jax.Array:
        x = jnp.asarray(x)
        program = self.compile(method, x)  # before reading the weights, if not yet read
        return program(self._part(method).value, **{_INPUT[method]: x})

    def normalize_latents(self, vae_latents: jax.Array) -> jax.Array:
        """VAE latents -> the transformer's normalised latents."""
        return normalize_latents(self.cfg, jnp.asarray(vae_latents))

    def denormalize_latents(self, normalized_latents: jax.Array) -> jax.Array:
        """The transformer's normalised latents -> VAE latents (as the reference pipeline)."""
        return denormalize_latents(self.cfg, jnp.asarray(normalized_latents))

    def _check_latents(self, latents: jax.Array) -> None:
        shape = tuple(latents.shape)
        if len(shape) != 5 or shape[1] != self.cfg.z_dim or shape[2] < 1:
            raise ConfigError(f"latents must be (B, {self.cfg.z_dim}, T', h, w), got {shape}")


def load_vae(
    path: str | Path,
    dtype: str | jnp.dtype = "float32",
    weights_dtype: str | jnp.dtype | None = None,
    *,
    decode_chunk: int | str | None = 1,
    encode_chunk: int | str | None = 1,
    frames_per_step: int = 1,
    conv: str = "auto",
    upsample: str = "subpixel",
    tiling: Tiling | None = None,
    sharding: ShardingFn | None = None,
    compile_in_child: bool | None = None,
) -> WanVAE:
    """Load ``vae/`` of a diffusers-layout Wan 2.1 model (``path`` = model root or that folder).

    ``dtype``: activations; ``weights_dtype``: how the weights are stored (default: ``dtype``);
    weights are cast to ``dtype`` at use. ``decode_chunk``: latent frames per decode step;
    ``encode_chunk``: groups of 4 frames per encode step (an int or ``"all"``).
    ``frames_per_step``: frames per step in the full-frame-rate layers (memory vs. speed).
    ``conv``/``upsample``: convolution formulations (see :class:`~wanjax.models.vae.blocks.Numerics`).
    ``tiling``: decode large frames in blended spatial tiles (:class:`Tiling`; off by default).
    ``compile_in_child``: see :class:`WanVAE`.
    The checkpoint's names, shapes and dtypes are checked now; each part's weights are read on its
    first use, after that call's program is compiled.
    """
    directory = VAE.directory(path)
    cfg = VAE.read_config(directory)
    dtype = parse_dtype(dtype)
    weights_dtype = parse_dtype(weights_dtype) if weights_dtype is not None else dtype
    check_checkpoint(VAE.open_weights(directory), checkpoint_spec(cfg), str(directory))

    def load(part: str) -> Params:
        """One part's weights; the files are mapped only while they are read."""
        other = "encoder" if part == "decoder" else "decoder"
        other_names = {n for s in jax.tree.leaves(checkpoint_spec(cfg, other)) for n in s.names}
        params = load_params(
            VAE.open_weights(directory),
            checkpoint_spec(cfg, part),
            weights_dtype,
            str(directory),
            sharding=sharding,
            ignore=other_names.__contains__,
        )
        jax.block_until_ready(params)  # transfers done: the file mapping is released now
        release_free_heap()  # and the heap the reads used (~20 MiB of the real decoder's) returned
        return params

    def like(part: str) -> Params:
        return abstract_params(checkpoint_spec(cfg, part), weights_dtype, sharding or first_device)

    return WanVAE(
        cfg,
        lambda: load("decoder"),
        dtype,
        params_like=like("decoder"),
        encoder_params=lambda: load("encoder"),
        encoder_like=like("encoder"),
        decode_chunk=decode_chunk,
        encode_chunk=encode_chunk,
        frames_per_step=frames_per_step,
        conv=conv,
        upsample=upsample,
        tiling=tiling,
        compile_in_child=compile_in_child,
    )
