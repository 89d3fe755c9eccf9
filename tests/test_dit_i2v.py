"""The image-to-video transformer (Wan 2.1 I2V: image tokens in every cross-attention, 36 input
channels; FLF2V: a position table over the first and last images' tokens) against diffusers'
``WanTransformer3DModel`` on the same random weights, float32."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.models import TINY_DIT, save_transformer

from wanjax import load_transformer
from wanjax.errors import ConfigError

I2V = dict(TINY_DIT, in_channels=36, image_dim=20, added_kv_proj_dim=24)  # inner dim 24 = 2 heads x 12
FLF2V = dict(I2V, pos_embed_seq_len=14)  # two images of 7 tokens


def relative_error(ours, ref) -> float:
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))


@pytest.mark.parametrize("config,images", [(I2V, 1), (FLF2V, 2)], ids=["i2v", "flf2v"])
def test_image_to_video_transformer_equals_diffusers(tmp_path, config, images):
    torch_model = save_transformer(tmp_path, seed=4, **config)
    ours = load_transformer(tmp_path, "float32")
    assert ours.cfg.image_to_video and "image_embedder" in ours.params
    gen = torch.Generator().manual_seed(0)
    latents = torch.randn((2, 36, 2, 8, 8), generator=gen)
    text = torch.randn((2, 512, TINY_DIT["text_dim"]), generator=gen)  # diffusers splits at 512 text tokens
    image = torch.randn((2 * images, 7, 20), generator=gen)
    timestep = torch.tensor([500.0, 120.0])
    with torch.no_grad():
        ref = torch_model(latents, timestep, text, encoder_hidden_states_image=image, return_dict=False)[0]
    got = ours(latents.numpy(), timestep.numpy(), text.numpy(), image.numpy())
    assert relative_error(got, ref.numpy()) <= 1e-5
    # the image tokens matter: other images give another velocity
    other = ours(latents.numpy(), timestep.numpy(), text.numpy(), image.numpy()[::-1].copy())
    assert relative_error(other, ref.numpy()) > 1e-3


def test_an_image_to_video_transformer_needs_image_embeds(tmp_path):
    save_transformer(tmp_path, seed=4, **I2V)
    model = load_transformer(tmp_path, "float32")
    with pytest.raises(ConfigError, match="needs image_embeds"):
        model(
            np.zeros((1, 36, 1, 4, 4), np.float32), 500.0, np.zeros((1, 8, TINY_DIT["text_dim"]), np.float32)
        )


def test_an_image_to_video_model_without_its_image_encoder_is_refused_before_any_weight(
    tiny_pipeline_dir, tmp_path, capsys
):
    import shutil

    from PIL import Image

    from wanjax.cli.main import main

    root = tmp_path / "i2v"
    shutil.copytree(tiny_pipeline_dir, root)
    shutil.rmtree(root / "transformer")
    save_transformer(root, seed=1, **dict(I2V, text_dim=24))  # the tiny pipeline's text width
    image = tmp_path / "image.png"
    Image.new("RGB", (64, 48)).save(image)
    out = tmp_path / "never.mp4"
    args = ["generate", "--model", str(root), "--prompt", "a cat", "--image", str(image)]
    assert main([*args, "--output_video", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "model lacks its image_encoder/ component folder" in err, err
    assert not out.exists()


def test_sampler_with_image_conditioning_equals_a_diffusers_loop(tmp_path):
    """The denoising loop of diffusers' WanImageToVideoPipeline (its transformer on [latents;
    condition] with the image states, CFG, UniPC), written out: the Sampler with ImageConditioning."""
    from diffusers import UniPCMultistepScheduler

    from wanjax.sampling.guidance import ImageConditioning
    from wanjax.sampling.sampler import Sampler
    from wanjax.sampling.scheduler import SchedulerConfig, make_scheduler

    torch_model = save_transformer(tmp_path, seed=4, **I2V)
    ours = load_transformer(tmp_path, "float32")
    gen = torch.Generator().manual_seed(3)
    noise = torch.randn((1, 16, 2, 8, 8), generator=gen)
    condition = torch.randn((1, 20, 2, 8, 8), generator=gen)
    image = torch.randn((1, 7, 20), generator=gen)
    text, negative = (torch.randn((1, 512, TINY_DIT["text_dim"]), generator=gen) for _ in range(2))
    steps, guidance = 4, 5.0
    reference = UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0
    )
    reference.set_timesteps(steps)
    latents = noise.clone()
    with torch.no_grad():
        for t in reference.timesteps:
            x = torch.cat([latents, condition], dim=1)
            timestep = t.expand(1)
            cond = torch_model(x, timestep, text, encoder_hidden_states_image=image, return_dict=False)[0]
            uncond = torch_model(x, timestep, negative, encoder_hidden_states_image=image, return_dict=False)[
                0
            ]
            velocity = uncond + guidance * (cond - uncond)
            latents = reference.step(velocity, t, latents, return_dict=False)[0]
    scheduler = make_scheduler(SchedulerConfig(flow_shift=3.0), steps)
    conditioning = ImageConditioning(condition.numpy(), image.numpy())
    got = Sampler(ours)(
        scheduler, noise.numpy(), text.numpy(), negative.numpy(), guidance, image=conditioning
    ).latents
    assert relative_error(got, latents.numpy()) <= 1e-5
