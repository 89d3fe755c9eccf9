"""The xla attention backend equals a float64 softmax reference, dense and blockwise."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wanjax.attention import attention
from wanjax.errors import ConfigError


def reference(q, k, v, scale=None):
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", p, v)


def random_qkv(b, lq, lk, h, d, seed=0, dtype=jnp.float32):
    keys = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(keys[0], (b, lq, h, d)) * 1.5
    k = jax.random.normal(keys[1], (b, lk, h, d)) * 1.5
    v = jax.random.normal(keys[2], (b, lk, h, d))
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


def rel(ours, ref):
    return np.linalg.norm(np.asarray(ours, np.float64) - ref) / np.linalg.norm(ref)


# (B, Lq, Lk, H, D): self-attention with lengths that are not multiples of the blocks, cross-attention.
SHAPES = [(2, 130, 130, 2, 64), (1, 195, 512, 3, 128), (1, 97, 33, 12, 16)]


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


def test_unknown_backend_is_refused():
    q, k, v = random_qkv(1, 4, 4, 1, 8)
    with pytest.raises(ConfigError, match="available: auto, xla"):
        attention(q, k, v, backend="flash9")
