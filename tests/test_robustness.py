"""Robustness (issue 9): every bad input is one line naming the problem before any work (exit 2),
runtime failures exit 1, outputs are atomic, NaN/inf is reported with its step, runs reproduce."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from wanjax.cli.main import main
from wanjax.errors import NumericalError, WanjaxError
from wanjax.io.checkpoint import open_safetensors
from wanjax.io.component import read_config_file
from wanjax.jobs import preflight as validation
from wanjax.models.config import TransformerConfig
from wanjax.pipeline import stages
from wanjax.pipeline.hub import resolve_model
from wanjax.sampling.results import check_steps_finite

SMALL = ("--height", "32", "--width", "48", "--frames", "5")
PROMPT = ("--prompt", "a cat")


@pytest.fixture(scope="module")
def demo_dir(demo_env) -> Path:
    return resolve_model("demo").path


def run(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def one_line_error(capsys, args, *needles: str, code: int = 2) -> str:
    got, _, err = run(capsys, *args)
    lines = err.strip().splitlines()
    assert got == code and len(lines) == 1 and "Traceback" not in err, (got, err)
    assert lines[0].startswith("wanjax: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def copy_model(demo_dir: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "model"
    shutil.copytree(demo_dir, dst)
    return dst


def generate_args(model, out: Path, *flags) -> tuple:
    return ("generate", "--model", model, *PROMPT, "--output_video", out / "v.mp4", *SMALL, *flags)


# ----------------------------------------------------------------------------------------------
# Bad flags: one line, exit 2, nothing written


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (("--guidance_scale", "-1"), ("--guidance_scale must be >= 0",)),
        (("--fps", "0"), ("--fps must be a frame rate from 0.1 to 1000",)),
        (("--fps", "-3"), ("--fps must be a frame rate from 0.1 to 1000", "got -3")),
        (("--fps", "1e-300"), ("--fps must be a frame rate from 0.1 to 1000",)),
        (("--fps", "1e300"), ("--fps must be a frame rate from 0.1 to 1000", "got 1e+300")),
        (("--max_sequence_length", "0"), ("--max_sequence_length must be at least 1",)),
        (("--num_inference_steps", "-2"), ("at least 1",)),
        (("--width", "100"), ("width 100", "multiple of 16", "e.g. 96")),
        (("--frames", "8"), ("4n+1", "5 or 9")),
        (("--height", "16400"), ("height 16400", "RoPE table", "height <= 16384")),
        (("--frames", "4097"), ("frames 4097", "RoPE table", "frames <= 4093")),
        (("--vae_dtype", "int8"), ("--vae_dtype", "unknown dtype")),
        (("--vae_weights_dtype", "int8"), ("--vae_weights_dtype", "unknown dtype")),
        (("--vae_decode_chunk", "0"), ("--vae_decode_chunk must be a positive integer or 'all'",)),
        (("--vae_decode_chunk", "two"), ("--vae_decode_chunk must be a positive integer or 'all'",)),
        (("--vae_tiling", "big"), ("--vae_tiling", "SIZE or SIZE:STRIDE")),
        (("--vae_tiling", "64:128"), ("--vae_tiling", "0 < stride <= size")),
        (("--vae_tiling", "16:4"), ("--vae_tiling stride 4", "at least 8")),
        (("--mesh", "dp=16"), ("uses 16 devices but 8 are available", "--mesh")),
        (("--attention", "cudnn"), ("needs an NVIDIA GPU", "available:")),
        (("--seed", "-5"), ("--seed must be an integer from 0 to 2**63-1",)),
    ],
)
def test_bad_flags_fail_before_any_work(demo_env, tmp_path, capsys, flags, needles):
    out = tmp_path / "out"
    one_line_error(capsys, generate_args("demo", out, *flags), *needles)
    assert not out.exists()


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (
            ("--attention", "nope"),
            "argument --attention: invalid choice 'nope' (choose from auto, xla, cudnn, splash, splash_exp2)",
        ),
        (("--vae_decode_chunk", "2", "--nope", "3"), "unrecognized arguments: --nope 3"),
        (("--bogus",), "unrecognized arguments: --bogus"),
        (("--seed", "1.5"), "argument --seed: invalid int value: '1.5'"),
    ],
)
def test_invalid_choices_and_unknown_flags_fail_before_any_work(demo_env, tmp_path, capsys, flags, line):
    out = tmp_path / "out"
    code, stdout, err = run(capsys, *generate_args("demo", out, *flags))
    assert (code, stdout, err) == (2, "", f"wanjax generate: error: {line}\n")
    assert not out.exists()


def test_debug_shows_the_traceback(demo_env, tmp_path):
    with pytest.raises(WanjaxError, match="--fps must be a frame rate"):
        main([str(a) for a in generate_args("demo", tmp_path, "--fps", "0", "--debug")])


def test_any_mesh_of_the_visible_devices_is_accepted_and_a_wrong_count_suggests_one():
    # tp=8 cannot split 12 heads: the axis joins the token split (the library runs it, so the CLI does)
    assert validation.check_mesh("dp=1,sp=1,tp=8", 8, heads=12).shape == (1, 1, 8)
    with pytest.raises(WanjaxError, match=r"uses 4 devices but 8 .*--mesh dp=2,sp=1,tp=4"):
        validation.check_mesh("dp=2,tp=2", 8, heads=12)
    assert validation.check_mesh("dp=2,sp=1,tp=4", 8, heads=12).shape == (2, 1, 4)


def test_unwritable_outputs_are_refused_up_front(demo_env, tmp_path, capsys):
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a folder")
    for flag, path in (
        ("--output_video", blocker / "v.mp4"),
        ("--frames_out", blocker / "sub" / "f.npy"),
        ("--metrics_json", blocker / "m.json"),
    ):
        args = (
            "generate",
            "--model",
            "demo",
            *PROMPT,
            *SMALL,
            "--output_video",
            tmp_path / "v.mp4",
            flag,
            path,
        )
        one_line_error(capsys, args, flag, "is not a directory")
    args = ("encode", "--model", "demo", *PROMPT, "--output_dir", blocker)
    one_line_error(capsys, args, "is not a directory")
    folder = tmp_path / "sheet.png"
    folder.mkdir()
    one_line_error(capsys, generate_args("demo", tmp_path, "--preview", folder), "is a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt", "sheet.png"]
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        one_line_error(capsys, generate_args("demo", locked), "cannot write to")


# ----------------------------------------------------------------------------------------------
# Bad model directories: named file and tensor, exit 2, nothing written


def _break_missing_component(model: Path) -> None:
    shutil.rmtree(model / "vae")


def _break_missing_tokenizer(model: Path) -> None:
    (model / "tokenizer" / "tokenizer.json").unlink()


def _break_shard_index(model: Path) -> None:
    folder = model / "transformer"
    names = list(load_file(folder / "diffusion_pytorch_model.safetensors"))
    (folder / "diffusion_pytorch_model.safetensors").unlink()
    index = {
        "metadata": {},
        "weight_map": {n: "diffusion_pytorch_model-00001-of-00002.safetensors" for n in names},
    }
    (folder / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(index))


def _break_bad_index_json(model: Path) -> None:
    (model / "transformer" / "diffusion_pytorch_model.safetensors").unlink()
    (model / "transformer" / "diffusion_pytorch_model.safetensors.index.json").write_text("{not json")


def _break_truncated(model: Path) -> None:
    path = model / "transformer" / "diffusion_pytorch_model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _break_corrupt_header(model: Path) -> None:
    path = model / "vae" / "diffusion_pytorch_model.safetensors"
    data = bytearray(path.read_bytes())
    data[8:40] = b"\x00garbage\xff" * 4
    path.write_bytes(bytes(data))


def _break_pickle_only(model: Path) -> None:
    folder = model / "transformer"
    (folder / "diffusion_pytorch_model.safetensors").rename(folder / "diffusion_pytorch_model.bin")


def _break_config_dims(model: Path) -> None:
    path = model / "transformer" / "config.json"
    config = json.loads(path.read_text())
    config["ffn_dim"] = 512
    path.write_text(json.dumps(config))


def _break_config_json(model: Path) -> None:
    (model / "text_encoder" / "config.json").write_text("[1, 2")


def _break_model_index(model: Path) -> None:
    (model / "model_index.json").write_text("\xff{")  # read first: it says which pipeline this is


@pytest.mark.parametrize(
    ("breaker", "needles"),
    [
        (_break_missing_component, ("lacks its vae/",)),
        (_break_missing_tokenizer, ("tokenizer/tokenizer.json",)),
        (_break_shard_index, ("shard file(s) missing", "00001-of-00002")),
        (_break_bad_index_json, ("not a valid shard index",)),
        (_break_truncated, ("truncated", "diffusion_pytorch_model.safetensors", "download it again")),
        (_break_corrupt_header, ("vae", "corrupt safetensors header")),
        (_break_pickle_only, ("diffusion_pytorch_model.bin", "safetensors only")),
        (_break_config_dims, ("shape mismatch", "blocks.0.ffn.net.0.proj", "(256, 128)")),
        (_break_config_json, ("text_encoder/config.json", "not valid JSON")),
        (_break_model_index, ("model_index.json", "not valid JSON")),
    ],
)
def test_broken_model_directories(demo_dir, tmp_path, capsys, breaker, needles):
    model = copy_model(demo_dir, tmp_path)
    breaker(model)
    out = tmp_path / "out"
    one_line_error(capsys, generate_args(model, out), *needles)
    assert not out.exists()
    code, _, err = run(capsys, "info", model)  # info names the problem too (or lists the component missing)
    assert code in (0, 2) and "Traceback" not in err and len(err.strip().splitlines()) <= 1, err


# ----------------------------------------------------------------------------------------------
# Bad stage files


def test_bad_stage_files(demo_env, tmp_path, capsys):
    d = tmp_path / "stages"
    d.mkdir()
    (d / stages.EMBEDDINGS_FILE).write_bytes(b"\x07\x00\x00\x00\x00\x00\x00\x00{broken")
    one_line_error(capsys, ("denoise", "--model", "demo", "--input_dir", d), "corrupt safetensors header")

    stages.save_embeddings(d, np.zeros((1, 8, 7), np.float32), np.zeros((1, 8, 7), np.float32))
    one_line_error(
        capsys,
        ("denoise", "--model", "demo", "--input_dir", d, *SMALL),
        "width 7",
        "takes 64",
        "another model",
    )
    assert not (d / stages.LATENTS_FILE).exists()

    stages.save_latents(d / stages.LATENTS_FILE, np.zeros((1, 8, 2, 4, 6), np.float32))
    one_line_error(capsys, ("decode", "--model", "demo", "--input_dir", d), "8 channels", "decodes 16")

    nan = np.zeros((1, 16, 2, 4, 6), np.float32)
    nan[0, 3, 1] = np.nan
    stages.save_latents(d / stages.LATENTS_FILE, nan)
    one_line_error(
        capsys,
        ("decode", "--model", "demo", "--input_dir", d),
        "24 NaN/inf value(s) of 768",
        "diverged",
        code=1,
    )
    (d / stages.CONFIG_FILE).write_text('{"stages": [1, 2]}')
    one_line_error(capsys, ("decode", "--model", "demo", "--input_dir", d), "generation_config.json")
    assert not list(d.glob("*.mp4")) and not list(d.glob(".*"))


def test_over_long_prompt_warns_with_the_dropped_token_count(demo_env, tmp_path, capsys):
    prompt = " ".join(["cat"] * 40)
    args = ("encode", "--model", "demo", "--output_dir", tmp_path, "--max_sequence_length", "8")
    with pytest.warns(UserWarning, match=r"the last \d+ token\(s\) were dropped"):
        code, _, err = run(capsys, *args, "--prompt", prompt)
    assert code == 0, err
    with warnings.catch_warnings():  # printed to stderr as outside pytest: one line
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: (
            sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))
        )
        code, _, err = run(capsys, *args, "--prompt", prompt)
    lines = [line for line in err.splitlines() if "warning" in line]
    assert code == 0 and len(lines) == 1, err
    assert lines[0].startswith("wanjax: warning: prompt 0 is") and "token(s) were dropped" in lines[0]


# ----------------------------------------------------------------------------------------------
# NaN/inf while denoising: the first step named, exit 1, no video


@pytest.mark.slow
def test_nan_during_denoising_names_the_step(demo_dir, tmp_path, capsys):
    model = copy_model(demo_dir, tmp_path)
    path = model / "transformer" / "diffusion_pytorch_model.safetensors"
    tensors = load_file(path)
    # finite weights (so the load-time check passes) whose output overflows to inf in the first step
    tensors["proj_out.weight"] = np.full_like(tensors["proj_out.weight"], 1e38)
    save_file(tensors, str(path), metadata={"format": "pt"})
    out = tmp_path / "out"
    args = generate_args(model, out, "--num_inference_steps", "2", "--frames_out", out / "f.npy")
    one_line_error(capsys, args, "NaN/inf", "first at step 1 of 2", "--dtype float32", code=1)
    assert not out.exists() or not list(out.iterdir())


def test_first_non_finite_step_is_reported():
    check_steps_finite([True, True], "bfloat16")
    with pytest.raises(NumericalError, match=r"first at step 2 of 4.*--dtype float32"):
        check_steps_finite([True, False, False, False], "bfloat16")
    with pytest.raises(NumericalError, match=r"step 3 of 3 .*float32.*check the checkpoint"):
        check_steps_finite([True, True, False], "float32")


# ----------------------------------------------------------------------------------------------
# Reproducibility


@pytest.mark.slow
def test_same_seed_same_frames_and_everything_recorded(demo_env, tmp_path, capsys):
    cache = ("--jax_cache_dir", tmp_path / "jax")
    frames = {}
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        args = (
            "generate",
            "--model",
            "demo",
            *PROMPT,
            *SMALL,
            *cache,
            "--num_inference_steps",
            "2",
            "--seed",
            seed,
        )
        files = ("--output_video", tmp_path / f"{name}.mp4", "--frames_out", tmp_path / f"{name}.npy")
        code, _, err = run(capsys, *args, *files, "--metrics_json", tmp_path / f"{name}.json")
        assert code == 0, err
        frames[name] = (tmp_path / f"{name}.npy").read_bytes()
    assert frames["a"] == frames["b"]
    assert frames["a"] != frames["c"]
    metrics = json.loads((tmp_path / "a.json").read_text())
    assert metrics["sampling"]["seed"] == 7 and metrics["arguments"]["seed"] == 7
    assert metrics["arguments"]["height"] == 32 and metrics["arguments"]["command"] == "generate"
    env = metrics["environment"]
    for key in ("wanjax", "jax", "jaxlib", "python", "platform"):
        assert env[key], key
    assert not list(tmp_path.glob(".*.tmp"))


def test_stage_config_records_seed_versions_and_arguments(demo_env, tmp_path, capsys):
    d = tmp_path / "s"
    assert run(capsys, "encode", "--model", "demo", *PROMPT, "--output_dir", d, *SMALL)[0] == 0
    code, _, err = run(capsys, "denoise", "--input_dir", d, "--num_inference_steps", "1", "--seed", "3")
    assert code == 0, err
    config = stages.read_config(d)
    assert config["seed"] == 3 and config["wanjax_version"]
    for stage in ("encode", "denoise"):
        entry = config["stages"][stage]
        assert entry["arguments"]["command"] == stage and entry["environment"]["jaxlib"]
    assert config["stages"]["denoise"]["arguments"]["seed"] == 3
    assert "arguments" not in config and "environment" not in config  # kept per stage


# ----------------------------------------------------------------------------------------------
# Interrupted decode: no partial mp4, earlier stage files untouched

_SLOW_WRITER = """
import faulthandler, pathlib, signal, sys, time
import av
faulthandler.register(signal.SIGUSR1, all_threads=True)  # stacks on demand, should it hang
# Ctrl-C as in a terminal, even when the suite runs as a background job (which ignores SIGINT,
# and its children inherit that)
signal.signal(signal.SIGINT, signal.default_int_handler)
marker = pathlib.Path(sys.argv[1])
real_open = av.open


