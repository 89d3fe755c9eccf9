"""The distilled models' own samplers: FastWan's DMD (FastVideo) and TurboWan's rCM (TurboDiffusion).

References are transcribed from the authors' code, float64 as they run it, and fed the draws of our
sampler (no torch generator's draws can be reproduced):

* FastVideo @ 2f3d4074 (hao-ai-lab/FastVideo): ``fastvideo/pipelines/stages/denoising.py`` L1255-1397
  (``DmdDenoisingStage``: ``FlowMatchEulerDiscreteScheduler(shift=8.0)``, the timesteps ``[1000, 757,
  522]`` of ``fastvideo/configs/pipelines/wan.py`` L116-124, ``pred_noise_to_pred_video`` then
  ``add_noise`` at the next timestep), ``fastvideo/models/utils.py`` L166-175 (the sigma: the table entry
  nearest the timestep), ``scheduling_flow_match_euler_discrete.py`` L141-149 (the table, diffusers').
* TurboDiffusion @ aaecff54 (thu-ml/TurboDiffusion): ``turbodiffusion/inference/wan2.1_t2v_infer.py``
  L113-139 (``mid_t = [1.5, 1.4, 1.0]``, ``sin / (cos + sin)``, the noise times ``t_steps[0]``, the
  timestep ``t * 1000`` in bfloat16, ``x = (1 - t_next) * (x - t_cur * v) + t_next * randn``);
  ``wan2.2_i2v_infer.py`` L47 (``sigma_max`` 200 for image to video).
"""

from __future__ import annotations

import itertools
import json
import math
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

import wanjax
from wanjax.errors import ConfigError
from wanjax.sampling.sampler import Sampler
from wanjax.sampling.scheduler import SchedulerConfig, make_scheduler


def fastvideo_dmd(latents, model, draws):
    """``DmdDenoisingStage``'s loop over ``[1000, 757, 522]``; ``model(x, t, i)`` gives the velocity.
    Returns the timesteps fed to the model and the final latents (float64)."""
    table = FlowMatchEulerDiscreteScheduler(shift=8.0)  # FastVideo builds the same 1000-entry table
    timesteps, sigmas = table.timesteps.double(), table.sigmas.double()
    steps = torch.tensor([1000, 757, 522], dtype=torch.long)

    def sigma(t):
        return sigmas[torch.argmin((timesteps - t).abs())]

    x, fed = torch.from_numpy(latents).double(), []
    for i, t in enumerate(steps):
        fed.append(float(t))
        x0 = x - sigma(t) * torch.as_tensor(model(x, float(t), i)).double()  # pred_noise_to_pred_video
        if i < len(steps) - 1:
            following = sigma(steps[i + 1])
            x = (1 - following) * x0 + following * torch.from_numpy(draws[i]).double()  # add_noise
        else:
            x = x0
    return fed, x.numpy()


def turbodiffusion_rcm(latents, model, draws, num_steps, sigma_max, ode=False):
    """TurboDiffusion's rCM loop; ``model(x, t, i)`` gives the velocity: (timesteps fed, final latents);
    ``ode``: its ``--ode`` update (``wan2.2_i2v_infer.py`` L202-210)."""
    mid_t = [1.5, 1.4, 1.0][: num_steps - 1]
    t_steps = torch.tensor([math.atan(sigma_max), *mid_t, 0], dtype=torch.float64)
    t_steps = torch.sin(t_steps) / (torch.cos(t_steps) + torch.sin(t_steps))
    x = torch.from_numpy(latents).to(torch.float64) * t_steps[0]
    fed = []
    for i, (t_cur, t_next) in enumerate(itertools.pairwise(t_steps)):
        fed.append(float((t_cur.float() * 1000).to(torch.bfloat16)))
        v = torch.as_tensor(model(x, fed[-1], i)).double()
        if ode:
            x = x - (t_cur - t_next) * v
        else:
            x = (1 - t_next) * (x - t_cur * v) + t_next * torch.from_numpy(draws[i]).double()
    return fed, x.numpy()


