"""End to end against diffusers: a tiny WanPipeline (UniPC, CFG on) saved with save_pretrained.

The three-stage CLI (float32, same prompt, same ``--init_latents``) must give diffusers'
``encode_prompt`` embeddings, its ``output_type="latent"`` latents and its decoded frames; the
stage-2 file must decode in diffusers' VAE to our frames; and ``generate`` must give exactly the
frames of the three stages. Every expected value comes from diffusers, never from wanjax.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.compare import relative_error, to_uint8
from helpers.pipelines import NEGATIVE, PROMPT, TEXT
from safetensors.numpy import load_file, save_file

from wanjax.cli.main import main
from wanjax.pipeline import stages

HEIGHT, WIDTH, FRAMES, STEPS, GUIDANCE = 48, 64, 9, 4, 5.0


@pytest.fixture(scope="module")
def model_dir(tiny_pipeline_dir):
    """The tiny random WanPipeline (:func:`build_tiny_pipeline`), and the diffusers pipeline read back."""
    from diffusers import WanPipeline

    return tiny_pipeline_dir, WanPipeline.from_pretrained(tiny_pipeline_dir)


@pytest.fixture(scope="module")
def noise(tmp_path_factory):
    """Starting noise in a safetensors file (key ``latents``), as torch draws it."""
    latents = torch.randn(
        (1, 16, (FRAMES - 1) // 4 + 1, HEIGHT // 8, WIDTH // 8), generator=torch.Generator().manual_seed(0)
    )
    path = tmp_path_factory.mktemp("noise") / "noise.safetensors"
    save_file({"latents": latents.numpy()}, str(path))
    return path, latents


@pytest.fixture(scope="module")
def reference(model_dir, noise):
    """diffusers: embeddings, output_type="latent" latents and decoded uint8 frames."""
    _, pipe = model_dir
    kwargs = dict(
        prompt=PROMPT,
        negative_prompt=NEGATIVE,
        height=HEIGHT,
        width=WIDTH,
        num_frames=FRAMES,
        num_inference_steps=STEPS,
        guidance_scale=GUIDANCE,
        latents=noise[1],
    )
    with torch.no_grad():
        pos, neg = pipe.encode_prompt(PROMPT, NEGATIVE, max_sequence_length=512, device="cpu")
        latents = pipe(**kwargs, output_type="latent").frames
        video = pipe(**kwargs, output_type="np").frames
    return {"pos": pos.numpy(), "neg": neg.numpy(), "latents": latents.numpy(), "frames": to_uint8(video)}


def cli(*args) -> None:
    assert main(list(map(str, args))) == 0


@pytest.fixture(scope="module")
def staged(model_dir, noise, tmp_path_factory):
    """The three-stage CLI in float32 from the same noise; returns the stage directory."""
    root, _ = model_dir
    d = tmp_path_factory.mktemp("stages")
    cli(
        "encode",
        "--model",
        root,
        "--prompt",
        PROMPT,
        "--negative-prompt",
        NEGATIVE,
        "--dtype",
        "float32",
        "--output_dir",
        d,
    )
    cli(
        "denoise",
        "--input_dir",
        d,
        "--init_latents",
        noise[0],
        "--num_inference_steps",
        STEPS,
        "--guidance_scale",
        GUIDANCE,
    )
    cli("decode", "--input_dir", d, "--output_video", d / "v.mp4", "--frames_out", d / "frames.npy")
    return d


@pytest.mark.slow
def test_stage_files_match_diffusers(staged, reference):
    embeds = load_file(staged / stages.EMBEDDINGS_FILE)
    assert embeds["prompt_embeds"].shape == reference["pos"].shape == (1, 512, TEXT["d_model"])
    assert relative_error(embeds["prompt_embeds"], reference["pos"]) <= 1e-4
    assert relative_error(embeds["negative_prompt_embeds"], reference["neg"]) <= 1e-4

    latents = load_file(staged / stages.LATENTS_FILE)["latents"]
    assert latents.dtype == np.float32 and latents.shape == reference["latents"].shape == (1, 16, 3, 6, 8)
    assert relative_error(latents, reference["latents"]) <= 1e-4

    frames = np.load(staged / "frames.npy")
    ref = reference["frames"]
    assert frames.dtype == np.uint8 and frames.shape == ref.shape == (1, FRAMES, HEIGHT, WIDTH, 3)
    assert ref.std() > 20 and ((ref == 0) | (ref == 255)).mean() < 0.2  # varied, mostly not clipped
    assert np.abs(frames.astype(np.int16) - ref).max() <= 2


@pytest.mark.slow
def test_stage2_file_decodes_in_diffusers(staged, model_dir):
    """Our latents file through diffusers' VAE (de-normalised as WanPipeline does) gives our frames."""
    from safetensors.torch import load_file as load_torch

    _, pipe = model_dir
    latents = load_torch(staged / stages.LATENTS_FILE)["latents"]
    cfg = pipe.vae.config
    mean = torch.tensor(cfg.latents_mean).view(1, cfg.z_dim, 1, 1, 1)
    inv_std = 1.0 / torch.tensor(cfg.latents_std).view(1, cfg.z_dim, 1, 1, 1)
    with torch.no_grad():
        video = pipe.vae.decode(latents / inv_std + mean, return_dict=False)[0]
    ref = to_uint8(pipe.video_processor.postprocess_video(video, output_type="np"))
    assert np.abs(np.load(staged / "frames.npy").astype(np.int16) - ref).max() <= 2


