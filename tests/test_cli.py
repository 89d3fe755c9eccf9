"""The command line: the demo runs end to end; user mistakes give one line and exit code 2."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
from safetensors.numpy import load_file


def run(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "wanjax.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def test_demo_writes_latents_and_model(tmp_path):
    result = run(
        "demo",
        "--output_dir",
        str(tmp_path),
        "--num_inference_steps",
        "3",
        "--frames",
        "5",
        "--height",
        "32",
        "--width",
        "48",
    )
    assert result.returncode == 0, result.stderr
    latents = load_file(tmp_path / "latents.safetensors")["latents"]
    assert latents.shape == (1, 16, 2, 4, 6) and np.isfinite(latents).all()
    assert "steady" in result.stdout
    assert not list(tmp_path.glob("*.tmp"))
    info = run("info", str(tmp_path / "model"))
    assert info.returncode == 0, info.stderr
    assert "WanTransformer3DModel" in info.stdout and "tensors" in info.stdout


def test_info_reads_a_diffusers_saved_model(tiny_transformer_dir):
    root, _ = tiny_transformer_dir
    result = run("info", str(root / "transformer"))
    assert result.returncode == 0, result.stderr
    assert "num_layers=2" in result.stdout


def one_line_error(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in lines[0]


def test_missing_model_path(tmp_path):
    one_line_error(run("info", str(tmp_path / "missing")), "does not exist")


def test_demo_bad_frames(tmp_path):
    one_line_error(run("demo", "--output_dir", str(tmp_path), "--frames", "10"), "4n+1", "9 or 13")
    assert not (tmp_path / "latents.safetensors").exists()


def test_demo_bad_size(tmp_path):
    one_line_error(run("demo", "--output_dir", str(tmp_path), "--height", "70"), "multiples of 16")


def test_demo_bad_dtype(tmp_path):
    one_line_error(run("demo", "--output_dir", str(tmp_path), "--dtype", "float8"), "unknown dtype")
