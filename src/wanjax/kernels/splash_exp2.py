"""The ``splash_exp2`` backend: our Pallas TPU flash-attention kernel using ``exp2``.

As in the seed's custom splash kernel: ``log2(e)`` is folded into the query scale outside the
kernel (``q * scale * log2(e)``), so the softmax runs on ``exp2`` (a native TPU VPU instruction)
without a per-element multiply; scores are laid out kv-major (``(bkv, bq)``: queries on lanes, so
row maxima and sums reduce over sublanes); each ``(bq, bkv)`` grid block is processed in
``bkv_compute`` slices (a loop), each slice in ``bkv_compute_in`` sub-slices that update the
online softmax in turn.

Grid: ``(batch*heads, q blocks, kv blocks)``; the running max, denominator and the transposed
``(D, bq)`` accumulator live in VMEM scratch across the kv axis. Keys beyond the true length and
outside the window are masked; kv blocks with no visible key are skipped.

A block mask (:class:`~wanjax.kernels.block_mask.BlockMask` of 128-token blocks, local queries on
block boundaries) is scalar-prefetched as one int32 per grid block, its ``(bkv/128, bq/128)`` table
slice in bits: a grid block with none set is skipped like one outside the window; in the others
each key block's bits select query lanes, broadcast over its 128 key rows, so the kernel masks the
partially kept grid blocks exactly.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from wanjax.errors import ConfigError
from wanjax.kernels.common import (
    MASK_VALUE,
    AttentionProblem,
    from_head_major,
    head_major,
    pad_to_blocks,
    use_interpret,
)

LOG2_E = math.log2(math.e)
MASK_BLOCK = 128  # the block of a block mask this kernel applies (its lanes' width)
SUBLANES = 8  # rows of the running max / denominator scratch (one TPU vreg tile)


def splash_exp2_attention(problem: AttentionProblem) -> jax.Array:
    """``softmax(q k^T * scale) v`` over ``(B, L, H, D)``; ``blocks``: ``(bq, bkv, bkv_compute, bkv_compute_in)``."""
    q, k, v, scale, blocks, window_size, block_mask = problem
    batch, q_len, _, dim = q.shape
    k_len = k.shape[1]
    (bq, bkv, bkv_compute, bkv_compute_in), q_pad, k_pad, d_pad = pad_to_blocks(q, k, blocks)
    q_scaled = (q.astype(jnp.float32) * (scale * LOG2_E)).astype(q.dtype)
    qh, kh, vh = head_major(q_scaled, q_pad, d_pad), head_major(k, k_pad, d_pad), head_major(v, k_pad, d_pad)
    grid = (qh.shape[0], q_pad // bq, k_pad // bkv)
    kernel_args = dict(
        bq=bq,
        bkv=bkv,
        bkv_compute=bkv_compute,
        bkv_compute_in=bkv_compute_in,
        k_len=k_len if k_pad != k_len else None,
        window=window_size,
    )
    if block_mask is not None:
        return _masked_call(block_mask, qh, kh, vh, grid, kernel_args, q_len, k_len, dim, batch)

    kernel = functools.partial(_kernel, **kernel_args)
    out = pl.pallas_call(
        kernel,
        grid=grid,
        in_specs=[
            pl.BlockSpec((None, bq, d_pad), lambda h, i, j: (h, i, 0)),
            pl.BlockSpec((None, bkv, d_pad), lambda h, i, j: (h, j, 0)),
            pl.BlockSpec((None, bkv, d_pad), lambda h, i, j: (h, j, 0)),
        ],
        out_specs=pl.BlockSpec((None, bq, d_pad), lambda h, i, j: (h, i, 0)),
        out_shape=jax.ShapeDtypeStruct(qh.shape, q.dtype),
        scratch_shapes=[
            pltpu.VMEM((SUBLANES, bq), jnp.float32),  # running max (rows identical)
            pltpu.VMEM((SUBLANES, bq), jnp.float32),  # running denominator
            pltpu.VMEM((d_pad, bq), jnp.float32),  # transposed output accumulator
        ],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            flags={"XLA_TPU_FORCE_LP_LLO_SCHEDULER": True},
        ),
        interpret=use_interpret("splash_exp2"),
        cost_estimate=_cost(qh, kh, q_len, k_len, dim, q_pad // bq),
        name="wanjax_splash_exp2",
    )(qh, kh, vh)
    return from_head_major(out, batch, q_len, dim)


def _masked_call(mask, qh, kh, vh, grid, kernel_args, q_len: int, k_len: int, dim: int, batch: int):
    """The kernel over ``grid`` under a block mask: each grid block's table slice packed in one
    scalar-prefetched int32 (bit ``r * (bq / 128) + c``: key block ``r``, query block ``c``; 0: skipped)."""
    bq, bkv = kernel_args["bq"], kernel_args["bkv"]
    rows, cols = bkv // MASK_BLOCK, bq // MASK_BLOCK
    if mask.block != MASK_BLOCK or mask.q_offset % MASK_BLOCK or rows * cols > 31:
        raise ConfigError(
            f"splash_exp2 applies block masks of {MASK_BLOCK}-token blocks on local queries starting on a "
            f"block boundary with grid blocks of at most 31 such blocks, got blocks of {mask.block} from "
            f"query {mask.q_offset} in {bq}x{bkv}; use --attention splash"
        )
    _, nq, nk = grid
    table = mask.coarse(nq * bq, nk * bkv).reshape(nq, cols, nk, rows).transpose(0, 2, 3, 1)
    weights = (1 << np.arange(rows * cols, dtype=np.int64)).reshape(rows, cols)
    bits = (table * weights).sum(axis=(2, 3)).astype(np.int32)  # (nq, nk)
    d_pad = qh.shape[-1]
    out = pl.pallas_call(
        functools.partial(_masked_kernel, **kernel_args),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=grid,
            in_specs=[
                pl.BlockSpec((None, bq, d_pad), lambda h, i, j, bits: (h, i, 0)),
                pl.BlockSpec((None, bkv, d_pad), lambda h, i, j, bits: (h, j, 0)),
                pl.BlockSpec((None, bkv, d_pad), lambda h, i, j, bits: (h, j, 0)),
            ],
            out_specs=pl.BlockSpec((None, bq, d_pad), lambda h, i, j, bits: (h, i, 0)),
            scratch_shapes=[
                pltpu.VMEM((SUBLANES, bq), jnp.float32),
                pltpu.VMEM((SUBLANES, bq), jnp.float32),
                pltpu.VMEM((d_pad, bq), jnp.float32),
            ],
        ),
        out_shape=jax.ShapeDtypeStruct(qh.shape, qh.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            flags={"XLA_TPU_FORCE_LP_LLO_SCHEDULER": True},
        ),
        interpret=use_interpret("splash_exp2"),
        cost_estimate=_cost(qh, kh, q_len, k_len, dim, nq, density=float(table.mean())),
        name="wanjax_splash_exp2_masked",
    )(jnp.asarray(bits), qh, kh, vh)
    return from_head_major(out, batch, q_len, dim)


def _masked_kernel(bits_ref, q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, **kwargs):
    _kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, bits_ref=bits_ref, **kwargs)


def _seen_rows(bits: jax.Array, first: int, count: int, bq: int) -> jax.Array:
    """``(count, bq)`` float: for key blocks ``first ..`` of the grid block, which query lanes see them."""
    lane_block = jax.lax.div(jax.lax.broadcasted_iota(jnp.int32, (1, bq), 1), MASK_BLOCK)  # no sign op
    cols = bq // MASK_BLOCK
    rows = []
    for r in range(first, first + count):
        row = jnp.zeros((1, bq), jnp.float32)
        for c in range(cols):
            bit = jnp.where((bits & (1 << (r * cols + c))) != 0, 1.0, 0.0)
            row = jnp.where(lane_block == c, bit, row)
        rows.append(row)
    return jnp.concatenate(rows, axis=0)


def _cost(
    qh: jax.Array, kh: jax.Array, q_len: int, k_len: int, dim: int, q_blocks: int, density: float = 1.0
) -> pl.CostEstimate:
    """What the compiler's cost model counts for the call (else ~0): the attention's analytic FLOPs
    (``4 Lq Lk D`` per head, the padding not counted; :mod:`wanjax.tools.flops`), one exponential
    per score, and the bytes moved: q and the output once, k and v once per query block; ``density``:
    the kept fraction of the grid's blocks under a block mask."""
    heads = qh.shape[0]
    item = qh.dtype.itemsize
    return pl.CostEstimate(
        flops=int(4 * heads * q_len * k_len * dim * density),
        transcendentals=int(heads * q_len * k_len * density),
        bytes_accessed=2 * qh.size * item + 2 * kh.size * item * q_blocks,
    )


