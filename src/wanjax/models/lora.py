"""LoRA adapters merged into a model's (possibly sharded) weights, as diffusers' ``fuse_lora`` merges them.

A LoRA file (:func:`wanjax.io.lora.read_lora`) holds per-module updates under diffusers' module names
(``blocks.0.attn1.to_q``). The model's component description (its ``checkpoint_spec``: each params
leaf with the checkpoint tensor names it is built from and their layout) says which leaf, and which
layer of a stacked leaf, a module's ``weight`` / ``bias`` became; nothing else is looked up.

Merged weight = ``base + sum_i w_i * scale_i * B_i @ A_i`` (``w_i``: the adapter weight the user
gives, ``scale_i``: PEFT's ``alpha / rank`` as the file says), bias = ``base + sum_i w_i * scale_i *
diff_b_i``, computed in float32 and cast to the leaf's dtype. The merge runs on the devices inside
one program per leaf whose output keeps the leaf's sharding, so each device computes only its own
slice of ``B @ A`` from the (small, replicated) factors: no device or host ever holds a whole merged
14B layer it does not own. Leaves in host memory (offload) are merged on the device and moved back.
A kernel kept as GGUF blocks (``--weights_dtype gguf``) takes the factors unmerged
(:class:`~wanjax.io.gguf_kernel.GGUFKernel`: added where the kernel is dequantised, the same sum).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from wanjax.errors import CheckpointError, ConfigError
from wanjax.io.checkpoint import LeafSource, Transpose, identity
from wanjax.io.gguf_kernel import GGUFKernel
from wanjax.io.lora import LoraFile, LoraUpdate, read_lora
from wanjax.io.quant import QuantizedKernel, quantize
from wanjax.models.offload import DEVICE, memory_kind

Params = Any
LoraSpec = tuple[str | Path | LoraFile, float]  # a file (or one read already) and its adapter weight
Path_ = tuple[Any, ...]  # a params leaf's key path


@dataclasses.dataclass(frozen=True)
class Target:
    """Where a checkpoint tensor went: the params leaf (key path), its source, and its layer."""

    path: Path_
    source: LeafSource
    layer: int | None  # None: not stacked


def tensor_index(spec: Any) -> dict[str, Target]:
    """Checkpoint tensor name -> the leaf (and layer) built from it, for every leaf of ``spec``."""
    index = {}
    leaves = jax.tree_util.tree_flatten_with_path(spec, is_leaf=lambda x: isinstance(x, LeafSource))[0]
    for path, source in leaves:
        for layer, name in enumerate(source.names):
            index[name] = Target(path, source, layer if source.stacked else None)
    return index


@dataclasses.dataclass
class LeafUpdate:
    """Every adapter's terms for one leaf, stacked over its layers (or one, unstacked): the factors
    concatenated along the rank axis with each adapter's weight and scale folded into ``up``."""

    source: LeafSource
    ups: list[np.ndarray] = dataclasses.field(default_factory=list)  # [layers, out, r_i] (or [out, r_i])
    downs: list[np.ndarray] = dataclasses.field(default_factory=list)  # [layers, r_i, in]
    bias: np.ndarray | None = None  # [layers, out] (or [out])


def load_loras(loras: Sequence[LoraSpec]) -> list[tuple[LoraFile, float]]:
    """Each ``(file, weight)`` read (:func:`~wanjax.io.lora.read_lora`); ConfigError for a weight that
    is not a finite number."""
    out = []
    for lora, weight in loras:
        if not np.isfinite(weight):
            raise ConfigError(f"LoRA weight {weight!r} for {lora} is not a finite number")
        out.append((lora if isinstance(lora, LoraFile) else read_lora(lora), float(weight)))
    return out


