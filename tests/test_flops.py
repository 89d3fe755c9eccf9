"""Analytic FLOP counts against the matrix products the traced programs actually contain."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import pytest
from jax.extend import core as jex_core

from wanjax.checkpoint import abstract_params
from wanjax.config import TransformerConfig
from wanjax.flops import Flops, achieved, dit_forward_flops, dit_step_flops, umt5_flops
from wanjax.models import dit, umt5


def _sub_jaxprs(params: dict) -> list[jex_core.Jaxpr]:
    found = []
    for value in params.values():
        for v in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(v, jex_core.ClosedJaxpr):
                found.append(v.jaxpr)
            elif isinstance(v, jex_core.Jaxpr):
                found.append(v)
    return found


def traced_matmul_flops(jaxpr: jex_core.Jaxpr) -> int:
    """2 x multiply-adds of every dot_general in ``jaxpr``, loops multiplied by their trip counts."""
    total = 0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            (lhs_contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            contract = math.prod(lhs[i] for i in lhs_contract)
            total += 2 * math.prod(eqn.outvars[0].aval.shape) * contract
            continue
        if name == "while":
            raise AssertionError("a while loop: trip count unknown to this counter")
        inner = sum(traced_matmul_flops(j) for j in _sub_jaxprs(eqn.params))
        total += inner * (eqn.params["length"] if name == "scan" else 1)
    return total


DIT = TransformerConfig(
    num_attention_heads=3,
    attention_head_dim=16,
    in_channels=4,
    out_channels=4,
    text_dim=24,
    freq_dim=32,
    ffn_dim=80,
    num_layers=3,
)


@pytest.mark.parametrize("latent_shape", [(1, 4, 1, 4, 6), (2, 4, 3, 6, 4)])
def test_dit_forward_count_equals_traced_matmuls(latent_shape):
    params = abstract_params(dit.checkpoint_spec(DIT), jnp.float32)
    text_len = 7

    def fn(p, x, t, c):
        return dit.forward(p, DIT, x, t, c, attention_backend="xla")

    args = (
        jax.ShapeDtypeStruct(latent_shape, jnp.float32),
        jax.ShapeDtypeStruct(latent_shape[:1], jnp.float32),
        jax.ShapeDtypeStruct((latent_shape[0], text_len, DIT.text_dim), jnp.float32),
    )
    traced = traced_matmul_flops(jax.make_jaxpr(fn)(params, *args).jaxpr)
    assert dit_forward_flops(DIT, latent_shape, text_len).total == traced


def test_umt5_count_equals_traced_matmuls():
    cfg = umt5.UMT5Config(vocab_size=50, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4)
    params = abstract_params(umt5.checkpoint_spec(cfg), jnp.float32)
    ids = jax.ShapeDtypeStruct((2, 9), jnp.int32)
    traced = traced_matmul_flops(
        jax.make_jaxpr(lambda p, i, m: umt5.forward(p, cfg, i, m))(params, ids, ids).jaxpr
    )
    assert umt5_flops(cfg, 2, 9).total == traced


def test_wan_1_3b_step_by_hand():
    """1.3B at 480x832x81 with CFG: 21x30x52 = 32,760 tokens; attention dominates."""
    cfg = TransformerConfig(num_attention_heads=12, ffn_dim=8960, num_layers=30)
    step = dit_step_flops(cfg, (1, 16, 21, 60, 104))
    tokens, d, batch = 32_760, 1536, 2
    self_attn = 4 * batch * tokens * tokens * d  # QK^T and PV, 2 FLOPs per multiply-add
    cross_attn = 4 * batch * tokens * 512 * d
    assert step.attention == 30 * (self_attn + cross_attn)  # 0.40 PFLOP
    assert step.attention > 2 * step.linear
    assert dit_step_flops(cfg, (1, 16, 21, 60, 104), guidance=False).total * 2 == step.total


def test_flops_arithmetic():
    f = Flops(3, 4) + 2 * Flops(1, 1)
    assert (f.linear, f.attention, f.total) == (5, 6, 11)
    assert achieved(f, 0.5) == 22 and math.isnan(achieved(f, 0))
