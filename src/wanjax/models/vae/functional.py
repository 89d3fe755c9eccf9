"""The VAE (Wan 2.1 or 2.2) as pure functions in diffusers' layout (channels first): :func:`decode`,
:func:`decode_uint8` and :func:`encode`, what :class:`~wanjax.models.vae.model.WanVAE` compiles
(``cfg``, ``nm``, ``chunk``, ``frames`` and ``tiling`` are static); :func:`decode_uint8_first` and
:func:`decode_uint8_next`, the same decode in parts the caller runs one after another. The Wan 2.2 VAE's patches are
made from the video before the encoder and undone after the decoder (per chunk, before ``finish``)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from wanjax.models.layers import Params
from wanjax.models.vae.config import VAEConfig
from wanjax.models.vae.ops import Cache, Numerics
from wanjax.models.vae.postprocess import (
    clamp,
    denormalize_latents,
    nonfinite_per_frame,
    patchify,
    to_uint8,
    unpatchify,
)
from wanjax.models.vae.scan import (
    decode_first,
    decode_frames,
    decode_latents,
    decode_next,
    encode_frames,
    uncounted,
    zero_cache,
)
from wanjax.models.vae.tiling import Tiling, decode_frames_tiled

__all__ = [
    "decode",
    "decode_cache",
    "decode_uint8",
    "decode_uint8_first",
    "decode_uint8_next",
    "decode_uint8_part",
    "encode",
]


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
) -> tuple[jax.Array, jax.Array]:
    """Channel-last VAE latents -> ``finish(frames)`` (time on ``time_axis``), tiled when ``tiling``
    applies to this size, and the count of non-finite values in the frames before ``finish``."""
    finish_patches = _finish_patches(cfg, finish)
    decode_z = functools.partial(decode_frames, params, cfg, nm=nm, chunk=chunk, frames=frames)
    if tiling is None or not tiling.applies(cfg, z.shape[2], z.shape[3]):
        return decode_z(z, finish_patches, time_axis=time_axis)
    video = decode_frames_tiled(lambda tile: decode_z(tile, uncounted)[0], cfg, z, tiling)
    out, counts = finish_patches(video)
    return out, jnp.sum(counts, dtype=jnp.int32)


def _finish_patches(
    cfg: VAEConfig, finish: Callable[[jax.Array], jax.Array]
) -> Callable[[jax.Array], tuple[jax.Array, jax.Array]]:
    """The decoder's output (patches for the Wan 2.2 VAE) -> ``finish(video)`` and the count of
    non-finite values per frame of the video."""

    def finish_patches(v: jax.Array) -> tuple[jax.Array, jax.Array]:
        video = unpatchify(cfg, v)
        return finish(video), nonfinite_per_frame(video, 1)

    return finish_patches


def _uint8_latents(cfg: VAEConfig, normalized_latents: jax.Array, nm: Numerics) -> jax.Array:
    return _to_channels_last(denormalize_latents(cfg, normalized_latents)).astype(nm.dtype)


def _uint8_finish(v: jax.Array) -> jax.Array:
    return to_uint8(clamp(v))


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
    return _decode_any(params, cfg, z, finish, 2, nm=nm, chunk=chunk, frames=frames, tiling=tiling)[0]


def decode_uint8(
    params: Params,
    cfg: VAEConfig,
    normalized_latents: jax.Array,
    *,
    nm: Numerics,
    chunk: int | None,
    frames: int,
    tiling: Tiling | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Transformer output ``(B, z, T', h, w)`` -> ``uint8 (B, T, H, W, 3)`` frames, all on the device,
    and the count of NaN or infinite values decoded (which the cast to ``uint8`` would hide)."""
    z = _to_channels_last(denormalize_latents(cfg, normalized_latents))
    return _decode_any(params, cfg, z, _uint8_finish, 1, nm=nm, chunk=chunk, frames=frames, tiling=tiling)


def decode_uint8_first(
    params: Params, normalized_latents: jax.Array, *, cfg: VAEConfig, nm: Numerics, frames: int
) -> tuple[jax.Array, jax.Array, Cache]:
    """:func:`decode_uint8` of the first latent frame ``(B, z, 1, h, w)`` alone: its ``uint8`` frames,
    their counts of non-finite values per frame, and the causal cache :func:`decode_uint8_next`
    continues from."""
    z = _uint8_latents(cfg, normalized_latents, nm)
    (out, counts), cache = decode_first(
        params, cfg, z, _finish_patches(cfg, _uint8_finish), nm=nm, frames=frames
    )
    return out, counts, cache


def decode_uint8_next(
    params: Params, cache: Cache, normalized_latents: jax.Array, *, cfg: VAEConfig, nm: Numerics, frames: int
) -> tuple[jax.Array, jax.Array, Cache]:
    """The next latent frames ``(B, z, c, h, w)`` after those ``cache`` has seen: their ``uint8``
    frames, counts of non-finite values per frame and the cache after them; the parts' frames are
    :func:`decode_uint8`'s (untiled) bit for bit."""
    z = _uint8_latents(cfg, normalized_latents, nm)
    finish = _finish_patches(cfg, _uint8_finish)
    (out, counts), cache = decode_next(params, cfg, cache, z, finish, nm=nm, frames=frames)
    return out, counts, cache


def decode_cache(params: Params, normalized_latents: jax.Array, *, cfg: VAEConfig, nm: Numerics) -> Cache:
    """The causal cache before the first of these latent frames ``(B, z, T', h, w)``, all zeros
    (:func:`~wanjax.models.vae.scan.zero_cache`), for :func:`decode_uint8_part`."""
    return zero_cache(params, cfg, _uint8_latents(cfg, normalized_latents[:, :, :1], nm), nm)


def decode_uint8_part(
    params: Params,
    cache: Cache,
    normalized_latents: jax.Array,
    first: jax.Array,
    *,
    cfg: VAEConfig,
    nm: Numerics,
) -> tuple[jax.Array, jax.Array, Cache]:
    """:func:`decode_uint8` in parts where the scan decodes the first frame too
    (:func:`~wanjax.models.vae.scan.first_in_scan`): the latent frames ``(B, z, c, h, w)`` after
    those ``cache`` has seen (``first``: they begin the video, ``cache`` from :func:`decode_cache`),
    their ``uint8`` frames (``r c``, of which the first ``r - 1`` of the video's are skipped ones),
    counts of non-finite values per frame and the cache after them; one program for every part,
    the first included, and the one program's frames bit for bit."""
    z = _uint8_latents(cfg, normalized_latents, nm)
    y, cache = decode_latents(params, cfg, cache, z, first, nm=nm)
    out, counts = _finish_patches(cfg, _uint8_finish)(y)
    return out, counts, cache


def encode(
    params: Params, cfg: VAEConfig, video: jax.Array, *, nm: Numerics, chunk: int | None, frames: int
) -> jax.Array:
    """diffusers ``vae.encode(video).latent_dist.mean``: ``(B, 3, T, H, W)`` in [-1, 1] -> VAE latents."""
    patches = patchify(cfg, _to_channels_last(video))
    mean = encode_frames(params, cfg, patches, nm=nm, chunk=chunk, frames=frames)
    return _to_channels_first(mean)
