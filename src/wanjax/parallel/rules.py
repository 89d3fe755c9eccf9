"""The rules that map parameters' logical axes onto mesh axes.

Every parameter leaf declares logical axis names (``embed``, ``heads``, ``mlp``, ``vocab``,
``layers``) on its :class:`~wanjax.io.checkpoint.LeafSource`; :data:`PARAM_RULES` maps each to mesh
axes (``dp``, ``sp``, ``tp``; see :mod:`wanjax.parallel.mesh`), and a mesh axis is used on a
dimension only when it divides it.

Meshes use ``AxisType.Auto``: the model code stays free of per-op sharding annotations, XLA's
partitioner propagates the weights' shardings, activations are pinned at block boundaries with
``with_sharding_constraint``, and attention runs under ``shard_map`` (see
:mod:`wanjax.parallel.attention`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from wanjax.io.checkpoint import LeafSource, ShardingFn, leaf_dtype, path_name

# Logical axis -> mesh axes, tried in order. "fsdp" stands for every mesh axis other than tp, and
# is used only when FSDP is on.
PARAM_RULES: dict[str, tuple[str, ...]] = {
    "layers": (),
    "embed": ("fsdp",),
    "heads": ("tp",),
    "mlp": ("tp",),
    "vocab": ("tp",),
    "embed_tp": ("tp",),  # the model dim of an embedding table whose vocabulary tp does not divide
}


def num_shards(spec: P, sizes: dict[str, int]) -> int:
    """How many pieces ``spec`` cuts an array into."""
    names = [n for e in spec if e is not None for n in ((e,) if isinstance(e, str) else e)]
    return math.prod(sizes[n] for n in names)


def leaf_spec(source: LeafSource, sizes: dict[str, int], fsdp: bool) -> P:
    """The PartitionSpec of one parameter leaf: its best-splitting candidate axes (the first on ties)."""
    shape = source.target_shape()
    specs = [partition_spec(axes, shape, sizes, fsdp) for axes in source.candidate_axes]
    return max(specs, key=lambda spec: num_shards(spec, sizes))


def partition_spec(
    axes: Sequence[str | None],
    shape: Sequence[int],
    sizes: dict[str, int],
    fsdp: bool = False,
    rules: dict[str, tuple[str, ...]] = PARAM_RULES,
) -> P:
    """The PartitionSpec for logical ``axes`` of ``shape``: each logical axis takes the mesh axes its
    rule lists (size > 1, not used by another dimension) while their product divides the dimension."""

    def expand(rule: str) -> list[str]:
        return ([a for a in sizes if a != "tp"] if fsdp else []) if rule == "fsdp" else [rule]

    used: set[str] = set()
    entries: list[Any] = []
    for name, dim in zip(axes, shape, strict=True):
        chosen: list[str] = []
        for a in (a for rule in (rules.get(name, ()) if name else ()) for a in expand(rule)):
            size = sizes.get(a, 1)
            if size > 1 and a not in used and dim % (math.prod(sizes[c] for c in chosen) * size) == 0:
                chosen.append(a)
        used.update(chosen)
        entries.append(None if not chosen else chosen[0] if len(chosen) == 1 else tuple(chosen))
    while entries and entries[-1] is None:
        entries.pop()
    return P(*entries)


def param_sharding(mesh: Mesh, fsdp: bool = False) -> ShardingFn:
    """A ``sharding(source)`` function for :func:`wanjax.io.checkpoint.load_params`."""
    sizes = dict(mesh.shape)

    def sharding(source: LeafSource) -> NamedSharding:
        return NamedSharding(mesh, leaf_spec(source, sizes, fsdp))

    return sharding


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


# ----------------------------------------------------------------------------------------------
# Activations


# ----------------------------------------------------------------------------------------------
# Host <-> global arrays (single- and multi-process)


def sharded_bytes(tree: Any) -> dict[Any, int]:
    """Bytes each device holds of ``tree``'s arrays."""
    out: dict[Any, int] = {}
    for leaf in jax.tree.leaves(tree):
        for shard in leaf.addressable_shards:
            out[shard.device] = out.get(shard.device, 0) + shard.data.nbytes
    return out


def describe(tree: Any) -> Iterable[tuple[str, tuple[int, ...], P]]:
    """``(path, shape, spec)`` for every leaf of a sharded params tree."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        yield path_name(path), tuple(leaf.shape), getattr(leaf.sharding, "spec", P())


def per_device_param_bytes(
    spec: Any,
    dtype: Any,
    sizes: dict[str, int],
    fsdp: bool = False,
    where: Callable[[LeafSource], bool] | None = None,
) -> tuple[int, int]:
    """``(bytes per device, bytes of replicated leaves)`` of a LeafSource tree loaded in ``dtype`` under
    ``sizes``; no devices or weights needed. ``where``: count only the leaves it accepts (e.g. those
    in device memory under an offload mode: ``lambda s: not wanjax.models.offload.streamed(s, mode)``)."""
    total = replicated_bytes = 0
    for source in jax.tree.leaves(spec, is_leaf=lambda x: isinstance(x, LeafSource)):
        if where is not None and not where(source):
            continue
        nbytes = math.prod(source.target_shape()) * leaf_dtype(source, np.dtype(dtype)).itemsize
        shards = num_shards(leaf_spec(source, sizes, fsdp), sizes)
        total += nbytes // shards
        replicated_bytes += nbytes if shards == 1 else 0
    return total, replicated_bytes
