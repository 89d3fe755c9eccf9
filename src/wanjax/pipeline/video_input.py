"""Video-to-video's source: the input video's frames and their latents, as diffusers'
``WanVideoToVideoPipeline`` prepares them.

A video is a file (read at the run's frame rate, :func:`~wanjax.io.video_reader.read_frames`), a
list of images or ``uint8 [T, H, W, 3]`` frames. Each frame is resized and scaled as an
image-to-video model's image is (a Lanczos resize to exactly ``width x height``, [-1, 1]: diffusers'
``VideoProcessor``), the clip VAE-encoded (the posterior's mode) and normalised. The sampler starts
from these latents noised to the first step a ``strength`` runs
(:mod:`~wanjax.sampling.scheduler.strength`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
from PIL import Image

from wanjax.errors import WanjaxError
from wanjax.io.video_reader import NotAVideo, read_frames
from wanjax.models.image_processor import ImageInput
from wanjax.pipeline.conditioning import encode_video, open_image, video_frame

VideoInput = str | Path | np.ndarray | Sequence[ImageInput]


def video_frames(video: VideoInput, fps: float, limit: int) -> list[Image.Image]:
    """Up to ``limit`` frames of ``video``: a file's sampled at ``fps``, given frames as they are."""
    if isinstance(video, str | Path):
        frames = read_frames(video, fps, limit)
    elif isinstance(video, np.ndarray):
        if video.dtype != np.uint8 or video.ndim != 4 or video.shape[-1] != 3:
            raise WanjaxError(f"video frames must be uint8 (T, H, W, 3), got {video.dtype} {video.shape}")
        frames = [Image.fromarray(frame) for frame in video[:limit]]
    else:
        frames = [open_image(frame) for frame in list(video)[:limit]]
    if not frames:
        where = f"{video} " if isinstance(video, str | Path) else ""
        raise WanjaxError(f"the video {where}holds no frame")
    return frames


def frames_that_fit(available: int, temporal: int) -> int:
    """The most frames a video of ``available`` frames gives a model (``temporal * n + 1``)."""
    return (available - 1) // temporal * temporal + 1


def source_latents(
    vae: Any,
    frames: Sequence[Image.Image],
    height: int,
    width: int,
    place: Callable[[np.ndarray], Any] = jnp.asarray,
) -> np.ndarray:
    """``(1, z, T', h, w)`` float32: the normalised VAE latents of ``frames`` resized to
    ``width x height`` (``place``: where the VAE encodes the video, e.g. split over a mesh)."""
    video = np.stack([video_frame(frame, height, width) for frame in frames], axis=1)[None]
    return encode_video(vae, video, place)


def mask_frames(mask: VideoInput | ImageInput, num_frames: int, fps: float) -> list[Image.Image]:
    """A mask of ``num_frames`` frames: one image (a PIL image, an image file) for every frame, or a
    video's frames (as :func:`video_frames`); WanjaxError when a video's count differs, or for a file
    that is neither."""
    if isinstance(mask, Image.Image):
        return [mask] * num_frames
    if isinstance(mask, str | Path):
        try:
            return [open_image(mask)] * num_frames
        except (WanjaxError, OSError):
            pass  # not an image: a video
    try:
        frames = video_frames(mask, fps, num_frames)
    except NotAVideo:
        raise WanjaxError(
            f"{mask} is neither a video nor an image that can be read: give the mask as one image (for "
            "every frame) or a video of the run's frames, white where the video is generated and black "
            "where it is kept (e.g. a PNG or an mp4)"
        ) from None
    if len(frames) != num_frames:
        raise WanjaxError(f"the mask has {len(frames)} frames; the video has {num_frames}: give as many")
    return frames
