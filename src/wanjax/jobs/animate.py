"""``generate`` (and ``encode``) on a Wan 2.2 Animate model: its flags
(:class:`~wanjax.jobs.animate_flags.AnimateFlags`) checked and its videos read before any work
(one-line errors naming the flag), then the run (:func:`wanjax.pipeline.animate.animate`, segment by
segment); the stages run its pieces (:mod:`wanjax.jobs.animate_stages`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wanjax.errors import FlagError, WanjaxError
from wanjax.jobs.opening import defaults_of, model_label
from wanjax.pipeline.animate import (
    ALL_FRAMES,
    VIDEO_INPUTS,
    AnimateSources,
    Segments,
    animate,
    check_inputs,
    segment_latent_shape,
)
from wanjax.pipeline.components import IMAGE_COMPONENTS
from wanjax.pipeline.options import RunOptions
from wanjax.pipeline.results import Video
from wanjax.pipeline.video_input import video_frames

if TYPE_CHECKING:
    import numpy as np
    from PIL import Image

    from wanjax.jobs.cache_flags import CacheFlags
    from wanjax.jobs.requests import InputsRequest
    from wanjax.pipeline.pipeline import WanPipeline


@dataclasses.dataclass(frozen=True)
class AnimateInputs:
    """An Animate run's inputs, read: the mode, each video's frames (None: not given) and the
    segments they are made in."""

    mode: str
    videos: tuple[list[Image.Image] | None, ...]  # pose, face, background, mask
    segments: Segments


def open_animate_inputs(
    pipe: WanPipeline,
    request: InputsRequest,
    cfg: Any,
    fps: float,
    init: np.ndarray | None,
) -> AnimateInputs | None:
    """The Animate flags checked against the model (None for another model, which must be given
    none) and their videos read at ``fps``: WanjaxError naming the flag for a missing input, a file
    that is not a video, a pose video shorter than ``--frames``, starting latents of another shape."""
    flags = request.animate
    if not cfg.animate:
        if flags.given:
            raise FlagError(
                "--mode, --pose_video, --face_video, --background_video, --mask_video, --segment_frame_length "
                f"and --prev_segment_conditioning_frames are for an Animate model; "
                f"{model_label(pipe.components.source)} is not one",
                next(f.name for f in dataclasses.fields(flags) if getattr(flags, f.name) is not None),
            )
        return None
    if request.images.image is None or flags.pose_video is None:
        raise FlagError(
            "an Animate model needs the character image and a pose video (--image, --pose_video)",
            "image" if request.images.image is None else "pose_video",
        )
    mode = flags.mode or "animate"
    check_inputs(
        mode, flags.face_video is not None, flags.background_video is not None, flags.mask_video is not None
    )
    pipe.components.sources.check((*IMAGE_COMPONENTS, "vae"))
    asked = request.video.frames
    videos: list[list[Image.Image] | None] = []
    for name in VIDEO_INPUTS:  # the flags are diffusers' names
        path = getattr(flags, name)
        if path is None:
            videos.append(None)
            continue
        if not Path(path).is_file():
            raise FlagError(f"--{name} {path}: file not found", name)
        limit = (asked or ALL_FRAMES) if not videos else len(videos[0] or ())
        try:
            videos.append(video_frames(path, fps, limit))
        except WanjaxError as e:
            raise FlagError(f"--{name}: {e}", name) from None
    pose = videos[0] or []
    if asked is not None and len(pose) < asked:
        raise FlagError(
            f"--pose_video gives {len(pose)} frames at {fps:g} fps, fewer than the {asked} asked for "
            f"(--frames): ask for {len(pose)} or fewer",
            "pose_video",
        )
    d = defaults_of(pipe)
    length = flags.segment_frame_length or d.segment_frame_length
    overlap = flags.prev_segment_conditioning_frames or d.prev_segment_conditioning_frames
    try:
        segments = Segments.of(len(pose), length, overlap, pipe.components.geometry.temporal)
    except FlagError as e:
        if e.flag == "pose_video":
            raise FlagError(f"--pose_video: {e}", e.flag) from None
        segment_values = ("segment_frame_length", "prev_segment_conditioning_frames")
        given = [name for name in segment_values if getattr(flags, name) is not None]
        flag = e.flag if e.flag in given or not given else given[0]  # the model's two go together
        raise FlagError(f"--segment_frame_length/--prev_segment_conditioning_frames: {e}", flag) from None
    if init is not None:
        size = (request.video.height or d.height, request.video.width or d.width)
        check_init(pipe, init, init.shape[0], *size, segments)
    return AnimateInputs(mode, tuple(videos), segments)


def check_init(
    pipe: WanPipeline, init: np.ndarray, batch: int, height: int, width: int, segments: Segments
) -> None:
    """``--init_latents``: the first segment's noise for ``batch`` videos, a latent frame more than a
    segment's (the reference's), at the video's size."""
    expected = segment_latent_shape(pipe.components.geometry, batch, height, width, segments)
    if tuple(init.shape) != expected:
        raise WanjaxError(
            f"--init_latents {tuple(init.shape)}: an Animate run's first segment at {width}x{height} takes "
            f"{expected} (a segment's {segments.length} frames' latent frames and the reference's); "
            "give latents of that shape or leave --init_latents out"
        )


def animate_options(
    pipe: WanPipeline, params: dict[str, Any], seed: int | None, cache: CacheFlags, **values: Any
) -> RunOptions:
    """The options an Animate run's segments are denoised with (``generate``'s and ``denoise``'s):
    the sampling ``params``, ``seed`` (with ``--init_latents``, the later segments' noise), the step
    cache and ``values`` (the size, the segments...), the model's defaults for the rest."""
    options = RunOptions(
        num_inference_steps=params["num_inference_steps"],
        guidance_scale=params["guidance_scale"],
        flow_shift=params["flow_shift"],
        scheduler=params["scheduler"],
        seed=params["seed"] if params["seed"] is not None else seed,
        cache=cache.config(),
        **values,
    )
    return dataclasses.replace(options.filled(defaults_of(pipe)), num_frames=None)  # the videos' frames


def animate_video(pipe: WanPipeline, request: InputsRequest, inputs: AnimateInputs) -> dict[str, int]:
    """The video's size (flags, else the model's) and frames (the pose video's)."""
    d = defaults_of(pipe)
    return {
        "height": request.video.height or d.height,
        "width": request.video.width or d.width,
        "frames": inputs.segments.frames,
    }


def run_animate(
    pipe: WanPipeline,
    work: Any,
    report: Callable[[str, int], None],
) -> Video:
    """A checked Animate ``generate`` (``work``: its :class:`~wanjax.jobs.generate.GenerateWork`)."""
    inputs, params, video = work.animate, work.params, work.video
    flags = work.request.animate
    options = animate_options(
        pipe,
        params,
        work.request.sampling.seed,
        work.request.cache,
        height=video["height"],
        width=video["width"],
        fps=work.fps,
        max_sequence_length=work.request.text.max_sequence_length,
        mode=inputs.mode,
        segment_frame_length=flags.segment_frame_length,
        prev_segment_conditioning_frames=flags.prev_segment_conditioning_frames,
    )
    report("encode", 0)
    return animate(
        pipe,
        work.prompts,
        [work.negative] * len(work.prompts),
        options,
        AnimateSources(work.image, *inputs.videos),
        latents=work.init,
        progress=False,
        on_step=lambda done: report("denoise", done),
    )
