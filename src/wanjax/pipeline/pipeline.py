"""Text to video: ``WanPipeline``, the Python API, as three stages (encode, denoise, decode).

``pipe(prompt)`` equals diffusers' ``WanPipeline.__call__`` (same defaults, same numerics; the noise
is drawn with JAX's generator, so pass ``latents`` to reproduce a diffusers run) and returns
``uint8 [B, T, H, W, 3]`` frames. The stages are also methods, so each can run on its own:

* :meth:`WanPipeline.encode_prompt`: prompts -> ``prompt_embeds``, ``negative_prompt_embeds``
  ``[B, max_sequence_length, text_dim]``;
* :meth:`WanPipeline.denoise`: noise + embeddings -> the transformer's normalised latents
  ``[B, 16, T', H/8, W/8]`` (diffusers' ``output_type="latent"``);
* :meth:`WanPipeline.decode`: latents -> ``uint8`` frames.

Components are loaded on first use, so a stage loads only its own weights. ``timings`` meters the
load / compile / run seconds of each stage since :meth:`WanPipeline.reset_timings`; a run's own
results (the denoising's step times, cache report, experts; a video's frames and timings) are what
it returns (:mod:`wanjax.pipeline.results`).

``offload`` (:mod:`wanjax.models.offload`) says which weights stay in device memory: ``"none"``
(all, once loaded), ``"model"`` (stage-wise: only the running stage's component; the others wait in
pinned host memory, so a second prompt moves them back instead of reading the checkpoint again; the
text encoder, run once per stage, streams its layers from there), ``"blocks"`` (as ``"model"``, and
the transformer's layers are streamed from host memory one at a time during each step). The VAE,
small beside the other two, stays where it was loaded.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from wanjax.errors import WanjaxError
from wanjax.io.lora import LoraFile
from wanjax.io.quantizable import UNQUANTIZED
from wanjax.io.quantizable import weights_dtype as weights_storage
from wanjax.kernels.attention import AttentionSpec
from wanjax.kernels.precision import Precision, parse_precision, resolve_precision
from wanjax.models.clip_vision import CLIPVisionEncoder
from wanjax.models.config import TransformerConfig, parse_dtype
from wanjax.models.defaults import TEXT_LENGTH
from wanjax.models.dit import TRANSFORMER, VaceControl, WanTransformer
from wanjax.models.image_processor import ImageInput
from wanjax.models.lora import LoraSpec
from wanjax.models.offload import Offload, parse_offload
from wanjax.models.registry import Defaults, Variant, defaults_for, match
from wanjax.models.umt5 import UMT5Encoder
from wanjax.models.vae import Tiling, WanVAE, parse_chunk
from wanjax.parallel.layouts import spatial_sharding, to_global, to_host
from wanjax.parallel.mesh import MeshSpec, make_mesh, mesh_spec_from_flags
from wanjax.pipeline.conditioning import (
    check_image_size,
    conditioning_latents,
    first_frame_latents,
    open_image,
    size_for_image,
)
from wanjax.pipeline.extension import Extension, extend
from wanjax.pipeline.hub import ModelSource, resolve_model
from wanjax.pipeline.inputs import (
    check_embeddings,
    check_image_input,
    check_video_latents,
    check_video_to_video,
)
from wanjax.pipeline.loading import PipelineComponents
from wanjax.pipeline.model_index import read_model_index
from wanjax.pipeline.residency import Loaded, Residency
from wanjax.pipeline.results import Video
from wanjax.pipeline.sources import ComponentSources, base_model, base_variant, component_files
from wanjax.pipeline.vace import control_latents, layer_scales
from wanjax.pipeline.video_input import VideoInput, frames_that_fit, mask_frames, source_latents, video_frames
from wanjax.runtime.jax_cache import enable_compilation_cache
from wanjax.runtime.timing import StageTiming
from wanjax.sampling.cache.step_cache import CacheConfig
from wanjax.sampling.results import Denoised
from wanjax.sampling.sampler import ImageConditioning, Sampler
from wanjax.sampling.scheduler import Scheduler, make_scheduler

if TYPE_CHECKING:
    from PIL import Image

Prompt = str | Sequence[str]


class WanPipeline(PipelineComponents):
    """Wan text, image or video to video (any variant of :mod:`wanjax.models.registry`). Build it with
    :meth:`from_pretrained`; see the module docstring.

    ``dtype``: transformer (and, unless ``text_encoder_dtype`` says otherwise, text encoder)
    weights and activations; ``vae_dtype``: the VAE's activations, ``vae_weights_dtype`` its
    weights (default: ``vae_dtype``). ``vae_decode_chunk``: latent frames per VAE decode step
    (an int or ``"all"``; the frames are the same whatever it is). ``vae_tiling``: decode in
    blended spatial tiles (``True``: diffusers' 256-pixel tiles every 192; or a
    :class:`~wanjax.models.vae.tiling.Tiling`), for frames too large to decode whole; not equal to an
    untiled decode at the seams. Weights are read when a stage first needs them.
    ``mesh``: run sharded over all devices -- a :class:`~wanjax.parallel.mesh.MeshSpec`, a string
    such as ``"dp=2,sp=1,tp=4"``, or ``"auto"``; ``None`` runs on one device. ``fsdp`` also
    splits the weights' model dimension over the non-tp axes. ``precision``: of the float32
    matmuls of the transformer and text encoder, ``vae_precision``: of the VAE's float32
    convolutions and matmuls (``highest | high | default``, JAX's names; ``None``: the platform's
    default, see :func:`~wanjax.kernels.precision.default_precision`; :attr:`precisions` tells
    what each component runs at). ``offload``: which weights stay in device memory between and
    during stages -- ``"none"`` (all), ``"model"`` (only the running stage's component; the
    frames are bit-identical to ``"none"``) or ``"blocks"`` (as ``"model"``, and the transformer's
    layer weights are streamed from host memory during each step); see the module docstring.
    ``weights_dtype``: ``"bf16"`` (the weights in ``dtype``), ``"int8"`` or ``"fp8"``: the
    transformer's and text encoder's matmul kernels stored in 8 bits with a float32 scale per
    output channel (:mod:`wanjax.io.quant`; error bounds in the README); ``"gguf"``: a GGUF file's
    quantised kernels kept as stored (:mod:`wanjax.io.gguf_kernel`). ``loras``: LoRA adapters
    ``[(file, weight), ...]`` merged into the transformer's weights; ``loras_2``: into a two-expert
    model's ``transformer_2`` (:meth:`set_loras`). ``text_encoder``, ``image_encoder``,
    ``transformer``, ``transformer_2``, ``vae``: components already built (as diffusers' pipelines
    take them), used instead of reading the checkpoint's; or a component's weights in one file (a
    path: safetensors or GGUF, diffusers' or the original Wan layout, fp8-scaled; see
    :mod:`wanjax.pipeline.sources`), read instead of the model's with the model's config. The
    dtype, mesh and offload options apply to the components the pipeline loads itself.
    """

    def __init__(
        self,
        source: ModelSource,
        dtype: Any = "bfloat16",
        *,
        text_encoder_dtype: Any = None,
        vae_dtype: Any = "float32",
        vae_weights_dtype: Any = None,
        vae_decode_chunk: int | str = 1,
        vae_tiling: Tiling | bool | None = None,
        attention_backend: str | AttentionSpec = "auto",
        mesh: MeshSpec | str | None = None,
        fsdp: bool = False,
        precision: str | None = None,
        vae_precision: str | None = None,
        offload: Offload | str = "none",
        weights_dtype: str = UNQUANTIZED,
        loras: Sequence[LoraSpec] = (),
        loras_2: Sequence[LoraSpec] = (),
        text_encoder: UMT5Encoder | str | Path | None = None,
        image_encoder: CLIPVisionEncoder | str | Path | None = None,
        transformer: WanTransformer | str | Path | None = None,
        transformer_2: WanTransformer | str | Path | None = None,
        vae: WanVAE | str | Path | None = None,
    ):
        given = {
            "text_encoder": text_encoder,
            "image_encoder": image_encoder,
            "transformer": transformer,
            "transformer_2": transformer_2,
            "vae": vae,
        }
        self.sources = ComponentSources(source.path, component_files(given))
        text_encoder, image_encoder, transformer, transformer_2, vae = (
            None if name in self.sources.files else value for name, value in given.items()
        )
        self.source = source
        self.model_index = read_model_index(source.path)  # an entry wanjax does not act on fails here
        self.offload = parse_offload(offload)
        self.residency = Residency(self.offload)
        weights_storage(weights_dtype)  # a bad name fails now, before any weight is read
        self.weights_dtype = weights_dtype
        self._mesh_request = mesh
        self._fsdp = fsdp
        self.path = source.path
        self.dtype = parse_dtype(dtype)
        self.text_encoder_dtype = parse_dtype(text_encoder_dtype or dtype)
        self.vae_dtype = parse_dtype(vae_dtype)
        self.vae_weights_dtype = parse_dtype(vae_weights_dtype or vae_dtype)
        self.vae_decode_chunk = parse_chunk(vae_decode_chunk, "vae_decode_chunk")
        self.vae_tiling = Tiling() if vae_tiling is True else vae_tiling or None
        self.attention_backend = attention_backend
        # parsed now (a bad value fails here), resolved against the platform when used
        self.precision = None if precision is None else parse_precision(precision)
        self.vae_precision = None if vae_precision is None else parse_precision(vae_precision)
        self.timings: dict[str, StageTiming] = {}
        # components built by the caller are used as they are; the others are read when first needed
        self._text_encoder = text_encoder
        self._transformer = transformer
        self._transformer_2 = transformer_2
        self._sampler: Sampler | None = None
        self._vae = vae
        self._image_encoder = image_encoder
        self.loras: list[tuple[LoraFile, float]] = []
        self.loras_2: list[tuple[LoraFile, float]] = []
        self.set_loras(loras)
        self.set_loras(loras_2, load_into_transformer_2=True)

    @classmethod
    def from_pretrained(
        cls,
        model: str | Path | None,
        dtype: Any = "bfloat16",
        *,
        jax_cache_dir: str | Path | bool | None = None,
        revision: str | None = None,
        download: bool = False,
        **options: Any,
    ) -> WanPipeline:
        """A pipeline for ``model``: a diffusers-layout directory, a hub repo id in the local Hugging
        Face cache (at ``revision``: a branch, tag or commit; fetched first with ``download=True``), or
        ``"demo"`` (the built-in smoke model); None with a ``transformer`` file: the model of the
        variant the registry recognises it as (its hub repository, or a demo). ``jax_cache_dir``: JAX's persistent compilation cache,
        which is process-wide ``jax.config`` -- ``None`` or ``False`` (default): JAX's configuration
        is left as it is; a path or URL: turned on there; ``True``: turned on in the default directory
        (as the CLI does, see ``docs/environment.md``); ``"off"``: turned off. ``dtype`` and
        ``options``: :class:`WanPipeline`'s own arguments.
        """
        if jax_cache_dir is not None and jax_cache_dir is not False:
            enable_compilation_cache(None if jax_cache_dir is True else jax_cache_dir)
        if model is None:
            model = base_model(base_variant(component_files(options)))
        return cls(resolve_model(model, revision=revision, download=download), dtype, **options)

    # ------------------------------------------------------------------------------------------
    # Components, loaded on first use

    def reset_timings(self) -> None:
        """Forget the stage timings of earlier runs (a new run's report starts empty)."""
        self.timings = {}

    def stage_timing(self, stage: str) -> StageTiming:
        return self.timings.setdefault(stage, StageTiming())

    def timings_so_far(self) -> dict[str, StageTiming]:
        """A copy of the stage timings, which later work on this pipeline leaves as they are."""
        return {stage: dataclasses.replace(t) for stage, t in self.timings.items()}

    @functools.cached_property
    def mesh_spec(self) -> MeshSpec | None:
        """The mesh requested at construction, resolved against the devices (``None``: one device)."""
        request = self._mesh_request
        if request is None:
            return None
        if isinstance(request, MeshSpec):
            return dataclasses.replace(request, fsdp=request.fsdp or self._fsdp)
        heads = self.transformer_config.num_attention_heads
        return mesh_spec_from_flags(request, jax.device_count(), heads=heads, use_fsdp=self._fsdp)

    @functools.cached_property
    def transformer_config(self) -> TransformerConfig:
        """The transformer's config (read from its ``config.json``, no weights)."""
        return self.sources.config(TRANSFORMER)

    @functools.cached_property
    def variant(self) -> Variant | None:
        """This checkpoint's entry in the model registry (:func:`wanjax.models.registry.match`), or None."""
        kind = dict(expand_timesteps=self.expand_timesteps, demo=self.source.is_demo, dmd=self.dmd)
        return match(self.transformer_config, self.experts, self.source.name, **kind)

    @functools.cached_property
    def defaults(self) -> Defaults:
        """The video and sampling values a run leaves out: the registry's for this checkpoint
        (:func:`wanjax.models.registry.defaults_for`), the same for every entry point."""
        kind = dict(demo=self.source.is_demo, dmd=self.dmd)
        return defaults_for(
            self.transformer_config, self.experts, self.expand_timesteps, self.source.name, **kind
        )

    def build_scheduler(
        self,
        num_inference_steps: int,
        flow_shift: float | None = None,
        kind: str = "auto",
        seed: int = 0,
        strength: float | None = None,
    ) -> Scheduler:
        """The scheduler a run of this checkpoint builds (:func:`make_scheduler`; ``auto``: its registry
        entry's sampler, else its scheduler config's; rCM's times per its image conditioning)."""
        kind = self.defaults.scheduler if kind == "auto" else kind
        i2v = self.transformer_config.image_to_video
        return make_scheduler(self.path, num_inference_steps, flow_shift, kind, seed, strength, i2v)

    @property
    def dmd(self) -> bool:
        """A FastWan checkpoint (``model_index.json``'s ``WanDMDPipeline``): its sampler is FastWan's."""
        return self.model_index is not None and self.model_index.dmd

    @property
    def expand_timesteps(self) -> bool:
        """Wan 2.2 TI2V (``model_index.json``'s ``expand_timesteps``): text to video, or with an image
        its latents as the first latent frame, whose tokens run at timestep 0."""
        return self.model_index is not None and self.model_index.expand_timesteps

    @property
    def precisions(self) -> dict[str, Precision]:
        """The float32 precision each component runs at (``transformer``, ``text_encoder``, ``vae``),
        the requested settings resolved against this platform's defaults (for the run's record)."""
        return {
            "transformer": resolve_precision(self.precision, "transformer"),
            "text_encoder": resolve_precision(self.precision, "text_encoder"),
            "vae": resolve_precision(self.vae_precision, "vae"),
        }

    @functools.cached_property
    def mesh(self) -> jax.sharding.Mesh | None:
        return None if self.mesh_spec is None else make_mesh(self.mesh_spec)

    def _enter(self, stage: str) -> None:
        """Before ``stage`` runs, the weights where :attr:`residency` puts them (the transfers count as
        the stage's load time; a component not loaded yet is read straight into its placement)."""
        if not self.residency.moves:
            return
        encoders = [e for e in (self._text_encoder, self._image_encoder) if e is not None]
        with self.stage_timing(stage).loading():
            self.residency.enter(stage, Loaded(encoders, self._transformer, self._transformer_2))

    # ------------------------------------------------------------------------------------------
    # The three stages

    def encode_prompt(
        self, prompt: Prompt, negative_prompt: Prompt | None = None, max_sequence_length: int = TEXT_LENGTH
    ) -> tuple[jax.Array, jax.Array]:
        """``(prompt_embeds, negative_prompt_embeds)``, each ``[B, max_sequence_length, text_dim]``
        in the text encoder's dtype; as diffusers' ``encode_prompt`` (negative prompt ``""`` when None).
        Both are encoded in one batch."""
        self._enter("encode")
        encoder = self.text_encoder
        with self.stage_timing("encode").running():
            embeds = encoder.encode_prompt(prompt, negative_prompt, max_sequence_length)
            jax.block_until_ready(embeds)
        return embeds

    def prepare_latents(self, batch: int, height: int, width: int, num_frames: int, seed: int) -> jax.Array:
        """Standard normal float32 noise ``[B, z, T', H/8, W/8]`` (JAX's generator); batch item ``i`` is
        drawn from ``seed + i``, so a prompt in a batch starts from the noise it gets when run alone
        with that seed."""
        shape = self.geometry.latent_shape(batch, height, width, num_frames)
        with self.stage_timing("denoise").running():
            keys = jnp.stack([jax.random.key(seed + i) for i in range(batch)])
            noise = jax.vmap(lambda key: jax.random.normal(key, shape[1:], jnp.float32))(keys)
            jax.block_until_ready(noise)
        return noise

    def denoise(
        self,
        prompt_embeds: jax.Array,
        negative_prompt_embeds: jax.Array | None,
        latents: jax.Array,
        *,
        num_inference_steps: int = 50,
        guidance_scale: float = 5.0,
        flow_shift: float | None = None,
        progress: bool = True,
        cache: CacheConfig | None = None,
        scheduler: str = "auto",
        seed: int = 0,
        image: ImageConditioning | None = None,
        guidance_scale_2: float | None = None,
        boundary_ratio: float | None = None,
        on_step: Callable[[int], None] | None = None,
        video_latents: np.ndarray | None = None,
        strength: float | None = None,
        vace: VaceControl | None = None,
    ) -> Denoised:
        """Denoise ``latents`` (float32 noise) with classifier-free guidance (skipped when
        ``guidance_scale <= 1``): the transformer's normalised latents, float32, and how the run went
        (:class:`~wanjax.sampling.results.Denoised`: step times, cache report, experts, mesh usage).
        ``flow_shift=None`` keeps the checkpoint's scheduler config. ``scheduler``: ``auto`` (the
        checkpoint's), ``unipc``, ``euler`` or ``distill`` (the few-step sampler of step-distilled
        models and LoRAs, whose re-noising draws come from ``seed``; see
        :mod:`wanjax.sampling.scheduler`). ``image``: an image-to-video model's conditioning
        (:meth:`prepare_image`), required by such a model. ``cache``: a step-cache policy
        (:class:`~wanjax.sampling.cache.step_cache.CacheConfig`); the result's ``cache_report`` tells what it
        skipped. A two-expert model (Wan 2.2 A14B): ``guidance_scale_2`` for the
        low-noise expert (default ``guidance_scale``, as diffusers), ``boundary_ratio`` in place of
        the checkpoint's (:attr:`boundary_ratio`); the result's ``expert_steps`` tell which expert
        ran each step. ``on_step(done)`` is called after each step with the number of steps done (an
        exception it raises stops the denoising). Video to video (a text-to-video model):
        ``video_latents``, the source video's normalised latents (:meth:`prepare_video`), noised with
        ``latents`` to the first of the last ``int(steps * strength)`` steps, which alone run
        (``strength`` default: :attr:`defaults`'), as diffusers' ``WanVideoToVideoPipeline``. A VACE
        model: ``vace``, its control (:meth:`prepare_vace`), required by such a model."""
        from tqdm import tqdm

        self._enter("denoise")
        model = self.transformer
        second = self.transformer_2
        if second is None and (guidance_scale_2 is not None or boundary_ratio is not None):
            raise WanjaxError(
                "guidance_scale_2 and boundary_ratio are for two-expert models (Wan 2.2 A14B: transformer_2)"
            )
        boundary = boundary_ratio if boundary_ratio is not None else self.boundary_ratio
        if model.cfg.image_to_video != (image is not None) and not self.expand_timesteps:
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
        check_embeddings(model, prompt_embeds, negative_prompt_embeds, latents, guidance_scale)
        if vace is not None:
            rows = latents.shape[0]
            vace = VaceControl(jnp.tile(jnp.asarray(vace.latents), (rows, 1, 1, 1, 1)), vace.scale)
        if video_latents is None and strength is not None:
            raise WanjaxError("a strength is for video to video: give the source video's latents too")
        if video_latents is not None:
            check_video_latents(model.cfg, image is not None, video_latents.shape, latents.shape)
            strength = self.defaults.strength if strength is None else strength
        cfg_pair = negative_prompt_embeds is not None and guidance_scale > 1  # run as one batch
        rows = latents.shape[0] * (2 if cfg_pair else 1)
        layout = model.token_layout((rows, *latents.shape[1:]))
        mesh_usage = None if layout is None else layout.describe(dict(self.mesh.shape))
        if self._sampler is None:
            self._sampler = Sampler(model, second)
        timing = self.stage_timing("denoise")
        with timing.running():
            steps = self.build_scheduler(num_inference_steps, flow_shift, scheduler, seed, strength)
            if video_latents is not None:
                latents = steps.noised(to_host(video_latents), to_host(latents))
            cond = jnp.asarray(prompt_embeds).astype(model.dtype)
            uncond = (
                None
                if negative_prompt_embeds is None
                else jnp.asarray(negative_prompt_embeds).astype(model.dtype)
            )
            runs = num_inference_steps - steps.start
            with tqdm(total=runs, desc="denoise", unit="step", disable=None if progress else True) as bar:
                result = self._sampler(
                    steps,
                    jnp.asarray(latents, jnp.float32),
                    cond,
                    uncond,
                    guidance_scale,
                    on_step=lambda i, seconds: (bar.update(), on_step and on_step(i + 1 - steps.start)),
                    check_finite=True,
                    cache=cache,
                    image=image if vace is None else vace,
                    boundary_ratio=boundary,
                    guidance_scale_2=guidance_scale_2,
                    on_expert=self._switch_expert,
                )
        return dataclasses.replace(result, mesh_usage=mesh_usage)

    def prepare_image(
        self,
        image: ImageInput,
        batch: int,
        height: int,
        width: int,
        num_frames: int,
        last_image: ImageInput | None = None,
    ) -> ImageConditioning:
        """An image-to-video model's conditioning for ``batch`` videos from ``image`` (the first frame;
        ``last_image``: the last, first-last-frame models): the image encoder's penultimate states of
        the image(s) and the conditioning latents (:mod:`wanjax.pipeline.conditioning`), as diffusers'
        ``WanImageToVideoPipeline`` prepares them."""
        self.geometry.check(height, width, num_frames)
        cfg, expand = self.transformer_config, self.expand_timesteps
        check_image_input(cfg, True, last_image is not None, str(self.path), expand)
        self._enter("encode")
        encoder = self.image_encoder if cfg.image_tokens else None
        vae = self.vae
        images = [image] if last_image is None else [image, last_image]
        with self.stage_timing("encode").running():
            states = None if encoder is None else encoder.encode_images(images)
            place = self._video_placement()
            if expand:
                latents = first_frame_latents(vae, image, height, width, place)
            else:
                latents = conditioning_latents(
                    vae, image, height, width, num_frames, self.geometry.temporal, last_image, place
                )
            conditioning = ImageConditioning(jnp.asarray(latents), states, expand).repeat(batch)
            jax.block_until_ready(conditioning)
        return conditioning

    def prepare_video(self, frames: Sequence[Image.Image], height: int, width: int) -> np.ndarray:
        """Video to video's source: the normalised VAE latents ``(1, z, T', h, w)`` of ``frames``
        (e.g. :func:`~wanjax.pipeline.video_input.video_frames`) resized to ``width x height``, as
        diffusers' ``WanVideoToVideoPipeline`` prepares them (:mod:`wanjax.pipeline.video_input`)."""
        self.geometry.check(height, width, len(frames))
        self._enter("encode")
        vae = self.vae
        with self.stage_timing("encode").running():
            return source_latents(vae, frames, height, width, self._video_placement())

    def _video_placement(self) -> Callable[[np.ndarray], jax.Array]:
        """Where a video is VAE-encoded: split over the mesh as the decoder's latents, or one device."""
        if self.mesh is None:
            return jnp.asarray
        return lambda video: to_global(video, spatial_sharding(self.mesh, video.shape))

    def video_size(
        self,
        image: ImageInput | None = None,
        height: int | None = None,
        width: int | None = None,
        max_area: int | None = None,
    ) -> tuple[int, int]:
        """``(height, width)`` of a video: given values kept; without an image, the model's defaults
        (:attr:`defaults`) for those left out; with one, the size of area about ``max_area`` (default:
        the defaults' area) with the image's aspect, in multiples of the model's latent patch
        (:func:`~wanjax.pipeline.conditioning.size_for_image`, as diffusers' image-to-video examples
        size it). WanjaxError for an image smaller than a patch."""
        d = self.defaults
        if image is None:
            return height or d.height, width or d.width
        max_area = max_area or d.height * d.width
        image = open_image(image)
        step = self.geometry.pixel_steps[0]  # diffusers' examples round both sides to this one
        check_image_size(image, step)
        return size_for_image(image.size, max_area, step, height, width)

    def decode(
        self, latents: jax.Array, progress: bool = False, on_frames: Callable[[int], None] | None = None
    ) -> np.ndarray:
        """The transformer's normalised latents ``[B, z, T', h, w]`` -> ``uint8 [B, T, H, W, 3]`` (on a
        mesh each device a spatial strip). ``progress``: a bar over the latent frames on a terminal; ``on_frames(done)``
        after each part; either decodes in parts (:meth:`~wanjax.models.vae.WanVAE.decode_uint8`)."""
        from tqdm import tqdm

        self._enter("decode")
        vae, off = self.vae, None if progress else True
        with (
            self.stage_timing("decode").running(),
            tqdm(total=latents.shape[2], desc="decode", disable=off) as bar,
        ):
            parts = lambda done, _: (bar.update(done - bar.n), on_frames and on_frames(done))  # noqa: E731
            placed = self._video_placement()(jnp.asarray(latents, jnp.float32))
            frames = to_host(vae.decode_uint8(placed, parts if not bar.disable or on_frames else None))
        return frames

    def __call__(
        self,
        prompt: Prompt,
        negative_prompt: Prompt | None = None,
        height: int | None = None,
        width: int | None = None,
        num_frames: int | None = None,
        num_inference_steps: int | None = None,
        guidance_scale: float | None = None,
        flow_shift: float | None = None,
        seed: int | None = None,
        latents: jax.Array | np.ndarray | None = None,
        max_sequence_length: int = TEXT_LENGTH,
        progress: bool = True,
        cache: CacheConfig | None = None,
        scheduler: str = "auto",
        image: ImageInput | None = None,
        last_image: ImageInput | None = None,
        guidance_scale_2: float | None = None,
        video: VideoInput | None = None,
        strength: float | None = None,
        fps: float | None = None,
        mask: VideoInput | ImageInput | None = None,
        reference_images: Sequence[ImageInput] = (),
        conditioning_scale: float | Sequence[float] = 1.0,
    ) -> Video:
        """Generate videos: a :class:`~wanjax.pipeline.results.Video` whose ``frames`` are
        ``uint8 [B, num_frames, height, width, 3]``, one video per prompt.

        ``latents``: starting noise ``[B, 16, T', H/8, W/8]`` instead of drawing it from ``seed``.
        ``cache``: a step-cache policy, e.g. ``CacheConfig("magcache")`` (see :meth:`denoise`).
        ``image`` (and ``last_image``): the first (and last) frame for an image-to-video model (a PIL
        image, a path or uint8 pixels), resized to ``width x height`` (:meth:`prepare_image`).
        ``height``/``width`` left out: the model's (:attr:`defaults`, as ``wanjax generate`` and the
        server use), or with an image the size of that area with the image's aspect
        (:meth:`video_size`); ``num_frames``, ``num_inference_steps``, ``guidance_scale`` and ``seed``
        left out: the model's too. ``guidance_scale_2``: a two-expert model's low-noise expert's
        guidance (default ``guidance_scale``).

        ``video``: video to video (a text-to-video model): a file (read at ``fps``, default the
        model's), images or ``uint8 [T, H, W, 3]`` frames, its first ``num_frames`` (left out: the
        model's, or as many as the video has, ``4n+1``) re-noised to ``strength`` (default the
        model's, 0.8 as diffusers') and denoised; ``latents`` is then the noise, and the size left
        out keeps the video's aspect as an image's does.

        A VACE model (as diffusers' ``WanVACEPipeline``): ``video`` is the control video (read as
        above; none: black), ``mask`` its mask (a video of as many frames, or one image for all;
        white: generate, black: keep), ``reference_images`` each prepended as a frame of its own
        (dropped from the result), ``conditioning_scale`` the control's weight (one, or one per
        vace layer); :meth:`prepare_vace`.
        """
        d = self.defaults
        vace_model, frames = self.transformer_config.vace, None
        if (mask is not None or reference_images) and not vace_model:
            raise WanjaxError("a mask and reference images are for a VACE model")
        if video is not None:
            if not vace_model:
                check_video_to_video(self.transformer_config, image is not None)
            frames = self.video_input(video, num_frames, fps)
            num_frames = len(frames)
        num_frames = d.frames if num_frames is None else num_frames
        references = len(reference_images) if vace_model else 0
        num_inference_steps = d.num_inference_steps if num_inference_steps is None else num_inference_steps
        guidance_scale = d.guidance_scale if guidance_scale is None else guidance_scale
        seed = d.seed if seed is None else seed
        self.reset_timings()
        if image is not None:
            image = open_image(image)
            last_image = None if last_image is None else open_image(last_image)
        check_image_input(
            self.transformer_config,
            image is not None,
            last_image is not None,
            str(self.path),
            self.expand_timesteps,
        )
        height, width = self.video_size(image if frames is None else frames[0], height, width)
        self.geometry.check(height, width, num_frames)
        prompt_embeds, negative_prompt_embeds = self.encode_prompt(
            prompt, negative_prompt, max_sequence_length
        )
        batch = prompt_embeds.shape[0]
        noised_frames = num_frames + references * self.geometry.temporal  # one latent frame each
        expected = self.geometry.latent_shape(batch, height, width, noised_frames)
        if latents is None:
            latents = self.prepare_latents(batch, height, width, noised_frames, seed)
        elif tuple(latents.shape) != expected:
            raise WanjaxError(
                f"latents {tuple(latents.shape)} do not match {batch} prompt(s) at {width}x{height}, "
                f"{num_frames} frames (expected {expected}); pass the matching height/width/num_frames"
            )
        conditioning = source = vace = None
        if image is not None:
            conditioning = self.prepare_image(image, batch, height, width, num_frames, last_image)
        if vace_model:
            vace = self.prepare_vace(
                frames, mask, reference_images, height, width, num_frames, conditioning_scale, fps
            )
        elif frames is not None:
            source = self.prepare_video(frames, height, width)
        denoised = self.denoise(
            prompt_embeds,
            negative_prompt_embeds,
            latents,
            num_inference_steps=num_inference_steps,
            guidance_scale=guidance_scale,
            flow_shift=flow_shift,
            progress=progress,
            cache=cache,
            scheduler=scheduler,
            seed=seed,
            image=conditioning,
            guidance_scale_2=guidance_scale_2,
            video_latents=source,
            strength=strength,
            vace=vace,
        )
        return Video(
            self.decode(denoised.latents[:, :, references:], progress), denoised, self.timings_so_far()
        )

    def extend(self, prompt: Prompt, video: VideoInput | None = None, **kwargs: Any) -> Extension:
        """A VACE model's long video: ``video`` continued clip by clip (:func:`wanjax.pipeline.extension.extend`)."""
        return extend(self, prompt, video, **kwargs)

    def prepare_vace(
        self,
        frames: Sequence[Image.Image] | None,
        mask: VideoInput | ImageInput | None,
        reference_images: Sequence[ImageInput],
        height: int,
        width: int,
        num_frames: int,
        conditioning_scale: float | Sequence[float] = 1.0,
        fps: float | None = None,
    ) -> VaceControl:
        """A VACE model's control for one video (:mod:`wanjax.pipeline.vace`): the control latents
        ``(1, 96, T' + R, h, w)`` of the control ``frames`` (None: black), the ``mask`` (a video of
        as many frames, or one image for all; None: all generated) and ``R`` reference images, and
        the scale of each vace layer."""
        scale = layer_scales(conditioning_scale, len(self.transformer_config.vace_layers or ()))
        self.geometry.check(height, width, num_frames)
        masks = None if mask is None else mask_frames(mask, num_frames, fps or self.defaults.fps)
        self._enter("encode")
        vae, size = self.vae, (height, width, num_frames, self.geometry.temporal)
        with self.stage_timing("encode").running():
            latents = control_latents(vae, frames, masks, reference_images, *size, self._video_placement())
        return VaceControl(jnp.asarray(latents), jnp.asarray(scale))

    def video_input(
        self, video: VideoInput, num_frames: int | None = None, fps: float | None = None
    ) -> list[Image.Image]:
        """The frames video to video reads from ``video`` (see :meth:`__call__`): ``num_frames`` of
        them (WanjaxError when it has fewer), or left out the model's default number or as many as it
        has (``4n+1``)."""
        wanted = self.defaults.frames if num_frames is None else num_frames
        frames = video_frames(video, fps or self.defaults.fps, wanted)
        fit = frames_that_fit(len(frames), self.geometry.temporal)
        if num_frames is not None and len(frames) < num_frames:
            raise WanjaxError(
                f"the video gives {len(frames)} frames at {fps or self.defaults.fps:g} fps, fewer than the "
                f"{num_frames} asked for: ask for {fit} frames or fewer"
            )
        return frames[:fit]
