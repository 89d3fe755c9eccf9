"""Meshes, sharding rules and sharded runs: parsing and rules; weights and whole pipelines on the 8 fake
CPU devices of the test process (tests/conftest.py); the command line on 8 devices and on one in new
processes."""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import meshes as mesh_runs
from helpers.meshes import write_model
from helpers.processes import xla_flags
from helpers.small_video import SMALL_GENERATE
from jax.sharding import PartitionSpec as P

from wanjax.errors import WanjaxError
from wanjax.models import dit, umt5
from wanjax.models.registry import transformer_preset
from wanjax.parallel.attention import sequence_mode
from wanjax.parallel.layouts import frame_layout, token_layout
from wanjax.parallel.mesh import auto_mesh, mesh_spec_from_flags, parse_mesh
from wanjax.parallel.rules import partition_spec, per_device_param_bytes

MESHES = ["dp=1,sp=1,tp=8", "dp=2,sp=1,tp=4", "dp=2,sp=2,tp=2", "dp=1,sp=8,tp=1", "dp=8,sp=1,tp=1"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(write_model(tmp_path_factory.mktemp("sharding") / "model"))


# ----------------------------------------------------------------------------------------------
# Mesh flags


def test_parse_mesh_keeps_the_written_order():
    spec = parse_mesh("tp=4, dp=2")
    assert spec.axes == (("tp", 4), ("dp", 2), ("sp", 1)) and spec.shape == (2, 1, 4)
    assert parse_mesh("dp=2,sp=1,tp=4").axes == (("dp", 2), ("sp", 1), ("tp", 4))


@pytest.mark.parametrize("text", ["dp=2,xp=4", "dp=two", "dp=0", "dp=2,dp=2", "", "dp2"])
def test_bad_mesh_strings_are_one_line_errors(text):
    with pytest.raises(WanjaxError, match="mesh") as info:
        parse_mesh(text)
    assert "\n" not in str(info.value) and "dp=2,sp=1,tp=4" in str(info.value)


def test_mesh_must_use_every_device():
    with pytest.raises(WanjaxError, match=r"uses 4 devices but 8 are available.*--mesh dp=2,sp=1,tp=4"):
        mesh_spec_from_flags("dp=2,tp=2", 8, heads=12)


def test_auto_mesh_fits_devices_and_divides_heads():
    assert auto_mesh(8, 12).shape == (2, 1, 4)  # 1.3B: tp=4 divides 12 heads
    assert auto_mesh(8, 40).shape == (2, 1, 4)  # 14B
    assert auto_mesh(8, 5).shape == (2, 4, 1)  # nothing divides 5 heads: the rest goes to sp
    assert auto_mesh(1, 12).shape == (1, 1, 1)
    assert auto_mesh(6, 12).shape == (2, 1, 3)
    assert mesh_spec_from_flags(None, 8, heads=12) == auto_mesh(8, 12)


def test_reference_flags_are_aliases():
    assert mesh_spec_from_flags(None, 8, use_dp=True).shape == (2, 1, 4)
    assert mesh_spec_from_flags(None, 8, use_dp=True, sp_num=2).shape == (2, 2, 2)
    assert mesh_spec_from_flags(None, 8, sp_num=8).shape == (1, 8, 1)
    assert mesh_spec_from_flags("auto", 8, use_fsdp=True).fsdp
    with pytest.raises(WanjaxError, match="does not divide the 8 devices"):
        mesh_spec_from_flags(None, 8, use_dp=True, sp_num=3)
    with pytest.raises(WanjaxError, match="either --mesh or"):
        mesh_spec_from_flags("dp=8", 8, use_dp=True)


# ----------------------------------------------------------------------------------------------
# Rules


def test_rules_split_only_dividing_dimensions():
    sizes = {"dp": 2, "sp": 1, "tp": 4}
    assert partition_spec(("layers", "embed", "heads"), (30, 1536, 1536), sizes) == P(None, None, "tp")
    assert partition_spec(("layers", "heads", "embed"), (30, 1536, 1536), sizes) == P(None, "tp")
    assert partition_spec(("layers", "embed", "heads"), (30, 1536, 1536), sizes, fsdp=True) == P(
        None, "dp", "tp"
    )
    assert partition_spec(("layers", "mlp"), (30, 6), sizes) == P()  # 4 does not divide 6: replicated
    fsdp_all = {"dp": 2, "sp": 2, "tp": 2}
    assert partition_spec(("embed", "mlp"), (8, 8), fsdp_all, fsdp=True) == P(("dp", "sp"), "tp")


@pytest.mark.parametrize(
    "mesh, layout, mode",
    [
        ("dp=1,sp=1,tp=8", ((), ("tp",), ()), "allgather"),  # 12 heads: tp=8 splits the tokens
        ("dp=2,sp=1,tp=4", (("dp",), (), ("tp",)), "local"),
        ("dp=2,sp=2,tp=2", (("dp",), ("sp",), ("tp",)), "ulysses"),
        ("dp=1,sp=8,tp=1", ((), ("sp",), ()), "allgather"),
        ("dp=8,sp=1,tp=1", ((), ("dp",), ()), "allgather"),  # CFG pair of 2: dp=8 splits the tokens
    ],
)
def test_token_layouts_of_the_test_meshes(mesh, layout, mode):
    sizes = parse_mesh(mesh).sizes
    got = token_layout(sizes, batch=2, length=16, heads=12)
    assert (got.batch, got.seq, got.heads) == layout
    assert sequence_mode(got, sizes, 12) == mode


@pytest.mark.parametrize(
    "mesh, rows, batch_axes",
    [
        ("dp=2,sp=1,tp=4", 42, ("dp",)),  # the 14B's CFG pair of 21 frames: the heads stay on tp
        ("dp=2,sp=2,tp=2", 4, ("dp", "sp")),  # two frames per row of the batch: sp splits whole frames
        ("dp=2,sp=2,tp=2", 6, ("dp",)),  # three: sp cannot, and computes redundantly
        ("dp=1,sp=8,tp=1", 8, ("sp",)),
    ],
)
def test_per_frame_attention_splits_rows_and_keeps_the_heads(mesh, rows, batch_axes):
    sizes = parse_mesh(mesh).sizes
    tokens = token_layout(sizes, batch=2, length=rows * 16, heads=8)
    got = frame_layout(tokens, sizes, rows)
    assert (got.batch, got.seq, got.heads) == (batch_axes, (), tokens.heads)


def test_14b_weights_are_sharded_not_replicated():
    """Under (2,1,4) the 14B transformer and the UMT5-XXL encoder keep < 1% of their bytes replicated
    and each device holds about a quarter; FSDP over dp halves that again."""
    cfg = transformer_preset("14B")
    spec = dit.checkpoint_spec(cfg)
    sizes = {"dp": 2, "sp": 1, "tp": 4}
    total, _ = per_device_param_bytes(spec, "bfloat16", {"dp": 1, "sp": 1, "tp": 1})
    per_device, replicated = per_device_param_bytes(spec, "bfloat16", sizes)
    fsdp, _ = per_device_param_bytes(spec, "bfloat16", sizes, fsdp=True)
    assert replicated < 0.01 * total
    assert total / 4 <= per_device < 1.01 * total / 4
    assert total / 8 <= fsdp < 1.02 * total / 8
    te = umt5.UMT5Config(vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64)
    spec = umt5.checkpoint_spec(te)
    total, _ = per_device_param_bytes(spec, "bfloat16", {"tp": 1})
    per_device, replicated = per_device_param_bytes(spec, "bfloat16", sizes)
    assert replicated < 0.01 * total and per_device < 1.01 * total / 4


# ----------------------------------------------------------------------------------------------
# On 8 fake devices


@pytest.mark.slow
def test_large_leaves_are_sharded_and_bytes_fall_with_tp(model_dir):
    meshes = ["dp=8,sp=1,tp=1", "dp=4,sp=1,tp=2", "dp=2,sp=1,tp=4", "dp=1,sp=1,tp=8"]
    report = mesh_runs.params(model_dir, meshes)
    leaves = report["dp=2,sp=1,tp=4"]["leaves"]
    large = {k: v for k, v in leaves.items() if 4 * _prod(v["shape"]) >= 64 * 1024}
    assert {k.split("/")[0] for k in large} == {"dit", "umt5"} and len(large) >= 12
    for name, leaf in large.items():
        assert "tp" in leaf["spec"], (name, leaf)  # split over tp ...
        assert leaf["uniform"] and _prod(leaf["shard_shape"]) * 4 == _prod(leaf["shape"]), (name, leaf)
    assert leaves["umt5/embedding"]["spec"] == "P(None, 'tp')"  # a vocabulary of 261: the model dim
    assert leaves["dit/blocks/attn1/to_q/kernel"]["spec"] == "P(None, None, 'tp')"  # columns
    assert leaves["dit/blocks/attn1/to_out/kernel"]["spec"] == "P(None, 'tp')"  # rows
    assert leaves["dit/blocks/ffn/proj_out/kernel"]["spec"] == "P(None, 'tp')"
    per_device = [report[m]["max_device_bytes"] for m in meshes]
    assert all(a > b for a, b in itertools.pairwise(per_device)), per_device
    assert per_device[-1] < 0.3 * per_device[0], per_device


@pytest.mark.parametrize("mesh, prompts", [("dp=2,sp=1,tp=4", 1), ("dp=8,sp=1,tp=1", 4)])
def test_text_encoder_splits_the_prompts_over_dp(model_dir, mesh, prompts):
    """Prompts and negatives run on different dp groups (each computes its share), as on one device;
    a batch dp does not divide stays whole."""
    from wanjax.models.umt5 import load_text_encoder
    from wanjax.parallel.mesh import make_mesh
    from wanjax.parallel.rules import param_sharding

    single = load_text_encoder(model_dir, "float32")
    encoder = load_text_encoder(model_dir, "float32", sharding=param_sharding(make_mesh(parse_mesh(mesh))))
    assert encoder.lower(2 * prompts, 16).compile().output_shardings.spec[0] == "dp"
    assert encoder.lower(3, 16).compile().output_shardings.spec in (P(), P(None))
    texts = [f"a red cat walks, take {i}" for i in range(prompts)]
    ref, got = (np.asarray(e.encode_prompt(texts, None, 16)[1]) for e in (single, encoder))
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5)


