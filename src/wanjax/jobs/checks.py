"""A request checked against its pipeline's model before any work: outputs, devices, attention,
VAE tiling, the video's size, its images and prompts, the step cache (one-line WanjaxError each)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from wanjax.errors import ConfigError, WanjaxError
from wanjax.jobs import preflight as validation
from wanjax.jobs.cache_flags import CacheFlags
from wanjax.jobs.groups import ImageFlags, PromptFlags, SourceVideoFlags, VaceFlags
from wanjax.jobs.opening import defaults_of, model_label
from wanjax.jobs.requests import OUTPUT_SUFFIXES, Request
from wanjax.kernels.attention import AttentionSpec
from wanjax.models.config import TransformerConfig
from wanjax.parallel.mesh import MeshSpec
from wanjax.pipeline import preparation
from wanjax.pipeline.components import IMAGE_COMPONENTS
from wanjax.pipeline.conditioning import check_image_size, open_image
from wanjax.pipeline.inputs import check_image_input, check_video_to_video
from wanjax.pipeline.pipeline import WanPipeline
from wanjax.pipeline.prompts import read_prompt_file
from wanjax.pipeline.video_input import mask_frames
from wanjax.sampling.cache.step_cache import resolve as resolve_cache

if TYPE_CHECKING:
    from PIL import Image


def check_devices(mesh: MeshSpec | str | None, heads: int | None) -> None:
    """The requested mesh fits the visible devices (and splits the heads), before any weight is read."""
    import jax

    validation.check_mesh(mesh, jax.device_count(), heads)


def check_attention(pipe: WanPipeline, cfg: TransformerConfig) -> None:
    """The attention backend can run the transformer's attention in this dtype, before any work."""
    from wanjax.kernels.attention import check_backend
    from wanjax.models.dit import attention_shapes

    spec = pipe.components.settings.attention_backend
    window = spec.window_size if isinstance(spec, AttentionSpec) else None
    check_backend(spec, attention_shapes(cfg, pipe.components.settings.dtype, window))


def check_output_paths(request: Request, **more: str | Path | None) -> None:
    """Every file the command will write can be written (checked before any work)."""
    flags = request.flags()
    outputs = {f"--{key}": flags.get(key) for key in (*OUTPUT_SUFFIXES, "metrics_json")}
    validation.check_outputs({**outputs, **more})
    validation.check_distinct({**outputs, **more})


def check_vae_tiling(pipe: WanPipeline) -> None:
    """``--vae_tiling`` against the VAE's config (read without weights), before any work."""
    if pipe.components.settings.vae_tiling is not None:
        try:
            pipe.components.settings.vae_tiling.check_stride(pipe.components.geometry.spatial)
        except ConfigError as e:
            raise ConfigError(f"--vae_tiling {e}") from None


def resolve_video(
    pipe: WanPipeline,
    given: Mapping[str, Any],
    earlier: Mapping[str, Any],
    init: np.ndarray | None,
    batch: int,
    init_name: str | None,
    image: Image.Image | None = None,
    references: int = 0,
) -> dict[str, int]:
    """Height, width and frames: flag > earlier stage > ``--init_latents`` shape > (height and width)
    the ``--image``'s aspect at the model's default area > model default; checked against the init
    latents' shape when there are some (which hold a latent frame per VACE reference image first)."""
    from_init = {}
    if init is not None:
        from_init = pipe.components.geometry.video_size(
            (*init.shape[:2], init.shape[2] - references, *init.shape[3:])
        )
    defaults = defaults_of(pipe)
    video: dict[str, int] = {}
    for key in ("height", "width", "frames"):
        for source in (given, earlier, from_init):
            if source.get(key) is not None:
                video[key] = int(source[key])
                break
    if image is not None and not {"height", "width"} <= video.keys():
        area = defaults.height * defaults.width
        video["height"], video["width"] = preparation.video_size(
            pipe.components, image, video.get("height"), video.get("width"), area
        )
    video = {key: video.get(key, getattr(defaults, key)) for key in ("height", "width", "frames")}
    frames = video["frames"] + references * pipe.components.geometry.temporal
    expected = pipe.components.geometry.latent_shape(batch, video["height"], video["width"], frames)
    if init is not None and tuple(init.shape) != expected:
        raise WanjaxError(
            f"--init_latents {init_name} has shape {list(init.shape)} but {batch} prompt(s) at "
            f"{video['width']}x{video['height']}, {video['frames']} frames need {list(expected)}"
        )
    return video


