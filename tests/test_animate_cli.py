"""``wanjax generate`` on an Animate model (the demo-animate model): diffusers' flag names, the videos
read from files at ``--fps``, the first segment's noise from ``--init_latents``; its frames are the
Python API's for the same inputs, and bad inputs are one-line errors before any work."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers.animate_inputs import FPS, FRAMES, write_animate_inputs
from safetensors.numpy import save_file

from wanjax import WanPipeline
from wanjax.cli.main import main
from wanjax.io.video_reader import read_frames

HEIGHT, WIDTH = 32, 48
RUN = ("--height", HEIGHT, "--width", WIDTH, "--num_inference_steps", 2, "--dtype", "float32")


@pytest.fixture(scope="module")
def files(tmp_path_factory, demo_env):
    return write_animate_inputs(tmp_path_factory.mktemp("animate_inputs"))


def generate(*args):
    return main(
        ["generate", "--model", "demo-animate", "--prompt", "a dancer", *map(str, RUN), *map(str, args)]
    )


def one_line(capsys, *args) -> str:
    code = generate(*args)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["animate", "replace"])
def test_generate_equals_the_python_api(files, mode, tmp_path, demo_env):
    pipe = WanPipeline.from_pretrained("demo-animate", dtype="float32", jax_cache_dir=False)
    segment = pipe.defaults.segment_frame_length
    noise = np.asarray(pipe.prepare_latents(1, HEIGHT, WIDTH, segment + 4, seed=5))
    save_file({"latents": noise}, str(tmp_path / "noise.safetensors"))
    videos = {"pose_video": files["pose"], "face_video": files["face"]}
    if mode == "replace":
        videos.update(background_video=files["background"], mask_video=files["mask"])
    flags = [x for name, path in videos.items() for x in (f"--{name}", path)]
    out = tmp_path / "out.mp4"
    frames_out = tmp_path / "frames.npy"
    assert (
        generate(
            "--image", files["image"], "--mode", mode, *flags, "--fps", FPS, "--seed", 5,
            "--init_latents", tmp_path / "noise.safetensors", "--output_video", out, "--frames_out", frames_out,
        )
        == 0
    )  # fmt: skip
    ours = np.load(frames_out)
    read = {k: read_frames(v, FPS, 1 << 20) for k, v in videos.items()}
    expected = pipe(
        "a dancer",
        image=str(files["image"]),
        mode=mode,
        **read,
        height=HEIGHT,
        width=WIDTH,
        num_inference_steps=2,
        seed=5,
        latents=noise,
        progress=False,
    ).frames
    assert ours.shape == (1, FRAMES, HEIGHT, WIDTH, 3)
    np.testing.assert_array_equal(ours, expected)


def test_bad_inputs_are_one_line_errors(files, capsys, demo_env):
    base = ("--image", files["image"], "--pose_video", files["pose"])
    assert "needs a face video (--face_video)" in one_line(capsys, *base)
    assert "needs the character image and a pose video" in one_line(
        capsys, "--image", files["image"], "--face_video", files["face"]
    )
    line = one_line(
        capsys, *base, "--face_video", files["face"], "--mode", "replace", "--mask_video", files["mask"]
    )
    assert "replace mode needs a background video and a mask video" in line
    line = one_line(capsys, *base, "--face_video", files["face"], "--frames", 40)
    assert "--pose_video gives 12 frames at 16 fps, fewer than the 40 asked for" in line
    line = one_line(capsys, *base, "--face_video", files["text"])
    assert "error: --face_video:" in line and "not a video" in line
    line = one_line(capsys, *base, "--face_video", files["face"], "--prev_segment_conditioning_frames", 5)
    assert "more than twice prev_segment_conditioning_frames 5" in line
    code = main(["generate", "--model", "demo", "--prompt", "x", "--pose_video", str(files["pose"])])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "are for an Animate model" in err


def test_a_cache_diffusers_cannot_hook_is_refused_on_an_animate_model(files, capsys, demo_env):
    """One line, before any work."""
    base = ("--image", files["image"], "--pose_video", files["pose"], "--face_video", files["face"])
    line = one_line(capsys, *base, "--cache", "firstblock")
    assert "firstblock does not run on an Animate model: diffusers (0.42.1) cannot put its" in line


@pytest.mark.slow
def test_taylorseer_on_an_animate_model(files, demo_env, tmp_path):
    """Its steps counted on over the segments; the record lists them all in turn."""
    base = ("--image", files["image"], "--pose_video", files["pose"], "--face_video", files["face"])
    taylor = ["--cache", "taylorseer", "--cache_option", "use_lite_mode=true"]
    taylor += ["--cache_option", "cache_interval=2", "--cache_option", "disable_cache_before_step=1"]
    assert generate(*base, *taylor, "--fps", FPS, "--output_video", tmp_path / "ts.mp4") == 0
    cache = json.loads((tmp_path / "ts.json").read_text())["cache"]
    assert cache["policy"] == "taylorseer" and cache["options"]["cache_interval"] == 2
    # two segments of 9 frames (demo-animate's) of 2 steps: hook calls 0..3, diffusers' C P | C P
    assert cache["branches"]["cond"]["skipped"] == [1, 3] and cache["dit_evaluations"] == 2
