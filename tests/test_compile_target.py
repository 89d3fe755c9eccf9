"""The TPU as a compile target: programs built for a TPU slice's devices (libtpu's topology, no TPU
here) are the TPU's programs, compiled by the real TPU compiler, Mosaic included."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from wanjax.chips import CHIPS, DEFAULT_BLOCKS, SLICES
from wanjax.io.checkpoint import abstract_params
from wanjax.kernels import tuning
from wanjax.kernels.attention import AttentionSpec, resolve_backend
from wanjax.kernels.common import AttentionShape, Platform
from wanjax.kernels.precision import resolve_precision
from wanjax.models import dit
from wanjax.models.registry import DEMO_TRANSFORMER, DEMO_VAE, registry
from wanjax.models.settings import RunSettings
from wanjax.models.vae import WanVAE, checkpoint_spec
from wanjax.models.vae.ops import default_conv
from wanjax.parallel.mesh import parse_mesh
from wanjax.runtime.compile_effort import ONCE_PER_VIDEO_EFFORT, once_per_video
from wanjax.runtime.libtpu import installed
from wanjax.sampling.cache.step_cache import CacheConfig
from wanjax.sampling.sampler import Sampler
from wanjax.sampling.scheduler import SchedulerConfig, make_scheduler
from wanjax.target import Target, building_for, current_target
from wanjax.tools.compile_target import (
    Program,
    RunSpec,
    attention_program,
    compile_one,
    compile_run,
    slice_target,
)
from wanjax.tools.flops import attention_flops

pytestmark = pytest.mark.skipif(not installed(), reason="libtpu (the test extra's jax[tpu]) is not installed")


TINY_VIDEO_ON_V6E = ("--height", "64", "--width", "64", "--frames", "5", "--compile", "v6e-8")


@pytest.fixture(autouse=True)
def _no_tune_cache(tmp_path, monkeypatch):
    """Block sizes from the defaults, never from a tune cache this machine happens to have."""
    monkeypatch.setenv("WANJAX_ATTENTION_TUNE_FILE", str(tmp_path / "none.json"))


@pytest.fixture(scope="module")
def v6e():
    return slice_target(SLICES["v6e-8"])


@pytest.fixture(scope="module")
def v5e():
    return slice_target(SLICES["v5e-8"])


@pytest.fixture(scope="module")
def v7x():
    return slice_target(SLICES["v7x-8"])


def test_the_host_is_the_default_target_and_a_block_sets_another(v6e):
    assert current_target().platform == "cpu" and not current_target().compile_only
    with building_for(v6e):
        assert current_target() is v6e
        assert (v6e.platform, v6e.device_kind, len(v6e.devices)) == ("tpu", "TPU v6 lite", 8)
        assert Platform.detect() == Platform("tpu")
    assert current_target().platform == "cpu"


def test_every_choice_reads_the_target_not_the_host(v6e):
    """Built for a TPU on this CPU host: the TPU's attention, VAE formulation and precisions."""
    shape = AttentionShape(128, "bfloat16")
    assert resolve_backend("auto", shape) == "xla"
    assert resolve_precision(None, "vae") == "highest"
    with building_for(v6e):
        assert resolve_backend("auto", shape) == "splash"
        assert resolve_precision(None, "vae") == "high"
        assert default_conv(current_target().platform) == default_conv("tpu")
        assert resolve_precision(None, "transformer") == "highest"
        assert WanVAE(DEMO_VAE, None, params_like={}).numerics.first_frame == "scan"
        assert once_per_video() == {"exec_time_optimization_effort": ONCE_PER_VIDEO_EFFORT}
    assert WanVAE(DEMO_VAE, None, params_like={}).numerics.first_frame == "alone"
    assert once_per_video() == {}


def _demo_decode(target: Target, latents: tuple[int, int, int], **options) -> jax.stages.Lowered:
    """The demo VAE's ``decode_uint8`` of ``(frames, h, w)`` latents, lowered for the target's first chip."""
    device = jax.sharding.SingleDeviceSharding(target.devices[0])
    with building_for(target):
        like = abstract_params(checkpoint_spec(DEMO_VAE, "decoder"), jnp.float32, lambda source: device)
        z = jax.ShapeDtypeStruct((1, DEMO_VAE.z_dim, *latents), jnp.float32, sharding=device)
        return WanVAE(DEMO_VAE, None, params_like=like, **options).lower("decode_uint8", z)