def run_ours(scheduler, latents, velocities):
    """Our sampler's steps on the given model outputs: (timesteps fed, final latents, its draws)."""
    state = scheduler.init_state(jnp.asarray(latents))
    fed = []
    for i in range(scheduler.num_inference_steps):
        fed.append(float(scheduler.model_timestep(i)))
        state, _ = scheduler.step(state, jnp.asarray(velocities[i]), i)
    return fed, np.asarray(state.sample)


def draws_of(scheduler, latents):
    """The re-noise draws our sampler makes at each step."""
    state = scheduler.init_state(jnp.asarray(latents))
    return [np.array(scheduler.noise(state, i)) for i in range(scheduler.num_inference_steps)]


def _inputs(steps: int):
    rng = np.random.default_rng(1)
    latents = rng.standard_normal((1, 16, 2, 4, 4)).astype(np.float32)
    return latents, [rng.standard_normal(latents.shape).astype(np.float32) for _ in range(steps)]


def test_dmd_steps_equal_fastvideos():
    latents, velocities = _inputs(3)
    ours = make_scheduler(SchedulerConfig(), 3, kind="dmd", seed=5)
    fed, result = run_ours(ours, latents, velocities)
    ref_fed, ref = fastvideo_dmd(latents, lambda x, t, i: velocities[i], draws_of(ours, latents))
    assert fed == ref_fed == [1000.0, 757.0, 522.0]
    np.testing.assert_allclose(ours.sigmas, [1.0, 0.75675672, 0.52173913, 0.0], rtol=1e-7)
    np.testing.assert_allclose(result, ref, rtol=1e-6, atol=1e-6)
    assert ours.config.flow_shift == 8.0  # the stage's table, whatever the checkpoint's shift


@pytest.mark.parametrize("steps", [1, 2, 3, 4])
@pytest.mark.parametrize("image", [False, True])
@pytest.mark.parametrize("kind", ["rcm", "rcm_ode"])
def test_rcm_steps_equal_turbodiffusions(steps, image, kind):
    latents, velocities = _inputs(steps)
    ours = make_scheduler(SchedulerConfig(), steps, kind=kind, seed=2, image=image)
    fed, result = run_ours(ours, latents, velocities)
    draws = draws_of(ours, latents)
    ref_fed, ref = turbodiffusion_rcm(
        latents, lambda x, t, i: velocities[i], draws, steps, 200.0 if image else 80.0, ode=kind == "rcm_ode"
    )
    assert fed == ref_fed
    if steps == 4 and not image:  # TurboWan2.1 T2V's four steps
        assert fed == [988.0, 932.0, 852.0, 608.0]
    np.testing.assert_allclose(result, ref, rtol=1e-6, atol=1e-6)


def test_few_step_refusals():
    """A step count a schedule lacks is refused with the counts it runs (the library names no flag:
    the command line names its own, tests/test_cli.py)."""
    with pytest.raises(ConfigError) as refused:
        make_scheduler(SchedulerConfig(), 4, kind="dmd")
    assert str(refused.value) == "the dmd sampler runs FastWan's 3 steps [1000, 757, 522], not 4"
    with pytest.raises(ConfigError) as refused:
        make_scheduler(SchedulerConfig(), 5, kind="rcm")
    assert str(refused.value) == "the rcm sampler runs 1 to 4 steps (TurboDiffusion's trained times), not 5"
    with pytest.raises(ConfigError, match="drop --flow_shift"):
        make_scheduler(SchedulerConfig(), 4, kind="rcm", flow_shift=5.0)


@pytest.mark.parametrize("kind, steps", [("dmd", 3), ("rcm", 4), ("rcm_ode", 4)])
def test_a_tiny_model_run_equals_the_authors_loop(tiny_transformer_dir, kind, steps):
    """3-step FastWan-style and 4-step TurboWan-style runs of a tiny DiT: our compiled sampler against
    the authors' loop around diffusers' transformer (float32), the same re-noise draws on both sides."""
    root, reference = tiny_transformer_dir
    gen = torch.Generator().manual_seed(3)
    latents = torch.randn((1, 16, 3, 6, 8), generator=gen)
    cond = torch.randn((1, 7, 32), generator=gen)
    scheduler = make_scheduler(SchedulerConfig(), steps, kind=kind, seed=11)
    draws = draws_of(scheduler, latents.numpy())

    def model(x, t, i):
        with torch.no_grad():
            return reference(x.float(), torch.tensor([t]), cond).sample

    if kind == "dmd":
        _, ref = fastvideo_dmd(latents.numpy(), model, draws)
    else:
        _, ref = turbodiffusion_rcm(latents.numpy(), model, draws, steps, 80.0, ode=kind == "rcm_ode")
    ours = wanjax.load_transformer(root, dtype="float32")
    result = Sampler(ours)(scheduler, jnp.asarray(latents.numpy()), jnp.asarray(cond.numpy()), None, 1.0)
    err = np.linalg.norm(np.asarray(result.latents) - ref) / np.linalg.norm(ref)
    assert err <= 1e-5, err


