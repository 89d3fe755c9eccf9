"""Starting part-way down a schedule, as diffusers' video-to-video does: the step a ``strength`` starts
at and the source latents noised to that step's sigma."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from wanjax.errors import ConfigError
from wanjax.sampling.scheduler.config import SchedulerConfig
from wanjax.sampling.scheduler.sigmas import check_steps

__all__ = ["PartialStart", "check_strength", "noised", "start_step", "steps_run"]


def check_strength(strength: float) -> float:
    """``strength`` as a float; ConfigError unless ``0 < strength <= 1``."""
    if isinstance(strength, bool) or not isinstance(strength, int | float) or not 0 < strength <= 1:
        raise ConfigError(f"strength must be a number in (0, 1], got {strength!r}")
    return float(strength)


def steps_run(num_inference_steps: int, strength: float | None) -> int:
    """How many of ``num_inference_steps`` a run of ``strength`` takes (diffusers' ``get_timesteps``:
    the last ``int(N * strength)``; all without a strength)."""
    if strength is None:
        return num_inference_steps
    return min(int(num_inference_steps * check_strength(strength)), num_inference_steps)


def start_step(timesteps: np.ndarray, strength: float | None) -> int:
    """The index of the first step a run of ``strength`` takes (``None``: 0, the whole schedule).

    As diffusers' ``get_timesteps``: ``int(N * strength)`` steps are run, the last ones. Its scheduler
    then finds its position by looking the first timestep up (``index_for_timestep``, which takes the
    second of equal timesteps); where that lands elsewhere diffusers would skip a step, so such a
    strength is refused instead of copied."""
    if strength is None:
        return 0
    n = len(timesteps)
    runs = steps_run(n, strength)
    if runs == 0:
        raise ConfigError(
            f"strength {strength:g} of {n} steps runs no step: give a strength of at least {1 / n:.3g} "
            "or more steps"
        )
    start = n - runs
    equal = np.flatnonzero(timesteps == timesteps[start])
    if len(equal) > 1 and equal[1] != start:
        raise ConfigError(
            f"strength {strength:g} of {n} steps starts at a timestep the schedule repeats "
            f"({timesteps[start]}); diffusers would skip a step there: choose another strength or step count"
        )
    return start


def noised(sigmas: np.ndarray, start: int, latents: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """``(1 - sigma) * latents + sigma * noise`` at ``sigmas[start]``, in float32 op by op (diffusers'
    ``add_noise`` / ``scale_noise`` on flow sigmas)."""
    sigma = np.float32(sigmas[start])
    alpha = np.float32(1) - sigma
    x = np.asarray(latents, np.float32)
    return alpha * x + sigma * np.asarray(noise, np.float32)


class PartialStart:
    """What a scheduler with ``sigmas`` and a ``start`` step adds: the source latents it starts from."""

    sigmas: np.ndarray
    start: int
    draws_noise: bool = False  # its steps draw fresh noise from the seed (a batch's items share one draw)

    def _flow_schedule(
        self,
        config: SchedulerConfig,
        num_inference_steps: int,
        strength: float | None,
        schedule: Callable[[int, float, int], tuple[np.ndarray, np.ndarray]],
    ) -> None:
        """Set ``config``, the step count, ``timesteps`` and ``sigmas`` of ``schedule`` (a flow
        schedule of the steps, the shift and the training timesteps) and the ``start`` step."""
        config.validate()
        self.config = config
        self.num_inference_steps = check_steps(num_inference_steps)
        self.timesteps, self.sigmas = schedule(
            self.num_inference_steps, float(config.flow_shift), config.num_train_timesteps
        )
        self.start = start_step(self.timesteps, strength)

    def noised(self, latents: np.ndarray, noise: np.ndarray) -> np.ndarray:
        """``latents`` noised to the first step's sigma (:func:`noised`)."""
        return noised(self.sigmas, self.start, latents, noise)
