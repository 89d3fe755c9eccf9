"""The VAE parity configs, seeded noise, and diffusers' pipeline-style decode."""

from __future__ import annotations

import numpy as np
import torch
from diffusers import AutoencoderKLWan

CONFIGS = {
    # temporal downsampling at non-default levels, z_dim 4 with custom latent statistics
    "small": dict(
        base_dim=8,
        z_dim=4,
        dim_mult=[1, 2, 2, 2],
        num_res_blocks=1,
        temperal_downsample=[True, False, True],
        latents_mean=[0.1, -0.2, 0.3, 0.5],
        latents_std=[2.0, 0.5, 1.5, 1.1],
    ),
    # the real architecture's shape (z_dim 16, dim_mult 1,2,4,4, two res blocks), narrow, with a
    # decoder wider than the encoder
    "wan_like": dict(
        base_dim=8,
        decoder_base_dim=12,
        z_dim=16,
        dim_mult=[1, 2, 4, 4],
        num_res_blocks=2,
        temperal_downsample=[False, True, True],
    ),
}


LATENT_HW = (3, 5)  # 24 x 40 frames: non-square, odd latent sizes


def randn(shape, seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def assert_not_saturated(video: np.ndarray) -> None:
    """The reference output must mostly lie inside (-1, 1), or a clamp could hide any difference."""
    assert np.mean(np.abs(video) < 0.999) > 0.9


def pipeline_frames(model: AutoencoderKLWan, normalized: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """diffusers' decoded video of normalised latents and its uint8 frames, as WanPipeline's
    denormalisation, VideoProcessor and PIL make them: ``(video, frames)``."""
    cfg = model.config
    mean = torch.tensor(cfg.latents_mean).view(1, cfg.z_dim, 1, 1, 1)
    inv_std = 1.0 / torch.tensor(cfg.latents_std).view(1, cfg.z_dim, 1, 1, 1)
    with torch.no_grad():
        video = model.decode(normalized / inv_std + mean).sample
    frames = (video * 0.5 + 0.5).clamp(0, 1).permute(0, 2, 3, 4, 1).numpy()
    return video.numpy(), (frames * 255).round().astype(np.uint8)
