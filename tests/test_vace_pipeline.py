"""VACE against diffusers' ``WanVACEPipeline`` on a tiny random pipeline saved with
``save_pretrained``, float32: a control video alone, with a mask (inpainting), reference images, and
all of them, each with a conditioning scale other than 1: diffusers' latents and frames from the
same inputs and noise; the mask folding and the reference canvas as diffusers builds them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.compare import relative_error, to_uint8
from helpers.pipelines import NEGATIVE, PROMPT, save_tiny, tiny_components
from PIL import Image

from wanjax import WanPipeline
from wanjax.errors import WanjaxError
from wanjax.pipeline.vace import fold_mask, reference_canvas

HEIGHT, WIDTH, FRAMES, STEPS = 48, 64, 9, 3


@pytest.fixture(scope="module")
def vace(tmp_path_factory, tokenizer_dir):
    from diffusers import WanVACEPipeline, WanVACETransformer3DModel
    from helpers.models import TINY_DIT, randomize_
    from helpers.pipelines import TEXT

    components = tiny_components(tokenizer_dir)
    dit = {**TINY_DIT, "text_dim": TEXT["d_model"], "vace_layers": [0, 1], "vace_in_channels": 96}
    components["transformer"] = randomize_(WanVACETransformer3DModel(**dit), seed=2, std=0.2).eval()
    root = tmp_path_factory.mktemp("wan_vace")
    save_tiny(WanVACEPipeline(**components), root, tokenizer_dir)
    ours = WanPipeline.from_pretrained(root, dtype="float32", jax_cache_dir=False)
    return WanVACEPipeline.from_pretrained(root), ours


def frames(count: int = FRAMES, size: tuple[int, int] = (128, 96)) -> list[Image.Image]:
    """A moving pattern at twice the video's size (the same aspect: both pipelines resize it alike)."""
    w, h = size
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    return [
        Image.fromarray(np.stack([127 + 100 * np.sin(x / 9 + t), 127 + 90 * np.cos(y / 7 - t / 2),
                                  127 + 60 * np.sin((x + y) / 13)], -1).astype(np.uint8))
        for t in range(count)
    ]  # fmt: skip


def masks(count: int = FRAMES, size: tuple[int, int] = (128, 96)) -> list[Image.Image]:
    """White (generate) on a moving right part, black (keep) elsewhere."""
    out = []
    for t in range(count):
        pixels = np.zeros((size[1], size[0], 3), np.uint8)
        pixels[:, size[0] // 2 + 4 * t :] = 255
        out.append(Image.fromarray(pixels))
    return out


def references() -> list[Image.Image]:
    rng = np.random.default_rng(7)
    return [
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)) for shape in ((70, 40, 3), (50, 90, 3))
    ]


