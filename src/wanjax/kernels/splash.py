"""The ``splash`` backend: JAX's Pallas TPU splash attention (``jax.experimental.pallas.ops.tpu``).

Sequences are padded to whole blocks: padded keys sit in their own segment (segment ids), so no
real query sees them; padded queries and head-dim columns are dropped from the result.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

from wanjax.kernels.common import AttentionProblem, from_head_major, head_major, pad_to_blocks, use_interpret


def splash_attention(problem: AttentionProblem) -> jax.Array:
    """``softmax(q k^T * scale) v`` over ``(B, L, H, D)``; ``blocks``: ``(bq, bkv, bkv_compute, _)``."""
    q, k, v, scale, blocks, window_size = problem
    batch, q_len, _, dim = q.shape
    k_len = k.shape[1]
    (bq, bkv, bkv_compute, _), q_pad, k_pad, d_pad = pad_to_blocks(q, k, blocks)

    shape = (q_pad, k_pad)
    mask = sm.FullMask(shape) if window_size is None else sm.LocalMask(shape, (window_size, window_size), 0)
    # One head's kernel, vmapped over (batch, head): the mask is processed once, not per head.
    kernel = sk.make_splash_mha(
        sm.MultiHeadMask([mask]),
        block_sizes=sk.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv_compute),
        head_shards=1,
        q_seq_shards=1,
        interpret=use_interpret("splash"),
    )
    segments = None
    if k_pad != k_len:
        segments = sk.SegmentIds(
            q=jnp.zeros(q_pad, jnp.int32), kv=(jnp.arange(k_pad) >= k_len).astype(jnp.int32)
        )
    q_scaled = (q.astype(jnp.float32) * scale).astype(q.dtype)
    qh, kh, vh = (head_major(x, n, d_pad)[:, None] for x, n in ((q_scaled, q_pad), (k, k_pad), (v, k_pad)))
    out = jax.vmap(kernel, in_axes=(0, 0, 0, None))(qh, kh, vh, segments)[:, 0]
    return from_head_major(out, batch, q_len, dim)
