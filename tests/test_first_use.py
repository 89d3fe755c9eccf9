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
from wanjax.cli.signals import STOPPED

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


# Python imports this before the console script runs: it sends the signal to its own process when the
# module named in WANJAX_TEST_SIGNAL_AT starts loading (as a Ctrl-C at exactly that moment would).
SIGNAL_AT_IMPORT = """
import os, signal, sys


class SignalAtImport:
    def find_spec(self, name, path=None, target=None):
        if name == os.environ["WANJAX_TEST_SIGNAL_AT"]:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), int(os.environ["WANJAX_TEST_SIGNAL"]))
        return None


sys.meta_path.insert(0, SignalAtImport())
"""


@pytest.mark.parametrize(
    "module, sig, code",
    [("wanjax.cli.main", signal.SIGINT, 130), ("jax", signal.SIGTERM, 143), ("jax", signal.SIGINT, 130)],
)
def test_a_signal_while_the_command_line_loads_is_one_line(demo_env, tmp_path, module, sig, code):
    """From the console script's first module on: the command line's own modules (before its
    handlers were in place, a KeyboardInterrupt traceback), then JAX's."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SIGNAL_AT_IMPORT)
    env = {**_env(demo_env), "PYTHONPATH": str(hook), "WANJAX_TEST_SIGNAL_AT": module}
    env["WANJAX_TEST_SIGNAL"] = str(int(sig))
    run = tmp_path / "run"
    run.mkdir()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in the test below
    try:
        result = subprocess.run(
            _command(*GENERATE, "--prompt", "a cat"), cwd=run, env=env, capture_output=True, text=True
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    assert (result.returncode, result.stdout) == (code, ""), result.stderr
    assert result.stderr.strip() == STOPPED[sig][1]
    assert _files(run) == []


@pytest.mark.parametrize(
    "sig, code, words",
    [
        (signal.SIGINT, 130, "wanjax: interrupted (no partial output files were left)"),
        (signal.SIGTERM, 143, "wanjax: terminated by SIGTERM (no partial output files were left)"),
    ],
)
# while jax is imported; while the run goes (slow: waits 2.5 s)
@pytest.mark.parametrize("after", [0.3, pytest.param(2.5, marks=pytest.mark.slow)])
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
    line = _failure_line(
        _command(*args, "--num_inference_steps", "1", "--height", "32", "--width", "48", "--frames", "5"),
        _env(demo_env),
    )
    assert line.startswith(f"wanjax: error: {root / component}") and "NaN or inf in the weights of" in line
    assert "download it again" in line
    assert not out.exists() or _files(out) == []


def _failure_line(args: list[str], env: dict[str, str]) -> str:
    """The one line of stderr of ``args``, run to a failure while running (exit 1)."""
    result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, (result.returncode, result.stderr)
    return lines[0]


def _stage_dir(folder: Path, latents) -> Path:
    """A stage directory holding ``latents`` as the demo model's denoised latents."""
    from wanjax.pipeline import stages

    stages.save_latents(folder / stages.LATENTS_FILE, latents)
    stages.write_config(folder, stages.record_stage({}, "denoise", {"model": "demo", "seed": 1}))
    return folder


def _image(folder: Path) -> str:
    from PIL import Image

    path = folder / "first.png"
    Image.new("RGB", (48, 32), (200, 120, 40)).save(path)
    return str(path)


@pytest.mark.slow
def test_frames_the_decoder_made_non_finite_exit_1_and_no_video(demo_env, tmp_path):
    """Finite latents the VAE overflows on (float32 noise times 3e37): the frames are checked before
    the uint8 cast, which would hide the NaNs, so the run ends with one line and writes nothing."""
    import numpy as np

    latents = 3e37 * np.random.default_rng(0).standard_normal((1, 16, 2, 16, 24), np.float32)
    d = _stage_dir(tmp_path / "stages", latents)
    out = tmp_path / "out"
    line = _failure_line(
        _command("decode", "--input_dir", str(d), "--output_video", str(out / "v.mp4")), _env(demo_env)
    )
    assert "the VAE decoded" in line and "value(s) of 368640 (float32 activations)" in line
    assert "check the VAE weights" in line
    assert not out.exists() or _files(out) == []


