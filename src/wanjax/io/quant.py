"""8-bit weight-only quantisation of matmul kernels (``--weights_dtype int8|fp8``).

A quantised kernel is a :class:`QuantizedKernel` leaf in place of the kernel array: ``values`` in the
kernel's shape, stored as ``int8`` or ``float8_e4m3fn``, and one float32 ``scale`` per output channel
(the kernel without its input axis: ``(out,)``, or ``(layers, out)`` for stacked kernels), so that
``kernel ≈ values * scale[..., None, :]``. It is a registered pytree (``values`` and ``scale`` its
children), so the params tree stays explicit: ``lax.scan`` over stacked layers slices both, and
moving, sharding or counting a tree's arrays sees them. Which leaves are quantised is
:func:`wanjax.io.quantizable.is_quantizable`'s rule; the matmul that dequantises them is
:func:`wanjax.models.layers.linear`.

Quantisation is symmetric, per output channel, from the absolute maximum over the input axis:
``int8``: ``scale = absmax / 127.5``, ``values = round(w * (1 / scale))`` clipped to ``[-128, 127]``
(error at most ``scale / 2``; torchao's and qwix's symmetric int8, so that the W8A8 matmul,
:mod:`wanjax.models.w8a8`, is theirs);
``fp8`` (e4m3fn): ``scale = absmax / 448``, ``values = w / scale`` rounded to the nearest e4m3 value
(relative error at most 2^-4 for normal values). It runs on the host as the checkpoint is read
(:func:`leaf_builder`), one layer at a time: a model never holds its kernels in 16 bits on a device.

Pre-quantised checkpoints: a kernel stored as ``F8_E4M3`` (the plain e4m3fn casts that many
downloadable "fp8" files are, without scales) is taken as it is under ``fp8`` (``scale = 1``); an
fp8-scaled one (:class:`~wanjax.io.weights_file.ScaledRef`) with its own scales; under ``int8`` either
is requantised from its values, under ``bf16`` read into the model dtype.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import ml_dtypes
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from wanjax.io.checkpoint import (
    Index,
    LeafBuilder,
    LeafSource,
    Ref,
    ShardingFn,
    abstract_params,
    build_leaf,
    leaf_dtype,
)
from wanjax.io.gguf_kernel import build_kept
from wanjax.io.quantizable import (
    INPUT_AXIS,
    KEPT_GGUF,
    QUANTIZED_DTYPES,
    SCALE_DTYPE,
    is_quantizable,
    scale_dims,
    scale_shape,
    weights_dtype,
)
from wanjax.io.weights_file import ScaledRef

INT8 = QUANTIZED_DTYPES["int8"]
FP8 = QUANTIZED_DTYPES["fp8"]
# the magnitude a channel's absmax maps to: e4m3's largest; for int8 half the range [-128, 127]
# (torchao's and qwix's symmetric int8: -absmax rounds to -128, +absmax to 128, clipped to 127)
QMAX: dict[np.dtype, float] = {INT8: 127.5, FP8: float(ml_dtypes.finfo(FP8).max)}
# the values each 8-bit dtype stores
LIMITS: dict[np.dtype, tuple[float, float]] = {INT8: (-128.0, 127.0), FP8: (-QMAX[FP8], QMAX[FP8])}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QuantizedKernel:
    """A matmul kernel ``(..., in, out)`` stored in 8 bits: ``values * scale[..., None, :]``.

    ``values``: int8 or float8_e4m3fn, the kernel's shape and sharding; ``scale``: float32, the
    kernel's shape without the input axis, sharded as the kernel's output axis is; ``dtype`` (static):
    the dtype the kernel stands for, which the matmul computes in (the model dtype); ``w8a8``
    (static, int8 only): the matmul quantises its input per token and multiplies int8 x int8
    (:mod:`wanjax.models.w8a8`, which marks the kernels a forward multiplies so), else weight-only.
    """

    values: Any
    scale: Any
    dtype: np.dtype = dataclasses.field(metadata={"static": True})
    w8a8: bool = dataclasses.field(default=False, metadata={"static": True})

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape)

    @property
    def ndim(self) -> int:
        return len(self.values.shape)

    def dequantize(self) -> jax.Array:
        """The kernel in :attr:`dtype`: ``values * scale`` in float32, rounded once."""
        values = jax.numpy.asarray(self.values).astype(np.float32)
        return (values * jax.numpy.expand_dims(self.scale, INPUT_AXIS)).astype(self.dtype)


# ----------------------------------------------------------------------------------------------
# Host quantisation


def quantize(w: Any, dtype: Any, xp: Any = np) -> tuple[Any, Any]:
    """``(values, scale)`` of a kernel ``w (..., in, out)``, per output channel (absmax over ``in``):
    ``w ≈ values * scale[..., None, :]``; ``values`` in ``dtype`` (int8 or float8_e4m3fn), ``scale``
    float32 of shape ``(..., out)`` (1 for an all-zero channel). ``xp``: NumPy (on the host, as a
    checkpoint is read) or ``jax.numpy`` (on the devices, as a LoRA is merged): the same rule."""
    dtype = np.dtype(dtype)
    if dtype not in QMAX:
        raise ValueError(f"cannot quantise to {dtype}; use one of {', '.join(map(str, QMAX))}")
    w = xp.asarray(w, np.float32)
    absmax = xp.abs(w).max(axis=INPUT_AXIS, initial=0.0)
    scale = xp.where(absmax > 0, _divided(absmax, QMAX[dtype], xp), np.float32(1)).astype(SCALE_DTYPE)
    if dtype == INT8:  # as torchao rounds: times the reciprocal, half to even
        q = xp.rint(w * xp.expand_dims(np.float32(1) / scale, INPUT_AXIS))
    else:
        q = w / xp.expand_dims(scale, INPUT_AXIS)
    return xp.clip(q, *LIMITS[dtype]).astype(dtype), scale


def _divided(a: Any, divisor: float, xp: Any) -> Any:
    """``a / divisor`` rounded once, as NumPy divides, also inside a program: XLA would multiply by
    the divisor's rounded reciprocal (an ulp off, and int8's absmax lands on a tie at 127.5 steps, so
    the ulp would decide a channel's largest value)."""
    if xp is np:
        return a / np.float32(divisor)
    return a / jax.lax.optimization_barrier(xp.full(a.shape, divisor, np.float32))


