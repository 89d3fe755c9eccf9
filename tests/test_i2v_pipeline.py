"""Image-to-video against diffusers' ``WanImageToVideoPipeline`` on tiny random pipelines saved with
``save_pretrained`` (CLIP image encoder and processor, I2V transformer, VAE; and a first-last-frame
variant): the same image(s), prompt and noise give diffusers' latents (float32) and frames, through
the Python API, ``generate --image`` and the three stages (which equal ``generate``).
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest
import torch
from helpers.compare import relative_error
from helpers.models import noise_file, randomize_
from helpers.pipelines import NEGATIVE, PROMPT, reference_run, save_tiny, tiny_components
from PIL import Image
from safetensors.numpy import load_file

from wanjax import WanPipeline
from wanjax.cli.main import main
from wanjax.errors import WanjaxError
from wanjax.pipeline import preparation, stages
from wanjax.pipeline.conditioning import condition_mask

HEIGHT, WIDTH, FRAMES, STEPS = 48, 64, 9, 3
CLIP_TOKENS = 5  # (28 / 14)^2 patches + the class token


def build_i2v(root, tokenizer_dir, **transformer):
    """A tiny WanImageToVideoPipeline saved under ``root``; diffusers' copy read back from it."""
    from diffusers import WanImageToVideoPipeline
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    vision = CLIPVisionConfig(
        hidden_size=20, intermediate_size=24, num_hidden_layers=3, num_attention_heads=4, image_size=28,
        patch_size=14, hidden_act="gelu",
    )  # fmt: skip
    components = tiny_components(
        tokenizer_dir, in_channels=36, out_channels=16, image_dim=20, added_kv_proj_dim=24, **transformer
    )
    pipe = WanImageToVideoPipeline(
        **components,
        image_encoder=randomize_(CLIPVisionModel(vision), seed=5, std=0.2).eval(),
        image_processor=CLIPImageProcessor(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28}),
    )
    save_tiny(pipe, root, tokenizer_dir)
    return WanImageToVideoPipeline.from_pretrained(root)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """Two images of other aspects than the video (resized by the pipeline), as PNG files."""
    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    paths = []
    for i, shape in enumerate(((37, 53, 3), (61, 45, 3))):
        paths.append(folder / f"image{i}.png")
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)).save(paths[-1])
    return paths


