"""The denoising loop: DiT velocity with classifier-free guidance, advanced by a flow scheduler.

One jitted step (model forward + guidance + scheduler update) is compiled once per shape and
called for every step; the step index is a traced argument, so all steps share the program.
The conditional and unconditional passes are batched into one forward.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

from wanjax.models.dit import WanTransformer
from wanjax.models.layers import Params
from wanjax.scheduler import Scheduler


@dataclasses.dataclass
class StepTimes:
    """Wall time of the first step (compile + run) and of every later step, in seconds."""

    first: float = 0.0
    steady: list[float] = dataclasses.field(default_factory=list)


def guided_velocity(
    model: WanTransformer,
    params: Params,
    latents: jax.Array,
    timestep: jax.Array,
    prompt_embeds: jax.Array,
    negative_prompt_embeds: jax.Array | None,
    guidance_scale: float,
) -> jax.Array:
    """``uncond + g * (cond - uncond)`` in the model dtype; the unconditional pass only when ``g > 1``."""
    x = latents.astype(model.dtype)
    batch = latents.shape[0]
    if negative_prompt_embeds is None or guidance_scale <= 1.0:
        return model.apply(params, x, jnp.full((batch,), timestep), prompt_embeds)
    both = model.apply(
        params,
        jnp.concatenate([x, x]),
        jnp.full((2 * batch,), timestep),
        jnp.concatenate([prompt_embeds, negative_prompt_embeds]),
    )
    cond, uncond = both[:batch], both[batch:]
    return uncond + jnp.asarray(guidance_scale, model.dtype) * (cond - uncond)


def denoise(
    model: WanTransformer,
    scheduler: Scheduler,
    latents: jax.Array,
    prompt_embeds: jax.Array,
    negative_prompt_embeds: jax.Array | None = None,
    guidance_scale: float = 5.0,
    on_step: Callable[[int, float], None] | None = None,
) -> tuple[jax.Array, StepTimes]:
    """Run all scheduler steps from ``latents`` (float32 noise); returns the final latents and timings."""
    model.check_shape(tuple(latents.shape))

    @jax.jit
    def step(params, state, index, cond, uncond):
        timestep = scheduler.model_timestep(index)
        velocity = guided_velocity(model, params, state.sample, timestep, cond, uncond, guidance_scale)
        return scheduler.step(state, velocity, index)[0]

    # Commit the state to the params' device: otherwise the first call (uncommitted inputs) and the
    # later ones (committed outputs) compile two programs.
    devices = jax.tree.leaves(model.params)[0].devices()
    state = scheduler.init_state(latents)
    if len(devices) == 1:
        state = jax.device_put(state, next(iter(devices)))
    times = StepTimes()
    for i in range(scheduler.num_inference_steps):
        start = time.perf_counter()
        state = step(model.params, state, jnp.int32(i), prompt_embeds, negative_prompt_embeds)
        jax.block_until_ready(state.sample)
        elapsed = time.perf_counter() - start
        if i == 0:
            times.first = elapsed
        else:
            times.steady.append(elapsed)
        if on_step:
            on_step(i, elapsed)
    return state.sample, times
