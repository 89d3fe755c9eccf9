"""Wan 2.2 Animate's run, as diffusers' ``WanAnimatePipeline``: a character image animated by a pose
video and a face video (``mode="animate"``), or put in place of the person a mask marks in a
background video (``mode="replace"``), in segments.

The inputs are prepared as diffusers prepares them: the reference image fitted into the video's size
on black (a Lanczos resize keeping its aspect, centred), VAE-encoded (the mode) with a 4-channel
mask of ones; its CLIP states; the pose, face and background videos Lanczos-resized (the face to the
motion encoder's square), the mask converted to gray after the resize, in ``[0, 1]``; each video
reflected back and forth to the frames the segments cover. The video is made ``segment_frame_length``
frames at a time, each segment starting ``segment_frame_length - prev_segment_conditioning_frames``
frames after the last: its latents (one latent frame more than the segment's: the reference's first)
are denoised reading the reference latents, the pose latents of its frames, its face frames, and the
conditioning latents of a video whose first ``prev_segment_conditioning_frames`` frames are the
previous segment's last decoded ones (the first segment: black, or the background's), the rest black
(or the background), with a mask of ones on those frames (replace: also where the mask is black).
Each segment's frames are decoded, the repeated ones dropped, and the video cut to the pose video's
length. The first segment starts from the given ``latents``; each draws its noise from the seed
(:meth:`~wanjax.pipeline.pipeline.WanPipeline.prepare_latents`, its segment's stream). A step cache
(TaylorSeer, the one diffusers runs on this model) goes on from segment to segment, as diffusers'
hook, which nothing resets between them: its steps counted on, its factors extrapolated across the
boundary; the result's cache report lists every segment's steps in turn.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from PIL import Image

from wanjax.errors import FlagError, WanjaxError
from wanjax.models.dit import AnimateControl
from wanjax.models.image_processor import ImageInput
from wanjax.models.vae.postprocess import to_uint8
from wanjax.parallel.layouts import to_host
from wanjax.pipeline.conditioning import encode_video, open_image, signed_pixels, video_frame
from wanjax.pipeline.options import RunOptions
from wanjax.pipeline.results import Video
from wanjax.pipeline.video_input import VideoInput, video_frames
from wanjax.sampling.cache.step_cache import CacheCarry, CacheReport
from wanjax.sampling.guidance import ImageConditioning
from wanjax.sampling.results import Denoised

__all__ = [
    "ALL_FRAMES",
    "MODES",
    "VIDEO_INPUTS",
    "AnimateConditioning",
    "AnimateSources",
    "AnimateVideos",
    "Segments",
    "animate",
    "check_inputs",
    "decode_segment",
    "decode_segments",
    "denoise_segment",
    "join_segments",
    "pad_frames",
    "prepare_conditioning",
    "prepare_inputs",
    "reference_frame",
    "run_segments",
    "segment_length",
]

MODES = ("animate", "replace")
PREV_SEGMENT_FRAMES = (1, 5)  # the conditioning frames diffusers allows
ALL_FRAMES = sys.maxsize  # read a file to its end
VIDEO_INPUTS = ("pose_video", "face_video", "background_video", "mask_video")  # diffusers' names


@dataclasses.dataclass(frozen=True)
class Segments:
    """How a video of ``frames`` frames is cut: segments of ``length`` frames, each starting ``step =
    length - overlap`` frames after the last, ``count`` of them covering ``covered`` frames (the
    inputs reflected up to that)."""

    frames: int
    length: int
    overlap: int

    @property
    def step(self) -> int:
        return self.length - self.overlap

    @property
    def count(self) -> int:
        return self.covered // self.step

    @property
    def covered(self) -> int:
        last = (self.frames - self.overlap) % self.step
        return self.frames + (self.step - last if last else 0)

    @classmethod
    def of(cls, frames: int, length: int, overlap: int, temporal: int) -> Segments:
        """diffusers' segmenting: ``length`` rounded down to ``temporal * n + 1``; WanjaxError for a
        conditioning-frame count it refuses, or a segment no longer than it."""
        if overlap not in PREV_SEGMENT_FRAMES:
            raise FlagError(
                f"prev_segment_conditioning_frames must be 1 or 5, got {overlap}",
                "prev_segment_conditioning_frames",
            )
        length = segment_length(length, temporal)
        if length - overlap <= overlap:  # diffusers' segments would run past the covered frames
            raise FlagError(
                f"segment_frame_length {length} must be more than twice prev_segment_conditioning_frames "
                f"{overlap}",
                "segment_frame_length",
            )
        if frames <= overlap:
            raise FlagError(f"the pose video needs more than {overlap} frames, got {frames}", "pose_video")
        return cls(frames, length, overlap)


def segment_length(length: int, temporal: int) -> int:
    """diffusers' ``segment_frame_length`` as it runs: rounded down to ``temporal * n + 1`` (at least 1)."""
    return max(length // temporal * temporal + 1 if length % temporal != 1 else length, 1)


def pad_frames(frames: Sequence[Any], count: int) -> list[Any]:
    """diffusers' ``pad_video_frames``: ``frames`` to ``count``, reflected back and forth
    (``[1, 2, 3] -> [1, 2, 3, 2, 1, 2, ...]``)."""
    index, backwards, out = 0, False, []
    while len(out) < count:
        out.append(frames[index])
        index += -1 if backwards else 1
        if index == 0 or index == len(frames) - 1:
            backwards = not backwards
    return out


def reference_frame(image: Image.Image, height: int, width: int) -> np.ndarray:
    """``WanAnimateImageProcessor`` (``resize_mode="fill"``, fill 0): the image resized to fit ``width x
    height`` keeping its aspect, centred on black, as ``[3, H, W]`` in [-1, 1]. A Lanczos resize:
    diffusers asks for bilinear, but the processor's base class registers its config again with
    its own default, Lanczos, which is what runs."""
    image = image.convert("RGB")
    ratio, src_ratio = width / height, image.width / image.height
    src_w = width if ratio < src_ratio else image.width * height // image.height
    src_h = height if ratio >= src_ratio else image.height * width // image.width
    resized = image.resize((src_w, src_h), resample=Image.Resampling.LANCZOS)
    canvas = Image.new("RGB", (width, height), color=0)
    canvas.paste(resized, box=(width // 2 - src_w // 2, height // 2 - src_h // 2))
    return signed_pixels(np.asarray(canvas)).transpose(2, 0, 1)


def mask_frame(image: Image.Image, height: int, width: int) -> np.ndarray:
    """diffusers' mask processor: Lanczos-resized to ``width x height``, then gray, in [0, 1], ``[1, H, W]``."""
    resized = image.resize((width, height), resample=Image.Resampling.LANCZOS).convert("L")
    return mask_values(np.asarray(resized))[None]


def mask_values(pixels: np.ndarray) -> np.ndarray:
    """A gray mask's uint8 pixels as float32 in [0, 1]."""
    return pixels.astype(np.float32) / np.float32(255.0)


def mask_pixels(mask: np.ndarray) -> np.ndarray:
    """The uint8 pixels :func:`mask_values` made ``mask`` from (its exact inverse)."""
    return np.rint(mask.astype(np.float32) * np.float32(255.0)).astype(np.uint8)


@dataclasses.dataclass(frozen=True)
class AnimateVideos:
    """The prepared pixels (float32, channels first, time second): the pose ``[3, N, H, W]`` and face
    ``[3, N, s, s]`` videos, replace mode's background ``[3, N, H, W]`` and mask ``[1, N, H, W]``
    (``N``: the frames the segments cover)."""

    segments: Segments
    pose: np.ndarray
    face: np.ndarray
    background: np.ndarray | None = None
    mask: np.ndarray | None = None

    @property
    def size(self) -> tuple[int, int]:
        """The video's ``(height, width)``."""
        return int(self.pose.shape[2]), int(self.pose.shape[3])


@dataclasses.dataclass(frozen=True)
class AnimateConditioning:
    """What every segment reads and none changes: the prepared ``videos``, the character's CLIP
    states ``image_embeds [1, L, D]`` and ``reference [1, temporal + z, 1, h, w]`` (a mask of ones
    and the reference frame's latents). ``wanjax encode`` stores it (``stage1_animate``)."""

    videos: AnimateVideos
    image_embeds: Any
    reference: np.ndarray


def check_inputs(mode: str, face: bool, background: bool, mask: bool) -> None:
    """WanjaxError naming an input the mode needs and was not given (or one it does not take)."""
    if mode not in MODES:
        raise FlagError(f"mode must be one of {', '.join(MODES)}, got {mode!r}", "mode")
    if not face:
        raise FlagError(
            "an Animate model needs a face video (--face_video) beside the pose video", "face_video"
        )
    if mode == "replace" and not (background and mask):
        raise FlagError(
            "replace mode needs a background video and a mask video (--background_video, --mask_video)",
            "mask_video" if background else "background_video",
        )
    if mode == "animate" and (background or mask):
        raise FlagError(
            "a background and a mask video are for replace mode (--mode replace)",
            "background_video" if background else "mask_video",
        )


def read_inputs(
    pose_video: VideoInput,
    face_video: VideoInput | None,
    background_video: VideoInput | None,
    mask_video: VideoInput | None,
    mode: str,
    num_frames: int | None,
    fps: float,
) -> tuple[list[Image.Image] | None, ...]:
    """The frames of each input (a file read at ``fps``, images or uint8 frames): the pose video's
    first ``num_frames`` (all, left out), as many of the others; WanjaxError naming a missing input
    or a short pose video."""
    check_inputs(mode, face_video is not None, background_video is not None, mask_video is not None)
    pose = video_frames(pose_video, fps, ALL_FRAMES if num_frames is None else num_frames)
    if num_frames is not None and len(pose) < num_frames:
        raise WanjaxError(
            f"the pose video gives {len(pose)} frames at {fps:g} fps, fewer than the {num_frames} asked for"
        )
    others = (face_video, background_video, mask_video)
    return (pose, *(None if v is None else video_frames(v, fps, len(pose)) for v in others))


def prepare_videos(
    frames: tuple[list[Image.Image], ...],
    height: int,
    width: int,
    face_size: int,
    segments: Segments,
) -> AnimateVideos:
    """The inputs' pixels as diffusers prepares them (see the module docstring)."""
    pose, face, background, mask = (None if f is None else pad_frames(f, segments.covered) for f in frames)

    def stacked(
        frames: list[Image.Image], h: int, w: int, frame: Callable[..., np.ndarray] = video_frame
    ) -> np.ndarray:
        return np.stack([frame(f, h, w) for f in frames], axis=1)

    return AnimateVideos(
        segments,
        stacked(pose, height, width),
        stacked(face, face_size, face_size),
        None if background is None else stacked(background, height, width),
        None if mask is None else stacked(mask, height, width, mask_frame),
    )


def _fold_mask(mask: np.ndarray, temporal: int) -> np.ndarray:
    """diffusers' ``get_i2v_mask`` layout: ``(B, 1, T, h, w)`` (the first frame repeated ``temporal``
    times) -> ``(B, temporal, T', h, w)``."""
    b, _, _, h, w = mask.shape
    mask = np.concatenate([np.repeat(mask[:, :, :1], temporal, axis=2), mask[:, :, 1:]], axis=2)
    return mask.reshape(b, -1, temporal, h, w).transpose(0, 2, 1, 3, 4)


def _nearest(mask: np.ndarray, h: int, w: int) -> np.ndarray:
    """torch's ``interpolate(mode="nearest")`` of ``(..., H, W)`` to ``(..., h, w)``."""
    rows = np.minimum(np.floor(np.arange(h) * np.float32(mask.shape[-2] / h)).astype(int), mask.shape[-2] - 1)
    cols = np.minimum(np.floor(np.arange(w) * np.float32(mask.shape[-1] / w)).astype(int), mask.shape[-1] - 1)
    return mask[..., rows[:, None], cols[None, :]]


def segment_conditioning(
    encode: Callable[[np.ndarray], np.ndarray],
    videos: AnimateVideos,
    start: int,
    previous: np.ndarray | None,
    temporal: int,
) -> np.ndarray:
    """diffusers' ``prepare_prev_segment_cond_latents``: ``(B, temporal + z, T', h, w)`` for the segment
    starting at ``start`` (``previous``: the last segment's decoded frames ``(B, 3, S, H, W)``)."""
    s = videos.segments
    end = start + s.length
    height, width = videos.size
    if previous is not None:
        first = previous[:, :, -s.overlap :]
    elif videos.background is not None:
        first = videos.background[None, :, start : start + s.overlap]
    else:
        first = np.zeros((1, 3, s.overlap, height, width), np.float32)
    if videos.background is not None:
        rest = np.broadcast_to(
            videos.background[None, :, start + s.overlap : end], (first.shape[0], 3, s.step, height, width)
        )
    else:
        rest = np.zeros((first.shape[0], 3, s.step, height, width), np.float32)
    latents = encode(np.concatenate([first, rest], axis=2).astype(np.float32))
    b, _, _, h, w = latents.shape
    if videos.mask is not None:
        mask = _nearest(1 - videos.mask[None, :, start:end], h, w).astype(np.float32)
    else:
        mask = np.zeros((1, 1, s.length, h, w), np.float32)
    mask = mask.copy()
    mask[:, :, : s.overlap if start > 0 else 0] = 1
    mask = np.broadcast_to(_fold_mask(mask, temporal), (b, temporal, *latents.shape[2:]))
    return np.concatenate([mask, latents], axis=1)


def segment_latent_shape(geometry: Any, batch: int, height: int, width: int, segments: Segments) -> tuple:
    """A segment's latents: a segment's latent frames and one more, the reference's, first."""
    return geometry.latent_shape(batch, height, width, segments.length + geometry.temporal)


def check_first_latents(
    geometry: Any, latents: Any, batch: int, height: int, width: int, segments: Segments
) -> None:
    """WanjaxError unless ``latents`` (the first segment's noise) have a segment's shape."""
    shape = segment_latent_shape(geometry, batch, height, width, segments)
    if tuple(latents.shape) != shape:
        raise WanjaxError(
            f"latents {tuple(latents.shape)} do not match {batch} prompt(s) at {width}x{height} in segments of "
            f"{segments.length} frames (expected {shape}: a latent frame more, the reference's)"
        )


def prepare_conditioning(
    parts: Any,
    image: Image.Image,
    frames: tuple[list[Image.Image] | None, ...],
    height: int,
    width: int,
    segments: Segments,
) -> AnimateConditioning:
    """The videos prepared, the character's CLIP states and its reference latents (the encode stage:
    what no segment changes). ``parts``: the pipeline's ``Components``."""
    cfg, temporal = parts.transformer_config, parts.geometry.temporal
    assert cfg.motion_encoder_size is not None
    videos = prepare_videos(frames, height, width, cfg.motion_encoder_size, segments)
    parts.enter("encode")
    with parts.stage_timing("encode").running():
        states = parts.image_encoder.encode_images([image])
        reference = encode_video(
            parts.vae, reference_frame(image, height, width)[None, :, None], parts.video_placement()
        )
        ones = np.ones((1, temporal, *reference.shape[2:]), np.float32)
    return AnimateConditioning(videos, to_host(states), np.concatenate([ones, reference], axis=1))


def denoise_segment(
    pipe: Any,
    conditioning: AnimateConditioning,
    k: int,
    prompt_embeds: Any,
    negative_prompt_embeds: Any,
    noise: Any,
    previous: np.ndarray | None,
    run: RunOptions,
    on_step: Callable[[int], None] | None = None,
    progress: bool = True,
    cache_carry: CacheCarry | None = None,
) -> Denoised:
    """Segment ``k`` denoised from ``noise``, conditioned on its pose latents (VAE-encoded here), its
    face frames, the reference and the last decoded frames of segment ``k - 1`` (``previous``);
    ``cache_carry``: the step cache's state at the end of segment ``k - 1``, which it continues."""
    parts = pipe.components
    videos, temporal = conditioning.videos, parts.geometry.temporal
    segments = videos.segments
    start = k * segments.step
    window = slice(start, start + segments.length)
    vae, place = parts.vae, parts.video_placement()

    def encode(video: np.ndarray) -> np.ndarray:
        parts.enter("encode")
        with parts.stage_timing("encode").running():
            return encode_video(vae, video, place)

    pose = encode(videos.pose[None, :, window])
    cond = segment_conditioning(encode, videos, start, previous, temporal)
    reference = conditioning.reference
    cond = np.concatenate([np.broadcast_to(reference, (cond.shape[0], *reference.shape[1:])), cond], axis=2)
    motion = AnimateControl(jnp.asarray(pose), jnp.asarray(videos.face[None, :, window]))
    image = ImageConditioning(jnp.asarray(cond[:1]), conditioning.image_embeds, motion=motion)
    image = image.repeat(noise.shape[0])
    if cond.shape[0] > 1:  # each video's own previous frames
        image = dataclasses.replace(image, latents=jnp.asarray(cond))
    return pipe.denoise(
        prompt_embeds,
        negative_prompt_embeds,
        noise,
        options=run,
        image=image,
        on_step=on_step,
        progress=progress,
        cache_carry=cache_carry,
    )


def decode_segment(parts: Any, latents: Any) -> np.ndarray:
    """A segment's frames, float32 ``(B, 3, S, H, W)`` in [-1, 1]: its latents, the reference's frame
    dropped, decoded."""
    parts.enter("decode")
    vae = parts.vae
    with parts.stage_timing("decode").running():
        vae_latents = vae.denormalize_latents(jnp.asarray(latents)[:, :, 1:])
        return to_host(vae.decode(parts.video_placement()(np.asarray(vae_latents)))).astype(np.float32)


def run_segments(
    pipe: Any,
    conditioning: AnimateConditioning,
    prompt_embeds: Any,
    negative_prompt_embeds: Any,
    run: RunOptions,
    latents: Any = None,
    on_step: Callable[[int], None] | None = None,
    progress: bool = True,
    decode_last: bool = True,
) -> Iterator[tuple[Denoised, np.ndarray | None]]:
    """Each segment in turn: its denoising and its decoded frames (:func:`decode_segment`; the last
    segment's only with ``decode_last``). The first starts from ``latents`` (None: the seed's noise),
    segment ``k`` from the seed's ``k``-th stream; ``run``: the filled options, the size included."""
    segments = conditioning.videos.segments
    height, width = conditioning.videos.size
    batch = prompt_embeds.shape[0]
    previous, carry = None, None
    for k in range(segments.count):
        noise = latents
        if k > 0 or latents is None:
            frames = segments.length + pipe.components.geometry.temporal
            noise = pipe.prepare_latents(batch, height, width, frames, run.seed, segment=k)
        args = (prompt_embeds, negative_prompt_embeds, noise, previous, run, on_step, progress)
        denoised = denoise_segment(pipe, conditioning, k, *args, cache_carry=carry)
        carry = denoised.cache_carry
        last = k == segments.count - 1
        previous = decode_segment(pipe.components, denoised.latents) if decode_last or not last else None
        yield denoised, previous


def joined(denoised: Sequence[Denoised]) -> Denoised:
    """The segments' denoising as one: the last segment's, with every segment's cache report in turn."""
    reports = [d.cache_report for d in denoised]
    report = None if reports[-1] is None else CacheReport.joined(reports)
    return dataclasses.replace(denoised[-1], cache_report=report, cache_carry=None)


def join_segments(decoded: Sequence[np.ndarray], segments: Segments) -> np.ndarray:
    """The video, ``uint8 [B, N, H, W, 3]``: the segments' frames, each after the first without the
    frames it repeats, cut to the pose video's ``N``."""
    kept = [frames if k == 0 else frames[:, :, segments.overlap :] for k, frames in enumerate(decoded)]
    video = np.concatenate(kept, axis=2)[:, :, : segments.frames]
    return to_host(to_uint8(jnp.asarray(video).transpose(0, 2, 3, 4, 1)))


@dataclasses.dataclass(frozen=True)
class AnimateSources:
    """An Animate run's inputs as given: the character image and the pose, face, background and mask
    videos (files, images or frames; None: not given)."""

    image: ImageInput
    pose_video: VideoInput
    face_video: VideoInput | None
    background_video: VideoInput | None = None
    mask_video: VideoInput | None = None

    @property
    def videos(self) -> tuple[VideoInput | None, ...]:
        return self.pose_video, self.face_video, self.background_video, self.mask_video


def prepare_inputs(pipe: Any, o: RunOptions, given: AnimateSources) -> AnimateConditioning:
    """The inputs read (``o``: filled options; the video's frames the pose video's, or its first
    ``o.num_frames``), cut into segments and prepared (:func:`prepare_conditioning`): the encode
    stage's work; WanjaxError naming a missing or unreadable input."""
    parts = pipe.components
    mode = o.mode or MODES[0]
    frames = read_inputs(*given.videos, mode, o.num_frames, o.fps)
    segments = Segments.of(
        len(frames[0]), o.segment_frame_length, o.prev_segment_conditioning_frames, parts.geometry.temporal
    )
    height, width = o.height or parts.defaults.height, o.width or parts.defaults.width
    parts.geometry.check(height, width, segments.length)
    return prepare_conditioning(parts, open_image(given.image), frames, height, width, segments)


def decode_segments(parts: Any, segments: Segments, latents: Sequence[Any]) -> np.ndarray:
    """The video, ``uint8 [B, N, H, W, 3]``, of the segments' ``latents`` (``wanjax decode``): each
    decoded and the segments joined, as the run itself does."""
    return join_segments([decode_segment(parts, x) for x in latents], segments)


def animate(
    pipe: Any,  # a WanPipeline of an Animate model (the pipeline module imports this one)
    prompt: str | Sequence[str],
    negative_prompt: str | Sequence[str] | None,
    o: RunOptions,
    given: AnimateSources,
    latents: Any = None,
    progress: bool = True,
    on_step: Callable[[int], None] | None = None,
) -> Video:
    """An Animate model's run (see the module docstring); ``o`` filled with the model's defaults.
    Returns the frames ``uint8 [B, N, H, W, 3]`` (``N``: the pose video's frames) and the last
    segment's denoising. The three stages run the same pieces: :func:`prepare_inputs` (the jobs:
    :func:`prepare_conditioning`), :func:`run_segments` and :func:`decode_segments`."""
    parts = pipe.components
    parts.timings.clear()
    conditioning = prepare_inputs(pipe, o, given)
    segments, (height, width) = conditioning.videos.segments, conditioning.videos.size
    pos, neg = pipe.encode_prompt(prompt, negative_prompt, o.max_sequence_length)
    if latents is not None:
        check_first_latents(parts.geometry, latents, pos.shape[0], height, width, segments)
    run = RunOptions.of(o, {"height": height, "width": width})
    done = list(run_segments(pipe, conditioning, pos, neg, run, latents, on_step, progress))
    decoded = [frames for _, frames in done]
    return Video(join_segments(decoded, segments), joined([d for d, _ in done]), pipe.timings_so_far())
