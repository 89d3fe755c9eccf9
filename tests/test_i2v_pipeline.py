"""Image-to-video through the Python API against diffusers' ``WanImageToVideoPipeline`` on a tiny random
pipeline saved with ``save_pretrained`` (CLIP image encoder and processor, I2V transformer, VAE): the
same image, prompt and noise give diffusers' latents (float32) and, through diffusers' VAE, its frames.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import randomize_
from PIL import Image
from test_pipeline_parity import NEGATIVE, PROMPT, relative_error, save_tiny, tiny_components, to_uint8
from test_tokenizer import make_tokenizer_dir

from wanjax import WanPipeline
from wanjax.errors import WanjaxError
from wanjax.pipeline.conditioning import condition_mask

HEIGHT, WIDTH, FRAMES, STEPS = 48, 64, 9, 3


@pytest.fixture(scope="module")
def i2v(tmp_path_factory):
    from diffusers import WanImageToVideoPipeline
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    root = tmp_path_factory.mktemp("wan_i2v")
    tokenizer_dir = make_tokenizer_dir(tmp_path_factory.mktemp("tok") / "tokenizer")
    vision = CLIPVisionConfig(
        hidden_size=20, intermediate_size=24, num_hidden_layers=3, num_attention_heads=4, image_size=28,
        patch_size=14, hidden_act="gelu",
    )  # fmt: skip
    pipe = WanImageToVideoPipeline(
        **tiny_components(tokenizer_dir, in_channels=36, out_channels=16, image_dim=20, added_kv_proj_dim=24),
        image_encoder=randomize_(CLIPVisionModel(vision), seed=5, std=0.2).eval(),
        image_processor=CLIPImageProcessor(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28}),
    )
    save_tiny(pipe, root, tokenizer_dir)
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (37, 53, 3), dtype=np.uint8))  # another aspect, resized
    noise = torch.randn((1, 16, 3, HEIGHT // 8, WIDTH // 8), generator=torch.Generator().manual_seed(0))
    return root, WanImageToVideoPipeline.from_pretrained(root), image, noise


def diffusers_run(pipe, image, noise, last_image=None) -> tuple[np.ndarray, np.ndarray]:
    final = []
    with torch.no_grad():
        video = pipe(
            image=image,
            last_image=last_image,
            prompt=PROMPT,
            negative_prompt=NEGATIVE,
            height=HEIGHT,
            width=WIDTH,
            num_frames=FRAMES,
            num_inference_steps=STEPS,
            guidance_scale=5.0,
            latents=noise,
            output_type="np",
            callback_on_step_end=lambda p, i, t, kw: final.append(kw["latents"].clone()) or {},
        ).frames
    return final[-1].numpy(), to_uint8(video)


def test_image_to_video_equals_diffusers(i2v):
    root, reference_pipe, image, noise = i2v
    latents_ref, frames_ref = diffusers_run(reference_pipe, image, noise)
    pipe = WanPipeline.from_pretrained(root, dtype="float32", jax_cache_dir=False)
    pos, neg = pipe.encode_prompt(PROMPT, NEGATIVE)
    conditioning = pipe.prepare_image(image, 1, HEIGHT, WIDTH, FRAMES)
    latents = pipe.denoise(
        pos, neg, noise.numpy(), num_inference_steps=STEPS, progress=False, image=conditioning
    )
    assert relative_error(latents, latents_ref) <= 1e-5
    frames = pipe(
        PROMPT, NEGATIVE, HEIGHT, WIDTH, FRAMES, STEPS, latents=noise.numpy(), image=image, progress=False
    )
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
