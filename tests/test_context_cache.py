"""The text K/V cache (``sampling/context_cache.py``): every block's cross-attention keys and values of
the prompts computed once per run. A run with it equals the run without it bit for bit (the uncached
run is diffusers' in the parity tests): text to video guided and not, several videos one after
another, under a step cache and with two experts; image to video (the image tokens' keys and values
cached too); VACE (the control blocks' too); float32 and bfloat16. The step program no longer
projects the context."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wanjax.io.checkpoint import random_params
from wanjax.models import dit
from wanjax.models.registry import transformer_preset
from wanjax.models.settings import RunSettings
from wanjax.sampling.cache.step_cache import CacheConfig
from wanjax.sampling.guidance import ImageConditioning
from wanjax.sampling.sampler import Sampler
from wanjax.sampling.scheduler import SchedulerConfig, make_scheduler
from wanjax.tools.flops import matmul_flops

TINY = transformer_preset("tiny")
CONFIGS = {
    "t2v": TINY,
    "i2v": dataclasses.replace(TINY, in_channels=36, image_dim=16, added_kv_proj_dim=24),
    "vace": dataclasses.replace(TINY, vace_layers=(0, 1), vace_in_channels=96),
}
LATENTS, TEXT, STEPS = (2, 16, 2, 4, 4), 8, 3


def model(kind: str, dtype: str, seed: int = 0) -> dit.WanTransformer:
    cfg = CONFIGS[kind]
    return dit.WanTransformer(cfg, random_params(dit.checkpoint_spec(cfg), dtype, seed), RunSettings(dtype))


def inputs(kind: str) -> tuple[jax.Array, jax.Array, jax.Array, object]:
    """Noise, prompt and negative embeddings of two videos, and the kind's conditioning."""
    rng = np.random.default_rng(1)
    draw = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)  # noqa: E731
    b, _, t, h, w = LATENTS
    noise, cond, uncond = draw(*LATENTS), draw(b, TEXT, TINY.text_dim), draw(b, TEXT, TINY.text_dim)
    extra = None
    if kind == "i2v":
        extra = ImageConditioning(draw(b, 20, t, h, w), draw(b, 5, 16))
    if kind == "vace":
        extra = dit.VaceControl(draw(b, 96, t, h, w))
    return noise, cond, uncond, extra


def run(model_1, cached: bool, kind: str, guided: bool = True, cache=None, model_2=None) -> np.ndarray:
    noise, cond, uncond, extra = inputs(kind)
    sampler = Sampler(model_1, model_2, context_cache=cached)
    two = {} if model_2 is None else {"boundary_ratio": 0.9}
    out = sampler(
        make_scheduler(SchedulerConfig(), STEPS),
        noise,
        cond.astype(model_1.dtype),
        uncond.astype(model_1.dtype) if guided else None,
        5.0,
        cache=cache,
        image=extra,
        **two,
    )
    return np.asarray(out.latents)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kind", list(CONFIGS))
@pytest.mark.bit_for_bit
def test_the_cached_run_is_the_uncached_run_bit_for_bit(kind, dtype):
    m = model(kind, dtype)
    cached, uncached = run(m, True, kind), run(m, False, kind)
    assert np.isfinite(cached).all()
    np.testing.assert_array_equal(cached, uncached)


@pytest.mark.parametrize(
    "case",
    ["unguided", "firstblock", "taylorseer", "two-experts"],
)
def test_the_cache_with_one_branch_a_step_cache_and_two_experts(case):
    """Unguided (one row per video), under a step cache (the guided batch's rows, not one video at
    a time) and with two experts (each its own keys and values): equal bit for bit."""
    m = model("t2v", "bfloat16")
    kwargs = {
        "unguided": dict(guided=False),
        "firstblock": dict(cache=CacheConfig("firstblock", threshold=0.2)),
        "taylorseer": dict(cache=CacheConfig("taylorseer", options={"use_lite_mode": True})),
        "two-experts": dict(model_2=model("t2v", "bfloat16", seed=5)),
    }[case]
    np.testing.assert_array_equal(run(m, True, "t2v", **kwargs), run(m, False, "t2v", **kwargs))


def test_the_step_program_no_longer_projects_the_context():
    """The compiler's FLOP count of the step drops by at least the text embedder's two matmuls and
    one block's key and value projections, of one video's CFG pair (the videos run one after
    another and the blocks in a loop; XLA counts a loop's body once)."""
    m = model("t2v", "float32")
    noise, cond, uncond, _ = inputs("t2v")
    scheduler = make_scheduler(SchedulerConfig(), STEPS)
    flops = {
        cached: Sampler(m, context_cache=cached)
        .compile(scheduler, noise, cond, uncond)
        .cost_analysis()["flops"]
        for cached in (True, False)
    }
    rows, d = 2, TINY.inner_dim
    embedder = matmul_flops(rows * TEXT, TINY.text_dim, d) + matmul_flops(rows * TEXT, d, d)
    layer_kv = 2 * matmul_flops(rows * TEXT, d, d)
    assert flops[False] - flops[True] >= embedder + layer_kv


@pytest.mark.parametrize("mesh", ["dp=2,sp=2,tp=2", "dp=1,sp=4,tp=2"])
@pytest.mark.bit_for_bit
def test_the_cache_on_a_mesh(mesh):
    """On 8 devices (the rows over dp, the videos one after another when dp is 1; the heads over tp):
    the cached run equals the uncached one and the one-device run."""
    from wanjax.parallel.mesh import make_mesh, parse_mesh

    devices = make_mesh(parse_mesh(mesh))
    params = random_params(dit.checkpoint_spec(TINY), "float32", 0, dit.transformer_sharding(devices))
    sharded = dit.WanTransformer(TINY, params, RunSettings("float32", mesh=devices))
    cached, uncached = run(sharded, True, "t2v"), run(sharded, False, "t2v")
    np.testing.assert_array_equal(cached, uncached)
    alone = run(model("t2v", "float32"), True, "t2v")
    np.testing.assert_allclose(cached, alone, rtol=1e-5, atol=1e-5)
