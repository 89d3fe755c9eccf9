"""The parameter-free shortcuts of the Wan 2.2 VAE's residual blocks, channel-last
(``[B, T, H, W, C]``): ``AvgDown3D`` (encoder) and ``DupUp3D`` (decoder), exact rearrangements of
diffusers' ``view``/``permute`` chains (gathers and one group mean, no weights).

``DupUp3D`` is split in two halves so that a temporal one can cross the decoder's segments (see
:func:`~wanjax.models.vae.blocks.time_doubling`): :func:`dup_time` makes the low-resolution
channels of one output frame (its temporal phase chosen), :func:`dup_space` spreads them over the
``factor_s x factor_s`` pixels they stand for.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from wanjax.models.vae.config import Layer
from wanjax.models.vae.ops import channel_sum

__all__ = ["avg_down", "dup_space", "dup_time", "dup_up"]


def avg_down(x: jax.Array, layer: Layer) -> jax.Array:
    """``AvgDown3D`` of a chunk ``(B, T, H, W, C_in) -> (B, ceil(T / ft), H / fs, W / fs, C_out)``:
    zero frames in front up to a whole number of ``factor_t`` groups, then each output channel the
    mean of ``C_in * factor / C_out`` consecutive entries of the reference's ``(channel, time, row,
    column)`` order."""
    factor_t, factor_s = layer.factors
    pad = -x.shape[1] % factor_t
    if pad:
        x = jnp.pad(x, ((0, 0), (pad, 0), (0, 0), (0, 0), (0, 0)))
    b, t, h, w, c = x.shape
    x = x.reshape(b, t // factor_t, factor_t, h // factor_s, factor_s, w // factor_s, factor_s, c)
    x = x.transpose(0, 1, 3, 5, 7, 2, 4, 6)  # (B, T', H', W', C, ft, fs_h, fs_w)
    group = c * factor_t * factor_s * factor_s // layer.dim_out
    x = x.reshape(*x.shape[:4], layer.dim_out, group)
    total = channel_sum(x.astype(jnp.float32))[..., 0]  # one summation order whatever the chunk
    return (total / group).astype(x.dtype)


def _dup_index(layer: Layer) -> np.ndarray:
    """``(factor_t, fs * fs * C_out)``: for each temporal phase, the input channel each output
    channel ``(row phase, column phase, channel)`` repeats (``repeat_interleave`` then ``view``)."""
    factor_t, factor_s = layer.factors
    factor = factor_t * factor_s * factor_s
    repeats = layer.dim_out * factor // layer.dim_in
    o, a, b, c = np.meshgrid(
        np.arange(layer.dim_out), np.arange(factor_t), np.arange(factor_s), np.arange(factor_s), indexing="ij"
    )
    source = (o * factor + a * factor_s * factor_s + b * factor_s + c) // repeats
    return source.transpose(1, 2, 3, 0).reshape(factor_t, -1)


def dup_time(x: jax.Array, layer: Layer, phase: int | jax.Array) -> jax.Array:
    """The temporal half of ``DupUp3D`` for output frames of one ``phase`` (frame ``factor_t * t +
    phase`` of input frame ``t``; may be traced): ``(B, T, h, w, C_in) -> (B, T, h, w, fs * fs *
    C_out)`` at the input's resolution."""
    index = _dup_index(layer)
    chosen = index[phase] if isinstance(phase, int) else jnp.asarray(index)[phase]
    return jnp.take(x, chosen, axis=-1)


def dup_space(y: jax.Array, layer: Layer) -> jax.Array:
    """The spatial half of ``DupUp3D``: :func:`dup_time`'s channels spread over their pixels,
    ``(B, T, h, w, fs * fs * C_out) -> (B, T, fs * h, fs * w, C_out)``."""
    _, factor_s = layer.factors
    b, t, h, w, _ = y.shape
    y = y.reshape(b, t, h, w, factor_s, factor_s, layer.dim_out).transpose(0, 1, 2, 4, 3, 5, 6)
    return y.reshape(b, t, h * factor_s, w * factor_s, layer.dim_out)


def dup_up(x: jax.Array, layer: Layer) -> jax.Array:
    """``DupUp3D`` without temporal upsampling (``factor_t = 1``: no frame dropped on the first chunk)."""
    if layer.factors[0] != 1:
        raise ValueError(f"{layer.name}: a temporal DupUp3D runs in halves (dup_time, dup_space)")
    return dup_space(dup_time(x, layer, 0), layer)
