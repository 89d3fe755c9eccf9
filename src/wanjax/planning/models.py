"""What a plan is of: a model's component configs (:class:`Model`), from a registry variant or a
diffusers directory, with the component files given checked to fit it and their GGUF types read."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from wanjax.errors import WanjaxError
from wanjax.io.component import Component
from wanjax.models import vae
from wanjax.models.clip_vision import IMAGE_ENCODER, CLIPVisionConfig
from wanjax.models.config import TransformerConfig
from wanjax.models.dit import TRANSFORMER
from wanjax.models.registry import CLIP_VIT_H_14, UMT5_XXL, WAN21_VAE, defaults_for, registry
from wanjax.models.umt5 import TEXT_ENCODER, UMT5Config
from wanjax.models.vae.config import VAEConfig
from wanjax.pipeline.demo import demo_text_encoder_config
from wanjax.pipeline.model_index import read_model_index


@dataclasses.dataclass(frozen=True)
class Model:
    transformer: TransformerConfig
    text_encoder: UMT5Config
    vae: VAEConfig
    image_encoder: CLIPVisionConfig | None = None  # image-to-video models with a CLIP encoder
    experts: int = 1  # Wan 2.2 A14B: two transformers of this config
    image: bool = False  # an image-to-video model: the VAE encodes its conditioning in the encode stage
    # an Animate model: the frames of the segments its run is made in (its variant's default)
    segment_frame_length: int | None = None
    # per component file given in GGUF: the type of each leaf ``--weights_dtype gguf`` keeps (by key path)
    gguf: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)


DEFAULT_MODEL = "14B"


def model_name(model: str | None, files: Mapping[str, str | None] | None = None) -> str:
    """The model a plan is of: ``model``; else the variant the component ``files``' transformer file
    is of (:func:`wanjax.pipeline.sources.base_variant`), else :data:`DEFAULT_MODEL`."""
    from wanjax.pipeline import sources

    if model is not None:
        return model
    paths = sources.component_files(files or {})
    return sources.base_variant(paths).name if paths else DEFAULT_MODEL


def model_configs(model: str, files: Mapping[str, str | None] | None = None) -> Model:
    """A variant of the registry (:func:`wanjax.models.registry.registry`, the demos included) or a
    diffusers directory (its configs; a component without one: the released checkpoints'), with the
    component ``files`` given (``{folder: file}``) checked to fit it."""
    from wanjax.pipeline import sources

    paths = sources.component_files(files or {})
    found = _model_configs(model)
    configs = {"transformer": found.transformer, "transformer_2": found.transformer, "vae": found.vae}
    configs |= {"text_encoder": found.text_encoder, "image_encoder": found.image_encoder}
    for folder, path in paths.items():
        if configs[folder] is None or (folder == "transformer_2" and found.experts == 1):
            raise WanjaxError(f"--{folder} {path}: {model} has no {folder}")
        sources.check_fit(folder, path, configs[folder], f"{model}'s {folder}")
    gguf = {folder: sources.kept_gguf_types(folder, path, configs[folder]) for folder, path in paths.items()}
    return dataclasses.replace(found, gguf={folder: kept for folder, kept in gguf.items() if kept})


def _model_configs(model: str) -> Model:
    presets = registry()
    if model in presets:
        v = presets[model]
        text = v.text_encoder or demo_text_encoder_config()  # None: a demo's, sized to its vocabulary
        segments = v.defaults.segment_frame_length if v.transformer.animate else None
        return Model(v.transformer, text, v.vae, v.image_encoder, v.experts, v.image, segments)
    root = Path(model)
    if not (root / TRANSFORMER.folder / TRANSFORMER.config_file).is_file():
        raise WanjaxError(
            f"--model {model!r} is neither a preset ({', '.join(presets)}) nor a diffusers model directory "
            "with transformer/config.json"
        )

    def read(component: Component, default: Any) -> Any:
        folder = root / component.folder
        return component.read_config(folder) if (folder / component.config_file).is_file() else default

    transformer = TRANSFORMER.read_config(root / TRANSFORMER.folder)
    index = read_model_index(root)
    return Model(
        transformer,
        read(TEXT_ENCODER, UMT5_XXL),
        read(vae.VAE, WAN21_VAE),
        read(IMAGE_ENCODER, CLIP_VIT_H_14) if transformer.image_tokens else None,
        2 if index is not None and index.boundary_ratio is not None else 1,
        transformer.image_to_video or (index is not None and index.expand_timesteps),
        defaults_for(transformer).segment_frame_length if transformer.animate else None,
    )
