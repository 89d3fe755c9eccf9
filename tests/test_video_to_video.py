"""Video to video against diffusers' ``WanVideoToVideoPipeline`` on the tiny saved pipeline: the same
source frames, prompt, strength and noise give diffusers' latents (float32) and frames; the
scheduler started part-way equals diffusers' UniPC and Euler run over the truncated timesteps; a
video file is read at the run's frame rate.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.compare import relative_error, to_uint8
from helpers.pipelines import NEGATIVE, PROMPT
from PIL import Image

from wanjax import WanPipeline
from wanjax.errors import ConfigError, WanjaxError
from wanjax.io.video import write_mp4
from wanjax.io.video_reader import read_frames
from wanjax.pipeline import preparation
from wanjax.sampling.scheduler import SchedulerConfig, make_scheduler

HEIGHT, WIDTH, STEPS = 48, 64, 5


def source_frames(count: int = 9, size: tuple[int, int] = (80, 56)) -> list[Image.Image]:
    """A smooth moving pattern of another size than the video (the pipeline resizes it)."""
    w, h = size
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    frames = []
    for t in range(count):
        r = 127 + 100 * np.sin(x / 9 + t / 2)
        g = 127 + 100 * np.cos(y / 7 - t / 3)
        b = 127 + 60 * np.sin((x + y) / 13 + t)
        frames.append(Image.fromarray(np.stack([r, g, b], -1).astype(np.uint8)))
    return frames


@pytest.fixture(scope="module")
def v2v(tiny_pipeline_dir):
    from diffusers import WanVideoToVideoPipeline

    return WanVideoToVideoPipeline.from_pretrained(tiny_pipeline_dir), WanPipeline.from_pretrained(
        tiny_pipeline_dir, dtype="float32", jax_cache_dir=False
    )


def diffusers_run(pipe, frames, strength: float) -> tuple[np.ndarray, np.ndarray, int]:
    """Its final latents, uint8 frames and the steps it ran; noise from ``manual_seed(0)``."""
    final = []

    def callback(p, i, t, kw):
        final.append(kw["latents"].clone())
        return {}

    with torch.no_grad():
        video = pipe(
            video=frames,
            prompt=[PROMPT],
            negative_prompt=[NEGATIVE],
            height=HEIGHT,
            width=WIDTH,
            num_inference_steps=STEPS,
            guidance_scale=5.0,
            strength=strength,
            generator=torch.Generator().manual_seed(0),
            output_type="np",
            callback_on_step_end=callback,
        ).frames
    return final[-1].numpy(), to_uint8(video), len(final)


def seed0_noise(frames: int) -> np.ndarray:
    shape = (1, 16, (frames - 1) // 4 + 1, HEIGHT // 8, WIDTH // 8)
    return torch.randn(shape, generator=torch.Generator().manual_seed(0)).numpy()


@pytest.mark.parametrize("strength", [0.6, 0.8])
def test_video_to_video_equals_diffusers(v2v, strength):
    """strength 0.6 of 5 steps runs the last 3, 0.8 the last 4 (UniPC warming up again from there)."""
    reference, pipe = v2v
    frames = source_frames()
    latents_ref, frames_ref, steps_ref = diffusers_run(reference, frames, strength)
    result = pipe(
        PROMPT,
        NEGATIVE,
        height=HEIGHT,
        width=WIDTH,
        num_inference_steps=STEPS,
        guidance_scale=5.0,
        latents=seed0_noise(len(frames)),
        video=frames,
        strength=strength,
        progress=False,
    )
    assert 1 + len(result.denoised.step_times.steady) == steps_ref == int(STEPS * strength)
    assert relative_error(result.denoised.latents, latents_ref) <= 1e-5
    assert np.abs(result.frames.astype(np.int16) - frames_ref).max() <= 2


@pytest.mark.parametrize("kind", ["unipc", "euler"])
@pytest.mark.parametrize("strength", [0.3, 0.7, 1.0])
def test_a_schedule_started_part_way_steps_as_diffusers(kind, strength):
    """Random model outputs through diffusers' scheduler over ``timesteps[start:]`` (noise added at
    the first) and through ours from ``start``: the same samples, op by op."""
    from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler

    steps, shift = 8, 3.0
    if kind == "unipc":
        theirs = UniPCMultistepScheduler(
            prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=shift
        )
    else:
        theirs = FlowMatchEulerDiscreteScheduler(shift=shift)
    theirs.set_timesteps(steps)
    ours = make_scheduler(SchedulerConfig(flow_shift=shift), steps, kind=kind, strength=strength)
    runs = int(steps * strength)
    assert ours.start == steps - runs
    rng = np.random.default_rng(0)
    source, noise = rng.standard_normal((2, 1, 4, 2, 3, 5)).astype(np.float32)
    timesteps = theirs.timesteps[steps - runs :]
    clean, drawn = torch.from_numpy(source), torch.from_numpy(noise)
    if kind == "unipc":
        x = theirs.add_noise(clean, drawn, timesteps[:1])
    else:
        x = theirs.scale_noise(clean, timesteps[:1], drawn)
    state = ours.init_state(ours.noised(source, noise))
    np.testing.assert_array_equal(np.asarray(state.sample), x.numpy())
    for i, t in zip(range(ours.start, steps), timesteps, strict=True):
        output = rng.standard_normal(source.shape).astype(np.float32)
        x = theirs.step(torch.from_numpy(output), t, x, return_dict=False)[0]
        state, _ = ours.step(state, output, i)
        np.testing.assert_allclose(np.asarray(state.sample), x.numpy(), rtol=1e-6, atol=1e-6)


def test_strengths_that_run_nothing_or_are_not_in_range_are_refused():
    config = SchedulerConfig(flow_shift=3.0)
    for strength in (0, -0.5, 1.5, float("nan"), True):
        with pytest.raises(ConfigError, match=r"strength must be a number in \(0, 1\]"):
            make_scheduler(config, 10, strength=strength)
    with pytest.raises(
        ConfigError, match=r"strength 0.05 of 10 steps runs no step: give a strength of at least 0\.1"
    ):
        make_scheduler(config, 10, strength=0.05)


def test_a_video_file_is_read_at_the_runs_frame_rate(tmp_path):
    """30 fps read at 16: frame i is the one shown at i/16 s; at 60: each frame twice; a short
    video gives what it has; a file that is not a video is one line."""
    levels = np.arange(12) * 20 + 10  # frame k is uniformly grey at level 20k + 10
    frames = np.repeat(levels[:, None, None, None], 3, -1) * np.ones((1, 32, 48, 1))
    path = write_mp4(frames.astype(np.uint8), tmp_path / "grey.mp4", fps=30)

    def shown(fps, limit):
        return [round((np.asarray(f, np.float32).mean() - 10) / 20) for f in read_frames(path, fps, limit)]

    assert shown(16, 5) == [int(i * 30 / 16) for i in range(5)] == [0, 1, 3, 5, 7]
    assert shown(60, 6) == [0, 0, 1, 1, 2, 2]
    assert shown(30, 100) == list(range(12))
    text = tmp_path / "notes.mp4"
    text.write_text("not a video")
    with pytest.raises(WanjaxError, match=r"notes\.mp4 is not a video PyAV can read"):
        read_frames(text, 16, 5)


def test_a_mask_that_is_neither_a_video_nor_an_image_says_what_to_give(tmp_path):
    """A mask is one image (for every frame) or a video; a file that is neither is named as neither."""
    from wanjax.pipeline.video_input import mask_frames

    notes = tmp_path / "notes.txt"
    notes.write_text("not a mask")
    with pytest.raises(WanjaxError) as refused:
        mask_frames(notes, 5, 16.0)
    assert str(refused.value) == (
        f"{notes} is neither a video nor an image that can be read: give the mask as one image (for "
        "every frame) or a video of the run's frames, white where the video is generated and black "
        "where it is kept (e.g. a PNG or an mp4)"
    )
    source_frames(1)[0].save(tmp_path / "mask.png")
    assert len(mask_frames(tmp_path / "mask.png", 5, 16.0)) == 5
    write_clip(tmp_path / "mask.mp4", source_frames(5), fps=16)
    assert len(mask_frames(tmp_path / "mask.mp4", 5, 16.0)) == 5
    with pytest.raises(WanjaxError, match="the mask has 5 frames; the video has 9"):  # a video's own problem
        mask_frames(tmp_path / "mask.mp4", 9, 16.0)


def test_the_video_gives_the_frames_and_aspect(v2v):
    """Frames left out: as many as the video has (4n+1); asked for more than it has: one line naming
    how many it can give; the size left out keeps the video's aspect at the model's area."""
    _, pipe = v2v
    assert len(preparation.read_video(pipe.components, source_frames(11))) == 9
    with pytest.raises(
        WanjaxError, match="gives 11 frames at 16 fps, fewer than the 13 asked for: ask for 9"
    ):
        preparation.read_video(pipe.components, source_frames(11), 13)
    assert preparation.video_size(pipe.components, source_frames(1)[0]) == preparation.video_size(
        pipe.components, Image.new("RGB", (80, 56))
    )


def test_video_to_video_needs_a_text_to_video_model_and_no_image(v2v):
    _, pipe = v2v
    with pytest.raises(WanjaxError, match="video to video runs on a text-to-video model, without an image"):
        pipe(PROMPT, video=source_frames(), image=source_frames(1)[0], num_inference_steps=2, progress=False)
    with pytest.raises(WanjaxError, match="a strength is for video to video"):
        pipe.denoise(
            np.zeros((1, 512, 24)), None, seed0_noise(9), guidance_scale=1, strength=0.5, progress=False
        )


def write_clip(path, frames: list[Image.Image], fps: float = 16.0):
    return write_mp4(np.stack([np.asarray(f) for f in frames]), path, fps=fps)


@pytest.mark.slow
def test_generate_and_three_stages_with_a_video_equal_diffusers(v2v, tmp_path):
    """``generate --video --strength --init_latents`` in float32: diffusers' frames from the same
    decoded frames and noise; ``encode --video`` / ``denoise --strength`` / ``decode``: diffusers'
    latents, and exactly ``generate``'s frames."""
    from safetensors.numpy import load_file, save_file

    from wanjax.cli.main import main

    reference, pipe = v2v
    clip = write_clip(tmp_path / "clip.mp4", source_frames(11, (96, 64)), fps=24)
    frames = read_frames(clip, 16, 9)  # 11 frames at 24 fps last 0.46 s: 8 frames at 16 fps
    assert len(frames) == 8
    latents_ref, frames_ref, _ = diffusers_run(reference, frames[:5], 0.6)
    noise = tmp_path / "noise.safetensors"
    save_file({"latents": seed0_noise(5)}, str(noise))
    quiet = ("--quiet",)
    text = (
        "--model",
        pipe.components.path,
        "--prompt",
        PROMPT,
        "--negative_prompt",
        NEGATIVE,
        "--dtype",
        "float32",
    )
    size = ("--height", HEIGHT, "--width", WIDTH, "--frames", 5)
    sampling = (
        "--num_inference_steps",
        STEPS,
        "--guidance_scale",
        5.0,
        "--init_latents",
        noise,
        "--strength",
        0.6,
    )

    def cli(*args):
        assert main([*map(str, args), *quiet]) == 0

    outputs = ("--output_video", tmp_path / "g.mp4", "--frames_out", tmp_path / "g.npy")
    cli("generate", *text, "--video", clip, *size, *sampling, *outputs)
    generated = np.load(tmp_path / "g.npy")
    assert np.abs(generated.astype(np.int16) - frames_ref).max() <= 2
    d = tmp_path / "stages"
    cli("encode", *text, "--video", clip, *size, "--output_dir", d)
    cli("denoise", "--input_dir", d, "--dtype", "float32", *sampling)
    assert relative_error(load_file(d / "stage2_latents.safetensors")["latents"], latents_ref) <= 1e-5
    cli("decode", "--input_dir", d, "--frames_out", d / "f.npy")
    np.testing.assert_array_equal(np.load(d / "f.npy"), generated)


