"""The ``splash`` backend: JAX's Pallas TPU splash attention (``jax.experimental.pallas.ops.tpu``).

Sequences are padded to whole blocks: padded keys sit in their own segment (segment ids), so no
real query sees them; padded queries and head-dim columns are dropped from the result.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

from wanjax.kernels.block_mask import BlockMask
from wanjax.kernels.common import AttentionProblem, from_head_major, head_major, pad_to_blocks, use_interpret


class BlockMaskElements(sm.Mask):
    """A :class:`BlockMask`'s element mask padded to ``shape`` (splash's ``Mask`` interface): padded
    keys masked, padded queries as the last local query (so no row is empty)."""

    def __init__(self, mask: BlockMask, q_len: int, shape: tuple[int, int]):
        self.mask, self.q_len, self._shape = mask, q_len, shape

    @property
    def shape(self) -> tuple[int, int]:
        return self._shape

    def __getitem__(self, idx) -> np.ndarray:
        q_slice, kv_slice = (sm._fill_slice(s, n) for s, n in zip(idx, self._shape, strict=True))
        local = np.minimum(np.arange(q_slice.start, q_slice.stop), self.q_len - 1)
        rows = np.minimum((self.mask.q_offset + local) // self.mask.block, self.mask.table.shape[0] - 1)
        keys = np.arange(kv_slice.start, kv_slice.stop)
        cols = np.minimum(keys // self.mask.block, self.mask.table.shape[1] - 1)
        return self.mask.table[rows][:, cols] & (keys < self.mask.length)[None, :]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BlockMaskElements) and (self.mask, self.q_len, self._shape) == (
            other.mask,
            other.q_len,
            other._shape,
        )

    def __hash__(self) -> int:
        return hash((self.mask, self.q_len, self._shape))


def splash_attention(problem: AttentionProblem) -> jax.Array:
    """``softmax(q k^T * scale) v`` over ``(B, L, H, D)``; ``blocks``: ``(bq, bkv, bkv_compute, _)``."""
    q, k, v, scale, blocks, window_size, block_mask = problem
    batch, q_len, _, dim = q.shape
    k_len = k.shape[1]
    (bq, bkv, bkv_compute, _), q_pad, k_pad, d_pad = pad_to_blocks(q, k, blocks)

    shape = (q_pad, k_pad)
    if block_mask is not None:
        mask = BlockMaskElements(block_mask, q_len, shape)
    elif window_size is None:
        mask = sm.FullMask(shape)
    else:
        mask = sm.LocalMask(shape, (window_size, window_size), 0)
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