def _kernel(
    q_ref,
    k_ref,
    v_ref,
    o_ref,
    m_ref,
    l_ref,
    acc_ref,
    *,
    bq: int,
    bkv: int,
    bkv_compute: int,
    bkv_compute_in: int,
    k_len: int | None,
    window: int | None,
    bits_ref=None,
) -> None:
    i, j = pl.program_id(1), pl.program_id(2)
    q_start, kv_start = i * bq, j * bkv

    @pl.when(j == 0)
    def init():
        m_ref[...] = jnp.full(m_ref.shape, MASK_VALUE, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    def compute(c: int, _: None, visible_rows: jax.Array | None = None) -> None:
        start = pl.multiple_of(c * bkv_compute, bkv_compute)
        k = k_ref[pl.ds(start, bkv_compute), :]
        v = v_ref[pl.ds(start, bkv_compute), :]
        # (bkv_compute, bq) scores in log2 units: queries on lanes.
        qk = jax.lax.dot_general(k, q_ref[...], (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        qk = _mask(qk, q_start, kv_start + start, k_len, window)
        if visible_rows is not None:  # (bkv_compute / 128, bq) of the block mask -> (bkv_compute, bq)
            rows = visible_rows.shape[0]
            seen = jnp.broadcast_to(visible_rows[:, None, :], (rows, MASK_BLOCK, bq)).reshape(bkv_compute, bq)
            qk = jnp.where(seen > 0.5, qk, MASK_VALUE)
        m, denom, acc = m_ref[0:1, :], l_ref[0:1, :], acc_ref[...]
        for s in range(0, bkv_compute, bkv_compute_in):
            qk_s = qk[s : s + bkv_compute_in]
            m_next = jnp.maximum(m, qk_s.max(axis=0, keepdims=True))
            p = jnp.exp2(qk_s - m_next)
            alpha = jnp.exp2(m - m_next)
            denom = alpha * denom + p.sum(axis=0, keepdims=True)
            pv = jax.lax.dot_general(
                v[s : s + bkv_compute_in],
                p.astype(v.dtype),
                (((0,), (0,)), ((), ())),
                preferred_element_type=jnp.float32,
            )  # (D, bq)
            acc = alpha * acc + pv
            m = m_next
        m_ref[...] = jnp.broadcast_to(m, m_ref.shape)
        l_ref[...] = jnp.broadcast_to(denom, l_ref.shape)
        acc_ref[...] = acc

    visible = _block_visible(q_start, kv_start, bq, bkv, k_len, window)
    if bits_ref is None:

        @pl.when(visible)
        def run():
            jax.lax.fori_loop(0, bkv // bkv_compute, compute, None)

    else:
        bits = bits_ref[i, j]

        @pl.when(visible & (bits != 0))
        def run_masked():
            per_slice = bkv_compute // MASK_BLOCK
            for c in range(bkv // bkv_compute):  # static: each slice's key blocks are static bits
                compute(c, None, _seen_rows(bits, c * per_slice, per_slice, bq))

    @pl.when(j == pl.num_programs(2) - 1)
    def finish():
        o_ref[...] = (acc_ref[...] / l_ref[0:1, :]).T.astype(o_ref.dtype)


def _mask(qk: jax.Array, q_start, kv_start, k_len: int | None, window: int | None) -> jax.Array:
    """Set scores of keys ``>= k_len`` or outside ``|q - k| <= window`` to ``MASK_VALUE``."""
    if k_len is None and window is None:
        return qk
    kv_pos = kv_start + jax.lax.broadcasted_iota(jnp.int32, qk.shape, 0)
    valid = jnp.ones(qk.shape, jnp.bool_)
    if k_len is not None:
        valid = valid & (kv_pos < k_len)
    if window is not None:
        q_pos = q_start + jax.lax.broadcasted_iota(jnp.int32, qk.shape, 1)
        valid = valid & (jnp.abs(q_pos - kv_pos) <= window)
    return jnp.where(valid, qk, MASK_VALUE)


def _block_visible(q_start, kv_start, bq: int, bkv: int, k_len: int | None, window: int | None):
    """Whether any query of the block sees any key of the kv block."""
    visible = jnp.bool_(True)
    if k_len is not None:
        visible = visible & (kv_start < k_len)
    if window is not None:
        visible = visible & (kv_start <= q_start + bq - 1 + window) & (kv_start + bkv - 1 >= q_start - window)
    return visible