CASES = {
    "video": ({"video": frames()}, 0.7),
    "video+mask": ({"video": frames(), "mask": masks()}, 1.4),
    "references": ({"reference_images": references()}, 0.6),
    "video+mask+references": (
        {"video": frames(), "mask": masks(), "reference_images": references()[:1]},
        [0.5, 1.2],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_vace_equals_diffusers(vace, case):
    reference, pipe = vace
    inputs, scale = CASES[case]
    refs = len(inputs.get("reference_images", ()))
    noise = torch.randn(
        (1, 16, (FRAMES - 1) // 4 + 1 + refs, HEIGHT // 8, WIDTH // 8),
        generator=torch.Generator().manual_seed(0),
    )
    final = []
    with torch.no_grad():  # one prompt as a string: diffusers' VACE pipeline takes no list
        frames_ref = reference(
            prompt=PROMPT, negative_prompt=NEGATIVE, height=HEIGHT, width=WIDTH, num_frames=FRAMES,
            num_inference_steps=STEPS, guidance_scale=5.0, latents=noise, conditioning_scale=scale,
            output_type="np", callback_on_step_end=lambda p, i, t, kw: final.append(kw["latents"]) or {}, **inputs,
        ).frames  # fmt: skip
    latents_ref, frames_ref = final[-1].numpy(), to_uint8(frames_ref)
    video = pipe(
        PROMPT, NEGATIVE, height=HEIGHT, width=WIDTH, num_frames=FRAMES, num_inference_steps=STEPS,
        guidance_scale=5.0, latents=noise.numpy(),
        conditioning_scale=scale, progress=False, **inputs,
    )  # fmt: skip
    assert relative_error(video.denoised.latents, latents_ref) <= 1e-5
    assert video.frames.shape == frames_ref.shape == (1, FRAMES, HEIGHT, WIDTH, 3)
    assert np.abs(video.frames.astype(np.int16) - frames_ref).max() <= 2


def test_the_mask_folding_and_the_reference_canvas_are_diffusers(vace):
    reference, _ = vace
    _, mask, refs = reference.preprocess_conditions(
        None, masks(), references(), 1, HEIGHT, WIDTH, FRAMES, torch.float32, "cpu"
    )
    folded = reference.prepare_masks(mask, [[]])[0].numpy()
    np.testing.assert_array_equal(fold_mask(mask[0].numpy(), 4), folded)
    for ours, theirs in zip((reference_canvas(r, HEIGHT, WIDTH) for r in references()), refs[0], strict=True):
        np.testing.assert_allclose(ours, theirs.numpy(), rtol=0, atol=1e-6)


def test_a_scale_per_layer_must_match_the_vace_layers(vace):
    with pytest.raises(
        WanjaxError, match=r"conditioning_scale holds 3 values; give one, or one per vace layer \(2\)"
    ):
        vace[1](PROMPT, num_inference_steps=1, conditioning_scale=[1.0, 1.0, 1.0], progress=False)


def test_vace_inputs_are_for_a_vace_model(tiny_pipeline_dir):
    pipe = WanPipeline.from_pretrained(tiny_pipeline_dir, dtype="float32", jax_cache_dir=False)
    with pytest.raises(WanjaxError, match="a mask and reference images are for a VACE model"):
        pipe(PROMPT, reference_images=references(), num_inference_steps=1, progress=False)


@pytest.mark.slow
def test_the_three_stages_with_vace_flags_are_generate(vace, tmp_path):
    """``encode --video --mask --reference_image`` writes the control (and its reference frames'
    count), ``denoise`` reads it, ``decode`` drops the reference frames: ``generate``'s frames."""
    from wanjax.cli.main import main
    from wanjax.io.video import write_mp4
    from wanjax.pipeline import stages

    _, pipe = vace
    clip = write_mp4(np.stack([np.asarray(f) for f in frames()]), tmp_path / "control.mp4", fps=16)
    masks()[2].save(tmp_path / "mask.png")
    references()[0].save(tmp_path / "ref.png")
    model = ["--model", str(pipe.components.path), "--dtype", "float32", "--quiet"]
    inputs = ["--prompt", PROMPT, "--video", str(clip), "--mask", str(tmp_path / "mask.png")]
    inputs += ["--reference_image", str(tmp_path / "ref.png"), "--conditioning_scale", "0.6"]
    size = ["--height", str(HEIGHT), "--width", str(WIDTH), "--frames", str(FRAMES)]
    sampling = ["--num_inference_steps", str(STEPS), "--seed", "5"]
    outputs = ["--output_video", str(tmp_path / "g.mp4"), "--frames_out", str(tmp_path / "g.npy")]
    assert main(["generate", *model, *inputs, *size, *sampling, *outputs]) == 0
    d = tmp_path / "stages"
    assert main(["encode", *model, *inputs, *size, "--output_dir", str(d)]) == 0
    assert stages.load_vace(d).latents.shape == (
        1,
        96,
        4,
        HEIGHT // 8,
        WIDTH // 8,
    )  # 3 latent frames + 1 reference
    assert main(["denoise", "--input_dir", str(d), *model[2:], *sampling]) == 0
    assert main(["decode", "--input_dir", str(d), "--frames_out", str(d / "f.npy"), "--quiet"]) == 0
    np.testing.assert_array_equal(np.load(d / "f.npy"), np.load(tmp_path / "g.npy"))


@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["dp=2,sp=2,tp=2", "dp=1,sp=4,tp=2", "dp=1,sp=8,tp=1"])
def test_vace_on_a_mesh_equals_one_device(vace, mesh):
    """The control encoded split over the mesh as the decoder's latents, the control blocks' tokens
    split as the others' (heads over tp, tokens over sp), float32: the one-device run."""
    _, one = vace
    inputs, scale = CASES["video+mask+references"]
    noise = torch.randn(
        (1, 16, 4, HEIGHT // 8, WIDTH // 8), generator=torch.Generator().manual_seed(1)
    ).numpy()
    args = (PROMPT, NEGATIVE)
    kwargs = dict(
        height=HEIGHT, width=WIDTH, num_frames=FRAMES, num_inference_steps=STEPS, guidance_scale=5.0
    )
    kwargs.update(latents=noise, conditioning_scale=scale, progress=False, **inputs)
    alone = one(*args, **kwargs)
    sharded = WanPipeline.from_pretrained(
        one.components.path, dtype="float32", jax_cache_dir=False, mesh=mesh
    )(*args, **kwargs)
    assert relative_error(sharded.denoised.latents, alone.denoised.latents) <= 1e-5
    assert np.abs(sharded.frames.astype(np.int16) - alone.frames).max() <= 1


@pytest.mark.slow
@pytest.mark.bit_for_bit
def test_generate_with_vace_flags_is_the_python_run(vace, tmp_path):
    """``generate --video --mask --reference_image --conditioning_scale --init_latents``: exactly the
    frames of ``pipe(...)`` on the same decoded frames, mask image and reference image."""
    from safetensors.numpy import save_file

    from wanjax.cli.main import main
    from wanjax.io.video import write_mp4
    from wanjax.io.video_reader import read_frames

    _, pipe = vace
    clip = write_mp4(np.stack([np.asarray(f) for f in frames()]), tmp_path / "control.mp4", fps=16)
    masks()[3].save(tmp_path / "mask.png")
    references()[1].save(tmp_path / "ref.png")
    noise = torch.randn(
        (1, 16, 4, HEIGHT // 8, WIDTH // 8), generator=torch.Generator().manual_seed(2)
    ).numpy()
    save_file({"latents": noise}, str(tmp_path / "noise.safetensors"))
    args = [
        "generate",
        "--model",
        str(pipe.components.path),
        "--prompt",
        PROMPT,
        "--negative_prompt",
        NEGATIVE,
        "--dtype",
        "float32",
    ]
    args += [
        "--video",
        str(clip),
        "--mask",
        str(tmp_path / "mask.png"),
        "--reference_image",
        str(tmp_path / "ref.png"),
    ]
    args += [
        "--conditioning_scale",
        "0.7",
        "--height",
        str(HEIGHT),
        "--width",
        str(WIDTH),
        "--frames",
        str(FRAMES),
    ]
    args += ["--num_inference_steps", str(STEPS), "--init_latents", str(tmp_path / "noise.safetensors")]
    assert main([*args, "--frames_out", str(tmp_path / "f.npy"), "--quiet"]) == 0
    python = pipe(
        PROMPT, NEGATIVE, height=HEIGHT, width=WIDTH, num_frames=FRAMES, num_inference_steps=STEPS, latents=noise,
        video=read_frames(clip, 16, FRAMES),
        mask=Image.open(tmp_path / "mask.png"), reference_images=[Image.open(tmp_path / "ref.png")],
        conditioning_scale=0.7, progress=False,
    )  # fmt: skip
    np.testing.assert_array_equal(np.load(tmp_path / "f.npy"), python.frames)


@pytest.mark.slow
def test_a_clip_extended_once_is_diffusers_vace_run_on_the_last_frames(vace):
    """The new clip: diffusers' VACE run whose control video is the last 5 frames then gray ones, its
    mask black on them and white after (as diffusers' VACE examples build them); the result: the
    given frames cross-faded with the clip's first 5, then the clip's new frames."""
    reference, pipe = vace
    start = np.stack([np.asarray(f) for f in frames(6, (WIDTH, HEIGHT))])
    noise = torch.randn((1, 16, 3, HEIGHT // 8, WIDTH // 8), generator=torch.Generator().manual_seed(3))
    control = [Image.fromarray(f) for f in start[-5:]] + [
        Image.new("RGB", (WIDTH, HEIGHT), (128, 128, 128))
    ] * 4
    mask = [Image.new("L", (WIDTH, HEIGHT), 0)] * 5 + [Image.new("L", (WIDTH, HEIGHT), 255)] * 4
    final = []
    with torch.no_grad():
        frames_ref = reference(
            prompt=PROMPT, negative_prompt=NEGATIVE, video=control, mask=mask, height=HEIGHT, width=WIDTH,
            num_frames=FRAMES, num_inference_steps=STEPS, guidance_scale=5.0, latents=noise, output_type="np",
            callback_on_step_end=lambda p, i, t, kw: final.append(kw["latents"]) or {},
        ).frames  # fmt: skip
    out = pipe.extend(
        PROMPT, start, clips=1, overlap=5, num_frames=FRAMES, height=HEIGHT, width=WIDTH, negative_prompt=NEGATIVE,
        num_inference_steps=STEPS, guidance_scale=5.0, latents=noise.numpy(), progress=False,
    )  # fmt: skip
    clip = out.clips[0]
    assert relative_error(clip.denoised.latents, final[-1].numpy()) <= 1e-5
    assert np.abs(clip.frames.astype(np.int16) - to_uint8(frames_ref)).max() <= 2
    assert out.frames.shape == (1, 6 + 4, HEIGHT, WIDTH, 3)
    np.testing.assert_array_equal(out.frames[0, :1], start[:1])
    np.testing.assert_array_equal(out.frames[0, 6:], clip.frames[0, 5:])
    w = np.arange(1, 6, dtype=np.float32)[:, None, None, None] / 6
    blended = np.rint((1 - w) * start[1:] + w * clip.frames[0, :5].astype(np.float32))
    np.testing.assert_array_equal(out.frames[0, 1:6], blended.astype(np.uint8))


def test_three_clips_compile_their_programs_once(vace):
    """A video of three clips from the prompt: the first clip compiles its programs, the next two
    (the same shapes, with control frames) none; 9 + 4 + 4 frames."""
    _, pipe = vace
    out = pipe.extend(
        [PROMPT, "the fox turns", "the fox runs"], None, clips=3, overlap=5, num_frames=FRAMES, height=HEIGHT,
        width=WIDTH, num_inference_steps=2, progress=False,
    )  # fmt: skip
    compiled = out.programs_compiled
    assert compiled[1:] == [0, 0] and out.frames.shape[1] == FRAMES + 2 * (FRAMES - 5)
    # continuity, reported: the kept frames' difference and the VAE's own round trip of them (random
    # weights keep nothing: with them the first is far above the second, so it is reported, not bounded)
    assert len(out.overlap_error) == len(out.round_trip_error) == 2
    assert all(e > 0 for e in out.overlap_error) and all(
        r is not None and r >= 0 for r in out.round_trip_error
    )
    print("overlap mean abs", out.overlap_error, "round trip mean abs", out.round_trip_error)
    with pytest.raises(WanjaxError, match="2 prompts for 3 clips"):
        pipe.extend([PROMPT, PROMPT], None, clips=3)


@pytest.mark.slow
def test_generate_clips_and_extend_make_the_python_long_video(vace, tmp_path):
    """``generate --clips 2`` (a prompt per clip) is ``pipe.extend``'s video, its record says the
    second clip compiled nothing; ``--extend`` of that video with one more clip continues it."""
    import json

    from wanjax.cli.main import main
    from wanjax.io.video_reader import read_frames

    _, pipe = vace
    common = [
        "--model",
        str(pipe.components.path),
        "--dtype",
        "float32",
        "--height",
        str(HEIGHT),
        "--width",
        str(WIDTH),
    ]
    common += ["--frames", str(FRAMES), "--num_inference_steps", "2", "--quiet"]
    first = tmp_path / "two.mp4"
    args = ["generate", *common, "--prompt", PROMPT, "--prompt", "the fox turns", "--clips", "2"]
    assert main([*args, "--output_video", str(first), "--frames_out", str(tmp_path / "two.npy")]) == 0
    python = pipe.extend([PROMPT, "the fox turns"], None, clips=2, num_frames=FRAMES, height=HEIGHT, width=WIDTH,
                         num_inference_steps=2, negative_prompt="", progress=False)  # fmt: skip
    # within 1 level: generate runs on the 8 test devices (--mesh auto), the Python pipeline on one
    assert np.abs(np.load(tmp_path / "two.npy").astype(np.int16) - python.frames).max() <= 1
    record = json.loads(first.with_suffix(".json").read_text())
    assert record["clips"]["count"] == 2 and record["clips"]["programs_compiled"][1] == 0
    assert record["video"]["frames"] == FRAMES + FRAMES - 5
    # the report is the whole video's: both clips' steps, and each stage's programs of both clips
    assert record["denoise"]["steps"] == 4 and len(record["denoise"]["step_s"]) == 4
    programs = sum(stage["programs"] for stage in record["stages"].values())
    assert programs == sum(record["clips"]["programs_compiled"]) > 0
    args = ["generate", *common, "--prompt", "the fox sleeps", "--extend", str(first), "--overlap", "3"]
    assert (
        main([*args, "--frames_out", str(tmp_path / "three.npy"), "--output_video", str(tmp_path / "x.mp4")])
        == 0
    )
    longer = pipe.extend("the fox sleeps", read_frames(first, 16, 1 << 30), overlap=3, num_frames=FRAMES, height=HEIGHT,
                         width=WIDTH, num_inference_steps=2, negative_prompt="", progress=False)  # fmt: skip
    assert np.abs(np.load(tmp_path / "three.npy").astype(np.int16) - longer.frames).max() <= 1
    assert longer.frames.shape[1] == FRAMES + FRAMES - 5 + FRAMES - 3
