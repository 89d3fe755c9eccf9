"""The one attention entry point of wanjax.

``attention(q, k, v)`` takes ``(B, L, H, D)`` queries/keys/values (no mask: Wan attends to every
key) and returns ``(B, Lq, H, D)`` in the query dtype. Backends are picked by name; ``xla`` is the
portable one:

* short problems (``B*H*Lq*Lk`` scores within ``dense_limit``) run as two float32-accumulated
  matmuls around a float32 softmax;
* longer ones run blockwise with an online softmax (flash-attention recurrence): queries in
  blocks of ``block_q``, keys in blocks of ``block_k``, so memory is ``O(B*H*block_q*block_k)``
  whatever the sequence length (32,760 tokens at 480p, 75,600 at 720p). Padded keys are masked,
  padded queries dropped.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from wanjax.errors import ConfigError

BACKENDS = ("auto", "xla")
DENSE_LIMIT = 1 << 26  # score elements (256 MiB in float32) above which the blockwise path is used


def attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    scale: float | None = None,
    backend: str = "auto",
    block_q: int = 512,
    block_k: int = 1024,
    dense_limit: int = DENSE_LIMIT,
    per_head: bool | None = None,
) -> jax.Array:
    """Softmax attention ``softmax(q k^T * scale) v`` over ``(B, L, H, D)`` arrays.

    ``per_head`` loops over (batch, head) pairs with 2-D matmuls, which XLA's CPU backend runs ~2x
    faster than batched ones (and only one head's score tile is live); default: on for CPU only.
    """
    if backend not in BACKENDS:
        raise ConfigError(f"unknown attention backend {backend!r}; available: {', '.join(BACKENDS)}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if per_head is None:
        per_head = jax.default_backend() == "cpu"
    batch, q_len, heads, dim = q.shape

    def head_major(x: jax.Array) -> jax.Array:  # (B, L, H, D) -> (B*H, L, D)
        return x.transpose(0, 2, 1, 3).reshape(batch * heads, x.shape[1], dim)

    def attend(qkv: tuple[jax.Array, jax.Array, jax.Array]) -> jax.Array:
        return _attend(*qkv, scale, block_q, block_k, dense_limit)

    qkv = (head_major(q), head_major(k), head_major(v))
    out = jax.lax.map(attend, qkv) if per_head else attend(qkv)
    return out.reshape(batch, heads, q_len, dim).transpose(0, 2, 1, 3)


def _attend(
    q: jax.Array, k: jax.Array, v: jax.Array, scale: float, block_q: int, block_k: int, dense_limit: int
) -> jax.Array:
    """Attention over ``(..., L, D)`` arrays (any leading batch axes)."""
    q_len, k_len = q.shape[-2], k.shape[-2]
    if math.prod(q.shape[:-1]) * k_len <= dense_limit:
        return _dense(q, k, v, scale)
    return _blockwise(q, k, v, scale, min(block_q, q_len), min(block_k, k_len))


def _einsum(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
    precision = jax.lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32, precision=precision)


def _scores(q: jax.Array, k: jax.Array, scale: float) -> jax.Array:
    """float32 ``(..., Lq, Lk)`` scaled scores."""
    return _einsum("...qd,...kd->...qk", q, k) * scale


def _dense(q: jax.Array, k: jax.Array, v: jax.Array, scale: float) -> jax.Array:
    probs = jax.nn.softmax(_scores(q, k, scale), axis=-1)
    return _einsum("...qk,...kd->...qd", probs.astype(v.dtype), v).astype(q.dtype)


def _blocks(x: jax.Array, size: int) -> jax.Array:
    """``(..., L, D)`` -> ``(ceil(L/size), ..., size, D)``, zero-padded at the end."""
    pad = -x.shape[-2] % size
    if pad:
        x = jnp.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, pad), (0, 0)])
    x = x.reshape(*x.shape[:-2], x.shape[-2] // size, size, x.shape[-1])
    return jnp.moveaxis(x, -3, 0)


def _blockwise(
    q: jax.Array, k: jax.Array, v: jax.Array, scale: float, block_q: int, block_k: int
) -> jax.Array:
    """Online-softmax attention: memory ``O(block_q * block_k)`` per leading index, any length."""
    lead, q_len, k_len = q.shape[:-2], q.shape[-2], k.shape[-2]
    k_blocks, v_blocks = _blocks(k, block_k), _blocks(v, block_k)
    valid = (jnp.arange(k_blocks.shape[0] * block_k) < k_len).reshape(-1, block_k)

    def one_query_block(qb: jax.Array) -> jax.Array:
        def step(carry, kv):
            running_max, denom, acc = carry
            kb, vb, kb_valid = kv
            s = jnp.where(kb_valid, _scores(qb, kb, scale), -jnp.inf)  # (..., bq, bk)
            new_max = jnp.maximum(running_max, s.max(axis=-1))
            p = jnp.exp(s - new_max[..., None])
            correction = jnp.exp(running_max - new_max)
            denom = denom * correction + p.sum(axis=-1)
            pv = _einsum("...qk,...kd->...qd", p.astype(v.dtype), vb)
            return (new_max, denom, acc * correction[..., None] + pv), None

        init = (
            jnp.full((*lead, block_q), -jnp.inf, jnp.float32),
            jnp.zeros((*lead, block_q), jnp.float32),
            jnp.zeros((*lead, block_q, q.shape[-1]), jnp.float32),
        )
        (_, denom, acc), _ = jax.lax.scan(step, init, (k_blocks, v_blocks, valid))
        return (acc / denom[..., None]).astype(q.dtype)

    out = jax.lax.map(one_query_block, _blocks(q, block_q))  # (nq, ..., bq, D)
    out = jnp.moveaxis(out, 0, -3)
    return out.reshape(*lead, -1, q.shape[-1])[..., :q_len, :]
