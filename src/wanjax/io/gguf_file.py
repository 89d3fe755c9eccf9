"""GGUF checkpoints (city96's quantised diffusion models) as lazily dequantised tensor references.

Files are parsed with the ``gguf`` package's :class:`gguf.GGUFReader`, which memory-maps them; a
tensor's bytes are dequantised (``gguf.quants.dequantize``) only when it is read, and only the
blocks that hold the rows asked for. GGUF stores each tensor's dimensions innermost first (``ne``);
:class:`GGUFRef` gives shapes in PyTorch order, as diffusers' ``load_gguf_checkpoint`` and
ComfyUI-GGUF do. A tensor that city96's ``convert.py`` stored reshaped (its SD1/SDXL ``shape_fix``)
carries its original shape in the metadata key ``comfy.gguf.orig_shape.<tensor name>`` (an array of
int32), which is honoured as ComfyUI-GGUF's loader honours it. Values are given as stored for F32,
F16 and BF16 tensors and as float32 for every quantised type.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from importlib.metadata import version
from pathlib import Path
from typing import Any

import gguf
import ml_dtypes
import numpy as np

from wanjax.errors import CheckpointError

Index = tuple[slice, ...]

_CHUNK = 1 << 20  # values dequantised per call to gguf

ORIG_SHAPE_KEY = "comfy.gguf.orig_shape."  # + tensor name: ComfyUI-GGUF's original-shape metadata

_Q = gguf.GGMLQuantizationType
_FLOAT_DTYPES: dict[_Q, np.dtype] = {
    _Q.F32: np.dtype(np.float32),
    _Q.F16: np.dtype(np.float16),
    _Q.BF16: np.dtype(ml_dtypes.bfloat16),
}


@dataclasses.dataclass(frozen=True)
class GGUFRef:
    """One tensor of a GGUF file; indexing it dequantises only the rows (first axis) asked for.

    ``shape`` is in PyTorch order; ``dtype`` is what values are given in (float32 for quantised
    types); ``quant_type`` is the GGML type name (``Q4_K``, ``F16``, ...). ``data`` holds the
    tensor's stored bytes (a view of the file's memory map).
    """

    name: str
    file: Path
    shape: tuple[int, ...]
    dtype: np.dtype
    quant_type: str
    data: np.ndarray = dataclasses.field(repr=False, compare=False)

    def __getitem__(self, index: Index) -> np.ndarray:
        """``tensor[index]`` (a slice per dimension), dequantised."""
        if not self.shape or not index:
            return self.array()[index]
        rows = range(*index[0].indices(self.shape[0]))
        if not rows:
            return np.empty(self.shape, self.dtype)[index]
        lo, hi = min(rows), max(rows) + 1
        inner = math.prod(self.shape[1:])
        values = self._elements(lo * inner, hi * inner).reshape(hi - lo, *self.shape[1:])
        return values[(slice(rows.start - lo, None, rows.step), *index[1:])]

    def array(self) -> np.ndarray:
        """The whole tensor, dequantised."""
        return self._elements(0, math.prod(self.shape)).reshape(self.shape)

    def _elements(self, start: int, stop: int) -> np.ndarray:
        """Elements ``start:stop`` of the flattened tensor (C order), read from the blocks that hold them."""
        qtype = _Q[self.quant_type]
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        if qtype in _FLOAT_DTYPES:
            return np.array(self.data[start * size : stop * size]).view(self.dtype)
        first, last = start // block, -(-stop // block)
        values = np.empty((last - first) * block, np.float32)
        step = max(1, _CHUNK // block)  # blocks per call: one vectorised call, bounded temporaries
        for i in range(first, last, step):
            j = min(i + step, last)
            chunk = np.asarray(self.data[i * size : j * size]).reshape(1, -1)
            values[(i - first) * block : (j - first) * block] = gguf.quants.dequantize(chunk, qtype)[0]
        return values[start - first * block : stop - first * block]


def open_gguf(path: Path) -> dict[str, GGUFRef]:
    """Every tensor of a GGUF file by name, its header and types checked (nothing dequantised)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror or e})") from None
    if magic != b"GGUF":
        raise CheckpointError(
            f"{path}: not a GGUF file (it does not start with 'GGUF'); expected a .gguf checkpoint"
        )
    try:
        reader = _Reader(path)
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror or e})") from None
    except (ValueError, IndexError, KeyError, OverflowError) as e:
        raise CheckpointError(
            f"{path}: truncated file or corrupt GGUF header ({e}); download it again"
        ) from None
    if reader.byte_order != "I":
        raise CheckpointError(f"{path}: a big-endian GGUF file; use a little-endian one")
    return {t.name: _ref(path, reader, t) for t in reader.tensors}


