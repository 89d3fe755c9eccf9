"""The TPU kernels (splash, splash_exp2) in Pallas interpret mode equal a float64 softmax reference."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers.attention_reference import random_qkv, reference, rel

import wanjax
from wanjax.chips import DEFAULT_BLOCKS
from wanjax.errors import ConfigError
from wanjax.kernels import tuning
from wanjax.kernels.attention import AttentionSpec, InterpretModeWarning, attention

pytestmark = pytest.mark.filterwarnings("ignore::wanjax.kernels.attention.InterpretModeWarning")

KERNELS = ["splash", "splash_exp2"]
TOLERANCE = {jnp.float32: 1e-5, jnp.bfloat16: 1e-2}
# (B, Lq, Lk, H, D): the lengths (1,950 pads to the blocks; 4,096 is a whole number of them),
# cross-attention with 512 keys and 12 heads, head_dim 64 and 128.
SHAPES = {
    "self1950": (1, 1950, 1950, 2, 64),
    "self4096": (1, 4096, 4096, 2, 128),
    "cross512": (2, 390, 512, 12, 128),
}
BLOCKS = dict(block_q=512, block_kv=1024, block_kv_compute=512, block_kv_compute_in=256)


def run(kernel, q, k, v, **options):
    spec = AttentionSpec(kernel, **{**BLOCKS, **options})
    return jax.jit(lambda q, k, v: attention(q, k, v, backend=spec))(q, k, v)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("kernel", KERNELS)
def test_matches_float64_reference(kernel, shape, dtype):
    q, k, v = random_qkv(*shape, seed=sum(shape), dtype=dtype)
    out = run(kernel, q, k, v)
    assert out.shape == q.shape and out.dtype == dtype
    assert rel(out, reference(q, k, v)) <= TOLERANCE[dtype]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_k_smoothing_is_exact(kernel, dtype):
    q, k, v = random_qkv(1, 1950, 1950, 2, 64, seed=7, dtype=dtype, key_offset=4.0)
    assert rel(run(kernel, q, k, v, k_smooth=True), reference(q, k, v)) <= TOLERANCE[dtype]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_window(kernel, dtype):
    """A window narrower than a block: kv blocks outside it are skipped, the rest masked."""
    q, k, v = random_qkv(1, 1950, 1950, 2, 64, seed=8, dtype=dtype)
    out = run(kernel, q, k, v, window_size=300, k_smooth=True)
    assert rel(out, reference(q, k, v, window=300)) <= TOLERANCE[dtype]


@pytest.mark.parametrize("kernel", KERNELS)
def test_small_blocks_and_odd_head_dim(kernel):
    """Many blocks per row (bkv_compute_in < bkv_compute < bkv) and a head dim padded to 128."""
    q, k, v = random_qkv(1, 700, 700, 3, 40, seed=9)
    out = run(kernel, q, k, v, block_q=128, block_kv=512, block_kv_compute=256, block_kv_compute_in=128)
    assert rel(out, reference(q, k, v)) <= 1e-5


def test_interpret_mode_warns_off_tpu():
    q, k, v = random_qkv(1, 8, 8, 1, 8)
    with pytest.warns(InterpretModeWarning, match="interpret mode, which is for testing only"):
        attention(q, k, v, backend="splash_exp2")


@pytest.mark.parametrize(
    "blocks,message",
    [
        (dict(block_q=100), "bq=100 must be a positive multiple of 128"),
        (dict(block_kv=1024, block_kv_compute=384), "blocks must nest"),
    ],
)
def test_bad_blocks_are_refused(blocks, message):
    q, k, v = random_qkv(1, 8, 8, 1, 8)
    with pytest.raises(ConfigError, match=message):
        attention(q, k, v, backend=AttentionSpec("splash_exp2", **blocks))


def test_tune_cache_supplies_missing_blocks(tmp_path):
    path = tmp_path / "tune.json"
    key = tuning.shape_key("splash_exp2", 1950, 1950, 64, "float32")
    spec = AttentionSpec("splash_exp2", block_q=256, tune_file=str(path))
    assert spec.blocks(key) == (256, *DEFAULT_BLOCKS[1:])
    tuning.store(key, tuning.device_kind(), (384, 768, 384, 128), path)
    assert spec.blocks(key) == (256, 768, 384, 128)
    assert AttentionSpec("splash_exp2", tune_file=str(path)).blocks(key + "x") == DEFAULT_BLOCKS


def test_a_tune_file_is_read_once_per_path(tmp_path, monkeypatch):
    """Lookups keep each file's table; a store refreshes it; another path is read on its own."""
    reads = []
    monkeypatch.setattr(tuning, "read_cache", lambda path=None: reads.append(path) or {})
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    for _ in range(3):
        assert tuning.lookup("key", "kind", first) == DEFAULT_BLOCKS
    assert reads == [first]
    tuning.lookup("key", "kind", second)
    assert reads == [first, second]
    tuning.store("key", "kind", (1, 2, 3, 4), first)  # reads the file to merge, then refreshes
    tuning.lookup("key", "kind", first)
    assert reads == [first, second, first, first]


def test_dit_forward_with_splash_exp2_equals_xla(tiny_transformer_dir):
    """A whole tiny DiT (150 tokens: two query blocks of 128, the second padded) agrees across backends."""
    root, _ = tiny_transformer_dir
    spec = AttentionSpec(
        "splash_exp2", block_q=128, block_kv=128, block_kv_compute=128, block_kv_compute_in=128
    )
    latents = jax.random.normal(jax.random.key(0), (1, 16, 5, 10, 12))
    text = jax.random.normal(jax.random.key(1), (1, 7, 32))
    timestep = jnp.array([500])
    outs = [
        np.asarray(
            wanjax.load_transformer(root, dtype="float32", attention_backend=b)(latents, timestep, text)
        )
        for b in ("xla", spec)
    ]
    assert rel(outs[1], outs[0].astype(np.float64)) <= 1e-5
