"""A :class:`~wanjax.pipeline.pipeline.WanPipeline`'s components: the text and image encoders, the
transformer(s) and the VAE, each built by the caller or read on first use from where
:class:`~wanjax.pipeline.sources.ComponentSources` says (the model directory or a file given for
it), with one :class:`LoadSettings` (dtypes, mesh, precision, offload, 8-bit weights); LoRAs merged.
Also what the checkpoint says without its weights: configs, registry entry and defaults, geometry."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from wanjax.errors import CheckpointError, WanjaxError
from wanjax.io.component import Component
from wanjax.io.lora import LoraFile
from wanjax.io.quantizable import UNQUANTIZED
from wanjax.io.quantizable import weights_dtype as weights_storage
from wanjax.kernels.attention import AttentionSpec
from wanjax.kernels.precision import Precision, parse_precision, resolve_precision
from wanjax.models.clip_vision import IMAGE_ENCODER, CLIPVisionEncoder, load_image_encoder
from wanjax.models.config import TransformerConfig, parse_dtype
from wanjax.models.dit import TRANSFORMER, TRANSFORMER_2, WanTransformer, checkpoint_spec, load_transformer
from wanjax.models.image_processor import IMAGE_PROCESSOR
from wanjax.models.lora import LoraSpec, MergedCache, load_loras, plan_updates
from wanjax.models.offload import parse_offload
from wanjax.models.registry import Defaults, Variant, defaults_for, match
from wanjax.models.tokenizer import TOKENIZER
from wanjax.models.umt5 import TEXT_ENCODER, UMT5Encoder, load_text_encoder
from wanjax.models.vae import VAE, Tiling, WanVAE, load_vae, parse_chunk
from wanjax.models.w8a8 import AUTO, check_activations
from wanjax.parallel.layouts import spatial_sharding, to_global
from wanjax.parallel.mesh import MeshSpec, make_mesh, mesh_spec_from_flags
from wanjax.parallel.rules import param_sharding, replicated
from wanjax.pipeline.hub import ModelSource
from wanjax.pipeline.inputs import VideoGeometry
from wanjax.pipeline.model_index import read_model_index
from wanjax.pipeline.residency import Loaded, Residency
from wanjax.pipeline.sources import ComponentSources, component_files
from wanjax.runtime.timing import StageTiming
from wanjax.sampling.scheduler import Scheduler, make_scheduler

__all__ = ["COMPONENTS", "Components", "LoadSettings"]

COMPONENTS = ("text_encoder", "image_encoder", "transformer", "transformer_2", "vae")


@dataclasses.dataclass(frozen=True)
class LoadSettings:
    """How a pipeline reads and runs its components (:meth:`WanPipeline.from_pretrained`'s options).

    ``dtype``: transformer (and, unless ``text_encoder_dtype`` says otherwise, text encoder) weights
    and activations; ``vae_dtype``: the VAE's activations, ``vae_weights_dtype`` its weights (default:
    ``vae_dtype``). ``vae_decode_chunk``: latent frames per VAE decode step (an int or ``"all"``; the
    frames are the same whatever it is). ``vae_tiling``: decode in blended spatial tiles (``True``:
    diffusers' 256-pixel tiles every 192; or a :class:`~wanjax.models.vae.tiling.Tiling`), for frames
    too large to decode whole; not equal to an untiled decode at the seams. ``attention_backend``:
    the transformer's (:func:`wanjax.kernels.attention.attention`). ``mesh``: run sharded over all
    devices -- a :class:`~wanjax.parallel.mesh.MeshSpec`, a string such as ``"dp=2,sp=1,tp=4"``, or
    ``"auto"``; ``None`` runs on one device. ``fsdp`` also splits the weights' model dimension over
    the non-tp axes. ``precision``: of the float32 matmuls of the transformer and text encoder,
    ``vae_precision``: of the VAE's float32 convolutions and matmuls (``highest | high | default``;
    ``None``: the platform's default, :func:`~wanjax.kernels.precision.default_precision`).
    ``offload``: which weights stay in device memory between and during stages (``none | model |
    blocks``, :mod:`wanjax.models.offload`). ``weights_dtype``: ``"bf16"`` (the weights in
    ``dtype``), ``"int8"`` or ``"fp8"`` (the transformer's and text encoder's matmul kernels in 8
    bits with a float32 scale per output channel, :mod:`wanjax.io.quant`), ``"gguf"`` (a GGUF file's
    quantised kernels kept as stored, :mod:`wanjax.io.gguf_kernel`). ``activations_dtype``: ``"int8"``
    multiplies the transformer blocks' int8 kernels int8 x int8 (W8A8, :mod:`wanjax.models.w8a8`),
    ``"auto"`` where the target multiplies int8 faster, a float dtype weight-only (the
    transformer's ``settings.int8_matmuls`` says what runs). Every value is checked here."""

    dtype: Any = "bfloat16"
    text_encoder_dtype: Any = None
    vae_dtype: Any = "float32"
    vae_weights_dtype: Any = None
    vae_decode_chunk: int | str | None = 1
    vae_tiling: Tiling | bool | None = None
    attention_backend: str | AttentionSpec = "auto"
    mesh: MeshSpec | str | None = None
    fsdp: bool = False
    precision: str | None = None
    vae_precision: str | None = None
    offload: str = "none"
    weights_dtype: str = UNQUANTIZED
    activations_dtype: str = AUTO

    def __post_init__(self) -> None:
        parsed = {
            "dtype": parse_dtype(self.dtype),
            "text_encoder_dtype": parse_dtype(self.text_encoder_dtype or self.dtype),
            "vae_dtype": parse_dtype(self.vae_dtype),
            "vae_weights_dtype": parse_dtype(self.vae_weights_dtype or self.vae_dtype),
            "vae_decode_chunk": parse_chunk(self.vae_decode_chunk, "vae_decode_chunk"),
            "vae_tiling": Tiling() if self.vae_tiling is True else self.vae_tiling or None,
            # parsed now (a bad value fails here), resolved against the platform when used
            "precision": None if self.precision is None else parse_precision(self.precision),
            "vae_precision": None if self.vae_precision is None else parse_precision(self.vae_precision),
            "offload": parse_offload(self.offload),
        }
        weights_storage(self.weights_dtype)  # a bad name fails now, before any weight is read
        check_activations(self.activations_dtype, self.weights_dtype)
        for name, value in parsed.items():
            object.__setattr__(self, name, value)


class Components:
    """A pipeline's components and what its checkpoint says without the weights. ``given``: components
    already built (as diffusers' pipelines take them) or a component's weights in one file (a path:
    safetensors or GGUF, diffusers' or the original Wan layout, fp8-scaled; :mod:`wanjax.pipeline.sources`),
    by name (:data:`COMPONENTS`); the settings apply to the components read here. ``loras`` (and
    ``loras_2``, a two-expert model's low-noise expert's): LoRA adapters ``[(file, weight), ...]``
    merged into the transformer's weights (:meth:`set_loras`). Each component is read on first use,
    its load seconds metered in :attr:`timings` under its stage."""

    def __init__(
        self,
        source: ModelSource,
        settings: LoadSettings,
        given: Mapping[str, Any] | None = None,
        loras: Sequence[LoraSpec] = (),
        loras_2: Sequence[LoraSpec] = (),
    ):
        given = {name: (given or {}).get(name) for name in COMPONENTS}
        self.source, self.path, self.settings = source, source.path, settings
        self.sources = ComponentSources(source.path, component_files(given))
        # components built by the caller are used as they are; the others are read when first needed
        self._built = {name: None if name in self.sources.files else value for name, value in given.items()}
        self.model_index = read_model_index(source.path)  # an entry wanjax does not act on fails here
        self.residency = Residency(settings.offload)
        self.timings: dict[str, StageTiming] = {}
        self.loras: list[tuple[LoraFile, float]] = []
        self.loras_2: list[tuple[LoraFile, float]] = []
        self.set_loras(loras)
        self.set_loras(loras_2, load_into_transformer_2=True)

    # ------------------------------------------------------------------------------------------
    # What the checkpoint says (no weights read)

    @functools.cached_property
    def transformer_config(self) -> TransformerConfig:
        """The transformer's config (read from its ``config.json``, no weights)."""
        return self.sources.config(TRANSFORMER)

    @property
    def boundary_ratio(self) -> float | None:
        """A two-expert model's switch (``model_index.json``'s ``boundary_ratio``): ``transformer``
        runs the steps whose timestep is at least ``boundary_ratio * num_train_timesteps``,
        ``transformer_2`` the rest. None: one transformer."""
        return None if self.model_index is None else self.model_index.boundary_ratio

    @property
    def experts(self) -> int:
        """Transformers that take turns: 2 for a two-expert model (Wan 2.2 A14B), else 1."""
        return 1 if self.boundary_ratio is None else 2

    @property
    def dmd(self) -> bool:
        """A FastWan checkpoint (``model_index.json``'s ``WanDMDPipeline``): its sampler is FastWan's."""
        return self.model_index is not None and self.model_index.dmd

    @property
    def expand_timesteps(self) -> bool:
        """Wan 2.2 TI2V (``model_index.json``'s ``expand_timesteps``): text to video, or with an image
        its latents as the first latent frame, whose tokens run at timestep 0."""
        return self.model_index is not None and self.model_index.expand_timesteps

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

    @functools.cached_property
    def geometry(self) -> VideoGeometry:
        """Latent/video size relation, read from the configs only (no weights)."""
        try:
            vae_cfg = self.sources.config(VAE)
            geometry = VideoGeometry(vae_cfg.z_dim, vae_cfg.spatial_factor, vae_cfg.temporal_factor)
        except CheckpointError:  # a model without vae/: Wan 2.1's VAE
            geometry = VideoGeometry()
        try:
            dit_cfg = self.transformer_config
        except CheckpointError:
            return geometry
        return dataclasses.replace(geometry, patch=tuple(dit_cfg.patch_size[1:]))

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

    # ------------------------------------------------------------------------------------------
    # Where the components run

    @functools.cached_property
    def mesh_spec(self) -> MeshSpec | None:
        """The mesh requested by the settings, resolved against the devices (``None``: one device)."""
        request, fsdp = self.settings.mesh, self.settings.fsdp
        if request is None:
            return None
        if isinstance(request, MeshSpec):
            return dataclasses.replace(request, fsdp=request.fsdp or fsdp)
        heads = self.transformer_config.num_attention_heads
        return mesh_spec_from_flags(request, jax.device_count(), heads=heads, use_fsdp=fsdp)

    @functools.cached_property
    def mesh(self) -> jax.sharding.Mesh | None:
        return None if self.mesh_spec is None else make_mesh(self.mesh_spec)

    @property
    def precisions(self) -> dict[str, Precision]:
        """The float32 precision each component runs at (``transformer``, ``text_encoder``, ``vae``),
        the requested settings resolved against this platform's defaults (for the run's record)."""
        s = self.settings
        return {
            "transformer": resolve_precision(s.precision, "transformer"),
            "text_encoder": resolve_precision(s.precision, "text_encoder"),
            "vae": resolve_precision(s.vae_precision, "vae"),
        }

    def stage_timing(self, stage: str) -> StageTiming:
        return self.timings.setdefault(stage, StageTiming())

    def enter(self, stage: str) -> None:
        """Before ``stage`` runs, the weights where :attr:`residency` puts them (the transfers count as
        the stage's load time; a component not loaded yet is read straight into its placement)."""
        if not self.residency.moves:
            return
        built = self._built
        encoders = [e for e in (built["text_encoder"], built["image_encoder"]) if e is not None]
        with self.stage_timing(stage).loading():
            self.residency.enter(stage, Loaded(encoders, built["transformer"], built["transformer_2"]))

    def switch_expert(self, expert: int) -> None:
        """Before expert ``expert``'s first step: the experts take turns on the device (:attr:`residency`)."""
        if not self.residency.moves or self._built["transformer_2"] is None:
            return
        with self.stage_timing("denoise").loading():
            self.residency.switch_expert((self.transformer, self._built["transformer_2"]), expert)

    def video_placement(self) -> Callable[[np.ndarray], jax.Array]:
        """Where a video is VAE-encoded or decoded: split over the mesh in strips, or one device."""
        if self.mesh is None:
            return jnp.asarray
        return lambda video: to_global(video, spatial_sharding(self.mesh, video.shape))

    def _param_sharding(self) -> Any:
        return None if self.mesh is None else param_sharding(self.mesh, self.mesh_spec.fsdp)

    # ------------------------------------------------------------------------------------------
    # The components, read on first use

    @property
    def text_encoder(self) -> UMT5Encoder:
        if self._built["text_encoder"] is None:
            with self.stage_timing("encode").loading():
                path, config = self.sources.weights(TEXT_ENCODER)
                encoder = load_text_encoder(
                    path,
                    self.settings.text_encoder_dtype,
                    config=config,
                    tokenizer=self.path / TOKENIZER.folder if config is not None else None,
                    sharding=self._param_sharding(),
                    precision=self.precisions["text_encoder"],
                    weights_dtype=self.settings.weights_dtype,
                    offload=self.settings.offload,
                )
                jax.block_until_ready(encoder.params)
                self._built["text_encoder"] = encoder
        return self._built["text_encoder"]

    def _load_transformer(self, component: Component, loras: list[tuple[LoraFile, float]]) -> WanTransformer:
        """The transformer ``component`` names, with ``loras`` merged into it."""
        path, config = self.sources.weights(component)
        if config is None:
            path = component.directory(path)
        s = self.settings
        with self.stage_timing("denoise").loading():
            model = load_transformer(
                path,
                s.dtype,
                config=config,
                attention_backend=s.attention_backend,
                mesh=self.mesh,
                fsdp=self.mesh_spec is not None and self.mesh_spec.fsdp,
                precision=self.precisions["transformer"],
                offload=s.offload,
                weights_dtype=s.weights_dtype,
                activations_dtype=s.activations_dtype,
            )
            jax.block_until_ready(model.params)
            if loras:
                model.set_loras(loras)
                jax.block_until_ready(model.params)
        return model

    @property
    def transformer(self) -> WanTransformer:
        """The transformer (of a two-expert model: the high-noise expert, run first)."""
        if self._built["transformer"] is None:
            self._built["transformer"] = self._load_transformer(TRANSFORMER, self.loras)
        return self._built["transformer"]

    @property
    def transformer_2(self) -> WanTransformer | None:
        """A two-expert model's low-noise expert (``transformer_2/``), None for one transformer.
        Under ``offload`` other than ``"none"`` it is read, then waits in host memory until its first
        step (the experts take turns on the device)."""
        if self.boundary_ratio is None:
            return None
        if self._built["transformer_2"] is None:
            if self._built["transformer"] is not None:
                self.residency.park(self._built["transformer"])  # one expert on the device at a time
            self._built["transformer_2"] = self._load_transformer(TRANSFORMER_2, self.loras_2)
            self.residency.park(self._built["transformer_2"])
        return self._built["transformer_2"]

    @property
    def image_encoder(self) -> CLIPVisionEncoder:
        """An image-to-video model's CLIP image encoder (and its image processor), in float32 as
        diffusers' Wan examples load it."""
        if self._built["image_encoder"] is None:
            with self.stage_timing("encode").loading():
                path, config = self.sources.weights(IMAGE_ENCODER)
                beside = self.path / IMAGE_PROCESSOR.folder
                processor = beside if config is not None and beside.is_dir() else None
                encoder = load_image_encoder(
                    path,
                    "float32",
                    sharding=self._param_sharding(),
                    precision=self.precisions["text_encoder"],
                    config=config,
                    processor=processor,
                )
                jax.block_until_ready(encoder.params)
                self._built["image_encoder"] = encoder
        return self._built["image_encoder"]

    @property
    def vae(self) -> WanVAE:
        if self._built["vae"] is None:
            s = self.settings
            with self.stage_timing("decode").loading():
                sharding = None if self.mesh is None else (lambda source: replicated(self.mesh))
                path, config = self.sources.weights(VAE)
                self._built["vae"] = load_vae(
                    path,
                    s.vae_dtype,
                    s.vae_weights_dtype,
                    config=config,
                    decode_chunk=s.vae_decode_chunk,
                    tiling=s.vae_tiling,
                    sharding=sharding,
                    precision=self.precisions["vae"],
                )
        return self._built["vae"]

    def load(self) -> None:
        """Read every component's weights now, each stage's in turn (under ``offload`` each then waits
        where that puts it), so that no later run pays for loading: a server's start."""
        self.enter("encode")
        _ = self.text_encoder
        if self.transformer_config.image_tokens:
            _ = self.image_encoder
        self.enter("denoise")
        _ = self.transformer, self.transformer_2
        self.enter("decode")
        _ = self.vae

    # ------------------------------------------------------------------------------------------
    # LoRA adapters

    def set_loras(
        self,
        loras: Sequence[LoraSpec],
        *,
        load_into_transformer_2: bool = False,
        cache: MergedCache | None = None,
    ) -> None:
        """Use these LoRA adapters (``[(file, weight), ...]``, replacing any set before; ``[]``: none):
        read and checked against the transformer's config now (:meth:`check_loras`), merged into its
        weights when it is loaded, or at once if it is (from the base weights kept in host memory for
        the leaves a LoRA changes; the checkpoint is not read again; a set in ``cache`` is not merged
        again). See :meth:`WanTransformer.set_loras`. ``load_into_transformer_2``: into a two-expert
        model's low-noise expert instead (as diffusers' ``load_lora_weights(...,
        load_into_transformer_2=True)``); each expert keeps its own adapters, as Wan 2.2 LoRAs come in
        high-noise / low-noise pairs."""
        files = self.check_loras(loras, load_into_transformer_2=load_into_transformer_2)
        model = self._built["transformer_2" if load_into_transformer_2 else "transformer"]
        if model is not None:
            with self.stage_timing("denoise").loading():
                model.set_loras(files, cache)
        if load_into_transformer_2:
            self.loras_2 = files
        else:
            self.loras = files

    def check_loras(
        self, loras: Sequence[LoraSpec], *, load_into_transformer_2: bool = False
    ) -> list[tuple[LoraFile, float]]:
        """These LoRA adapters read and checked against the (low-noise, with
        ``load_into_transformer_2``) transformer's config, nothing merged: WanjaxError for a file that
        does not fit it, or for LoRAs of ``transformer_2`` on a model with one transformer."""
        component = TRANSFORMER_2 if load_into_transformer_2 else TRANSFORMER
        if load_into_transformer_2 and loras and self.boundary_ratio is None:
            raise WanjaxError(
                f"{self.path} has one transformer: LoRAs for transformer_2 (the low-noise expert) need a "
                "two-expert model such as Wan 2.2 A14B; give them as the transformer's LoRAs"
            )
        files = load_loras(loras)
        if files:  # a LoRA for another model fails here
            plan_updates(checkpoint_spec(self.sources.config(component)), files)
        return files


def split_options(options: Mapping[str, Any]) -> tuple[LoadSettings, dict[str, Any], dict[str, Any]]:
    """:meth:`WanPipeline.from_pretrained`'s options as the settings, the given components and the
    LoRAs (``loras``, ``loras_2``); TypeError naming an unknown option."""
    fields = {f.name for f in dataclasses.fields(LoadSettings)}
    unknown = set(options) - fields - set(COMPONENTS) - {"loras", "loras_2"}
    if unknown:
        raise TypeError(f"unknown pipeline option(s): {', '.join(sorted(unknown))}")
    settings = LoadSettings(**{k: v for k, v in options.items() if k in fields})
    given = {k: v for k, v in options.items() if k in COMPONENTS}
    loras = {k: v for k, v in options.items() if k in ("loras", "loras_2")}
    return settings, given, loras
