"""What a run prepares from its inputs with the components, before denoising, as diffusers' Wan
pipelines prepare them: an image model's conditioning (the image encoder's states and the
conditioning latents, :mod:`~wanjax.pipeline.conditioning`), video to video's source latents and
frames (:mod:`~wanjax.pipeline.video_input`), a VACE model's control (:mod:`~wanjax.pipeline.vace`),
and the size of a video given an image."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from wanjax.errors import WanjaxError
from wanjax.models.dit import VaceControl
from wanjax.models.image_processor import ImageInput
from wanjax.pipeline.conditioning import (
    check_image_size,
    conditioning_latents,
    first_frame_latents,
    open_image,
    size_for_image,
)
from wanjax.pipeline.inputs import check_image_input
from wanjax.pipeline.loading import Components
from wanjax.pipeline.vace import control_latents, layer_scales
from wanjax.pipeline.video_input import VideoInput, frames_that_fit, mask_frames, source_latents, video_frames
from wanjax.sampling.guidance import ImageConditioning

if TYPE_CHECKING:
    from PIL import Image

__all__ = ["image_conditioning", "read_video", "vace_control", "video_latents", "video_size"]


def image_conditioning(
    parts: Components,
    image: ImageInput,
    batch: int,
    height: int,
    width: int,
    num_frames: int,
    last_image: ImageInput | None = None,
) -> ImageConditioning:
    """An image-to-video model's conditioning for ``batch`` videos from ``image`` (the first frame;
    ``last_image``: the last, first-last-frame models): the image encoder's penultimate states of
    the image(s) and the conditioning latents, as diffusers' ``WanImageToVideoPipeline`` prepares them."""
    parts.geometry.check(height, width, num_frames)
    cfg, expand = parts.transformer_config, parts.expand_timesteps
    check_image_input(cfg, True, last_image is not None, str(parts.path), expand)
    parts.enter("encode")
    encoder = parts.image_encoder if cfg.image_tokens else None
    vae = parts.vae
    images = [image] if last_image is None else [image, last_image]
    with parts.stage_timing("encode").running():
        states = None if encoder is None else encoder.encode_images(images)
        place = parts.video_placement()
        if expand:
            latents = first_frame_latents(vae, image, height, width, place)
        else:
            temporal = parts.geometry.temporal
            latents = conditioning_latents(vae, image, height, width, num_frames, temporal, last_image, place)
        conditioning = ImageConditioning(jnp.asarray(latents), states, expand).repeat(batch)
        jax.block_until_ready(conditioning)
    return conditioning


def video_latents(parts: Components, frames: Sequence[Image.Image], height: int, width: int) -> np.ndarray:
    """Video to video's source: the normalised VAE latents ``(1, z, T', h, w)`` of ``frames`` resized to
    ``width x height``, as diffusers' ``WanVideoToVideoPipeline`` prepares them."""
    parts.geometry.check(height, width, len(frames))
    parts.enter("encode")
    vae = parts.vae
    with parts.stage_timing("encode").running():
        return source_latents(vae, frames, height, width, parts.video_placement())


def vace_control(
    parts: Components,
    frames: Sequence[Image.Image] | None,
    mask: VideoInput | ImageInput | None,
    reference_images: Sequence[ImageInput],
    height: int,
    width: int,
    num_frames: int,
    conditioning_scale: float | Sequence[float] = 1.0,
    fps: float | None = None,
) -> VaceControl:
    """A VACE model's control for one video: the control latents ``(1, 96, T' + R, h, w)`` of the
    control ``frames`` (None: black), the ``mask`` (a video of as many frames, or one image for all;
    None: all generated) and ``R`` reference images, and the scale of each vace layer."""
    scale = layer_scales(conditioning_scale, len(parts.transformer_config.vace_layers or ()))
    parts.geometry.check(height, width, num_frames)
    masks = None if mask is None else mask_frames(mask, num_frames, fps or parts.defaults.fps)
    parts.enter("encode")
    vae, size = parts.vae, (height, width, num_frames, parts.geometry.temporal)
    with parts.stage_timing("encode").running():
        latents = control_latents(vae, frames, masks, reference_images, *size, parts.video_placement())
    return VaceControl(jnp.asarray(latents), jnp.asarray(scale))


def video_size(
    parts: Components,
    image: ImageInput | None = None,
    height: int | None = None,
    width: int | None = None,
    max_area: int | None = None,
) -> tuple[int, int]:
    """``(height, width)`` of a video: given values kept; without an image, the model's defaults for
    those left out; with one, the size of area about ``max_area`` (default: the defaults' area) with
    the image's aspect, in multiples of the model's latent patch (as diffusers' image-to-video examples
    size it). WanjaxError for an image smaller than a patch."""
    d = parts.defaults
    if image is None:
        return height or d.height, width or d.width
    max_area = max_area or d.height * d.width
    image = open_image(image)
    step = parts.geometry.pixel_steps[0]  # diffusers' examples round both sides to this one
    check_image_size(image, step)
    return size_for_image(image.size, max_area, step, height, width)


def read_video(
    parts: Components, video: VideoInput, num_frames: int | None = None, fps: float | None = None
) -> list[Image.Image]:
    """The frames video to video reads from ``video`` (a file read at ``fps``, images or ``uint8 [T, H,
    W, 3]`` frames): ``num_frames`` of them (WanjaxError when it has fewer), or left out the model's
    default number or as many as it has (``4n+1``)."""
    fps = fps or parts.defaults.fps
    wanted = parts.defaults.frames if num_frames is None else num_frames
    frames = video_frames(video, fps, wanted)
    fit = frames_that_fit(len(frames), parts.geometry.temporal)
    if num_frames is not None and len(frames) < num_frames:
        raise WanjaxError(
            f"the video gives {len(frames)} frames at {fps:g} fps, fewer than the {num_frames} asked "
            f"for: ask for {fit} frames or fewer"
        )
    return frames[:fit]
