"""The step a step cache runs (:mod:`~wanjax.sampling.cache.step_cache`): its state's shapes and the
transformer's forward that computes the blocks or takes their cached output, per branch."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from wanjax.models.dit import DitInputs, WanTransformer
from wanjax.models.layers import Params
from wanjax.sampling.cache import seacache, taylorseer
from wanjax.sampling.cache.step_cache import StepCache

__all__ = ["CacheState", "cached_forward", "first_block_changed", "magnitude_ratio", "state_shapes"]

CacheState = dict[str, jax.Array]


def state_shapes(
    cache: StepCache, tokens: jax.ShapeDtypeStruct, velocity: jax.ShapeDtypeStruct
) -> CacheState:
    """The cache carried between steps, for the guided batch's ``tokens (rows, L, D)`` and
    ``velocity (rows, C, T, H, W)``: the cached residual, and for First-Block Cache the first block's
    residual at the last computed step; TaylorSeer's factors of the velocity, how many are valid and
    the step they were computed at; SeaCache's (:func:`wanjax.sampling.cache.seacache.state_shapes`, its
    latents shaped as the velocity: it runs only where the input is the latents alone)."""
    if cache.sea is not None:
        return seacache.state_shapes(tokens, velocity, len(cache.branches))
    if cache.taylor is not None:
        count = cache.taylor.max_order + 1
        dtype = taylorseer.factor_dtype(cache.taylor, velocity.dtype)
        scalar = jax.ShapeDtypeStruct((), jnp.int32)
        return {
            "factors": jax.ShapeDtypeStruct((count, *velocity.shape), dtype),
            "orders": scalar,
            "last": scalar,
        }
    names = ("residual", "reference") if cache.policy == "firstblock" else ("residual",)
    return {name: jax.ShapeDtypeStruct(tokens.shape, tokens.dtype) for name in names}


def _per_branch(values: jax.Array, branches: int) -> jax.Array:
    """``(rows, ...)`` -> ``(branches, rows/branches, ...)``."""
    return values.reshape(branches, values.shape[0] // branches, *values.shape[1:])


def _rows(flags: jax.Array, rows: int) -> jax.Array:
    """Per-branch flags ``(branches,)`` broadcast to the rows of ``(rows, L, D)`` tokens."""
    return jnp.repeat(flags, rows // flags.shape[0])[:, None, None]


def first_block_changed(
    residual: jax.Array, reference: jax.Array, threshold: jax.Array, branches: int
) -> jax.Array:
    """Per branch, whether the first block's residual changed by more than ``threshold``:
    ``mean|r - r_ref| / mean|r_ref|`` over the branch's rows, in the residual's dtype."""
    r, ref = _per_branch(residual, branches), _per_branch(reference, branches)
    axes = tuple(range(1, r.ndim))
    change = jnp.mean(jnp.abs(r - ref), axis=axes) / jnp.mean(jnp.abs(ref), axis=axes)
    return change.astype(jnp.float32) > threshold


def magnitude_ratio(residual: jax.Array, previous: jax.Array, branches: int) -> jax.Array:
    """Per branch, the mean over its rows' tokens of ``||r|| / (||r_prev|| + 1e-8)`` (float32)."""
    current = jnp.linalg.norm(residual.astype(jnp.float32), axis=-1)
    before = jnp.linalg.norm(previous.astype(jnp.float32), axis=-1)
    ratio = _per_branch(current / (before + 1e-8), branches)
    return jnp.mean(ratio, axis=tuple(range(1, ratio.ndim)))


