"""Long videos by extension, on a VACE model: each new clip starts from the last frames so far.

A clip of ``num_frames`` frames is generated with the last ``overlap`` frames of the video so far as
its first frames, kept (mask black on them, as diffusers' VACE examples mark given frames), the rest
generated from gray frames (mask white, the examples' ``(128, 128, 128)``). The clip's first
``overlap`` frames reproduce the given ones up to the VAE's round trip; they are cross-faded into the
video (weight ``(i + 1) / (overlap + 1)`` for the clip's frame ``i``) and the rest appended. Every clip
has the same shapes, so the programs compiled for the first serve the others.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from PIL import Image

from wanjax.errors import WanjaxError
from wanjax.pipeline import preparation
from wanjax.pipeline.results import Video
from wanjax.pipeline.video_input import VideoInput, video_frames

__all__ = ["GRAY", "Extension", "append_clip", "extend", "extension_inputs"]

GRAY = (128, 128, 128)  # the frames to generate, as diffusers' VACE examples give them
OVERLAP = 5  # frames a clip shares with the video so far: the first two latent frames


@dataclasses.dataclass(frozen=True)
class Extension:
    """An extended video: ``frames`` ``uint8 [1, T, H, W, 3]``, each generated clip's run and, for each
    clip that continued the video, how far its first frames are from the frames they were given
    (mean absolute difference, levels) beside the VAE's own round trip of those frames (None unless
    the overlap is ``4n + 1`` frames, what the VAE encodes and decodes back as many of)."""

    frames: np.ndarray
    clips: list[Video]
    overlap_error: list[float] = dataclasses.field(default_factory=list)
    round_trip_error: list[float | None] = dataclasses.field(default_factory=list)

    @property
    def programs_compiled(self) -> list[int]:
        """The programs each clip compiled (the first compiles, the others reuse them)."""
        return [sum(t.programs for t in clip.timings.values()) for clip in self.clips]

    def report(self) -> dict[str, Any]:
        """What a run records of its clips."""
        return {
            "count": len(self.clips),
            "programs_compiled": self.programs_compiled,
            "overlap_mean_abs": self.overlap_error,
            "round_trip_mean_abs": self.round_trip_error,
        }


def extension_inputs(last: np.ndarray, num_frames: int) -> tuple[list[Image.Image], list[Image.Image]]:
    """A clip's control frames and masks: the ``last`` frames ``uint8 [k, H, W, 3]`` kept, gray frames
    to generate after them."""
    k, height, width = last.shape[:3]
    if not 0 < k < num_frames:
        raise WanjaxError(f"an overlap of {k} frames must be at least 1 and under the clip's {num_frames}")
    gray = Image.new("RGB", (width, height), GRAY)
    control = [Image.fromarray(f) for f in last] + [gray] * (num_frames - k)
    black, white = Image.new("L", (width, height), 0), Image.new("L", (width, height), 255)
    return control, [black] * k + [white] * (num_frames - k)


def append_clip(video: np.ndarray, clip: np.ndarray, overlap: int) -> np.ndarray:
    """``video`` ``[T, H, W, 3]`` with ``clip``'s first ``overlap`` frames cross-faded into its last
    ones and the rest of ``clip`` appended."""
    weights = (np.arange(1, overlap + 1, dtype=np.float32) / np.float32(overlap + 1))[:, None, None, None]
    shared = (1 - weights) * video[-overlap:].astype(np.float32) + weights * clip[:overlap].astype(np.float32)
    blended = np.clip(np.rint(shared), 0, 255).astype(np.uint8)
    return np.concatenate([video[:-overlap], blended, clip[overlap:]])


def extend(
    pipe: Any,  # a WanPipeline of a VACE model (the pipeline module imports this one)
    prompt: str | Sequence[str],
    video: VideoInput | None = None,
    *,
    clips: int = 1,
    overlap: int = OVERLAP,
    num_frames: int | None = None,
    height: int | None = None,
    width: int | None = None,
    fps: float | None = None,
    seed: int | None = None,
    on_clip: Callable[[int], None] | None = None,
    **call: Any,
) -> Extension:
    """``video`` (a file read at ``fps``, images or frames; None: the first clip from the prompt alone)
    continued by ``clips`` clips of ``num_frames`` frames (default the model's), each with its prompt
    (one for all, or one per clip) and the seed ``seed + i``; ``on_clip(i)`` as clip ``i`` (from 0)
    starts; ``call``: the rest of :meth:`WanPipeline.__call__`'s arguments, for every clip."""
    if not pipe.components.transformer_config.vace:
        raise WanjaxError("extending a video needs a VACE model (its control frames and mask)")
    prompts = [prompt] * clips if isinstance(prompt, str) else list(prompt)
    if len(prompts) != clips or clips < 1:
        raise WanjaxError(f"{len(prompts)} prompts for {clips} clips: give one, or one per clip")
    d = pipe.defaults
    frames, fps = num_frames or d.frames, fps or d.fps
    seed = d.seed if seed is None else seed
    given = None if video is None else video_frames(video, fps, 1 << 30)
    height, width = preparation.video_size(
        pipe.components, None if given is None else given[0], height, width
    )
    runs: list[Video] = []
    overlap_error: list[float] = []
    round_trip_error: list[float | None] = []
    out = None
    if given is not None:
        resized = [f.convert("RGB").resize((width, height), Image.Resampling.LANCZOS) for f in given]
        out = np.stack([np.asarray(f) for f in resized])
    for i, text in enumerate(prompts):
        if on_clip is not None:
            on_clip(i)
        control = {}
        if out is not None:
            control["video"], control["mask"] = extension_inputs(out[-overlap:], frames)
        run = pipe(
            text, num_frames=frames, height=height, width=width, seed=seed + i, fps=fps, **control, **call
        )
        runs.append(run)
        clip = run.frames[0]
        if out is not None:
            given_frames = out[-overlap:]
            overlap_error.append(mean_abs(clip[: len(given_frames)], given_frames))
            round_trip_error.append(round_trip(pipe, given_frames, height, width))
        out = clip if out is None else append_clip(out, clip, overlap)
    return Extension(out[None], runs, overlap_error, round_trip_error)


def mean_abs(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float32) - b.astype(np.float32)).mean())


def round_trip(pipe: Any, frames: np.ndarray, height: int, width: int) -> float | None:
    """The mean absolute difference of ``frames`` and their VAE round trip (None unless ``4n + 1`` of them)."""
    if (len(frames) - 1) % pipe.components.geometry.temporal:
        return None
    latents = preparation.video_latents(pipe.components, [Image.fromarray(f) for f in frames], height, width)
    return mean_abs(pipe.decode(latents)[0], frames)
