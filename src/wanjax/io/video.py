"""Video output: H.264 mp4 (yuv420p) through PyAV, and a PNG contact sheet of frames."""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path

import numpy as np

from wanjax.io.atomic import atomic_path

FPS_RANGE = (0.1, 1000.0)  # the frame rates a video is written at: a slow slideshow to a fast camera


def fps_problem(fps: float) -> str | None:
    """Why ``fps`` cannot be a video's frame rate (None: it can), to follow the flag or field name."""
    low, high = FPS_RANGE
    if not (math.isfinite(fps) and low <= fps <= high):
        return f"must be a frame rate from {low:g} to {high:g} (e.g. 16), got {fps:g}"
    return None


def frame_rate(fps: float) -> Fraction:
    """``fps`` as the fraction a container stores (23.976 -> 2997/125; NTSC's 24000/1001 stays)."""
    return Fraction(fps).limit_denominator(1001)


def _check_frames(frames: np.ndarray) -> np.ndarray:
    frames = np.asarray(frames)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be uint8 [T, H, W, 3], got {frames.dtype} {frames.shape}")
    return frames


def write_mp4(
    frames: np.ndarray,
    path: str | Path,
    fps: float = 16.0,
    crf: int = 18,
    metadata: Mapping[str, str] | None = None,
) -> Path:
    """Encode ``uint8 [T, H, W, 3]`` frames as H.264 (yuv420p) at ``fps``; written atomically.
    ``metadata``: container tags (mp4 keeps ``title``, ``comment``, ``description``, ...)."""
    import av  # imported here: only the video stage needs it

    frames = _check_frames(frames)
    path = Path(path)
    with atomic_path(path) as tmp, av.open(str(tmp), mode="w", format="mp4") as container:
        container.metadata.update(metadata or {})
        stream = container.add_stream("libx264", rate=frame_rate(fps))
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": str(crf)}
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
    return path


def contact_sheet(frames: np.ndarray, columns: int | None = None) -> np.ndarray:
    """Tile ``[T, H, W, 3]`` frames into one ``[rows*H, columns*W, 3]`` image (black padding)."""
    frames = _check_frames(frames)
    t, h, w, _ = frames.shape
    columns = columns or math.ceil(math.sqrt(t))
    rows = math.ceil(t / columns)
    sheet = np.zeros((rows * h, columns * w, 3), np.uint8)
    for i, frame in enumerate(frames):
        r, c = divmod(i, columns)
        sheet[r * h : (r + 1) * h, c * w : (c + 1) * w] = frame
    return sheet


def write_thumbnail(frames: np.ndarray, path: str | Path) -> Path:
    """Write the first frame as a WebP image (the format OpenAI's video thumbnails come in), atomically."""
    from PIL import Image

    path = Path(path)
    with atomic_path(path) as tmp:
        Image.fromarray(_check_frames(frames)[0]).save(tmp, format="WEBP", quality=90)
    return path


def write_preview(frames: np.ndarray, path: str | Path, columns: int | None = None) -> Path:
    """Write a PNG contact sheet of the frames, atomically."""
    from PIL import Image

    path = Path(path)
    with atomic_path(path) as tmp:
        Image.fromarray(contact_sheet(frames, columns)).save(tmp, format="PNG")
    return path