def plan_updates(spec: Any, loras: Sequence[tuple[LoraFile, float]]) -> dict[Path_, LeafUpdate]:
    """Group the adapters' updates by the params leaf they change (see :func:`tensor_index`).

    CheckpointError naming the first module of a file that matches no parameter of this model (a
    LoRA for another model) and how many of its modules did match, or a module whose factors do not
    fit its weight's shape."""
    index = tensor_index(spec)
    plan: dict[Path_, LeafUpdate] = {}
    for lora, weight in loras:
        unmatched = [module for module in lora.targets() if f"{module}.weight" not in index]
        if unmatched:
            raise CheckpointError(
                f"{lora.path}: LoRA module {unmatched[0]} matches no parameter of this model "
                f"({len(lora.updates) - len(unmatched)} of {len(lora.updates)} modules matched); is the LoRA "
                "for another model?"
            )
        per_leaf: dict[Path_, dict[int | None, Any]] = {}
        for module in lora.targets():
            update = lora.updates[module]
            weight_target, bias_target = index[f"{module}.weight"], index.get(f"{module}.bias")
            factors = _factors(update)
            if factors is not None:
                up, down = factors
                shape = (up.shape[0], down.shape[1])
                if shape != weight_target.source.shape:
                    raise CheckpointError(
                        f"{lora.path}: {module}: a LoRA update of shape {shape} for a weight of shape "
                        f"{weight_target.source.shape}; the LoRA is for another model size"
                    )
                _check_layout(weight_target.source, module)
                plan.setdefault(weight_target.path, LeafUpdate(weight_target.source))
                per_leaf.setdefault(weight_target.path, {})[weight_target.layer] = (
                    up * np.float32(weight * update.scale),
                    down,
                )
            bias = update.bias_delta()
            if bias is not None:
                if bias_target is None or bias.shape != bias_target.source.shape:
                    raise CheckpointError(
                        f"{lora.path}: {module}: a bias update for a module without that bias"
                    )
                leaf = plan.setdefault(bias_target.path, LeafUpdate(bias_target.source))
                _add_bias(leaf, bias_target.layer, bias * np.float32(weight))
        for path, layers in per_leaf.items():
            _add_factors(plan[path], layers)
    return plan


def _factors(update: LoraUpdate) -> tuple[np.ndarray, np.ndarray] | None:
    """``(up, down)`` whose product is the update's weight delta before its scale; a full delta
    (LightX2V's ``head.head.diff``) as itself times the identity, as diffusers loads it."""
    if update.diff is not None:
        return update.diff, np.eye(update.diff.shape[1], dtype=np.float32)
    if update.up is None:
        return None
    return update.up, update.down


def _check_layout(source: LeafSource, module: str) -> None:
    if source.layout is not identity and not isinstance(source.layout, Transpose):
        raise CheckpointError(f"LoRA on {module} is not supported (its weight is not a plain matrix here)")


def _add_factors(leaf: LeafUpdate, layers: dict[int | None, tuple[np.ndarray, np.ndarray]]) -> None:
    """One adapter's factors for a leaf, zero in the layers it does not touch."""
    rank = max(down.shape[0] for _, down in layers.values())
    out, inp = leaf.source.shape
    if not leaf.source.stacked:
        up, down = layers[None]
        leaf.ups.append(up)
        leaf.downs.append(down)
        return
    n = len(leaf.source.names)
    ups, downs = np.zeros((n, out, rank), np.float32), np.zeros((n, rank, inp), np.float32)
    for layer, (up, down) in layers.items():
        r = down.shape[0]
        ups[layer, :, :r], downs[layer, :r] = up, down
    leaf.ups.append(ups)
    leaf.downs.append(downs)


def _add_bias(leaf: LeafUpdate, layer: int | None, delta: np.ndarray) -> None:
    if leaf.bias is None:
        shape = (len(leaf.source.names), *delta.shape) if leaf.source.stacked else delta.shape
        leaf.bias = np.zeros(shape, np.float32)
    if layer is None:
        leaf.bias += delta
    else:
        leaf.bias[layer] += delta


