"""mp4 and preview output: decodable, right size and frame count, atomic."""

from __future__ import annotations

import os
import stat
from fractions import Fraction

import av
import numpy as np
import pytest
from PIL import Image

from wanjax.io.atomic import atomic_path, write_text
from wanjax.io.video import contact_sheet, fps_problem, write_mp4, write_preview


def gradient_frames(t=9, h=48, w=80):
    frames = np.zeros((t, h, w, 3), np.uint8)
    for i in range(t):
        frames[i, ..., 0] = i * 25
        frames[i, ..., 1] = np.linspace(0, 255, w, dtype=np.uint8)[None, :]
        frames[i, ..., 2] = np.linspace(0, 255, h, dtype=np.uint8)[:, None]
    return frames


def test_mp4_round_trip(tmp_path):
    frames = gradient_frames()
    path = write_mp4(frames, tmp_path / "v.mp4", fps=16)
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == "h264"
        assert stream.codec_context.pix_fmt == "yuv420p"
        assert float(stream.average_rate) == 16
        decoded = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    assert decoded.shape == frames.shape
    # Lossy yuv420p: close on average, not bit-exact.
    assert np.abs(decoded.astype(int) - frames).mean() < 4
    assert not list(tmp_path.glob(".*tmp"))


@pytest.mark.parametrize(
    ("fps", "rate"),
    [(23.976, Fraction(2997, 125)), (24000 / 1001, Fraction(24000, 1001)), (0.5, Fraction(1, 2))],
)
def test_fractional_frame_rates_are_written(tmp_path, fps, rate):
    """A float rate made PyAV fail ("'float' object has no attribute 'numerator'") after every step."""
    path = write_mp4(gradient_frames(t=3), tmp_path / "v.mp4", fps=fps)
    with av.open(str(path)) as container:
        assert container.streams.video[0].average_rate == Fraction(rate)


def test_mp4_rejects_float_frames(tmp_path):
    with pytest.raises(ValueError, match="uint8"):
        write_mp4(np.zeros((2, 16, 16, 3), np.float32), tmp_path / "v.mp4")
    assert not list(tmp_path.iterdir())


def test_preview_is_a_contact_sheet(tmp_path):
    frames = gradient_frames(t=5, h=16, w=24)
    sheet = contact_sheet(frames)
    assert sheet.shape == (2 * 16, 3 * 24, 3)
    np.testing.assert_array_equal(sheet[16:32, 24:48], frames[4])
    assert not sheet[16:, 48:].any()
    path = write_preview(frames, tmp_path / "p.png")
    np.testing.assert_array_equal(np.asarray(Image.open(path)), sheet)


def test_interrupted_write_keeps_previous_file(tmp_path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"previous")
    with pytest.raises(KeyboardInterrupt), atomic_path(target) as tmp:
        tmp.write_bytes(b"half")
        raise KeyboardInterrupt
    assert target.read_bytes() == b"previous"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_atomic_output_follows_umask(tmp_path):
    """Outputs get the permissions a plain open() would give (0o666 minus the umask), not mkstemp's 0o600."""
    old = os.umask(0o022)
    try:
        path = write_text(tmp_path / "config.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_frame_rates_at_and_past_their_bounds():
    assert fps_problem(0.1) is None and fps_problem(1000) is None and fps_problem(16) is None
    for fps in (0.0999, 1000.001, 0, -1, float("nan"), float("inf")):
        assert "must be a frame rate from 0.1 to 1000" in fps_problem(fps)
