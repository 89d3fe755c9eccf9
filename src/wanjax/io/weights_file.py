"""One weights file of any format users download, opened as tensor references (no tensor read):
safetensors (plain, or fp8-scaled as ComfyUI and Kijai publish them) and GGUF.

fp8-scaled files store a matmul weight ``X.weight`` as ``float8_e4m3fn`` beside its float32 scale
``X.scale_weight`` (ComfyUI's older ``scaled_fp8`` files, with that marker tensor) or
``X.weight_scale`` (its newer quantised files; both per tensor or per output channel), plus input
scales (``scale_input`` / ``input_scale``) for fp8 activations, which weight-only dequantisation does
not use. Each such pair is opened as one :class:`ScaledRef`, whose values are the exact
dequantisation ``weight.astype(float32) * scale``; :mod:`wanjax.io.quant` keeps the 8-bit values
themselves where the model stores its kernels in fp8.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from wanjax.errors import CheckpointError
from wanjax.io.checkpoint import Index, Ref, TensorRef, open_safetensors

WEIGHT_SCALES = ("scale_weight", "weight_scale")  # X.<this> scales X.weight
UNUSED = ("scaled_fp8", "scale_input", "input_scale", "comfy_quant")  # markers and activation scales
FORMATS = (".safetensors", ".gguf")


@dataclasses.dataclass(frozen=True)
class ScaledRef:
    """An 8-bit weight and its float32 scale (a scalar, or one per output channel: the first axis),
    read as ``values.astype(float32) * scale``."""

    values: TensorRef
    scale: np.ndarray

    @property
    def name(self) -> str:
        return self.values.name

    @property
    def shape(self) -> tuple[int, ...]:
        return self.values.shape

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32)

    def channel_scale(self, index: slice = slice(None)) -> np.ndarray:
        """The scale of each output channel ``index`` selects, shape ``(channels,)``."""
        channels = range(self.shape[0])[index]
        return (
            np.broadcast_to(self.scale.reshape(-1), (self.shape[0],))[index]
            .astype(np.float32)
            .reshape(len(channels))
        )

    def __getitem__(self, index: Index) -> np.ndarray:
        values = self.values[index].astype(np.float32)
        scale = self.channel_scale(index[0] if index else slice(None))
        return values * scale.reshape(-1, *(1,) * (values.ndim - 1))

    def array(self) -> np.ndarray:
        return self[tuple(slice(None) for _ in self.shape)]


def _scale_problem(weight: TensorRef, scale: np.ndarray) -> str | None:
    if weight.dtype.itemsize != 1:
        return f"is {weight.dtype}, not 8-bit"
    if scale.size not in (1, weight.shape[0]):
        return f"has {scale.size} scales for {weight.shape[0]} output channels"
    if not np.all(np.isfinite(scale)):
        return "has a non-finite scale"
    return None


def scaled_fp8(path: Path, refs: dict[str, TensorRef]) -> dict[str, Ref]:
    """``refs`` with each scaled 8-bit weight as a :class:`ScaledRef` and the scales, markers and
    input scales removed."""
    out: dict[str, Ref] = {}
    for name, ref in refs.items():
        module, _, leaf = name.rpartition(".")
        if leaf in WEIGHT_SCALES or leaf in UNUSED or name in UNUSED:
            continue
        scale_name = next(
            (f"{module}.{s}" for s in WEIGHT_SCALES if leaf == "weight" and f"{module}.{s}" in refs), None
        )
        if scale_name is None:
            out[name] = ref
            continue
        scale = refs[scale_name].array().astype(np.float32)
        problem = _scale_problem(ref, scale)
        if problem:
            raise CheckpointError(
                f"{path}: fp8-scaled weight {name} {problem}; the file is not a valid fp8-scaled checkpoint"
            )
        out[name] = ScaledRef(ref, scale)
    return out


def open_weights(path: str | Path) -> dict[str, Any]:
    """The tensors of one weights file (``.safetensors`` or ``.gguf``), by their stored names."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file")
    if path.suffix == ".gguf":
        from wanjax.io.gguf_file import open_gguf

        return open_gguf(path)
    if path.suffix != ".safetensors":
        raise CheckpointError(
            f"{path}: not a weights file wanjax reads (use {' or '.join(FORMATS)}; "
            "convert pickles with safetensors' save_file)"
        )
    return scaled_fp8(path, open_safetensors(path))