@functools.partial(jax.jit, static_argnames=("transpose",))
def _merged(base: jax.Array, up: jax.Array, down: jax.Array, bias: jax.Array, transpose: bool) -> jax.Array:
    """``base + up @ down (+ bias)`` in float32 (per layer when stacked), in base's dtype."""
    delta = bias
    if up.shape[-1]:
        product = jnp.matmul(up, down, precision=jax.lax.Precision.HIGHEST)
        delta = delta + (jnp.swapaxes(product, -1, -2) if transpose else product)
    return (base.astype(jnp.float32) + delta).astype(base.dtype)


@functools.partial(jax.jit, static_argnames=("transpose", "qdtype"))
def _merged_quantized(
    values: jax.Array, scale: jax.Array, up: jax.Array, down: jax.Array, transpose: bool, qdtype: np.dtype
) -> tuple[jax.Array, jax.Array]:
    """An 8-bit kernel with ``up @ down`` merged: dequantised in float32, merged, requantised per
    output channel by :func:`~wanjax.io.quant.quantize`'s rule."""
    base = QuantizedKernel(values, scale, np.dtype(np.float32)).dequantize()
    merged = _merged(base, up, down, jnp.zeros((), jnp.float32), transpose)
    return quantize(merged, qdtype, xp=jnp)


def merge_quantized(base: QuantizedKernel, update: LeafUpdate) -> QuantizedKernel:
    """An 8-bit kernel with ``update`` merged (in float32, then requantised per output channel: the
    error is the 8-bit rounding of the merged weight, as if the merged model had been quantised),
    each output laid out as ``base``'s."""
    shardings = (base.values.sharding, base.scale.sharding)
    replicated = _replicated_like(shardings[0])
    up, down, _ = _factors_of(update, base.shape[:1] if update.source.stacked else ())
    values, scale = jax.jit(
        functools.partial(
            _merged_quantized,
            transpose=isinstance(update.source.layout, Transpose),
            qdtype=np.dtype(base.values.dtype),
        ),
        out_shardings=shardings,
    )(base.values, base.scale, jax.device_put(up, replicated), jax.device_put(down, replicated))
    return QuantizedKernel(values, scale, base.dtype)


def _factors_of(update: LeafUpdate, lead: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(up, down, bias)`` of every adapter of a leaf, concatenated along the rank axis (empty for a
    bias-only update; bias 0 when none)."""
    if update.ups:
        up = np.concatenate(update.ups, axis=-1)
        down = np.concatenate(update.downs, axis=-2)
    else:
        up, down = np.zeros((*lead, 0, 0), np.float32), np.zeros((*lead, 0, 0), np.float32)
    bias = update.bias if update.bias is not None else np.zeros((), np.float32)
    return up, down, bias


def with_factors(base: GGUFKernel, update: LeafUpdate) -> GGUFKernel:
    """A GGUF kernel with ``update``'s factors beside its own (concatenated along the rank), on every
    device of its blocks, in their memory kind."""
    up, down, _ = _factors_of(update, base.shape[:1] if update.source.stacked else ())
    if base.up is not None:
        up = np.concatenate([np.asarray(base.up), up], axis=-1)
        down = np.concatenate([np.asarray(base.down), down], axis=-2)
    replicated = _replicated_like(base.blocks.sharding).with_memory_kind(memory_kind(base.blocks))
    return dataclasses.replace(base, up=jax.device_put(up, replicated), down=jax.device_put(down, replicated))


def merge_leaf(base: jax.Array, update: LeafUpdate) -> jax.Array:
    """``base`` with ``update`` merged: computed on the devices ``base`` lives on, the output laid out
    as ``base`` (so each device computes only its own slice), back in ``base``'s memory kind."""
    if isinstance(base, QuantizedKernel):
        return merge_quantized(base, update)
    if isinstance(base, GGUFKernel):
        return with_factors(base, update)
    sharding = base.sharding
    on_device = sharding.with_memory_kind(DEVICE) if memory_kind(base) != DEVICE else sharding
    replicated = _replicated_like(sharding)
    up, down, bias = _factors_of(update, base.shape[:1] if update.source.stacked else ())
    merged = jax.jit(
        functools.partial(_merged, transpose=isinstance(update.source.layout, Transpose)),
        out_shardings=on_device,
    )(
        jax.device_put(base, on_device),
        jax.device_put(up, replicated),
        jax.device_put(down, replicated),
        jax.device_put(bias, on_device if bias.ndim else replicated),
    )
    return merged if on_device == sharding else jax.device_put(merged, sharding)


def _replicated_like(sharding: jax.sharding.Sharding) -> jax.sharding.Sharding:
    """Every device of ``sharding`` holding the whole array, in device memory."""
    if isinstance(sharding, jax.sharding.NamedSharding):
        return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(), memory_kind=DEVICE)
    return jax.sharding.SingleDeviceSharding(next(iter(sharding.device_set)), memory_kind=DEVICE)


