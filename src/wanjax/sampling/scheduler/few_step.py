"""The schedules of step-distilled Wan models, as their authors' samplers build them: each is run by the
re-noising sampler (:class:`~wanjax.sampling.scheduler.distill.FlowDistillScheduler`): ``x0 = x -
sigma_k * v``, then ``x = (1 - sigma_{k+1}) * x0 + sigma_{k+1} * eps_k``, the last step returning ``x0``.

* ``dmd`` — FastWan (FastVideo's ``DmdDenoisingStage``, hao-ai-lab/FastVideo @ 2f3d407,
  ``fastvideo/pipelines/stages/denoising.py`` L1255-1397): the model is conditioned on the integer
  timesteps ``[1000, 757, 522]`` (``fastvideo/configs/pipelines/wan.py`` L116-124, L275-278, both
  FastWan2.1 and FastWan2.2-TI2V-5B); each one's sigma is the nearest entry of a shift-8
  ``FlowMatchEulerDiscreteScheduler``'s 1000-step table (``fastvideo/models/utils.py`` L166-175: the
  ``argmin`` of ``|timesteps - t|``; the stage hard-codes ``shift=8.0`` whatever the pipeline's flow
  shift), no classifier-free guidance.
* ``rcm`` — TurboWan (thu-ml/TurboDiffusion @ aaecff5, ``turbodiffusion/inference/wan2.1_t2v_infer.py``
  L113-139; ``wan2.2_i2v_infer.py`` L173-210): TrigFlow times ``[atan(sigma_max), 1.5, 1.4, 1.0][:N]``
  then 0, each mapped to ``s = sin / (cos + sin)`` (no shift), the model conditioned on ``s * 1000``
  rounded to bfloat16 (the network's timestep dtype), the starting noise scaled by ``s_0``;
  ``sigma_max`` 80 for text to video, 200 for image to video; 1 to 4 steps. ``rcm_ode``: the same
  schedule with its deterministic update, ``x = x - (s_k - s_{k+1}) * v`` (``--ode`` of
  ``wan2.2_i2v_infer.py`` L55, L202-210, which TurboDiffusion's I2V example script passes).

Tables are float32 (the authors compute in float64: the rounding of ``s`` differs by under an ulp).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import ml_dtypes
import numpy as np

from wanjax.errors import ConfigError

__all__ = [
    "DMD_SHIFT",
    "DMD_TIMESTEPS",
    "RCM_SIGMA_MAX",
    "RCM_TIMES",
    "FewStepSchedule",
    "StepCountError",
    "dmd_schedule",
    "rcm_schedule",
]

DMD_TIMESTEPS = (1000, 757, 522)  # FastWan's dmd_denoising_steps
DMD_SHIFT = 8.0  # the shift of the table DmdDenoisingStage looks sigmas up in
RCM_TIMES = (1.5, 1.4, 1.0)  # TurboDiffusion's mid TrigFlow times (``mid_t``)
RCM_SIGMA_MAX = {"text": 80.0, "image": 200.0}  # its --sigma_max for T2V and for I2V


class StepCountError(ConfigError):
    """A step count a schedule does not run: ``kind`` runs ``steps`` (its words, e.g. ``1 to 4 steps
    (...)``), at most ``most`` (``fewer``: fewer run too), not ``given``; a front end names its own
    flags from these."""

    def __init__(self, kind: str, steps: str, most: int, given: int, fewer: bool = False):
        super().__init__(f"the {kind} sampler runs {steps}, not {given}")
        self.kind, self.steps, self.most, self.given, self.fewer = kind, steps, most, given, fewer


class FewStepSchedule(NamedTuple):
    """What a re-noising sampler runs: the model's timesteps, the sigmas (ending with 0), and the factor
    of the starting noise."""

    timesteps: np.ndarray  # float32, one per step
    sigmas: np.ndarray  # float32, one per step and a final 0
    initial_scale: float = 1.0
    ode: bool = False  # Euler on the flow ODE instead of re-noising


def dmd_schedule(num_inference_steps: int, shift: float = DMD_SHIFT, num_train_timesteps: int = 1000):
    """FastWan's DMD schedule (see the module docstring); StepCountError for another step count."""
    if num_inference_steps != len(DMD_TIMESTEPS):
        steps = f"FastWan's {len(DMD_TIMESTEPS)} steps {list(DMD_TIMESTEPS)}"
        raise StepCountError("dmd", steps, len(DMD_TIMESTEPS), num_inference_steps)
    n = np.float32(num_train_timesteps)
    grid = np.linspace(1, num_train_timesteps, num_train_timesteps, dtype=np.float32)[::-1] / n
    table = np.float32(shift) * grid / (np.float32(1) + np.float32(shift - 1) * grid)
    steps = np.asarray(DMD_TIMESTEPS, np.float32)
    nearest = np.abs(table[None, :] * n - steps[:, None]).argmin(axis=1)
    return FewStepSchedule(steps, np.concatenate([table[nearest], np.zeros(1, np.float32)]))


def rcm_schedule(
    num_inference_steps: int, sigma_max: float = RCM_SIGMA_MAX["text"], ode: bool = False
) -> FewStepSchedule:
    """TurboWan's rCM schedule (see the module docstring; ``ode``: its deterministic update);
    StepCountError outside 1 to 4 steps."""
    most = len(RCM_TIMES) + 1
    if not 1 <= num_inference_steps <= most:
        steps = f"1 to {most} steps (TurboDiffusion's trained times)"
        raise StepCountError("rcm_ode" if ode else "rcm", steps, most, num_inference_steps, fewer=True)
    times = np.array([math.atan(sigma_max), *RCM_TIMES[: num_inference_steps - 1], 0.0])
    s = (np.sin(times) / (np.cos(times) + np.sin(times))).astype(np.float32)
    s[-1] = 0.0
    timesteps = (s[:-1] * np.float32(1000)).astype(ml_dtypes.bfloat16).astype(np.float32)
    return FewStepSchedule(timesteps, s, float(s[0]), ode)
