"""The files a video-writing command leaves: one mp4 per batch item (the prompt and seed in its
metadata), optional raw frames and previews, and a JSON record of the run beside the video.

Names are decided once, before any work (:func:`video_files`, :func:`record_file`), so the pre-flight
check, the writer and the report name the same files. A default name never reuses one a run already
left (:func:`fresh_video_name`).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from wanjax.io.atomic import atomic_path
from wanjax.jobs.groups import OutputFlags
from wanjax.jobs.requests import DecodeRequest, GenerateRequest
from wanjax.parallel.multihost import is_primary

RECORD_SUFFIX = ".json"
Writing = TypeVar("Writing", GenerateRequest, DecodeRequest)  # the jobs that write videos
DESCRIBED = (  # the run's parameters an mp4's metadata carries, beside its prompt
    "model",
    "negative_prompt",
    "seed",
    "num_inference_steps",
    "guidance_scale",
    "scheduler",
    "flow_shift",
    "init_latents",
    "strength",
    "conditioning_scale",
    "height",
    "width",
    "frames",
    "fps",
    "wanjax_version",
)


def numbered(path: str | Path, batch: int) -> list[Path]:
    """The files a batch of ``batch`` writes for ``path``: itself, or ``NAME_0.ext`` ... per item."""
    path = Path(path)
    if batch == 1:
        return [path]
    return [path.with_name(f"{path.stem}_{i}{path.suffix}") for i in range(batch)]


def record_file(output_video: str | Path, metrics_json: str | None) -> Path:
    """Where the run's JSON record goes: ``--metrics_json``, else ``NAME.json`` beside ``NAME.mp4``."""
    return Path(metrics_json) if metrics_json else Path(output_video).with_suffix(RECORD_SUFFIX)


def fresh_video_name(directory: str | Path = ".", now: datetime.datetime | None = None) -> str:
    """``YYYYMMDD_HHMMSS.mp4`` as the reference scripts name videos, made unique: ``...-2.mp4``,
    ``...-3.mp4`` when a file of that stem (a video, its numbered batch files or its record) exists."""
    stem = (now or datetime.datetime.now()).strftime("%Y%m%d_%H%M%S")
    directory = Path(directory)
    candidates = (stem if n == 1 else f"{stem}-{n}" for n in range(1, 1_000_000))
    return next(f"{c}.mp4" for c in candidates if not any(directory.glob(f"{c}[._]*")))


@dataclasses.dataclass(frozen=True)
class ClipInfo:
    """What an mp4's metadata says of how it was made: its prompt, and the run's other parameters."""

    prompt: str | None
    parameters: Mapping[str, Any]

    def metadata(self) -> dict[str, str]:
        """mp4 tags: ``title`` the prompt, ``comment`` the parameters as JSON."""
        described = {"prompt": self.prompt, **self.parameters} if self.prompt is not None else self.parameters
        tags = {"comment": json.dumps(described, ensure_ascii=False, sort_keys=True)}
        return {"title": self.prompt, **tags} if self.prompt is not None else tags


def clip_infos(batch: int, prompts: str | Sequence[str] | None, values: Mapping[str, Any]) -> list[ClipInfo]:
    """One :class:`ClipInfo` per batch item, from the run's ``values`` (those named in
    :data:`DESCRIBED`): item ``i`` has prompt ``i`` (one prompt serves them all) and seed
    ``seed + i`` (the noise :meth:`~wanjax.pipeline.pipeline.WanPipeline.prepare_latents` draws for it)."""
    from wanjax.version import __version__

    if isinstance(prompts, str) or (prompts is not None and len(prompts) == 1 and batch > 1):
        prompts = [prompts if isinstance(prompts, str) else prompts[0]] * batch
    parameters = {key: values[key] for key in DESCRIBED if values.get(key) is not None}
    parameters["wanjax_version"] = __version__
    infos = []
    for i in range(batch):
        item = dict(parameters)
        if item.get("seed") is not None:
            item["seed"] = int(item["seed"]) + i
        infos.append(ClipInfo(prompts[i] if prompts else None, item))
    return infos


def write_outputs(
    frames: np.ndarray, outputs: OutputFlags, fps: float, clips: Sequence[ClipInfo]
) -> dict[str, Any]:
    """The mp4s (one per batch item), the optional raw frames, previews and thumbnails, written by
    process 0 only; returns every file written, by kind (``video``, ``preview`` and ``thumbnail``
    are lists)."""
    from wanjax.io.video import write_mp4, write_preview, write_thumbnail

    batch = frames.shape[0]
    videos = numbered(outputs.output_video, batch)
    previews = numbered(outputs.preview, batch) if outputs.preview else []
    thumbnails = numbered(outputs.thumbnail, batch) if outputs.thumbnail else []
    if is_primary():
        for clip, path, info in zip(frames, videos, clips, strict=True):
            write_mp4(clip, path, fps=fps, metadata=info.metadata())
        for clip, path in zip(frames, previews, strict=False):
            write_preview(clip, path)
        for clip, path in zip(frames, thumbnails, strict=False):
            write_thumbnail(clip, path)
        if outputs.frames_out:
            with atomic_path(outputs.frames_out) as tmp, open(tmp, "wb") as f:
                np.save(f, frames)
    written: dict[str, Any] = {"video": [str(p) for p in videos]}
    if outputs.frames_out:
        written["frames"] = outputs.frames_out
    if previews:
        written["preview"] = [str(p) for p in previews]
    if thumbnails:
        written["thumbnail"] = [str(p) for p in thumbnails]
    return written


def video_record(request: Writing) -> Path:
    """The JSON record a video-writing run leaves (``--output_video`` must be resolved)."""
    return record_file(request.outputs.output_video, request.common.metrics_json)


def with_output_video(request: Writing, default: str) -> Writing:
    """``request`` with ``--output_video`` resolved (``default`` when left out)."""
    outputs = dataclasses.replace(request.outputs, output_video=request.outputs.output_video or default)
    return dataclasses.replace(request, outputs=outputs)
