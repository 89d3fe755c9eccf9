"""Flow-matching samplers for Wan 2.1 as pure functions over an explicit state.

Three schedulers reproduce diffusers 0.42.1 (two for the configurations Wan ships with, one for its
step-distilled models and LoRAs):

* :class:`UniPCFlowScheduler` — ``UniPCMultistepScheduler`` with ``use_flow_sigmas=True``,
  ``prediction_type="flow_prediction"``, ``predict_x0=True``, ``solver_order`` 1 or 2, ``bh1``/``bh2``
  (the Wan 2.1 T2V default).
* :class:`FlowEulerScheduler` — ``FlowMatchEulerDiscreteScheduler`` (plain Euler on the flow ODE).
* :class:`FlowDistillScheduler` — ``FlowMatchEulerDiscreteScheduler(stochastic_sampling=True)`` on the
  grid ``linspace(1, 0, N+1)[:-1]``: each step predicts the clean latents and re-noises them with fresh
  noise, as LightX2V runs its 4-step distilled models; the same sampler on FastWan's (``dmd``) and
  TurboWan's (``rcm``) own schedules (:mod:`~wanjax.sampling.scheduler.few_step`).

Each scheduler is built on the host for a fixed number of steps. All scalar coefficients of every step
are precomputed in numpy float32, following the reference's torch float32 operation order (``log`` and
``expm1`` are evaluated in float64 and rounded, and the 2x2 corrector system is solved the way MKL's
``sgesv`` does: partial pivoting, FMA updates, reciprocal back-substitution). The traced ``step`` is
then a handful of elementwise multiply-adds with coefficients gathered by ``step_index``, which may be
a traced int32 scalar, so a step can run inside ``jax.jit``, ``lax.fori_loop`` or ``lax.scan``::

    sched = make_scheduler("Wan2.1-T2V-1.3B-Diffusers", num_inference_steps=50)
    state = sched.init_state(latents)
    def body(i, state):
        v = model(state.sample, sched.model_timestep(i))
        state, _ = sched.step(state, v, i)
        return state
    latents = jax.lax.fori_loop(0, sched.num_inference_steps, body, state).sample

``step(state, model_output, step_index)`` returns ``(new_state, prev_sample)``; ``new_state.sample``
holds the same values as ``prev_sample`` (always float32, so the state's dtype never changes).

Numerics: run op by op (eager), the steps are bit-identical to diffusers on CPU, bf16 model outputs
included (tests/test_scheduler.py). Under ``jit`` XLA fuses ``a*b + c`` into FMAs, so results then
differ from diffusers by a few float32 ulps (~3e-7 relative after 50 steps).

Submodules: ``config`` (scheduler_config.json parsing and validation), ``sigmas`` (timestep/sigma tables),
``ops`` (torch-rounded traced ops), ``unipc`` and ``euler`` (the two samplers). This module builds them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from wanjax.errors import ConfigError
from wanjax.sampling.scheduler.config import EULER_CLASS, UNIPC_CLASS, SchedulerConfig, load_scheduler_config
from wanjax.sampling.scheduler.config import IGNORED_FIELDS as IGNORED_FIELDS
from wanjax.sampling.scheduler.distill import DISTILL_SHIFT, DistillState, FlowDistillScheduler
from wanjax.sampling.scheduler.euler import EulerState, FlowEulerScheduler
from wanjax.sampling.scheduler.few_step import DMD_SHIFT, RCM_SIGMA_MAX, dmd_schedule, rcm_schedule
from wanjax.sampling.scheduler.sigmas import euler_flow_schedule as euler_flow_schedule
from wanjax.sampling.scheduler.sigmas import unipc_flow_schedule as unipc_flow_schedule
from wanjax.sampling.scheduler.unipc import UNIPC_COEFFICIENTS, UniPCFlowScheduler, UniPCState

__all__ = [
    "DISTILL_SHIFT",
    "DMD_SHIFT",
    "SCHEDULER_KINDS",
    "UNIPC_COEFFICIENTS",
    "DistillState",
    "EulerState",
    "FlowDistillScheduler",
    "FlowEulerScheduler",
    "Scheduler",
    "SchedulerConfig",
    "UniPCFlowScheduler",
    "UniPCState",
    "load_scheduler_config",
    "make_scheduler",
]

SCHEDULER_KINDS = ("auto", "unipc", "euler", "distill", "dmd", "rcm", "rcm_ode")

Scheduler = UniPCFlowScheduler | FlowEulerScheduler | FlowDistillScheduler


def make_scheduler(
    path_or_config: str | Path | dict[str, Any] | SchedulerConfig,
    num_inference_steps: int,
    flow_shift: float | None = None,
    kind: str = "unipc",
    seed: int = 0,
    strength: float | None = None,
    image: bool = False,
) -> Scheduler:
    """Build a scheduler for ``num_inference_steps`` steps.

    ``path_or_config``: a model root dir, its ``scheduler/`` dir, a ``scheduler_config.json`` path, a
    dict or a :class:`SchedulerConfig`. ``flow_shift=None`` keeps the config's shift (``distill``:
    :data:`DISTILL_SHIFT`, what the distilled models are run with). ``kind``: ``"unipc"``, ``"euler"``,
    ``"auto"`` (from the config's ``_class_name``), ``"distill"`` (the few-step re-noising sampler of
    step-distilled models and LoRAs, :mod:`~wanjax.sampling.scheduler.distill`; ``seed`` picks its noise),
    ``"dmd"`` (FastWan's 3 steps; ``flow_shift`` that of its sigma table, default 8), ``"rcm"``
    (TurboWan's 1 to 4 steps, no shift; ``image``: an image-to-video model's ``sigma_max``) or
    ``"rcm_ode"`` (the same with its deterministic update).
    ``strength``: run only the last ``int(N * strength)`` steps, from source latents noised to the first
    one's sigma (``noised``), as diffusers' video-to-video (:mod:`~wanjax.sampling.scheduler.strength`).
    """
    if kind not in SCHEDULER_KINDS:
        raise ConfigError(
            f"scheduler kind={kind!r} is not supported (supported: {', '.join(SCHEDULER_KINDS)})"
        )
    config = load_scheduler_config(path_or_config)
    if kind.startswith("rcm") and flow_shift not in (None, 1.0):  # 1: no shift, what a run records
        raise ConfigError(
            f"the {kind} sampler has no flow shift (its times are TrigFlow's): drop --flow_shift"
        )
    if flow_shift is None:
        flow_shift = {"distill": DISTILL_SHIFT, "dmd": DMD_SHIFT, "rcm": 1.0, "rcm_ode": 1.0}.get(kind)
    if flow_shift is not None:
        config = dataclasses.replace(config, flow_shift=flow_shift)
        config.validate("flow_shift override")
    if kind == "auto":
        by_class = {UNIPC_CLASS: "unipc", EULER_CLASS: "euler"}
        if config.class_name not in by_class:
            raise ConfigError(
                f"scheduler _class_name={config.class_name!r} is not supported with kind='auto' "
                f"(supported: {', '.join(by_class)})"
            )
        kind = by_class[config.class_name]
    if kind == "unipc":
        return UniPCFlowScheduler(config, num_inference_steps, strength)
    if kind == "distill":
        return FlowDistillScheduler(config, num_inference_steps, seed, strength)
    if kind == "dmd":
        schedule = ("dmd", dmd_schedule(num_inference_steps, config.flow_shift, config.num_train_timesteps))
        return FlowDistillScheduler(config, num_inference_steps, seed, strength, schedule)
    if kind in ("rcm", "rcm_ode"):
        sigma_max = RCM_SIGMA_MAX["image" if image else "text"]
        schedule = (kind, rcm_schedule(num_inference_steps, sigma_max, ode=kind == "rcm_ode"))
        return FlowDistillScheduler(config, num_inference_steps, seed, strength, schedule)
    return FlowEulerScheduler(config, num_inference_steps, strength)
