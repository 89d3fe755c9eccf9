"""Wan 2.2 TI2V-5B-style pipelines against diffusers, on a tiny random pipeline saved with
``save_pretrained``: the Wan 2.2 VAE (48-channel-style latents, 16x16 pixels per latent: 2x2 patches
and residual blocks) and ``expand_timesteps``. Text to video (``WanPipeline``), and with an image
(``WanImageToVideoPipeline`` on the same components): the image's latents stand in for the first
latent frame, whose tokens run at timestep 0, and are re-imposed at the end. Same noise -> diffusers'
latents and frames; ``generate`` and the three stages give the same frames.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.compare import relative_error, to_uint8
from helpers.models import noise_file, randomize_
from helpers.pipelines import NEGATIVE, PROMPT, save_tiny, tiny_components
from PIL import Image
from safetensors.numpy import load_file

from wanjax import WanPipeline
from wanjax.cli.main import main
from wanjax.errors import WanjaxError
from wanjax.pipeline import preparation, stages

HEIGHT, WIDTH, FRAMES, STEPS, Z = 64, 96, 9, 3, 12
VAE22 = dict(
    base_dim=8,
    decoder_base_dim=12,
    z_dim=Z,
    dim_mult=[1, 2, 4, 4],
    num_res_blocks=1,
    temperal_downsample=[False, True, True],
    latents_mean=[0.05 * i - 0.3 for i in range(Z)],
    latents_std=[0.5 + 0.1 * i for i in range(Z)],
    is_residual=True,
    patch_size=2,
    in_channels=12,
    out_channels=12,
    scale_factor_spatial=16,
)


@pytest.fixture(scope="module")
def ti2v(tmp_path_factory, tokenizer_dir):
    """The saved pipeline (a ``WanPipeline`` with ``expand_timesteps``), diffusers' copy read back, and
    an image-to-video pipeline on the same components."""
    from diffusers import AutoencoderKLWan, WanImageToVideoPipeline
    from diffusers import WanPipeline as ReferencePipeline

    root = tmp_path_factory.mktemp("ti2v")
    components = tiny_components(tokenizer_dir, in_channels=Z, out_channels=Z)
    components["vae"] = randomize_(AutoencoderKLWan(**VAE22), seed=3, std=0.2).eval()
    save_tiny(ReferencePipeline(**components, expand_timesteps=True), root, tokenizer_dir)
    reference = ReferencePipeline.from_pretrained(root)
    parts = {
        k: getattr(reference, k) for k in ("tokenizer", "text_encoder", "transformer", "vae", "scheduler")
    }
    return root, reference, WanImageToVideoPipeline(**parts, expand_timesteps=True)


@pytest.fixture(scope="module")
def noise(tmp_path_factory):
    return noise_file(tmp_path_factory, (1, Z, 3, HEIGHT // 16, WIDTH // 16))


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    path = tmp_path_factory.mktemp("image") / "image.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (41, 59, 3), dtype=np.uint8)).save(path)
    return path


def diffusers_run(pipe, noise, **kwargs) -> tuple[np.ndarray, np.ndarray]:
    """diffusers' final latents (after the first frame's re-imposition) and uint8 frames."""
    args = dict(
        prompt=PROMPT,
        negative_prompt=NEGATIVE,
        height=HEIGHT,
        width=WIDTH,
        num_frames=FRAMES,
        num_inference_steps=STEPS,
        guidance_scale=5.0,
        latents=noise,
        **kwargs,
    )
    with torch.no_grad():
        latents = pipe(**args, output_type="latent").frames
        video = pipe(**args, output_type="np").frames
    return latents.numpy(), to_uint8(video)


@pytest.mark.slow
@pytest.mark.parametrize("with_image", [False, True], ids=["t2v", "i2v"])
def test_text_and_image_to_video_equal_diffusers(ti2v, noise, image, with_image):
    root, reference, reference_i2v = ti2v
    picture = Image.open(image).convert("RGB")
    if with_image:
        latents_ref, frames_ref = diffusers_run(reference_i2v, noise[0], image=picture)
    else:
        latents_ref, frames_ref = diffusers_run(reference, noise[0])
    pipe = WanPipeline.from_pretrained(root, dtype="float32", jax_cache_dir=False)
    assert (
        pipe.components.expand_timesteps
        and pipe.components.geometry.spatial == 16
        and pipe.components.geometry.z_dim == Z
    )
    pos, neg = pipe.encode_prompt(PROMPT, NEGATIVE)
    conditioning = (
        preparation.image_conditioning(pipe.components, picture, 1, HEIGHT, WIDTH, FRAMES)
        if with_image
        else None
    )
    if with_image:
        assert conditioning.first_frame and conditioning.latents.shape == (1, Z, 1, HEIGHT // 16, WIDTH // 16)
    latents = pipe.denoise(
        pos, neg, noise[0].numpy(), num_inference_steps=STEPS, progress=False, image=conditioning
    ).latents
    assert relative_error(latents, latents_ref) <= 1e-5
    if with_image:  # the first latent frame is the image's, exactly as diffusers re-imposes it
        np.testing.assert_allclose(np.asarray(latents)[:, :, 0], latents_ref[:, :, 0], rtol=1e-5, atol=1e-6)
    frames = pipe.decode(latents)
    assert frames.shape == frames_ref.shape and frames_ref.std() > 20
    assert np.abs(frames.astype(np.int16) - frames_ref).max() <= 2


@pytest.mark.slow
def test_generate_and_three_stages_with_an_image(ti2v, noise, image, tmp_path):
    """``generate --image`` (float32, diffusers' noise) gives diffusers' frames, the three stages
    exactly ``generate``'s; a last image is refused (TI2V takes a first frame only)."""
    root, _, reference_i2v = ti2v
    _, frames_ref = diffusers_run(reference_i2v, noise[0], image=Image.open(image).convert("RGB"))
    text = ("--model", str(root), "--prompt", PROMPT, "--negative_prompt", NEGATIVE, "--dtype", "float32")
    video = ("--height", HEIGHT, "--width", WIDTH, "--frames", FRAMES, "--image", str(image))
    sampling = ("--num_inference_steps", STEPS, "--guidance_scale", 5.0, "--init_latents", str(noise[1]))

    def cli(*args) -> None:
        assert main(list(map(str, args))) == 0

    out = ("--output_video", tmp_path / "g.mp4", "--frames_out", tmp_path / "g.npy")
    cli("generate", *text, *video, *sampling, *out)
    generated = np.load(tmp_path / "g.npy")
    assert np.abs(generated.astype(np.int16) - frames_ref).max() <= 2
    d = tmp_path / "stages"
    cli("encode", *text, *video, "--output_dir", d)
    assert load_file(d / stages.IMAGE_FILE)["condition_latents"].shape == (1, Z, 1, HEIGHT // 16, WIDTH // 16)
    cli("denoise", "--input_dir", d, *sampling)
    cli("decode", "--input_dir", d, "--frames_out", d / "s.npy")
    np.testing.assert_array_equal(np.load(d / "s.npy"), generated)
    pipe = WanPipeline.from_pretrained(root, dtype="float32", jax_cache_dir=False)
    with pytest.raises(WanjaxError, match="takes a first frame only"):
        preparation.image_conditioning(pipe.components, image, 1, HEIGHT, WIDTH, FRAMES, last_image=image)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["firstblock", "magcache"])
def test_step_cache_with_the_image_as_first_frame_equals_diffusers(ti2v, noise, image, policy):
    """Step caching on TI2V with an image (its tokens at timestep 0 in every step): diffusers'
    decisions per branch and its latents, for First-Block Cache and for MagCache on a given curve."""
    from diffusers.hooks import FirstBlockCacheConfig, MagCacheConfig
    from helpers.pipelines import branch_decisions

    from wanjax.sampling.cache.step_cache import CacheConfig

    root, _, reference_i2v = ti2v
    picture = Image.open(image).convert("RGB")
    if policy == "firstblock":
        config, ours = FirstBlockCacheConfig(threshold=0.3), CacheConfig("firstblock", threshold=0.3)
        expected = [True, False, True]
    else:
        mag = dict(mag_ratios=[1.0, 0.99, 0.99], threshold=0.05, max_skip_steps=2, retention_ratio=0.0)
        config, ours = MagCacheConfig(num_inference_steps=STEPS, **mag), CacheConfig("magcache", **mag)
        expected = [True, False, False]
    decisions = []

    def on_step(p, i, t, kwargs):
        decisions.append(branch_decisions(p.transformer, policy))
        return {}

    reference_i2v.transformer.enable_cache(config)
    try:
        latents_ref, _ = diffusers_run(reference_i2v, noise[0], image=picture, callback_on_step_end=on_step)
    finally:
        reference_i2v.transformer.disable_cache()
    decisions = decisions[:STEPS]  # diffusers_run's first call (its latents); the second decodes
    computed_ref = {name: [d[name] for d in decisions] for name in ("cond", "uncond")}
    assert computed_ref == {"cond": expected, "uncond": expected}

    pipe = WanPipeline.from_pretrained(root, dtype="float32", jax_cache_dir=False)
    pos, neg = pipe.encode_prompt(PROMPT, NEGATIVE)
    conditioning = preparation.image_conditioning(pipe.components, picture, 1, HEIGHT, WIDTH, FRAMES)
    denoised = pipe.denoise(
        pos, neg, noise[0].numpy(), num_inference_steps=STEPS, progress=False, image=conditioning, cache=ours
    )
    latents = denoised.latents
    assert denoised.cache_report.computed == computed_ref
    assert relative_error(latents, latents_ref) <= 1e-5


def test_magcache_on_ti2v_5b_defaults_to_its_published_curves():
    """TI2V-5B's MagCache curve follows the run, as the MagCache authors pick it: with an image as the
    first frame its i2v curve, else its t2v one (each at its published settings)."""
    from wanjax.models.registry import transformer_preset
    from wanjax.sampling.cache import step_cache

    five = transformer_preset("5B")
    assert step_cache.preset_for(five) == "wan2.2-ti2v-5b-t2v"
    assert step_cache.preset_for(five, first_frame=True) == "wan2.2-ti2v-5b-i2v"
    for first_frame, name in ((False, "wan2.2-ti2v-5b-t2v"), (True, "wan2.2-ti2v-5b-i2v")):
        cache = step_cache.resolve(
            step_cache.CacheConfig("magcache"), five, 50, True, first_frame=first_frame
        )
        assert cache.source.startswith(f"preset {name}")
        assert (cache.threshold, cache.max_skip_steps, cache.retention_ratio) == (0.06, 2, 0.2)
