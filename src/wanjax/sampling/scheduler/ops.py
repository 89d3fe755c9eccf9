"""Traced elementwise ops that round the way torch does for a float32 scalar and a tensor."""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["scalar_times", "true_div"]


def true_div(a: jax.Array, s: jax.Array) -> jax.Array:
    """``a / s`` for a scalar ``s``, rounded like an IEEE division (as torch does).

    XLA rewrites division by a broadcast scalar into multiplication by its reciprocal, which rounds
    differently; the barrier hides the broadcast from that rewrite.
    """
    return a / jax.lax.optimization_barrier(jnp.broadcast_to(s, a.shape))


def scalar_times(sigma: jax.Array, model_output: jax.Array) -> jax.Array:
    """``sigma * model_output`` as torch computes a 0-d float32 tensor times a tensor; returns float32.

    For a bf16/fp16 ``model_output`` torch rounds ``sigma`` to that dtype, multiplies (exactly, in
    float32) and rounds the product to that dtype.
    """
    if model_output.dtype == jnp.float32:
        return sigma * model_output
    dt = model_output.dtype
    prod = sigma.astype(dt).astype(jnp.float32) * model_output.astype(jnp.float32)
    return prod.astype(dt).astype(jnp.float32)
