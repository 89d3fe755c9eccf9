"""``wanjax bench`` on a shortened 1.3B architecture: the report's fields, FLOPs and errors."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math

import pytest

from wanjax.errors import WanjaxError
from wanjax.models.config import PRESETS
from wanjax.models.vae.config import VAEConfig
from wanjax.tools import bench
from wanjax.tools.flops import Flops, dit_step_flops, vae_decode_flops


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
    cfg = dataclasses.replace(PRESETS["1.3B"], num_layers=1)
    assert denoise["tflop"] * 1e12 == pytest.approx(dit_step_flops(cfg, (1, 16, 1, 4, 4), 16).total)
    assert 0 < denoise["s_per_step_median"] <= denoise["steady_median_s"]
    assert 0 < denoise["fraction_of_peak"] < 1.5 and math.isfinite(result["peak_tflops"])
    assert result["peak_memory_gib"] > 0
    table = capsys.readouterr().out
    assert "denoise" in table and "s/step" in table


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
    monkeypatch.setattr(bench, "VAEConfig", lambda: TINY_VAE)
    monkeypatch.setattr(bench, "device_peak", lambda dtype="bfloat16": (1e12, f"test {dtype}"))
    cfg = bench.BenchConfig(height=32, width=32, frames=5, stages=("decode",), repeats=1)
    result = bench.run_bench(cfg)
    decode = result["stages"]["decode"]
    assert decode["tflop"] * 1e12 == pytest.approx(vae_decode_flops(TINY_VAE, (1, 16, 2, 4, 4)).total)
    assert 0 < decode["tflop_executed"] < decode["tflop"]
    assert decode["achieved_tflops"] > decode["achieved_tflops_executed"] > 0
    assert decode["fraction_of_peak"] == pytest.approx(decode["achieved_tflops"])  # peak 1 TFLOP/s
    assert result["pipeline"] == {}  # only with all three stages
    assert decode["peak_dtype"] == "float32" and set(result["peaks"]) == {"bfloat16", "float32"}
    print(bench.format_table(result))
    assert "wanjax's formulation executes" in capsys.readouterr().out


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
