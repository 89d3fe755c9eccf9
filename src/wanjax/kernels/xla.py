"""The portable ``xla`` attention backend: plain matmuls, memory bounded at any length.

* short problems (``B*H*Lq*Lk`` scores within ``dense_limit``) run as two float32-accumulated
  matmuls around a float32 softmax;
* longer ones run blockwise with an online softmax (flash-attention recurrence): queries in
  blocks of ``block_q``, keys in blocks of ``block_k``, so memory is ``O(B*H*block_q*block_k)``
  whatever the sequence length (32,760 tokens at 480p, 75,600 at 720p). Padded keys are masked,
  padded queries dropped.

``per_head`` loops over (batch, head) pairs with 2-D matmuls, which XLA's CPU backend runs ~2x
faster than batched ones (and only one head's score tile is live). ``precision`` sets how float32
inputs are multiplied (see :mod:`wanjax.kernels.precision`; default exact).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from wanjax.kernels.block_mask import BlockMask
from wanjax.kernels.common import MASK_VALUE, blocks_of, einsum_f32
from wanjax.kernels.precision import Precision
from wanjax.kernels.xla_sparse import block_sparse

DENSE_LIMIT = 1 << 26  # score elements (256 MiB in float32) above which the blockwise path is used


def xla_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    scale: float,
    window_size: int | None = None,
    block_q: int = 512,
    block_k: int = 1024,
    dense_limit: int = DENSE_LIMIT,
    per_head: bool = False,
    precision: Precision = "highest",
    block_mask: BlockMask | None = None,
) -> jax.Array:
    """``softmax(q k^T * scale) v`` over ``(B, L, H, D)`` arrays; ``window_size``: keys ``|i - j| <= w``;
    ``block_mask``: block-sparse self-attention (:mod:`wanjax.kernels.xla_sparse`, key chunks of
    ``block_k`` tokens), whatever the length."""
    batch, q_len, heads, _ = q.shape

    def to_head_major(x: jax.Array) -> jax.Array:  # (B, L, H, D) -> (B*H, L, D)
        return x.transpose(0, 2, 1, 3).reshape(batch * heads, x.shape[1], x.shape[3])

    def attend(qkv: tuple[jax.Array, jax.Array, jax.Array]) -> jax.Array:
        q, k, v = qkv
        if block_mask is not None:
            return block_sparse(q, k, v, scale, block_mask, block_k // block_mask.block, precision, block_q)
        if math.prod(q.shape[:-1]) * k.shape[-2] <= dense_limit:
            return _dense(q, k, v, scale, window_size, precision)
        return _blockwise(
            q, k, v, scale, window_size, min(block_q, q_len), min(block_k, k.shape[-2]), precision
        )

    qkv = (to_head_major(q), to_head_major(k), to_head_major(v))
    out = jax.lax.map(attend, qkv) if per_head else attend(qkv)
    return out.reshape(batch, heads, q_len, v.shape[-1]).transpose(0, 2, 1, 3)


def _masked_scores(
    q: jax.Array,
    k: jax.Array,
    scale: float,
    q_pos: jax.Array,
    k_pos: jax.Array,
    k_len: int | None,
    window: int | None,
    precision: Precision,
) -> jax.Array:
    """float32 ``(..., Lq, Lk)`` scaled scores, ``MASK_VALUE`` at keys ``>= k_len`` or out of the window."""
    s = einsum_f32("...qd,...kd->...qk", q, k, precision) * scale
    if k_len is None and window is None:
        return s
    valid = jnp.ones((q_pos.size, k_pos.size), bool)
    if k_len is not None:
        valid = valid & (k_pos[None, :] < k_len)
    if window is not None:
        valid = valid & (jnp.abs(q_pos[:, None] - k_pos[None, :]) <= window)
    return jnp.where(valid, s, MASK_VALUE)


def _dense(
    q: jax.Array, k: jax.Array, v: jax.Array, scale: float, window: int | None, precision: Precision
) -> jax.Array:
    q_pos, k_pos = jnp.arange(q.shape[-2]), jnp.arange(k.shape[-2])
    probs = jax.nn.softmax(_masked_scores(q, k, scale, q_pos, k_pos, None, window, precision), axis=-1)
    return einsum_f32("...qk,...kd->...qd", probs.astype(v.dtype), v, precision).astype(q.dtype)


def _blockwise(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    scale: float,
    window: int | None,
    block_q: int,
    block_k: int,
    precision: Precision,
) -> jax.Array:
    """Online-softmax attention: memory ``O(block_q * block_k)`` per leading index, any length.

    Scores of masked keys are a large finite negative, so a tile with no visible key adds nothing
    once a visible one has been seen (its weight is rescaled by ``exp(MASK_VALUE - max) = 0``).
    """
    lead, q_len, k_len = q.shape[:-2], q.shape[-2], k.shape[-2]
    k_blocks, v_blocks = blocks_of(k, block_k), blocks_of(v, block_k)
    k_starts = jnp.arange(k_blocks.shape[0]) * block_k
    padded_len = k_len if k_len % block_k else None  # mask padded keys only where there are some

    def one_query_block(args: tuple[jax.Array, jax.Array]) -> jax.Array:
        qb, q_start = args
        q_pos = q_start + jnp.arange(block_q)

        def step(carry, kv):
            running_max, denom, acc = carry
            kb, vb, k_start = kv
            k_pos = k_start + jnp.arange(block_k)
            s = _masked_scores(qb, kb, scale, q_pos, k_pos, padded_len, window, precision)
            new_max = jnp.maximum(running_max, s.max(axis=-1))
            p = jnp.exp(s - new_max[..., None])
            correction = jnp.exp(running_max - new_max)
            denom = denom * correction + p.sum(axis=-1)
            pv = einsum_f32("...qk,...kd->...qd", p.astype(v.dtype), vb, precision)
            return (new_max, denom, acc * correction[..., None] + pv), None

        init = (
            jnp.full((*lead, block_q), MASK_VALUE, jnp.float32),
            jnp.zeros((*lead, block_q), jnp.float32),
            jnp.zeros((*lead, block_q, v.shape[-1]), jnp.float32),
        )
        (_, denom, acc), _ = jax.lax.scan(step, init, (k_blocks, v_blocks, k_starts))
        return (acc / denom[..., None]).astype(q.dtype)

    q_blocks = blocks_of(q, block_q)
    out = jax.lax.map(one_query_block, (q_blocks, jnp.arange(q_blocks.shape[0]) * block_q))
    out = jnp.moveaxis(out, 0, -3)  # (..., nq, bq, D)
    return out.reshape(*lead, -1, v.shape[-1])[..., :q_len, :]
