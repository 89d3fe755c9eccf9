"""Image-to-video conditioning latents, as diffusers' ``WanImageToVideoPipeline.prepare_latents``.

The given image is resized to the video's size and scaled to [-1, 1] (diffusers' ``VideoProcessor``:
a Lanczos resize to exactly ``width x height``), placed as frame 0 of an otherwise black video (and a
last image as its last frame), VAE-encoded (the posterior's mode) and normalised. Four mask channels
say which latent frames hold a given image: the mask is 1 on the given frames, 0 elsewhere, and the
first frame counts ``temporal`` times (one per pixel frame of the first latent frame), folded into the
latent frames' 4 sub-frames. The result, ``[mask (4); latents (z)]`` per latent frame, is what the
transformer reads beside the noisy latents (:class:`~wanjax.sampling.guidance.ImageConditioning`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
from PIL import Image

from wanjax.errors import WanjaxError
from wanjax.models.image_processor import ImageInput, load_image
from wanjax.parallel.layouts import to_host


def size_for_image(
    image_size: tuple[int, int],
    max_area: int,
    step: int,
    height: int | None = None,
    width: int | None = None,
) -> tuple[int, int]:
    """``(height, width)`` of a video for an image of ``(width, height)`` pixels: both left out, the
    size of area about ``max_area`` with the image's aspect, each side rounded down to a multiple of
    ``step`` (diffusers' Wan image-to-video examples: ``round(sqrt(max_area * aspect)) // step * step``);
    one given, the other from the aspect, rounded down alike; both given, themselves. WanjaxError when
    the image is too narrow for a side to reach ``step``."""
    image_w, image_h = image_size
    aspect = image_h / image_w
    if height is None and width is None:
        height = round(math.sqrt(max_area * aspect)) // step * step
        width = round(math.sqrt(max_area / aspect)) // step * step
    elif height is None:
        height = round(width * aspect) // step * step
    elif width is None:
        width = round(height / aspect) // step * step
    if height < step or width < step:
        raise WanjaxError(
            f"an image of {image_w}x{image_h} is too narrow for a video of that shape (a side would be "
            f"under {step} pixels); give --height and --width"
        )
    return height, width


def check_image_size(image: Image.Image, step: int, name: str = "image") -> None:
    """WanjaxError when ``image`` has fewer than ``step`` pixels on a side (less than one latent
    patch: nothing a video could start from)."""
    if min(image.size) < step:
        raise WanjaxError(
            f"{name} of {image.width}x{image.height} is too small: give one at least {step} pixels on each side"
        )


def open_image(image: ImageInput) -> Image.Image:
    """``image`` as a PIL image: a path is opened as diffusers' ``load_image`` opens it (EXIF
    orientation applied, converted to RGB), uint8 ``(H, W, 3)`` pixels wrapped, a PIL image kept."""
    if isinstance(image, str) or hasattr(image, "__fspath__"):
        image = load_image(image)
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] != 3:
            raise WanjaxError(f"an image array must be uint8 (H, W, 3), got {image.dtype} {image.shape}")
        image = Image.fromarray(image)
    if not isinstance(image, Image.Image):
        raise WanjaxError(f"an image must be a PIL image, a path or uint8 pixels, got {type(image).__name__}")
    if image.width < 1 or image.height < 1:
        raise WanjaxError("the image is empty")
    return image


def video_frame(image: ImageInput, height: int, width: int) -> np.ndarray:
    """``image`` (see :func:`open_image`) as a ``[3, height, width]`` float32 frame in [-1, 1]:
    converted to RGB as Pillow converts (transparency dropped), Lanczos-resized to exactly that size,
    as diffusers' ``VideoProcessor``."""
    resized = open_image(image).convert("RGB").resize((width, height), resample=Image.Resampling.LANCZOS)
    return signed_pixels(np.asarray(resized)).transpose(2, 0, 1)


def signed_pixels(pixels: np.ndarray) -> np.ndarray:
    """uint8 pixels as float32 in [-1, 1], ``2 * p / 255 - 1`` (diffusers' processors)."""
    unit = pixels.astype(np.float32) / np.float32(255.0)
    return np.float32(2.0) * unit - np.float32(1.0)


def uint8_pixels(signed: np.ndarray) -> np.ndarray:
    """The uint8 pixels :func:`signed_pixels` made ``signed`` from (its exact inverse: 255 values
    2/255 apart)."""
    return np.rint((signed.astype(np.float32) + np.float32(1.0)) * np.float32(127.5)).astype(np.uint8)


def condition_mask(num_frames: int, temporal: int, latent_hw: tuple[int, int], last: bool) -> np.ndarray:
    """The 4-channel mask ``(1, temporal, T', h, w)`` of the given frames (the first, and the last
    when ``last``), laid out as diffusers lays it out."""
    h, w = latent_hw
    mask = np.zeros((1, 1, num_frames, h, w), np.float32)
    mask[:, :, 0] = 1
    if last:
        mask[:, :, -1] = 1
    first = np.repeat(mask[:, :, 0:1], temporal, axis=2)
    mask = np.concatenate([first, mask[:, :, 1:]], axis=2)
    mask = mask.reshape(1, -1, temporal, h, w)
    return mask.transpose(0, 2, 1, 3, 4)


def conditioning_latents(
    vae: Any,
    image: ImageInput,
    height: int,
    width: int,
    num_frames: int,
    temporal: int,
    last_image: ImageInput | None = None,
    place: Callable[[np.ndarray], Any] = jnp.asarray,
) -> np.ndarray:
    """``(1, temporal + z, T', h, w)`` float32: the mask and the normalised VAE latents of a video whose
    first frame is ``image`` (and last frame ``last_image``), black elsewhere (``temporal``: the VAE's
    frames per latent frame). ``place`` puts the video where the VAE encodes it (e.g. split over a
    mesh)."""
    video = np.zeros((1, 3, num_frames, height, width), np.float32)
    video[0, :, 0] = video_frame(image, height, width)
    if last_image is not None:
        video[0, :, -1] = video_frame(last_image, height, width)
    latents = encode_video(vae, video, place)
    mask = condition_mask(num_frames, temporal, latents.shape[3:], last_image is not None)
    return np.concatenate([mask, latents], axis=1)


def first_frame_latents(
    vae: Any, image: ImageInput, height: int, width: int, place: Callable[[np.ndarray], Any] = jnp.asarray
) -> np.ndarray:
    """``(1, z, 1, h, w)`` float32: the normalised VAE latents of ``image`` alone, as one frame (Wan 2.2
    TI2V's ``expand_timesteps``: they stand in for the first latent frame)."""
    return encode_video(vae, video_frame(image, height, width)[None, :, None], place)


def encode_video(vae: Any, video: np.ndarray, place: Callable[[np.ndarray], Any]) -> np.ndarray:
    """The normalised VAE latents (the posterior's mode) of a ``(1, 3, T, H, W)`` video in [-1, 1]."""
    return to_host(vae.normalize_latents(vae.encode(place(video)))).astype(np.float32)
