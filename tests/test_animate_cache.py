"""Step caches on Wan 2.2 Animate against diffusers' ``WanAnimatePipeline`` with the cache enabled on
its transformer (0.42.1): TaylorSeer, the one diffusers runs there, on the tiny random pipeline of
``test_animate_pipeline`` over two segments; its hook is never reset between segments, so its steps
count on and the second segment's first steps extrapolate the first segment's factors. The policies
diffusers cannot hook on this model are refused in one line (checked: diffusers raises on them)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.compare import relative_error
from helpers.pipelines import NEGATIVE, PROMPT
from test_animate_pipeline import HEIGHT, SEGMENT, WIDTH, animate_setup, diffusers_run, our_run
from test_animate_transformer import ANIMATE

from wanjax import CacheConfig, WanPipeline
from wanjax.errors import ConfigError
from wanjax.models.registry import transformer_preset
from wanjax.sampling.cache import step_cache, taylorseer

STEPS = 3
# hook calls 0..5 over the two segments: C P C | P C P (a per-segment restart would be C P C | C P C)
TAYLOR = dict(
    use_lite_mode=True,
    taylor_factors_dtype="float32",
    cache_interval=2,
    disable_cache_before_step=1,
    max_order=2,
)


@pytest.fixture(scope="module")
def animate(tmp_path_factory, tokenizer_dir):
    return animate_setup(tmp_path_factory, tokenizer_dir)


@pytest.mark.slow
def test_taylorseer_on_animate_equals_diffusers(animate, monkeypatch):
    """Animate mode, guidance, two segments: diffusers' decisions per branch and step (both
    segments), its last latents (float32) and its frames."""
    from diffusers import TaylorSeerCacheConfig

    root, reference, inputs = animate
    videos = {k: v for k, v in inputs.items() if "background" not in k and "mask" not in k}
    pipe = WanPipeline.from_pretrained(root, dtype="float32", jax_cache_dir=False)
    frames_in_segment = SEGMENT + 4  # a latent frame more: the reference's
    first = pipe.prepare_latents(1, HEIGHT, WIDTH, frames_in_segment, seed=11)
    second = pipe.prepare_latents(1, HEIGHT, WIDTH, frames_in_segment, seed=11, segment=1)
    config = TaylorSeerCacheConfig(**{**TAYLOR, "taylor_factors_dtype": torch.float32})
    noises = (torch.from_numpy(np.array(first)), torch.from_numpy(np.array(second)))
    frames_ref, latents_ref, computed = diffusers_run(
        reference, inputs, "animate", *noises, monkeypatch, steps=STEPS, cache=config
    )
    out = our_run(pipe, videos, "animate", first, STEPS, cache=CacheConfig("taylorseer", options=TAYLOR))
    expected = [True, False, True, False, True, False]
    assert computed == {"cond": expected, "uncond": expected}
    assert out.denoised.cache_report.computed == computed
    error = relative_error(out.denoised.latents, latents_ref)
    levels = int(np.abs(out.frames.astype(np.int16) - frames_ref).max())
    print(f"taylorseer: last latents relative error {error:.2e}, frames within {levels} levels")
    assert error <= 1e-4
    assert levels <= 2


@pytest.mark.slow
def test_taylorseer_on_animate_on_a_mesh_equals_one_device(animate):
    """The carried state (factors sharded as the velocity) on dp=2,sp=2,tp=2: the one-device run."""
    root, _, inputs = animate
    videos = {k: v for k, v in inputs.items() if "background" not in k and "mask" not in k}
    kwargs = dict(
        height=HEIGHT, width=WIDTH, segment_frame_length=SEGMENT, num_inference_steps=STEPS, guidance_scale=5.0,
        seed=3, progress=False, cache=CacheConfig("taylorseer", options=TAYLOR), **videos,
    )  # fmt: skip
    runs = [
        WanPipeline.from_pretrained(root, dtype="float32", jax_cache_dir=False, mesh=mesh)(
            PROMPT, NEGATIVE, **kwargs
        )
        for mesh in (None, "dp=2,sp=2,tp=2")
    ]
    alone, sharded = runs
    assert sharded.denoised.cache_report.computed == alone.denoised.cache_report.computed
    assert alone.denoised.cache_report.computed["cond"] == [True, False, True, False, True, False]
    assert relative_error(sharded.denoised.latents, alone.denoised.latents) <= 1e-5
    assert int(np.abs(sharded.frames.astype(np.int16) - alone.frames).max()) <= 1


def test_a_continued_taylorseer_schedule_counts_on():
    """A run continuing ``calls_before`` hook calls takes the hook's decisions from there."""
    cfg = transformer_preset("Animate-14B")
    options = CacheConfig("taylorseer", options=TAYLOR)
    whole = taylorseer.schedule(2 * STEPS, taylorseer.settings(TAYLOR))
    for k in range(2):
        cache = step_cache.resolve(options, cfg, STEPS, guided=True, calls_before=k * STEPS)
        assert cache.schedule.tolist() == [[c, c] for c in whole[k * STEPS : (k + 1) * STEPS]]


@pytest.mark.parametrize("policy", ["magcache", "firstblock", "seacache", "teacache"])
def test_caches_diffusers_cannot_run_on_animate_are_one_line_errors(policy):
    cfg = transformer_preset("Animate-14B")
    with pytest.raises(ConfigError) as caught:
        step_cache.resolve(CacheConfig(policy), cfg, 20, guided=False)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{policy} does not run on an Animate model")
    assert "use --cache taylorseer or leave the cache off" in message


def test_diffusers_hooks_on_the_animate_transformer():
    """Why they are refused: diffusers' MagCache, First-Block Cache and SeaCache raise on its block
    class; its TaylorSeer hook goes on."""
    from diffusers import WanAnimateTransformer3DModel
    from diffusers.hooks import FirstBlockCacheConfig, MagCacheConfig, SeaCacheConfig, TaylorSeerCacheConfig

    refused = [
        MagCacheConfig(mag_ratios=[1.0] * 4, num_inference_steps=4),
        FirstBlockCacheConfig(),
        SeaCacheConfig(),
    ]
    for config in refused:
        model = WanAnimateTransformer3DModel(**{**ANIMATE, "text_dim": 24})
        with pytest.raises(
            ValueError, match=r"transformer_wan_animate\.WanTransformerBlock.> not registered"
        ):
            model.enable_cache(config)
    model = WanAnimateTransformer3DModel(**{**ANIMATE, "text_dim": 24})
    model.enable_cache(TaylorSeerCacheConfig(use_lite_mode=True))
    assert model.proj_out._diffusers_hook.get_hook("taylorseer_cache") is not None
