"""The built-in demo model and whole runs with it: deterministic files in the diffusers layout, an mp4
from ``wanjax generate --model demo`` (the README command), one compile per shape, and a second
process that takes every program from the persistent compilation cache."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import av
import numpy as np
import pytest
from helpers.processes import users_xla_flags

from wanjax import WanPipeline
from wanjax.errors import ConfigError
from wanjax.models.registry import DEMO_DEFAULTS
from wanjax.models.vae import Tiling
from wanjax.pipeline.demo import demo_model_dir, is_demo_model


def test_demo_model_is_deterministic_and_complete(tmp_path):
    first, second = demo_model_dir(tmp_path / "a"), demo_model_dir(tmp_path / "b")
    assert first.name == second.name and is_demo_model(first)
    files = sorted(p.relative_to(first) for p in first.rglob("*") if p.is_file())
    assert [str(f) for f in files] == [
        "model_index.json",
        "scheduler/scheduler_config.json",
        "text_encoder/config.json",
        "text_encoder/model.safetensors",
        "tokenizer/tokenizer.json",
        "tokenizer/tokenizer_config.json",
        "transformer/config.json",
        "transformer/diffusion_pytorch_model.safetensors",
        "vae/config.json",
        "vae/diffusion_pytorch_model.safetensors",
    ]
    for f in files:
        assert (first / f).read_bytes() == (second / f).read_bytes(), f
    assert demo_model_dir(tmp_path / "a") == first  # reused, not rewritten
    assert not [p for p in (tmp_path / "a").iterdir() if p.name.endswith(".tmp")]


@pytest.mark.slow
def test_python_api_compiles_once_per_shape(demo_env):
    pipe = WanPipeline.from_pretrained("demo", dtype="float32", jax_cache_dir=False)
    kwargs = dict(height=32, width=48, num_frames=5, num_inference_steps=2, progress=False)
    a = pipe(["a red cat", "a dog"], **kwargs, seed=1)
    assert a.frames.shape == (2, 5, 32, 48, 3) and a.frames.dtype == np.uint8
    assert sum(t.programs for t in a.timings.values()) > 0
    b = pipe(["a red cat", "a dog"], **kwargs, seed=2)
    assert {s: t.programs for s, t in b.timings.items()} == {"encode": 0, "denoise": 0, "decode": 0}
    assert not np.array_equal(a.frames, b.frames)


def test_pipeline_vae_options_reach_the_vae(demo_env):
    """vae_weights_dtype, vae_decode_chunk and vae_tiling as load_vae takes them; bad values are
    refused when the pipeline is made, before any weight is read."""
    pipe = WanPipeline.from_pretrained(
        "demo", vae_weights_dtype="bfloat16", vae_decode_chunk="all", vae_tiling=True, jax_cache_dir=False
    )
    vae = pipe.vae
    assert vae.dtype == np.float32 and vae.params["decoder.conv_in"]["kernel"].dtype == "bfloat16"
    assert vae.decode_chunk is None and vae.tiling == Tiling(256, 192)
    assert WanPipeline.from_pretrained("demo", jax_cache_dir=False).vae.tiling is None
    for bad in ({"vae_decode_chunk": 0}, {"vae_weights_dtype": "int7"}):
        with pytest.raises(ConfigError):
            WanPipeline.from_pretrained("demo", jax_cache_dir=False, **bad)


def generate(tmp_path, name: str, *outputs) -> tuple[dict, str]:
    """``wanjax generate --model demo`` in a new process (cwd ``tmp_path``), compiling as a user's run
    does (its compile time is compared with the cached run's); its metrics and stdout."""
    env = {
        **os.environ,
        "WANJAX_CACHE": str(tmp_path / "cache"),
        "WANJAX_JAX_CACHE_DIR": str(tmp_path / "jax"),
        "XLA_FLAGS": users_xla_flags(),
    }
    result = subprocess.run(
        [sys.executable, "-m", "wanjax.cli.main", "generate", "--model", "demo", "--prompt", "A cat plays the piano",
         *outputs, "--metrics_json", f"{name}.json"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return json.loads((tmp_path / f"{name}.json").read_text()), result.stdout


@pytest.mark.slow
def test_generate_demo_video_then_a_second_run_compiles_nothing(tmp_path):
    first, out = generate(tmp_path, "first", "--output_video", "first.mp4", "--preview", "first.png")
    assert "smoke model" in out and "compile s" in out and "first.mp4" in out
    assert first["smoke_model"] and first["model"] == "demo"
    assert first["denoise"]["steps"] == DEMO_DEFAULTS.num_inference_steps
    with av.open(str(tmp_path / "first.mp4")) as container:
        stream = container.streams.video[0]
        assert (stream.codec_context.name, stream.codec_context.pix_fmt) == ("h264", "yuv420p")
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
    assert len(frames) == DEMO_DEFAULTS.frames
    assert frames[0].shape == (DEMO_DEFAULTS.height, DEMO_DEFAULTS.width, 3)
    assert (tmp_path / "first.png").stat().st_size > 0

    second, _ = generate(tmp_path, "second")  # default output name: YYYYMMDD_HHMMSS.mp4
    [video] = second["outputs"]["video"]
    assert re.fullmatch(r"\d{8}_\d{6}\.mp4", video), second["outputs"]
    assert (tmp_path / video).is_file()
    for stage in ("encode", "denoise", "decode"):
        assert second["stages"][stage]["programs"] == second["stages"][stage]["cache_hits"] > 0, second
    assert second["compile_s"] < 0.25 * first["compile_s"], (first["compile_s"], second["compile_s"])


@pytest.mark.slow
def test_image_to_video_demo_runs_from_an_image_at_its_aspect(demo_env, tmp_path):
    """``generate --model demo-i2v --image``: the video keeps the image's aspect at the demo's area; the
    demo folder is a diffusers WanImageToVideoPipeline (read by diffusers itself)."""
    from diffusers import WanImageToVideoPipeline
    from PIL import Image

    from wanjax.cli.main import main
    from wanjax.io.paths import cache_root

    image = tmp_path / "portrait.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (300, 200, 3), dtype=np.uint8)).save(image)
    video = tmp_path / "v.mp4"
    args = ["generate", "--model", "demo-i2v", "--prompt", "a cat", "--image", str(image)]
    assert main([*args, "--num_inference_steps", "2", "--output_video", str(video)]) == 0
    record = json.loads(video.with_suffix(".json").read_text())
    area = DEMO_DEFAULTS.height * DEMO_DEFAULTS.width
    assert (record["video"]["height"], record["video"]["width"]) == (192, 128)  # 3:2 portrait, area 128*192
    assert record["video"]["height"] * record["video"]["width"] == area and record["model"] == "demo-i2v"
    folder = demo_model_dir(cache_root(), "demo-i2v")
    pipe = WanImageToVideoPipeline.from_pretrained(folder)
    assert pipe.image_encoder.config.hidden_size == pipe.transformer.config.image_dim


@pytest.mark.slow
def test_two_expert_demo_is_a_diffusers_wan22_pipeline_and_runs_both_experts(demo_env, tmp_path):
    """``demo-a14b``: diffusers reads it as a Wan 2.2 A14B-style WanPipeline (``transformer_2``,
    ``boundary_ratio``); ``generate`` runs the high-noise expert, then the low-noise one."""
    from diffusers import WanPipeline as ReferencePipeline

    from wanjax.cli.main import main
    from wanjax.io.paths import cache_root

    video = tmp_path / "v.mp4"
    args = ["generate", "--model", "demo-a14b", "--prompt", "a cat", "--num_inference_steps", "4"]
    assert main([*args, "--output_video", str(video)]) == 0
    record = json.loads(video.with_suffix(".json").read_text())
    assert record["expert_steps"] == [0, 0, 1, 1] and record["sampling"]["boundary_ratio"] == 0.875
    reference = ReferencePipeline.from_pretrained(demo_model_dir(cache_root(), "demo-a14b"))
    assert reference.transformer_2 is not None and reference.config.boundary_ratio == 0.875
