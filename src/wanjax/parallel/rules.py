"""Device meshes, logical axis names and the rules that map them onto mesh axes.

A mesh has the named axes ``dp`` (data: the batch, i.e. the CFG pair), ``sp`` (sequence: video
tokens) and ``tp`` (tensor: attention heads and FFN columns), in the order written by the user
(default ``(dp, sp, tp)``, the order the reference measured fastest). Every parameter leaf has
logical axis names (``embed``, ``heads``, ``mlp``, ``vocab``, ``layers``); :data:`PARAM_RULES` maps
each to mesh axes, and a mesh axis is used on a dimension only when it divides it.

Meshes use ``AxisType.Auto``: the model code stays free of per-op sharding annotations, XLA's
partitioner propagates the weights' shardings, activations are pinned at block boundaries with
``with_sharding_constraint``, and attention runs under ``shard_map`` (see
:mod:`wanjax.parallel.attention`).
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

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

# Parameter logical axes by path pattern ("/"-joined keys, fnmatch). A path may match several rows:
# the one splitting the leaf over the most devices wins. Unmatched leaves are replicated.
DIT_PARAM_AXES: tuple[tuple[str, tuple[str | None, ...]], ...] = (
    ("blocks/attn?/to_[qkv]/kernel", ("layers", "embed", "heads")),
    ("blocks/attn?/to_[qkv]/bias", ("layers", "heads")),
    ("blocks/attn?/norm_[qk]/scale", ("layers", "heads")),
    ("blocks/attn?/to_out/kernel", ("layers", "heads", "embed")),
    ("blocks/attn?/to_out/bias", ("layers", "embed")),
    ("blocks/ffn/proj_in/kernel", ("layers", "embed", "mlp")),
    ("blocks/ffn/proj_in/bias", ("layers", "mlp")),
    ("blocks/ffn/proj_out/kernel", ("layers", "mlp", "embed")),
    ("blocks/ffn/proj_out/bias", ("layers", "embed")),
    ("blocks/scale_shift_table", ("layers", None, "embed")),
    ("blocks/norm2/*", ("layers", "embed")),
    ("time_embedder/linear_1/kernel", (None, "mlp")),
    ("time_embedder/linear_1/bias", ("mlp",)),
    ("time_embedder/linear_2/kernel", ("mlp", "embed")),
    ("time_proj/kernel", ("embed", "mlp")),
    ("time_proj/bias", ("mlp",)),
    ("text_embedder/linear_1/kernel", (None, "mlp")),
    ("text_embedder/linear_1/bias", ("mlp",)),
    ("text_embedder/linear_2/kernel", ("mlp", "embed")),
    ("patch_embedding/kernel", (None, "embed")),
    ("proj_out/kernel", ("embed", None)),
)

UMT5_PARAM_AXES: tuple[tuple[str, tuple[str | None, ...]], ...] = (
    ("embedding", ("vocab", "embed")),
    ("embedding", (None, "embed_tp")),
    ("layers/[qkv]/kernel", ("layers", "embed", "heads")),
    ("layers/o/kernel", ("layers", "heads", "embed")),
    ("layers/wi_[01]/kernel", ("layers", "embed", "mlp")),
    ("layers/wo/kernel", ("layers", "mlp", "embed")),
    ("layers/*_norm/scale", ("layers", "embed")),
)


AxesTable = Sequence[tuple[str, tuple[str | None, ...]]]


def logical_axes(table: AxesTable, path: Sequence[str], ndim: int) -> list[tuple[str | None, ...]]:
    """The candidate logical axis names of the leaf at ``path`` (``[(None,) * ndim]``: replicated)."""
    key = "/".join(path)
    found = [axes for pattern, axes in table if fnmatch.fnmatchcase(key, pattern)]
    for axes in found:
        if len(axes) != ndim:
            raise ValueError(f"{key}: rule {axes} has {len(axes)} axes, the leaf {ndim}")
    return found or [(None,) * ndim]


def num_shards(spec: P, sizes: dict[str, int]) -> int:
    """How many pieces ``spec`` cuts an array into."""
    names = [n for e in spec if e is not None for n in ((e,) if isinstance(e, str) else e)]
    return math.prod(sizes[n] for n in names)


def leaf_spec(
    table: AxesTable, path: Sequence[str], shape: Sequence[int], sizes: dict[str, int], fsdp: bool
) -> P:
    """The PartitionSpec of one parameter leaf: its best-splitting candidate row."""
    specs = [partition_spec(axes, shape, sizes, fsdp) for axes in logical_axes(table, path, len(shape))]
    return max(specs, key=lambda spec: num_shards(spec, sizes))  # first of the best on ties


# ----------------------------------------------------------------------------------------------
# Mesh specification


# ----------------------------------------------------------------------------------------------
# Rules -> partition specs


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


def param_sharding(mesh: Mesh, table: AxesTable, fsdp: bool = False):
    """A ``sharding(path, shape)`` function for :func:`wanjax.io.checkpoint.load_params`."""
    sizes = dict(mesh.shape)

    def sharding(path: tuple[str, ...], shape: tuple[int, ...]) -> NamedSharding:
        return NamedSharding(mesh, leaf_spec(table, path, shape, sizes, fsdp))

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
        keys = "/".join(str(getattr(k, "key", k)) for k in path)
        yield keys, tuple(leaf.shape), getattr(leaf.sharding, "spec", P())


def per_device_param_bytes(
    abstract: Any, table: AxesTable, sizes: dict[str, int], fsdp: bool = False
) -> tuple[int, int]:
    """``(bytes per device, bytes of replicated leaves)`` of an abstract params tree under ``sizes``;
    no devices or weights needed."""
    total = replicated_bytes = 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(abstract)[0]:
        keys = tuple(str(getattr(k, "key", k)) for k in path)
        nbytes = math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize
        shards = num_shards(leaf_spec(table, keys, leaf.shape, sizes, fsdp), sizes)
        total += nbytes // shards
        replicated_bytes += nbytes if shards == 1 else 0
    return total, replicated_bytes
