"""``wanjax bench`` on a shortened 1.3B architecture: the report's fields, FLOPs and errors."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wanjax.errors import WanjaxError
from wanjax.io.checkpoint import (
    REPLICATED,
    LeafSource,
    abstract_params,
    linear_kernel,
    random_params,
    random_params_on_device,
    random_scale,
    random_tensor,
    stacked,
)
from wanjax.jobs.cache_flags import CacheFlags
from wanjax.jobs.groups import MemoryFlags
from wanjax.models import dit, registry, umt5
from wanjax.models.registry import CLIP_VIT_H_14, DEMO_VAE22, UMT5_XXL, transformer_preset
from wanjax.models.vae.config import VAEConfig
from wanjax.sampling.cache import step_cache
from wanjax.tools import bench, measure
from wanjax.tools.flops import Flops, dit_step_flops, vae_decode_flops


@pytest.mark.slow
def test_denoise_bench_reports_steps_and_flops(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    out = tmp_path / "bench.json"
    args = parser.parse_args(
        [
            "--layers",
            "1",
            "--height",
            "32",
            "--width",
            "32",
            "--frames",
            "1",
            "--num-inference-steps",
            "3",
            "--max_sequence_length",
            "16",
            "--stages",
            "denoise",
            "--repeats",
            "2",
            "--json",
            str(out),
        ]
    )
    result = bench.run(args)
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    denoise = result["stages"]["denoise"]
    cfg = dataclasses.replace(transformer_preset("1.3B"), num_layers=1)
    step = dit_step_flops(cfg, (1, 16, 1, 4, 4), 16, context_cached=True)  # the text K/V cache read
    assert denoise["tflop"] * 1e12 == pytest.approx(step.total)
    saved = dit_step_flops(cfg, (1, 16, 1, 4, 4), 16).total - step.total
    assert denoise["text_kv"]["tflop_saved_per_step"] * 1e12 == pytest.approx(saved) and saved > 0
    assert denoise["text_kv"]["bytes"] == 2 * 1 * 2 * 16 * cfg.inner_dim * 2  # k, v; 1 layer; CFG; bf16
    assert 0 < denoise["s_per_step_median"] <= denoise["steady_median_s"]
    assert 0 < denoise["fraction_of_peak"] < 1.5 and math.isfinite(result["peak_tflops"])
    assert result["peak_memory_gib"] > 0
    table = capsys.readouterr().out
    assert "denoise" in table and "s/step" in table
    # memory: the step program's own figures (XLA's memory_analysis) beside the allocator's peak
    check_memory_report(result, json.loads(out.read_text()), table, "denoise")
    assert denoise["random_weights_s"] > 0  # auto: ~90M weights are drawn with NumPy on a CPU
    assert denoise["random_weights"] == ("numpy" if jax.default_backend() == "cpu" else "device")


def check_memory_report(result, written, table, stage):
    """Both memory figures in the result, the JSON written and the table, each named for what it is."""
    program = result["stages"][stage]["program_memory"]
    assert program["argument_bytes"] > 0 and program["temp_bytes"] > 0 and program["output_bytes"] > 0
    assert program["total_bytes"] >= program["argument_bytes"] + program["temp_bytes"]
    assert set(program) == {*measure.MEMORY_FIELDS, measure.HOST_ARGUMENT, "total_bytes"}
    allocator = result["memory"]["allocator_peak_bytes"]
    stats = jax.devices()[0].memory_stats()
    if stats is None or "peak_bytes_in_use" not in stats:  # CPU: no allocator statistics
        assert allocator is None and result["stages"][stage]["allocator_peak_bytes"] is None
        assert " n/a" in table.split("allocator peak GiB")[1]
    else:
        assert allocator > 0
    assert result["memory"]["host_peak_rss_bytes"] > 0
    assert written["stages"][stage]["program_memory"] == program
    assert written["memory"]["allocator_peak_bytes"] == allocator
    assert {"program_memory", "allocator_peak_bytes"} <= set(written["memory"]["legend"])
    assert "program GiB" in table and "memory_analysis" in table and "peak_bytes_in_use" in table


def shrink_variant(monkeypatch: pytest.MonkeyPatch, name: str, **components) -> None:
    """Registry variant ``name`` with smaller components, for this test."""
    variants = tuple(dataclasses.replace(v, **components) if v.name == name else v for v in registry.VARIANTS)
    monkeypatch.setattr(registry, "VARIANTS", variants)


# The smallest decoder with every kind of layer (conv_in, mid block with attention, a temporal
# upsampler, conv_out): the real VAE's program takes ~20 s to compile on a busy 2-core CPU.
TINY_VAE = VAEConfig(
    base_dim=4,
    dim_mult=(1, 1),
    num_res_blocks=0,
    temperal_downsample=(True,),
    scale_factor_temporal=2,
    scale_factor_spatial=2,
)


def test_decode_bench_reports_vae_flops(capsys, monkeypatch):
    """Latents [1,16,2,4,4] through the decode stage: the reference count and the (smaller) count
    of what wanjax's formulation executes."""
    shrink_variant(monkeypatch, "1.3B", vae=TINY_VAE)
    monkeypatch.setattr(bench, "device_peak", lambda dtype="bfloat16": (1e12, f"test {dtype}"))
    cfg = bench.BenchConfig(height=8, width=8, frames=5, stages=("decode",), repeats=1)  # 2 px a latent
    result = bench.run_bench(cfg)
    decode = result["stages"]["decode"]
    assert decode["tflop"] * 1e12 == pytest.approx(vae_decode_flops(TINY_VAE, (1, 16, 2, 4, 4)).total)
    assert 0 < decode["tflop_executed"] < decode["tflop"]
    assert decode["achieved_tflops"] > decode["achieved_tflops_executed"] > 0
    assert decode["fraction_of_peak"] == pytest.approx(decode["achieved_tflops"])  # peak 1 TFLOP/s
    assert result["pipeline"] == {}  # only with all three stages
    assert decode["peak_dtype"] == "float32" and set(result["peaks"]) == {"bfloat16", "float32"}
    print(bench.format_table(result))
    table = capsys.readouterr().out
    assert "wanjax's formulation executes" in table
    check_memory_report(result, json.loads(json.dumps(result)), table, "decode")