def _prod(shape: list[int]) -> int:
    return math.prod(shape)


@pytest.mark.slow
def test_five_meshes_match_the_single_device_run(model_dir):
    """encode -> 2 UniPC steps with CFG -> decode on each mesh vs one device, float32."""
    report = mesh_runs.parity(model_dir, MESHES)
    modes = {m: r["mode"] for m, r in report.items()}
    assert set(modes.values()) == {"allgather", "ulysses", "local"}, modes
    for mesh, r in report.items():
        assert r["frames_shape"] == [1, 5, 32, 64, 3]
        assert r["latents_rel"] <= 1e-5, (mesh, r)
        assert r["frames_max"] <= 1, (mesh, r)
        assert r["embeds_max"] <= 1e-5, (mesh, r)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["demo-i2v", "demo-a14b", "demo-i2v-a14b", "demo-ti2v"])
def test_image_to_video_and_wan22_on_meshes_match_the_single_device_run(variant, tmp_path):
    """The I2V demo model (CLIP sharded as UMT5, image tokens beside the text tokens), the two-expert
    ones (both experts sharded, switching at the same step; image to video: the conditioning latents
    alone) and the TI2V one (the Wan 2.2 VAE, the image's latents as frame 0 at timestep 0), float32."""
    meshes = ("dp=2,sp=2,tp=2", "dp=1,sp=8,tp=1")  # heads and tokens split; tokens over all 8
    if variant == "demo-i2v":  # the image tokens beside the text under tensor parallelism alone too
        meshes = ("dp=1,sp=1,tp=8", *meshes)
    report = mesh_runs.demo_parity(str(tmp_path / variant), variant, list(meshes))
    for mesh, r in report.items():
        if variant == "demo-i2v":
            assert r["condition_max"] <= 1e-5 and r["states_max"] <= 1e-5, (mesh, r)
        elif variant in ("demo-ti2v", "demo-i2v-a14b"):
            assert r["condition_max"] <= 1e-5 and "states_max" not in r, (mesh, r)
        if variant.endswith("a14b"):  # 4 steps: 999, 900 | 750, 500 (0.875); 999, 900 | ... (0.9)
            assert r["experts"][0] == r["experts"][1] == [0, 0, 1, 1], (mesh, r)
        assert r["latents_rel"] <= 1e-5, (mesh, r)
        assert r["frames_max"] <= 1, (mesh, r)


