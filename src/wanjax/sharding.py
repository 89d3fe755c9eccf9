"""Device meshes, logical axis names and the rules that map them onto mesh axes.

A mesh has the named axes ``dp`` (data: the batch, i.e. the CFG pair), ``sp`` (sequence: video
tokens) and ``tp`` (tensor: attention heads and FFN columns), in the order written by the user
(default ``(dp, sp, tp)``, the order the reference measured fastest). Every parameter leaf has
logical axis names (``embed``, ``heads``, ``mlp``, ``vocab``, ``layers``); :data:`PARAM_RULES` maps
each to mesh axes, and a mesh axis is used on a dimension only when it divides it.

Meshes use ``AxisType.Auto``: the model code stays free of per-op sharding annotations, XLA's
partitioner propagates the weights' shardings, activations are pinned at block boundaries with
``with_sharding_constraint``, and attention runs under ``shard_map`` (see
:mod:`wanjax.parallel_attention`).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from collections.abc import Iterable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from wanjax.errors import WanjaxError

AXES = ("dp", "sp", "tp")

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


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    """Named axis sizes in device-mesh order, plus whether ``embed`` weights are FSDP-sharded."""

    axes: tuple[tuple[str, int], ...] = (("dp", 1), ("sp", 1), ("tp", 1))
    fsdp: bool = False

    @property
    def sizes(self) -> dict[str, int]:
        return dict(self.axes)

    @property
    def num_devices(self) -> int:
        return math.prod(size for _, size in self.axes)

    @property
    def flag(self) -> str:
        """As ``--mesh`` takes it: ``dp=2,sp=1,tp=4``."""
        return ",".join(f"{name}={size}" for name, size in self.axes)

    def __str__(self) -> str:
        return self.flag + (" (fsdp)" if self.fsdp else "")

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(dp, sp, tp)`` whatever the order."""
        return tuple(self.sizes[a] for a in AXES)  # type: ignore[return-value]


