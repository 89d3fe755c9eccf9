"""Blocks run under lax.scan: the compiled program does not grow with the number of layers."""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp

from wanjax.io.checkpoint import abstract_params
from wanjax.models.dit import DitInputs, checkpoint_spec, forward
from wanjax.models.registry import transformer_preset
from wanjax.models.settings import RunSettings


def lowered_ops(num_layers: int) -> list[str]:
    cfg = transformer_preset("1.3B", num_layers=num_layers)
    params = abstract_params(checkpoint_spec(cfg), jnp.bfloat16)
    latents = jax.ShapeDtypeStruct((1, 16, 5, 30, 52), jnp.float32)
    timestep = jax.ShapeDtypeStruct((1,), jnp.int32)
    text = jax.ShapeDtypeStruct((1, 512, 4096), jnp.bfloat16)
    fn = jax.jit(forward, static_argnames=("cfg", "settings"))
    inputs = DitInputs(latents, timestep, text)
    text_ir = fn.lower(params, cfg, inputs, settings=RunSettings(jnp.bfloat16)).as_text()
    return re.findall(r"= (?:\"?)([a-z_]+\.[a-z_]+)", text_ir)


def test_program_size_independent_of_depth():
    two, thirty = lowered_ops(2), lowered_ops(30)
    assert len(two) > 100  # the whole forward was lowered
    assert two == thirty  # same operations in the same order: only the loop's trip count differs


def test_presets_are_only_defaults_for_benchmarks():
    cfg = transformer_preset("14B", num_layers=2)
    assert dataclasses.replace(cfg, num_layers=40) == transformer_preset("14B")
    assert cfg.inner_dim == 5120