def test_pipeline_summary_adds_the_stages():
    stages = {
        "encode": {"steady_median_s": 1.0, "tflop": 2.0},
        "denoise": {"steady_median_s": 9.0, "s_per_step_median": 2.0, "tflop": 10.0},
        "decode": {"steady_median_s": 5.0, "tflop": 6.0},
    }
    p = bench.pipeline_summary(bench.BenchConfig(num_inference_steps=4), stages)
    assert p["steady_s"] == 14.0 and p["tflop"] == 48.0
    assert p["achieved_tflops"] == pytest.approx(48 / 14)
    assert p["seconds_share"] == pytest.approx({"encode": 1 / 14, "denoise": 8 / 14, "decode": 5 / 14})


def test_pipeline_fraction_of_peak_weighs_each_stage_by_its_dtype(monkeypatch):
    """bf16 stages against the bf16 peak, the float32 decode against the float32 one."""
    peaks = {"bfloat16": 4e12, "float32": 1e12}
    monkeypatch.setattr(bench, "device_peak", lambda dtype="bfloat16": (peaks[dtype], dtype))
    fake = {
        "encode": bench.StageResult(9, [1.0], Flops(2e12)),
        "denoise": bench.StageResult(9, [4.0], Flops(10e12), per_step=[2.0, 2.0]),
        "decode": bench.StageResult(9, [5.0], Flops(6e12)),
    }
    monkeypatch.setattr(bench, "STAGES", {k: (lambda cfg, r=r: r) for k, r in fake.items()})
    result = bench.run_bench(bench.BenchConfig(num_inference_steps=2))
    assert result["stages"]["decode"]["fraction_of_peak"] == pytest.approx(6e12 / 5 / 1e12)
    assert result["stages"]["denoise"]["fraction_of_peak"] == pytest.approx(10e12 / 2 / 4e12)
    pipeline = result["pipeline"]  # 1 s + 2 x 2 s at 4 TFLOP/s, 5 s at 1 TFLOP/s: 25 TFLOP possible
    assert pipeline["tflop"] == 28.0 and pipeline["fraction_of_peak"] == pytest.approx(28 / 25)
    assert pipeline["peak_dtype"] == "bfloat16+float32"
    assert "bfloat16+float32" in bench.format_table(result)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"arch": "7B"}, "unknown --arch"),
        ({"frames": 8}, r"frames 4n\+1"),
        ({"height": 100}, "multiples of 16"),
        ({"num_inference_steps": 0}, "at least 1"),
        ({"dtype": "float8"}, "float8"),
    ],
)
def test_bad_bench_config(overrides, message):
    with pytest.raises(WanjaxError, match=message):
        bench.run_bench(bench.BenchConfig(stages=("denoise",), **overrides))