MISTAKES = {
    "not a video": (("--video", "notes.mp4"), "--video: notes.mp4 is not a video PyAV can read"),
    "an image as the video": (("--video", "clip.png"), "--video: clip.png is an image (PNG), not a video"),
    "a JPEG named mp4": (("--video", "photo.mp4"), "--video: photo.mp4 is an image (JPEG), not a video"),
    "strength zero": (("--video", "clip.mp4", "--strength", "0"), "--strength must be over 0 and at most 1"),
    "strength over one": (
        ("--video", "clip.mp4", "--strength", "1.5"),
        "--strength must be over 0 and at most 1",
    ),
    "strength alone": (("--strength", "0.5"), "--strength is for video to video: give the video too"),
    "too few frames": (
        ("--video", "clip.mp4", "--frames", "33"),
        "--video: the video gives 27 frames at 16 fps, fewer than the 33 asked for: ask for 25 frames or fewer",
    ),
    "image model": (
        ("--model", "demo-i2v", "--video", "clip.mp4"),
        "--video is for a text-to-video model; demo-i2v starts from an image (--image)",
    ),
    "video and image": (("--video", "clip.mp4", "--image", "clip.png"), "--video and --image both given"),
    "mask for a text-to-video model": (
        ("--video", "clip.mp4", "--mask", "clip.png"),
        "--mask, --reference_image and --conditioning_scale are for a VACE model; demo is not one",
    ),
    "a mask that is neither a video nor an image": (
        ("--model", "demo-vace", "--mask", "notes.mp4"),
        "--mask: notes.mp4 is neither a video nor an image that can be read: give the mask as one image",
    ),
    "a reference that is no image": (
        ("--model", "demo-vace", "--reference_image", "notes.mp4"),
        "--reference_image ",
    ),
    "clips for a text-to-video model": (
        ("--clips", "2"),
        "--extend and --clips continue a video with a VACE model's control; demo is not one",
    ),
    "overlap alone": (("--model", "demo-vace", "--overlap", "3"), "--overlap is for --extend or --clips"),
    "extend with a control video": (
        ("--model", "demo-vace", "--extend", "clip.mp4", "--video", "clip.mp4"),
        "--extend and --clips make each clip's control; leave --video, --mask and --reference_image out",
    ),
}


