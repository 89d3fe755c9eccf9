"""Wan 2.2 Animate's flags (:mod:`wanjax.pipeline.animate`): the mode, the pose, face, background and
mask videos and the segments, by diffusers' ``WanAnimatePipeline``'s names."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from wanjax.jobs.flags import library, option

_animate_modes = library("wanjax.pipeline.animate", "MODES")


_prev_segment_frames = library("wanjax.pipeline.animate", "PREV_SEGMENT_FRAMES")


def segment_frame_length_flag() -> Any:
    """``--segment_frame_length`` (``generate``'s and ``plan``'s)."""
    return option(
        help="Animate: frames made per segment, 4n+1 (default {ref.segment_frame_length}; demo "
        "{demo.segment_frame_length})",
    )


@dataclasses.dataclass(frozen=True)
class AnimateFlags:
    """Wan 2.2 Animate: the character (--image) moved by a pose and a face video, or put in place of
    the person a mask marks in a background video; diffusers' ``WanAnimatePipeline``'s names."""

    title: ClassVar[str] = "Animate (pose, face, background and mask videos)"
    mode: str | None = option(
        help="Animate: animate the --image character with the pose and face videos, or replace the "
        "person --mask_video marks in --background_video (default animate)",
        choices=_animate_modes,
    )
    pose_video: str | None = option(
        help="Animate: the pose video (any file PyAV reads, at --fps): the video has its frames (or its "
        "first --frames)",
    )
    face_video: str | None = option(help="Animate: the face video, frame for frame with the pose video")
    background_video: str | None = option(help="Animate, replace mode: the video whose person is replaced")
    mask_video: str | None = option(
        help="Animate, replace mode: white where the character goes, black where the background stays"
    )
    segment_frame_length: int | None = segment_frame_length_flag()
    prev_segment_conditioning_frames: int | None = option(
        help="Animate: the last frames of a segment the next one continues from (default "
        "{ref.prev_segment_conditioning_frames})",
        choices=_prev_segment_frames,
    )

    @property
    def given(self) -> bool:
        return any(getattr(self, f.name) is not None for f in dataclasses.fields(self))