def test_a_tpus_decode_holds_the_decoder_once(v6e):
    """Built for a TPU, the first latent frame is the scan's first step: the program's convolutions
    are the decoder's once, where decoding that frame alone holds them twice (and the TPU compiler's
    time and code go with them)."""
    convolutions = {
        first: _demo_decode(v6e, (3, 4, 4), first_frame=first).as_text().count("stablehlo.convolution")
        for first in ("auto", "alone")
    }
    assert convolutions["alone"] == 2 * convolutions["auto"] > 0, convolutions


@pytest.mark.slow
def test_a_tpus_decode_code_barely_grows_with_the_frame(v6e):
    """The demo decode compiled for one v6e chip at 32x32 and 128x128 latents (256 and 1024 pixels
    a side): 18.9 and 25.7 MiB of code (1.36x; 7 and 9 s). At the TPU compiler's default effort
    it is 46.8 and 86.0 MiB (1.84x; 56 and 104 s), and grows on to minutes at the real sizes."""
    code = [
        _demo_decode(v6e, (2, side, side)).compile().memory_analysis().generated_code_size_in_bytes
        for side in (32, 128)
    ]
    assert code[1] < 1.5 * code[0], code
    assert code[1] < 40 * 2**20, code


def _attention_program(target: Target, backend: str | AttentionSpec, length: int, heads: int = 2):
    return attention_program(target, backend, (1, length, heads, 128))


@pytest.mark.parametrize("backend", ["splash", "splash_exp2"])
@pytest.mark.parametrize("tpu", ["v5e", "v6e"])
def test_both_kernels_compile_through_mosaic_at_a_small_shape(backend, tpu, request):
    target = request.getfixturevalue(tpu)
    with building_for(target):
        report = compile_one(_attention_program(target, backend, 1024))
    assert report.compiled, report.error
    assert report.tpu_custom_calls >= 1  # the Pallas kernel, not interpret mode's emulation


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["splash", "splash_exp2"])
@pytest.mark.parametrize("tpu", ["v5e", "v6e", "v7x"])
def test_default_blocks_compile_at_the_14b_720p_shape(backend, tpu, request):
    """One chip's self-attention of Wan 2.1 14B at 1280x720x81 on dp=2,tp=4 (75,600 tokens, 10 heads):
    the blocks the runtime picks for the chip (no tune cache) compile, the seed's splash on v5e not;
    its FLOPs counted in the program are the analytic count."""
    target = request.getfixturevalue(tpu)
    with building_for(target):
        report = compile_one(_attention_program(target, backend, 75600, heads=10))
    assert report.compiled and report.tpu_custom_calls >= 1, report.error
    assert report.flops_per_chip == attention_flops(1, 10, 75600, 75600, 128)
    assert tuning.default_blocks(target.device_kind, backend) == (
        (1024, 2048, 512, 256) if (tpu, backend) == ("v5e", "splash") else DEFAULT_BLOCKS
    )


@pytest.mark.parametrize("generation", sorted({s.chip.name for s in SLICES.values()}))
def test_each_chip_is_the_compilers(generation):
    """Device kind and usable HBM per generation, as libtpu describes the chip and the TPU compiler
    reports it when a program does not fit (a 64 GiB temporary)."""
    chip = CHIPS[generation]
    tpu = next(s for s in SLICES.values() if s.chip is chip)
    target = slice_target(tpu)
    assert target.device_kind == chip.device_kind
    huge = jax.ShapeDtypeStruct(
        (16, 1 << 30), jnp.float32, sharding=jax.sharding.SingleDeviceSharding(target.devices[0])
    )
    with building_for(target):
        report = compile_one(Program("huge", lambda: jax.jit(lambda a: a * 2).lower(huge), "x", None, 0))
    assert f"exceeds available HBM ({chip.usable_hbm_bytes / 2**30:.2f}G)" in report.error, report.error


