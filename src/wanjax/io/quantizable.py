"""Which params leaves 8-bit weight-only quantisation stores in 8 bits, and the shape of their scales:
the one rule that the quantisation code and ``wanjax plan`` share.

A leaf is quantisable when it is a matmul kernel, that is its layout is
:data:`~wanjax.io.checkpoint.linear_kernel` (PyTorch ``Linear.weight`` ``(out, in)`` -> ``(in, out)``;
stacked leaves are ``(layers, in, out)``), and it is not ``keep_fp32``. Everything else (norms,
biases, embeddings, modulation tables, the patch embedding's conv kernel) stays in the model dtype.
A quantised kernel holds 1 byte per element plus one float32 scale per output channel (per layer for
stacked kernels): the scale is the kernel without its input axis, and is sharded as the kernel's
remaining axes are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import ml_dtypes
import numpy as np

from wanjax.errors import ConfigError
from wanjax.io.checkpoint import LeafSource, linear_kernel

# ``--weights_dtype``: bf16 keeps the weights in the model dtype (no quantisation); int8 and fp8 store
# quantisable leaves in 8 bits; gguf keeps a GGUF file's quantised kernels as the file stores them
# (:mod:`wanjax.io.gguf_kernel`), the rest in the model dtype.
UNQUANTIZED = "bf16"
QUANTIZED_DTYPES: dict[str, np.dtype] = {
    "int8": np.dtype(np.int8),
    "fp8": np.dtype(ml_dtypes.float8_e4m3fn),
}
KEPT_GGUF = "gguf"
WEIGHTS_DTYPES = (UNQUANTIZED, *QUANTIZED_DTYPES, KEPT_GGUF)
SCALE_DTYPE = np.dtype(np.float32)
INPUT_AXIS = -2  # a kernel's contraction axis: (in, out), or (layers, in, out) when stacked

T = TypeVar("T")


def is_quantizable(source: LeafSource) -> bool:
    """True for a matmul kernel (layout :data:`linear_kernel`, 2-D or stacked 3-D) not kept float32."""
    return source.layout == linear_kernel and not source.keep_fp32


def scale_dims(per_dim: Sequence[T]) -> tuple[T, ...]:
    """A kernel's per-dimension values (its shape, logical axes, PartitionSpec entries padded to its
    rank) without the input axis: the scale's."""
    kept = list(per_dim)
    del kept[INPUT_AXIS]
    return tuple(kept)


def scale_shape(source: LeafSource) -> tuple[int, ...]:
    """The float32 scale of a quantisable leaf: ``(out,)``, or ``(layers, out)`` when stacked."""
    return scale_dims(source.target_shape())


def weights_dtype(name: str, what: str = "weights dtype") -> np.dtype | None:
    """``--weights_dtype`` -> the 8-bit storage dtype, or None for ``bf16`` and ``gguf`` (nothing
    quantised on loading); ConfigError naming ``what`` (e.g. the flag) for anything else."""
    if name in (UNQUANTIZED, KEPT_GGUF):
        return None
    if name not in QUANTIZED_DTYPES:
        raise ConfigError(f"unknown {what} {name!r}; use one of {', '.join(WEIGHTS_DTYPES)}")
    return QUANTIZED_DTYPES[name]
