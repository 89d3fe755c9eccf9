"""``wanjax bench`` on a shortened 1.3B architecture: the report's fields, FLOPs and errors."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math

import pytest

from wanjax import bench
from wanjax.config import PRESETS
from wanjax.errors import WanjaxError
from wanjax.flops import dit_step_flops


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
