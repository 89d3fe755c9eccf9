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

import dataclasses
import functools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from wanjax.errors import ConfigError
from wanjax.kernels.radial import RadialAttention
from wanjax.models.dit import WanTransformer
from wanjax.models.layers import Params
from wanjax.parallel.layouts import to_global, to_host
from wanjax.parallel.rules import replicated
from wanjax.runtime.compile_effort import once_per_video
from wanjax.runtime.programs import ProgramCache, signature
from wanjax.runtime.timing import StepTimes
from wanjax.sampling.cache.forward import cached_forward, state_shapes
from wanjax.sampling.cache.step_cache import CacheCarry, CacheConfig, CacheReport, StepCache, resolve
from wanjax.sampling.context_cache import (
    ContextCache,
    cache_sharding,
    context_cache,
    default_on,
)
from wanjax.sampling.guidance import (
    ImageConditioning,
    StepConditioning,
    guide,
    guided_batch,
    guided_velocity,
    is_first_frame,
    one_by_one,
)
from wanjax.sampling.results import Denoised
from wanjax.sampling.scheduler import Scheduler

__all__ = ["Sampler"]


class Sampler:
    """The denoising loop of one model, with its compiled step programs.

    A program is built per (scheduler config and step count, guidance on/off, input shapes) and
    kept, so repeated calls (several seeds, the same shape) compile nothing. ``context_cache``
    (exact; None: :func:`~wanjax.sampling.context_cache.default_on`): the blocks' cross-attention
    keys and values of the prompts are computed once per expert before its first step
    (:mod:`~wanjax.sampling.context_cache`), not at every step.
    """

    def __init__(
        self,
        model: WanTransformer,
        model_2: WanTransformer | None = None,
        context_cache: bool | None = None,
    ):
        self.model = model
        self.experts = (model,) if model_2 is None else (model, model_2)
        self.context_cache = default_on(model.settings.offload) if context_cache is None else context_cache
        self._programs = ProgramCache()

    def _program(self, spec: StepSpec, args: tuple[Any, ...]) -> jax.stages.Compiled:
        """The step program ``spec`` names for ``args``, compiled once per :meth:`StepSpec.key`."""
        lower = self._lower if spec.cache is None else self._cached_lower
        return self._programs.get(spec.key(args), lambda: lower(spec, args))

    def _expert(self, spec: StepSpec) -> WanTransformer:
        """The spec's expert, or (``sparse``) the same weights running radial attention."""
        model = self.experts[spec.expert]
        if spec.sparse is None:
            return model
        return WanTransformer(
            model.cfg, model.params, dataclasses.replace(model.settings, sparse=spec.sparse)
        )

    def _lower(self, spec: StepSpec, args: tuple[Any, ...]) -> jax.stages.Lowered:
        """The step program (without a step cache), lowered."""
        model, scheduler = self._expert(spec), spec.scheduler

        def step(params, state, index, cond, uncond, guidance, image, kv):
            timestep = scheduler.model_timestep(index)
            velocity = guided_velocity(
                model, params, state.sample, timestep, cond, uncond, guidance, image, kv
            )
            state = scheduler.step(state, velocity, index)[0]
            # A device-side flag per step (read back only once, after the loop).
            return state, jnp.all(jnp.isfinite(state.sample))

        # Under a mesh the (small) scheduler state stays replicated, so every step's output has
        # exactly the input sharding the program was compiled for. keep_unused: the weights the
        # text K/V cache made unused (the context's projections) stay the program's arguments, as
        # they stay in device memory (what memory_analysis' readers count).
        out = None if model.settings.mesh is None else replicated(model.settings.mesh)
        return jax.jit(step, out_shardings=out, keep_unused=True).lower(*args)

    def _cached_lower(self, spec: StepSpec, args: tuple[Any, ...]) -> jax.stages.Lowered:
        """The step program under the spec's step cache, lowered: it also carries the cache state
        (``args``' after the step's own) and returns which branches computed (and, calibrating, their
        magnitude ratios)."""
        model, scheduler, cache = self._expert(spec), spec.scheduler, spec.cache
        assert cache is not None

        def step(
            params, state, index, cond, uncond, guidance, image, kv, cache_state, schedule, threshold, first
        ):
            timestep = scheduler.model_timestep(index)
            inputs = guided_batch(model, state.sample, timestep, cond, uncond, image, kv)
            velocity, cache_state, computed, ratios = cached_forward(
                model, params, inputs, cache, cache_state, index, schedule[index], threshold, first
            )
            velocity = guide(model, velocity, state.sample.shape[0], guidance)
            state = scheduler.step(state, velocity, index)[0]
            return state, jnp.all(jnp.isfinite(state.sample)), cache_state, computed, ratios

        out = None
        if model.settings.mesh is not None:
            rep = replicated(model.settings.mesh)
            _, cache_sharding = self._cache_specs(cache, args[1].sample.shape, spec.expert)
            out = (rep, rep, cache_sharding, rep, rep)
        # keep_unused: each policy leaves one of schedule / threshold unread; kept, the program's
        # inputs stay the arguments (what memory_analysis' readers pair them with)
        return jax.jit(step, out_shardings=out, keep_unused=True).lower(*args)

    def _placement(self, params: Params) -> jax.sharding.Sharding | None:
        """Where the step's inputs go: replicated over the mesh, else on the device of ``params``
        (arrays or ShapeDtypeStructs; None: no sharding, or several devices without a mesh, inputs
        left where they are)."""
        if self.model.settings.mesh is not None:
            return replicated(self.model.settings.mesh)
        sharding = getattr(jax.tree.leaves(params)[0], "sharding", None)
        devices = () if sharding is None else sharding.device_set
        return jax.sharding.SingleDeviceSharding(next(iter(devices))) if len(devices) == 1 else None

    def compile(self, *args: Any, **kwargs: Any) -> jax.stages.Compiled:
        """The step program :meth:`__call__` runs for inputs shaped like these (see :meth:`lower`),
        compiled now and kept (a later call with such inputs compiles nothing). ``.memory_analysis()``
        gives its memory."""
        scheduler, step_args, expert = self._abstract_step(*args, **kwargs)
        return self._program(StepSpec(scheduler, expert), step_args)

    def lower(
        self,
        *args: Any,
        cache: CacheConfig | None = None,
        sparse: RadialAttention | None = None,
        **kwargs: Any,
    ) -> jax.stages.Lowered:
        """The step program for inputs shaped like these, lowered only (e.g. for another target);
        with ``cache``, the program that policy runs (its state and schedule abstract inputs too);
        with ``sparse``, a sparse step's."""
        cached = cache is not None and cache.enabled
        scheduler, step_args, expert = self._abstract_step(*args, cached=cached, **kwargs)
        _, state, _, _, uncond, _, image, _ = step_args
        two = len(self.experts) == 2
        steps = scheduler.num_inference_steps
        turns = [min(i, 1) for i in range(steps)] if two else None  # each expert's turn: shapes only
        step_cache = self._step_cache(cache, scheduler, uncond is not None, turns, image)
        spec = StepSpec(scheduler, expert, sparse, step_cache)
        if step_cache is None:
            return self._lower(spec, step_args)
        specs, _ = self._cache_specs(step_cache, state.sample.shape, expert)
        return self._cached_lower(spec, step_args + specs)

    def _abstract_step(
        self,
        scheduler: Scheduler,
        latents: jax.Array | jax.ShapeDtypeStruct,
        prompt_embeds: jax.Array | jax.ShapeDtypeStruct,
        negative_prompt_embeds: jax.Array | jax.ShapeDtypeStruct | None = None,
        params: Params | None = None,
        *,
        image: StepConditioning | None = None,
        expert: int = 0,
        cached: bool = False,
    ) -> tuple[Scheduler, tuple[Any, ...], int]:
        """The step's abstract arguments for inputs shaped like these (arrays or
        ``jax.ShapeDtypeStruct``; ``params``: the expert's, or an abstract tree with the same
        shardings, e.g. from :func:`~wanjax.io.checkpoint.abstract_params`). Pass
        ``negative_prompt_embeds`` for the guided (batched CFG) program, ``image`` for an
        image-to-video model's conditioning, ``expert`` for the second expert's program, ``cached``
        for a step cache's (the text K/V cache then in the guided batch's rows)."""
        params = self.experts[expert].params if params is None else params
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
        image = None if image is None else jax.tree.map(like, image)
        kv = None
        if self.context_cache:
            per_video = not cached and one_by_one(self.experts[expert], image)
            shapes = jax.eval_shape(
                lambda p, c, u, i: context_cache(self.experts[expert], p, c, u, i, per_video),
                params,
                cond,
                uncond,
                image,
            )
            sharding = self._kv_sharding(expert, cond, uncond, per_video) or placement
            kv = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), shapes)
        return scheduler, (params, state, index, cond, uncond, guidance, image, kv), expert

    def _kv_sharding(self, expert: int, cond: Any, uncond: Any, per_video: bool) -> NamedSharding | None:
        """The text K/V cache's sharding under the mesh (:func:`cache_sharding`), for these prompts."""
        rows = (1 if per_video else cond.shape[0]) * (1 if uncond is None else 2)
        return cache_sharding(self.experts[expert], rows, per_video)

    def _context_lower(self, expert: int, args: tuple[Any, ...], per_video: bool) -> jax.stages.Lowered:
        """The text K/V cache's program of ``(params, cond, uncond, image)``, lowered."""
        model, (_, cond, uncond, _) = self.experts[expert], args
        sharding = self._kv_sharding(expert, cond, uncond, per_video)
        fn = lambda p, c, u, i: context_cache(model, p, c, u, i, per_video)  # noqa: E731
        options = once_per_video() or None  # once a video, not every step
        jitted = jax.jit(fn, out_shardings=sharding, keep_unused=True, compiler_options=options)
        return jitted.lower(*args)  # all the weights, as the step

    def _context_cache(
        self,
        expert: int,
        params: Params,
        cond: jax.Array,
        uncond: jax.Array | None,
        image: Any,
        per_video: bool,
    ) -> ContextCache | None:
        """The run's text K/V cache for this expert (None when off), its program compiled once per shape."""
        if not self.context_cache:
            return None
        args = (params, cond, uncond, image)
        lower = functools.partial(self._context_lower, expert, args, per_video)
        return self._programs.get(("context", expert, per_video, signature(args)), lower)(*args)

    def lower_context_cache(
        self, *args: Any, cache: CacheConfig | None = None, **kwargs: Any
    ) -> jax.stages.Lowered:
        """The text K/V cache's program for a run with inputs shaped like these (:meth:`lower`'s
        arguments), lowered only."""
        cached = cache is not None and cache.enabled
        _, step_args, expert = self._abstract_step(*args, cached=cached, **kwargs)
        params, _, _, cond, uncond, _, image, _ = step_args
        per_video = not cached and one_by_one(self.experts[expert], image)
        return self._context_lower(expert, (params, cond, uncond, image), per_video)

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
        cache: CacheConfig | None = None,
        image: StepConditioning | None = None,
        *,
        boundary_ratio: float | None = None,
        guidance_scale_2: float | None = None,
        on_expert: Callable[[int], None] | None = None,
        sparse: RadialAttention | None = None,
        cache_carry: CacheCarry | None = None,
    ) -> Denoised:
        """Run the scheduler's steps (from its ``start``) from ``latents`` (float32: noise, or source
        latents noised to the first step): the final latents, the step timings and what the run
        decided (:class:`Denoised`). ``image``: an image-to-video model's
        conditioning (:class:`ImageConditioning`).

        ``cache``: a step-cache policy (:mod:`wanjax.sampling.cache.step_cache`); what it decided is the
        result's ``cache_report``.

        Two experts (a Sampler built with ``model_2``, Wan 2.2 A14B): each step runs the first expert
        while its timestep is at least ``boundary_ratio * num_train_timesteps``, the second after
        (:func:`expert_schedule`), with ``guidance_scale_2`` (default ``guidance_scale``), each with
        its own compiled program; ``on_expert(k)`` is called before expert ``k``'s first step (e.g.
        to swap the weights in device memory), and the expert's params are read after it.

        The unconditional pass runs only when ``negative_prompt_embeds`` is given and
        ``guidance_scale > 1``. ``on_step(i, seconds)`` is called after each step. Each step also
        computes an on-device flag "the latents are finite" (the result's ``finite_flags``, never read
        in the loop); with ``check_finite`` (or a later :meth:`Denoised.check_finite`) NaN/inf in the final
        latents raise :class:`~wanjax.errors.NumericalError` naming the first step that produced them.

        ``sparse``: radial attention (:class:`~wanjax.kernels.radial.RadialAttention`) from step
        ``dense_timestep`` on, in the blocks from ``dense_block`` on; the dense steps run the dense
        program. The result's ``sparse_steps`` lists the steps that ran sparse.

        ``cache_carry``: a previous run's TaylorSeer state (its result's ``cache_carry``) this run
        continues, its hook's steps counted on, as diffusers' hook across Animate's segments.
        """
        joined = isinstance(image, ImageConditioning) and not image.first_frame
        channels = latents.shape[1] + (image.latents.shape[1] if joined else 0)
        self.model.check_shape((latents.shape[0], channels, *latents.shape[2:]))
        two = len(self.experts) == 2
        if two != (boundary_ratio is not None):
            raise ConfigError(
                "two experts need a boundary_ratio, one expert none"
                if two
                else "a boundary_ratio needs the second expert (model_2)"
            )
        if cache is not None and cache.enabled and scheduler.start:
            raise ConfigError(
                "a step cache runs a whole schedule, not one started part-way (a strength under 1): "
                "leave the cache off"
            )
        experts = expert_schedule(scheduler, boundary_ratio)
        scales = (guidance_scale, guidance_scale if guidance_scale_2 is None else guidance_scale_2)
        # as diffusers' do_classifier_free_guidance: guidance_scale alone decides, for both experts
        uncond = negative_prompt_embeds if guidance_scale > 1.0 else None
        # Place every input on the params' device (one device) or replicate it over the mesh (as a
        # global array, also across processes), so the compiled program and the arrays it returns
        # agree on placement from the first step on.
        placement = self._placement(self.model.params)
        if self.model.settings.mesh is not None:
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
        guidance = [place(jnp.float32(g)) for g in scales]
        index0 = place(jnp.int32(0))
        times = StepTimes()
        image = None if image is None else jax.tree.map(place, image)
        time_inputs = self._time_inputs(scheduler, latents.shape[2], is_first_frame(image))
        calls_before = 0 if cache_carry is None else cache_carry.calls
        step_cache = self._step_cache(
            cache, scheduler, uncond is not None, experts if two else None, image, time_inputs, calls_before
        )
        finite: list[jax.Array] = []
        decisions: list[tuple[jax.Array, jax.Array]] = []
        program, extra, current = None, (), None
        sparse_steps = []
        for i in range(scheduler.start, scheduler.num_inference_steps):
            k = experts[i]
            step_sparse = sparse if sparse is not None and sparse.sparse_step(i) else None
            if step_sparse is not None:
                sparse_steps.append(i)
            if (k, step_sparse) != current:  # a new expert's or mode's first step: its program
                if on_expert is not None and (current is None or current[0] != k):
                    on_expert(k)
                params = self.experts[k].params
                start = time.perf_counter()
                per_video = step_cache is None and one_by_one(self.experts[k], image)
                kv = self._context_cache(k, params, cond, uncond, image, per_video)
                args = (params, state, index0, cond, uncond, guidance[k], image, kv)
                # each expert starts from an empty cache, as diffusers' hook on each transformer
                if step_cache is not None and (current is None or current[0] != k):
                    extra = self._cache_inputs(step_cache, latents, place, k, i)
                    if cache_carry is not None and current is None:
                        extra = (cache_carry.state, *extra[1:])
                program = self._program(StepSpec(scheduler, k, step_sparse, step_cache), args + extra)
                times.compile += time.perf_counter() - start
                current = (k, step_sparse)
            start = time.perf_counter()
            step_args = (params, state, place(jnp.int32(i)), cond, uncond, guidance[k], image, kv)
            if step_cache is None:
                state, ok = program(*step_args)
            else:
                state, ok, cache_state, computed, ratios = program(*step_args, *extra)
                extra = (cache_state, *extra[1:])
                decisions.append((computed, ratios))
            finite.append(ok)
            jax.block_until_ready(state.sample)
            elapsed = time.perf_counter() - start
            if i == scheduler.start:
                times.first = elapsed
            else:
                times.steady.append(elapsed)
            if on_step:
                on_step(i, elapsed)
        report = None if step_cache is None else cache_report(step_cache, decisions, times)
        carry = None
        if step_cache is not None and step_cache.taylor is not None:
            steps = scheduler.num_inference_steps - scheduler.start
            last = place(jnp.int32(int(to_host(extra[0]["last"])) - steps))
            carry = CacheCarry({**extra[0], "last": last}, calls_before + steps)
        final = state.sample
        if is_first_frame(image):
            final = image.impose(final)
        result = Denoised(
            final,
            times,
            report,
            tuple(experts[scheduler.start :]),
            finite_flags=tuple(finite),
            sparse_steps=tuple(sparse_steps),
            sparse_attention=sparse,
            cache_carry=carry,
        )
        if check_finite:
            result.check_finite(self.model.dtype)
        return result

    def _step_cache(
        self,
        cache: CacheConfig | None,
        scheduler: Scheduler,
        guided: bool,
        experts: Sequence[int] | None,
        image: Any,
        time_inputs: Callable[[bool], np.ndarray] | None = None,
        calls_before: int = 0,
    ) -> StepCache | None:
        """``cache`` resolved for this run's schedule (:func:`~wanjax.sampling.cache.step_cache.resolve`)."""
        if cache is None:
            return None
        steps, first = scheduler.num_inference_steps, is_first_frame(image)
        sigmas = scheduler.sigmas
        return resolve(
            cache, self.model.cfg, steps, guided, experts, first, time_inputs, sigmas, calls_before
        )

    def _time_inputs(
        self, scheduler: Scheduler, frames: int, first_frame: bool
    ) -> Callable[[bool], np.ndarray]:
        """TeaCache's modulated input of each step (one sample's, float32): the time embedding of the
        step's timestep as the transformer sees it (per latent frame, the first at 0, for TI2V's
        first frame), or with ``ret_steps`` the blocks' modulation."""

        def inputs(ret_steps: bool) -> np.ndarray:
            times = jnp.stack([scheduler.model_timestep(i) for i in range(scheduler.num_inference_steps)])
            if first_frame:
                times = jnp.repeat(times[:, None], frames, axis=1).at[:, 0].set(0.0)
            temb, time_mod = jax.jit(self.model.embed_time)(self.experts[0].params, times)
            return to_host(time_mod if ret_steps else temb).astype(np.float32)

        return inputs

    def _cache_specs(
        self, cache: StepCache, latents_shape: tuple[int, ...], expert: int = 0
    ) -> tuple[tuple[Any, ...], Any]:
        """The cached program's extra inputs, abstract (cache state, the MagCache schedule, the
        threshold, the expert's first step), and the cache state's shardings: under a mesh the
        tokens' layout for what is shaped as the tokens, the rest replicated."""
        model = self.experts[expert]
        rows = latents_shape[0] * len(cache.branches)
        shape = (rows, *latents_shape[1:])
        length = math.prod(s // p for s, p in zip(shape[2:], model.cfg.patch_size, strict=True))
        tokens = jax.ShapeDtypeStruct((rows, length, model.cfg.inner_dim), model.dtype)
        velocity = jax.ShapeDtypeStruct((rows, model.cfg.out_channels, *shape[2:]), model.dtype)
        layout = model.token_layout(shape)
        placement = self._placement(model.params)

        def sharding(s: jax.ShapeDtypeStruct) -> Any:
            if layout is not None and s.shape == tokens.shape:
                return NamedSharding(model.settings.mesh, layout.tokens())
            return placement  # replicated under a mesh, as the sampler's state

        state = {
            name: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding(s))
            for name, s in state_shapes(cache, tokens, velocity).items()
        }
        scalars = [(cache.schedule.shape, cache.schedule.dtype), ((), jnp.float32), ((), jnp.int32)]
        rest = tuple(jax.ShapeDtypeStruct(shape, dtype, sharding=placement) for shape, dtype in scalars)
        shardings = None if model.settings.mesh is None else {k: s.sharding for k, s in state.items()}
        return (state, *rest), shardings

    def _cache_inputs(
        self,
        cache: StepCache,
        latents: jax.Array,
        place: Callable[[Any], Any],
        expert: int = 0,
        first: int = 0,
    ) -> tuple[Any, ...]:
        """The cached program's extra inputs for expert ``expert`` from step ``first`` on (zero cache
        state, the MagCache schedule, the threshold, ``first``; :meth:`_cache_specs`)."""
        (state, *_), _ = self._cache_specs(cache, latents.shape, expert)
        zeros = {
            name: jax.jit(functools.partial(jnp.zeros, s.shape, s.dtype), out_shardings=s.sharding)()
            for name, s in state.items()
        }
        schedule = place(jnp.asarray(cache.schedule))
        return zeros, schedule, place(jnp.float32(cache.threshold)), place(jnp.int32(first))