@pytest.mark.slow
def test_an_impossible_block_is_the_compilers_one_line_vmem_error(v5e):
    """A 2048 x 2048 block of splash needs more than v5e's 16 MiB of scoped VMEM (23 MiB; a 4096 block,
    79 MiB, fails alike after five times the compile)."""
    spec = AttentionSpec("splash", block_q=2048, block_kv=2048, block_kv_compute=2048)
    with building_for(v5e):
        report = compile_one(_attention_program(v5e, spec, 8192))
    assert not report.compiled
    assert "vmem" in report.error.lower() and "\n" not in report.error


def test_a_dit_step_built_for_a_tpu_slice_has_the_kernels_and_no_interpret_mode(v6e):
    """The sampler's guided step on a dp=2,tp=4 mesh of v6e chips, abstract weights only."""
    from wanjax.parallel.mesh import make_mesh

    with building_for(v6e):
        mesh = make_mesh(parse_mesh("dp=2,sp=1,tp=4"), v6e.devices)
        settings = RunSettings(jnp.bfloat16, attention="splash_exp2", mesh=mesh)
        params = abstract_params(
            dit.checkpoint_spec(DEMO_TRANSFORMER), jnp.bfloat16, dit.transformer_sharding(mesh)
        )
        model = dit.WanTransformer(DEMO_TRANSFORMER, params, settings)
        latents = jax.ShapeDtypeStruct((1, 16, 2, 16, 16), jnp.float32)
        text = jax.ShapeDtypeStruct((1, 16, DEMO_TRANSFORMER.text_dim), jnp.bfloat16)
        lowered = Sampler(model).lower(make_scheduler(SchedulerConfig(), 2), latents, text, text, params)
        compiled = lowered.compile()
    hlo = compiled.as_text()
    assert "tpu_custom_call" in hlo
    assert compiled.memory_analysis().argument_size_in_bytes > 0


@pytest.mark.slow
def test_a_two_expert_models_two_steps_compile_for_v6e():
    """An image model with two experts compiles a step per expert (its other programs are demo-i2v's, the
    same VAE and text encoder: compiled by the command-line test below)."""
    run = RunSpec(
        registry()["demo-i2v-a14b"], 64, 64, 5, parse_mesh("dp=2,sp=1,tp=4"), attention="splash_exp2"
    )
    report = compile_run(run, SLICES["v6e-8"], only=("step",))
    assert [p.name for p in report.programs] == ["step_high_noise", "step_low_noise"]
    assert report.fits, report.table()
    assert all(p.tpu_custom_calls > 0 and p.attention_backend == "splash_exp2" for p in report.programs)


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}  # as a user's shell has it
    return subprocess.run(
        [sys.executable, "-m", "wanjax.cli.main", *args], capture_output=True, text=True, env=env, check=False
    )


