"""CLIP image preprocessing: transformers' ``CLIPImageProcessor`` (its PIL backend, the "slow"
processor) with Pillow and NumPy only.

Per image, as transformers does it: conversion to RGB (transparency composited onto white), a resize
with Pillow (shortest edge to ``size``, the long edge ``int(size * long / short)``, or to an exact
``height x width``; ``resample`` is Pillow's filter number, 3 = bicubic), a center crop (offsets
``(H - h) // 2``; an image smaller than the crop is zero-padded first), rescaling in float64 rounded
to float32 (``x * rescale_factor``) and normalisation in float32 (``(x - mean) / std``). The result is
``float32 [B, 3, crop_h, crop_w]``, the ``pixel_values`` of a CLIP vision model.

transformers >= 5 runs ``CLIPImageProcessor`` on torchvision when it is installed, which resizes
slightly differently; ``CLIPImageProcessorPil`` (or ``backend="pil"``) is the one reproduced here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from PIL import Image, ImageOps

from wanjax.errors import ConfigError, WanjaxError
from wanjax.io.component import Component
from wanjax.models.config import ComponentConfig

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}

ImageInput = Image.Image | np.ndarray | str | Path
Size = tuple[str, tuple[int, ...]]  # ("shortest_edge", (n,)) or ("exact", (height, width))


def _size(value: Any, name: str, square: bool) -> Size:
    """transformers' ``get_size_dict``: an int is the shortest edge (``square``: both sides), a dict
    holds ``shortest_edge`` or ``height`` and ``width``, a pair is ``(height, width)``."""
    if isinstance(value, dict):
        value = {k: v for k, v in value.items() if v is not None}
        if set(value) == {"shortest_edge"}:
            return "shortest_edge", (int(value["shortest_edge"]),)
        if set(value) == {"height", "width"}:
            return "exact", (int(value["height"]), int(value["width"]))
        raise ConfigError(f"{name} {value} is not supported (use shortest_edge, or height and width)")
    if isinstance(value, tuple) and len(value) == 2:
        return "exact", (int(value[0]), int(value[1]))
    if isinstance(value, int) and not isinstance(value, bool):
        return ("exact", (value, value)) if square else ("shortest_edge", (value,))
    raise ConfigError(f"{name} must be an int, a pair or a size dict, got {value!r}")


@dataclasses.dataclass(frozen=True)
class ImageProcessorConfig(ComponentConfig):
    """``image_processor/preprocessor_config.json`` of a ``CLIPImageProcessor``; the defaults are
    that class's (and Wan 2.1 image-to-video's)."""

    do_resize: bool = True
    size: Any = 224  # an int: the shortest edge
    resample: int = 3
    do_center_crop: bool = True
    crop_size: Any = 224  # an int: a square
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: float | tuple[float, ...] = OPENAI_CLIP_MEAN
    image_std: float | tuple[float, ...] = OPENAI_CLIP_STD
    do_convert_rgb: bool = True
    image_processor_type: str = "CLIPImageProcessor"

    _IGNORED_FIELDS: ClassVar[frozenset[str]] = frozenset(
        {"processor_class", "feature_extractor_type", "input_data_format", "data_format", "return_tensors"}
    )

    @property
    def resize(self) -> Size:
        return _size(self.size, "size", square=False)

    @property
    def crop(self) -> tuple[int, int]:
        _, (height, width) = _size(self.crop_size, "crop_size", square=True)
        return height, width

    def resized_shape(self, height: int, width: int) -> tuple[int, int]:
        """``(height, width)`` after the resize: transformers' ``get_resize_output_image_size`` with
        ``default_to_square=False`` for a shortest edge."""
        rule, values = self.resize
        if rule == "exact":
            return values[0], values[1]
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = values[0], int(values[0] * long / short)
        return (new_long, new_short) if width <= height else (new_short, new_long)

    def validate(self, source: str) -> None:
        if not self.image_processor_type.startswith("CLIPImageProcessor"):
            raise ConfigError(
                f"{source}: image_processor_type {self.image_processor_type!r} is not supported "
                "(only CLIPImageProcessor)"
            )
        if self.resample not in RESAMPLE:
            raise ConfigError(f"{source}: resample {self.resample!r} is not a Pillow filter (0-5)")
        try:
            sizes = [*self.resize[1], *self.crop]
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None
        if min(sizes) < 1:
            raise ConfigError(
                f"{source}: size and crop_size must be positive, got {self.size}, {self.crop_size}"
            )
        for name in ("image_mean", "image_std"):
            values = np.atleast_1d(np.asarray(getattr(self, name), np.float64))
            if values.ndim != 1 or values.size not in (1, 3):
                raise ConfigError(f"{source}: {name} must be one value or one per RGB channel")
        if not np.all(np.asarray(self.image_std, np.float64)):
            raise ConfigError(f"{source}: image_std must be non-zero")


IMAGE_PROCESSOR = Component(
    "image_processor", config=ImageProcessorConfig, config_file="preprocessor_config.json"
)


def load_image(path: str | Path) -> Image.Image:
    """An image file as diffusers' ``load_image`` opens it: EXIF orientation applied, then
    ``convert("RGB")`` (which drops transparency without compositing)."""
    try:
        with Image.open(path) as opened:
            image = ImageOps.exif_transpose(opened).convert("RGB")
    except FileNotFoundError:
        raise WanjaxError(f"{path}: no such image file") from None
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise WanjaxError(f"{path}: cannot read image ({e})") from None
    if 0 in image.size:
        raise WanjaxError(f"{path}: empty image ({image.width}x{image.height})")
    return image


def _composite_on_white(rgba: np.ndarray) -> np.ndarray:
    """transformers' ``convert_to_rgb`` of a uint8 RGBA array: blended in float64, rounded."""
    alpha = rgba[..., 3:4] / 255
    return np.round(alpha * rgba[..., :3] + (1 - alpha) * 255).astype(np.uint8)