def schedule_key(scheduler: Scheduler) -> tuple[Any, ...]:
    """What of a scheduler a compiled step holds as constants (its coefficient table: a run started
    part-way warms up from its ``start``; a distilled model's own timesteps and sigmas)."""
    tables = tuple(np.asarray(scheduler.timesteps).tolist()), tuple(np.asarray(scheduler.sigmas).tolist())
    return scheduler.kind, scheduler.config, scheduler.num_inference_steps, scheduler.start, tables


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """Which step program a step runs: its scheduler's, expert ``expert``'s, dense or (``sparse``)
    with radial attention, without or (``cache``) under a step cache."""

    scheduler: Scheduler
    expert: int = 0
    sparse: RadialAttention | None = None
    cache: StepCache | None = None

    def key(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """The program's key for the step's ``args`` (a cached step's: its cache inputs too; a sparse
        step's: the dense step's key behind the radial settings)."""
        key = (self.expert, *schedule_key(self.scheduler), signature(args))
        if self.cache is not None:
            key = ("cached", self.expert, *self.cache.key, *key[1:])
        return key if self.sparse is None else ("sparse", self.sparse, *key)


def expert_schedule(scheduler: Scheduler, boundary_ratio: float | None) -> list[int]:
    """The expert of each step: 0 (the high-noise ``transformer``) while the step's timestep is at
    least ``boundary_ratio * num_train_timesteps``, 1 (``transformer_2``) after; all 0 without a
    boundary. Compared in float32, as diffusers' ``t >= boundary_timestep`` promotes a timestep
    tensor and a Python float."""
    steps = scheduler.num_inference_steps
    if boundary_ratio is None:
        return [0] * steps
    boundary = np.float32(boundary_ratio * scheduler.config.num_train_timesteps)
    timesteps = np.asarray(scheduler.timesteps).astype(np.float32)
    return [0 if t >= boundary else 1 for t in timesteps[:steps]]


def cache_report(
    cache: StepCache, decisions: list[tuple[jax.Array, jax.Array]], times: StepTimes
) -> CacheReport:
    """What the cache decided at each step (read back once, after the loop) and the seconds it saved:
    at each step where no branch computed, the median computing step's time minus its own."""
    computed = np.array([to_host(c) for c, _ in decisions], bool).reshape(len(decisions), -1)
    per_branch = {name: computed[:, k].tolist() for k, name in enumerate(cache.branches)}
    ratios = None
    if cache.calibrate:
        values = np.array([to_host(r) for _, r in decisions], np.float64).reshape(len(decisions), -1)
        ratios = {name: values[:, k].tolist() for k, name in enumerate(cache.branches)}
    seconds = [times.first, *times.steady]
    full = [t for i, t in enumerate(seconds) if i > 0 and computed[i].any()]
    saved = None
    if full:
        typical = statistics.median(full)
        saved = sum(max(0.0, typical - t) for i, t in enumerate(seconds) if not computed[i].any())
    return CacheReport(cache, per_branch, ratios, saved)
