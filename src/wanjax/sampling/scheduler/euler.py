"""Flow-matching Euler sampler (diffusers ``FlowMatchEulerDiscreteScheduler``, static shift)."""

from __future__ import annotations

from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from wanjax.sampling.scheduler.config import SchedulerConfig
from wanjax.sampling.scheduler.ops import scalar_times
from wanjax.sampling.scheduler.sigmas import euler_flow_schedule
from wanjax.sampling.scheduler.strength import PartialStart

__all__ = ["EulerState", "FlowEulerScheduler"]


class EulerState(NamedTuple):
    """Flow-Euler sampling state: ``sample`` as float32 (values already rounded to the model dtype)."""

    sample: jax.Array


class FlowEulerScheduler(PartialStart):
    """diffusers ``FlowMatchEulerDiscreteScheduler`` (static shift) for a fixed step count.

    ``timesteps`` are float32 (``sigma * 1000``, not integers); ``sigmas`` float32 with N+1 values.
    Note diffusers shifts its end point twice (``sigma_min`` is a shifted value that is shifted again).
    ``start``: the first step run (0, or where a ``strength`` starts).
    """

    kind: Literal["euler"] = "euler"

    def __init__(
        self, config: SchedulerConfig, num_inference_steps: int, strength: float | None = None
    ) -> None:
        self._flow_schedule(config, num_inference_steps, strength, euler_flow_schedule)
        self._dt = (self.sigmas[1:] - self.sigmas[:-1]).astype(np.float32)

    def model_timestep(self, step_index: jax.Array | int) -> jax.Array:
        """The timestep the model is conditioned on at ``step_index`` (float32 scalar, traceable)."""
        return jnp.asarray(self.timesteps, jnp.float32)[step_index]

    def init_state(self, latents: jax.Array) -> EulerState:
        """Initial state for the starting noise ``latents`` (kept in float32)."""
        return EulerState(sample=jnp.asarray(latents, jnp.float32))

    def step(
        self, state: EulerState, model_output: jax.Array, step_index: jax.Array | int
    ) -> tuple[EulerState, jax.Array]:
        """``x + (sigma_{i+1} - sigma_i) * v`` in float32, then cast to ``model_output.dtype`` (as diffusers).

        Returns ``(new_state, prev_sample)``: ``prev_sample`` has ``model_output``'s dtype;
        ``new_state.sample`` holds the same values in float32.
        """
        dt = jnp.asarray(self._dt)[step_index]
        prev = (state.sample + scalar_times(dt, model_output)).astype(model_output.dtype)
        return EulerState(sample=prev.astype(jnp.float32)), prev
