"""The denoising loop: DiT velocity with classifier-free guidance, advanced by a flow scheduler.

One jitted step (model forward + guidance + scheduler update) is compiled ahead of the loop and
called for every step; the step index and the guidance scale are traced arguments, so all steps
share one program. The conditional and unconditional passes are batched into one forward; with
guidance <= 1 the unconditional pass is left out. A :class:`Sampler` keeps its compiled programs,
so later calls with the same shapes compile nothing.

Programs are keyed by the :func:`~wanjax.runtime.programs.signature` of their arguments, the
weights' shardings included, and those carry their memory kind: weights streamed from host memory
(``offload="blocks"``) get their own program, and weights moved to the host and back between
stages (``offload="model"``) find theirs again. :meth:`Sampler.compile` builds the step program for
abstract arguments (``jax.ShapeDtypeStruct``), e.g. for its ``memory_analysis()`` before any weight
is read.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from wanjax.errors import NumericalError
from wanjax.models.dit import WanTransformer
from wanjax.models.layers import Params
from wanjax.parallel.layouts import to_global, to_host
from wanjax.parallel.rules import replicated
from wanjax.pipeline.scheduler import Scheduler
from wanjax.runtime.programs import ProgramCache, signature
from wanjax.runtime.timing import StepTimes

__all__ = ["Sampler", "StepTimes", "denoise", "guided_velocity"]


def guided_velocity(
    model: WanTransformer,
    params: Params,
    latents: jax.Array,
    timestep: jax.Array,
    prompt_embeds: jax.Array,
    negative_prompt_embeds: jax.Array | None,
    guidance_scale: float | jax.Array,
) -> jax.Array:
    """``uncond + g * (cond - uncond)`` in the model dtype; only the conditional pass without negatives.

    Rounded as torch does it for the reference: the difference in the model dtype, the product with
    the (float32) scale rounded to the model dtype, then the sum.
    """
    x = latents.astype(model.dtype)
    batch = latents.shape[0]
    if negative_prompt_embeds is None:
        return model.apply(params, x, jnp.full((batch,), timestep), prompt_embeds)
    both = model.apply(
        params,
        jnp.concatenate([x, x]),
        jnp.full((2 * batch,), timestep),
        jnp.concatenate([prompt_embeds, negative_prompt_embeds]),
    )
    cond, uncond = both[:batch], both[batch:]
    scaled = jnp.asarray(guidance_scale, jnp.float32) * (cond - uncond).astype(jnp.float32)
    return uncond + scaled.astype(model.dtype)


class Sampler:
    """The denoising loop of one model, with its compiled step programs.

    A program is built per (scheduler config and step count, guidance on/off, input shapes) and
    kept, so repeated calls (several seeds, the same shape) compile nothing.
    """

    def __init__(self, model: WanTransformer):
        self.model = model
        self._programs = ProgramCache()
        self.finite_flags: list[jax.Array] = []

    def _program(self, scheduler: Scheduler, args: tuple[Any, ...]) -> jax.stages.Compiled:
        model = self.model

        def step(params, state, index, cond, uncond, guidance):
            timestep = scheduler.model_timestep(index)
            velocity = guided_velocity(model, params, state.sample, timestep, cond, uncond, guidance)
            state = scheduler.step(state, velocity, index)[0]
            # A device-side flag per step (read back only once, after the loop).
            return state, jnp.all(jnp.isfinite(state.sample))

        def lower() -> jax.stages.Lowered:
            # Under a mesh the (small) scheduler state stays replicated, so every step's output has
            # exactly the input sharding the program was compiled for.
            out = None if model.mesh is None else replicated(model.mesh)
            return jax.jit(step, out_shardings=out).lower(*args)

        key = (scheduler.kind, scheduler.config, scheduler.num_inference_steps, signature(args))
        return self._programs.get(key, lower)

    def _placement(self, params: Params) -> jax.sharding.Sharding | None:
        """Where the step's inputs go: replicated over the mesh, else on the device of ``params``
        (arrays or ShapeDtypeStructs; None: no sharding, or several devices without a mesh, inputs
        left where they are)."""
        if self.model.mesh is not None:
            return replicated(self.model.mesh)
        sharding = getattr(jax.tree.leaves(params)[0], "sharding", None)
        devices = () if sharding is None else sharding.device_set
        return jax.sharding.SingleDeviceSharding(next(iter(devices))) if len(devices) == 1 else None

    def compile(
        self,
        scheduler: Scheduler,
        latents: jax.Array | jax.ShapeDtypeStruct,
        prompt_embeds: jax.Array | jax.ShapeDtypeStruct,
        negative_prompt_embeds: jax.Array | jax.ShapeDtypeStruct | None = None,
        params: Params | None = None,
    ) -> jax.stages.Compiled:
        """The step program :meth:`__call__` runs for inputs shaped like these (arrays or
        ``jax.ShapeDtypeStruct``; ``params``: the model's, or an abstract tree with the same
        shardings, e.g. from :func:`~wanjax.io.checkpoint.abstract_params`), compiled now and kept
        (a later call with such inputs compiles nothing). Pass ``negative_prompt_embeds`` for the
        guided (batched CFG) program. ``.memory_analysis()`` gives its memory."""
        params = self.model.params if params is None else params
        placement = self._placement(params)

        def like(x: Any) -> Any:
            if x is None:
                return None
            sharding = placement if placement is not None else getattr(x, "sharding", None)
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

        state = jax.tree.map(like, jax.eval_shape(scheduler.init_state, like(latents)))
        scalars = (jax.ShapeDtypeStruct((), jnp.int32), jax.ShapeDtypeStruct((), jnp.float32))
        index, guidance = (like(x) for x in scalars)
        cond, uncond = like(prompt_embeds), like(negative_prompt_embeds)
        return self._program(scheduler, (params, state, index, cond, uncond, guidance))

    def programs(self) -> tuple[jax.stages.Compiled, ...]:
        """The step programs kept, least recently used first (e.g. for ``memory_analysis()``)."""
        return self._programs.programs()

    def __call__(
        self,
        scheduler: Scheduler,
        latents: jax.Array,
        prompt_embeds: jax.Array,
        negative_prompt_embeds: jax.Array | None = None,
        guidance_scale: float = 5.0,
        on_step: Callable[[int, float], None] | None = None,
        check_finite: bool = False,
    ) -> tuple[jax.Array, StepTimes]:
        """Run all scheduler steps from ``latents`` (float32 noise); the final latents and timings.

        The unconditional pass runs only when ``negative_prompt_embeds`` is given and
        ``guidance_scale > 1``. ``on_step(i, seconds)`` is called after each step. Each step also
        computes an on-device flag "the latents are finite" (kept in ``finite_flags``, never read in
        the loop); with ``check_finite`` (or a later :meth:`check_finite`) NaN/inf in the final
        latents raise :class:`~wanjax.errors.NumericalError` naming the first step that produced them.
        """
        self.model.check_shape(tuple(latents.shape))
        uncond = negative_prompt_embeds if guidance_scale > 1.0 else None
        # Place every input on the params' device (one device) or replicate it over the mesh (as a
        # global array, also across processes), so the compiled program and the arrays it returns
        # agree on placement from the first step on.
        placement = self._placement(self.model.params)
        if self.model.mesh is not None:
            place = lambda x: None if x is None else to_global(x, placement)  # noqa: E731
        elif placement is not None:
            place = lambda x: jax.device_put(x, placement)  # noqa: E731
        else:
            place = lambda x: x  # noqa: E731
        state = jax.tree.map(place, scheduler.init_state(latents))
        cond, uncond = (
            place(jnp.asarray(prompt_embeds)),
            place(None if uncond is None else jnp.asarray(uncond)),
        )
        guidance = place(jnp.float32(guidance_scale))
        index0 = place(jnp.int32(0))
        times = StepTimes()
        start = time.perf_counter()
        program = self._program(scheduler, (self.model.params, state, index0, cond, uncond, guidance))
        times.compile = time.perf_counter() - start
        finite: list[jax.Array] = []
        self.finite_flags = finite
        for i in range(scheduler.num_inference_steps):
            start = time.perf_counter()
            state, ok = program(self.model.params, state, place(jnp.int32(i)), cond, uncond, guidance)
            finite.append(ok)
            jax.block_until_ready(state.sample)
            elapsed = time.perf_counter() - start
            if i == 0:
                times.first = elapsed
            else:
                times.steady.append(elapsed)
            if on_step:
                on_step(i, elapsed)
        if check_finite:
            self.check_finite()
        return state.sample, times

    def check_finite(self) -> None:
        """Raise NumericalError when the last run's latents are not finite, naming the first step that
        made them so: one device-to-host read of the last step's flag, all of them only on failure."""
        finite = self.finite_flags
        if finite and not bool(to_host(finite[-1])):
            check_steps_finite([bool(to_host(f)) for f in finite], self.model.dtype)


def check_steps_finite(finite: list[bool], dtype: Any) -> None:
    """Raise NumericalError naming the first step whose latents were not finite (if any)."""
    if all(finite):
        return
    first = finite.index(False) + 1
    hint = (
        "try --dtype float32"
        if jnp.dtype(dtype).itemsize < 4
        else "check the checkpoint's weights and inputs"
    )
    raise NumericalError(
        f"denoising produced NaN/inf latents, first at step {first} of {len(finite)} "
        f"(transformer dtype {jnp.dtype(dtype).name}); {hint}"
    )


def denoise(
    model: WanTransformer,
    scheduler: Scheduler,
    latents: jax.Array,
    prompt_embeds: jax.Array,
    negative_prompt_embeds: jax.Array | None = None,
    guidance_scale: float = 5.0,
    on_step: Callable[[int, float], None] | None = None,
) -> tuple[jax.Array, StepTimes]:
    """Run all scheduler steps from ``latents`` (float32 noise); returns the final latents and timings.

    One-off form of :class:`Sampler` (keep a Sampler to reuse compiled programs across calls).
    """
    return Sampler(model)(scheduler, latents, prompt_embeds, negative_prompt_embeds, guidance_scale, on_step)
