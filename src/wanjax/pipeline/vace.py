"""A VACE model's control latents, as diffusers' ``WanVACEPipeline`` prepares them.

* The control video (frames resized to exactly the run's size and scaled to [-1, 1], as an
  image-to-video model's image; none: a black video) and its mask (the same resize, then mapped to
  [0, 1]; none: all ones, everything generated) give two VAE encodings: the video where the
  binarised mask is 0 (``inactive``: what is kept) and where it is 1 (``reactive``), 32 channels.
* The mask's first channel folded 8x8 into 64 channels per latent pixel, resampled to the latent
  frames (torch's ``nearest-exact``).
* Each reference image, scaled to fit the run's size (its sides first rounded down to multiples of
  8, then torch's bilinear resize) and centred on a white canvas, VAE-encoded as one frame with zero
  ``reactive`` channels and a zero mask, prepended along time (the last given first); the noisy
  latents get one more latent frame per image, dropped before the decode.

The result ``(1, 96, T' + R, h, w)`` is what the control blocks read
(:class:`~wanjax.models.dit.VaceControl`). One deliberate difference: diffusers keeps a control video
smaller than the run's size at its own size (its tokens then no longer line up with the video's);
here every control frame is resized to the run's size.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from PIL import Image

from wanjax.errors import WanjaxError
from wanjax.models.image_processor import ImageInput
from wanjax.pipeline.conditioning import encode_video, open_image, video_frame

__all__ = ["control_latents", "fold_mask", "layer_scales", "reference_canvas"]

PATCH_PIXELS = 8  # the VAE's spatial factor: a latent pixel's pixels along each side


def layer_scales(conditioning_scale: float | Sequence[float], layers: int) -> np.ndarray:
    """The scale of each of ``layers`` vace layers' hints: one value for all, or one each (float32);
    WanjaxError for another count."""
    if np.ndim(conditioning_scale) and np.shape(conditioning_scale) != (layers,):
        raise WanjaxError(
            f"conditioning_scale holds {np.size(conditioning_scale)} values; give one, or one per vace "
            f"layer ({layers})"
        )
    return np.broadcast_to(np.asarray(conditioning_scale, np.float32), (layers,))


def bilinear(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """torch's ``interpolate(mode="bilinear", align_corners=False)`` of ``(C, H, W)`` float32."""

    def taps(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        scale = np.float32(n_in / n_out)
        src = np.maximum((np.arange(n_out, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5), 0)
        low = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
        high = np.minimum(low + 1, n_in - 1)
        return low, high, (src - low).astype(np.float32)

    y0, y1, wy = taps(image.shape[1], height)
    x0, x1, wx = taps(image.shape[2], width)
    wy, wx = wy[:, None], wx[None, :]
    top = image[:, y0][:, :, x0] * (1 - wx) + image[:, y0][:, :, x1] * wx
    bottom = image[:, y1][:, :, x0] * (1 - wx) + image[:, y1][:, :, x1] * wx
    return (top * (1 - wy) + bottom * wy).astype(np.float32)


def reference_canvas(image: ImageInput, height: int, width: int) -> np.ndarray:
    """A reference image as ``(3, height, width)`` in [-1, 1]: scaled to fit, centred on white."""
    opened = open_image(image)
    h, w = opened.height // PATCH_PIXELS * PATCH_PIXELS, opened.width // PATCH_PIXELS * PATCH_PIXELS
    pixels = video_frame(opened, h, w)
    scale = min(height / h, width / w)
    new_h, new_w = int(h * scale), int(w * scale)
    canvas = np.ones((3, height, width), np.float32)
    top, left = (height - new_h) // 2, (width - new_w) // 2
    canvas[:, top : top + new_h, left : left + new_w] = bilinear(pixels, new_h, new_w)
    return canvas


def fold_mask(mask: np.ndarray, temporal: int) -> np.ndarray:
    """The mask's first channel ``(F, H, W)`` (of ``(3, F, H, W)``) as ``(64, F', H/8, W/8)``: each
    latent pixel's 8x8 values as channels, frames resampled to ``F' = ceil(F / temporal)`` by torch's
    ``nearest-exact`` (source frame ``floor((i + 0.5) * F / F')``)."""
    frames, height, width = mask.shape[1:]
    p = PATCH_PIXELS
    folded = mask[0].reshape(frames, height // p, p, width // p, p).transpose(2, 4, 0, 1, 3)
    folded = folded.reshape(p * p, frames, height // p, width // p)
    out = (frames + temporal - 1) // temporal
    source = np.floor((np.arange(out, dtype=np.float32) + np.float32(0.5)) * np.float32(frames / out))
    return folded[:, np.minimum(source.astype(np.int64), frames - 1)]


def control_latents(
    vae: Any,
    frames: Sequence[Image.Image] | None,
    masks: Sequence[Image.Image] | None,
    references: Sequence[ImageInput],
    height: int,
    width: int,
    num_frames: int,
    temporal: int,
    place: Callable[[np.ndarray], Any] = jnp.asarray,
) -> np.ndarray:
    """``(1, 96, T' + R, h, w)`` float32: the control latents of the control ``frames`` (None: a
    black video of ``num_frames``), their ``masks`` (None: all ones; one mask frame per video frame)
    and the ``references`` (see the module docstring; ``place``: where the VAE encodes)."""
    if frames is None:
        video = np.zeros((3, num_frames, height, width), np.float32)
    else:
        video = np.stack([video_frame(f, height, width) for f in frames], axis=1)
    if masks is None:
        mask = np.ones_like(video)
    else:
        mask = np.stack([video_frame(m, height, width) for m in masks], axis=1)
        mask = np.clip((mask + np.float32(1)) / np.float32(2), 0, 1)
    binary = np.where(mask > 0.5, np.float32(1), np.float32(0))
    inactive = encode_video(vae, (video * (1 - binary))[None], place)
    reactive = encode_video(vae, (video * binary)[None], place)
    latents = np.concatenate([inactive, reactive], axis=1)
    for image in references:  # each prepended: the last reference ends up first
        encoded = encode_video(vae, reference_canvas(image, height, width)[None, :, None], place)
        latents = np.concatenate([np.concatenate([encoded, np.zeros_like(encoded)], axis=1), latents], axis=2)
    folded = fold_mask(mask, temporal)
    folded = np.concatenate([np.zeros_like(folded[:, : len(references)]), folded], axis=1)
    return np.concatenate([latents, folded[None]], axis=1).astype(np.float32)
