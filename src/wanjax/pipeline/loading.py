"""The components of a :class:`~wanjax.pipeline.pipeline.WanPipeline`, each read on first use from
where :class:`~wanjax.pipeline.sources.ComponentSources` says (the model directory or a file given
for it), with the pipeline's dtype, mesh, precision, offload and weights options; LoRAs merged."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax

from wanjax.errors import CheckpointError, WanjaxError
from wanjax.io.component import Component
from wanjax.io.lora import LoraFile
from wanjax.models.clip_vision import IMAGE_ENCODER, CLIPVisionEncoder, load_image_encoder
from wanjax.models.dit import TRANSFORMER, TRANSFORMER_2, WanTransformer, checkpoint_spec, load_transformer
from wanjax.models.image_processor import IMAGE_PROCESSOR
from wanjax.models.lora import LoraSpec, MergedCache, load_loras, plan_updates
from wanjax.models.tokenizer import TOKENIZER
from wanjax.models.umt5 import TEXT_ENCODER, UMT5Encoder, load_text_encoder
from wanjax.models.vae import VAE, WanVAE, load_vae
from wanjax.parallel.rules import param_sharding, replicated
from wanjax.pipeline.inputs import VideoGeometry


class PipelineComponents:
    """The loading half of :class:`~wanjax.pipeline.pipeline.WanPipeline` (its attributes are set by
    the pipeline's constructor): the text and image encoders, the transformer(s), the VAE."""

    @property
    def text_encoder(self) -> UMT5Encoder:
        if self._text_encoder is None:
            with self.stage_timing("encode").loading():
                sharding = None
                if self.mesh is not None:
                    sharding = param_sharding(self.mesh, self.mesh_spec.fsdp)
                path, config = self.sources.weights(TEXT_ENCODER)
                self._text_encoder = load_text_encoder(
                    path,
                    self.text_encoder_dtype,
                    config=config,
                    tokenizer=self.path / TOKENIZER.folder if config is not None else None,
                    sharding=sharding,
                    precision=self.precisions["text_encoder"],
                    weights_dtype=self.weights_dtype,
                    offload=self.offload,
                )
                jax.block_until_ready(self._text_encoder.params)
        return self._text_encoder

    def _load_transformer(self, component: Component, loras: list[tuple[LoraFile, float]]) -> WanTransformer:
        """The transformer ``component`` names, with ``loras`` merged into it."""
        path, config = self.sources.weights(component)
        if config is None:
            path = component.directory(path)
        with self.stage_timing("denoise").loading():
            model = load_transformer(
                path,
                self.dtype,
                config=config,
                attention_backend=self.attention_backend,
                mesh=self.mesh,
                fsdp=self.mesh_spec is not None and self.mesh_spec.fsdp,
                precision=self.precisions["transformer"],
                offload=self.offload,
                weights_dtype=self.weights_dtype,
            )
            jax.block_until_ready(model.params)
            if loras:
                model.set_loras(loras)
                jax.block_until_ready(model.params)
        return model

    @property
    def transformer(self) -> WanTransformer:
        """The transformer (of a two-expert model: the high-noise expert, run first)."""
        if self._transformer is None:
            self._transformer = self._load_transformer(TRANSFORMER, self.loras)
        return self._transformer

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
    def transformer_2(self) -> WanTransformer | None:
        """A two-expert model's low-noise expert (``transformer_2/``), None for one transformer.
        Under ``offload`` other than ``"none"`` it is read, then waits in host memory until its first
        step (the experts take turns on the device)."""
        if self.boundary_ratio is None:
            return None
        if self._transformer_2 is None:
            if self._transformer is not None:
                self.residency.park(self._transformer)  # one expert on the device at a time
            self._transformer_2 = self._load_transformer(TRANSFORMER_2, self.loras_2)
            self.residency.park(self._transformer_2)
        return self._transformer_2

    def _switch_expert(self, expert: int) -> None:
        """Before expert ``expert``'s first step: the experts take turns on the device (:attr:`residency`)."""
        if not self.residency.moves or self._transformer_2 is None:
            return
        with self.stage_timing("denoise").loading():
            self.residency.switch_expert((self.transformer, self._transformer_2), expert)

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
        model = self._transformer_2 if load_into_transformer_2 else self._transformer
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

    @property
    def image_encoder(self) -> CLIPVisionEncoder:
        """An image-to-video model's CLIP image encoder (and its image processor), in float32 as
        diffusers' Wan examples load it."""
        if self._image_encoder is None:
            with self.stage_timing("encode").loading():
                sharding = None
                if self.mesh is not None:
                    sharding = param_sharding(self.mesh, self.mesh_spec.fsdp)
                path, config = self.sources.weights(IMAGE_ENCODER)
                beside = self.path / IMAGE_PROCESSOR.folder
                processor = beside if config is not None and beside.is_dir() else None
                self._image_encoder = load_image_encoder(
                    path,
                    "float32",
                    sharding=sharding,
                    precision=self.precisions["text_encoder"],
                    config=config,
                    processor=processor,
                )
                jax.block_until_ready(self._image_encoder.params)
        return self._image_encoder

    @property
    def vae(self) -> WanVAE:
        if self._vae is None:
            with self.stage_timing("decode").loading():
                sharding = None if self.mesh is None else (lambda source: replicated(self.mesh))
                path, config = self.sources.weights(VAE)
                self._vae = load_vae(
                    path,
                    self.vae_dtype,
                    self.vae_weights_dtype,
                    config=config,
                    decode_chunk=self.vae_decode_chunk,
                    tiling=self.vae_tiling,
                    sharding=sharding,
                    precision=self.precisions["vae"],
                )
        return self._vae

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

    def load(self) -> None:
        """Read every component's weights now, each stage's in turn (under ``offload`` each then waits
        where that puts it), so that no later run pays for loading: a server's start."""
        self._enter("encode")
        _ = self.text_encoder
        if self.transformer_config.image_tokens:
            _ = self.image_encoder
        self._enter("denoise")
        _ = self.transformer, self.transformer_2
        self._enter("decode")
        _ = self.vae

    # ------------------------------------------------------------------------------------------
    # Residency (offload "model" and "blocks")