@pytest.mark.slow
def test_video_mistakes_are_one_line_exit_2_and_nothing_written(tmp_path, demo_env):
    """Through the real command, each in its own folder holding the inputs: exit 2, one line naming
    the problem, no output."""
    import os
    import subprocess
    import sys

    started = {}
    for name, (args, _) in MISTAKES.items():
        cwd = tmp_path / name.replace(" ", "_")
        cwd.mkdir()
        write_clip(cwd / "clip.mp4", source_frames(40, (64, 48)), fps=24)  # 27 frames at 16 fps
        source_frames(1)[0].save(cwd / "clip.png")
        source_frames(1)[0].save(cwd / "photo.mp4", format="JPEG")
        (cwd / "notes.mp4").write_text("not a video")
        command = [sys.executable, "-m", "wanjax.cli", "generate", "--model", "demo", "--prompt", "a cat"]
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "WANJAX_CACHE": str(demo_env)}
        inputs = sorted(p.name for p in cwd.iterdir())
        proc = subprocess.Popen(
            [*command, *args, "--output_video", "out/v.mp4"], cwd=cwd, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        started[name] = (proc, cwd, inputs)
    for name, (proc, cwd, inputs) in started.items():
        out, err = proc.communicate(timeout=300)
        lines = err.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, (name, proc.returncode, err)
        assert lines[0].startswith("wanjax: error: ") and MISTAKES[name][1] in lines[0], (name, lines[0])
        assert out == "" and sorted(p.name for p in cwd.iterdir()) == inputs, name
