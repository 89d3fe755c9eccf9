"""Step caching against diffusers' hooks: MagCache and First-Block Cache on a tiny random WanPipeline.

diffusers runs with ``transformer.enable_cache(MagCacheConfig(...) | FirstBlockCacheConfig(...))``;
its per-branch decisions are read from the hooks' state after every step. wanjax must skip the same
steps in each branch, give the same final latents (float32, 1e-5 relative) and, through diffusers'
VAE, the same frames within 1 uint8 level. Every expected value comes from diffusers.
"""

from __future__ import annotations

import itertools
import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from helpers.compare import relative_error, to_uint8
from helpers.pipelines import NEGATIVE, PROMPT, branch_decisions, reference_run

from wanjax import WanPipeline
from wanjax.errors import ConfigError
from wanjax.models.registry import transformer_preset
from wanjax.sampling.cache import seacache, step_cache, taylorseer, teacache
from wanjax.sampling.cache.step_cache import CacheConfig, mag_schedule, nearest_interp, read_mag_ratios

HEIGHT, WIDTH, FRAMES, STEPS, GUIDANCE = 48, 64, 9, 12, 5.0
# a decaying magnitude curve of 25 points (resampled to the 12 steps), and one of exactly 12
CURVE_25 = [1.0, 1.0, *np.round(1.0 - 0.004 * np.arange(1, 24) ** 1.3, 5).tolist()]
CURVE_12 = [1.0, 1.0, 0.99, 0.985, 0.98, 0.97, 0.95, 0.93, 0.9, 0.86, 0.8, 0.7]


@pytest.fixture(scope="module")
def model_dir(tiny_pipeline_dir):
    from diffusers import WanPipeline as DiffusersPipeline

    return tiny_pipeline_dir, DiffusersPipeline.from_pretrained(tiny_pipeline_dir)