@pytest.mark.slow
def test_config_records_every_parameter(staged, model_dir, noise):
    config = stages.read_config(staged)
    expected = {
        "model": str(model_dir[0].resolve()),
        "prompt": PROMPT,
        "negative_prompt": NEGATIVE,
        "max_sequence_length": 512,
        "height": HEIGHT,
        "width": WIDTH,
        "frames": FRAMES,
        "fps": 16,
        "num_inference_steps": STEPS,
        "guidance_scale": GUIDANCE,
        "flow_shift": 3.0,
        "seed": None,
        "init_latents": str(noise[0].resolve()),
        "output_video": str(staged / "v.mp4"),
    }
    assert {k: config[k] for k in expected} == expected
    assert list(config["stages"]) == ["encode", "denoise", "decode"] and "wanjax_version" in config


@pytest.mark.slow
def test_three_stages_equal_generate_bfloat16(model_dir, tmp_path):
    """Same arguments, default dtype (bf16 embeddings stored natively), noise from --seed."""
    root, _ = model_dir
    common = ("--prompt", PROMPT, "--negative_prompt", NEGATIVE)
    video = ("--height", HEIGHT, "--width", WIDTH, "--frames", FRAMES)
    sampling = ("--num_inference_steps", 3, "--guidance_scale", 4.0, "--seed", 7)
    cli(
        "generate",
        "--model",
        root,
        *common,
        *video,
        *sampling,
        "--output_video",
        tmp_path / "g.mp4",
        "--frames_out",
        tmp_path / "g.npy",
    )
    d = tmp_path / "stages"
    cli("encode", "--model", root, *common, "--output_dir", d)
    assert load_file(d / stages.EMBEDDINGS_FILE)["prompt_embeds"].dtype.name == "bfloat16"
    cli("denoise", "--input_dir", d, *video, *sampling)
    cli("decode", "--input_dir", d, "--frames_out", d / "s.npy")
    np.testing.assert_array_equal(np.load(d / "s.npy"), np.load(tmp_path / "g.npy"))
    assert (d / "output_video.mp4").is_file() and (tmp_path / "g.mp4").is_file()


@pytest.mark.slow
def test_python_api_without_guidance_matches_diffusers(model_dir, noise):
    """``WanPipeline.__call__`` with guidance 1 (no unconditional pass) and given latents."""
    from wanjax import WanPipeline

    root, reference = model_dir
    kwargs = dict(height=HEIGHT, width=WIDTH, num_frames=FRAMES, num_inference_steps=3, guidance_scale=1.0)
    with torch.no_grad():
        ref = to_uint8(reference(PROMPT, NEGATIVE, latents=noise[1], output_type="np", **kwargs).frames)
    pipe = WanPipeline.from_pretrained(root, dtype="float32", jax_cache_dir=False)
    video = pipe(PROMPT, NEGATIVE, latents=noise[1].numpy(), progress=False, **kwargs)
    frames = video.frames
    assert frames.shape == ref.shape and ref.std() > 20
    assert np.abs(frames.astype(np.int16) - ref).max() <= 2
    assert set(video.timings) == {"encode", "denoise", "decode"} and video.denoised.step_times.steps == 3