def rgb_pixels(image: ImageInput, convert_rgb: bool = True) -> np.ndarray:
    """``uint8 (H, W, 3)`` pixels of a PIL image, a uint8 ``(H, W[, 1|3|4])`` array or an image file
    (opened with :func:`load_image`); with ``convert_rgb``, transformers' ``convert_to_rgb``
    (transparency composited onto white, grey repeated)."""
    if isinstance(image, str | Path):
        image = load_image(image)
    if isinstance(image, Image.Image):
        if 0 in image.size:
            raise WanjaxError(f"empty image ({image.width}x{image.height})")
        try:
            if convert_rgb and ("A" in image.getbands() or image.info.get("transparency") is not None):
                rgba = image.convert("RGBA")
                white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
                image = Image.alpha_composite(white, rgba).convert("RGB")
            elif convert_rgb:
                image = image.convert("RGB")
            pixels = np.array(image)
        except (OSError, ValueError) as e:
            raise WanjaxError(f"cannot decode image ({e})") from None
    elif isinstance(image, np.ndarray):
        pixels = image[..., None] if image.ndim == 2 else image
        if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[-1] not in (1, 3, 4):
            raise WanjaxError(
                f"image arrays must be uint8 (H, W[, 1|3|4]) channels-last, got {image.dtype} {image.shape}"
            )
        if convert_rgb and pixels.shape[-1] == 1:
            pixels = np.repeat(pixels, 3, axis=-1)
        elif convert_rgb and pixels.shape[-1] == 4:
            pixels = _composite_on_white(pixels)
    else:
        raise WanjaxError(f"not an image: {type(image).__name__} (give a PIL image, a uint8 array or a path)")
    if pixels.ndim != 3 or pixels.shape[-1] != 3 or pixels.dtype != np.uint8:
        raise WanjaxError(
            f"image of shape {pixels.shape} ({pixels.dtype}) is not 8-bit RGB; use do_convert_rgb"
        )
    if pixels.size == 0:
        raise WanjaxError(f"empty image ({pixels.shape[1]}x{pixels.shape[0]})")
    return pixels


def center_crop(pixels: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """transformers' ``center_crop`` of ``(H, W, C)``: offsets ``(H - h) // 2``, ``(W - w) // 2``; an
    image smaller than the crop is first zero-padded (``ceil`` of half the difference before it)."""
    height, width = pixels.shape[:2]
    crop_h, crop_w = size
    top, left = (height - crop_h) // 2, (width - crop_w) // 2
    if top >= 0 and left >= 0:
        return pixels[top : top + crop_h, left : left + crop_w]
    new_h, new_w = max(crop_h, height), max(crop_w, width)
    pad_top, pad_left = math.ceil((new_h - height) / 2), math.ceil((new_w - width) / 2)
    padded = np.zeros((new_h, new_w, *pixels.shape[2:]), pixels.dtype)
    padded[pad_top : pad_top + height, pad_left : pad_left + width] = pixels
    top, left = top + pad_top, left + pad_left
    return padded[max(0, top) : min(new_h, top + crop_h), max(0, left) : min(new_w, left + crop_w)]


class ImageProcessor:
    """``processor(images)`` -> ``float32 [B, 3, H, W]`` pixel values, as ``CLIPImageProcessor``'s
    ``pixel_values``. ``images``: one image (PIL, uint8 array, path), a list of them, or a uint8
    ``(B, H, W, C)`` array."""

    def __init__(self, cfg: ImageProcessorConfig | None = None):
        self.cfg = cfg or ImageProcessorConfig()

    def preprocess(self, image: ImageInput) -> np.ndarray:
        """One image -> ``float32 (3, H, W)``."""
        cfg = self.cfg
        pixels = rgb_pixels(image, cfg.do_convert_rgb)
        if cfg.do_resize:
            height, width = cfg.resized_shape(*pixels.shape[:2])
            resized = Image.fromarray(pixels).resize((width, height), resample=cfg.resample)
            pixels = np.asarray(resized)
        if cfg.do_center_crop:
            pixels = center_crop(pixels, cfg.crop)
        x = pixels.astype(np.float64) * cfg.rescale_factor if cfg.do_rescale else pixels
        x = x.astype(np.float32)
        if cfg.do_normalize:
            x = (x - np.asarray(cfg.image_mean, np.float32)) / np.asarray(cfg.image_std, np.float32)
        return np.ascontiguousarray(x.transpose(2, 0, 1))

    def __call__(self, images: ImageInput | Sequence[ImageInput]) -> np.ndarray:
        if isinstance(images, np.ndarray) and images.ndim == 4:
            images = list(images)
        elif not isinstance(images, list | tuple):
            images = [images]
        if not images:
            raise WanjaxError("no images to preprocess")
        arrays = [self.preprocess(image) for image in images]
        shapes = sorted({a.shape for a in arrays})
        if len(shapes) > 1:
            raise WanjaxError(f"preprocessed images differ in shape ({shapes}); enable do_center_crop")
        return np.stack(arrays)


def load_image_processor(path: str | Path) -> ImageProcessor:
    """The processor of ``image_processor/preprocessor_config.json`` (``path``: the model root or
    that folder)."""
    return ImageProcessor(IMAGE_PROCESSOR.read_config(IMAGE_PROCESSOR.directory(path)))
