"""What the step caches read: their published presets (JSON files shipped beside this module) and
lists of numbers given as a preset name, a JSON file or a list."""

from __future__ import annotations

import functools
import importlib.resources
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from wanjax.errors import ConfigError


@functools.cache
def packaged_presets(file_name: str) -> dict[str, dict[str, Any]]:
    """The entries of a presets file of this package by name (``_``-prefixed keys are comments)."""
    text = importlib.resources.files(__package__).joinpath(file_name).read_text()
    return {name: entry for name, entry in json.loads(text).items() if not name.startswith("_")}


def read_json_file(value: str | Path, names: Iterable[str], kind: str, what: str, expected: str) -> Any:
    """The JSON a file given for ``kind``'s ``what`` holds (e.g. MagCache's ratios); ConfigError for a
    name that is neither one of the presets ``names`` nor a .json file, an unreadable file or bad JSON."""
    path = Path(value)
    if path.suffix != ".json" and not path.exists():
        raise ConfigError(
            f"unknown {kind} preset {str(value)!r}; use one of {', '.join(names)} or a .json file"
        )
    try:
        return json.loads(path.read_text())
    except OSError as e:
        raise ConfigError(f"cannot read the {kind} {what} {path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not JSON ({e.msg}, line {e.lineno}); expected {expected}") from None


def number_list(value: Any, where: str, what: str) -> list[float]:
    """``value`` as a non-empty list of finite floats; ConfigError naming ``where`` and ``what`` otherwise."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence) or not value:
        raise ConfigError(f"{where}: the {what} must be a non-empty list of numbers")
    try:
        out = [float(v) for v in value]
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: the {what} must be a non-empty list of numbers") from None
    if not all(np.isfinite(out)):
        raise ConfigError(f"{where}: the {what} must be finite numbers")
    return out