class SlowContainer:
    def __init__(self, container):
        self.container, self.muxed = container, 0

    def __enter__(self):
        self.container.__enter__()
        return self

    def __exit__(self, *exc):
        return self.container.__exit__(*exc)

    @property
    def metadata(self):
        return self.container.metadata

    def add_stream(self, *args, **kwargs):
        return self.container.add_stream(*args, **kwargs)

    def mux(self, packets):
        self.container.mux(packets)
        self.muxed += 1
        if self.muxed == 3:  # midway through the frames
            marker.write_text("encoding")
            for _ in range(3000):  # a slow encoder: Python runs signal handlers between the sleeps
                time.sleep(0.1)


av.open = lambda *args, **kwargs: SlowContainer(real_open(*args, **kwargs))
from wanjax.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_killed_decode_leaves_no_partial_video(demo_env, tmp_path, sig):
    d = tmp_path / "stages"
    latents = np.random.default_rng(0).standard_normal((1, 16, 3, 4, 6)).astype(np.float32)
    stages.save_latents(d / stages.LATENTS_FILE, latents)
    stages.write_config(d, stages.record_stage({}, "denoise", {"model": "demo", "seed": 1}))
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    wrapper, marker = tmp_path / "slow.py", tmp_path / "marker"
    wrapper.write_text(_SLOW_WRITER)
    env = {**os.environ, "WANJAX_CACHE": str(demo_env), "JAX_PLATFORMS": "cpu"}
    args = ["decode", "--input_dir", str(d), "--output_video", str(d / "video.mp4")]
    proc = subprocess.Popen(
        [sys.executable, str(wrapper), str(marker), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 240
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "decode never reached the mp4 writer"
            time.sleep(0.1)
        assert list(d.glob(".video.*.tmp")), list(d.iterdir())  # the writer was midway
        proc.send_signal(sig)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)  # faulthandler: every thread's stack to stderr
            time.sleep(2)
            proc.kill()
            stacks = proc.communicate()[1].decode()[-6000:]
            raise AssertionError(f"still running 60 s after {sig!r}:\n{stacks}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not list(d.glob("*.mp4"))
    leftovers = [p.name for p in d.iterdir() if p.name not in before]
    assert all(name.endswith(".tmp") for name in leftovers), leftovers  # never a *.mp4 name
    if sig == signal.SIGINT:  # interrupted cleanly: temp file removed, one line, exit 130
        assert proc.returncode == 130 and not leftovers, (proc.returncode, leftovers)
        assert b"Traceback" not in err and b"interrupted" in err
    assert {p.name: p.read_bytes() for p in d.iterdir() if p.name in before} == before


# ----------------------------------------------------------------------------------------------
# Fuzzing the readers: corrupted bytes give a WanjaxError, never another exception or a hang


class _Timeout(Exception):
    pass


def _mutations(data: bytes, rng: random.Random, count: int, safetensors: bool) -> list[bytes]:
    out = [b"", data[:4], data[:8], data[:9]]
    header_len = int.from_bytes(data[:8], "little") if safetensors else 0
    while len(out) < count:
        kind = rng.randrange(6)
        buf = bytearray(data)
        if kind == 0:  # truncate
            buf = buf[: rng.randrange(len(buf))]
        elif kind == 1:  # random bytes at random places
            for _ in range(rng.randint(1, 8)):
                buf[rng.randrange(len(buf))] = rng.randrange(256)
        elif kind == 2 and header_len:  # wrong header length
            value = rng.choice(
                [0, 1, header_len - 1, header_len + 1, len(data) * 2, 2**63, rng.randrange(2**64)]
            )
            buf[:8] = value.to_bytes(8, "little")
        elif kind == 3 and header_len:  # bytes changed inside the header only
            for _ in range(rng.randint(1, 4)):
                buf[8 + rng.randrange(header_len)] = rng.choice(b'{}[]":,0123456789-eE.abc ')
        elif kind == 4:  # random garbage
            buf = bytearray(rng.randbytes(rng.randrange(1, 200)))
        else:  # bytes inserted
            at = rng.randrange(len(buf))
            buf[at:at] = rng.randbytes(rng.randint(1, 16))
        out.append(bytes(buf))
    return out


def _structured_headers() -> list[bytes]:
    entries = [
        [],
        "x",
        {"latents": None},
        {"latents": {"dtype": "F32"}},
        {"latents": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}},
        {"latents": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}},
        {"latents": {"dtype": "F32", "shape": ["a"], "data_offsets": [0, 4]}},
        {"latents": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}},
        {"latents": {"dtype": 5, "shape": [1], "data_offsets": [0, 4]}},
        {"latents": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 4]}},
        {"latents": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}},
        {"latents": {"dtype": "F32", "shape": [1, 1, 1, 1, 1], "data_offsets": [0, 4]}},
        {"latents": {"dtype": "I32", "shape": [1, 1, 1, 1, 1], "data_offsets": [0, 4]}},
        {"latents": {"dtype": "F32", "shape": [1, 1, 1, 1, 1], "data_offsets": [0, 10**12]}},
    ]
    out = []
    for entry in entries:
        header = json.dumps(entry).encode()
        out.append(len(header).to_bytes(8, "little") + header + b"\x00\x00\xc0\x7f")  # data: one NaN
    return out


