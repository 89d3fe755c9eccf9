"""Block-sparse self-attention equals dense attention under the same element mask, on every backend
(the TPU kernels in Pallas interpret mode), whole and as the all-gather form's query shards."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from helpers.attention_reference import random_qkv, reference, rel

from wanjax.errors import ConfigError
from wanjax.kernels.attention import AttentionSpec, attention
from wanjax.kernels.block_mask import BlockMask
from wanjax.kernels.radial import radial_block_mask

pytestmark = pytest.mark.filterwarnings("ignore::wanjax.kernels.attention.InterpretModeWarning")

TPU_BLOCKS = dict(block_q=256, block_kv=512, block_kv_compute=256, block_kv_compute_in=128)
BACKENDS = {
    "xla": dict(block_kv=256),  # key chunks of two mask blocks
    "splash": TPU_BLOCKS,
    "splash_exp2": TPU_BLOCKS,
}


def radial_mask() -> BlockMask:
    """8 latent frames of 120 tokens (960: a partial last block), 31% of the blocks kept."""
    return BlockMask(radial_block_mask(8, 120, 1.0, 128), 128, 960)


def random_mask(length: int = 1000, seed: int = 3) -> BlockMask:
    """Any pattern: random blocks with the diagonal kept (no empty row)."""
    n = -(-length // 128)
    table = np.random.default_rng(seed).random((n, n)) < 0.35
    np.fill_diagonal(table, True)
    return BlockMask(table, 128, length)


def run(backend: str, mask: BlockMask, q, k, v, per_head: bool | None = None):
    spec = AttentionSpec(backend, block_mask=mask, **BACKENDS[backend])
    return jax.jit(lambda q, k, v: attention(q, k, v, backend=spec, per_head=per_head))(q, k, v)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("make_mask", [radial_mask, random_mask], ids=["radial", "random"])
def test_sparse_equals_masked_dense(backend, make_mask):
    mask = make_mask()
    assert 0.2 < mask.density < 0.6
    q, k, v = random_qkv(1, mask.length, mask.length, 2, 64, seed=mask.length)
    out = run(backend, mask, q, k, v)
    assert rel(out, reference(q, k, v, mask=mask.elements(mask.length))) <= 1e-5


@pytest.mark.parametrize("per_head,block_q", [(False, 128), (True, 128), (True, 384)])
def test_xla_batched_per_head_and_query_blocks(per_head, block_q):
    """Query blocks of one mask row, or of three (each over its rows' union, each row its own mask)."""
    mask = radial_mask()
    q, k, v = random_qkv(2, mask.length, mask.length, 3, 32, seed=5)
    spec = AttentionSpec("xla", block_q=block_q, block_kv=256, block_mask=mask)
    out = jax.jit(lambda q, k, v: attention(q, k, v, backend=spec, per_head=per_head))(q, k, v)
    assert rel(out, reference(q, k, v, mask=mask.elements(mask.length))) <= 1e-5


@pytest.mark.parametrize(
    "backend,make_mask,shards",
    [
        ("xla", radial_mask, 3),
        ("splash", radial_mask, 3),
        ("splash_exp2", lambda: random_mask(1024), 2),  # its shards start on block boundaries
    ],
)
def test_query_shards_take_their_rows(backend, make_mask, shards):
    """The all-gather form: each device attends its queries (for 3 shards of 960: 320, not on block
    boundaries) to every key under its own rows of the mask."""
    mask = make_mask()
    q, k, v = random_qkv(1, mask.length, mask.length, 2, 64, seed=11)
    dense = reference(q, k, v, mask=mask.elements(mask.length))
    shard = mask.length // shards
    for index in range(shards):
        rows = slice(index * shard, (index + 1) * shard)
        out = run(backend, mask.shard(index, shards), q[:, rows], k, v)
        assert rel(out, dense[:, rows]) <= 1e-5


def test_splash_exp2_refuses_unaligned_shards():
    mask = radial_mask().shard(1, 3)
    q, k, v = random_qkv(1, 320, 960, 1, 64)
    with pytest.raises(ConfigError, match="use --attention splash"):
        run("splash_exp2", mask, q, k, v)


def test_xla_loops_over_kept_blocks_only():
    """The ``xla`` loop's work per query block is its kept key blocks: for block-aligned queries the
    index table holds exactly the mask's kept blocks, ascending (the padding is never looped over)."""
    mask = BlockMask(radial_block_mask(21, 1560, 1.0, 128), 128, 32760)
    indices, counts = mask.kept_blocks(mask.length, mask.block)
    assert counts.sum() == mask.table.sum()
    for row, (ids, count) in enumerate(zip(indices, counts, strict=True)):
        np.testing.assert_array_equal(ids[:count], np.flatnonzero(mask.table[row]))
    print(f"kept {counts.sum()} of {mask.table.size} blocks, {counts.max()} at most per row")


def test_mask_refuses_other_lengths():
    mask = radial_mask()
    q, k, v = random_qkv(1, 64, 512, 1, 32)
    with pytest.raises(ValueError, match="self-attention only"):
        attention(q, k, v, backend=AttentionSpec("xla", block_mask=mask))
