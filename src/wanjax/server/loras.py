"""Per-request LoRAs: the adapters a job names (``lora`` / ``lora_2``: ``[{"name", "scale"}]``) among
the files of the server's ``--lora_dir``, on top of the server's own ``--lora`` / ``--lora_2``."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from wanjax.server import json_text
from wanjax.server.errors import ApiError

LORA_FIELDS = ("lora", "lora_2")  # into the transformer; into a two-expert model's low-noise expert
MAX_LORAS = 8
SUFFIX = ".safetensors"
NAME = re.compile(r"[A-Za-z0-9][\w.+-]{0,127}")  # a file's name in --lora_dir without SUFFIX: no path


def lora_entries(field: str, value: Any) -> list[dict[str, Any]]:
    """A body's ``lora`` / ``lora_2`` value as ``[{"name", "scale"}]`` (scale 1.0 when left out); a
    form field's JSON text is read first. ApiError 400 for anything else."""
    shape = f'{field} must be a list of up to {MAX_LORAS} {{"name": ..., "scale": ...}} objects'
    if isinstance(value, str):  # a multipart form sends it as JSON text
        try:
            value = json_text.loads(value)
        except json_text.TooDeep as e:
            raise ApiError(400, f"{shape}, got JSON with {e}", param=field) from None
        except ValueError:
            raise ApiError(400, f"{shape}, got text that is not JSON", param=field) from None
    if not isinstance(value, list) or len(value) > MAX_LORAS:
        raise ApiError(400, f"{shape}, got {value!r:.80}", param=field)
    entries = []
    for item in value:
        if not isinstance(item, dict) or "name" not in item or set(item) - {"name", "scale"}:
            raise ApiError(400, f"{shape}, got {item!r:.80}", param=field)
        name, scale = item["name"], item.get("scale", 1.0)
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ApiError(
                400,
                f"{field}: {name!r:.80} is not a LoRA's name (a file's name in the server's LoRA folder)",
                param=field,
            )
        if isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale):
            raise ApiError(
                400, f"{field}: the scale of {name} must be a finite number, got {scale!r:.40}", param=field
            )
        entries.append({"name": name, "scale": float(scale)})
    names = [entry["name"] for entry in entries]
    if len(set(names)) < len(names):
        raise ApiError(400, f"{field} names a LoRA twice: give each once, with its scale", param=field)
    return entries


def lora_group(params: Mapping[str, Any]) -> str:
    """The job's LoRA set as text ("" for none): jobs of one set run back to back."""
    chosen = {field: params[field] for field in LORA_FIELDS if params.get(field)}
    return json.dumps(chosen, sort_keys=True) if chosen else ""


@dataclasses.dataclass(frozen=True)
class LoraLibrary:
    """The LoRA files jobs may name: ``folder / NAME.safetensors`` (None: none)."""

    folder: Path | None

    def names(self) -> list[str]:
        if self.folder is None:
            return []
        return sorted(path.name.removesuffix(SUFFIX) for path in self.folder.glob(f"*{SUFFIX}"))

    def path(self, field: str, name: str) -> Path:
        """The file of the LoRA ``name``; ApiError 400 naming the choices when there is none."""
        if self.folder is None:
            raise ApiError(
                400,
                f"{field}: this server was started without a folder of LoRAs; jobs cannot name any",
                param=field,
            )
        path = self.folder / f"{name}{SUFFIX}"
        if not path.is_file():
            names = self.names()
            listed = ", ".join(names[:20]) + (", ..." if len(names) > 20 else "") if names else "none"
            raise ApiError(400, f"{field}: no LoRA {name!r} on this server; it has: {listed}", param=field)
        return path

    def specs(self, params: Mapping[str, Any], field: str) -> list[tuple[Path, float]]:
        """The job's ``field`` as ``(file, scale)`` pairs."""
        return [(self.path(field, e["name"]), e["scale"]) for e in params.get(field, ())]

    def flags(self, params: Mapping[str, Any], field: str) -> tuple[str, ...]:
        """The job's ``field`` as ``--lora PATH:SCALE`` values."""
        return tuple(f"{path}:{scale!r}" for path, scale in self.specs(params, field))