def parse_mesh(text: str, fsdp: bool = False) -> MeshSpec:
    """``"dp=2,sp=1,tp=4"`` (any order, which is the device order; missing axes are 1)."""
    usage = "write --mesh like dp=2,sp=1,tp=4 (axes dp, sp, tp) or auto"
    sizes: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, value = part.partition("=")
        name = name.strip()
        if not eq or name not in AXES or not value.strip().isdigit() or int(value) < 1:
            raise WanjaxError(f"bad --mesh entry {part!r}; {usage}")
        if name in sizes:
            raise WanjaxError(f"--mesh names {name} twice; {usage}")
        sizes[name] = int(value)
    if not sizes:
        raise WanjaxError(f"empty --mesh {text!r}; {usage}")
    order = list(sizes) + [a for a in AXES if a not in sizes]
    return MeshSpec(tuple((a, sizes.get(a, 1)) for a in order), fsdp)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def auto_mesh(num_devices: int, heads: int | None = None, batch: int = 2, fsdp: bool = False) -> MeshSpec:
    """dp=2 for the CFG pair when the devices are even, then the largest tp dividing the heads; the
    rest goes to sp (sequence parallelism works for any head count)."""
    dp = 2 if num_devices % 2 == 0 and batch % 2 == 0 else 1
    rest = num_devices // dp
    tp = max(d for d in _divisors(rest) if heads is None or heads % d == 0)
    return MeshSpec((("dp", dp), ("sp", rest // tp), ("tp", tp)), fsdp)


def mesh_spec_from_flags(
    mesh: str | None,
    num_devices: int,
    *,
    heads: int | None = None,
    use_dp: bool = False,
    sp_num: int | None = None,
    use_fsdp: bool = False,
) -> MeshSpec:
    """The mesh from ``--mesh`` (a spec or ``auto``) or the reference's flags: ``--use_dp`` (dp=2),
    ``--sp_num N`` (sp=N), the remaining devices on tp; ``--use_fsdp`` shards ``embed`` weights too."""
    if mesh is not None and (use_dp or sp_num):
        raise WanjaxError("give either --mesh or --use_dp/--sp_num, not both")
    if mesh is None and not (use_dp or sp_num):
        mesh = "auto"
    if mesh == "auto":
        spec = auto_mesh(num_devices, heads, fsdp=use_fsdp)
    elif mesh is not None:
        spec = parse_mesh(mesh, use_fsdp)
    else:
        dp, sp = (2 if use_dp else 1), (sp_num or 1)
        if num_devices % (dp * sp):
            raise WanjaxError(
                f"dp={dp} x sp={sp} does not divide the {num_devices} devices; choose --sp_num dividing "
                f"{num_devices // dp}"
            )
        spec = MeshSpec((("dp", dp), ("sp", sp), ("tp", num_devices // (dp * sp))), use_fsdp)
    check_device_count(spec, num_devices, heads)
    return spec


def check_device_count(spec: MeshSpec, num_devices: int, heads: int | None = None) -> None:
    """WanjaxError (suggesting a mesh) unless ``spec`` uses exactly ``num_devices`` devices."""
    if spec.num_devices != num_devices:
        raise WanjaxError(
            f"mesh {spec.flag} uses {spec.num_devices} devices but {num_devices} are available; make the "
            f"axis sizes multiply to {num_devices} (e.g. --mesh {auto_mesh(num_devices, heads).flag})"
        )


def make_mesh(spec: MeshSpec, devices: Sequence[Any] | None = None) -> Mesh:
    """A :class:`jax.sharding.Mesh` with ``spec``'s axes in its order (``AxisType.Auto``)."""
    devices = list(jax.devices() if devices is None else devices)
    if len(devices) != spec.num_devices:
        raise WanjaxError(f"mesh {spec} needs {spec.num_devices} devices, {len(devices)} given")
    names = tuple(name for name, _ in spec.axes)
    shape = tuple(size for _, size in spec.axes)
    return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(names), devices=devices)


# ----------------------------------------------------------------------------------------------
# Rules -> partition specs


def _mesh_sizes(mesh: Mesh) -> dict[str, int]:
    return dict(mesh.shape)


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
    """A ``sharding(path, shape)`` function for :func:`wanjax.checkpoint.load_params`."""
    sizes = _mesh_sizes(mesh)

    def sharding(path: tuple[str, ...], shape: tuple[int, ...]) -> NamedSharding:
        return NamedSharding(mesh, leaf_spec(table, path, shape, sizes, fsdp))

    return sharding


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


# ----------------------------------------------------------------------------------------------
# Activations


@dataclasses.dataclass(frozen=True)
class TokenLayout:
    """How ``(B, L, H, D)`` token activations are split: mesh axes for batch, sequence and heads.

    Mesh axes that divide none of them compute redundantly (replicated)."""

    batch: tuple[str, ...]
    seq: tuple[str, ...]
    heads: tuple[str, ...]

    @staticmethod
    def _entry(axes: tuple[str, ...]) -> Any:
        return None if not axes else axes[0] if len(axes) == 1 else axes

    def tokens(self) -> P:
        """``(B, L, D)``."""
        return P(self._entry(self.batch), self._entry(self.seq))

    def qkv(self, split_seq: bool = True) -> P:
        """``(B, L, H, D)``; keys of cross-attention keep their (short) sequence whole."""
        return P(
            self._entry(self.batch), self._entry(self.seq) if split_seq else None, self._entry(self.heads)
        )

    def context(self) -> P:
        """``(B, L_text, D)`` text context: split over the batch only."""
        return P(self._entry(self.batch))


def token_layout(sizes: dict[str, int], batch: int, length: int, heads: int) -> TokenLayout:
    """``dp`` on the batch (the CFG pair) when it divides it, ``tp`` on the heads when it divides them,
    then ``sp`` and every axis left over on the token sequence while the product divides ``length``."""
    dp, tp = sizes.get("dp", 1), sizes.get("tp", 1)
    batch_axes = ("dp",) if dp > 1 and batch % dp == 0 else ()
    head_axes = ("tp",) if tp > 1 and heads % tp == 0 else ()
    seq: list[str] = []
    for a in ("sp", "dp", "tp"):
        size = sizes.get(a, 1)
        if (
            size > 1
            and a not in batch_axes + head_axes
            and length % (math.prod(sizes[s] for s in seq) * size) == 0
        ):
            seq.append(a)
    return TokenLayout(batch_axes, tuple(seq), head_axes)


def constrain(x: jax.Array, mesh: Mesh | None, spec: P) -> jax.Array:
    """``with_sharding_constraint`` under ``mesh`` (identity without a mesh)."""
    return x if mesh is None else jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


# ----------------------------------------------------------------------------------------------
# Host <-> global arrays (single- and multi-process)


def to_global(x: Any, sharding: NamedSharding) -> jax.Array:
    """A global array with ``sharding`` from a value every process holds in full (host or local)."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return x if x.sharding == sharding else jax.device_put(x, sharding)
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def to_host(x: jax.Array) -> np.ndarray:
    """The full value of ``x`` on every process (gathered across hosts when needed)."""
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
        return np.asarray(x)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


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


def spatial_sharding(mesh: Mesh, shape: Sequence[int]) -> NamedSharding:
    """VAE activations ``(B, C, T, H, W)`` split over every device along W, then H, for the mesh axes
    that divide them (the batch stays whole: each device decodes a strip of every video)."""
    sizes = _mesh_sizes(mesh)
    width: list[str] = []
    height: list[str] = []
    for a in (a for a in mesh.axis_names if sizes[a] > 1):
        for dims, dim in ((width, shape[-1]), (height, shape[-2])):
            if dim % (math.prod(sizes[c] for c in dims) * sizes[a]) == 0:
                dims.append(a)
                break
    entry = TokenLayout._entry
    return NamedSharding(mesh, P(None, None, None, entry(tuple(height)), entry(tuple(width))))


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