@pytest.mark.slow
@pytest.mark.parametrize(("offload", "weights"), [("blocks", "int8"), ("model", "bf16")])
def test_denoise_bench_offload_and_weights_dtype(tmp_path, capsys, offload, weights):
    """``--offload`` / ``--weights_dtype`` as the pipeline runs them: the JSON records the mode, the
    step program's memory with the host-memory arguments (the streamed layers) apart, and s/step;
    int8 weights run W8A8 here (``--activations_dtype int8``), and the result says what ran."""
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    out = tmp_path / "bench.json"
    tiny = ["--layers", "2", "--height", "32", "--width", "32", "--frames", "1", "--repeats", "1"]
    activations = "int8" if weights == "int8" else "auto"
    memory = ["--offload", offload, "--weights-dtype", weights, "--activations_dtype", activations]
    args = parser.parse_args(
        [*tiny, *memory, "--max_sequence_length", "16", "--stages", "denoise", "--json", str(out)]
    )
    bench.run(args)
    written = json.loads(out.read_text())
    assert written["config"]["memory"] == {
        "offload": offload,
        "weights_dtype": weights,
        "activations_dtype": activations,
    }
    assert written["activations_dtype"] == ("int8" if weights == "int8" else "bfloat16")
    denoise = written["stages"]["denoise"]
    assert denoise["s_per_step_median"] > 0
    assert denoise["weights_to_device_s"] >= 0  # model and blocks: back from pinned host memory
    program, placed = denoise["program_memory"], denoise["weights_bytes"]
    assert program["argument_bytes"] > 0 and program["temp_bytes"] > 0
    assert program["total_bytes"] == (
        program["argument_bytes"] + program["output_bytes"] - program["alias_bytes"]
        + program["temp_bytes"] + program["generated_code_bytes"]
    )  # fmt: skip
    if offload == "blocks":  # the stacked layers are host arguments, not counted in the device total
        assert program[measure.HOST_ARGUMENT] > 0 and placed["host"] > 0
        assert program[measure.HOST_ARGUMENT] == placed["host"]
    else:
        assert program[measure.HOST_ARGUMENT] == 0 and placed["host"] == 0
    assert program["argument_bytes"] >= placed["device"]
    spec = dit.checkpoint_spec(dataclasses.replace(transformer_preset("1.3B"), num_layers=2))
    if weights == "int8":  # the matmul kernels in 1 byte: under 60% of the bf16 weights' bytes
        assert denoise["random_weights"].startswith("numpy, int8")
        bf16_bytes = sum(math.prod(x.shape) * 2 for x in jax.tree.leaves(abstract_params(spec, jnp.bfloat16)))
        assert placed["device"] + placed["host"] < 0.6 * bf16_bytes
    table = capsys.readouterr().out
    assert f"offload {offload}, weights {weights}, matmuls {written['activations_dtype']}" in table
    assert "host args GiB" in table