@pytest.fixture(scope="module")
def noise():
    shape = (1, 16, (FRAMES - 1) // 4 + 1, HEIGHT // 8, WIDTH // 8)
    return torch.randn(shape, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def ours(model_dir):
    """wanjax's pipeline on the same checkpoint (float32) and its prompt embeddings."""
    pipe = WanPipeline.from_pretrained(model_dir[0], dtype="float32", jax_cache_dir=False)
    return pipe, pipe.encode_prompt(PROMPT, NEGATIVE)


def diffusers_run(pipe, noise, config, prompts=(PROMPT,)) -> dict:
    """diffusers with ``config`` enabled: per-branch decisions, final latents, frames, calibration."""
    from diffusers.hooks import mag_cache

    decisions: list[dict[str, bool]] = []
    calibration: dict[str, list[float]] = {"cond": [], "uncond": []}
    from diffusers import SeaCacheConfig

    policy = "magcache" if isinstance(config, mag_cache.MagCacheConfig) else "firstblock"
    policy = "seacache" if isinstance(config, SeaCacheConfig) else policy

    def on_step(p, i, t, kwargs):
        decisions.append(branch_decisions(p.transformer, policy))
        return {}

    record = mag_cache.MagCacheBlockHook._perform_calibration_step

    def calibrate(self, state, residual):
        record(self, state, residual)
        calibration[self.state_manager._context.name].append(state.calibration_ratios[-1])

    pipe.transformer.enable_cache(config)
    try:
        mag_cache.MagCacheBlockHook._perform_calibration_step = calibrate
        latents, frames = run_diffusers(pipe, noise, prompts, on_step)
    finally:
        mag_cache.MagCacheBlockHook._perform_calibration_step = record
        pipe.transformer.disable_cache()
    computed = {name: [d[name] for d in decisions] for name in ("cond", "uncond")}
    return {"computed": computed, "latents": latents, "frames": frames, "ratios": calibration}


def run_diffusers(pipe, noise, prompts=(PROMPT,), on_step=None) -> tuple[np.ndarray, np.ndarray]:
    """diffusers' pipeline at this module's shape: its final latents and uint8 frames."""
    return reference_run(pipe, HEIGHT, WIDTH, FRAMES, STEPS, noise, on_step, prompts, guidance_scale=GUIDANCE)


def decode_in_diffusers(pipe, latents: np.ndarray) -> np.ndarray:
    """Normalised latents through diffusers' VAE, de-normalised as its WanPipeline does."""
    cfg = pipe.vae.config
    mean = torch.tensor(cfg.latents_mean).view(1, cfg.z_dim, 1, 1, 1)
    std = torch.tensor(cfg.latents_std).view(1, cfg.z_dim, 1, 1, 1)
    with torch.no_grad():
        video = pipe.vae.decode(torch.from_numpy(np.array(latents)) * std + mean, return_dict=False)[0]
    return to_uint8(pipe.video_processor.postprocess_video(video, output_type="np"))


def our_run(ours, noise, cache: CacheConfig, prompts=(PROMPT,)) -> tuple[np.ndarray, dict]:
    pipe, (pos, neg) = ours
    if prompts != (PROMPT,):
        pos, neg = pipe.encode_prompt(list(prompts), [NEGATIVE] * len(prompts))
    run = pipe.denoise(
        pos,
        neg,
        noise.numpy(),
        num_inference_steps=STEPS,
        guidance_scale=GUIDANCE,
        progress=False,
        cache=cache,
    )
    return np.asarray(run.latents), run.cache_report


def check_equal(
    model_dir, noise, ours, reference_config, cache: CacheConfig, min_skipped: int, prompts=(PROMPT,)
) -> dict:
    ref = diffusers_run(model_dir[1], noise, reference_config, prompts)
    latents, report = our_run(ours, noise, cache, prompts)
    assert report.computed == ref["computed"]
    skipped = sum(not c for flags in ref["computed"].values() for c in flags)
    assert skipped >= min_skipped, ref["computed"]  # the case exercises skipping
    assert relative_error(latents, ref["latents"]) <= 1e-5
    frames = decode_in_diffusers(model_dir[1], latents)
    assert np.abs(frames.astype(np.int16) - ref["frames"]).max() <= 1
    return ref


@pytest.mark.parametrize(
    "curve", [CURVE_12, pytest.param(CURVE_25, marks=pytest.mark.slow)], ids=["12", "25-resampled"]
)
def test_magcache_equals_diffusers(model_dir, noise, ours, curve):
    from diffusers.hooks import MagCacheConfig

    settings = dict(threshold=0.06, max_skip_steps=2, retention_ratio=0.2)
    reference = MagCacheConfig(**settings, num_inference_steps=STEPS, mag_ratios=curve)
    check_equal(model_dir, noise, ours, reference, CacheConfig("magcache", **settings, mag_ratios=curve), 4)


@pytest.mark.slow
@pytest.mark.parametrize(
    "threshold,min_skipped",
    # 0.4361 lies between the two branches' first change (cond 0.43572, uncond 0.43659): the branches
    # decide differently at steps 1 and 2 (one computes, the other reuses its cache)
    [(0.35, 6), (0.4361, 12)],
)
def test_first_block_cache_equals_diffusers(model_dir, noise, ours, threshold, min_skipped):
    from diffusers.hooks import FirstBlockCacheConfig

    ref = check_equal(
        model_dir,
        noise,
        ours,
        FirstBlockCacheConfig(threshold=threshold),
        CacheConfig("firstblock", threshold=threshold),
        min_skipped,
    )
    if threshold == 0.4361:
        assert ref["computed"]["cond"][1:3] == [False, False] and ref["computed"]["uncond"][1:3] == [
            True,
            True,
        ]


@pytest.mark.slow
def test_a_batch_makes_one_decision_per_branch_as_diffusers(model_dir, ours):
    """Two prompts: each branch decides once for both rows (the change is measured over the batch)."""
    from diffusers.hooks import FirstBlockCacheConfig

    shape = (2, 16, (FRAMES - 1) // 4 + 1, HEIGHT // 8, WIDTH // 8)
    noise = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    prompts = (PROMPT, "a dog")
    config = CacheConfig("firstblock", threshold=0.35)
    check_equal(model_dir, noise, ours, FirstBlockCacheConfig(threshold=0.35), config, 6, prompts)


@pytest.mark.slow
def test_calibration_equals_diffusers(model_dir, noise, ours):
    from diffusers.hooks import MagCacheConfig

    ref = diffusers_run(model_dir[1], noise, MagCacheConfig(calibrate=True, num_inference_steps=STEPS))
    _, report = our_run(ours, noise, CacheConfig("magcache", calibrate=True))
    assert all(all(flags) for flags in report.computed.values())
    for branch in ("cond", "uncond"):
        assert (
            len(ref["ratios"][branch]) == STEPS
            and ref["ratios"][branch][0] == report.ratios[branch][0] == 1.0
        )
        np.testing.assert_allclose(report.ratios[branch], ref["ratios"][branch], rtol=1e-5)


def test_off_is_the_uncached_program(ours, noise):
    pipe, (pos, neg) = ours
    run = dict(num_inference_steps=3, guidance_scale=GUIDANCE, progress=False)
    plain = np.asarray(pipe.denoise(pos, neg, noise.numpy(), **run).latents)
    programs = pipe._sampler.programs()
    off = pipe.denoise(pos, neg, noise.numpy(), **run, cache=CacheConfig("off"))
    np.testing.assert_array_equal(np.asarray(off.latents), plain)
    assert pipe._sampler.programs() == programs and off.cache_report is None


def test_unguided_runs_one_branch(ours, noise):
    pipe, (pos, _) = ours
    cache = CacheConfig("magcache", mag_ratios=CURVE_12, threshold=0.06, max_skip_steps=2)
    report = pipe.denoise(
        pos, None, noise.numpy(), num_inference_steps=STEPS, guidance_scale=1.0, progress=False, cache=cache
    ).cache_report
    assert list(report.computed) == ["cond"]
    assert report.computed["cond"] == mag_schedule(CURVE_12, STEPS, 0.06, 2, 0.2).tolist()


# ----------------------------------------------------------------------------------------------
# TeaCache against its authors' code (tests/helpers/teacache_reference.py) around diffusers' blocks


def teacache_reference(model_dir, noise, coefficients, thresh: float, ret_steps: bool):
    """diffusers' pipeline under the authors' TeaCache: decisions, latents, frames, distances."""
    from helpers.teacache_reference import install

    tea, uninstall = install(model_dir[1].transformer, coefficients, thresh, ret_steps, STEPS)
    try:
        latents, frames = run_diffusers(model_dir[1], noise)
    finally:
        uninstall()
    return {"computed": tea.computed(), "latents": latents, "frames": frames, "distances": tea.distances}


@pytest.mark.parametrize(
    "ret_steps", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["temb", "ret_steps"]
)
def test_teacache_equals_its_authors_code(model_dir, noise, ours, ret_steps):
    """Coefficients ``x -> x`` (the plain relative change) and a threshold between the changes the
    reference measures uncached, so that some steps skip and some compute after skipping."""
    identity = [1.0, 0.0]
    measured = teacache_reference(model_dir, noise, identity, 0.0, ret_steps)["distances"]
    thresh = 2.5 * float(np.median(measured))
    ref = teacache_reference(model_dir, noise, identity, thresh, ret_steps)
    latents, report = our_run(
        ours, noise, CacheConfig("teacache", threshold=thresh, coefficients=identity, ret_steps=ret_steps)
    )
    assert report.computed == ref["computed"]
    flags = ref["computed"]["cond"]
    assert flags.count(False) >= 3, flags  # the case skips, and computes again after a skip
    assert any(not before and after for before, after in itertools.pairwise(flags)), flags
    assert report.as_json()["coefficients"] == "given" and report.as_json()["ret_steps"] == ret_steps
    assert relative_error(latents, ref["latents"]) <= 1e-5
    frames = decode_in_diffusers(model_dir[1], latents)
    assert np.abs(frames.astype(np.int16) - ref["frames"]).max() <= 1


def test_teacache_presets_are_the_published_coefficients():
    """Each preset's two modes as the authors' file holds them (teacache_generate.py @ 7c10efc)."""
    published = {
        "wan2.1-t2v-1.3b": (
            [2.39676752e03, -1.31110545e03, 2.01331979e02, -8.29855975e00, 1.37887774e-01],
            0.05,
        ),
        "wan2.1-t2v-14b": ([-5784.54975374, 5449.50911966, -1811.16591783, 256.27178429, -13.02252404], 0.14),
        "wan2.1-i2v-14b-480p": (
            [-3.02331670e02, 2.23948934e02, -5.25463970e01, 5.87348440e00, -2.01973289e-01],
            0.13,
        ),
        "wan2.1-i2v-14b-720p": ([-114.36346466, 65.26524496, -18.82220707, 4.91518089, -0.23412683], 0.20),
    }
    assert set(teacache.presets()) == set(published)
    for name, (coefficients, threshold) in published.items():
        tea = teacache.read_coefficients(name)
        assert tea.coefficients == tuple(coefficients) and tea.threshold == threshold
        assert "7c10efc4702c6b619f47805f7abe4a7a08085aa0" in tea.source
    ret = teacache.read_coefficients("wan2.1-t2v-14b", ret_steps=True)
    assert ret.coefficients[0] == -3.03318725e05 and ret.threshold == 0.10
    assert teacache.read_coefficients(None, transformer_preset("1.3B")).coefficients[0] == 2.39676752e03


def test_teacache_forces_the_authors_first_and_last_steps():
    """A polynomial that is always 0 skips every step but those the authors' counters force."""
    modulated = np.linspace(1.0, 2.0, 8, dtype=np.float32)[:, None]
    assert teacache.tea_schedule(modulated, [0.0], 0.5).tolist() == [True, *[False] * 6, True]
    assert teacache.tea_schedule(modulated, [0.0], 0.5, ret_steps=True).tolist() == [True] * 5 + [False] * 3
    assert teacache.tea_schedule(modulated, [1.0, 0.0], 0.0).all()  # any change reaches a 0 threshold


# ----------------------------------------------------------------------------------------------
# TaylorSeer against diffusers' hook


def taylorseer_reference(model_dir, noise, options: dict) -> dict:
    """diffusers' pipeline with ``TaylorSeerCacheConfig(**options)``: per-branch decisions (the
    output projection's hook updated its factors at this step), latents, frames."""
    from diffusers import TaylorSeerCacheConfig

    pipe = model_dir[1]
    decisions: list[dict[str, bool]] = []

    def on_step(p, i, t, kwargs):
        decisions.append(branch_decisions(p.transformer, "taylorseer"))
        return {}

    dtype = options.get("taylor_factors_dtype")
    config = {**options, "taylor_factors_dtype": getattr(torch, dtype) if dtype else torch.bfloat16}
    pipe.transformer.enable_cache(TaylorSeerCacheConfig(**config))
    try:
        latents, frames = run_diffusers(pipe, noise, on_step=on_step)
    finally:
        pipe.transformer.disable_cache()
    computed = {name: [d[name] for d in decisions] for name in ("cond", "uncond")}
    return {"computed": computed, "latents": latents, "frames": frames}


@pytest.mark.parametrize(
    "options",
    [
        dict(
            use_lite_mode=True, taylor_factors_dtype="float32", cache_interval=3, disable_cache_before_step=2
        ),
        pytest.param(
            dict(
                cache_identifiers=["^proj_out$"],
                taylor_factors_dtype="float32",
                max_order=2,
                disable_cache_after_step=10,
            ),
            marks=pytest.mark.slow,
        ),
    ],
    ids=["lite", "identifiers-order-2-cooldown"],
)
def test_taylorseer_equals_diffusers(model_dir, noise, ours, options):
    ref = taylorseer_reference(model_dir, noise, options)
    latents, report = our_run(ours, noise, CacheConfig("taylorseer", options=options))
    assert report.computed == ref["computed"]
    assert ref["computed"]["cond"].count(False) >= 3, ref["computed"]  # the case predicts
    assert report.as_json()["options"]["cache_interval"] == options.get("cache_interval", 5)
    assert relative_error(latents, ref["latents"]) <= 1e-5
    frames = decode_in_diffusers(model_dir[1], latents)
    assert np.abs(frames.astype(np.int16) - ref["frames"]).max() <= 1


# SeaCache against diffusers' hook


@pytest.mark.parametrize(
    "options, min_skipped",
    [
        ({}, 4),  # diffusers' defaults: threshold 0.25, linear extrapolation, 2 skips in a row at most
        pytest.param(
            dict(
                threshold=0.6,
                residual_order=0,
                max_consecutive_cached=0,
                retention_steps=2,
                cache_end_steps=3,
            ),
            8,
            marks=pytest.mark.slow,
        ),
    ],
    ids=["defaults", "order-0-unbounded"],
)
def test_seacache_equals_diffusers(model_dir, noise, ours, options, min_skipped):
    """SeaCache decides on the device from the filtered latents: the same steps per branch as diffusers'
    hook, its latents and frames."""
    from diffusers import SeaCacheConfig

    cache = CacheConfig("seacache", options=options)
    ref = check_equal(model_dir, noise, ours, SeaCacheConfig(**options), cache, min_skipped)
    assert ref["computed"]["cond"][:1] == [True] and ref["computed"]["cond"][-1] is True


def test_seacache_runs_where_diffusers_runs_it():
    """diffusers' SeaCache hook decides only on a text-to-video run of a transformer whose input is the
    latents (its image-to-video and VACE pipelines give it no step: it computes every step there);
    wanjax refuses it elsewhere in one line, and takes its threshold once."""
    from wanjax.sampling.cache.step_cache import resolve

    cache = CacheConfig("seacache", threshold=0.3)
    assert resolve(cache, transformer_preset("1.3B"), 10, True).threshold == 0.3
    assert resolve(cache, transformer_preset("5B"), 10, True).sea.residual_order == 1
    for cfg, first_frame in ((transformer_preset("I2V-14B"), False), (transformer_preset("5B"), True)):
        with pytest.raises(ConfigError, match="seacache runs where diffusers' runs it"):
            resolve(cache, cfg, 10, True, first_frame=first_frame)
    with pytest.raises(ConfigError, match="give seacache's threshold once"):
        CacheConfig("seacache", threshold=0.3, options={"threshold": "0.2"})


@pytest.mark.parametrize("factor_dtype", ["bfloat16", "float32"])
def test_taylor_factors_and_predictions_are_diffusers(factor_dtype):
    """Four updates at steps 0, 1, 3, 7 (orders growing to max_order 2) and a prediction after each,
    on the same tensors: wanjax's arrays equal diffusers' ``TaylorSeerState``'s exactly."""
    from diffusers.hooks.taylorseer_cache import TaylorSeerState

    reference = TaylorSeerState(taylor_factors_dtype=getattr(torch, factor_dtype), max_order=2)
    factors = jnp.zeros((3, 2, 5, 7), factor_dtype)
    orders, last = jnp.int32(0), jnp.int32(0)
    rng = np.random.default_rng(0)
    for step in (0, 1, 3, 7):
        features = rng.standard_normal((2, 5, 7)).astype(np.float32)
        reference.current_step = step
        reference.update((torch.from_numpy(features),))
        factors, orders, last = taylorseer.update(
            factors, orders, last, jnp.asarray(features), jnp.int32(step)
        )
        for k, factor in reference.taylor_factors[0].items():
            np.testing.assert_array_equal(np.asarray(factors[k].astype(jnp.float32)), factor.float().numpy())
        reference.current_step = step + 2
        expected = reference.predict()[0].numpy()
        got = taylorseer.predict(factors, orders, last, jnp.int32(step + 2), jnp.float32)
        np.testing.assert_array_equal(np.asarray(got), expected)
    assert int(orders) == 3


# ----------------------------------------------------------------------------------------------
# The curves and the settings


@pytest.mark.parametrize("source,target", [(25, 12), (100, 50), (12, 12), (7, 30), (10, 1)])
def test_nearest_interp_is_diffusers(source, target):
    from diffusers.hooks.mag_cache import nearest_interp as reference

    curve = np.linspace(1.0, 0.5, source).astype(np.float32)
    np.testing.assert_array_equal(
        nearest_interp(curve, target), reference(torch.from_numpy(curve), target).numpy()
    )


def test_presets_are_the_published_interleaved_curves():
    presets = step_cache.presets()
    assert {"wan2.1-t2v-1.3b", "wan2.1-t2v-14b"} <= set(presets)
    for name in ("wan2.1-t2v-1.3b", "wan2.1-t2v-14b"):
        entry = presets[name]
        assert len(entry["ratios"]) == 2 * entry["num_steps"] == 100 and entry["ratios"][:2] == [1.0, 1.0]
        assert "Zehong-Ma/MagCache" in entry["source"]
        curves = read_mag_ratios(name)
        assert (
            curves.curves["cond"] == entry["ratios"][0::2]
            and curves.curves["uncond"] == entry["ratios"][1::2]
        )
        assert curves.threshold == entry["threshold"]
    assert step_cache.preset_for(transformer_preset("1.3B")) == "wan2.1-t2v-1.3b"
    assert step_cache.preset_for(transformer_preset("14B")) == "wan2.1-t2v-14b"
    assert step_cache.preset_for(transformer_preset("tiny")) is None


def test_a_published_preset_skips_at_its_settings():
    """The 1.3B curve at 50 steps with its published settings (threshold 0.12, K 4, retention 0.2)."""
    cache = step_cache.resolve(CacheConfig("magcache"), transformer_preset("1.3B"), 50, guided=True)
    assert (cache.threshold, cache.max_skip_steps, cache.retention_ratio) == (0.12, 4, 0.2)
    assert cache.schedule.shape == (50, 2) and cache.schedule[:10].all()
    assert (~cache.schedule).sum(axis=0).min() >= 25  # 29 of 50 skipped: the ~2.1-2.7x reported
    override = step_cache.resolve(
        CacheConfig("magcache", threshold=0.0), transformer_preset("1.3B"), 50, True
    )
    assert override.schedule.all()


def test_bad_settings_are_one_line_errors(tmp_path):
    cases = [
        (lambda: CacheConfig("tea"), "unknown cache policy 'tea'"),
        (lambda: CacheConfig("magcache", ret_steps=True), "ret_steps is for the teacache policy"),
        (lambda: CacheConfig("teacache", mag_ratios=[1.0]), "mag_ratios is for the magcache policy"),
        (lambda: teacache.read_coefficients("wan9"), "unknown TeaCache preset 'wan9'"),
        (lambda: CacheConfig("taylorseer"), "set use_lite_mode=true or cache_identifiers"),
        (lambda: CacheConfig("taylorseer", options={"interval": 3}), "unknown taylorseer option 'interval'"),
        (lambda: CacheConfig("taylorseer", options={"use_lite_mode": "yes"}), "must be true or false"),
        (lambda: CacheConfig("taylorseer", options={"cache_interval": 0}), "integer >= 1"),
        (
            lambda: CacheConfig(
                "taylorseer", options={"use_lite_mode": True, "disable_cache_before_step": 0}
            ),
            "predicts the first step",
        ),
        (
            lambda: CacheConfig("magcache", options={"max_order": 2}),
            "options is for the taylorseer or seacache policy",
        ),
        (lambda: CacheConfig("seacache", options={"tresh": 1}), "unknown seacache option 'tresh'; the"),
        (lambda: CacheConfig("seacache", options={"residual_order": "2"}), "must be 0 or 1"),
        (lambda: CacheConfig("seacache", options={"power_exp": "0"}), "power_exp must be positive"),
        (lambda: CacheConfig("seacache", options={"retention_steps": "x"}), "must be a number"),
        (lambda: CacheConfig("seacache", options={"raw_vision_callback": "f"}), "leave it out"),
        (lambda: teacache.read_coefficients([1.0, None]), "list of numbers"),
        (lambda: teacache.read_coefficients(None, transformer_preset("tiny")), "none are published for this"),
        (
            lambda: step_cache.resolve(
                CacheConfig("teacache", coefficients=[1.0]), transformer_preset("tiny"), 5, True
            ),
            "needs a threshold",
        ),
        (
            lambda: step_cache.resolve(
                CacheConfig("teacache"), transformer_preset("14B"), 4, True, [0, 0, 1, 1]
            ),
            "for a two-expert model use --cache magcache or firstblock",
        ),
        (lambda: CacheConfig("firstblock", max_skip_steps=2), "max_skip_steps is for the magcache policy"),
        (lambda: CacheConfig("magcache", threshold=-1), "threshold must be >= 0"),
        (lambda: CacheConfig("magcache", retention_ratio=2), "retention_ratio must lie in"),
        (lambda: read_mag_ratios("wan9"), "unknown MagCache preset 'wan9'"),
        (lambda: read_mag_ratios(tmp_path / "missing.json"), "cannot read the MagCache ratios"),
        (lambda: read_mag_ratios([1.0, "x"]), "list of numbers"),
        (lambda: read_mag_ratios({"cnd": [1.0]}), "need a 'cond' list"),
        (lambda: read_mag_ratios(None, transformer_preset("tiny")), "no published curve matches this model"),
    ]
    (tmp_path / "bad.json").write_text("[1.0,")
    cases.append((lambda: read_mag_ratios(tmp_path / "bad.json"), "not JSON"))
    for make, message in cases:
        with pytest.raises(ConfigError, match=message) as info:
            make()
        assert "\n" not in str(info.value)


# ----------------------------------------------------------------------------------------------
# On an 8-device mesh


@pytest.mark.slow
def test_cache_on_an_8_device_mesh_equals_one_device(model_dir, noise):
    caches = {
        "magcache": CacheConfig("magcache", mag_ratios=CURVE_12, threshold=0.06, max_skip_steps=2),
        "firstblock": CacheConfig("firstblock", threshold=0.4361),
        "seacache": CacheConfig("seacache", options={"max_consecutive_cached": 0}),
    }
    out = {}
    for mesh in (None, "dp=2,sp=2,tp=2", "dp=1,sp=4,tp=2"):
        pipe = WanPipeline.from_pretrained(model_dir[0], dtype="float32", jax_cache_dir=False, mesh=mesh)
        pos, neg = pipe.encode_prompt(PROMPT, NEGATIVE)
        for name, cache in caches.items():
            run = pipe.denoise(pos, neg, noise.numpy(), num_inference_steps=12, progress=False, cache=cache)
            computed = run.cache_report.computed
            out[mesh, name] = {
                "latents": np.asarray(run.latents),
                "computed": computed,
                "usage": run.mesh_usage,
            }
    for policy in caches:
        one = out[None, policy]
        assert sum(not c for c in one["computed"]["uncond"]) >= 3
        for mesh in ("dp=2,sp=2,tp=2", "dp=1,sp=4,tp=2"):
            sharded = out[mesh, policy]
            assert sharded["usage"] and sharded["computed"] == one["computed"], (
                mesh,
                policy,
                sharded["usage"],
            )
            assert relative_error(sharded["latents"], one["latents"]) <= 1e-5, (mesh, policy)


# ----------------------------------------------------------------------------------------------
# The command line


@pytest.mark.slow
def test_cli_cache_flags_calibrate_then_reuse_and_record(demo_env, tmp_path, capsys):
    """``--cache_calibrate`` writes per-branch ratios that ``--mag_ratios`` reads back; each run's
    record holds the cache's decisions; the stage command takes the same flags; bad values are
    one-line errors (exit 2) that write nothing."""
    from wanjax.cli.main import main

    small = ["--height", "32", "--width", "32", "--frames", "5", "--num_inference_steps", "8"]  # fmt: skip
    base = ["generate", "--model", "demo", "--prompt", "a cat", *small]
    ratios = tmp_path / "ratios.json"
    assert main([*base, "--cache_calibrate", str(ratios), "--output_video", str(tmp_path / "cal.mp4")]) == 0
    measured = json.loads(ratios.read_text())
    assert list(measured) == ["cond", "uncond"] and len(measured["cond"]) == 8 and measured["cond"][0] == 1.0
    calibration = json.loads((tmp_path / "cal.json").read_text())["cache"]
    assert calibration["ratios"] == measured and calibration["dit_evaluations"] == 16

    flags = ["--cache", "magcache", "--mag_ratios", str(ratios), "--cache_threshold", "0.5"]
    assert main([*base, *flags, "--output_video", str(tmp_path / "m.mp4")]) == 0
    cache = json.loads((tmp_path / "m.json").read_text())["cache"]
    expected = {b: mag_schedule(measured[b], 8, 0.5, 3, 0.2) for b in ("cond", "uncond")}
    for branch, flags_of in expected.items():
        assert cache["branches"][branch]["skipped"] == np.flatnonzero(~flags_of).tolist()
    assert cache["dit_evaluations"] == 2 * int((expected["cond"] | expected["uncond"]).sum())
    assert "cache: magcache, steps skipped" in capsys.readouterr().out

    (tmp_path / "tea.json").write_text("[1.0, 0.0]")
    tea = [
        "--cache",
        "teacache",
        "--teacache_coefficients",
        str(tmp_path / "tea.json"),
        "--cache_threshold",
        "1e9",
    ]
    assert main([*base, *tea, "--output_video", str(tmp_path / "t.mp4")]) == 0
    cache = json.loads((tmp_path / "t.json").read_text())["cache"]
    assert (cache["policy"], cache["coefficients"], cache["ret_steps"]) == (
        "teacache",
        f"file {tmp_path / 'tea.json'}",
        False,
    )
    assert cache["branches"]["cond"]["skipped"] == cache["branches"]["uncond"]["skipped"] == list(range(1, 7))
    assert cache["dit_evaluations"] == 4  # the first and the last step, both branches

    taylor = ["--cache", "taylorseer", "--cache_option", "use_lite_mode=true"]
    taylor += ["--cache_option", "cache_interval=2", "--cache_option", "disable_cache_before_step=1"]
    assert main([*base, *taylor, "--output_video", str(tmp_path / "ts.mp4")]) == 0
    cache = json.loads((tmp_path / "ts.json").read_text())["cache"]
    assert cache["policy"] == "taylorseer" and cache["options"]["cache_interval"] == 2
    assert cache["branches"]["cond"]["skipped"] == [1, 3, 5, 7]  # diffusers' (step - 1 - 1) % 2 == 0 computes
    sea = ["--cache", "seacache", "--cache_option", "residual_order=0", "--cache_threshold", "1"]
    assert main([*base, *sea, "--output_video", str(tmp_path / "sea.mp4")]) == 0
    cache = json.loads((tmp_path / "sea.json").read_text())["cache"]
    assert cache["options"] == {**seacache.DEFAULTS, "residual_order": 0, "threshold": 1.0}
    assert cache["branches"]["cond"]["skipped"] and cache["branches"]["cond"]["skipped"][-1] < 7

    stage = tmp_path / "stages"
    assert main(["encode", "--model", "demo", "--prompt", "a cat", "--output_dir", str(stage)]) == 0
    assert (
        main(
            [
                "denoise",
                "--input_dir",
                str(stage),
                "--cache",
                "firstblock",
                "--cache_threshold",
                "1.0",
                *small,
            ]
        )
        == 0
    )
    config = json.loads((stage / "generation_config.json").read_text())
    assert config["stages"]["denoise"]["arguments"]["cache"] == "firstblock"

    capsys.readouterr()
    for bad in (
        ["--cache", "firstblock", "--cache_max_skip", "2"],
        ["--cache", "magcache", "--mag_ratios", "nope"],
        ["--cache", "magcache"],  # the demo model has no published curve
        ["--cache", "teacache"],  # nor coefficients
        ["--cache", "teacache", "--teacache_coefficients", "nope"],
        ["--cache", "magcache", "--teacache_ret_steps"],
        ["--cache", "taylorseer"],  # diffusers' default modules are not Wan's
        ["--cache", "taylorseer", "--cache_option", "interval=3"],
        ["--cache", "taylorseer", "--cache_option", "use_lite_mode"],
        ["--cache", "seacache", "--cache_option", "tresh=1"],
        ["--cache", "seacache", "--cache_threshold", "1", "--cache_option", "threshold=2"],
        ["--cache_calibrate", str(tmp_path / "r.txt")],
        ["--cache", "firstblock", "--cache_calibrate", str(tmp_path / "r.json")],
    ):
        assert main([*base, *bad, "--output_video", str(tmp_path / "bad.mp4")]) == 2, bad
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--cache" in err, err
    assert not (tmp_path / "bad.mp4").exists() and not (tmp_path / "r.json").exists()


def test_the_report_times_computed_and_skipped_steps_apart():
    """s/step over all steps is mostly the skipped steps' cost: the report gives each kind its own."""
    from wanjax.runtime.timing import RunReport, StepTimes

    steps = StepTimes(compile=1.0, first=0.5, steady=[0.04, 0.002, 0.05, 0.001, 0.001])
    branches = {"cond": {"skipped": [2, 4, 5]}, "uncond": {"skipped": [4, 5]}}  # step 2: uncond ran
    report = RunReport("generate", "demo", steps=steps, extra={"cache": {"branches": branches}})
    assert report.computed_and_skipped() == ((4, 0.04), (2, 0.001))  # steps 0-3 (0 untimed); 4, 5
    denoise = report.to_dict()["denoise"]
    assert (denoise["computed_steps"], denoise["s_per_computed_step"]) == (4, 0.04)
    assert (denoise["skipped_steps"], denoise["s_per_skipped_step"]) == (2, 0.001)
    assert RunReport("generate", "demo", steps=steps).computed_and_skipped() is None
