"""SeaCache: skip the blocks while a spectrally filtered view of the noisy latents barely changes, as
diffusers' ``hooks/sea_cache.py`` (0.42.1) decides it for a Wan text-to-video transformer.

The indicator of a step is each sample's transformer input ``(C, T, H, W)`` seen as ``(T, H, W, C)``,
Fourier-transformed over (T, H, W), multiplied by the product of three per-axis Wiener gains
``s * P / (s^2 * P + n^2)`` (``s = 1 - sigma``, ``n = sigma``, ``P = 1 / |f|^power_exp``) normalised
to unit mean, and transformed back (real part, in the input's dtype). Per CFG branch, the relative L1
change of the indicator since the last step (averaged over the branch's samples) accumulates; the
branch computes when the sum reaches ``threshold`` (the sum then restarts), in its first
``retention_steps`` and last ``cache_end_steps`` steps, at its first step, after
``max_consecutive_cached`` skips in a row (0: no limit), and whenever it has no residual yet. A
computed step stores the blocks' residual (output minus input) and its step; a skip adds to the
blocks' input the last residual (``residual_order`` 0) or the line through the last two
(``residual_order`` 1: ``r1 + (r1 - r0) * (i - i1) / (i1 - i0)``).

diffusers applies it to Wan transformers whose input is the latents alone (``in_channels ==
out_channels``) in the pipeline that gives the hook its step (``WanPipeline``: text to video, TI2V-5B
without an image); elsewhere its hook runs every step, so wanjax refuses it there. The decision is
data: it is taken on the device, as First-Block Cache's.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from wanjax.errors import ConfigError

INTEGERS = ("residual_order", "retention_steps", "cache_end_steps", "max_consecutive_cached")
SIGMA_CLAMP = 1e-6


@dataclasses.dataclass(frozen=True)
class SeaCacheSettings:
    """diffusers' ``SeaCacheConfig`` fields (see :func:`settings`)."""

    threshold: float = 0.25
    residual_order: int = 1
    retention_steps: int = 1
    cache_end_steps: int = 1
    max_consecutive_cached: int = 2
    power_exp: float = 3.0

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# diffusers' SeaCacheConfig fields and defaults (raw_vision_callback, a Python hook for other models, aside)
DEFAULTS: dict[str, Any] = SeaCacheSettings().as_json()