def _check_reader(read, blobs: list[bytes], path: Path) -> dict[str, int]:
    outcomes = {"ok": 0, "error": 0}

    def alarm(*_):
        raise _Timeout

    previous = signal.signal(signal.SIGALRM, alarm)
    try:
        for i, blob in enumerate(blobs):
            path.write_bytes(blob)
            signal.setitimer(signal.ITIMER_REAL, 2.0)
            try:
                read(path)
                outcomes["ok"] += 1
            except WanjaxError as e:
                assert "\n" not in str(e) and str(e), repr(e)
                outcomes["error"] += 1
            except _Timeout:
                pytest.fail(f"case {i}: reader hung on {blob[:64]!r}")
            except Exception as e:
                pytest.fail(f"case {i}: {type(e).__name__}: {e} on {blob[:64]!r}")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, previous)
    return outcomes


def test_fuzzed_stage_files_and_configs_give_clean_errors(demo_dir, tmp_path):
    rng = random.Random(1234)
    d = tmp_path / "good"
    stages.save_embeddings(d, np.ones((1, 4, 8), np.float32), np.ones((1, 4, 8), np.float32))
    stages.save_latents(d / stages.LATENTS_FILE, np.ones((1, 16, 1, 2, 2), np.float32))
    config = stages.record_stage({}, "encode", {"model": "demo", "prompt": "a cat", "height": 32})
    stages.write_config(d, config)
    bad = tmp_path / "bad"
    bad.mkdir()

    def read_embeddings(path: Path) -> None:
        path.rename(bad / stages.EMBEDDINGS_FILE)
        stages.load_embeddings(bad)

    def read_config(path: Path) -> None:
        path.rename(bad / stages.CONFIG_FILE)
        stages.read_config(bad)

    def read_tensors(path: Path) -> None:
        for ref in open_safetensors(path).values():
            ref.array()
            ref[tuple(slice(0, 1) for _ in ref.shape)]

    transformer_config = (demo_dir / "transformer" / "config.json").read_bytes()
    readers = [
        (stages.load_latents, (d / stages.LATENTS_FILE).read_bytes(), True),
        (read_embeddings, (d / stages.EMBEDDINGS_FILE).read_bytes(), True),
        (open_safetensors, (d / stages.LATENTS_FILE).read_bytes(), True),
        (read_tensors, (d / stages.EMBEDDINGS_FILE).read_bytes(), True),
        (read_config, (d / stages.CONFIG_FILE).read_bytes(), False),
        (lambda p: read_config_file(TransformerConfig, p), transformer_config, False),
    ]
    for read, data, safetensors in readers:
        blobs = _mutations(data, rng, 50, safetensors) + (_structured_headers() if safetensors else [])
        blobs += [b"[" * 100_000, b'{"stages": {"encode": 1}}', b"\xff\xfe\x00", b"null", b"{}"]
        outcomes = _check_reader(read, blobs, tmp_path / "case.bin")
        assert outcomes["error"] >= 10, (read, outcomes)