def test_an_empty_prompt_and_a_misspelt_negative_name_warn_in_one_line_each(demo_env, tmp_path):
    """Accepted as diffusers accepts them (exit 0, the stage written), each with its own warning line."""
    out = tmp_path / "enc"
    args = (
        "encode",
        "--model",
        "demo",
        "--prompt",
        "",
        "--negative_prompt",
        "officail",
        "--output_dir",
        str(out),
    )
    result = subprocess.run(_command(*args), env=_env(demo_env), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"wanjax: warning: {UNCONDITIONED}",
        "wanjax: warning: --negative_prompt 'officail' is used as the text itself; "
        "did you mean the named prompt 'official'?",
    ]
    assert (out / "stage1_embeddings.safetensors").is_file()


UNCONDITIONED = (
    "--prompt is empty: the video will be unconditioned (it follows no text; diffusers allows it); "
    'give --prompt "what it shows"'
)


def test_an_empty_prompt_on_a_text_to_video_model_warns_unless_quiet(demo_env, tmp_path):
    """``generate --prompt ""`` runs (exit 0, the video written) with one warning line that the video
    is unconditioned; ``--quiet`` runs it without a word."""
    started = {}
    for quiet in ((), ("--quiet",)):
        out = tmp_path / f"quiet{len(quiet)}" / "v.mp4"
        args = ("generate", "--model", "demo", "--prompt", "", "--output_video", str(out), *quiet)
        small = ("--num_inference_steps", "1", "--frames", "5", "--height", "32", "--width", "48")
        proc = subprocess.Popen(
            _command(*args, *small),
            env=_env(demo_env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started[quiet] = (proc, out)
    for quiet, (proc, out) in started.items():
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert err.strip().splitlines() == ([] if quiet else [f"wanjax: warning: {UNCONDITIONED}"])
        assert out.is_file()


def _run_in_terminal(args: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str]:
    """``args`` run with a pseudo-terminal as stdin, stdout and stderr: exit code and what it showed."""
    import pty

    leader, follower = pty.openpty()
    proc = subprocess.Popen(args, env=env, cwd=cwd, stdin=follower, stdout=follower, stderr=follower)
    os.close(follower)
    shown = bytearray()
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    return proc.wait(timeout=300), _kept(shown.decode().replace("\r\n", "\n"))


def _kept(shown: str) -> str:
    """What stays on a terminal of ``shown``: a silent stage's word (rewritten in place while a stage is
    silent, then erased or overwritten) left out; a count's rewrites kept, each after its ``\\r``."""
    lines = []
    for line in shown.split("\n"):
        parts = [p for p in line.replace("\r\x1b[K", "\r").split("\r") if p and "still running" not in p]
        lines.append(
            "".join(f"\r{p}" for p in parts) if any(p.endswith("\x1b[K") for p in parts) else "".join(parts)
        )
    return "\n".join(lines)


def _counted(shown: str) -> str:
    """A count rewritten in place (``[t] stage: unit i/n, rate, ETA``) without its time and rate."""
    return shown.split("] ", 1)[1].split(",")[0].split("\x1b")[0]


@pytest.mark.slow
def test_a_terminal_shows_the_stages_as_they_start_and_a_pipe_only_the_table(demo_env, tmp_path):
    args = (
        *GENERATE[:3],
        "--prompt",
        "a cat",
        "--height",
        "32",
        "--width",
        "48",
        "--num_inference_steps",
        "3",
    )
    terminal, piped = tmp_path / "terminal", tmp_path / "piped"
    for folder in (terminal, piped):
        folder.mkdir()
    code, shown = _run_in_terminal(_command(*args, "--output_video", "v.mp4"), _env(demo_env), terminal)
    result = subprocess.run(
        _command(*args, "--output_video", "v.mp4"),
        cwd=piped,
        env=_env(demo_env),
        capture_output=True,
        text=True,
    )
    assert code == 0 and result.returncode == 0, (shown, result.stderr)
    lines = shown.split("\n")  # not splitlines: the step count's carriage returns stay in its line
    assert lines[0] == "wanjax generate: model demo, 1 video of 17 frames 48x32, 3 steps"
    starts = [line.split("] ", 1)[1].split(":")[0] for line in lines if line.startswith("[")]
    assert starts == ["encode", "denoise", "decode", "write"], lines
    (counted,) = [line for line in lines if "denoise: step" in line]  # rewritten in place, with an ETA
    assert [c.split("] ")[1][:17] for c in counted.split("\r")[1:]] == [
        f"denoise: step {i}/3" for i in (1, 2, 3)
    ]
    assert counted.endswith("s/step, about 0.0 s left\x1b[K"), counted
    (decoded,) = [line for line in lines if "decode: latent frame" in line]  # 17 frames: 5 latent frames
    assert [_counted(c) for c in decoded.split("\r")[1:]] == [
        f"decode: latent frame {i}/5" for i in range(1, 6)
    ]
    assert (
        lines.index(counted) == 3
        and lines.index(decoded) == 5
        and lines[7] == "wanjax generate: model demo (smoke model: tiny random weights)"
    )
    table = result.stdout.split("\n")  # piped: the final table alone
    assert result.stderr == "" and table[0] == lines[7] and table[1] == lines[8]
    assert not any(line.startswith("[") for line in table) and "denoise: step" not in result.stdout


@pytest.mark.slow
def test_a_long_video_on_a_terminal_says_its_frames_and_counts_each_clip(demo_env, tmp_path):
    """``--clips 2``: the header the whole video's (29 frames, 2 clips), a line per clip and its steps."""
    args = (
        "generate",
        "--model",
        "demo-vace",
        "--prompt",
        "a cat",
        "--clips",
        "2",
        "--height",
        "32",
        "--width",
        "48",
    )
    code, shown = _run_in_terminal(
        _command(*args, "--num_inference_steps", "2", "--output_video", "v.mp4"), _env(demo_env), tmp_path
    )
    assert code == 0, shown
    lines = shown.split("\n")
    assert lines[0] == (
        "wanjax generate: model demo-vace, 1 video of 29 frames 48x32, 2 steps per clip, in 2 clips of 17 "
        "frames (5 shared with the one before)"
    ), lines
    starts = [line.split("] ", 1)[1].split(":")[0] for line in lines if line.startswith("[")]
    assert starts == ["clip 1/2", "denoise", "decode", "clip 2/2", "denoise", "decode", "write"], lines
    counted = [[_counted(c) for c in line.split("\r")[1:]] for line in lines if "denoise: step" in line]
    assert counted == [["denoise: step 1/2", "denoise: step 2/2"]] * 2, lines


@pytest.mark.slow
def test_encode_on_a_terminal_says_what_it_encodes(demo_env, tmp_path):
    """The header, then a line as each part starts: the text, the video to re-make, the files."""
    import numpy as np

    from wanjax.io.video import write_mp4

    write_mp4(np.full((9, 32, 48, 3), 90, np.uint8), tmp_path / "clip.mp4")
    args = ("encode", "--model", "demo", "--prompt", "a cat", "--video", "clip.mp4", "--output_dir", "st")
    code, shown = _run_in_terminal(_command(*args), _env(demo_env), tmp_path)
    assert code == 0, shown
    lines = shown.split("\n")
    assert lines[0] == "wanjax encode: model demo, 1 prompt, a video to re-make", lines
    starts = [line.split("] ", 1)[1] for line in lines if line.startswith("[")]
    assert starts == [
        "encode: the text encoder (loaded and compiled on first use)",
        "video: the video to re-make: the VAE encoder",
        "write: the stage files",
    ], lines


@pytest.mark.slow
def test_bench_on_a_terminal_announces_its_shape_and_each_stage(tmp_path):
    args = ["bench", "--arch", "1.3B", "--layers", "1", "--height", "32", "--width", "32", "--frames", "1"]
    args += ["--stages", "denoise", "decode", "--repeats", "1"]
    code, shown = _run_in_terminal(_command(*args), {**os.environ, "JAX_PLATFORMS": "cpu"}, tmp_path)
    assert code == 0, shown
    lines = shown.split("\n")
    assert lines[0] == "wanjax bench: --arch 1.3B (1 layer), 1 frames 32x32, 1 timed runs", lines
    starts = [line.split("] ", 1)[1] for line in lines if line.startswith("[")]
    assert starts == [
        "denoise: the transformer: random weights drawn, compiled, timed, 2 steps",
        "decode: the VAE decoder: random weights drawn, compiled, timed",
    ], lines


def test_status_lines_count_the_steps_with_an_eta_and_stay_silent_when_disabled():
    import io

    from wanjax.jobs.status import Status

    ticks = iter([0.0, 0.5, 2.0, 12.0, 13.0, 14.0, 15.0, 20.0, 22.5, 25.0, 26.0])
    out = io.StringIO()
    status = Status("generate", 3, out, clock=lambda: next(ticks), frames=3)
    status.header("model demo")
    for stage, done in [("encode", 0), ("denoise", 0), ("denoise", 1), ("denoise", 2), ("denoise", 3)]:
        status(stage, done)
    for done in (3, 1, 2, 3):  # the stage's start (with the steps run), then the latent frames decoded
        status("decode", done)  # the first alone: it and the part after it compile, then the ETA
    status("write", 0)
    assert out.getvalue().split("\n") == [
        "wanjax generate: model demo",
        "[   0.5 s] encode: the text encoder (loaded and compiled on first use)",
        "[   2.0 s] denoise: the transformer, 3 steps",
        "\r[  12.0 s] denoise: step 1/3\x1b[K"
        "\r[  13.0 s] denoise: step 2/3, 1.000 s/step, about 1.0 s left\x1b[K"
        "\r[  14.0 s] denoise: step 3/3, 1.000 s/step, about 0.0 s left\x1b[K",
        "[  15.0 s] decode: the VAE decoder (loaded and compiled on first use)",
        "\r[  20.0 s] decode: latent frame 1/3\x1b[K"
        "\r[  22.5 s] decode: latent frame 2/3\x1b[K"
        "\r[  25.0 s] decode: latent frame 3/3, 2.500 s/latent frame, about 0.0 s left\x1b[K",
        "[  26.0 s] write: the outputs",
        "",
    ]
    silent = io.StringIO()
    quiet = Status("generate", 3, silent, mode=None)
    quiet.header("model demo")
    quiet("encode", 0)
    assert silent.getvalue() == ""


def test_piped_status_prints_whole_lines_a_count_at_most_every_30_s():
    import io

    from wanjax.jobs.status import Status

    ticks = iter([0.0, 1.0, 2.0, 10.0, 20.0, 45.0, 50.0, 60.0])
    out = io.StringIO()
    status = Status("generate", 5, out, mode="lines", clock=lambda: next(ticks))
    for done in range(6):
        status("denoise", done)
    status("write", 0)
    assert out.getvalue().split("\n") == [
        "[   1.0 s] denoise: the transformer, 5 steps",
        "[   2.0 s] denoise: step 1/5",  # the first (its compile is over)
        "[  45.0 s] denoise: step 4/5, 14.333 s/step, about 14.3 s left",  # 30 s after the last line
        "[  50.0 s] denoise: step 5/5, 12.000 s/step, about 0.0 s left",  # the last
        "[  60.0 s] write: the outputs",
        "",
    ]
    # held back for the run's first 30 s: a quick run prints nothing, a long one all its lines
    for end, shown in [
        (29.0, ""),
        (31.0, "[   1.0 s] encode: the text encoder (loaded and compiled on first use)\n"),
    ]:
        ticks = iter([0.0, 1.0, end])
        out = io.StringIO()
        status = Status("generate", 5, out, mode="lines", clock=ticks.__next__, hold=30.0)
        status("encode", 0)
        status("denoise", 0)
        assert out.getvalue() == (shown and shown + f"[{end:6.1f} s] denoise: the transformer, 5 steps\n")


def test_a_silent_stage_says_it_still_runs_and_on_which_unit():
    """A first step that compiles for minutes: the watching thread's word, in place on a terminal
    (erased when the step ends) and as a line when piped."""
    import io
    import threading

    from wanjax.jobs.status import Status

    now = [0.0]
    for mode, expected in [
        ("terminal", "\r[  90.0 s] denoise: step 1/10 (the first compiles its program), still running\x1b[K"),
        ("lines", "[  90.0 s] denoise: step 1/10 (the first compiles its program), still running\n"),
    ]:
        now[0] = 0.0
        out = io.StringIO()
        with Status("generate", 10, out, mode=mode, clock=lambda: now[0], tick=0.01) as status:
            status("denoise", 0)
            now[0] = 90.0
            deadline = threading.Event()
            for _ in range(500):  # the thread looks every 10 ms
                if "still running" in out.getvalue():
                    break
                deadline.wait(0.01)
            shown = out.getvalue()
            assert shown.startswith("[   0.0 s] denoise: the transformer, 10 steps\n"), shown
            assert shown.endswith(expected), shown
            now[0] = 91.0
            status("denoise", 1)
        if mode == "terminal":  # the step's count replaces the word in place
            assert out.getvalue().endswith("still running\x1b[K\r[  91.0 s] denoise: step 1/10\x1b[K\n")


@pytest.mark.slow
def test_the_decode_stage_on_a_terminal_says_what_it_decodes_and_counts_its_latent_frames(demo_env, tmp_path):
    import numpy as np

    from wanjax.pipeline import stages

    d = _stage_dir(tmp_path / "stages", np.zeros((1, 16, 2, 4, 6), np.float32))
    code, shown = _run_in_terminal(_command("decode", "--input_dir", str(d)), _env(demo_env), tmp_path)
    lines = shown.split("\n")
    assert code == 0, shown
    assert lines[0] == f"wanjax decode: model demo, 1 video of 5 frames 48x32, from {d / stages.LATENTS_FILE}"
    assert lines[1].split("] ", 1)[1] == "decode: the VAE decoder (loaded and compiled on first use)"
    counts = [_counted(c) for c in lines[2].split("\r")[1:]]  # 5 frames: 2 latent frames
    assert counts == ["decode: latent frame 1/2", "decode: latent frame 2/2"], lines[2]
    assert lines[3].split("] ", 1)[1] == "write: the outputs"
    assert lines[4] == "wanjax decode: model demo (smoke model: tiny random weights)"


@pytest.mark.slow
def test_a_generate_that_cannot_fit_is_refused_before_any_weight(demo_env, tmp_path, capsys, monkeypatch):
    """``plan``'s estimate of each stage against the memory here (fixed small): one line naming the
    stage, what it needs and what there is, exit 2, nothing written; with enough, the run goes."""
    from wanjax.cli.main import main
    from wanjax.planning import run_memory

    args = ["generate", "--model", "demo", "--prompt", "a cat", "--output_video", str(tmp_path / "v.mp4")]
    monkeypatch.setattr(run_memory, "available_memory", lambda: (2 << 20, "this machine"))
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1
        and "the decode stage needs about 26.6 MiB and this machine has 2.0 MiB available" in err[0]
    ), err
    assert err[0].endswith("; use a smaller --height/--width or fewer --frames") and not list(
        tmp_path.iterdir()
    )
    monkeypatch.setattr(run_memory, "available_memory", lambda: (1 << 30, "this machine"))
    assert main([*args, "--quiet"]) == 0


@pytest.mark.parametrize(
    ("model", "gib", "fix"),
    [("1.3B", 10, "--weights_dtype int8"), ("14B", 30, "--weights_dtype int8"), ("14B", 24, "a smaller")],
)
def test_the_flag_a_refusal_names_makes_the_run_fit(model, gib, fix):
    """On a CPU (one RAM for weights waiting and running) 8-bit weights shrink every stage; offload
    does not: a 14B run at 480p needs 35.5 GiB in bf16, 22.9 in int8."""
    from wanjax.parallel.mesh import MeshSpec
    from wanjax.planning.device_memory import plan_needs
    from wanjax.planning.models import model_configs
    from wanjax.planning.plan import HEADROOM
    from wanjax.planning.run_memory import remedy

    configs, usable = model_configs(model), HEADROOM * gib * 2**30
    run = {"height": 480, "width": 832, "frames": 81, "dtype": "bfloat16", "vae_dtype": "float32"}
    run |= {"offload": "none", "weights_dtype": "bf16"}
    assert max(plan_needs(configs, MeshSpec(), **run).values()) > usable
    named = remedy(configs, MeshSpec(), run, usable)
    assert named.startswith(fix)
    if named == "--weights_dtype int8":
        assert max(plan_needs(configs, MeshSpec(), **{**run, "weights_dtype": "int8"}).values()) <= usable