def _value(name: str, value: Any) -> Any:
    """``value`` of field ``name`` checked as diffusers' ``__post_init__`` does (text read as JSON)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ConfigError(f"seacache {name} must be a number, got {value!r}") from None
    if name in INTEGERS:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"seacache {name} must be an integer >= 0, got {value!r}")
        if name == "residual_order" and value not in (0, 1):
            raise ConfigError(f"seacache residual_order must be 0 or 1, got {value}")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"seacache {name} must be a finite number, got {value!r}")
    if name == "power_exp" and value <= 0:
        raise ConfigError(f"seacache power_exp must be positive, got {value}")
    if value < 0:
        raise ConfigError(f"seacache {name} must be >= 0, got {value}")
    return float(value)


def settings(options: Mapping[str, Any] | None, threshold: float | None = None) -> SeaCacheSettings:
    """``options`` (diffusers' field names; values or their text) over diffusers' defaults, checked;
    ``threshold`` (``--cache_threshold``) sets that field unless the options do too (then an error)."""
    options = dict(options or {})
    if "raw_vision_callback" in options:
        raise ConfigError(
            "seacache raw_vision_callback is diffusers' Python hook for other models; wanjax builds the Wan "
            "indicator itself: leave it out"
        )
    unknown = sorted(set(options) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"unknown seacache option {unknown[0]!r}; the options are {', '.join(DEFAULTS)}")
    if threshold is not None:
        if "threshold" in options:
            raise ConfigError(
                "give seacache's threshold once: --cache_threshold or --cache_option threshold="
            )
        options["threshold"] = threshold
    return SeaCacheSettings(**{name: _value(name, value) for name, value in options.items()})


def step_scalars(sigmas: np.ndarray, num_steps: int) -> np.ndarray:
    """Per step ``(s, s^2, n^2)`` in float32 (``[num_steps, 3]``) from the scheduler's sigma, clamped to
    ``[1e-6, 1 - 1e-6]`` in float64 as the hook's Python floats are, then rounded as torch rounds a
    Python scalar meeting a float32 tensor."""
    out = np.zeros((num_steps, 3), np.float32)
    for i in range(num_steps):
        sigma = max(SIGMA_CLAMP, min(1.0 - SIGMA_CLAMP, float(sigmas[i])))
        signal = 1.0 - sigma
        out[i] = (signal, signal**2, sigma**2)
    return out


def _fftfreq(n: int) -> jax.Array:
    """torch's ``fft.fftfreq(n)`` in float32: ``k / n`` for ``k = 0 .. ceil(n/2)-1, -floor(n/2) .. -1``."""
    k = np.concatenate([np.arange(0, (n + 1) // 2), np.arange(-(n // 2), 0)])
    return jnp.asarray(k, jnp.float32) / jnp.float32(n)


def indicator(latents: jax.Array, scalars: jax.Array, power_exp: float) -> jax.Array:
    """The indicator of ``latents (N, C, T, H, W)``: ``(N, T, H, W, C)`` in their dtype, each sample
    filtered by the step's gain (``scalars``: its row of :func:`step_scalars`)."""
    x = jnp.moveaxis(latents, 1, -1).astype(jnp.float32)
    spectrum = jnp.fft.fftn(x, axes=(1, 2, 3))
    signal, signal_sq, noise_sq = scalars[0], scalars[1], scalars[2]
    gain = None
    for axis, n in zip((0, 1, 2), x.shape[1:4], strict=True):
        clean = 1.0 / (jnp.abs(_fftfreq(n)) ** jnp.float32(power_exp) + jnp.float32(1e-16))
        axis_gain = signal * clean / (signal_sq * clean + noise_sq + jnp.float32(1e-16))
        shape = [1, 1, 1]
        shape[axis] = n
        gain = axis_gain.reshape(shape) if gain is None else gain * axis_gain.reshape(shape)
    mean = jnp.mean(gain)
    gain = jnp.where(jnp.isfinite(mean) & (mean > 0), gain / mean, gain)
    filtered = jnp.fft.ifftn(spectrum * gain[None, :, :, :, None], axes=(1, 2, 3)).real
    return filtered.astype(latents.dtype)


def state_shapes(
    tokens: jax.ShapeDtypeStruct, latents: jax.ShapeDtypeStruct, branches: int
) -> dict[str, jax.ShapeDtypeStruct]:
    """What a run carries between steps: the last indicator; the last two residuals of the blocks
    (``latest``, ``previous``), per branch their steps, how many are kept, the accumulated change and
    the skips in a row."""
    n, c, t, h, w = latents.shape
    ints = jax.ShapeDtypeStruct((branches,), jnp.int32)
    return {
        "indicator": jax.ShapeDtypeStruct((n, t, h, w, c), latents.dtype),
        "latest": tokens,
        "previous": tokens,
        "steps": jax.ShapeDtypeStruct((branches, 2), jnp.int32),
        "count": ints,
        "distance": jax.ShapeDtypeStruct((branches,), jnp.float32),
        "consecutive": ints,
    }


def _per_branch(values: jax.Array, branches: int) -> jax.Array:
    return values.reshape(branches, values.shape[0] // branches, *values.shape[1:])


def decide(
    s: SeaCacheSettings,
    state: dict[str, jax.Array],
    current: jax.Array,
    index: jax.Array,
    start_index: jax.Array,
    num_steps: int,
    threshold: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """Per branch, whether the step computes, and the accumulated change after it."""
    branches = state["count"].shape[0]
    cur = _per_branch(current.astype(jnp.float32), branches)
    prev = _per_branch(state["indicator"].astype(jnp.float32), branches)
    axes = tuple(range(2, cur.ndim))
    change = jnp.mean(jnp.abs(cur - prev), axis=axes) / (jnp.mean(jnp.abs(prev), axis=axes) + 1e-16)
    distance = jnp.mean(change, axis=1)
    forced = (index < s.retention_steps) | (index >= num_steps - s.cache_end_steps) | (index == start_index)
    if s.max_consecutive_cached:
        forced = forced | (state["consecutive"] >= s.max_consecutive_cached)
    candidate = state["distance"] + distance
    natural = forced | ~jnp.isfinite(distance) | (candidate >= threshold)
    compute = natural | (state["count"] == 0)
    return compute, jnp.where(compute, jnp.float32(0), candidate)


def reused_residual(s: SeaCacheSettings, state: dict[str, jax.Array], index: jax.Array) -> jax.Array:
    """The residual a skip adds, per row: the latest, or (order 1, two kept) the line through both
    (the difference scaled in float32 and rounded, as a tensor times a Python float)."""
    latest = state["latest"]
    if s.residual_order == 0:
        return latest
    branches = state["count"].shape[0]
    before, last = state["steps"][:, 0], state["steps"][:, 1]
    scale = (index - last).astype(jnp.float32) / jnp.maximum(last - before, 1).astype(jnp.float32)
    rows = jnp.repeat(scale, latest.shape[0] // branches)[:, None, None]
    step = ((latest - state["previous"]).astype(jnp.float32) * rows).astype(latest.dtype)
    two = jnp.repeat(state["count"] >= 2, latest.shape[0] // branches)[:, None, None]
    return jnp.where(two, latest + step, latest)


def record(
    s: SeaCacheSettings,
    state: dict[str, jax.Array],
    compute: jax.Array,
    residual: jax.Array,
    current: jax.Array,
    distance: jax.Array,
    index: jax.Array,
) -> dict[str, jax.Array]:
    """The state after the step: a computing branch keeps ``residual`` (its rows) as the latest, the
    latest before it as the previous (order 1), its step, and restarts its skips; a skipping branch
    counts one more skip. The indicator is kept either way."""
    branches = compute.shape[0]
    rows = jnp.repeat(compute, residual.shape[0] // branches)[:, None, None]
    keep = s.residual_order + 1
    steps = state["steps"]
    shifted = jnp.stack([steps[:, 1], jnp.broadcast_to(index, steps[:, 1].shape)], axis=1)
    return {
        "indicator": current,
        "latest": jnp.where(rows, residual, state["latest"]),
        "previous": jnp.where(rows, state["latest"], state["previous"]),
        "steps": jnp.where(compute[:, None], shifted, steps),
        "count": jnp.where(compute, jnp.minimum(state["count"] + 1, keep), state["count"]),
        "distance": distance,
        "consecutive": jnp.where(compute, 0, state["consecutive"] + 1),
    }
