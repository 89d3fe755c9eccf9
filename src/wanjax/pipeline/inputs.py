"""What a run's inputs must be: the images a transformer takes, conditioning read from a stage file,
and the video sizes a model can generate (:class:`VideoGeometry`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from wanjax.errors import FlagError, WanjaxError
from wanjax.models.config import TransformerConfig
from wanjax.models.dit import WanTransformer
from wanjax.sampling.guidance import ImageConditioning


def check_image_input(
    cfg: TransformerConfig, image: bool, last_image: bool, source: str, expand_timesteps: bool = False
) -> None:
    """WanjaxError unless the images given (a first frame ``image``, a ``last_image``) are the ones the
    transformer takes: a first frame for an image-to-video model, and a last one too for a
    first-last-frame model; none for text-to-video; a first frame or none for a text-and-image model
    (``expand_timesteps``, Wan 2.2 TI2V)."""
    if last_image and not image:
        raise FlagError("a last image needs a first one: give --image too", "image")
    if expand_timesteps:
        if last_image:
            raise FlagError(
                f"{source} (Wan 2.2 TI2V) takes a first frame only; leave --last_image out", "last_image"
            )
        return
    if cfg.image_to_video and not image:
        raise FlagError(
            f"{source} is an image-to-video model: give the first frame with --image FILE "
            "(Python: pipe(prompt, image=...))",
            "image",
        )
    if image and not cfg.image_to_video:
        raise FlagError(
            f"{source} is a text-to-video model: it takes no image; leave --image out or use an "
            "image-to-video model (e.g. Wan-AI/Wan2.1-I2V-14B-480P-Diffusers)",
            "image",
        )
    if cfg.first_last_frame and image and not last_image:
        raise FlagError(
            f"{source} is a first-last-frame model: give the last frame too with --last_image FILE "
            "(Python: last_image=...)",
            "last_image",
        )
    if last_image and cfg.image_tokens and not cfg.first_last_frame:  # its image tokens are one image's
        raise FlagError(
            f"{source} takes a first frame only (not a first-last-frame model, e.g. "
            "Wan-AI/Wan2.1-FLF2V-14B-720P-diffusers); leave --last_image out",
            "last_image",
        )


def check_conditioning(
    cfg: TransformerConfig, conditioning: ImageConditioning, latent_shape: Sequence[int], where: str
) -> None:
    """WanjaxError unless ``conditioning`` (of one video, e.g. read from a stage file) fits this
    transformer and a video of latents ``latent_shape``: its latents on the same grid with the channels
    the transformer adds to the noisy ones, one image state per given frame, ``image_dim`` wide."""
    latents, states = conditioning.latents, conditioning.image_embeds
    if conditioning.first_frame:  # expand_timesteps: the image's own latents, one frame
        expected = (1, latent_shape[1], 1, *latent_shape[3:])
    else:
        expected = (1, cfg.in_channels - latent_shape[1], *latent_shape[2:])
    if tuple(latents.shape) != expected:
        raise WanjaxError(
            f"{where}: condition_latents {list(latents.shape)} but this model and video need {list(expected)}; "
            "re-run `wanjax encode --image ...` with this model and video size"
        )
    if not cfg.image_tokens:
        if states is not None:
            raise WanjaxError(
                f"{where}: image_embeds given but this model takes no image-encoder states; they come "
                "from another model (re-run `wanjax encode --image ...` with it)"
            )
        return
    images = 2 if cfg.first_last_frame else 1
    if states is None or states.shape[0] != images or states.shape[-1] != cfg.image_dim:
        shape = None if states is None else list(states.shape)
        raise WanjaxError(
            f"{where}: image_embeds {shape} but this model takes {images} image(s) of width "
            f"{cfg.image_dim}; they come from another model (re-run `wanjax encode --image ...` with it)"
        )


@dataclasses.dataclass(frozen=True)
class VideoGeometry:
    """How video sizes map to latent sizes for one model (from its VAE and transformer configs)."""

    z_dim: int = 16
    spatial: int = 8  # pixels per latent along H and W
    temporal: int = 4  # frames per latent frame after the first
    patch: tuple[int, int] = (2, 2)  # transformer patch along the latent H and W

    @property
    def pixel_steps(self) -> tuple[int, int]:
        """Pixels per transformer token along H and W: what video sizes must be multiples of."""
        return self.spatial * self.patch[0], self.spatial * self.patch[1]

    def check(self, height: int, width: int, num_frames: int) -> None:
        """Raise WanjaxError (naming valid values) unless the sizes can be generated."""
        for name, value, step in zip(("height", "width"), (height, width), self.pixel_steps, strict=True):
            if value < step or value % step:
                near = max(step, round(value / step) * step)
                raise WanjaxError(f"{name} {value} must be a positive multiple of {step} (e.g. {near})")
        if num_frames < 1 or (num_frames - 1) % self.temporal:
            low = max(1, (num_frames - 1) // self.temporal * self.temporal + 1)
            raise WanjaxError(
                f"frames {num_frames} must be {self.temporal}n+1 (e.g. {low} or {low + self.temporal})"
            )

    def latent_frames(self, num_frames: int) -> int:
        """The latent frames of a ``num_frames`` video: the first, then one per ``temporal`` frames."""
        return (num_frames - 1) // self.temporal + 1

    def latent_shape(self, batch: int, height: int, width: int, num_frames: int) -> tuple[int, ...]:
        self.check(height, width, num_frames)
        return (
            batch,
            self.z_dim,
            self.latent_frames(num_frames),
            height // self.spatial,
            width // self.spatial,
        )

    def video_size(self, latent_shape: Sequence[int]) -> dict[str, int]:
        """``{"batch", "frames", "height", "width"}`` of the video a latent shape decodes to."""
        b, _, t, h, w = latent_shape
        return {
            "batch": b,
            "frames": 1 + self.temporal * (t - 1),
            "height": h * self.spatial,
            "width": w * self.spatial,
        }


def check_embeddings(
    model: WanTransformer,
    prompt_embeds: Any,
    negative_prompt_embeds: Any,
    latents: Any,
    guidance_scale: float,
) -> None:
    """WanjaxError unless the text embeddings fit the transformer, the latents' batch and the guidance."""
    text_dim = model.cfg.text_dim
    for name, e in (("prompt_embeds", prompt_embeds), ("negative_prompt_embeds", negative_prompt_embeds)):
        if e is None:
            continue
        if len(e.shape) != 3 or e.shape[2] != text_dim:
            raise WanjaxError(
                f"{name} {tuple(e.shape)} must be [B, L, {text_dim}] for this transformer (text_dim "
                f"{text_dim}); were they encoded for another model?"
            )
        if e.shape[0] != latents.shape[0]:
            raise WanjaxError(f"{name} has batch {e.shape[0]} but the latents have {latents.shape[0]}")
    if negative_prompt_embeds is None and guidance_scale > 1:
        raise WanjaxError(f"guidance_scale {guidance_scale} > 1 needs negative_prompt_embeds")
    if negative_prompt_embeds is not None and negative_prompt_embeds.shape != prompt_embeds.shape:
        raise WanjaxError(
            f"negative_prompt_embeds {tuple(negative_prompt_embeds.shape)} and prompt_embeds "
            f"{tuple(prompt_embeds.shape)} differ in shape"
        )


def check_video_to_video(cfg: TransformerConfig, image: bool) -> None:
    """WanjaxError unless a video-to-video run can go: a text-to-video model, no image."""
    if cfg.image_to_video or image:
        raise WanjaxError(
            "video to video runs on a text-to-video model, without an image; give a video or an image"
        )


def check_video_latents(
    cfg: TransformerConfig, image: bool, source_shape: Sequence[int], noise_shape: Sequence[int]
) -> None:
    """:func:`check_video_to_video`, and source latents of the noise's shape (one source for every
    batch item, or one each)."""
    check_video_to_video(cfg, image)
    source, noise = tuple(source_shape), tuple(noise_shape)
    if source[1:] != noise[1:] or source[0] not in (1, noise[0]):
        raise WanjaxError(f"the source video's latents {list(source)} do not match the noise {list(noise)}")
