"""Text to video: ``WanPipeline``, the Python API, as three stages (encode, denoise, decode).

``pipe(prompt)`` equals diffusers' ``WanPipeline.__call__`` (same defaults, same numerics; the noise
is drawn with JAX's generator, so pass ``latents`` to reproduce a diffusers run) and returns
``uint8 [B, T, H, W, 3]`` frames. The stages are also methods, so each can run on its own:

* :meth:`WanPipeline.encode_prompt`: prompts -> ``prompt_embeds``, ``negative_prompt_embeds``
  ``[B, max_sequence_length, text_dim]``;
* :meth:`WanPipeline.denoise`: noise + embeddings -> the transformer's normalised latents
  ``[B, 16, T', H/8, W/8]`` (diffusers' ``output_type="latent"``);
* :meth:`WanPipeline.decode`: latents -> ``uint8`` frames.

The pipeline is built from its :class:`~wanjax.pipeline.loading.Components` (read on first use, so
a stage loads only its own weights; their settings, what the checkpoint says, where the weights wait
under ``offload``) and runs with :class:`~wanjax.pipeline.options.RunOptions` (or diffusers' keyword
arguments). A run's results are what it returns (:mod:`wanjax.pipeline.results`); ``timings`` meters
the load / compile / run seconds of each stage of the last run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from wanjax.errors import WanjaxError
from wanjax.models.defaults import TEXT_LENGTH
from wanjax.models.dit import VaceControl
from wanjax.models.image_processor import ImageInput
from wanjax.parallel.layouts import to_host
from wanjax.pipeline import preparation
from wanjax.pipeline.animate import (
    AnimateConditioning,
    AnimateSources,
    Segments,
    animate,
    check_first_latents,
    decode_segments,
    prepare_inputs,
    run_segments,
)
from wanjax.pipeline.conditioning import open_image
from wanjax.pipeline.extension import Extension, extend
from wanjax.pipeline.hub import resolve_model
from wanjax.pipeline.inputs import (
    check_embeddings,
    check_image_input,
    check_video_latents,
    check_video_to_video,
)
from wanjax.pipeline.loading import COMPONENTS, Components, split_options
from wanjax.pipeline.options import RunOptions
from wanjax.pipeline.results import Video
from wanjax.pipeline.sources import base_model, base_variant, component_files
from wanjax.pipeline.video_input import VideoInput
from wanjax.runtime.jax_cache import enable_compilation_cache
from wanjax.runtime.timing import StageTiming
from wanjax.sampling.cache.step_cache import CacheCarry
from wanjax.sampling.guidance import ImageConditioning
from wanjax.sampling.results import Denoised
from wanjax.sampling.sampler import Sampler

if TYPE_CHECKING:
    pass

Prompt = str | Sequence[str]

# What ``pipe.<name>`` gives of its components: the components themselves (as diffusers' pipelines
# have them), the registry's defaults for the checkpoint, the LoRAs, the stage timings, and loading all
FORWARDED = (*COMPONENTS, "defaults", "set_loras", "load", "timings")


class WanPipeline:
    """Wan text, image or video to video (any variant of :mod:`wanjax.models.registry`): build it with
    :meth:`from_pretrained`, or from :class:`~wanjax.pipeline.loading.Components`; see the module
    docstring. ``pipe.vae``, ``pipe.transformer``, ... (:data:`FORWARDED`) are its components'."""

    def __init__(self, components: Components):
        self.components = components
        self._sampler: Sampler | None = None

    def __getattr__(self, name: str) -> Any:
        if name in FORWARDED:
            return getattr(self.__dict__["components"], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @classmethod
    def from_pretrained(
        cls,
        model: str | Any | None,
        dtype: Any = "bfloat16",
        *,
        jax_cache_dir: str | Any | bool | None = None,
        revision: str | None = None,
        download: bool = False,
        **options: Any,
    ) -> WanPipeline:
        """A pipeline for ``model``: a diffusers-layout directory, a hub repo id in the local Hugging
        Face cache (at ``revision``: a branch, tag or commit; fetched first with ``download=True``), or
        ``"demo"`` (the built-in smoke model); None with a ``transformer`` file: the model of the
        variant the registry recognises it as (its hub repository, or a demo). ``jax_cache_dir``:
        JAX's persistent compilation cache, which is process-wide ``jax.config`` -- ``None`` or
        ``False`` (default): JAX's configuration is left as it is; a path or URL: turned on there;
        ``True``: turned on in the default directory (as the CLI does, see ``docs/environment.md``);
        ``"off"``: turned off. ``dtype`` and ``options``: the fields of
        :class:`~wanjax.pipeline.loading.LoadSettings`, components built already or a component's
        file by name (``text_encoder``, ``image_encoder``, ``transformer``, ``transformer_2``,
        ``vae``), and LoRAs (``loras``, ``loras_2``: ``[(file, weight), ...]``).
        """
        if jax_cache_dir is not None and jax_cache_dir is not False:
            enable_compilation_cache(None if jax_cache_dir is True else jax_cache_dir)
        settings, given, loras = split_options({"dtype": dtype, **options})
        if model is None:
            model = base_model(base_variant(component_files(given)))
        source = resolve_model(model, revision=revision, download=download)
        return cls(Components(source, settings, given, **loras))

    # ------------------------------------------------------------------------------------------
    # The three stages

    def encode_prompt(
        self, prompt: Prompt, negative_prompt: Prompt | None = None, max_sequence_length: int = TEXT_LENGTH
    ) -> tuple[jax.Array, jax.Array]:
        """``(prompt_embeds, negative_prompt_embeds)``, each ``[B, max_sequence_length, text_dim]``
        in the text encoder's dtype; as diffusers' ``encode_prompt`` (negative prompt ``""`` when None).
        Both are encoded in one batch."""
        parts = self.components
        parts.enter("encode")
        encoder = parts.text_encoder
        with parts.stage_timing("encode").running():
            embeds = encoder.encode_prompt(prompt, negative_prompt, max_sequence_length)
            jax.block_until_ready(embeds)
        return embeds

    def prepare_latents(
        self, batch: int, height: int, width: int, num_frames: int, seed: int, segment: int = 0
    ) -> jax.Array:
        """Standard normal float32 noise ``[B, z, T', H/8, W/8]`` (JAX's generator); batch item ``i`` is
        drawn from ``seed + i``, so a prompt in a batch starts from the noise it gets when run alone
        with that seed. ``segment``: an Animate run's segment after the first draws from its own
        stream of that key (``fold_in``)."""
        parts = self.components
        shape = parts.geometry.latent_shape(batch, height, width, num_frames)
        with parts.stage_timing("denoise").running():
            keys = [jax.random.key(seed + i) for i in range(batch)]
            keys = jnp.stack([jax.random.fold_in(k, segment) if segment else k for k in keys])
            noise = jax.vmap(lambda key: jax.random.normal(key, shape[1:], jnp.float32))(keys)
            jax.block_until_ready(noise)
        return noise

    def denoise(
        self,
        prompt_embeds: jax.Array,
        negative_prompt_embeds: jax.Array | None,
        latents: jax.Array,
        *,
        options: RunOptions | None = None,
        image: ImageConditioning | None = None,
        video_latents: np.ndarray | None = None,
        vace: VaceControl | None = None,
        on_step: Callable[[int], None] | None = None,
        progress: bool = True,
        cache_carry: CacheCarry | None = None,
        **values: Any,
    ) -> Denoised:
        """Denoise ``latents`` (float32 noise) with classifier-free guidance: the transformer's
        normalised latents, float32, and how the run went (:class:`~wanjax.sampling.results.Denoised`:
        step times, cache report, experts, mesh usage). ``options`` (and diffusers' keyword arguments
        ``values`` over them): steps, guidance, scheduler, seed, step cache, a two-expert model's
        second guidance and boundary, a video's strength (:class:`~wanjax.pipeline.options.RunOptions`;
        left out: the model's). ``image``: an image-to-video model's conditioning
        (:func:`~wanjax.pipeline.preparation.image_conditioning`), required by such a model. Video to video (a text-to-video model):
        ``video_latents``, the source video's normalised latents (:func:`~wanjax.pipeline.preparation.video_latents`), noised with
        ``latents`` to the first of the last ``int(steps * strength)`` steps, which alone run, as
        diffusers' ``WanVideoToVideoPipeline``. A VACE model: ``vace``, its control
        (:func:`~wanjax.pipeline.preparation.vace_control`), required by such a model. ``on_step(done)`` is called after each step
        with the number of steps done (an exception it raises stops the denoising). ``cache_carry``: a
        previous run's TaylorSeer state to continue (:class:`~wanjax.sampling.cache.step_cache.CacheCarry`)."""
        from tqdm import tqdm

        parts = self.components
        o = RunOptions.of(options, values)
        if video_latents is None and o.strength is not None:
            raise WanjaxError("a strength is for video to video: give the source video's latents too")
        o = o.filled(parts.defaults, video=video_latents is not None)
        parts.enter("denoise")
        model, second = parts.transformer, parts.transformer_2
        self._check_denoise(model, second, o, image, vace)
        check_embeddings(model, prompt_embeds, negative_prompt_embeds, latents, o.guidance_scale)
        if vace is not None:
            rows = latents.shape[0]
            vace = VaceControl(jnp.tile(jnp.asarray(vace.latents), (rows, 1, 1, 1, 1)), vace.scale)
        if video_latents is not None:
            check_video_latents(model.cfg, image is not None, video_latents.shape, latents.shape)
        cfg_pair = negative_prompt_embeds is not None and o.guidance_scale > 1  # run as one batch
        layout = model.token_layout((latents.shape[0] * (2 if cfg_pair else 1), *latents.shape[1:]))
        mesh_usage = None if layout is None else layout.describe(dict(parts.mesh.shape))
        if self._sampler is None:
            self._sampler = Sampler(model, second)
        with parts.stage_timing("denoise").running():
            steps = parts.build_scheduler(
                o.num_inference_steps, o.flow_shift, o.scheduler, o.seed, o.strength
            )
            if video_latents is not None:
                latents = steps.noised(to_host(video_latents), to_host(latents))
            cond = jnp.asarray(prompt_embeds).astype(model.dtype)
            uncond = None if negative_prompt_embeds is None else jnp.asarray(negative_prompt_embeds)
            uncond = None if uncond is None else uncond.astype(model.dtype)
            runs = o.num_inference_steps - steps.start
            with tqdm(total=runs, desc="denoise", unit="step", disable=None if progress else True) as bar:
                result = self._sampler(
                    steps,
                    jnp.asarray(latents, jnp.float32),
                    cond,
                    uncond,
                    o.guidance_scale,
                    on_step=lambda i, seconds: (bar.update(), on_step and on_step(i + 1 - steps.start)),
                    check_finite=True,
                    cache=o.cache,
                    image=image if vace is None else vace,
                    boundary_ratio=o.boundary_ratio if o.boundary_ratio is not None else parts.boundary_ratio,
                    guidance_scale_2=o.guidance_scale_2,
                    on_expert=parts.switch_expert,
                    sparse=o.sparse_attention,
                    cache_carry=cache_carry,
                )
        return dataclasses.replace(result, mesh_usage=mesh_usage)

    def _check_denoise(
        self,
        model: Any,
        second: Any,
        o: RunOptions,
        image: ImageConditioning | None,
        vace: VaceControl | None,
    ) -> None:
        """WanjaxError for a denoise the model cannot run: expert options without two experts, an
        image model without its image (or the reverse), a VACE model without its control (or the
        reverse)."""
        if second is None and (o.guidance_scale_2 is not None or o.boundary_ratio is not None):
            raise WanjaxError(
                "guidance_scale_2 and boundary_ratio are for two-expert models (Wan 2.2 A14B: transformer_2)"
            )
        if model.cfg.image_to_video != (image is not None) and not self.components.expand_timesteps:
            raise WanjaxError(
                "an image-to-video model needs an image (pipe(prompt, image=...))"
                if image is None
                else "an image was given but this is a text-to-video model"
            )
        if model.cfg.vace != (vace is not None):
            raise WanjaxError(
                "a VACE model needs its control (pipe(prompt, video=..., mask=..., reference_images=...))"
                if vace is None
                else "a VACE control was given but this is not a VACE model"
            )

    def decode(
        self, latents: jax.Array, progress: bool = False, on_frames: Callable[[int], None] | None = None
    ) -> np.ndarray:
        """The transformer's normalised latents ``[B, z, T', h, w]`` -> ``uint8 [B, T, H, W, 3]`` (on a
        mesh each device a spatial strip). ``progress``: a bar over the latent frames on a terminal;
        ``on_frames(done)`` after each part; either decodes in parts
        (:meth:`~wanjax.models.vae.WanVAE.decode_uint8`)."""
        from tqdm import tqdm

        parts = self.components
        parts.enter("decode")
        vae, off = parts.vae, None if progress else True
        with (
            parts.stage_timing("decode").running(),
            tqdm(total=latents.shape[2], desc="decode", disable=off) as bar,
        ):
            count = lambda done, _: (bar.update(done - bar.n), on_frames and on_frames(done))  # noqa: E731
            placed = parts.video_placement()(jnp.asarray(latents, jnp.float32))
            frames = to_host(vae.decode_uint8(placed, count if not bar.disable or on_frames else None))
        return frames

    # ------------------------------------------------------------------------------------------
    # A whole run

    def __call__(
        self,
        prompt: Prompt,
        negative_prompt: Prompt | None = None,
        *,
        options: RunOptions | None = None,
        image: ImageInput | None = None,
        last_image: ImageInput | None = None,
        video: VideoInput | None = None,
        mask: VideoInput | ImageInput | None = None,
        reference_images: Sequence[ImageInput] = (),
        pose_video: VideoInput | None = None,
        face_video: VideoInput | None = None,
        background_video: VideoInput | None = None,
        mask_video: VideoInput | None = None,
        latents: jax.Array | np.ndarray | None = None,
        progress: bool = True,
        on_step: Callable[[int], None] | None = None,
        **values: Any,
    ) -> Video:
        """Generate videos: a :class:`~wanjax.pipeline.results.Video` whose ``frames`` are
        ``uint8 [B, num_frames, height, width, 3]``, one video per prompt. ``options`` (and diffusers'
        keyword arguments ``values`` over them: ``height``, ``num_frames``, ``num_inference_steps``,
        ``guidance_scale``, ``seed``, ``cache``, ...; :class:`~wanjax.pipeline.options.RunOptions`):
        left out, the model's (``pipe.defaults``, as ``wanjax generate`` and the server use), the size
        with an image that area with the image's aspect (:func:`~wanjax.pipeline.preparation.video_size`).

        ``latents``: starting noise ``[B, 16, T', H/8, W/8]`` instead of drawing it from ``seed``.
        ``on_step(done)``: after each denoising step (:meth:`denoise`).
        ``image`` (and ``last_image``): the first (and last) frame for an image-to-video model (a PIL
        image, a path or uint8 pixels), resized to ``width x height`` (:func:`~wanjax.pipeline.preparation.image_conditioning`).
        ``video``: video to video (a text-to-video model): a file (read at ``fps``), images or ``uint8
        [T, H, W, 3]`` frames, its first ``num_frames`` (left out: the model's, or as many as the video
        has, ``4n+1``) re-noised to ``strength`` and denoised; ``latents`` is then the noise. A VACE
        model (as diffusers' ``WanVACEPipeline``): ``video`` is the control video (none: black),
        ``mask`` its mask (a video of as many frames, or one image for all; white: generate, black:
        keep), ``reference_images`` each prepended as a frame of its own (dropped from the result),
        the ``conditioning_scale`` option the control's weight (:func:`~wanjax.pipeline.preparation.vace_control`).
        An Animate model (as diffusers' ``WanAnimatePipeline``, :mod:`~wanjax.pipeline.animate`):
        ``image`` the character, ``pose_video`` and ``face_video`` its motion, in ``mode="replace"``
        also ``background_video`` and ``mask_video``; ``latents`` the first segment's noise
        ``[B, 16, T' + 1, H/8, W/8]`` (``T'``: a segment's latent frames).
        """
        parts = self.components
        o = RunOptions.of(options, values)
        if parts.transformer_config.animate:
            if pose_video is None or image is None:
                raise WanjaxError(
                    "an Animate model needs a character image and a pose video (image=, pose_video=)"
                )
            filled = self._animate_options(o)
            given = AnimateSources(image, pose_video, face_video, background_video, mask_video)
            return animate(self, prompt, negative_prompt, filled, given, latents, progress, on_step)
        if any(v is not None for v in (pose_video, face_video, background_video, mask_video)):
            raise WanjaxError("pose, face, background and mask videos are for an Animate model")
        vace_model, frames = parts.transformer_config.vace, None
        if (mask is not None or reference_images) and not vace_model:
            raise WanjaxError("a mask and reference images are for a VACE model")
        if video is not None:
            if not vace_model:
                check_video_to_video(parts.transformer_config, image is not None)
            frames = preparation.read_video(parts, video, o.num_frames, o.fps)
            o = RunOptions.of(o, {"num_frames": len(frames)})
        o = o.filled(parts.defaults)
        references = len(reference_images) if vace_model else 0
        parts.timings.clear()
        if image is not None:
            image = open_image(image)
            last_image = None if last_image is None else open_image(last_image)
        check_image_input(
            parts.transformer_config,
            image is not None,
            last_image is not None,
            str(parts.path),
            parts.expand_timesteps,
        )
        height, width = preparation.video_size(
            parts, image if frames is None else frames[0], o.height, o.width
        )
        parts.geometry.check(height, width, o.num_frames)
        pos, neg = self.encode_prompt(prompt, negative_prompt, o.max_sequence_length)
        batch = pos.shape[0]
        noised_frames = o.num_frames + references * parts.geometry.temporal  # one latent frame each
        expected = parts.geometry.latent_shape(batch, height, width, noised_frames)
        if latents is None:
            latents = self.prepare_latents(batch, height, width, noised_frames, o.seed)
        elif tuple(latents.shape) != expected:
            raise WanjaxError(
                f"latents {tuple(latents.shape)} do not match {batch} prompt(s) at {width}x{height}, "
                f"{o.num_frames} frames (expected {expected}); pass the matching height/width/num_frames"
            )
        conditioning = source = vace = None
        if image is not None:
            conditioning = preparation.image_conditioning(
                parts, image, batch, height, width, o.num_frames, last_image
            )
        if vace_model:
            size = (height, width, o.num_frames, o.conditioning_scale, o.fps)
            vace = preparation.vace_control(parts, frames, mask, reference_images, *size)
        elif frames is not None:
            source = preparation.video_latents(parts, frames, height, width)
        options_run = RunOptions.of(o, {"height": height, "width": width})
        denoised = self.denoise(
            pos,
            neg,
            latents,
            options=options_run,
            image=conditioning,
            video_latents=source,
            vace=vace,
            on_step=on_step,
            progress=progress,
        )
        frames_out = self.decode(denoised.latents[:, :, references:], progress)
        return Video(frames_out, denoised, self.timings_so_far())

    # ------------------------------------------------------------------------------------------
    # An Animate model's stages (:mod:`~wanjax.pipeline.animate`): what ``__call__`` runs, in parts

    def prepare_animate(
        self,
        image: ImageInput,
        pose_video: VideoInput,
        face_video: VideoInput | None,
        background_video: VideoInput | None = None,
        mask_video: VideoInput | None = None,
        *,
        options: RunOptions | None = None,
        **values: Any,
    ) -> AnimateConditioning:
        """An Animate model's inputs beside :meth:`encode_prompt` (stage 1): the videos read and
        prepared, the character's CLIP states and reference latents, the segments (``options`` and
        ``values`` as :meth:`__call__`'s: the size, ``mode``, ``fps``, ``num_frames``, the segments)."""
        o = self._animate_options(RunOptions.of(options, values))
        return prepare_inputs(
            self, o, AnimateSources(image, pose_video, face_video, background_video, mask_video)
        )

    def denoise_segments(
        self,
        prompt_embeds: jax.Array | np.ndarray,
        negative_prompt_embeds: jax.Array | np.ndarray | None,
        conditioning: AnimateConditioning,
        latents: jax.Array | np.ndarray | None = None,
        *,
        options: RunOptions | None = None,
        on_step: Callable[[int], None] | None = None,
        progress: bool = True,
        **values: Any,
    ) -> list[Denoised]:
        """Each segment of an Animate run denoised in turn (stage 2), each conditioned on the last
        frames of the one before, decoded here by the VAE; ``latents``: the first segment's noise
        (left out: the seed's). Their latents are what :meth:`decode_segments` takes."""
        height, width = conditioning.videos.size
        run = RunOptions.of(
            self._animate_options(RunOptions.of(options, values)), {"height": height, "width": width}
        )
        if latents is not None:
            segments = conditioning.videos.segments
            check_first_latents(
                self.components.geometry, latents, prompt_embeds.shape[0], height, width, segments
            )
        pos, neg = prompt_embeds, negative_prompt_embeds
        runs = run_segments(self, conditioning, pos, neg, run, latents, on_step, progress, False)
        return [denoised for denoised, _ in runs]

    def decode_segments(self, segments: Segments, latents: Sequence[jax.Array | np.ndarray]) -> np.ndarray:
        """An Animate run's video (stage 3), ``uint8 [B, N, H, W, 3]``: each segment's latents decoded,
        the frames a segment repeats dropped, cut to the pose video's frames."""
        return decode_segments(self.components, segments, latents)

    def _animate_options(self, o: RunOptions) -> RunOptions:
        """``o`` filled with the model's defaults but ``num_frames`` (left out: the pose video's);
        WanjaxError on a model that is not an Animate model."""
        if not self.components.transformer_config.animate:
            raise WanjaxError(
                f"{self.components.path} is not an Animate model (prepare_animate, denoise_segments)"
            )
        return dataclasses.replace(o.filled(self.components.defaults), num_frames=o.num_frames)

    def extend(self, prompt: Prompt, video: VideoInput | None = None, **kwargs: Any) -> Extension:
        """A VACE model's long video: ``video`` continued clip by clip (:func:`wanjax.pipeline.extension.extend`)."""
        return extend(self, prompt, video, **kwargs)

    def timings_so_far(self) -> dict[str, StageTiming]:
        """A copy of the stage timings, which later work on this pipeline leaves as they are."""
        return {stage: dataclasses.replace(t) for stage, t in self.components.timings.items()}
