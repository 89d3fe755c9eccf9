"""Which mesh and which memory mode ``wanjax plan`` suggests: every mesh of the devices, the one
``--mesh auto`` runs when it fits, each ``--offload`` / ``--weights_dtype`` mode's peak, the cheapest
that fits."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from wanjax.chips import GiB
from wanjax.io.quantizable import UNQUANTIZED
from wanjax.models.offload import OFFLOAD_MODES
from wanjax.parallel.mesh import MeshSpec, auto_mesh
from wanjax.planning.models import Model
from wanjax.planning.plan import HEADROOM, Plan, plan

__all__ = [
    "Suggestion",
    "candidate_meshes",
    "cheapest_fitting",
    "mode_order",
    "mode_table",
    "plan_modes",
    "suggest_mesh",
]


def candidate_meshes(num_devices: int, fsdp: bool = False) -> list[MeshSpec]:
    """Every (dp, sp, tp) factorisation of the devices."""
    out = []
    for dp, sp in itertools.product(range(1, num_devices + 1), repeat=2):
        if num_devices % (dp * sp) == 0:
            out.append(MeshSpec((("dp", dp), ("sp", sp), ("tp", num_devices // (dp * sp))), fsdp))
    return out


@dataclasses.dataclass(frozen=True)
class Suggestion:
    """The mesh ``wanjax plan`` suggests, and why (one line, from the plans' numbers)."""

    plan: Plan
    reason: str


def suggest_mesh(plans: list[Plan], heads: int) -> Suggestion | None:
    """Of ``plans`` (one per :func:`candidate_meshes` mesh), the ``--mesh auto`` mesh (what ``generate``
    runs) when it fits, else the fitting mesh with the lowest peak; None when none fits."""
    fitting = [p for p in plans if p.fits]
    if not fitting:
        return None
    leanest = min(fitting, key=lambda p: p.peak)
    preferred = auto_mesh(plans[0].mesh.num_devices, heads, fsdp=plans[0].mesh.fsdp)
    auto = next(p for p in plans if p.mesh.shape == preferred.shape)
    if not auto.fits:
        usable = HEADROOM * auto.device_memory
        return Suggestion(
            leanest,
            f"--mesh auto ({auto.mesh.flag}) would peak at {auto.peak / GiB:.2f} GiB, over the "
            f"{usable / GiB:.1f} GiB usable; this is the fitting mesh with the lowest peak",
        )
    n = auto.block_devices
    devices = "one device" if n == 1 else f"{n} devices that exchange activations"
    reason = f"--mesh auto (generate's default) fits; each DiT block runs on {devices}{auto.roles}"
    if leanest.peak < auto.peak:
        on = "but on" if leanest.block_devices > n else "on the same"
        lower = (auto.peak - leanest.peak) / GiB
        reason += (
            f"; {leanest.mesh.flag} peaks {lower:.2f} GiB lower, {on} {leanest.block_devices} devices"
            f"{leanest.roles}"
        )
    return Suggestion(auto, reason)


def mode_order(weights_dtype: str = UNQUANTIZED) -> list[tuple[str, str]]:
    """``(offload, weights_dtype)`` pairs, cheapest first: unquantised before 8-bit (offloading changes
    where weights wait, not the video; quantisation changes the video), and within each, less
    host-to-device traffic first (none, model, blocks). The 8-bit dtype is ``weights_dtype`` when it is
    one (or ``gguf``), else fp8 (int8 takes the same memory)."""
    quantized = weights_dtype if weights_dtype != UNQUANTIZED else "fp8"
    return [(o, w) for w in (UNQUANTIZED, quantized) for o in OFFLOAD_MODES]


def plan_modes(
    model: Model, mesh: MeshSpec, weights_dtype: str = UNQUANTIZED, **kwargs: Any
) -> dict[tuple[str, str], Plan]:
    """:func:`plan` of ``mesh`` in every mode of :func:`mode_order`."""
    return {
        (o, w): plan(model, mesh, offload=o, weights_dtype=w, **kwargs) for o, w in mode_order(weights_dtype)
    }


def mode_table(plans: dict[tuple[str, str], Plan], chosen: tuple[str, str]) -> str:
    """Each mode's peak on one mesh (a :func:`plan_modes` result), offload by row, weights by column."""
    first = next(iter(plans.values()))
    columns = list(dict.fromkeys(w for _, w in plans))
    usable = HEADROOM * first.device_memory / GiB
    lines = [
        f"modes on mesh {first.mesh.flag} (peak GiB per device, {usable:.1f} usable):",
        "  --offload " + "".join(f"{'--weights_dtype ' + w:<24}" for w in columns).rstrip(),
    ]
    for offload in OFFLOAD_MODES:
        cells = []
        for w in columns:
            p = plans[(offload, w)]
            mark = " <-" if (offload, w) == chosen else ""
            cells.append(f"{p.peak / GiB:6.2f} {'fits' if p.fits else 'no'}{mark}")
        lines.append(f"  {offload:<10}" + "".join(f"{c:<24}" for c in cells).rstrip())
    return "\n".join(lines)


def cheapest_fitting(
    model: Model, meshes: list[MeshSpec], weights_dtype: str = UNQUANTIZED, **kwargs: Any
) -> Plan | None:
    """The plan of the first mode of :func:`mode_order` that fits on one of ``meshes`` (with several,
    on the mesh :func:`suggest_mesh` picks), or None."""
    for offload, w in mode_order(weights_dtype):
        plans = [plan(model, m, offload=offload, weights_dtype=w, **kwargs) for m in meshes]
        if len(plans) == 1:
            if plans[0].fits:
                return plans[0]
        elif suggestion := suggest_mesh(plans, model.transformer.num_attention_heads):
            return suggestion.plan
    return None
