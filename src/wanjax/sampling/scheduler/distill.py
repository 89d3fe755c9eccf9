"""The few-step sampler of step-distilled Wan models and LoRAs (LightX2V's 4-step "StepDistill").

At each step the model's velocity gives the clean latents, ``x0 = x - sigma_k * v``, which are then
noised again to the next step's level with fresh Gaussian noise, ``x = (1 - sigma_{k+1}) * x0 +
sigma_{k+1} * eps_k`` (the last step returns ``x0``): diffusers' ``FlowMatchEulerDiscreteScheduler(shift=s,
stochastic_sampling=True)`` after ``set_timesteps(sigmas=...)``, which is how LightX2V runs its
distilled models (``WanStepDistillScheduler``: the "LCM" / consistency step they were trained with).

The sigmas are the unshifted grid ``1, (N-1)/N, ..., 1/N`` (LightX2V's ``denoising_step_list`` [1000,
750, 500, 250] for 4 steps) shifted by ``s`` (LightX2V: 5.0): ``s*u / (1 + (s-1)*u)``, in float32 as
diffusers computes them; the model is conditioned on ``sigma * 1000`` (937.5, 833.33, ... not rounded).
The noise is JAX's, from a key the state carries (``jax.random.fold_in(key, step)``), so a seed gives
the same video on every platform; it cannot equal torch's draws.

The same sampler runs the distilled models' own schedules (:mod:`~wanjax.sampling.scheduler.few_step`:
FastWan's ``dmd``, TurboWan's ``rcm``), which give their own timesteps, sigmas and starting-noise factor.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from wanjax.sampling.scheduler.config import SchedulerConfig
from wanjax.sampling.scheduler.few_step import FewStepSchedule
from wanjax.sampling.scheduler.ops import scalar_times
from wanjax.sampling.scheduler.sigmas import check_steps
from wanjax.sampling.scheduler.strength import PartialStart, start_step

__all__ = ["DISTILL_SHIFT", "DistillState", "FlowDistillScheduler", "distill_schedule"]

DISTILL_SHIFT = 5.0  # LightX2V's sample_shift for its Wan 2.1 4-step models and LoRAs


class DistillState(NamedTuple):
    """``sample`` (float32, values rounded to the model dtype) and the re-noise key's raw data."""

    sample: jax.Array
    key: jax.Array


def distill_schedule(num_inference_steps: int, shift: float, num_train_timesteps: int = 1000):
    """``(timesteps, sigmas)`` float32: diffusers' ``set_timesteps(sigmas=linspace(1, 0, N+1)[:-1])``
    with ``shift`` (``sigmas`` ends with 0)."""
    grid = (np.arange(num_inference_steps, 0, -1, dtype=np.float64) / num_inference_steps).astype(np.float32)
    shifted = shift * grid / (1 + (shift - 1) * grid)  # numpy float32 ops (a Python float is weak)
    timesteps = shifted * np.float32(num_train_timesteps)
    return timesteps.astype(np.float32), np.concatenate([shifted, np.zeros(1, np.float32)]).astype(np.float32)


class FlowDistillScheduler(PartialStart):
    """The re-noising few-step sampler (see the module docstring) for a fixed step count; ``seed``
    picks the re-noise draws (it is part of the state, not of the compiled program). ``schedule``: a
    distilled model's own (its ``kind``), else LightX2V's grid with the config's shift."""

    kind: Literal["distill", "dmd", "rcm", "rcm_ode"]

    def __init__(
        self,
        config: SchedulerConfig,
        num_inference_steps: int,
        seed: int = 0,
        strength: float | None = None,
        schedule: tuple[Literal["distill", "dmd", "rcm", "rcm_ode"], FewStepSchedule] | None = None,
    ) -> None:
        config.validate()
        self.config = config
        self.num_inference_steps = check_steps(num_inference_steps)
        self.seed = seed
        if schedule is None:
            grid = distill_schedule(
                self.num_inference_steps, float(config.flow_shift), config.num_train_timesteps
            )
            schedule = ("distill", FewStepSchedule(*grid))
        self.kind, (self.timesteps, self.sigmas, self.initial_scale, self.ode) = schedule
        self.start = start_step(self.timesteps, strength)

    @property
    def draws_noise(self) -> bool:
        return not self.ode

    def model_timestep(self, step_index: jax.Array | int) -> jax.Array:
        """The timestep the model is conditioned on at ``step_index`` (float32 scalar, traceable)."""
        return jnp.asarray(self.timesteps, jnp.float32)[step_index]

    def init_state(self, latents: jax.Array) -> DistillState:
        """The starting noise ``latents`` (float32; times the schedule's starting factor when it runs
        whole) and the key of this scheduler's ``seed``."""
        key = jax.random.key_data(jax.random.key(self.seed))
        sample = jnp.asarray(latents, jnp.float32)
        if self.start == 0 and self.initial_scale != 1.0:
            sample = sample * jnp.float32(self.initial_scale)
        return DistillState(sample=sample, key=key)

    def noise(self, state: DistillState, step_index: jax.Array | int) -> jax.Array:
        """The fresh noise step ``step_index`` re-noises with (standard normal, float32)."""
        key = jax.random.fold_in(jax.random.wrap_key_data(state.key), step_index)
        return jax.random.normal(key, state.sample.shape, jnp.float32)

    def step(
        self, state: DistillState, model_output: jax.Array, step_index: jax.Array | int
    ) -> tuple[DistillState, jax.Array]:
        """``x0 = x - sigma * v``, then ``(1 - sigma_next) * x0 + sigma_next * eps`` in float32, cast to
        ``model_output.dtype`` (as diffusers); with the schedule's ``ode``, ``x - (sigma - sigma_next) *
        v``. Returns ``(new_state, prev_sample)``."""
        sigmas = jnp.asarray(self.sigmas)
        sigma, following = sigmas[step_index], sigmas[step_index + 1]
        if self.ode:
            prev = (state.sample - scalar_times(sigma - following, model_output)).astype(model_output.dtype)
            return DistillState(sample=prev.astype(jnp.float32), key=state.key), prev
        x0 = state.sample - scalar_times(sigma, model_output)
        prev = ((1.0 - following) * x0 + following * self.noise(state, step_index)).astype(model_output.dtype)
        return DistillState(sample=prev.astype(jnp.float32), key=state.key), prev