def open_images(
    pipe: WanPipeline, flags: ImageFlags, cfg: TransformerConfig
) -> tuple[Image.Image | None, Image.Image | None]:
    """``--image`` and ``--last_image`` opened, after checking that the model takes them (and, when it
    does, that its image components are sound); one-line errors for unreadable or too small images."""
    given = (flags.image is not None, flags.last_image is not None)
    check_image_input(cfg, *given, model_label(pipe.components.source), pipe.components.expand_timesteps)
    if flags.image is None:
        return None, None
    pipe.components.sources.check((*IMAGE_COMPONENTS, "vae") if cfg.image_tokens else ("vae",))
    step = pipe.components.geometry.pixel_steps[0]
    opened = []
    for name in ("image", "last_image"):
        path = getattr(flags, name)
        if path is None:
            opened.append(None)
            continue
        try:
            image = open_image(path)
        except WanjaxError as e:
            raise WanjaxError(f"--{name} {e}") from None
        check_image_size(image, step, f"--{name} {path}")
        opened.append(image)
    return opened[0], opened[1]


def open_source_video(
    pipe: WanPipeline, flags: SourceVideoFlags, cfg: TransformerConfig, fps: float, frames: int | None
) -> list[Image.Image] | None:
    """``--video``'s frames at ``fps`` (its first ``frames``; left out, the model's default number or
    as many as it has), after checking that the model re-makes videos; one-line errors for a file
    that is not a video, or too short or too small for the run."""
    if flags.video is None:
        return None
    try:
        check_video_to_video(cfg, False)
    except WanjaxError:
        raise WanjaxError(
            f"--video is for a text-to-video model; {model_label(pipe.components.source)} starts from an image (--image)"
        ) from None
    pipe.components.sources.check(("vae",))
    path = Path(flags.video)
    if not path.is_file():
        raise WanjaxError(f"--video {path}: file not found")
    try:
        opened = preparation.read_video(pipe.components, path, frames, fps)
    except WanjaxError as e:
        raise WanjaxError(f"--video: {e}") from None
    check_image_size(opened[0], pipe.components.geometry.pixel_steps[0], f"--video {path}")
    return opened


@dataclasses.dataclass(frozen=True)
class VaceInputs:
    """A VACE run's control, opened: the mask's frames (None: all generated), the reference images
    and the control's weight."""

    masks: list[Image.Image] | None
    references: list[Image.Image]
    scale: float


def open_vace_inputs(
    pipe: WanPipeline, flags: VaceFlags, cfg: TransformerConfig, num_frames: int, fps: float
) -> VaceInputs | None:
    """``--mask`` (``num_frames`` frames, or one image for all) and each ``--reference_image`` opened,
    after checking that the model is a VACE model (None for any other, which must be given none);
    one-line errors naming the flag."""
    if not cfg.vace:
        if flags.given:
            raise WanjaxError(
                f"--mask, --reference_image and --conditioning_scale are for a VACE model; "
                f"{model_label(pipe.components.source)} is not one"
            )
        return None
    masks = None
    if flags.mask is not None:
        if not Path(flags.mask).is_file():
            raise WanjaxError(f"--mask {flags.mask}: file not found")
        try:
            masks = mask_frames(flags.mask, num_frames, fps)
        except WanjaxError as e:
            raise WanjaxError(f"--mask: {e}") from None
    references = []
    for path in flags.reference_image:
        try:
            references.append(open_image(path))
        except WanjaxError as e:
            raise WanjaxError(f"--reference_image {e}") from None
        check_image_size(references[-1], 8, f"--reference_image {path}")
    scale = flags.conditioning_scale
    return VaceInputs(masks, references, defaults_of(pipe).conditioning_scale if scale is None else scale)


def prompt_list(text: PromptFlags) -> list[str]:
    """The prompts of this run: ``--prompt_file``'s (see :func:`read_prompt_file`) or the ``--prompt`` values."""
    if not text.prompt_file:
        return list(text.prompt)
    try:
        return read_prompt_file(text.prompt_file)
    except WanjaxError as e:
        raise WanjaxError(f"--prompt_file {e}") from None


def check_cache(
    cache: CacheFlags, cfg: TransformerConfig, params: Mapping[str, Any], guided: bool, first_frame: bool
) -> None:
    """The step cache resolves for this model and run (a MagCache curve exists for it) before any
    work; ``first_frame``: an image is the run's first latent frame (TI2V)."""
    steps = params["num_inference_steps"]
    experts = [0] * steps if "boundary_ratio" in params else None  # the curve is what is checked here
    config = cache.config()
    if config.enabled and params.get("strength", 1) < 1:
        raise ConfigError(
            f"--cache {cache.cache} runs a whole schedule, not video to video's part of one "
            f"(--strength {params['strength']}): leave the cache off"
        )
    try:
        resolve_cache(config, cfg, steps, guided, experts, first_frame)
    except ConfigError as e:
        raise ConfigError(f"--cache {cache.cache}: {e}") from None