@pytest.mark.slow
def test_denoise_bench_with_a_step_cache(tmp_path, capsys):
    """``--cache``: the JSON holds the cache's decisions; the table the DiT evaluations per video and
    the effective seconds per step (a whole loop over its steps); no FLOP rate from skipped steps."""
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    out = tmp_path / "bench.json"
    tiny = ["--layers", "2", "--height", "32", "--width", "32", "--frames", "1", "--repeats", "1"]
    cache = ["--cache", "magcache", "--mag_ratios", "wan2.1-t2v-1.3b", "--num_inference_steps", "10"]
    bench.run(
        parser.parse_args(
            [*tiny, *cache, "--max_sequence_length", "16", "--stages", "denoise", "--json", str(out)]
        )
    )
    denoise = json.loads(out.read_text())["stages"]["denoise"]
    expected = step_cache.resolve(
        step_cache.CacheConfig("magcache", mag_ratios="wan2.1-t2v-1.3b"),
        transformer_preset("1.3B"),
        10,
        guided=True,
    )
    assert denoise["cache"]["dit_evaluations"] == 2 * int(expected.schedule[:, 0].sum()) < 20
    assert denoise["s_per_step_effective"] > 0 and "achieved_tflops" not in denoise
    assert "DiT evaluations per video (uncached 20)" in capsys.readouterr().out
    # the loop's FLOPs: whole steps where the blocks ran, the embeddings and projection where skipped
    cfg = dataclasses.replace(transformer_preset("1.3B"), num_layers=2)
    computed = int(expected.schedule[:, 0].sum())
    step = dit_step_flops(cfg, (1, 16, 1, 4, 4), 16, context_cached=True).total
    skip = dit_step_flops(cfg, (1, 16, 1, 4, 4), 16, context_cached=True, skipped_by="magcache").total
    assert 0 < skip < step / 10
    loop = computed * step + (10 - computed) * skip
    assert denoise["cache"]["tflop_per_loop"] * 1e12 == pytest.approx(loop)


