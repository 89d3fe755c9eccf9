"""Spatial tiling of the VAE decode, as diffusers' ``enable_tiling()``: tile geometry (and its
``SIZE[:STRIDE]`` option string), blending of neighbouring tiles, and the tiled decode."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from wanjax.errors import ConfigError
from wanjax.models.vae.config import VAEConfig

__all__ = ["Tiling", "decode_frames_tiled"]


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

    def applies(self, cfg: VAEConfig, latent_height: int, latent_width: int) -> bool:
        """Whether latents of this size decode in tiles: the frame is larger than a tile."""
        size = self.size // cfg.spatial_factor
        return latent_height > size or latent_width > size

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
    decode_tile: Callable[[jax.Array], jax.Array], cfg: VAEConfig, vae_latents: jax.Array, tiling: Tiling
) -> jax.Array:
    """``decode_tile`` (channel-last latents -> unclamped float frames, patches for the Wan 2.2 VAE,
    time on axis 1: :func:`~wanjax.models.vae.scan.decode_frames`) through :class:`Tiling`. Tiles
    of one shape run one after another under ``lax.map``, so each tile shape is compiled once."""
    h, w = vae_latents.shape[2:4]
    scale = cfg.resampling_factor  # decoder output pixels (patches) per latent
    tiling = Tiling(tiling.size // cfg.patch, tiling.stride // cfg.patch)  # in the decoder's pixels
    size, stride = tiling.size // scale, tiling.stride // scale
    grid = [(i, j) for i in range(0, h, stride) for j in range(0, w, stride)]
    groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for i, j in grid:
        groups.setdefault((min(size, h - i), min(size, w - j)), []).append((i, j))
    decoded: dict[tuple[int, int], jax.Array] = {}
    for (th, tw), starts in groups.items():
        tiles = jnp.stack([vae_latents[:, :, i : i + th, j : j + tw] for i, j in starts])
        outs = jax.lax.map(decode_tile, tiles)
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
