"""TaylorSeer: at the steps between full forwards, the transformer's output extrapolated by a Taylor
series of its finite differences, as diffusers' ``hooks/taylorseer_cache.py`` (0.42.1) computes it.

The settings are diffusers' ``TaylorSeerCacheConfig`` fields, by their names. diffusers hooks the
modules its regular expressions name; on a Wan transformer the default ones (``^blocks.*attn``, ...)
match no module (its attention modules are ``attn1``/``attn2``), so only a configuration whose
predicted module is the output projection ``proj_out`` changes anything: ``use_lite_mode`` (blocks
skipped, ``proj_out`` predicted) or ``cache_identifiers`` matching ``proj_out``. With ``proj_out``
predicted, the other hooks cannot change the output, so wanjax runs exactly that: a predicted step
skips the whole forward and returns the prediction; any other configuration is a one-line error.

Per CFG branch (diffusers' cache contexts) and per expert (a hook per transformer), each call counts
a step ``s``; it computes when ``s < disable_cache_before_step``, ``(s - before - 1) % cache_interval
== 0`` or ``s >= disable_cache_after_step``, which depends on the step alone, so the schedule is
computed on the host before the loop. A computed step stores the output and its divided differences
up to ``max_order`` (in ``taylor_factors_dtype``); a predicted one sums ``factor_k * offset^k / k!``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from wanjax.errors import ConfigError

PREDICTED_MODULE = "proj_out"
# diffusers' TaylorSeerCacheConfig defaults and its identifiers (hooks/taylorseer_cache.py)
DEFAULTS: dict[str, Any] = {
    "cache_interval": 5,
    "disable_cache_before_step": 3,
    "disable_cache_after_step": None,
    "max_order": 1,
    "taylor_factors_dtype": "bfloat16",
    "skip_predict_identifiers": None,
    "cache_identifiers": None,
    "use_lite_mode": False,
}
DEFAULT_IDENTIFIERS = (
    "^blocks.*attn",
    "^transformer_blocks.*attn",
    "^single_transformer_blocks.*attn",
    "^temporal_transformer_blocks.*attn",
)
FACTOR_DTYPES = ("bfloat16", "float16", "float32", None)  # None: the model's dtype


@dataclasses.dataclass(frozen=True)
class TaylorSeerSettings:
    """diffusers' ``TaylorSeerCacheConfig`` fields (identifiers as tuples); see :func:`settings`."""

    cache_interval: int = 5
    disable_cache_before_step: int = 3
    disable_cache_after_step: int | None = None
    max_order: int = 1
    taylor_factors_dtype: str | None = "bfloat16"
    skip_predict_identifiers: tuple[str, ...] | None = None
    cache_identifiers: tuple[str, ...] | None = None
    use_lite_mode: bool = False

    def as_json(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


def _value(name: str, value: Any) -> Any:
    """``value`` of field ``name`` checked (and read from text, as ``--cache_option`` gives it)."""
    if isinstance(value, str) and value.strip().lower() in ("none", "null"):
        value = None
    if isinstance(value, str) and name != "taylor_factors_dtype":
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            value = [value] if name.endswith("identifiers") else value
    bad = ConfigError
    if name in ("cache_interval", "max_order", "disable_cache_before_step", "disable_cache_after_step"):
        if value is None and name == "disable_cache_after_step":
            return None
        least = 1 if name in ("cache_interval", "max_order") else 0
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise bad(f"taylorseer {name} must be an integer >= {least}, got {value!r}")
        return value
    if name == "use_lite_mode":
        if not isinstance(value, bool):
            raise bad(f"taylorseer use_lite_mode must be true or false, got {value!r}")
        return value
    if name == "taylor_factors_dtype":
        value = None if value in (None, "none", "None") else str(value).removeprefix("torch.")
        if value not in FACTOR_DTYPES:
            raise bad(
                f"taylorseer taylor_factors_dtype must be bfloat16, float16, float32 or none, got {value!r}"
            )
        return value
    if value is None:
        return None
    if isinstance(value, str) or not all(isinstance(v, str) for v in value):
        raise bad(f"taylorseer {name} must be a list of regular expressions, got {value!r}")
    for pattern in value:
        try:
            re.compile(pattern)
        except re.error as e:
            raise bad(f"taylorseer {name}: {pattern!r} is not a regular expression ({e})") from None
    return tuple(value)


def settings(options: Mapping[str, Any] | None) -> TaylorSeerSettings:
    """``options`` (diffusers' field names; values or their text) over diffusers' defaults, checked:
    an unknown name lists the valid ones; a configuration that predicts anything but ``proj_out`` on
    a Wan transformer (see the module docstring) is refused."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"unknown taylorseer option {unknown[0]!r}; the options are {', '.join(DEFAULTS)}")
    found = TaylorSeerSettings(**{name: _value(name, value) for name, value in options.items()})
    if found.disable_cache_before_step == 0 and found.cache_interval > 1:
        raise ConfigError(
            "taylorseer disable_cache_before_step 0 with cache_interval > 1 predicts the first step, before "
            "any step has computed (diffusers raises there); use disable_cache_before_step >= 1"
        )
    if not found.use_lite_mode:
        active = found.cache_identifiers or DEFAULT_IDENTIFIERS
        inactive = found.skip_predict_identifiers or ()
        hit = lambda patterns: any(re.fullmatch(p, PREDICTED_MODULE) for p in patterns)  # noqa: E731
        if not hit(active) or hit(inactive):
            raise ConfigError(
                "taylorseer on a Wan transformer predicts its output projection only: set use_lite_mode=true "
                f'or cache_identifiers=["^{PREDICTED_MODULE}$"] (diffusers\' defaults match no Wan module, '
                "so they would cache nothing)"
            )
    return found


def schedule(num_steps: int, s: TaylorSeerSettings) -> np.ndarray:
    """Which of a transformer's ``num_steps`` calls compute (``bool [num_steps]``), as the hook decides."""
    out = np.zeros(num_steps, bool)
    for step in range(num_steps):
        warmup = step < s.disable_cache_before_step
        interval = (step - s.disable_cache_before_step - 1) % s.cache_interval == 0
        cooldown = s.disable_cache_after_step is not None and step >= s.disable_cache_after_step
        out[step] = warmup or interval or cooldown
    return out


def factor_dtype(s: TaylorSeerSettings, model_dtype: Any) -> jnp.dtype:
    return jnp.dtype(model_dtype if s.taylor_factors_dtype is None else s.taylor_factors_dtype)


def update(
    factors: jax.Array, orders: jax.Array, last: jax.Array, features: jax.Array, index: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The factors after a computed step ``index`` whose output is ``features``: the output, then each
    order's divided difference against the stored one (in the features' dtype, stored in the factors'),
    ``orders`` (how many are valid) one higher up to ``max_order + 1``; ``last`` becomes ``index``."""
    count = factors.shape[0]
    delta = jnp.maximum(index - last, 1).astype(features.dtype)
    new = [features]
    for j in range(count - 1):
        new.append((new[j] - factors[j].astype(features.dtype)) / delta)
    return jnp.stack([f.astype(factors.dtype) for f in new]), jnp.minimum(orders + 1, count), index


def predict(
    factors: jax.Array, orders: jax.Array, last: jax.Array, index: jax.Array, dtype: Any
) -> jax.Array:
    """``sum_k factor_k * offset^k / k!`` over the valid orders (``offset = index - last``): each factor
    in ``dtype``, times the coefficient in float32, rounded to ``dtype`` (torch's product of a tensor and
    a Python float)."""
    offset = (index - last).astype(jnp.float32)
    out = jnp.zeros(factors.shape[1:], dtype)
    for k in range(factors.shape[0]):
        term = (factors[k].astype(dtype).astype(jnp.float32) * (offset**k / math.factorial(k))).astype(dtype)
        out = jnp.where(k < orders, out + term, out)
    return out