@pytest.mark.parametrize(("flag", "value"), [("--offload", "disk"), ("--weights_dtype", "fp16")])
def test_bad_offload_or_weights_dtype_is_a_one_line_usage_error(capsys, flag, value):
    from wanjax.cli.main import main

    assert main(["bench", "--stages", "denoise", flag, value]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and value in err and flag.lstrip("-") in err
    field = flag.lstrip("-")
    with pytest.raises(WanjaxError, match=f"unknown {flag}"):
        bench.run_bench(bench.BenchConfig(stages=("denoise",), memory=MemoryFlags(**{field: value})))


def test_encode_bench_reports_program_memory_with_device_weights(capsys):
    """The encode stage compiles its program ahead and reports its memory; ``--random_weights
    device`` draws the weights with jax.random (and says so)."""
    cfg = bench.BenchConfig(
        layers=1, stages=("encode",), max_sequence_length=8, repeats=1, random_weights="device"
    )
    # UMT5-XXL dims with 1 layer: ~330 M weights; a smaller model keeps this test quick
    small = dataclasses.replace(UMT5_XXL, d_model=64, d_kv=16, num_heads=4, d_ff=128)
    with pytest.MonkeyPatch.context() as mp:
        shrink_variant(mp, "1.3B", text_encoder=small)
        mp.setattr(bench, "BENCH_VOCAB", 128)
        mp.setattr(bench, "device_peak", lambda dtype="bfloat16": (1e12, f"test {dtype}"))
        result = bench.run_bench(cfg)
    encode = result["stages"]["encode"]
    assert encode["random_weights"] == "device"
    assert encode["program_memory"]["argument_bytes"] > 0
    table = bench.format_table(result)
    assert "encode" in table.split("random weights drawn")[1] and "(device)" in table


def test_random_weights_choice():
    assert bench.random_weights_path("numpy") == "numpy"
    assert bench.random_weights_path("device") == "device"
    on_cpu = jax.default_backend() == "cpu"
    assert bench.random_weights_path("auto", 10**6) == ("numpy" if on_cpu else "device")
    assert bench.random_weights_path("auto", bench.CPU_DEVICE_DRAW_MIN_PARAMS) == "device"
    with pytest.raises(WanjaxError, match="random_weights"):
        bench.run_bench(bench.BenchConfig(stages=("denoise",), random_weights="gpu"))


def test_random_tensor_uses_the_shared_scale_rule():
    """NumPy's draws follow :func:`random_scale`, the rule the device path uses too."""
    rng = np.random.default_rng(0)
    for name, shape in [("a.norm1.weight", (64,)), ("x.bias", (64,)), ("p.weight", (32, 64, 3)),
                        ("shared.weight", (64, 8)), ("blocks.0.scale_shift_table", (1, 6, 64))]:  # fmt: skip
        scale, offset = random_scale(name, shape)
        expected = np.random.default_rng(1).standard_normal(shape, dtype=np.float32) * np.float32(scale)
        drawn = random_tensor(name, shape, np.random.default_rng(1))
        np.testing.assert_allclose(drawn, expected + offset, rtol=1e-6)
        assert random_tensor(name, shape, rng).dtype == np.float32
    assert random_scale("p.weight", (32, 64, 3)) == pytest.approx((1 / np.sqrt(192), 0.0))
    assert random_scale("norm_out.gamma", (8, 1, 1, 1)) == (0.1, 1.0)


def _same_layout(host, device):
    flat_h, tree_h = jax.tree.flatten(host)
    flat_d, tree_d = jax.tree.flatten(device)
    assert tree_h == tree_d
    for h, d in zip(flat_h, flat_d, strict=True):
        assert (h.shape, h.dtype, h.sharding) == (d.shape, d.dtype, d.sharding)


SMALL_UMT5 = dataclasses.replace(
    UMT5_XXL, d_model=32, d_kv=8, num_heads=4, d_ff=64, num_layers=2, vocab_size=64
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("spec", "dtype"),
    [
        (dit.checkpoint_spec(transformer_preset("tiny")), jnp.bfloat16),  # keep_fp32 leaves stay float32
        (umt5.checkpoint_spec(SMALL_UMT5), jnp.float32),
    ],
    ids=["dit", "umt5"],
)
def test_device_random_params_match_host_layout(spec, dtype):
    _same_layout(random_params(spec, dtype), random_params_on_device(spec, dtype))


def test_device_random_params_scale():
    """Norm scales near 1, small biases, linear weights of std 1/sqrt(fan_in) (the checkpoint's
    ``in`` axis, whatever our layout), every layer of a stacked leaf drawn apart."""
    spec = {
        "q": stacked("blocks.{i}.attn1.to_q.weight", 3, (256, 1024), layout=linear_kernel, axes=REPLICATED),
        "norm": LeafSource(("blocks.norm2.weight",), (4096,), axes=REPLICATED),
        "bias": LeafSource(("proj.bias",), (4096,), axes=REPLICATED),
        "table": LeafSource(("scale_shift_table",), (1, 2, 4096), keep_fp32=True, axes=REPLICATED),
    }
    params = random_params_on_device(spec, jnp.bfloat16, seed=3)
    q = np.asarray(params["q"], np.float32)
    assert q.shape == (3, 1024, 256)
    assert np.std(q) == pytest.approx(1 / np.sqrt(1024), rel=0.1) and abs(np.mean(q)) < 1e-3
    assert not np.array_equal(q[0], q[1])
    norm = np.asarray(params["norm"], np.float32)
    assert np.mean(norm) == pytest.approx(1.0, abs=0.01) and np.std(norm) == pytest.approx(0.1, rel=0.1)
    assert np.std(np.asarray(params["bias"], np.float32)) == pytest.approx(0.02, rel=0.1)
    assert params["table"].dtype == jnp.float32
    assert np.std(np.asarray(params["table"])) == pytest.approx(1 / 64, rel=0.1)
    again = random_params_on_device(spec, jnp.bfloat16, seed=3)
    assert np.array_equal(np.asarray(again["q"], np.float32), q)  # a seed gives the same weights
    other = random_params_on_device(spec, jnp.bfloat16, seed=4)
    assert not np.array_equal(np.asarray(other["q"], np.float32), q)


def test_device_random_params_on_an_8_device_mesh():
    """dp=2 x tp=4 with FSDP: every leaf in the sharding the host path gives it, drawn in place."""
    from wanjax.parallel.mesh import make_mesh, parse_mesh
    from wanjax.parallel.rules import param_sharding

    assert len(jax.devices()) == 8
    mesh = make_mesh(parse_mesh("dp=2,tp=4", fsdp=True))
    sharding = param_sharding(mesh, fsdp=True)
    spec = {  # a DiT block's kinds of leaves: stacked linear kernels, vectors, a replicated bias
        "q": stacked(
            "blocks.{i}.attn1.to_q.weight",
            2,
            (64, 32),
            layout=linear_kernel,
            axes=("layers", "embed", "heads"),
        ),
        "ffn": stacked("blocks.{i}.ffn.net.0.proj.bias", 2, (128,), axes=("layers", "mlp")),
        "bias": LeafSource(("proj_out.bias",), (16,), axes=REPLICATED),
    }
    host = jax.tree.leaves(random_params(spec, np.float32, sharding=sharding))
    device = jax.tree.leaves(random_params_on_device(spec, np.float32, sharding=sharding))
    for h, d in zip(host, device, strict=True):
        assert (h.shape, h.dtype, h.sharding) == (d.shape, d.dtype, d.sharding)
    assert sum(not d.sharding.is_fully_replicated for d in device) == 2  # the stacked leaves really are split
    one_device = jax.tree.leaves(random_params_on_device(spec, np.float32))  # threefry: sharding-free draws
    for a, b in zip(device, one_device, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_image_to_video_arch_times_the_image_stage_and_joins_the_image_tokens(monkeypatch):
    """``--arch I2V-14B`` (its transformer shrunk here): the image stage (CLIP, the VAE encode) runs,
    and the denoise FLOPs count the CLIP ViT-H/14 tokens; a text-to-video arch skips the image stage."""
    small = dataclasses.replace(
        transformer_preset("tiny"), in_channels=36, image_dim=CLIP_VIT_H_14.hidden_size, added_kv_proj_dim=24
    )
    shrink_variant(monkeypatch, "I2V-14B", transformer=small)
    sizes = dict(height=32, width=32, frames=5, max_sequence_length=8, repeats=1, random_weights="numpy")
    cfg = bench.BenchConfig(arch="I2V-14B", layers=2, stages=("image", "denoise"), **sizes)
    result = bench.run_bench(cfg)
    assert list(result["stages"]) == ["image", "denoise"]
    image = result["stages"]["image"]
    assert image["tflop_clip"] > 0 and "tflop" not in image and image["program_memory"]["total_bytes"] > 0
    tokens = CLIP_VIT_H_14.num_positions
    expected = dit_step_flops(
        small, cfg.latent_shape(), 8, guidance=True, image_len=tokens, context_cached=True
    )
    assert result["stages"]["denoise"]["tflop"] == pytest.approx(expected.total / 1e12)
    plain = bench.run_bench(dataclasses.replace(cfg, arch="1.3B", layers=1, stages=("image",)))
    assert plain["stages"] == {}


@pytest.mark.slow
def test_two_expert_arch_draws_both_experts_and_caches_per_expert(monkeypatch):
    """``--arch A14B`` (shrunk here): two experts' weights, both run (their boundary falls between the
    two steps); under either step cache each expert's first step computes."""
    shrink_variant(monkeypatch, "A14B", transformer=transformer_preset("tiny"))
    sizes = dict(height=32, width=32, frames=5, max_sequence_length=8, repeats=1, random_weights="numpy")
    cfg = bench.BenchConfig(arch="A14B", stages=("denoise",), **sizes)
    result = bench.run_bench(cfg)
    single = dit.checkpoint_spec(transformer_preset("tiny"))
    expected = 2 * sum(
        a.size * a.dtype.itemsize for a in jax.tree.leaves(abstract_params(single, "bfloat16"))
    )
    assert result["stages"]["denoise"]["weights_bytes"]["device"] == expected
    assert result["stages"]["denoise"]["expert_steps"] == [0, 1]  # timesteps 999 | 500, boundary 875
    firstblock = dataclasses.replace(cfg, cache=CacheFlags(cache="firstblock"))
    cached = bench.run_bench(firstblock)["stages"]["denoise"]["cache"]
    assert cached["policy"] == "firstblock" and cached["branches"]["cond"]["evaluated_steps"] == 2
    magcache = CacheFlags(cache="magcache", mag_ratios="wan2.2-t2v-a14b", cache_retention=0.0)
    mag = dataclasses.replace(cfg, cache=magcache)
    cached = bench.run_bench(mag)["stages"]["denoise"]["cache"]
    assert cached["mag_ratios"].startswith("preset wan2.2-t2v-a14b") and cached["dit_evaluations"] == 4


@pytest.mark.slow
def test_ti2v_arch_encodes_the_image_alone_and_denoises_with_it_as_frame_0(monkeypatch):
    """``--arch 5B`` (shrunk here, with a narrow Wan 2.2 VAE): the image stage VAE-encodes one frame,
    the denoise stage runs with the image's latents as frame 0 (timesteps per latent frame)."""
    small = dataclasses.replace(
        transformer_preset("tiny"), in_channels=DEMO_VAE22.z_dim, out_channels=DEMO_VAE22.z_dim
    )
    shrink_variant(monkeypatch, "5B", transformer=small, vae=DEMO_VAE22)
    sizes = dict(height=32, width=64, frames=5, max_sequence_length=8, repeats=1, random_weights="numpy")
    result = bench.run_bench(bench.BenchConfig(arch="5B", stages=("image", "denoise"), **sizes))
    assert list(result["stages"]) == ["image", "denoise"]
    assert result["stages"]["image"]["tflop_clip"] == 0  # no CLIP: the VAE encode alone
    assert result["stages"]["denoise"]["program_memory"]["total_bytes"] > 0
    assert result["config"]["arch"] == "5B"


@pytest.mark.slow
def test_a_bench_that_cannot_fit_is_refused_naming_the_layers_that_would(monkeypatch):
    """The 14B's denoise stage (27 GiB of weights, 0.8 GiB of text K/V cache and its activations) on
    a machine with 24 GiB free: refused before any
    weight is drawn, with the most ``--layers`` whose stage plan says fits."""
    from wanjax.planning import device_memory
    from wanjax.planning.plan import HEADROOM
    from wanjax.tools import bench_memory

    monkeypatch.setattr(device_memory, "host_available", lambda: 24 << 30)
    cfg = bench.BenchConfig(arch="14B")
    with pytest.raises(WanjaxError) as refused:
        bench.run_bench(cfg)
    message = str(refused.value)
    assert "the denoise stage needs about 28" in message and "24.0 GiB available" in message
    layers = int(message.rsplit("--layers ", 1)[1])
    needs = [
        bench_memory.stage_needs(dataclasses.replace(cfg, layers=n))["denoise"] for n in (layers, layers + 1)
    ]
    assert needs[0] <= HEADROOM * (24 << 30) < needs[1]
    bench.run_bench(dataclasses.replace(cfg, stages=("decode",), height=32, width=32, frames=1, repeats=1))


@pytest.mark.slow
def test_the_bench_cli_refuses_in_one_line_and_writes_nothing(tmp_path):
    """Through the real command: exit 2, one line, no JSON (A14B's two experts: 54 GiB)."""
    import subprocess
    import sys

    from wanjax.planning.device_memory import host_available

    if (host_available() or 0) > 50 << 30:
        pytest.skip("this machine has the memory to run it")
    out = tmp_path / "bench.json"
    args = [sys.executable, "-m", "wanjax.cli", "bench", "--arch", "A14B", "--json", str(out)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "the denoise stage needs about 5" in lines[0] and "--layers" in lines[0]
    assert not out.exists()


@pytest.mark.slow
def test_a_vace_arch_runs_its_control_blocks_and_counts_them():
    """``--arch VACE-1.3B --layers 2``: the first layer's control block with it (random control
    latents), its FLOPs in the count."""
    cfg = bench.BenchConfig(
        arch="VACE-1.3B", layers=2, height=32, width=32, frames=1, stages=("denoise",), repeats=1,
        num_inference_steps=2, max_sequence_length=16,
    )  # fmt: skip
    assert cfg.transformer_config().vace_layers == (0,)
    denoise = bench.run_bench(cfg)["stages"]["denoise"]
    expected = dit_step_flops(cfg.transformer_config(), (1, 16, 1, 4, 4), 16, context_cached=True).total
    plain = dit_step_flops(
        dataclasses.replace(transformer_preset("1.3B"), num_layers=2),
        (1, 16, 1, 4, 4),
        16,
        context_cached=True,
    )
    assert denoise["tflop"] * 1e12 == pytest.approx(expected) and expected > plain.total
