"""What a new user meets on the command line (issue 36), through the real ``wanjax`` process: each
mistake exits 2 with one line naming the problem and the fix, before any work, and writes nothing;
Ctrl-C and SIGTERM end a run at any moment with one line."""

from __future__ import annotations

import os
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
