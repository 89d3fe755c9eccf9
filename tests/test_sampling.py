"""The denoising loop (DiT + CFG + UniPC) equals the reference loop of diffusers' WanPipeline."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler

import wanjax
from wanjax.sampling.sampler import Sampler


def reference_loop(model, scheduler, latents, cond, uncond, guidance):
    """WanPipeline.__call__'s loop (section 4.3 of the spec): separate cond/uncond passes."""
    for t in scheduler.timesteps:
        timestep = t.expand(latents.shape[0])
        with torch.no_grad():
            noise = model(latents, timestep, cond).sample
            if guidance > 1:
                noise_uncond = model(latents, timestep, uncond).sample
                noise = noise_uncond + guidance * (noise - noise_uncond)
        latents = scheduler.step(noise, t, latents, return_dict=False)[0]
    return latents


@pytest.mark.parametrize(
    ("kind", "steps", "guidance"), [("unipc", 6, 5.0), ("unipc", 3, 1.0), ("euler", 4, 3.0)]
)
def test_denoise_matches_reference_loop(tmp_path, tiny_transformer_dir, kind, steps, guidance):
    root, model = tiny_transformer_dir
    if kind == "unipc":
        ref_sched = UniPCMultistepScheduler(
            prediction_type="flow_prediction", use_flow_sigmas=True, num_train_timesteps=1000, flow_shift=3.0
        )
    else:
        ref_sched = FlowMatchEulerDiscreteScheduler(shift=3.0)
    ref_sched.set_timesteps(steps)
    ref_sched.save_pretrained(tmp_path / "scheduler")
    gen = torch.Generator().manual_seed(7)
    latents = torch.randn((1, 16, 3, 6, 8), generator=gen)
    cond = torch.randn((1, 7, 32), generator=gen)
    uncond = torch.randn((1, 7, 32), generator=gen)
    ref = reference_loop(model, ref_sched, latents, cond, uncond, guidance).numpy()

    ours_model = wanjax.load_transformer(root, dtype="float32")
    scheduler = wanjax.make_scheduler(tmp_path, steps, kind="auto")
    result = Sampler(ours_model)(
        scheduler,
        jnp.asarray(latents.numpy()),
        jnp.asarray(cond.numpy()),
        jnp.asarray(uncond.numpy()),
        guidance,
    )
    assert len(result.step_times.steady) == steps - 1
    err = np.linalg.norm(np.asarray(result.latents) - ref) / np.linalg.norm(ref)
    assert err <= 1e-4
