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
PER_HEAD_MIN_KEYS = 1024


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

    ``per_head`` loops over (batch, head) pairs with 2-D matmuls: on CPU this is ~1.4x faster for long
    key sequences (and keeps one head's score tile in memory), slower for short ones such as the 512
    text keys. By default it is on for the CPU backend when there are at least ``PER_HEAD_MIN_KEYS`` keys.
    """
    if backend not in BACKENDS:
        raise ConfigError(f"unknown attention backend {backend!r}; available: {', '.join(BACKENDS)}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if per_head is None:
        per_head = jax.default_backend() == "cpu" and k.shape[1] >= PER_HEAD_MIN_KEYS
    if not per_head:
        return _attend(q, k, v, scale, block_q, block_k, dense_limit)
    batch, q_len, heads, dim = q.shape

    def head_major(x: jax.Array) -> jax.Array:  # (B, L, H, D) -> (B*H, 1, L, 1, D)
        return x.transpose(0, 2, 1, 3).reshape(batch * heads, 1, x.shape[1], 1, dim)

    def one_head(qkv: tuple[jax.Array, jax.Array, jax.Array]) -> jax.Array:
        return _attend(*qkv, scale, block_q, block_k, dense_limit)

    out = jax.lax.map(one_head, (head_major(q), head_major(k), head_major(v)))
    return out.reshape(batch, heads, q_len, dim).transpose(0, 2, 1, 3)


def _attend(
    q: jax.Array, k: jax.Array, v: jax.Array, scale: float, block_q: int, block_k: int, dense_limit: int
) -> jax.Array:
    batch, q_len, heads, _ = q.shape
    if batch * heads * q_len * k.shape[1] <= dense_limit:
        return _dense(q, k, v, scale)
    return _blockwise(q, k, v, scale, min(block_q, q_len), min(block_k, k.shape[1]))


def _scores(q: jax.Array, k: jax.Array, scale: float) -> jax.Array:
    """float32 ``(B, H, Lq, Lk)`` scaled scores."""
    return _einsum("bqhd,bkhd->bhqk", q, k) * scale


def _einsum(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
    precision = jax.lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32, precision=precision)


def _dense(q: jax.Array, k: jax.Array, v: jax.Array, scale: float) -> jax.Array:
    probs = jax.nn.softmax(_scores(q, k, scale), axis=-1)
    return _einsum("bhqk,bkhd->bqhd", probs.astype(v.dtype), v).astype(q.dtype)


def _pad_to(x: jax.Array, axis: int, multiple: int) -> jax.Array:
    pad = -x.shape[axis] % multiple
    if not pad:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths)


def _blocks(x: jax.Array, size: int) -> jax.Array:
    """``(B, L, H, D)`` (L a multiple of size) -> ``(L/size, B, size, H, D)``."""
    b, length, h, d = x.shape
    return x.reshape(b, length // size, size, h, d).swapaxes(0, 1)


def _blockwise(
    q: jax.Array, k: jax.Array, v: jax.Array, scale: float, block_q: int, block_k: int
) -> jax.Array:
    batch, q_len, heads, dim = q.shape
    k_len = k.shape[1]
    q_blocks = _blocks(_pad_to(q, 1, block_q), block_q)
    k_blocks = _blocks(_pad_to(k, 1, block_k), block_k)
    v_blocks = _blocks(_pad_to(v, 1, block_k), block_k)
    valid = (jnp.arange(k_blocks.shape[0] * block_k) < k_len).reshape(-1, block_k)

    def one_query_block(qb: jax.Array) -> jax.Array:
        def step(carry, kv):
            running_max, denom, acc = carry
            kb, vb, kb_valid = kv
            s = jnp.where(kb_valid, _scores(qb, kb, scale), -jnp.inf)  # (B, H, bq, bk)
            new_max = jnp.maximum(running_max, s.max(axis=-1))
            p = jnp.exp(s - new_max[..., None])
            correction = jnp.exp(running_max - new_max)
            denom = denom * correction + p.sum(axis=-1)
            pv = _einsum("bhqk,bkhd->bhqd", p.astype(v.dtype), vb)
            return (new_max, denom, acc * correction[..., None] + pv), None

        init = (
            jnp.full((batch, heads, block_q), -jnp.inf, jnp.float32),
            jnp.zeros((batch, heads, block_q), jnp.float32),
            jnp.zeros((batch, heads, block_q, dim), jnp.float32),
        )
        (_, denom, acc), _ = jax.lax.scan(step, init, (k_blocks, v_blocks, valid))
        return (acc / denom[..., None]).transpose(0, 2, 1, 3).astype(q.dtype)  # (B, bq, H, D)

    out = jax.lax.map(one_query_block, q_blocks)  # (nq, B, bq, H, D)
    return out.swapaxes(0, 1).reshape(batch, -1, heads, dim)[:, :q_len]
