"""The ``xla`` backend's block-sparse self-attention: each query block computes its kept key blocks only.

For every query block (the mask's block, 128 tokens) the host's :class:`~wanjax.kernels.block_mask.BlockMask`
gives the key blocks it sees as a static index table (padded to the largest count) and their count.
A loop over the query blocks runs, per block, a ``fori_loop`` of as many chunks of ``chunk`` key
blocks as that block keeps (a dynamic trip count: the padding costs nothing): the chunk's keys and
values are gathered, scored, masked (padding entries, keys past the length, and, for queries not
starting on a block boundary, each query row's own table row) and folded into an online softmax.
So the FLOPs are the mask's kept blocks (plus at most one partial chunk per query block), not a dense
product with a mask.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from wanjax.kernels.block_mask import BlockMask
from wanjax.kernels.common import MASK_VALUE, blocks_of, einsum_f32
from wanjax.kernels.precision import Precision


def block_sparse(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    scale: float,
    mask: BlockMask,
    chunk: int,
    precision: Precision,
    q_block: int | None = None,
) -> jax.Array:
    """Attention of ``(..., Lq, D)`` queries to ``(..., Lk, D)`` keys under ``mask`` (its local rows);
    queries in blocks of ``q_block`` (a multiple of the mask's block; default the mask's block), each
    over the union of its rows' kept key blocks."""
    lead, q_len, dim_v = q.shape[:-2], q.shape[-2], v.shape[-1]
    size = mask.block
    q_size = size if q_block is None else max(size, q_block // size * size)
    indices, counts = mask.kept_blocks(q_len, q_size)
    chunk = max(1, min(chunk, indices.shape[1]))
    pad = -indices.shape[1] % chunk
    indices = np.concatenate([indices, np.repeat(indices[:, -1:], pad, axis=1)], axis=1)
    indices = indices.reshape(indices.shape[0], -1, chunk)
    table = jnp.asarray(mask.table)
    k_blocks, v_blocks = blocks_of(k, size), blocks_of(v, size)  # (n_k_blocks, ..., size, D)
    offsets, q_offsets = jnp.arange(size), jnp.arange(q_size)
    uniform_rows = q_size == size and mask.q_offset % size == 0  # each query block is one table row

    def one_query_block(args: tuple[jax.Array, ...]) -> jax.Array:
        qb, ids, count, q_start = args
        q_rows = jnp.minimum((mask.q_offset + q_start + q_offsets) // size, table.shape[0] - 1)
        row_table = table[q_rows]  # (q_size, n_k_blocks): each query's own row

        def step(c: jax.Array, carry: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
            running_max, denom, acc = carry
            ids_c = ids[c]
            kc = jnp.moveaxis(jnp.take(k_blocks, ids_c, axis=0), 0, -3)  # (..., chunk, size, D)
            vc = jnp.moveaxis(jnp.take(v_blocks, ids_c, axis=0), 0, -3)
            kc = kc.reshape(*lead, chunk * size, kc.shape[-1])
            vc = vc.reshape(*lead, chunk * size, dim_v)
            s = einsum_f32("...qd,...kd->...qk", qb, kc, precision) * scale
            entry_ok = c * chunk + jnp.arange(chunk) < count
            key_ok = (ids_c[:, None] * size + offsets[None, :] < mask.length) & entry_ok[:, None]
            valid = key_ok.reshape(-1)[None, :]
            if not uniform_rows:  # queries of several table rows: each row's own kept blocks
                valid = jnp.repeat(row_table[:, ids_c], size, axis=1) & valid
            s = jnp.where(valid, s, MASK_VALUE)
            new_max = jnp.maximum(running_max, s.max(axis=-1))
            p = jnp.exp(s - new_max[..., None])
            correction = jnp.exp(running_max - new_max)
            denom = denom * correction + p.sum(axis=-1)
            pv = einsum_f32("...qk,...kd->...qd", p.astype(v.dtype), vc, precision)
            return new_max, denom, acc * correction[..., None] + pv

        init = (
            jnp.full((*lead, q_size), MASK_VALUE, jnp.float32),
            jnp.zeros((*lead, q_size), jnp.float32),
            jnp.zeros((*lead, q_size, dim_v), jnp.float32),
        )
        _, denom, acc = jax.lax.fori_loop(0, (count + chunk - 1) // chunk, step, init)
        return (acc / denom[..., None]).astype(q.dtype)

    q_blocks = blocks_of(q, q_size)
    starts = jnp.arange(q_blocks.shape[0]) * q_size
    out = jax.lax.map(one_query_block, (q_blocks, jnp.asarray(indices), jnp.asarray(counts), starts))
    out = jnp.moveaxis(out, 0, -3)  # (..., n_q_blocks, q_size, D)
    return out.reshape(*lead, -1, dim_v)[..., :q_len, :]
