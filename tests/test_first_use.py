"""What a new user meets on the command line (issue 36), through the real ``wanjax`` process: each
mistake exits 2 with one line naming the problem and the fix, before any work, and writes nothing;
Ctrl-C and SIGTERM end a run at any moment with one line."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from wanjax.cli.main import subcommands

GENERATE = ("generate", "--model", "demo", "--output_video", "out/v.mp4")

# name: (arguments, what the one line says)
MISTAKES = {
    "unquoted prompt": (
        ("generate", "--model", "demo", "--prompt", "A", "cat", "walks", "--output_video", "out/v.mp4"),
        ('unrecognized arguments: cat walks; quote a value with spaces: --prompt "A cat walks"',),
    ),
    "flag typo": ((*GENERATE, "--promt", "a cat"), ("--promt", "did you mean --prompt?")),
    "lora weight": (
        (*GENERATE, "--prompt", "a cat", "--lora", "style.safetensors:abc"),
        ("--lora style.safetensors:abc: the weight after ':' must be a number, e.g. style.safetensors:0.8",),
    ),
    "seed range": (
        (*GENERATE, "--prompt", "a cat", "--seed", "18446744073709551615"),
        ("--seed must be an integer from 0 to 2**63-1 (9223372036854775807)",),
    ),
    "text length": (
        (*GENERATE, "--prompt", "a cat", "--max_sequence_length", "100000"),
        ("--max_sequence_length must be 1 to 512 (the text tokens Wan was trained on), got 100000",),
    ),
    "bench layers": (
        ("bench", "--layers", "0"),
        ("--layers must be at least 1 (leave it out for all layers), got 0",),
    ),
    "unwritable output": (
        ("generate", "--model", "demo", "--prompt", "a cat", "--output_video", "/proc/nope/v.mp4"),
        ("--output_video /proc/nope/v.mp4: cannot create /proc/nope",),
    ),
}


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "wanjax.cli", *args]


def _env(cache: Path) -> dict[str, str]:
    return {**os.environ, "JAX_PLATFORMS": "cpu", "WANJAX_CACHE": str(cache)}


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def mistakes(tmp_path_factory, demo_env) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """Every case of :data:`MISTAKES` run at once (each in its own empty folder): its process and folder."""
    started = {}
    for name, (args, _) in MISTAKES.items():
        cwd = tmp_path_factory.mktemp(name.replace(" ", "_"))
        proc = subprocess.Popen(
            _command(*args),
            cwd=cwd,
            env=_env(demo_env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started[name] = (proc, cwd)
    done = {}
    for name, (proc, cwd) in started.items():
        out, err = proc.communicate(timeout=300)
        done[name] = (subprocess.CompletedProcess(proc.args, proc.returncode, out, err), cwd)
    return done


@pytest.mark.parametrize("name", list(MISTAKES))
def test_a_mistake_is_one_line_exit_2_and_nothing_written(mistakes, name):
    result, cwd = mistakes[name]
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, (result.returncode, result.stderr)
    assert lines[0].startswith(("wanjax: error: ", "wanjax generate: error: ")), lines[0]
    for needle in MISTAKES[name][1]:
        assert needle in lines[0], lines[0]
    assert result.stdout == "" and _files(cwd) == []


def test_wanjax_alone_lists_every_subcommand_with_its_line(tmp_path):
    result = subprocess.run(_command(), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    listed = {line.split()[0]: line for line in result.stderr.splitlines()[1:]}
    assert list(listed) == list(subcommands())
    for name, command in subcommands().items():
        assert listed[name].endswith(command.help)


@pytest.mark.parametrize(
    "sig, code, words",
    [
        (signal.SIGINT, 130, "wanjax: interrupted (no partial output files were left)"),
        (signal.SIGTERM, 143, "wanjax: terminated by SIGTERM (no partial output files were left)"),
    ],
)
@pytest.mark.parametrize("after", [0.3, 2.5])  # while jax is imported; while the run goes
def test_ctrl_c_and_sigterm_end_a_run_with_one_line(demo_env, tmp_path, sig, code, words, after):
    # Ctrl-C as a terminal delivers it, even when the suite runs in the background: a background
    # job ignores SIGINT and its children inherit that; a handled signal is reset to the default
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(
            _command(*GENERATE, "--prompt", "a cat", "--num_inference_steps", "30"),
            cwd=tmp_path,
            env=_env(demo_env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    time.sleep(after)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code and err.strip() == words, (proc.returncode, err)
    assert _files(tmp_path) == []


def _corrupt_largest_tensor(weights: Path) -> str:
    """0xFF over 64 bytes inside the data of the file's largest float tensor (the header intact):
    NaNs, as a damaged download gives. The tensor's name."""
    raw = weights.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + size])
    name, entry = max(
        ((k, v) for k, v in header.items() if k != "__metadata__" and v["dtype"].startswith(("F", "BF"))),
        key=lambda kv: kv[1]["data_offsets"][1] - kv[1]["data_offsets"][0],
    )
    start, end = (8 + size + o for o in entry["data_offsets"])
    at = (start + end) // 2 // 4 * 4
    weights.write_bytes(raw[:at] + b"\xff" * 64 + raw[at + 64 :])
    return name


@pytest.mark.parametrize(
    "model, component",
    [
        ("demo", "text_encoder"),
        pytest.param("demo", "transformer", marks=pytest.mark.slow),
        pytest.param("demo", "vae", marks=pytest.mark.slow),  # its decoder: read after denoising
        pytest.param("demo-i2v", "image_encoder", marks=pytest.mark.slow),
    ],
)
def test_a_corrupted_weight_is_named_exit_1_and_no_video(demo_env, tmp_path, model, component):
    from wanjax.pipeline.hub import resolve_model

    root = tmp_path / "model"
    shutil.copytree(resolve_model(model).path, root)
    (weights,) = (root / component).glob("*.safetensors")
    _corrupt_largest_tensor(weights)
    out = tmp_path / "out"
    image = ("--image", _image(tmp_path)) if model == "demo-i2v" else ()
    args = (
        "generate",
        "--model",
        str(root),
        "--prompt",
        "a cat",
        "--output_video",
        str(out / "v.mp4"),
        *image,
    )
    result = subprocess.run(
        _command(*args, "--num_inference_steps", "1", "--height", "32", "--width", "48", "--frames", "5"),
        env=_env(demo_env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, (result.returncode, result.stderr)
    assert (
        lines[0].startswith(f"wanjax: error: {root / component}")
        and "NaN or inf in the weights of" in lines[0]
    )
    assert "download it again" in lines[0]
    assert not out.exists() or _files(out) == []


def _image(folder: Path) -> str:
    from PIL import Image

    path = folder / "first.png"
    Image.new("RGB", (48, 32), (200, 120, 40)).save(path)
    return str(path)