@pytest.mark.slow
def test_video_to_video_on_meshes_matches_the_single_device_run(tmp_path):
    """The source video encoded split over the mesh as the decoder's latents, noised and denoised
    from the second of four steps (strength 0.75), float32."""
    report = mesh_runs.demo_parity(str(tmp_path / "demo"), "demo", ["dp=2,sp=2,tp=2", "dp=1,sp=8,tp=1"], 0.75)
    for mesh, r in report.items():
        assert r["condition_max"] <= 1e-5 and r["experts"][0] == [0, 0, 0], (mesh, r)
        assert r["latents_rel"] <= 1e-5 and r["frames_max"] <= 1, (mesh, r)


@pytest.mark.slow
def test_small_frames_split_into_strips_decode_as_on_one_device(tmp_path):
    """Latents whose 2-D or one-pixel splits XLA's partitioner decoded wrongly (up to 236 levels off):
    split into strips at least two latent pixels wide, they decode as on one device; so does the
    accelerators' formulation (ring caches)."""
    cases = ["2x4@dp=2,sp=2,tp=2", "4x2@dp=2,sp=1,tp=2", "2x2@dp=2,sp=1,tp=2", "4x8@dp=1,sp=2,tp=4"]
    cases += ["4x8@dp=1,sp=2,tp=4@ring"]
    report = mesh_runs.vae_strips(str(tmp_path / "demo"), cases)
    for case, r in report.items():
        assert r["max"] <= 1, (case, r)
    for conv in ("", "@ring"):  # 4 columns a strip
        assert report[f"4x8@dp=1,sp=2,tp=4{conv}"]["spec"] == "P(None, None, None, None, 'sp')"
    assert report["2x2@dp=2,sp=1,tp=2"]["spec"] == "P(None, None, None, None, None)"  # too small to split