@pytest.mark.slow
def test_a_fastwan_checkpoint_runs_its_own_sampler(tiny_pipeline_dir, tmp_path):
    """A checkpoint whose model_index.json names FastVideo's WanDMDPipeline: 3 DMD steps without
    guidance when a run leaves them out, in Python and on the command line (its scheduler config,
    UniPC, is not what FastVideo runs)."""
    from wanjax.jobs.groups import SamplingFlags
    from wanjax.jobs.sampling import sampling_params

    root = tmp_path / "FastWan-tiny"
    shutil.copytree(tiny_pipeline_dir, root)
    index = json.loads((root / "model_index.json").read_text())
    (root / "model_index.json").write_text(json.dumps({**index, "_class_name": "WanDMDPipeline"}))
    fast = wanjax.WanPipeline.from_pretrained(root, dtype="float32", jax_cache_dir=False)
    plain = wanjax.WanPipeline.from_pretrained(tiny_pipeline_dir, dtype="float32", jax_cache_dir=False)
    assert (fast.defaults.scheduler, fast.defaults.num_inference_steps, fast.defaults.guidance_scale) == (
        "dmd",
        3,
        1.0,
    )
    params = sampling_params(fast, SamplingFlags())
    assert (params["scheduler"], params["num_inference_steps"], params["guidance_scale"]) == ("dmd", 3, 1.0)
    assert sampling_params(plain, SamplingFlags())["scheduler"] == "unipc"
    size = dict(height=48, width=64, num_frames=9, seed=3, progress=False)
    video = fast("a cat", **size)
    expected = plain("a cat", num_inference_steps=3, guidance_scale=1.0, scheduler="dmd", **size)
    assert video.denoised.step_times.steps == 3
    np.testing.assert_array_equal(np.asarray(video.latents), np.asarray(expected.latents))
    other = plain("a cat", num_inference_steps=3, guidance_scale=1.0, **size)  # UniPC: another video
    assert np.abs(np.asarray(other.latents) - np.asarray(expected.latents)).max() > 1e-2


@pytest.mark.slow
@pytest.mark.parametrize("kind, steps", [("dmd", 3), ("rcm", 4)])
def test_generate_runs_the_sampler_and_records_it(demo_env, tmp_path, kind, steps):
    """``wanjax generate --scheduler dmd|rcm`` on the demo model: the run and its record (rcm: no shift)."""
    from wanjax.cli.main import main

    out = tmp_path / f"{kind}.mp4"
    flags = ["--scheduler", kind, "--num_inference_steps", str(steps), "--guidance_scale", "1"]
    assert main(["generate", "--model", "demo", "--prompt", "a cat", *flags, "--output_video", str(out)]) == 0
    sampling = json.loads(out.with_suffix(".json").read_text())["sampling"]
    assert (sampling["scheduler"], sampling["num_inference_steps"]) == (kind, steps)
    assert sampling["flow_shift"] == {"dmd": 8.0, "rcm": 1.0}[kind]


def test_info_names_a_fastwan_variants_sampler(capsys):
    from wanjax.cli.main import main

    assert main(["info", "FastWan-1.3B"]) == 0
    out = capsys.readouterr().out
    assert "defaults: 832x448, 61 frames at 16 fps, 3 steps (dmd), guidance 1, seed 42" in out
    assert main(["info", "1.3B"]) == 0
    assert "50 steps, guidance 5" in capsys.readouterr().out  # the checkpoint's own scheduler
