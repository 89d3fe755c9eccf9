"""Spatial x2 upsampling of the Wan 2.1 and 2.2 VAEs (nearest x2 + 3x3 conv, per frame), and the
residual blocks' low-resolution cache that recomputes upsampled frames instead of keeping them (Wan
2.1 only: in Wan 2.2 a shortcut is added between the upsampling and the next residual block)."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from wanjax.models.layers import Params
from wanjax.models.vae.causal_conv import caches_owed_sums, conv3d_causal
from wanjax.models.vae.ops import FLOAT32, Frames, Numerics, after, conv2d, per_frame


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
    has a quarter of the pixels). :func:`~wanjax.models.vae.blocks.run_layers` asks only below the
    output resolution: there the recompute's own full-resolution frames would outweigh the saving.
    The real decoder's two such blocks keep 23 MiB less at 240x416, for ~4% more FLOPs."""
    if not (nm.lowres_cache and nm.conv == "taps"):
        return False
    itemsize = np.dtype(nm.dtype).itemsize
    usual = c_out * FLOAT32.itemsize if caches_owed_sums(c_in, c_out, nm) else c_in * itemsize
    return c_low * itemsize < 4 * usual


def lowres_history(hist: Frames | None, u: jax.Array) -> Frames:
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


def conv1_lowres(
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
