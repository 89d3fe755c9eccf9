"""Video input: a file's frames through PyAV, resampled to a frame rate."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from wanjax.errors import WanjaxError

_EPS = 1e-6  # seconds: a frame stamped this close to a sampling time counts as at it


class NotAVideo(WanjaxError):
    """A file PyAV cannot open as a container: no video at all (rather than a video with a problem)."""


def image_format(name: str) -> str | None:
    """The image kind of an FFmpeg container format (``png_pipe`` -> ``PNG``; ``image2``: an image
    file), None for a video's (an animated GIF is a video)."""
    if name == "image2":
        return "image"
    return name.removesuffix("_pipe").upper() if name.endswith("_pipe") else None


def read_frames(path: str | Path, fps: float, limit: int) -> list[Image.Image]:
    """Up to ``limit`` RGB frames of the video at ``path``, sampled at ``fps``: frame ``i`` is the one
    shown at ``i / fps`` seconds (the last one stamped at or before it), so a 30 fps video read at
    16 fps skips frames and an 8 fps one repeats them. Fewer when the video ends sooner (it lasts
    until its last frame's time plus one frame). :class:`NotAVideo` for a file PyAV cannot open;
    WanjaxError for an image (one rule for the command line and the server: a still is not a video),
    a file without a video stream or one that cannot be decoded."""
    import av  # imported here: only a video input needs it

    try:
        container = av.open(str(path))
    except (av.error.FFmpegError, OSError, ValueError) as e:
        raise NotAVideo(f"{path} is not a video PyAV can read ({e.__class__.__name__}: {e})") from None
    with container:
        if image_format(container.format.name):
            kind = image_format(container.format.name)
            raise WanjaxError(
                f"{path} is an image ({kind}), not a video: give a video file (mp4, webm, mov, ...)"
            )
        if not container.streams.video:
            raise WanjaxError(f"{path} holds no video stream")
        stream = container.streams.video[0]
        rate = float(stream.average_rate or stream.guessed_rate or fps)
        frames: list[Image.Image] = []
        previous, previous_time = None, 0.0
        try:
            for index, frame in enumerate(container.decode(stream)):
                time = frame.time if frame.time is not None else index / rate
                while previous is not None and len(frames) < limit and len(frames) / fps < time - _EPS:
                    frames.append(previous)
                if len(frames) >= limit:
                    break
                previous, previous_time = frame.to_image(), time
        except av.error.FFmpegError as e:
            raise WanjaxError(f"{path}: the video cannot be decoded ({e})") from None
        end = previous_time + 1 / rate
        while previous is not None and len(frames) < limit and len(frames) / fps < end - _EPS:
            frames.append(previous)
    return frames