def _ref(path: Path, reader: gguf.GGUFReader, tensor: Any) -> GGUFRef:
    qtype = tensor.tensor_type
    if not _dequantisable(qtype):
        raise CheckpointError(f"{path}: {_unsupported(tensor.name, qtype.name, 'cannot dequantise')}")
    shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF's ne order -> PyTorch order
    field = reader.get_field(ORIG_SHAPE_KEY + tensor.name)
    if field is not None:
        if field.types != [gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32]:
            raise CheckpointError(
                f"{path}: bad metadata {ORIG_SHAPE_KEY}{tensor.name} (expected an array of int32, "
                f"got {[t.name for t in field.types]}); convert the model again"
            )
        orig = tuple(int(field.parts[i][0]) for i in field.data)
        if math.prod(orig) != math.prod(shape):
            raise CheckpointError(
                f"{path}: {ORIG_SHAPE_KEY}{tensor.name} is {orig} but the tensor has shape {shape}; "
                "convert the model again"
            )
        shape = orig
    dtype = _FLOAT_DTYPES.get(qtype, np.dtype(np.float32))
    raw = np.asarray(tensor.data).reshape(-1).view(np.uint8)  # a view of the file's memory map
    return GGUFRef(tensor.name, path, shape, dtype, qtype.name, raw)


class _Reader(gguf.GGUFReader):
    """``GGUFReader`` that names the tensor when its type is unknown or its data runs past the end of
    the file (the reader itself fails on these with a bare ``ValueError``)."""

    def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:
        for field in fields:
            _, name, _, dims, raw_type, offset = field.parts
            name = bytes(name).decode("utf-8", "replace")
            try:
                qtype = _Q(int(raw_type[0]))
                block, size = gguf.GGML_QUANT_SIZES[qtype]
            except (ValueError, KeyError):
                raise CheckpointError(_unsupported(name, f"#{int(raw_type[0])}", "does not know")) from None
            end = start_offs + int(offset[0]) + math.prod(int(n) for n in dims) // block * size
            if end > len(self.data):
                raise CheckpointError(
                    f"truncated file: tensor {name} ends at byte {end} but the file has "
                    f"{len(self.data)} bytes; download it again"
                )
        super()._build_tensors(start_offs, fields)


@functools.cache
def _dequantisable(qtype: gguf.GGMLQuantizationType) -> bool:
    """Whether the installed gguf package can give this type's values (tried on one zero block)."""
    if qtype in _FLOAT_DTYPES:
        return True
    try:
        gguf.quants.dequantize(np.zeros((1, gguf.GGML_QUANT_SIZES[qtype][1]), np.uint8), qtype)
    except NotImplementedError:
        return False
    return True


def supported_types() -> list[str]:
    """The GGML type names this module reads with the installed gguf package."""
    return [q.name for q in _Q if q in gguf.GGML_QUANT_SIZES and _dequantisable(q)]


def _unsupported(name: str, type_name: str, why: str) -> str:
    return (
        f"tensor {name} has quantisation type {type_name}, which gguf {version('gguf')} {why} "
        f"(supported: {', '.join(supported_types())}); use a file quantised to a supported type, "
        "or upgrade gguf"
    )