@pytest.mark.slow
def test_commands_stay_quiet_with_libtpu_installed_and_no_tpu():
    """libtpu installed, no TPU: JAX alone prints libtpu's start-up warnings; a wanjax command that
    starts JAX's backends prints nothing on stderr, and an error stays its one line."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    bare = [sys.executable, "-c", "import jax; jax.devices()"]
    assert "TPU" in subprocess.run(bare, capture_output=True, text=True, env=env, check=True).stderr
    result = _cli("plan", "--model", "1.3B", "--height", "480", "--width", "832")  # counts the devices
    assert "1 device," in result.stdout and result.stderr == "", result.stderr
    result = _cli("info", "no/such/model")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr


@pytest.mark.slow
def test_plan_compile_from_the_command_line_compiles_every_program_and_writes_its_report(tmp_path):
    """An image model's text encoder, image encoder, VAE encode, text K/V cache, step and VAE decode, all
    compiled for the slice (the step through Mosaic); the table on stdout, the report as JSON."""
    out = tmp_path / "report.json"
    args = ("plan", "--model", "demo-i2v", "--height", "32", "--width", "32", "--frames", "5")
    result = _cli(*args, "--compile", "v9-8")
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "unknown TPU slice 'v9-8' for --compile; use one of v4-8," in result.stderr
    flags = ("--mesh", "dp=2,sp=1,tp=4", "--attention", "splash_exp2", "--json", str(out))
    result = _cli(*args, "--compile", "v6e-8", *flags)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    assert (
        "compiled for v6e-8 (8 chips, 32.00 GiB HBM each, 31.25 usable), mesh dp=2,sp=1,tp=4" in result.stdout
    )
    document = json.loads(out.read_text())
    assert (document["topology"], document["chips"], document["fits"]) == ("v6e-8", 8, True)
    programs = {p["name"]: p for p in document["programs"]}
    assert list(programs) == ["text_encoder", "image_encoder", "vae_encode", "text_kv", "step", "vae_decode"]
    assert all(p["compiled"] and p["planned_bytes_per_chip"] > 0 for p in programs.values())
    step = programs["step"]
    assert step["tpu_custom_calls"] > 0 and step["attention_backend"] == "splash_exp2"
    assert set(step["bytes_per_chip"]) >= {"arguments", "temporaries", "outputs", "code", "total"}
    # the estimate beside each program is the slice's: feature maps padded to the TPU's lanes
    from wanjax.chips import TPU_LANES
    from wanjax.planning.models import model_configs
    from wanjax.planning.plan import plan

    size = dict(height=32, width=32, frames=5, device_memory=1 << 30)
    on_tpu, here = (
        plan(model_configs("demo-i2v"), parse_mesh("dp=2,sp=1,tp=4"), **size, lanes=lanes).on_device("decode")
        for lanes in (TPU_LANES, 1)
    )
    assert programs["vae_decode"]["planned_bytes_per_chip"] == on_tpu > here


@pytest.mark.slow
def test_tune_attention_keeps_only_the_candidates_that_compile_for_the_slice(capsys):
    from wanjax.tools.tune_attention import Problem, check_compiling

    problem = Problem("self", 1, 8192, 8192, 2, 128)
    candidates = [(2048, 2048, 2048, 128), (1024, 1024, 512, 128)]
    kept = check_compiling(problem, "splash", jnp.bfloat16, candidates, "v5e-8")
    assert kept == [(1024, 1024, 512, 128)]
    out = capsys.readouterr().out
    assert "(2048, 2048, 2048, 128): RESOURCE_EXHAUSTED" in out and "1 candidates compile for v5e-8" in out


@pytest.mark.slow
def test_plan_compile_can_compile_only_some_programs(tmp_path):
    out = tmp_path / "step.json"
    args = ("plan", "--model", "demo-a14b", *TINY_VIDEO_ON_V6E)
    result = _cli(*args, "--programs", "step,vea_decode")
    assert (
        result.returncode == 2 and "--programs 'step,vea_decode': choose from text_encoder," in result.stderr
    )
    result = _cli(*args, "--programs", "step", "--json", str(out))
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    programs = json.loads(out.read_text())["programs"]
    assert [p["name"] for p in programs] == ["step_high_noise", "step_low_noise"]
    assert all(p["resident_bytes_per_chip"] > 0 for p in programs)  # the other expert, text encoder, VAE
    # the experts' steps are one program (their weights are its arguments): a run compiles it once
    # and takes it from the compilation cache for the second expert; so does the report
    high, low = programs
    assert (high["same_as"], low["same_as"], low["compile_seconds"]) == (None, "step_high_noise", 0.0)
    assert high["compile_seconds"] > 0 and low["bytes_per_chip"] == high["bytes_per_chip"]
    lines = result.stdout.splitlines()
    assert any(
        line.startswith("  step_low_noise ")
        and line.endswith("the same program as step_high_noise: taken from the compilation cache")
        for line in lines
    ), result.stdout
    assert " 1 program compiled in " in lines[-1] and "(1 more taken from the compilation cache)" in lines[-1]


def test_the_compilers_cost_model_counts_splash_exp2_as_the_analytic_flops(v6e):
    """Without its ``pl.CostEstimate`` the compiler counted the kernel as ~0 FLOPs."""
    with building_for(v6e):
        compiled = attention_program(v6e, "splash_exp2", (1, 4096, 2, 128)).lower().compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    assert cost["flops"] == pytest.approx(attention_flops(1, 2, 4096, 4096, 128), rel=1e-3)
    assert cost["transcendentals"] == 2 * 4096 * 4096


@pytest.mark.parametrize("backend", ["splash", "splash_exp2"])
def test_a_steps_flops_on_one_chip_are_the_analytic_count(backend):
    """Counted in the compiled step, every layer of its scan (XLA's cost analysis counts one) and
    every attention call (``splash_exp2`` by its ``pl.CostEstimate``, JAX's ``splash`` by the
    analytic count of its call's label): the image-to-video step's analytic FLOPs, exactly; the cost
    model's time (loops scaled) labelled an estimate. The text K/V cache's program (the context's
    keys and values the step no longer projects) is its analytic count too."""
    run = RunSpec(registry()["demo-i2v"], 64, 64, 5, parse_mesh("dp=1,sp=1,tp=1"), attention=backend)
    report = compile_run(run, SLICES["v6e-1"], only=["step", "text_kv"])
    text_kv, step = report.programs
    assert text_kv.name == "text_kv" and text_kv.flops_per_chip == text_kv.analytic_flops > 0
    assert step.flops_per_chip == step.analytic_flops > 0
    assert step.peak_seconds == pytest.approx(step.flops_per_chip / 918e12)  # v6e's dense bf16 peak
    if backend == "splash":  # JAX's kernel carries no cost estimate: the cost model misses its work
        assert step.cost_model_seconds is None and "no cost-model time" in report.table()
    else:
        assert step.cost_model_seconds > 0 and "(estimate)" in report.table()
    assert report.as_json()["programs"][1]["flops_per_chip"] == step.flops_per_chip


@pytest.mark.parametrize(
    ("name", "cache"),
    [
        pytest.param("demo", CacheConfig("firstblock"), marks=pytest.mark.slow, id="firstblock"),
        pytest.param(
            "demo-a14b",
            CacheConfig("magcache", mag_ratios=[1.0, 0.9]),
            marks=pytest.mark.slow,
            id="magcache-per-expert",
        ),
        pytest.param("demo", CacheConfig("teacache", coefficients=[1.0, 0.0], threshold=0.1), id="teacache"),
        pytest.param(
            "demo-a14b",
            CacheConfig("taylorseer", options={"use_lite_mode": True}),
            marks=pytest.mark.slow,
            id="taylorseer-per-expert",
        ),
    ],
)
def test_a_step_cache_compiles_its_own_step_for_a_tpu(name, cache):
    """The step a cached run compiles: it also carries the cache state (the residual of the guided
    batch's tokens, First-Block Cache's first-block reference too) and skips the blocks in a branch
    whose FLOPs count the computing side."""
    mesh = parse_mesh("dp=2,sp=1,tp=4")
    plain = compile_run(RunSpec(registry()[name], 64, 64, 5, mesh), SLICES["v6e-8"], only=["step"])
    cached = compile_run(
        RunSpec(registry()[name], 64, 64, 5, mesh, cache=cache), SLICES["v6e-8"], only=["step"]
    )
    assert cached.fits, cached.table()
    for with_cache, without in zip(cached.programs, plain.programs, strict=True):
        assert with_cache.bytes_per_chip["arguments"] > without.bytes_per_chip["arguments"]
        assert with_cache.flops_per_chip == without.flops_per_chip


@pytest.mark.parametrize(
    ("program", "offload"),
    [pytest.param("text_encoder", "model", marks=pytest.mark.slow), ("step", "blocks")],
)
def test_streamed_offload_compiles_for_a_tpu(program, offload):
    """Found by the compile target: the TPU compiler refused the streamed stacked norms and UMT5's
    relative bias in host memory ("Sublane slicing size must be multiple of element packing factor",
    "Async slice only supports slicing in 1 dimension"); only the matmul kernels stream now."""
    run = RunSpec(registry()["demo"], 64, 64, 5, parse_mesh("dp=2,sp=1,tp=4"), offload=offload)
    report = compile_run(run, SLICES["v5e-8"], only=[program])
    assert report.programs[0].compiled, report.programs[0].error
    assert report.programs[0].bytes_per_chip["host_arguments"] > 0  # the kernels stay in host memory


@pytest.mark.slow
def test_8_bit_weights_compile_for_a_tpu():
    run = RunSpec(registry()["demo"], 64, 64, 5, parse_mesh("dp=2,sp=1,tp=4"), weights_dtype="int8")
    report = compile_run(run, SLICES["v5e-8"], only=["text_encoder", "step"])
    assert [p.compiled for p in report.programs] == [True, True], report.table()


def test_a_cache_without_its_curve_is_a_one_line_error_before_any_compile(capsys):
    from wanjax.cli.main import main

    args = ["plan", "--model", "demo", *TINY_VIDEO_ON_V6E]
    assert main([*args, "--cache", "magcache"]) == 2
    err = capsys.readouterr().err
    assert "magcache needs a ratio curve" in err and len(err.strip().splitlines()) == 1


def test_a_multi_host_slice_compiles_a_mesh_that_splits_a_physical_axis():
    """v6e-16 is 4 hosts of 2x2 chips on a 4x4 torus: dp=2,sp=2,tp=4 has no assignment to whole
    physical axes (jax.make_mesh refused it on every generation but v5e)."""
    run = RunSpec(registry()["demo"], 64, 64, 5, parse_mesh("dp=2,sp=2,tp=4"), attention="splash_exp2")
    report = compile_run(run, SLICES["v6e-16"], only=["text_encoder", "step"])
    assert report.fits, report.table()
    assert len({d.process_index for d in slice_target(SLICES["v6e-16"]).devices}) == 4


@pytest.mark.slow
def test_a_w8a8_step_multiplies_int8_by_int8_on_a_tpu():
    """``--weights_dtype int8`` on v6e-8: ``auto`` runs W8A8 there, every block's eight matmuls (self
    q, k, v, out; cross q, out; FFN in, out: the text's keys and values are ``text_kv``'s) as
    ``s8 x s8`` dots, each layer counted; a float ``--activations_dtype`` keeps them bf16."""
    variant = registry()["demo"]
    mesh = parse_mesh("dp=2,sp=1,tp=4")
    steps = {
        a: compile_run(
            RunSpec(variant, 64, 64, 5, mesh, weights_dtype="int8", activations_dtype=a),
            SLICES["v6e-8"],
            only=["step"],
        ).programs[0]
        for a in ("auto", "bfloat16")
    }
    assert all(p.compiled for p in steps.values())
    assert steps["auto"].int8_products == 8 * variant.transformer.num_layers
    assert 0 < steps["auto"].int8_flops_per_chip < steps["auto"].flops_per_chip
    assert steps["bfloat16"].int8_products == 0


def test_an_animate_steps_flops_are_the_analytic_count_with_the_reference_frame():
    """demo-animate on one chip, a segment of its 9 frames (3 latent frames and the reference's,
    whatever the run's frames): the analytic count is over the step's own latents, the reference's
    frame included; the counted step is that plus one face adapter per layer without one (the HLO
    walk counts the ``lax.cond``'s adapter branch at every layer of the scan; it runs after every
    second), less the motion encoder's taps on padding (the analytic count has every tap of its
    padded convolutions; the walk, as XLA's cost analysis, only those on input): under a tenth of
    the motion encoder's count on the 16x16 demo faces."""
    import dataclasses

    from wanjax.tools.flops import animate_flops, dit_step_flops

    variant = registry()["demo-animate"]
    run = RunSpec(variant, 64, 64, 5, parse_mesh("dp=1,sp=1,tp=1"), attention="splash_exp2")
    assert run.step_frames == 9 and run.latents_shape[2] == 3
    step = compile_run(run, SLICES["v6e-1"], only=["step"]).programs[0]
    cfg, shape = variant.transformer, (*run.latents_shape[:2], 4, *run.latents_shape[3:])
    image_len = variant.image_encoder.num_positions
    assert (
        step.analytic_flops
        == dit_step_flops(cfg, shape, run.max_sequence_length, True, image_len, True).total
    )
    every_block = dataclasses.replace(cfg, inject_face_latents_blocks=1)
    adapters = animate_flops(every_block, shape, 2).total - animate_flops(cfg, shape, 2).total
    no_adapters = dataclasses.replace(cfg, inject_face_latents_blocks=cfg.num_layers + 1)  # none counted
    motion = animate_flops(no_adapters, shape, 2).total
    padding = step.analytic_flops + adapters - step.flops_per_chip
    assert 0 < padding < motion / 10