def test_runtime_failures_exit_1_and_user_mistakes_exit_2(demo_env, tmp_path, capsys, monkeypatch):
    """An OSError while working (disk full) is one line with exit 1; --debug re-raises it."""
    from wanjax.jobs import requests

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(requests, "check_flags", disk_full)
    one_line_error(capsys, generate_args("demo", tmp_path), "No space left on device", code=1)
    with pytest.raises(OSError):
        main([str(a) for a in generate_args("demo", tmp_path, "--debug")])
    assert WanjaxError.exit_code == 2 and NumericalError.exit_code == 1


def test_a_full_disk_names_the_folder_and_what_was_being_written(demo_env, tmp_path, capsys, monkeypatch):
    """ENOSPC while the video is written (PyAV's write fails): one line naming the full folder, the
    file and that nothing of it was kept, exit 1, no partial file; still an OSError to a caller."""
    import errno

    import av

    from wanjax.errors import RuntimeFailure
    from wanjax.io.atomic import write_text

    real_open = av.open

    def full(file, mode="r", **kwargs):
        if mode == "w":
            raise OSError(errno.ENOSPC, "No space left on device", file)
        return real_open(file, mode, **kwargs)

    monkeypatch.setattr(av, "open", full)
    out = tmp_path / "out"
    line = one_line_error(capsys, generate_args("demo", out, "--num_inference_steps", "1"), code=1)
    assert line == (
        f"wanjax: error: the disk of {out} is full: v.mp4 was not written and nothing of it was kept; "
        "free space there, or write to another disk"
    )
    assert not out.exists() or list(out.iterdir()) == []

    def no_room(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")  # Python's own writes name no file

    monkeypatch.setattr(Path, "write_text", no_room)
    with pytest.raises(OSError) as failed:
        write_text(tmp_path / "notes" / "record.json", "{}")
    assert isinstance(failed.value, RuntimeFailure) and failed.value.errno == errno.ENOSPC
    assert str(failed.value).startswith(
        f"the disk of {tmp_path / 'notes'} is full: record.json was not written"
    )
    assert list((tmp_path / "notes").iterdir()) == []


def test_finite_check_reads_one_flag_per_run_not_per_step(monkeypatch):
    """The per-step flags stay on the device: no read in the loop, one read for the check."""
    import jax.numpy as jnp
    from jax._src.array import ArrayImpl

    from wanjax.io.checkpoint import random_params
    from wanjax.models.dit import WanTransformer, checkpoint_spec
    from wanjax.models.registry import transformer_preset
    from wanjax.sampling.sampler import Sampler
    from wanjax.sampling.scheduler import SchedulerConfig, make_scheduler

    cfg = dataclasses.replace(transformer_preset("tiny"), num_layers=1)
    model = WanTransformer(cfg, random_params(checkpoint_spec(cfg), jnp.float32))
    latents = np.random.default_rng(0).standard_normal((1, 16, 1, 4, 4)).astype(np.float32)
    text = jnp.ones((1, 8, cfg.text_dim), jnp.float32)
    sampler = Sampler(model)
    from wanjax.sampling import results as sampling

    reads = []
    original, to_host = ArrayImpl._value, sampling.to_host
    monkeypatch.setattr(ArrayImpl, "_value", property(lambda self: reads.append(1) or original.fget(self)))
    monkeypatch.setattr(sampling, "to_host", lambda x: reads.append(1) or np.array(to_host(x)))
    for check, expected in ((False, 0), (True, 1)):
        reads.clear()
        result = sampler(make_scheduler(SchedulerConfig(), 3), latents, text, text, 5.0, check_finite=check)
        assert len(reads) == expected, (check, len(reads))
    assert len(result.finite_flags) == 3


@pytest.mark.parametrize("in_place", [True, False], ids=["host_memory", "device_program"])
def test_non_finite_weights_are_named_wherever_they_live(monkeypatch, in_place):
    """Weights in host memory are read in place, a few values at a time (no program compiled: its
    compile left ~100 MiB behind); elsewhere one program checks them on the chips. Both find the
    same tensors: float32, bfloat16, a value in a later chunk, a leaf split over the 8 devices."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from wanjax.io import finite
    from wanjax.parallel.mesh import make_mesh, parse_mesh
    from wanjax.runtime.timing import CompileMeter

    mesh = make_mesh(parse_mesh("dp=1,sp=2,tp=4"))
    split = jax.device_put(jnp.ones((8, 4)).at[7, 3].set(-jnp.inf), NamedSharding(mesh, PartitionSpec("tp")))
    params = {
        "a": jnp.ones((3, 4)),
        "b": {"c": jnp.ones(7).at[6].set(jnp.inf), "d": jnp.zeros(5, jnp.bfloat16).at[2].set(jnp.nan)},
        "ids": jnp.ones(3, jnp.int32),
        "split": split,
        "whole": jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, PartitionSpec())),
    }
    monkeypatch.setattr(finite, "HOST_CHUNK", 3)
    monkeypatch.setattr(finite, "_in_host_memory", lambda leaf: in_place)
    with CompileMeter() as compiled:
        assert finite.non_finite_leaves(params) == ["b/c", "b/d", "split"]
    assert (compiled.programs == 0) == in_place
