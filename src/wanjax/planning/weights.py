"""Bytes per device of a component's weights under the sharding rules (:mod:`wanjax.parallel.rules`),
in the run's dtypes, 8-bit (each quantisable leaf 1 byte per element plus a float32 scale per output
channel) or as a GGUF file's kept blocks; the layer stack apart, for what streams."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from wanjax.errors import WanjaxError
from wanjax.io.checkpoint import LeafSource, leaf_dtype, linear_kernel
from wanjax.io.gguf_kernel import blocks_shape, blocks_spec
from wanjax.io.quantizable import (
    KEPT_GGUF,
    SCALE_DTYPE,
    UNQUANTIZED,
    is_quantizable,
    scale_dims,
    weights_dtype,
)
from wanjax.models import dit
from wanjax.models.config import TransformerConfig
from wanjax.models.dit_context import CONTEXT_KV_WEIGHTS
from wanjax.parallel.rules import leaf_spec, num_shards

__all__ = [
    "ANIMATE_LEAVES",
    "VACE_LEAVES",
    "WeightBytes",
    "copied_stack_bytes",
    "transformer_bytes",
    "weight_bytes",
]


@dataclasses.dataclass(frozen=True)
class WeightBytes:
    """Bytes per device of one component's weights: the leaves outside the layer stack, and one layer
    of the stacked leaves (whose layer axis is never sharded)."""

    fixed: int
    layer: int
    num_layers: int
    dequantized_layer: int = 0  # one layer's quantised kernels in the model dtype (0 if not quantised)
    kernels_16bit_layer: int = 0  # one layer's stacked matmul kernels stored in 16 bits

    @property
    def kernels_16bit(self) -> int:
        """Every layer's stacked 16-bit matmul kernels (what a v7x step copies:
        :attr:`~wanjax.target.Target.copies_16bit_stacks`)."""
        return self.kernels_16bit_layer * self.num_layers

    @property
    def stacked(self) -> int:
        return self.layer * self.num_layers

    @property
    def total(self) -> int:
        return self.fixed + self.stacked


def weight_bytes(
    spec: Any,
    dtype: Any,
    sizes: dict[str, int],
    fsdp: bool = False,
    weights: str = UNQUANTIZED,
    kept: Mapping[str, str] | None = None,
) -> WeightBytes:
    """Per-device bytes of a LeafSource tree loaded in ``dtype`` under ``sizes``, with ``weights``
    (``--weights_dtype``) 8-bit: each :func:`~wanjax.io.quantizable.is_quantizable` leaf as 1 byte per
    element plus a float32 scale per output channel, split as the kernel's output axis is; ``gguf``:
    the leaves of ``kept`` (key path -> GGUF type, :func:`wanjax.pipeline.sources.kept_gguf_types`)
    as their blocks, split as :func:`~wanjax.io.gguf_kernel.blocks_spec` splits them."""
    quantized = weights_dtype(weights)
    kept = (kept or {}) if weights == KEPT_GGUF else {}
    dtype = np.dtype(dtype)
    fixed = layer = dequantized = kernels_16bit = 0
    num_layers = 0
    leaves = jax.tree_util.tree_flatten_with_path(spec, is_leaf=lambda x: isinstance(x, LeafSource))[0]
    for key, source in leaves:
        qtype = kept.get(jax.tree_util.keystr(key))
        shape = source.target_shape()
        entries = tuple(leaf_spec(source, sizes, fsdp))
        entries += (None,) * (len(shape) - len(entries))
        if source.stacked:  # one layer: the layer axis is never split
            if entries[0] is not None:
                raise WanjaxError(f"{source.names[0]}: a stacked leaf split over its layers")
            if num_layers not in (0, len(source.names)):
                raise WanjaxError(
                    f"{source.names[0]}: stacked leaves of {num_layers} and {len(source.names)} layers"
                )
            num_layers = len(source.names)
            shape, entries = shape[1:], entries[1:]
        stored = quantized if quantized is not None and is_quantizable(source) else None
        if qtype is not None:
            blocks = blocks_spec(entries, shape, qtype, sizes)
            nbytes = _shard_bytes(blocks_shape(shape, qtype), blocks, np.dtype(np.uint8), sizes)
        elif stored is not None:
            nbytes = _shard_bytes(shape, entries, stored, sizes)
            nbytes += _shard_bytes(scale_dims(shape), scale_dims(entries), SCALE_DTYPE, sizes)
        else:
            nbytes = _shard_bytes(shape, entries, leaf_dtype(source, dtype), sizes)
        if source.stacked and (qtype or stored) is not None:  # one layer dequantised for its matmuls
            dequantized += _shard_bytes(shape, entries, dtype, sizes)
        if source.stacked and source.layout == linear_kernel:  # streamed (offload.streamed)
            layer += nbytes
            if (qtype or stored) is None and leaf_dtype(source, dtype).itemsize == 2:
                kernels_16bit += nbytes
        else:  # the rest stays on the device, streaming or not, stacked norms and biases included
            fixed += nbytes * (len(source.names) if source.stacked else 1)
    return WeightBytes(fixed, layer, num_layers, dequantized, kernels_16bit)


VACE_LEAVES = ("vace_patch_embedding", "vace_proj_in", "vace_blocks")
# Animate's leaves (the face adapters: a stack of their own, of a layer every k blocks)
ANIMATE_LEAVES = ("pose_patch_embedding", "motion_encoder", "face_encoder", "face_adapter")


def transformer_bytes(cfg: TransformerConfig, *args: Any, **kwargs: Any) -> WeightBytes:
    """:func:`weight_bytes` (with its other arguments) of a transformer: a VACE model's control blocks
    and an Animate model's face adapters (their own stacks, never streamed) count with the weights
    that stay on the device."""
    spec = dit.checkpoint_spec(cfg)
    control = {name: spec.pop(name) for name in (*VACE_LEAVES, *ANIMATE_LEAVES) if name in spec}
    found = weight_bytes(spec, *args, **kwargs)
    if not control:
        return found
    return dataclasses.replace(found, fixed=found.fixed + weight_bytes(control, *args, **kwargs).total)


def copied_stack_bytes(
    cfg: TransformerConfig,
    dtype: Any,
    sizes: dict[str, int],
    fsdp: bool,
    weights: str,
    kept: Mapping[str, str] | None,
    context_cached: bool,
) -> int:
    """The stacked 16-bit matmul kernels a v7x step copies (:attr:`~wanjax.target.Target.copies_16bit_stacks`):
    those the step reads, so not the cross-attention's context projections when the text K/V cache
    holds their keys and values (measured: 8 of the 14B's 10 kernels a layer, 1.39 GiB per 10 layers
    on dp=2,tp=4)."""
    spec = dit.checkpoint_spec(cfg)
    for name in (*VACE_LEAVES, *ANIMATE_LEAVES):
        spec.pop(name, None)
    if context_cached:
        spec["blocks"]["attn2"] = {
            k: v for k, v in spec["blocks"]["attn2"].items() if k not in CONTEXT_KV_WEIGHTS
        }
    return weight_bytes(spec, dtype, sizes, fsdp, weights, kept).kernels_16bit


def _shard_bytes(
    shape: tuple[int, ...], entries: tuple[Any, ...], dtype: np.dtype, sizes: dict[str, int]
) -> int:
    return (
        math.prod(shape) * np.dtype(dtype).itemsize // num_shards(jax.sharding.PartitionSpec(*entries), sizes)
    )
