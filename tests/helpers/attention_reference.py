"""Float64 NumPy softmax attention and random inputs, shared by the attention tests."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def reference(q, k, v, scale=None, window=None, mask=None):
    """``softmax(q k^T * scale) v`` in float64 over ``(B, L, H, D)``; ``window``: keys ``|i - j| <= w``;
    ``mask``: a bool ``(Lq, Lk)`` element mask (True: attend)."""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if window is not None:
        i, j = np.arange(q.shape[1])[:, None], np.arange(k.shape[1])[None, :]
        s = np.where(np.abs(i - j) <= window, s, -np.inf)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", p, v)


def random_qkv(b, lq, lk, h, d, seed=0, dtype=jnp.float32, key_offset=0.0):
    """Random inputs; ``key_offset`` adds a shared vector to every key (what K smoothing removes)."""
    keys = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(keys[0], (b, lq, h, d)) * 1.5
    k = jax.random.normal(keys[1], (b, lk, h, d)) * 1.5
    k = k + key_offset * jax.random.normal(keys[3], (b, 1, h, d))
    v = jax.random.normal(keys[2], (b, lk, h, d))
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


def rel(ours, ref):
    return float(np.linalg.norm(np.asarray(ours, np.float64) - ref) / np.linalg.norm(ref))