def _replace(params: Params, new: dict[Path_, Any]) -> Params:
    """``params`` with the leaves at ``new``'s paths given by ``new[path](leaf)`` (an 8-bit kernel is
    one leaf here)."""
    if not new:
        return params
    leaves, treedef = jax.tree_util.tree_flatten_with_path(params, is_leaf=_is_kernel)
    return jax.tree_util.tree_unflatten(treedef, [new[p](leaf) if p in new else leaf for p, leaf in leaves])


def _is_kernel(x: Any) -> bool:
    return isinstance(x, QuantizedKernel | GGUFKernel)


def merge(params: Params, plan: dict[Path_, LeafUpdate]) -> Params:
    """``params`` with every leaf of ``plan`` merged (:func:`merge_leaf`); the other leaves as they are."""
    return _replace(params, {path: functools.partial(_merge_into, update=u) for path, u in plan.items()})


def _merge_into(leaf: jax.Array, update: LeafUpdate) -> jax.Array:
    return merge_leaf(leaf, update)


def restore(params: Params, base: dict[Path_, jax.Array]) -> Params:
    """``params`` with the leaves at ``base``'s paths put back to those arrays, placed where the
    current leaves are (same sharding and memory kind)."""
    return _replace(params, {path: functools.partial(_placed_as, b) for path, b in base.items()})


def _placed_as(array: Any, leaf: Any) -> Any:
    if isinstance(array, GGUFKernel):  # the blocks never change: the leaf's, with ``array``'s factors
        return dataclasses.replace(leaf, up=array.up, down=array.down)
    return jax.device_put(array, jax.tree.map(lambda x: x.sharding, leaf))


def leaves_at(params: Params, paths: Any) -> dict[Path_, Any]:
    """The leaves of ``params`` at ``paths`` (an 8-bit kernel is one leaf)."""
    leaves = dict(jax.tree_util.tree_flatten_with_path(params, is_leaf=_is_kernel)[0])
    return {path: leaves[path] for path in paths}


def set_key(loras: Sequence[LoraSpec]) -> tuple[tuple[str, float], ...]:
    """What identifies a set of adapters (read or not): each file and its weight, in order."""
    return tuple((str(f.path if isinstance(f, LoraFile) else Path(f)), float(w)) for f, w in loras)


class MergedCache:
    """The merged leaves of recently used LoRA sets, where the model keeps its weights, so that a
    set used again is put back without merging; the least recently used sets are dropped beyond
    ``budget`` bytes (a set larger than that is not kept)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._sets: collections.OrderedDict[Hashable, tuple[dict[Path_, Any], int]] = (
            collections.OrderedDict()
        )

    def get(self, key: Hashable) -> dict[Path_, Any] | None:
        if key not in self._sets:
            return None
        self._sets.move_to_end(key)
        return self._sets[key][0]

    def put(self, key: Hashable, leaves: dict[Path_, Any]) -> None:
        size = sum(x.nbytes for x in jax.tree.leaves(list(leaves.values())))
        if not leaves or size > self.budget:
            return
        self._sets[key] = (leaves, size)
        self._sets.move_to_end(key)
        while sum(kept for _, kept in self._sets.values()) > self.budget:
            self._sets.popitem(last=False)

    def __len__(self) -> int:
        return len(self._sets)
