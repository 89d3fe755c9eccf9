"""TeaCache: skip the DiT's blocks while the step's timestep embedding has barely changed.

Decision for decision as the authors' Wan 2.1 code (``teacache_forward`` in
``TeaCache4Wan2.1/teacache_generate.py``; coefficients, lines and thresholds in ``teacache.json``):
at each step the modulated input ``m`` (the time embedding ``temb``; with ``ret_steps`` the blocks'
modulation ``time_mod``, the authors' ``use_ret_steps``) is compared with the previous step's,
``mean|m - m_prev| / mean|m_prev|`` in float32 (the authors' embedding is float32), mapped through
``np.poly1d(coefficients)`` and added to a running sum (a Python float); the step skips while the sum
is below the threshold, else it computes and the sum restarts. The first step (the first five with
``ret_steps``) and, without ``ret_steps``, the last step always compute. A skip adds the residual of
the blocks cached at the last computed step, per CFG branch (the step cache's MagCache path).

``m`` depends on the timestep alone, so both branches share one schedule, computed on the host
before the loop from the model's own time embedder.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from wanjax.errors import ConfigError
from wanjax.models.config import TransformerConfig
from wanjax.models.registry import match
from wanjax.sampling.cache.files import number_list, packaged_presets, read_json_file

PRESETS_FILE = "teacache.json"
MODES = ("time_embedding", "ret_steps")  # the modulated input: temb (e), or time_mod (e0)
WARMUP_STEPS = {"time_embedding": 1, "ret_steps": 5}  # the authors' ret_steps // 2
COMPUTES_LAST = {"time_embedding": True, "ret_steps": False}  # cutoff_steps 2N - 2, or 2N

Coefficients = str | Path | Sequence[float]


def presets() -> dict[str, dict[str, Any]]:
    """The published coefficients by model name (``wan2.1-t2v-1.3b``, ...), per mode, with the
    authors' thresholds and the source they were copied from."""
    return packaged_presets(PRESETS_FILE)


def preset_for(cfg: TransformerConfig) -> str | None:
    """The coefficients published for this transformer's registry variant, or None."""
    found = match(cfg, 1)
    return None if found is None else found.teacache


@dataclasses.dataclass(frozen=True)
class TeaCoefficients:
    """A rescaling polynomial (highest power first, as ``np.poly1d``), where it came from, and the
    threshold published with it (None for coefficients of the user's own)."""

    coefficients: tuple[float, ...]
    source: str
    threshold: float | None = None


def _as_coefficients(value: Any, where: str) -> tuple[float, ...]:
    return tuple(number_list(value, where, "coefficients"))


def read_coefficients(
    value: Coefficients | None, cfg: TransformerConfig | None = None, ret_steps: bool = False
) -> TeaCoefficients:
    """``value`` (a preset name, a JSON file holding a list, or a list; None: ``cfg``'s preset) for
    the mode ``ret_steps`` picks; ConfigError for an unknown name, an unreadable file or a bad list."""
    mode = MODES[1] if ret_steps else MODES[0]
    if value is None:
        value = None if cfg is None else preset_for(cfg)
        if value is None:
            raise ConfigError(
                "teacache needs coefficients: none are published for this model; pass --teacache_coefficients "
                f"NAME|FILE.json (presets: {', '.join(presets())})"
            )
    if isinstance(value, str | Path) and str(value) in presets():
        entry = presets()[str(value)]
        published = entry[mode]
        source = f"preset {value} {mode} ({entry['source']}, line {published['line']})"
        return TeaCoefficients(
            _as_coefficients(published["coefficients"], str(value)), source, published["threshold"]
        )
    if isinstance(value, str | Path):
        data = read_json_file(value, presets(), "TeaCache", "coefficients", "a list of numbers")
        return TeaCoefficients(_as_coefficients(data, str(Path(value))), f"file {Path(value)}")
    return TeaCoefficients(_as_coefficients(value, "teacache coefficients"), "given")


def relative_l1(current: np.ndarray, previous: np.ndarray) -> float:
    """``mean|current - previous| / mean|previous|`` in float32, as a Python float (the authors'
    ``(...).abs().mean() / (...).abs().mean()`` then ``.item()``)."""
    cur, prev = np.asarray(current, np.float32), np.asarray(previous, np.float32)
    change = np.abs(cur - prev).mean(dtype=np.float32)
    return float(np.float32(change) / np.float32(np.abs(prev).mean(dtype=np.float32)))


def tea_schedule(
    modulated: np.ndarray, coefficients: Sequence[float], threshold: float, ret_steps: bool = False
) -> np.ndarray:
    """Which steps compute (``bool [steps]``) for the modulated inputs of each step (``[steps, ...]``)."""
    mode = MODES[1] if ret_steps else MODES[0]
    steps, warmup = len(modulated), WARMUP_STEPS[mode]
    rescale = np.poly1d(coefficients)
    compute = np.ones(steps, bool)
    accumulated = 0.0
    for i in range(steps):
        if i < warmup or (COMPUTES_LAST[mode] and i == steps - 1):
            accumulated = 0.0
            continue
        accumulated += rescale(relative_l1(modulated[i], modulated[i - 1]))
        if accumulated < threshold:
            compute[i] = False
        else:
            accumulated = 0.0
    return compute
