"""Device meshes: the named axes ``dp``, ``sp``, ``tp`` and how the flags choose their sizes.

A mesh has the named axes ``dp`` (data: the batch, i.e. the CFG pair), ``sp`` (sequence: video
tokens) and ``tp`` (tensor: attention heads and FFN columns), in the order written by the user
(default ``(dp, sp, tp)``, the order the reference measured fastest). Any sizes whose product is the
device count run (see :mod:`wanjax.parallel.layouts` for an axis that cannot split its dimension).

Meshes use ``AxisType.Auto``: the model code stays free of per-op sharding annotations, XLA's
partitioner propagates the weights' shardings (:mod:`wanjax.parallel.rules`), activations are
pinned at block boundaries with ``with_sharding_constraint``, and attention runs under
``shard_map`` (see :mod:`wanjax.parallel.attention`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh

from wanjax.errors import WanjaxError

AXES = ("dp", "sp", "tp")


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
    # As jax.make_mesh, but an axis may split a physical one on every generation (jax allows it on
    # v5e only): dp=2,sp=2,tp=4 on a v6e-16's 4x4 chips has no other assignment.
    grid = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
    return Mesh(grid, names, axis_types=(AxisType.Auto,) * len(names))