def dequantize(values: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``values * scale[..., None, :]`` in float32 (host NumPy)."""
    return np.asarray(values).astype(np.float32) * np.expand_dims(scale, INPUT_AXIS)


def _is_float8(dtype: np.dtype) -> bool:
    return dtype.itemsize == 1 and dtype.kind not in "iub"


def read_quantized(
    source: LeafSource, refs: Mapping[str, Ref], index: Index, dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray]:
    """``(values, scale)`` of the slice ``index`` of a quantisable leaf, which must span the whole
    input axis (a scale needs the whole channel). Stacked leaves are read and quantised one layer at
    a time (one layer in float32 on the host). A leaf stored in ``dtype`` already (a float8
    checkpoint) is taken as it is, with scale 1."""
    scaled = _read_scaled(source, refs, index, dtype)
    if scaled is not None:
        return scaled
    stored = {np.dtype(refs[name].dtype) for name in source.names}
    if stored == {dtype} and _is_float8(dtype):
        values = source.read(refs, index, dtype)
        return values, np.ones(scale_dims(values.shape), SCALE_DTYPE)
    if not source.stacked:
        return quantize(source.read(refs, index, np.dtype(np.float32)), dtype)
    shape = tuple(len(range(*s.indices(n))) for s, n in zip(index, source.target_shape(), strict=True))
    values, scale = np.empty(shape, dtype), np.empty(scale_dims(shape), SCALE_DTYPE)
    for j, layer in enumerate(range(len(source.names))[index[0]]):
        w = source.read(refs, (slice(layer, layer + 1), *index[1:]), np.dtype(np.float32))
        layer_values, layer_scale = quantize(w[0], dtype)
        values[j], scale[j] = layer_values, layer_scale
    return values, scale


def _read_scaled(
    source: LeafSource, refs: Mapping[str, Ref], index: Index, dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray] | None:
    """``(values, scale)`` of an fp8-scaled checkpoint's kernel stored in ``dtype`` already, taken as
    it is (its 8-bit values and its scales, per tensor or per output channel): None otherwise."""
    stored = [refs[name] for name in source.names]
    if not all(isinstance(r, ScaledRef) and r.values.dtype == dtype for r in stored):
        return None
    values = source.read({r.name: r.values for r in stored}, index, dtype)  # type: ignore[union-attr]
    channels = index[-1]  # the kernel's output axis is the stored weight's first
    if not source.stacked:
        return values, stored[0].channel_scale(channels)  # type: ignore[union-attr]
    layers = range(len(stored))[index[0]]
    return values, np.stack([stored[layer].channel_scale(channels) for layer in layers])  # type: ignore[union-attr]


# ----------------------------------------------------------------------------------------------
# Building quantised leaves


def scale_sharding(kernel: jax.sharding.Sharding, ndim: int) -> jax.sharding.Sharding:
    """The sharding of a kernel's scale: the kernel's (``ndim`` dimensions) without its input axis,
    so each device holds the scales of the output channels it holds, memory kind kept."""
    if isinstance(kernel, SingleDeviceSharding):
        return kernel
    if isinstance(kernel, NamedSharding):
        spec = (*kernel.spec, *(None,) * (ndim - len(kernel.spec)))
        return NamedSharding(kernel.mesh, PartitionSpec(*scale_dims(spec)), memory_kind=kernel.memory_kind)
    raise ValueError(f"cannot derive a scale's sharding from {type(kernel).__name__}; use a NamedSharding")


def quantized_leaf(
    source: LeafSource, refs: Mapping[str, Ref], qdtype: np.dtype, dtype: np.dtype, sharding: ShardingFn
) -> QuantizedKernel:
    """A quantisable leaf built as a :class:`QuantizedKernel` (``qdtype`` values, standing for
    ``dtype``): each addressable shard is read and quantised on the host from the output channels it
    holds (every input row of them, once per distinct set of channels however the input axis is
    split), then placed; the scale follows the output axis (:func:`scale_sharding`)."""
    shape = source.target_shape()
    kernel_sharding = sharding(source)
    in_axis = len(shape) + INPUT_AXIS
    blocks: dict[tuple[tuple[int, int, int], ...], tuple[np.ndarray, np.ndarray]] = {}

    def block(index: Index) -> tuple[np.ndarray, np.ndarray]:
        """The quantised channels ``index`` selects, every input row of them."""
        whole = (*index[:in_axis], slice(None), *index[in_axis + 1 :])
        key = tuple(s.indices(n) for s, n in zip(whole, shape, strict=True))
        if key not in blocks:
            blocks[key] = read_quantized(source, refs, whole, qdtype)
        return blocks[key]

    def values(index: Index) -> np.ndarray:
        rows = (slice(None),) * in_axis + (index[in_axis],)
        return block(index)[0][rows]

    def scale(index: Index) -> np.ndarray:
        return block((*index[:in_axis], slice(None), *index[in_axis:]))[1]

    return QuantizedKernel(
        jax.make_array_from_callback(shape, kernel_sharding, values),
        jax.make_array_from_callback(scale_shape(source), scale_sharding(kernel_sharding, len(shape)), scale),
        dtype,
    )


def leaf_builder(weights: str) -> LeafBuilder:
    """The :data:`~wanjax.io.checkpoint.LeafBuilder` of ``--weights_dtype weights``: ``bf16`` builds
    every leaf in the model dtype (:func:`~wanjax.io.checkpoint.build_leaf`); ``int8`` and ``fp8``
    build quantisable leaves as :class:`QuantizedKernel` and the others as ``bf16`` does; ``gguf`` keeps
    a GGUF file's quantised kernels as :class:`~wanjax.io.gguf_kernel.GGUFKernel`."""
    if weights == KEPT_GGUF:
        return build_kept
    qdtype = weights_dtype(weights)
    if qdtype is None:
        return build_leaf

    def build(source: LeafSource, refs: Mapping[str, Ref], dtype: np.dtype, sharding: ShardingFn) -> Any:
        if not is_quantizable(source):
            return build_leaf(source, refs, dtype, sharding)
        return quantized_leaf(source, refs, qdtype, leaf_dtype(source, dtype), sharding)

    return build


def abstract_quantized_params(spec: Any, dtype: Any, weights: str, sharding: ShardingFn | None = None) -> Any:
    """:func:`~wanjax.io.checkpoint.abstract_params` as :func:`leaf_builder` ``(weights)`` would load
    the tree: each quantisable leaf a :class:`QuantizedKernel` of ``jax.ShapeDtypeStruct``."""
    tree = abstract_params(spec, dtype, sharding)
    qdtype = weights_dtype(weights)
    if qdtype is None:
        return tree

    def leaf(source: LeafSource, kernel: jax.ShapeDtypeStruct) -> Any:
        if not is_quantizable(source):
            return kernel
        placed = None if kernel.sharding is None else scale_sharding(kernel.sharding, len(kernel.shape))
        return QuantizedKernel(
            jax.ShapeDtypeStruct(kernel.shape, qdtype, sharding=kernel.sharding),
            jax.ShapeDtypeStruct(scale_shape(source), SCALE_DTYPE, sharding=placed),
            np.dtype(kernel.dtype),
        )

    return jax.tree.map(leaf, spec, tree, is_leaf=lambda x: isinstance(x, LeafSource))
