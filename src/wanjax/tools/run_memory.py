"""Whether a ``generate`` run fits the memory here, asked of :mod:`wanjax.tools.plan` before any
weight is read: a run that cannot fit is refused in one line naming a flag that makes it fit, not
killed by the system part-way."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax

from wanjax.errors import WanjaxError
from wanjax.parallel.mesh import MeshSpec
from wanjax.tools.bench_memory import available_memory, plan_needs
from wanjax.tools.plan import HEADROOM, Model, model_configs, size_text

__all__ = ["REMEDIES", "check_generate_fits", "remedy"]

if TYPE_CHECKING:
    from wanjax.jobs.generate import GenerateWork
    from wanjax.pipeline.pipeline import WanPipeline

# what may make a run fit, in the order suggested: (flag, plan arguments it changes)
REMEDIES = (
    ("--weights_dtype int8", {"weights_dtype": "int8"}),
    ("--offload model", {"offload": "model"}),
    ("--offload blocks", {"offload": "blocks"}),
)


def check_generate_fits(pipe: WanPipeline, work: GenerateWork) -> None:
    """WanjaxError in one line when a stage of the run needs more than :data:`HEADROOM` of the memory
    one device has (a CPU's free RAM; an accelerator's limit): the stage, what it needs, what there is
    and the first flag of :data:`REMEDIES` that would fit (else a smaller video). Nothing is checked
    where the memory is unknown."""
    available, where = available_memory()
    if available is None:
        return
    request = work.request
    model = model_configs(str(pipe.path), request.files.given())
    arguments: dict[str, Any] = {
        "height": work.video["height"],
        "width": work.video["width"],
        "frames": work.video["frames"],
        "dtype": pipe.dtype.name,
        "vae_dtype": pipe.vae_dtype.name,
        "batch": work.batch,
        "cfg": work.params["guidance_scale"] > 1,
        "max_sequence_length": request.text.max_sequence_length,
        "offload": request.memory.offload,
        "weights_dtype": request.memory.weights_dtype,
    }
    # a CPU's devices share one RAM: the whole run's bytes; an accelerator's: one device's share
    mesh = MeshSpec() if jax.devices()[0].platform == "cpu" else pipe.mesh_spec or MeshSpec()
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
