"""Whether a run fits the memory here, asked of :mod:`wanjax.planning.plan` before any weight is read:
a run that cannot fit is refused in one line naming a flag that makes it fit, not killed by the system
part-way."""

from __future__ import annotations

from typing import Any

from wanjax.errors import WanjaxError
from wanjax.parallel.mesh import MeshSpec
from wanjax.planning.device_memory import available_memory, plan_needs
from wanjax.planning.models import Model
from wanjax.planning.plan import HEADROOM, size_text

__all__ = ["REMEDIES", "check_fits", "remedy"]

# what may make a run fit, in the order suggested: (flag, plan arguments it changes)
REMEDIES = (
    ("--weights_dtype int8", {"weights_dtype": "int8"}),
    ("--offload model", {"offload": "model"}),
    ("--offload blocks", {"offload": "blocks"}),
)


def check_fits(model: Model, mesh: MeshSpec, arguments: dict[str, Any]) -> None:
    """WanjaxError in one line when a stage of the run (``plan``'s ``arguments`` on ``mesh``) needs
    more than :data:`HEADROOM` of the memory one device has (a CPU's free RAM; an accelerator's
    limit): the stage, what it needs, what there is and the first flag of :data:`REMEDIES` that would
    fit (else a smaller video). Nothing is checked where the memory is unknown."""
    available, where = available_memory()
    if available is None:
        return
    usable = HEADROOM * available
    needs = plan_needs(model, mesh, **arguments)
    stage, need = max(needs.items(), key=lambda item: item[1])
    if need <= usable:
        return
    fix = remedy(model, mesh, arguments, usable)
    raise WanjaxError(
        f"the {stage} stage needs about {size_text(need)} and {where} has {size_text(available)} "
        f"available ({HEADROOM:.0%} usable), by wanjax plan's estimate; use {fix}"
    )


def remedy(model: Model, mesh: MeshSpec, arguments: dict[str, Any], usable: float) -> str:
    """The first flag of :data:`REMEDIES` (one the run does not use yet) with which every stage of the
    run (``plan``'s ``arguments``) needs at most ``usable`` bytes, else a smaller video."""
    for flag, change in REMEDIES:
        new = any(arguments[k] != v for k, v in change.items())
        if new and max(plan_needs(model, mesh, **{**arguments, **change}).values()) <= usable:
            return flag
    return "a smaller --height/--width or fewer --frames"