def cached_forward(
    model: WanTransformer,
    params: Params,
    inputs: DitInputs,
    cache: StepCache,
    state: CacheState,
    index: jax.Array,
    planned: jax.Array,
    threshold: jax.Array,
    start_index: jax.Array,
) -> tuple[jax.Array, CacheState, jax.Array, jax.Array]:
    """The velocity of the (guided) batch's ``inputs`` (:func:`~wanjax.sampling.guidance.guided_batch`'s,
    the run's text K/V cache in them or not) under ``cache``, with the new cache state, which branches
    computed (``bool (branches,)``) and, calibrating, each branch's magnitude ratio (else 1.0).
    ``planned``: MagCache's ``compute`` row for this step; ``threshold``: First-Block Cache's;
    ``start_index``: the step ``state`` was new at (0; a second expert's first step), which computes."""
    branches = len(cache.branches)
    if cache.taylor is not None:
        return _taylor_forward(model, params, inputs, state, index, planned)
    tokens, cond = model.embed(params, inputs)
    rows = tokens.shape[0]
    out: CacheState = {}
    if cache.sea is not None:
        return _sea_forward(
            model, params, inputs.latents, tokens, cond, cache, state, index, threshold, start_index
        )
    if cache.policy == "firstblock":
        base = model.blocks(params, tokens, cond, 0, 1)
        first = base - tokens
        changed = first_block_changed(first, state["reference"], threshold, branches)
        compute = jnp.logical_or(index == start_index, changed)
        out["reference"] = jnp.where(_rows(compute, rows), first, state["reference"])
        start = 1
    else:
        base, compute, start = tokens, planned, 0
    reused = base + state["residual"]
    fresh = jax.lax.cond(jnp.any(compute), lambda: model.blocks(params, base, cond, start), lambda: reused)
    hidden = jnp.where(_rows(compute, rows), fresh, reused)
    out["residual"] = jnp.where(_rows(compute, rows), fresh - base, state["residual"])
    ratios = jnp.ones((branches,), jnp.float32)
    if cache.calibrate:
        measured = magnitude_ratio(out["residual"], state["residual"], branches)
        ratios = jnp.where(index == start_index, ratios, measured)
    return model.project(params, hidden, cond), out, compute, ratios


def _sea_forward(
    model: WanTransformer,
    params: Params,
    latents: jax.Array,
    tokens: jax.Array,
    cond: Any,
    cache: StepCache,
    state: CacheState,
    index: jax.Array,
    threshold: jax.Array,
    start_index: jax.Array,
) -> tuple[jax.Array, CacheState, jax.Array, jax.Array]:
    """SeaCache's step: the indicator, each branch's decision on the device, the blocks where any
    branch computes, a skipping branch's rows from its reused residual."""
    assert cache.sea is not None and cache.sea_scalars is not None
    sea, rows = cache.sea, tokens.shape[0]
    scalars = jnp.asarray(cache.sea_scalars)[index]
    current = seacache.indicator(latents, scalars, sea.power_exp)
    steps = cache.schedule.shape[0]
    compute, distance = seacache.decide(sea, state, current, index, start_index, steps, threshold)
    reused = tokens + seacache.reused_residual(sea, state, index)
    fresh = jax.lax.cond(jnp.any(compute), lambda: model.blocks(params, tokens, cond), lambda: reused)
    hidden = jnp.where(_rows(compute, rows), fresh, reused)
    out = seacache.record(sea, state, compute, fresh - tokens, current, distance, index)
    return model.project(params, hidden, cond), out, compute, jnp.ones(compute.shape, jnp.float32)


def _taylor_forward(
    model: WanTransformer,
    params: Params,
    inputs: DitInputs,
    state: CacheState,
    index: jax.Array,
    planned: jax.Array,
) -> tuple[jax.Array, CacheState, jax.Array, jax.Array]:
    """TaylorSeer's step: the whole forward of ``inputs`` and its factors updated, or their prediction
    alone."""

    def compute() -> tuple[jax.Array, CacheState]:
        velocity = model.apply(params, inputs)
        factors, orders, last = taylorseer.update(
            state["factors"], state["orders"], state["last"], velocity, index
        )
        return velocity, {"factors": factors, "orders": orders, "last": last}

    def predicted() -> tuple[jax.Array, CacheState]:
        return taylorseer.predict(state["factors"], state["orders"], state["last"], index, model.dtype), state

    velocity, out = jax.lax.cond(planned[0], compute, predicted)
    return velocity, out, planned, jnp.ones(planned.shape, jnp.float32)


# ----------------------------------------------------------------------------------------------
# What a run did
