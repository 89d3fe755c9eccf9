"""Conversions at the VAE's edges: the transformer's normalised latents to and from VAE latents, video
to and from the Wan 2.2 VAE's patches, and decoded video to clamped floats and ``uint8`` frames (as
the reference pipeline and diffusers' post-processing compute them)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from wanjax.models.vae.config import VAEConfig

__all__ = [
    "clamp",
    "denormalize_latents",
    "nonfinite_per_frame",
    "normalize_latents",
    "patchify",
    "to_uint8",
    "unpatchify",
]


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


def patchify(cfg: VAEConfig, video: jax.Array) -> jax.Array:
    """diffusers ``patchify``, channel-last: ``(B, T, H, W, C) -> (B, T, H / p, W / p, C p p)``, patch
    channels in the reference's ``(channel, column, row)`` order (identity without patches)."""
    p = cfg.patch
    if p == 1:
        return video
    b, t, h, w, c = video.shape
    x = video.reshape(b, t, h // p, p, w // p, p, c).transpose(0, 1, 2, 4, 6, 5, 3)
    return x.reshape(b, t, h // p, w // p, c * p * p)


def unpatchify(cfg: VAEConfig, video: jax.Array) -> jax.Array:
    """diffusers ``unpatchify``, channel-last: the inverse of :func:`patchify`."""
    p = cfg.patch
    if p == 1:
        return video
    b, t, h, w, cpp = video.shape
    x = video.reshape(b, t, h, w, cpp // (p * p), p, p).transpose(0, 1, 2, 6, 3, 5, 4)
    return x.reshape(b, t, h * p, w * p, cpp // (p * p))


def clamp(video: jax.Array) -> jax.Array:
    return jnp.clip(video, -1.0, 1.0)


def to_uint8(video: jax.Array) -> jax.Array:
    """Clamped video in [-1, 1] -> uint8, as diffusers' post-processing:
    ``round(clamp(v * 0.5 + 0.5, 0, 1) * 255)`` in float32."""
    v = jnp.clip(video.astype(jnp.float32) * 0.5 + 0.5, 0.0, 1.0)
    return jnp.round(v * 255.0).astype(jnp.uint8)


def nonfinite_per_frame(video: jax.Array, time_axis: int) -> jax.Array:
    """The count of NaN and infinite values in each frame (``int32``, one per index of ``time_axis``)."""
    axes = tuple(a for a in range(video.ndim) if a != time_axis % video.ndim)
    return jnp.sum(~jnp.isfinite(video), axis=axes, dtype=jnp.int32)
