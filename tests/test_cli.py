"""The command line: ``info`` and model resolution; user mistakes give one line and exit code 2,
before any work is done and without leaving partial files."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from helpers.small_video import SMALL_GENERATE

from wanjax.cli.main import build_parser, main, subcommands
from wanjax.jobs import requests
from wanjax.pipeline import stages
from wanjax.planning import models as plan_model


def run(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def one_line_error(capsys, args, *needles: str) -> str:
    code, _, err = run(capsys, *args)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# a short float32 demo run: frames comparable across flags
DEMO_FLOAT32 = (
    "generate",
    "--model",
    "demo",
    "--prompt",
    "a cat",
    "--num_inference_steps",
    "2",
    "--dtype",
    "float32",
)
ATTENTION_CHOICES = "(choose from auto, xla, cudnn, splash, splash_exp2)"
COMMANDS = "generate, encode, denoise, decode, serve, plan, bench, tune-attention, info, convert"


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ("generate", "--attention", "nope"),
            f"wanjax generate: error: argument --attention: invalid choice 'nope' {ATTENTION_CHOICES}",
        ),
        (("generate", "--nope", "3"), "wanjax generate: error: unrecognized arguments: --nope 3"),
        (
            ("generate", "--steps", "5"),
            "wanjax generate: error: unrecognized arguments: --steps 5 (did you mean --num_inference_steps?)",
        ),
        (
            ("generate", "--cfg=4"),
            "wanjax generate: error: unrecognized arguments: --cfg=4 (did you mean --guidance_scale?)",
        ),
        (
            ("generate", "--negative", "blur"),
            "wanjax generate: error: unrecognized arguments: --negative blur (did you mean --negative_prompt?)",
        ),
        (
            ("generate", "--num-frames", "33"),
            "wanjax generate: error: unrecognized arguments: --num-frames 33 (did you mean --frames?)",
        ),
        (
            ("decode", "--output", "v.mp4"),
            "wanjax decode: error: unrecognized arguments: --output v.mp4 (did you mean --output_video?)",
        ),
        (  # an alias whose flag the command lacks suggests nothing
            ("info", "demo", "--steps", "5"),
            "wanjax info: error: unrecognized arguments: --steps 5",
        ),
        (("decode", "--frames", "x"), "wanjax decode: error: argument --frames: invalid int value: 'x'"),
        (
            ("bench", "--stages", "all"),
            "wanjax bench: error: argument --stages: invalid choice 'all' (choose from encode, image, denoise, decode)",
        ),
        (("info",), "wanjax info: error: the following arguments are required: model"),
        (("nope",), f"wanjax: error: argument command: invalid choice 'nope' (choose from {COMMANDS})"),
    ],
)
def test_parser_mistakes_are_one_line(tmp_path, monkeypatch, capsys, args, line):
    """argparse's own mistakes (invalid choices, unknown flags, missing arguments) are one line too,
    exit 2, without the usage."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, *args)
    assert (code, out, err) == (2, "", line + "\n")
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_the_console_command_exits_2_with_one_line():
    result = subprocess.run(
        [sys.executable, "-m", "wanjax.cli", "generate", "--attention", "nope"],
        capture_output=True,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert result.returncode == 2, result.stderr
    assert (
        result.stderr
        == f"wanjax generate: error: argument --attention: invalid choice 'nope' {ATTENTION_CHOICES}\n"
    )


def test_help_is_the_full_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["generate", "--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and out.startswith("usage: wanjax generate")
    for flag in ("--num_inference_steps", "--num-inference-steps", "--attention", "--vae_tiling", "--debug"):
        assert flag in out
    assert "(default 50; demo 10)" in out and "(default 480; demo 128)" in out


def test_every_flag_lands_in_the_request():
    """Each pipeline, plan and info flag is a field of its command's request (and each field a flag);
    left-out flags take the request's defaults, the ones a run records."""
    commands = subcommands()
    parser = build_parser(commands)
    given = {"info": ["demo"], "generate": ["--prompt", "a cat"], "encode": ["--prompt", "a cat"]}
    for name in ("generate", "encode", "denoise", "decode", "plan", "info"):
        args = parser.parse_args([name, *given.get(name, [])])
        request = commands[name].request(args)
        assert isinstance(request, requests.Request) and request.command == name
        assert set(request.flags()) == set(vars(args)) - {"command", "debug"}, name
    args = parser.parse_args(["generate", "--prompt", "a cat", "--debug"])
    recorded = commands["generate"].request(args).arguments()
    assert list(recorded) == sorted(recorded) and "debug" not in recorded
    assert recorded["command"] == "generate" and recorded["prompt"] == ["a cat"]
    defaults = {
        "attention": "auto",
        "vae_dtype": "float32",
        "vae_decode_chunk": "1",
        "max_sequence_length": 512,
    }
    assert {k: recorded[k] for k in defaults} == defaults
    assert recorded["height"] is None and recorded["use_dp"] is False and recorded["model"] is None
    plan = commands["plan"].request(parser.parse_args(["plan"]))
    assert plan_model.model_name(plan.model, plan.files.given()) == "14B"  # no --model, no file
    assert (plan.model, plan.height, plan.width, plan.frames, plan.device_memory) == (
        None,
        720,
        1280,
        81,
        "32GiB",
    )


def test_info_reads_a_diffusers_saved_model(tiny_transformer_dir, capsys):
    root, _ = tiny_transformer_dir
    code, out, _ = run(capsys, "info", root / "transformer")
    assert code == 0 and "num_layers=2" in out and "tensors" in out


def test_info_on_the_demo_model(demo_env, capsys):
    code, out, _ = run(capsys, "info", "demo")
    assert code == 0
    assert "smoke model" in out
    for component in ("[text_encoder]", "[tokenizer]", "[transformer]", "[vae]", "[scheduler]"):
        assert component in out
    assert "UMT5EncoderModel" in out and "AutoencoderKLWan" in out and "tokenizer.json" in out


@pytest.mark.slow
def test_info_and_generate_accept_transformer_weights_named_model(demo_env, tmp_path, capsys):
    """``transformer/model.safetensors`` loads (a weight stem the transformer's description lists), so
    ``info`` and the pre-flight checks read it too."""
    import shutil

    from wanjax.pipeline.hub import resolve_model

    root = tmp_path / "model"
    shutil.copytree(resolve_model("demo").path, root)
    folder = root / "transformer"
    (folder / "diffusion_pytorch_model.safetensors").rename(folder / "model.safetensors")
    code, out, _ = run(capsys, "info", root)
    transformer = out.split("[transformer]")[1].split("\n[")[0]
    assert code == 0 and "weights: " in transformer and "tensors" in transformer, out
    code, _, err = run(
        capsys,
        "generate",
        "--model",
        root,
        "--prompt",
        "a cat",
        "--num_inference_steps",
        "1",
        "--frames",
        "5",
        "--height",
        "32",
        "--width",
        "64",
        "--output_video",
        tmp_path / "v.mp4",
    )
    assert code == 0, err
    assert (tmp_path / "v.mp4").is_file()


def test_hub_id_resolved_from_the_local_hf_cache(demo_env, tmp_path, monkeypatch, capsys):
    """A repo id is read from the HF cache snapshot that refs/main names; absent, the error says how to get it."""
    # huggingface_hub reads $HF_HUB_CACHE when it is imported: set what it read
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    one_line_error(
        capsys, ("info", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"), "not in the Hugging Face cache", "hf download"
    )
    assert run(capsys, "info", "demo")[0] == 0  # generates the demo model
    demo_dir = next(demo_env.glob("demo-*"))
    repo = tmp_path / "models--Wan-AI--Wan2.1-T2V-1.3B-Diffusers"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots").mkdir()
    os.symlink(demo_dir, repo / "snapshots" / "abc123")
    code, out, _ = run(capsys, "info", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers")
    assert code == 0 and "snapshots/abc123" in out


def test_missing_model_path(tmp_path, capsys):
    one_line_error(capsys, ("info", tmp_path / "missing"), "does not exist")
    one_line_error(
        capsys, ("generate", "--model", tmp_path / "missing", "--prompt", "a cat"), "does not exist"
    )


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (("--frames", "10"), ("4n+1", "9 or 13")),
        (("--height", "70"), ("height 70", "multiple of 16", "e.g. 64")),
        (("--dtype", "float8"), ("unknown dtype",)),
        (("--output_video", "x.avi"), ("must end in .mp4",)),
        (("--frames-out", "x.png"), ("must end in .npy",)),
        (("--num-inference-steps", "0"), ("at least 1",)),
        (("--flow_shift", "-1"), ("--flow_shift must be positive",)),
        (
            ("--attention", "cudnn"),
            ("'cudnn' needs an NVIDIA GPU", "available: auto, xla, splash, splash_exp2"),
        ),
        (("--bqsize", "100"), ("bqsize=100", "multiple of 128")),
        (("--window_size", "-1"), ("window_size must be >= 0",)),
        (  # the demo's 10 steps: the flag to change, and to what
            ("--scheduler", "rcm"),
            (
                "--scheduler rcm runs 1 to 4 steps (TurboDiffusion's trained times); set --num_inference_steps 4 or fewer, not 10",
            ),
        ),
        (
            ("--scheduler", "rcm_ode", "--num_inference_steps", "6"),
            ("--scheduler rcm_ode runs 1 to 4 steps", "set --num_inference_steps 4 or fewer, not 6"),
        ),
        (
            ("--scheduler", "dmd", "--num_inference_steps", "4"),
            ("--scheduler dmd runs FastWan's 3 steps [1000, 757, 522]; set --num_inference_steps 3, not 4",),
        ),
    ],
)
def test_generate_rejects_bad_flags(demo_env, tmp_path, capsys, flags, needles):
    out = tmp_path / "v.mp4"
    args = (
        "generate",
        "--model",
        "demo",
        "--prompt",
        "a cat",
        "--output_video",
        out,
        *flags,
    )
    one_line_error(capsys, args, *needles)
    assert not list(tmp_path.iterdir())  # nothing written, not even a partial file


def test_stage_mistakes(demo_env, tmp_path, capsys):
    d = tmp_path / "stages"
    one_line_error(
        capsys, ("denoise", "--input_dir", d), "stage1_embeddings.safetensors", "run `wanjax encode"
    )
    one_line_error(capsys, ("decode", "--input_dir", d), "stage2_latents.safetensors", "run `wanjax denoise")

    video = ("--height", "32", "--width", "48", "--frames", "5")
    assert run(capsys, "encode", "--model", "demo", "--prompt", "a cat", "--output_dir", d, *video)[0] == 0
    one_line_error(
        capsys, ("denoise", "--input_dir", d, "--height", "64"), "--height 64 contradicts", "height 32"
    )

    bad = tmp_path / "noise.safetensors"
    stages.save_latents(bad, np.zeros((1, 16, 3, 4, 6), np.float32))  # 9 frames, not 5
    one_line_error(
        capsys,
        ("denoise", "--input_dir", d, "--init_latents", bad),
        "[1, 16, 3, 4, 6]",
        "[1, 16, 2, 4, 6]",
    )
    one_line_error(
        capsys,
        ("denoise", "--input_dir", d, "--init_latents", tmp_path / "nope.safetensors"),
        "not found",
    )
    assert not (d / stages.LATENTS_FILE).exists()

    stages.save_latents(d / stages.LATENTS_FILE, np.zeros((1, 16, 2, 4, 6), np.float32))
    one_line_error(
        capsys,
        ("decode", "--input_dir", d, "--frames", "9"),
        "--frames 9 contradicts",
        "5 frames of 48x32",
    )
    one_line_error(capsys, ("decode", "--input_dir", d, "--output_video", d / "x.gif"), "must end in .mp4")
    assert not list(d.glob("*.mp4")) and not list(d.glob("*.tmp"))


@pytest.mark.slow
def test_attention_flags_reach_the_model(demo_env, tmp_path, capsys):
    """The seed's kernel flags run the demo through our splash_exp2 kernel (interpret mode here);
    the frames equal the xla backend's."""
    frames = {}
    for name, flags in (
        ("xla", ("--attention", "xla")),
        ("exp2", ("--use_custom_attention", "--bqsize", "128")),
    ):
        path = tmp_path / f"{name}.npy"
        code, _, err = run(
            capsys,
            *DEMO_FLOAT32,
            "--frames_out",
            path,
            "--output_video",
            tmp_path / f"{name}.mp4",
            *flags,
        )
        assert code == 0, err
        frames[name] = np.load(path).astype(int)
    assert np.abs(frames["xla"] - frames["exp2"]).max() <= 1


@pytest.mark.slow
def test_vae_flags_reach_the_decoder(demo_env, tmp_path, capsys):
    """--vae_decode_chunk all decodes the same frames as one latent frame per step; --vae_tiling
    tiles 64x128 frames (two tiles of 96 columns 64 apart, two tile shapes to compile; the seam is
    blended, so frames change). The decode stage on two latent frames: the VAE flags are its
    (generate's decode is the same stage)."""
    d = tmp_path / "stages"
    latents = np.random.default_rng(0).standard_normal((1, 16, 2, 8, 16)).astype(np.float32)
    stages.save_latents(d / stages.LATENTS_FILE, latents)
    stages.write_config(d, stages.record_stage({}, "denoise", {"model": "demo", "seed": 1}))
    frames = {}
    for name, flags in (
        ("default", ()),
        ("whole", ("--vae_decode_chunk", "all", "--vae_weights_dtype", "float32")),
        ("tiled", ("--vae_tiling", "96:64")),
    ):
        path = tmp_path / f"{name}.npy"
        out = ("--frames_out", path, "--output_video", tmp_path / f"{name}.mp4")
        code, _, err = run(capsys, "decode", "--input_dir", d, *out, *flags)
        assert code == 0, err
        frames[name] = np.load(path)
    assert frames["default"].shape == (1, 5, 64, 128, 3)
    np.testing.assert_array_equal(frames["whole"], frames["default"])
    assert frames["tiled"].shape == frames["default"].shape
    assert (frames["tiled"] != frames["default"]).any()


@pytest.mark.slow
def test_bench_subcommand_prints_its_table(capsys, tmp_path):
    out = tmp_path / "bench.json"
    args = ("bench", "--arch", "1.3B", "--layers", "1", "--height", "16", "--width", "16", "--frames", "1")
    code, stdout, err = run(
        capsys, *args, "--num_inference_steps", "1", "--stages", "denoise", "--repeats", "1", "--json", out
    )
    assert code == 0, err
    assert "denoise" in stdout and out.is_file()


def test_tune_attention_off_tpu_is_a_one_line_error(capsys):
    one_line_error(capsys, ("tune-attention", "--model", "1.3B"), "run it on a TPU", "--allow_interpret")


@pytest.mark.slow
def test_several_prompts_make_a_batch_with_one_video_each(demo_env, tmp_path, capsys):
    """Two prompts (flag or file) run as one batch: two mp4s, frames [2, ...]; batch item i is what its
    prompt gives alone with seed + i."""
    prompts = ["a red fox in the snow", "a blue whale at sea"]
    common = ("--model", "demo", "--num_inference_steps", "2", "--dtype", "float32")
    common += SMALL_GENERATE
    (tmp_path / "prompts.txt").write_text(f"{prompts[0]}\n\n{prompts[1]}\n")
    for name, source in (
        ("flag", ("--prompt", prompts[0], "--prompt", prompts[1])),
        ("file", ("--prompt_file", tmp_path / "prompts.txt")),
    ):
        out = tmp_path / name
        code, _, err = run(
            capsys,
            "generate",
            *common,
            *source,
            "--output_video",
            out / "v.mp4",
            "--frames_out",
            out / "f.npy",
        )
        assert code == 0, err
        assert sorted(p.name for p in out.glob("*.mp4")) == ["v_0.mp4", "v_1.mp4"]
    both = np.load(tmp_path / "flag" / "f.npy")
    assert both.shape[0] == 2 and np.array_equal(both, np.load(tmp_path / "file" / "f.npy"))
    # item i starts from seed + i: the second prompt alone with seed 43 gives the batch's second video
    code, _, err = run(
        capsys,
        "generate",
        *common,
        "--prompt",
        prompts[1],
        "--seed",
        "43",
        "--output_video",
        tmp_path / "one.mp4",
        "--frames_out",
        tmp_path / "one.npy",
    )
    assert code == 0, err
    alone = np.load(tmp_path / "one.npy")[0].astype(int)
    assert np.abs(both[1].astype(int) - alone).max() <= 1
    assert np.abs(both[0].astype(int) - alone).max() > 1


def test_empty_prompt_file_is_a_one_line_error(demo_env, tmp_path, capsys):
    (tmp_path / "p.txt").write_text("\n  \n")
    args = ("generate", "--model", "demo", "--prompt_file", tmp_path / "p.txt")
    one_line_error(capsys, (*args, "--output_video", tmp_path / "v.mp4"), "holds no prompt")
    assert not list(tmp_path.glob("*.mp4"))
