"""GGUF-quantised matmul kernels kept on the devices as the file stores them (``--weights_dtype gguf``).

A :class:`GGUFKernel` holds a kernel's GGUF blocks, ``(..., out, n_blocks, block_bytes)`` uint8 in the
stored tensor's order (PyTorch ``(out, in)``, blocks along ``in``), and dequantises them where the
matmul reads them (:mod:`wanjax.io.gguf_blocks`, exact), inside the layer's program: a stacked
kernel is dequantised one layer at a time as the scan reaches it, so the device holds the file's
bytes (a Q4_K 14B transformer: 7.5 GiB, by ``plan``) and one layer's kernels in the model dtype.

A LoRA rides along unmerged: ``up (..., out, r)`` and ``down (..., r, in)`` (every adapter of the
leaf concatenated along ``r``, each scaled) are added to the dequantised float32 weight before it is
rounded to the model dtype, which is what merging into the dequantised weight gives, without a
quantiser for GGUF's types.

Which leaves are kept: a matmul kernel (layout :data:`~wanjax.io.checkpoint.linear_kernel`, those kept
in float32 too) whose tensors are all stored in one quantised GGUF type; any other leaf (float tensors, another file's, a
stacked leaf whose layers differ in type) is read in the model dtype. Sharding follows the kernel's:
the output axis as the kernel's, the input axis over whole blocks where the blocks divide evenly
(else over the output axis, where that is free and divides; :func:`blocks_spec`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from wanjax.io.checkpoint import (
    Index,
    LeafSource,
    Ref,
    ShardingFn,
    abstract_params,
    build_leaf,
    leaf_dtype,
    linear_kernel,
)
from wanjax.io.gguf_blocks import DEQUANTIZERS, block_shape, dequantize
from wanjax.io.gguf_file import GGUFRef


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class GGUFKernel:
    """A matmul kernel ``(..., in, out)`` stored as GGUF blocks of ``qtype``, standing for ``dtype``;
    ``up``/``down``: an unmerged LoRA's factors (None without one); ``w8a8`` (static): the matmul
    requantises it to int8 and multiplies int8 x int8 (:mod:`wanjax.models.w8a8`)."""

    blocks: Any
    qtype: str = dataclasses.field(metadata={"static": True})
    dtype: np.dtype = dataclasses.field(metadata={"static": True})
    up: Any = None
    down: Any = None
    w8a8: bool = dataclasses.field(default=False, metadata={"static": True})

    @property
    def shape(self) -> tuple[int, ...]:
        *lead, out, n, _ = self.blocks.shape
        return (*lead, n * block_shape(self.qtype)[0], out)

    def dequantize(self, dtype: Any = None) -> jax.Array:
        """The kernel ``(..., in, out)`` in ``dtype`` (default :attr:`dtype`; the LoRA added in
        float32), rounded once."""
        w = dequantize(self.blocks, self.qtype)
        if self.up is not None:
            w = w + jnp.matmul(self.up, self.down, precision=jax.lax.Precision.HIGHEST)
        return jnp.swapaxes(w, -1, -2).astype(dtype or self.dtype)


def stored_type(source: LeafSource, refs: Mapping[str, Ref]) -> str | None:
    """The GGUF type a leaf is kept in under ``--weights_dtype gguf``, or None (read in the model dtype)."""
    if source.layout != linear_kernel:  # keep_fp32 kernels too: their blocks, dequantised to float32
        return None
    stored = [refs[name] for name in source.names]
    if not all(isinstance(r, GGUFRef) for r in stored):
        return None
    types = {r.quant_type for r in stored}  # type: ignore[union-attr]
    if len(types) != 1 or next(iter(types)) not in DEQUANTIZERS:
        return None
    return next(iter(types))


def blocks_shape(kernel_shape: tuple[int, ...], qtype: str) -> tuple[int, ...]:
    """A kernel's ``(..., in, out)`` shape as its blocks' ``(..., out, n_blocks, block_bytes)``."""
    *lead, inp, out = kernel_shape
    block, size = block_shape(qtype)
    if inp % block:
        raise ValueError(f"an input axis of {inp} is not whole {qtype} blocks of {block}")
    return (*lead, out, inp // block, size)


def blocks_spec(
    kernel_spec: tuple[Any, ...], kernel_shape: tuple[int, ...], qtype: str, sizes: Mapping[str, int]
) -> tuple[Any, ...]:
    """The blocks' PartitionSpec entries from the kernel's (padded to its rank): the output axis's as
    they are, the input axis's on the blocks axis where the blocks divide over it; where they do not
    (a K-quant row of 54 blocks over 4 devices), on the output axis if that is unsplit and divides,
    else unsplit. The matmul's program moves a dequantised layer to the kernel's own split."""
    *lead, inp, out = kernel_spec
    *_, n_out, n_blocks, _ = blocks_shape(kernel_shape, qtype)
    if inp is not None and n_blocks % _devices(inp, sizes):
        inp, out = None, (inp if out is None and n_out % _devices(inp, sizes) == 0 else out)
    return (*lead, out, inp, None)


def _devices(entry: Any, sizes: Mapping[str, int]) -> int:
    """How many devices a PartitionSpec entry (a mesh axis name or a tuple of them) splits over."""
    return int(np.prod([sizes[n] for n in (entry if isinstance(entry, tuple) else (entry,))]))


def blocks_sharding(
    kernel: jax.sharding.Sharding, kernel_shape: tuple[int, ...], qtype: str
) -> jax.sharding.Sharding:
    """:func:`blocks_spec` as a sharding (a single device's as it is)."""
    if not isinstance(kernel, NamedSharding):
        return kernel
    spec = (*kernel.spec, *(None,) * (len(kernel_shape) - len(kernel.spec)))
    entries = blocks_spec(spec, kernel_shape, qtype, dict(kernel.mesh.shape))
    return NamedSharding(kernel.mesh, PartitionSpec(*entries), memory_kind=kernel.memory_kind)


def gguf_leaf(
    source: LeafSource, refs: Mapping[str, Ref], qtype: str, dtype: np.dtype, sharding: ShardingFn
) -> GGUFKernel:
    """A leaf built as a :class:`GGUFKernel`: each addressable shard copied from the file's blocks."""
    shape = blocks_shape(source.target_shape(), qtype)
    placed = blocks_sharding(sharding(source), source.target_shape(), qtype)
    stored: list[GGUFRef] = [refs[name] for name in source.names]  # type: ignore[misc]

    def tensor_blocks(ref: GGUFRef, index: Index) -> np.ndarray:
        return np.array(ref.data.reshape(shape[-3:])[index])

    def shard(index: Index) -> np.ndarray:
        if not source.stacked:
            return tensor_blocks(stored[0], index)
        layers = range(len(stored))[index[0]]
        return np.stack([tensor_blocks(stored[i], index[1:]) for i in layers])

    return GGUFKernel(jax.make_array_from_callback(shape, placed, shard), qtype=qtype, dtype=dtype)


def build_kept(source: LeafSource, refs: Mapping[str, Ref], dtype: np.dtype, sharding: ShardingFn) -> Any:
    """The :data:`~wanjax.io.checkpoint.LeafBuilder` of ``--weights_dtype gguf``."""
    qtype = stored_type(source, refs)
    if qtype is None:
        return build_leaf(source, refs, dtype, sharding)
    return gguf_leaf(source, refs, qtype, leaf_dtype(source, dtype), sharding)


def abstract_kept(spec: Any, dtype: Any, kept: Mapping[str, str], sharding: ShardingFn | None = None) -> Any:
    """:func:`~wanjax.io.checkpoint.abstract_params` as :func:`build_kept` would load the tree: the
    leaves of ``kept`` (key path -> GGUF type, :func:`wanjax.pipeline.sources.kept_gguf_types`) as
    :class:`GGUFKernel` of ``jax.ShapeDtypeStruct`` blocks, placed as :func:`gguf_leaf` places them."""
    tree = abstract_params(spec, dtype, sharding)

    def leaf(key: Any, source: LeafSource, kernel: jax.ShapeDtypeStruct) -> Any:
        qtype = kept.get(jax.tree_util.keystr(key))
        if qtype is None:
            return kernel
        shape = source.target_shape()
        placed = None if kernel.sharding is None else blocks_sharding(kernel.sharding, shape, qtype)
        blocks = jax.ShapeDtypeStruct(blocks_shape(shape, qtype), np.uint8, sharding=placed)
        return GGUFKernel(blocks, qtype=qtype, dtype=np.dtype(kernel.dtype))

    return jax.tree_util.tree_map_with_path(leaf, spec, tree, is_leaf=lambda x: isinstance(x, LeafSource))
