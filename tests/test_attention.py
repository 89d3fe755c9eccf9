"""The xla attention backend equals a float64 softmax reference, dense and blockwise; backend selection."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers.attention_reference import random_qkv, reference, rel

from wanjax.errors import ConfigError
from wanjax.kernels.attention import AttentionShape, AttentionSpec, attention, resolve_backend

# (B, Lq, Lk, H, D): self-attention with lengths that are not multiples of the blocks, cross-attention.
SHAPES = [(2, 130, 130, 2, 64), (1, 195, 512, 3, 128), (1, 97, 33, 12, 16)]


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("blockwise", [False, True], ids=["dense", "blockwise"])
def test_float32_matches_float64_reference(shape, blockwise):
    q, k, v = random_qkv(*shape)
    kwargs = dict(dense_limit=0, block_q=32, block_k=48) if blockwise else {}
    out = attention(q, k, v, **kwargs)
    assert out.shape == q.shape and out.dtype == jnp.float32
    assert rel(out, reference(q, k, v)) <= 1e-5


@pytest.mark.parametrize("blockwise", [False, True], ids=["dense", "blockwise"])
def test_bfloat16_close_to_reference(blockwise):
    q, k, v = random_qkv(1, 200, 200, 4, 64, seed=1, dtype=jnp.bfloat16)
    kwargs = dict(dense_limit=0, block_q=64, block_k=64) if blockwise else {}
    out = attention(q, k, v, **kwargs)
    assert out.dtype == jnp.bfloat16
    assert rel(out, reference(q, k, v)) <= 1e-2


def test_custom_scale():
    q, k, v = random_qkv(1, 40, 50, 2, 16, seed=2)
    out = attention(q, k, v, scale=0.5, dense_limit=0, block_q=16, block_k=16)
    assert rel(out, reference(q, k, v, scale=0.5)) <= 1e-5


def _largest_intermediate(jaxpr) -> int:
    """Element count of the largest value any equation (nested ones included) produces."""
    largest = 0
    for eqn in jaxpr.eqns:
        for var in eqn.outvars:
            largest = max(largest, int(np.prod(var.aval.shape)))
        for param in eqn.params.values():
            inner = getattr(param, "jaxpr", param)
            if hasattr(inner, "eqns"):
                largest = max(largest, _largest_intermediate(inner))
    return largest


def test_long_sequence_never_materialises_full_scores():
    """At 720p lengths (75,600 tokens, 40 heads) no intermediate may hold Lq x Lk scores."""
    length, heads = 75_600, 40
    q = jax.ShapeDtypeStruct((1, length, heads, 128), jnp.bfloat16)
    jaxpr = jax.make_jaxpr(attention)(q, q, q)
    # Nothing larger than the (block-padded) inputs themselves: memory is linear in L, not L * L.
    padded_input = length * 1.02 * heads * 128
    assert _largest_intermediate(jaxpr.jaxpr) <= padded_input < heads * length * length / 100


@pytest.mark.parametrize("blockwise", [False, True], ids=["dense", "blockwise"])
@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 1e-2)], ids=["f32", "bf16"])
def test_k_smoothing_is_exact(blockwise, dtype, tol):
    """Keys sharing a large offset: smoothing removes it without changing the result."""
    q, k, v = random_qkv(1, 130, 130, 2, 64, seed=3, dtype=dtype, key_offset=4.0)
    kwargs = dict(dense_limit=0, block_q=32, block_k=48) if blockwise else {}
    out = attention(q, k, v, backend=AttentionSpec("xla", k_smooth=True), **kwargs)
    assert rel(out, reference(q, k, v)) <= tol


@pytest.mark.parametrize("blockwise", [False, True], ids=["dense", "blockwise"])
@pytest.mark.parametrize("window", [0, 7, 60])
def test_window_matches_reference(blockwise, window):
    q, k, v = random_qkv(1, 130, 130, 2, 16, seed=4)
    kwargs = dict(dense_limit=0, block_q=32, block_k=48) if blockwise else {}
    out = attention(q, k, v, backend=AttentionSpec("xla", window_size=window), **kwargs)
    assert rel(out, reference(q, k, v, window=window)) <= 1e-5


def test_window_leaves_cross_attention_global():
    q, k, v = random_qkv(1, 40, 24, 2, 16, seed=5)
    out = attention(q, k, v, backend=AttentionSpec("xla", window_size=2))
    assert rel(out, reference(q, k, v)) <= 1e-5


def test_auto_is_xla_on_cpu():
    """(Other platforms, simulated: tests/test_backend_choice.py.)"""
    bf16, f32 = AttentionShape(128, jnp.bfloat16), AttentionShape(384, jnp.float32)
    assert resolve_backend("auto") == resolve_backend("auto", bf16) == resolve_backend("auto", f32) == "xla"


ON_CPU = "; available: auto, xla, splash, splash_exp2$"


def test_unknown_backend_is_refused():
    q, k, v = random_qkv(1, 4, 4, 1, 8)
    with pytest.raises(ConfigError, match="^unknown attention backend 'flash9'" + ON_CPU):
        attention(q, k, v, backend="flash9")
    with pytest.raises(ConfigError, match="^unknown attention backend 'flash9'" + ON_CPU):
        AttentionSpec("flash9")


def test_cudnn_is_unavailable_on_cpu():
    q, k, v = random_qkv(1, 4, 4, 1, 8)
    with pytest.raises(
        ConfigError, match="^attention backend 'cudnn' needs an NVIDIA GPU, unavailable on cpu" + ON_CPU
    ):
        attention(q, k, v, backend="cudnn")


def test_negative_window_is_refused():
    with pytest.raises(ConfigError, match="window_size must be >= 0"):
        AttentionSpec("xla", window_size=-1)