@pytest.fixture(scope="module")
def noise(tmp_path_factory):
    return noise_file(tmp_path_factory, (1, 16, 3, HEIGHT // 8, WIDTH // 8))


@pytest.fixture(scope="module")
def i2v(tmp_path_factory, tokenizer_dir, images, noise):
    root = tmp_path_factory.mktemp("wan_i2v")
    return root, build_i2v(root, tokenizer_dir), Image.open(images[0]).convert("RGB"), noise[0]


@pytest.fixture(scope="module")
def flf2v(tmp_path_factory, tokenizer_dir):
    """A first-last-frame pipeline: the image embedder's position embedding spans two images."""
    root = tmp_path_factory.mktemp("wan_flf2v")
    return root, build_i2v(root, tokenizer_dir, pos_embed_seq_len=2 * CLIP_TOKENS)


def diffusers_run(pipe, image, noise, last_image=None) -> tuple[np.ndarray, np.ndarray]:
    return reference_run(pipe, HEIGHT, WIDTH, FRAMES, STEPS, noise, image=image, last_image=last_image)


@pytest.mark.slow
def test_image_to_video_equals_diffusers(i2v):
    root, reference_pipe, image, noise = i2v
    latents_ref, frames_ref = diffusers_run(reference_pipe, image, noise)
    pipe = WanPipeline.from_pretrained(root, dtype="float32", jax_cache_dir=False)
    pos, neg = pipe.encode_prompt(PROMPT, NEGATIVE)
    conditioning = preparation.image_conditioning(pipe.components, image, 1, HEIGHT, WIDTH, FRAMES)
    latents = pipe.denoise(
        pos, neg, noise.numpy(), num_inference_steps=STEPS, progress=False, image=conditioning
    ).latents
    assert relative_error(latents, latents_ref) <= 1e-5
    frames = pipe(
        PROMPT,
        NEGATIVE,
        height=HEIGHT,
        width=WIDTH,
        num_frames=FRAMES,
        num_inference_steps=STEPS,
        latents=noise.numpy(),
        image=image,
        progress=False,
    ).frames
    assert np.abs(frames.astype(np.int16) - frames_ref).max() <= 2
    with pytest.raises(WanjaxError, match="needs an image"):
        pipe.denoise(pos, neg, noise.numpy(), num_inference_steps=STEPS, progress=False)


def test_the_mask_is_diffusers(i2v):
    """The 4 mask channels for a first frame, and for first and last frames, as prepare_latents builds them."""
    _, reference_pipe, _, _ = i2v
    for last in (False, True):
        ours = condition_mask(FRAMES, 4, (HEIGHT // 8, WIDTH // 8), last)
        image = torch.zeros((1, 3, HEIGHT, WIDTH))
        with torch.no_grad():
            _, condition = reference_pipe.prepare_latents(
                image, 1, 16, HEIGHT, WIDTH, FRAMES, torch.float32, "cpu", None, None, image if last else None
            )
        np.testing.assert_array_equal(ours, condition[:, :4].numpy())


def cli(*args) -> None:
    assert main(list(map(str, args))) == 0


VIDEO = ("--height", HEIGHT, "--width", WIDTH, "--frames", FRAMES)
SAMPLING = ("--num_inference_steps", STEPS, "--guidance_scale", 5.0)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["i2v", "flf2v"])
def test_generate_and_three_stages_equal_diffusers(variant, request, images, noise, tmp_path):
    """``encode --image [--last_image]`` / ``denoise`` / ``decode`` in float32 from diffusers' noise: its
    latents and frames; ``generate`` with the same flags: exactly the stages' frames."""
    from diffusers.utils import load_image

    root, reference_pipe = request.getfixturevalue(variant)[:2]
    image_flags = ("--image", images[0]) + (("--last_image", images[1]) if variant == "flf2v" else ())
    last = load_image(str(images[1])) if variant == "flf2v" else None
    latents_ref, frames_ref = diffusers_run(reference_pipe, load_image(str(images[0])), noise[0], last)
    text = ("--model", root, "--prompt", PROMPT, "--negative_prompt", NEGATIVE, "--dtype", "float32")
    d = tmp_path / "stages"
    cli("encode", *text, *image_flags, *VIDEO, "--output_dir", d)
    conditioning = load_file(d / stages.IMAGE_FILE)
    assert conditioning["image_embeds"].shape == (2 if last else 1, CLIP_TOKENS, 20)
    assert conditioning["condition_latents"].shape == (1, 20, 3, HEIGHT // 8, WIDTH // 8)
    cli("denoise", "--input_dir", d, "--init_latents", noise[1], *SAMPLING)
    cli("decode", "--input_dir", d, "--frames_out", d / "stages.npy")
    latents = load_file(d / stages.LATENTS_FILE)["latents"]
    assert relative_error(latents, latents_ref) <= 1e-4
    frames = np.load(d / "stages.npy")
    assert frames.shape == frames_ref.shape and frames_ref.std() > 20
    assert np.abs(frames.astype(np.int16) - frames_ref).max() <= 2

    out = tmp_path / "generate.npy"
    more = ("--init_latents", noise[1], "--frames_out", out, "--output_video", tmp_path / "g.mp4")
    cli("generate", *text, *image_flags, *VIDEO, *SAMPLING, *more)
    np.testing.assert_array_equal(np.load(out), frames)
    config = stages.read_config(d)
    assert config["image"] == str(images[0].resolve()) and config["height"] == HEIGHT


@pytest.mark.slow
def test_first_last_frame_through_python_equals_diffusers(flf2v, images, noise):
    root, reference_pipe = flf2v
    first, last = (Image.open(p).convert("RGB") for p in images)
    latents_ref, _ = diffusers_run(reference_pipe, first, noise[0], last)
    pipe = WanPipeline.from_pretrained(root, dtype="float32", jax_cache_dir=False)
    pos, neg = pipe.encode_prompt(PROMPT, NEGATIVE)
    conditioning = preparation.image_conditioning(
        pipe.components, first, 1, HEIGHT, WIDTH, FRAMES, last_image=last
    )
    latents = pipe.denoise(
        pos, neg, noise[0].numpy(), num_inference_steps=STEPS, progress=False, image=conditioning
    ).latents
    assert relative_error(latents, latents_ref) <= 1e-5
    with pytest.raises(WanjaxError, match="first-last-frame model"):
        preparation.image_conditioning(pipe.components, first, 1, HEIGHT, WIDTH, FRAMES)


def example_size(width: int, height: int, max_area: int, mod: int) -> tuple[int, int]:
    """diffusers' Wan image-to-video example, as written in its docs (height, width)."""
    aspect_ratio = height / width
    h = round(np.sqrt(max_area * aspect_ratio)) // mod * mod
    w = round(np.sqrt(max_area / aspect_ratio)) // mod * mod
    return h, w


def test_the_video_size_follows_the_image_as_diffusers_examples_compute_it(i2v):
    from wanjax.pipeline.conditioning import size_for_image

    pipe = WanPipeline.from_pretrained(i2v[0], dtype="float32", jax_cache_dir=False)
    for width, height in ((1024, 768), (768, 1024), (1280, 720), (53, 37), (3000, 2000), (512, 512)):
        for area in (480 * 832, 720 * 1280):
            expected = example_size(width, height, area, 16)
            assert size_for_image((width, height), area, 16) == expected
            image = Image.new("RGB", (width, height))
            assert preparation.video_size(pipe.components, image, max_area=area) == expected
    assert preparation.video_size(pipe.components, Image.new("RGB", (1000, 500)), height=480) == (
        480,
        960,
    )  # width from the aspect
    assert preparation.video_size(pipe.components, Image.new("RGB", (1000, 500)), width=320) == (160, 320)
    assert preparation.video_size(pipe.components, Image.new("RGB", (1000, 500)), 64, 64) == (64, 64)
    assert preparation.video_size(pipe.components, None) == (480, 832)
    with pytest.raises(WanjaxError, match="too narrow"):
        preparation.video_size(pipe.components, Image.new("RGB", (40000, 16)))
    with pytest.raises(WanjaxError, match="too small"):
        preparation.video_size(pipe.components, Image.new("RGB", (15, 200)))


@pytest.mark.parametrize("mode", ["RGBA", "LA", "P", "L", "I;16", "CMYK", "1"])
def test_image_modes_become_the_frame_diffusers_makes(mode, tmp_path):
    """A file in any Pillow mode: diffusers' ``load_image`` (RGB conversion as Pillow does it) then its
    ``VideoProcessor`` give our first frame."""
    from diffusers.utils import load_image
    from diffusers.video_processor import VideoProcessor

    from wanjax.pipeline.conditioning import video_frame

    rng = np.random.default_rng(1)
    rgba = Image.fromarray(rng.integers(0, 256, (40, 30, 4), dtype=np.uint8), "RGBA")
    image = rgba.convert("I;16") if mode == "I;16" else rgba.convert(mode)
    path = tmp_path / ("image.jpg" if mode == "CMYK" else "image.png")
    image.save(path)
    reference = VideoProcessor(vae_scale_factor=8).preprocess(load_image(str(path)), height=32, width=48)
    np.testing.assert_allclose(video_frame(path, 32, 48), reference[0].numpy(), atol=1e-6)


@pytest.mark.parametrize(
    "flags, message",
    [
        ((), "is an image-to-video model: give the first frame with --image"),
        (("--image", "missing.png"), "--image missing.png: no such image file"),
        (("--image", "garbage.png"), "--image garbage.png: cannot read image"),
        (("--image", "small.png"), "--image small.png of 12x40 is too small"),
        (("--image", "ok.png", "--last_image", "ok.png"), "takes a first frame only"),
        (("--last_image", "ok.png"), "--last_image needs --image"),
    ],
)
def test_bad_images_are_one_line_errors_and_nothing_is_written(
    i2v, flags, message, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    Path("garbage.png").write_bytes(b"not an image")
    Image.new("RGB", (12, 40)).save("small.png")
    Image.new("RGB", (40, 40)).save("ok.png")
    before = set(tmp_path.iterdir())
    code = main(["generate", "--model", str(i2v[0]), "--prompt", "a cat", *flags, "--output_video", "v.mp4"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert set(tmp_path.iterdir()) == before


@pytest.mark.slow
def test_a_text_to_video_model_refuses_an_image_and_its_stages_check_the_image_file(
    i2v, images, tiny_pipeline_dir, tmp_path, capsys
):
    args = ("--prompt", "a cat", "--image", str(images[0]))
    assert (
        main(
            ["generate", "--model", str(tiny_pipeline_dir), *args, "--output_video", str(tmp_path / "v.mp4")]
        )
        == 2
    )
    assert "is a text-to-video model: it takes no image" in capsys.readouterr().err
    d = tmp_path / "stages"
    cli("encode", "--model", i2v[0], "--prompt", "a cat", "--output_dir", d, "--image", images[0], *VIDEO)
    assert main(["denoise", "--input_dir", str(d), "--model", str(tiny_pipeline_dir)]) == 2
    assert "holds an image's conditioning but" in capsys.readouterr().err
    (d / stages.IMAGE_FILE).unlink()
    assert main(["denoise", "--input_dir", str(d)]) == 2
    assert "run `wanjax encode --image IMAGE" in capsys.readouterr().err


@pytest.mark.slow
def test_model_offload_moves_the_image_encoder_and_keeps_the_frames(i2v):
    """``offload="model"``: CLIP waits in host memory outside the encode stage (as the text encoder);
    the frames are those of the resident run."""
    from wanjax.models.offload import HOST, memory_kind

    root, _, image, noise = i2v
    kwargs = dict(latents=noise.numpy(), image=image, progress=False)
    resident = WanPipeline.from_pretrained(root, dtype="float32", jax_cache_dir=False)
    offloaded = WanPipeline.from_pretrained(root, dtype="float32", jax_cache_dir=False, offload="model")
    expected = resident(
        PROMPT, NEGATIVE, height=HEIGHT, width=WIDTH, num_frames=FRAMES, num_inference_steps=STEPS, **kwargs
    ).frames
    np.testing.assert_array_equal(
        offloaded(
            PROMPT,
            NEGATIVE,
            height=HEIGHT,
            width=WIDTH,
            num_frames=FRAMES,
            num_inference_steps=STEPS,
            **kwargs,
        ).frames,
        expected,
    )
    leaves = jax.tree.leaves(offloaded.image_encoder.params)
    assert {memory_kind(a) for a in leaves} == {HOST}