@pytest.mark.slow
def test_vae_decode_memory_per_device_shrinks_with_spatial_sharding(model_dir):
    report = mesh_runs.vae_memory(model_dir, [1, 2, 8])
    temp = {n: r["temp"] for n, r in report.items()}
    assert report[8]["spec"] == "P(None, None, None, None, 'sp')"  # width 32 over 8 devices
    assert temp[2] < 0.6 * temp[1] and temp[8] < 0.25 * temp[1], temp


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--mesh", "dp=2,qp=4"], "bad --mesh entry 'qp=4'"),
        (["--use_dp", "--mesh", "dp=2"], "either --mesh or --use_dp/--sp_num"),
    ],
)
def test_cli_refuses_bad_mesh_flags_in_one_line(flags, message, capsys, tmp_path):
    from wanjax.cli.main import main

    args = ["generate", "--model", "demo", "--prompt", "a cat", "--output_video", str(tmp_path / "v.mp4")]
    assert main([*args, *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def _generate(cwd: Path, model: str, devices: int, name: str, *flags: str) -> tuple[np.ndarray, str]:
    """``wanjax generate`` on ``devices`` fake CPU devices in a new process; its uint8 frames and report."""
    env = {
        **os.environ,
        "XLA_FLAGS": xla_flags(devices),
        "JAX_PLATFORMS": "cpu",
    }
    args = ["--model", model, "--prompt", "cat", "--height", "32", "--width", "64", "--frames", "5"]
    args += ["--num_inference_steps", "2", "--dtype", "float32"]
    args += ["--output_video", f"{name}.mp4", "--frames_out", f"{name}.npy", *flags]
    result = subprocess.run(
        [sys.executable, "-m", "wanjax.cli", "generate", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return np.load(cwd / f"{name}.npy"), result.stdout


@pytest.mark.slow
def test_cli_runs_a_tp_that_does_not_divide_the_heads(model_dir, tmp_path):
    """``--mesh dp=1,sp=1,tp=8`` on the 12-head model: tp joins the token split, the frames are the
    one-device frames to float32 rounding."""
    sharded, report = _generate(tmp_path, model_dir, 8, "tp8", "--mesh", "dp=1,sp=1,tp=8")
    single, _ = _generate(tmp_path, model_dir, 1, "one")
    assert "mesh: dp=1, sp=1, tp=8: tokens" in report
    assert sharded.shape == (1, 5, 32, 64, 3)
    assert np.abs(sharded.astype(int) - single).max() <= 1


@pytest.mark.slow
@pytest.mark.all_devices
def test_a_command_without_a_mesh_spans_every_device(demo_env, tmp_path, capsys):
    """No ``--mesh`` on an 8-device host: the command's automatic mesh over all eight, in its summary
    and its record."""
    from wanjax.cli.main import main

    args = ["generate", "--model", "demo", "--prompt", "a cat", *SMALL_GENERATE, "--num_inference_steps", "1"]
    assert main([*args, "--output_video", str(tmp_path / "v.mp4")]) == 0
    layout = "dp=2: batch, sp=1, tp=4: heads"  # auto_mesh(8, 12): tp divides the demo's 12 heads
    assert f"mesh: {layout}" in capsys.readouterr().out
    assert json.loads((tmp_path / "v.json").read_text())["mesh"] == layout


def test_the_layout_says_how_each_mesh_axis_is_used():
    sizes = parse_mesh("dp=1,sp=2,tp=2").sizes
    assert (
        token_layout(sizes, batch=2, length=16, heads=3).describe(sizes) == "dp=1, sp=2: tokens, tp=2: tokens"
    )
    sizes = parse_mesh("dp=2,sp=1,tp=4").sizes
    assert (
        token_layout(sizes, batch=2, length=16, heads=12).describe(sizes) == "dp=2: batch, sp=1, tp=4: heads"
    )
