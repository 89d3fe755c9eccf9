"""Whether ``wanjax bench``'s stages fit the memory here, asked of :mod:`wanjax.planning.plan` before
any weight is drawn: a run that cannot fit is refused in one line, not killed by the system."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from wanjax.chips import GiB
from wanjax.errors import WanjaxError
from wanjax.parallel.mesh import MeshSpec
from wanjax.planning.device_memory import available_memory, plan_needs
from wanjax.planning.models import Model
from wanjax.planning.plan import HEADROOM

__all__ = ["check_memory", "stage_needs"]


def stage_needs(cfg: Any) -> dict[str, int]:
    """Bytes each stage of ``cfg`` (a :class:`~wanjax.tools.bench.BenchConfig`) needs on one device,
    by ``plan``: its component's weights (on a CPU all of them, what waits in host memory included)
    and its activations. Each stage draws its own weights and drops them after, as ``bench`` runs
    them; the image stage is within the encode stage's."""
    model = Model(cfg.transformer_config(), cfg.text_config(), cfg.vae, None, cfg.variant.experts)
    return plan_needs(
        model,
        MeshSpec(),
        height=cfg.height,
        width=cfg.width,
        frames=cfg.frames,
        dtype=cfg.dtype,
        vae_dtype=cfg.vae_dtype,
        cfg=cfg.guidance_scale > 1,
        max_sequence_length=cfg.max_sequence_length,
        offload=cfg.memory.offload,
        weights_dtype=cfg.memory.weights_dtype,
    )


def check_memory(cfg: Any, stages: Iterable[str]) -> None:
    """WanjaxError in one line when a stage of ``stages`` needs more than :data:`HEADROOM` of the
    memory available: what it needs, what there is, and the ``--layers`` that would fit."""
    names = ["encode" if name == "image" else name for name in stages]
    available, where = available_memory()
    if available is None or not names:
        return
    usable = HEADROOM * available
    needs = stage_needs(cfg)
    stage, need = max(((n, needs[n]) for n in names), key=lambda item: item[1])
    if need <= usable:
        return
    fix = "smaller --height, --width or --frames"
    if stage != "decode":
        full = max(cfg.transformer_config().num_layers, cfg.text_config().num_layers)
        fitting = next(
            (
                n
                for n in range(full - 1, 0, -1)
                if stage_needs(dataclasses.replace(cfg, layers=n))[stage] <= usable
            ),
            None,
        )
        fix = f"--layers {fitting}" if fitting else f"{fix}, or --weights_dtype int8"
    raise WanjaxError(
        f"bench --arch {cfg.arch}: the {stage} stage needs about {need / GiB:.1f} GiB and {where} has "
        f"{available / GiB:.1f} GiB available ({HEADROOM:.0%} usable); use {fix}"
    )
