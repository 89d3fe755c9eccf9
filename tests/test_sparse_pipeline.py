"""Radial attention in a run: dense steps run today's program; sparse runs on a mesh equal one device."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from wanjax.errors import ConfigError
from wanjax.jobs.groups import AttentionFlags
from wanjax.kernels.radial import RadialAttention, radial_block_mask
from wanjax.pipeline.pipeline import WanPipeline

# 33 frames at 128x256: 9 latent frames of 8x16 = 128 tokens (1,152 tokens, 9 blocks of 128), where
# the radial mask (decay 0.2) keeps 68% of the blocks.
SIZE = dict(height=128, width=256, num_frames=33)
STEPS = 3


@pytest.fixture(scope="module")
def demo(demo_env):
    pipe = WanPipeline.from_pretrained("demo", "float32", jax_cache_dir=False)
    text = jax.random.normal(jax.random.key(0), (1, 8, pipe.transformer.cfg.text_dim))
    noise = pipe.prepare_latents(1, SIZE["height"], SIZE["width"], SIZE["num_frames"], seed=0)
    return pipe, text, noise


def denoise(pipe, text, noise, sparse):
    return pipe.denoise(
        text, text * 0.5, noise, num_inference_steps=STEPS, progress=False, sparse_attention=sparse
    )


def test_the_grid_is_sparse():
    assert radial_block_mask(9, 128, 0.2).mean() < 0.7


@pytest.mark.slow
def test_dense_steps_equal_the_dense_run_bit_for_bit(demo):
    pipe, text, noise = demo
    dense = denoise(pipe, text, noise, None)
    covered = denoise(pipe, text, noise, RadialAttention(0.2, dense_timestep=STEPS))
    assert covered.sparse_steps == ()
    np.testing.assert_array_equal(np.asarray(covered.latents), np.asarray(dense.latents))
    sparse = denoise(pipe, text, noise, RadialAttention(0.2, dense_timestep=1, dense_block=1))
    assert sparse.sparse_steps == (1, 2)
    assert np.isfinite(np.asarray(sparse.latents)).all()
    assert not np.array_equal(np.asarray(sparse.latents), np.asarray(dense.latents))


@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["dp=1,sp=8,tp=1", "dp=2,sp=4,tp=1"], ids=["allgather", "ulysses"])
def test_sparse_on_8_devices_equals_one_device(demo, mesh):
    """4 heads: sp=8 all-gathers the keys (each device its 144 query rows of the mask), sp=4 Ulysses.
    The mesh sums in another order: the sparse run's difference from one device stays within the
    dense run's own (measured: 1.05e-5 for the dense run under dp=2,sp=4) and 1e-5 relative."""
    pipe, text, noise = demo
    radial = RadialAttention(0.2, dense_block=1)
    sharded = WanPipeline.from_pretrained("demo", "float32", jax_cache_dir=False, mesh=mesh)
    diffs = {}
    for sparse in (None, radial):
        one, got = denoise(pipe, text, noise, sparse), denoise(sharded, text, noise, sparse)
        diffs[sparse] = float(np.abs(np.asarray(got.latents) - np.asarray(one.latents)).max())
        np.testing.assert_allclose(np.asarray(got.latents), np.asarray(one.latents), rtol=1e-5, atol=1e-5)
    assert got.sparse_steps == one.sparse_steps == tuple(range(STEPS))
    print(f"{mesh}: max difference from one device, dense {diffs[None]:.2e}, sparse {diffs[radial]:.2e}")
    assert diffs[radial] <= max(1e-5, 2 * diffs[None])


def test_options_by_the_authors_names():
    flags = AttentionFlags(sparse_attention="radial", sparse_option=("decay_factor=0.2", "dense_timestep=12"))
    assert flags.sparse() == RadialAttention(0.2, dense_timestep=12)
    assert AttentionFlags().sparse() is None
    with pytest.raises(
        ConfigError,
        match=r"unknown --sparse_option 'decay'.*valid: decay_factor, dense_timestep, dense_block",
    ):
        AttentionFlags(sparse_attention="radial", sparse_option=("decay=0.2",)).sparse()
    with pytest.raises(ConfigError, match="not a int"):
        AttentionFlags(sparse_attention="radial", sparse_option=("dense_block=x",)).sparse()
    with pytest.raises(ConfigError, match="needs --sparse_attention radial"):
        AttentionFlags(sparse_option=("dense_block=1",)).sparse()


@pytest.mark.parametrize(
    "flags,needle",
    [
        (
            ["--sparse_attention", "radial", "--sparse_option", "decay=0.2"],
            "valid: decay_factor, dense_timestep",
        ),
        (["--sparse_option", "dense_block=1"], "needs --sparse_attention radial"),
        (["--sparse_attention", "radial", "--window_size", "64"], "cannot be combined"),
    ],
)
def test_a_bad_sparse_flag_is_one_line_before_any_work(capsys, tmp_path, flags, needle):
    from wanjax.cli.main import main

    args = [
        "generate",
        "--model",
        "demo",
        "--prompt",
        "a cat",
        "--output_video",
        str(tmp_path / "out" / "v.mp4"),
        *flags,
    ]
    code = main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and needle in err[0], err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_bench_reports_density_and_the_sparse_steps_flops(tmp_path):
    """``bench --sparse_attention radial``: the JSON's density is the mask's, the sparse step's FLOPs
    the dense step's with the sparse blocks' self-attention cut to the kept pairs."""
    import argparse
    import dataclasses
    import json

    from wanjax.models.registry import transformer_preset
    from wanjax.tools import bench
    from wanjax.tools.flops import dit_step_flops, sparse_step_flops

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    out = tmp_path / "bench.json"
    args = ["--layers", "2", "--height", "128", "--width", "256", "--frames", "33", "--repeats", "1"]
    sparse = [
        "--sparse_attention",
        "radial",
        "--sparse_option",
        "dense_timestep=1",
        "--sparse_option",
        "dense_block=1",
    ]
    bench.run(
        parser.parse_args(
            [*args, *sparse, "--max_sequence_length", "16", "--stages", "denoise", "--json", str(out)]
        )
    )
    denoise = json.loads(out.read_text())["stages"]["denoise"]
    report = denoise["sparse_attention"]
    assert report["attention_density"] == pytest.approx(radial_block_mask(9, 128, 1.0).mean())
    assert report["sparse_steps"] == [1] and report["dense_block"] == 1
    cfg = dataclasses.replace(transformer_preset("1.3B"), num_layers=2)
    shape = (1, 16, 9, 16, 32)
    step = dit_step_flops(cfg, shape, 16, context_cached=True)
    expected = sparse_step_flops(cfg, shape, step, RadialAttention(dense_timestep=1, dense_block=1))
    assert report["tflop_sparse_step"] * 1e12 == pytest.approx(expected.total)
    assert expected.attention < step.attention and denoise["tflop"] * 1e12 == pytest.approx(step.total)


@pytest.mark.slow
def test_the_run_record_says_which_steps_and_blocks_ran_sparse(demo_env, tmp_path, capsys):
    import json

    from wanjax.cli.main import main

    record = tmp_path / "v.json"
    args = ["generate", "--model", "demo", "--prompt", "a cat", "--height", "32", "--width", "48"]
    args += ["--frames", "5", "--num_inference_steps", "3", "--output_video", str(tmp_path / "v.mp4")]
    args += [
        "--sparse_attention",
        "radial",
        "--sparse_option",
        "dense_timestep=1",
        "--sparse_option",
        "dense_block=2",
    ]
    assert main(args) == 0, capsys.readouterr().err
    written = json.loads(record.read_text())
    found = written.get("sparse_attention") or written.get("extra", {}).get("sparse_attention")
    assert found == {"kind": "radial", "sparse_steps": [1, 2], "sparse_blocks_from": 2, "decay_factor": 1.0}


@pytest.mark.parametrize("command", ["generate", "denoise", "serve"])
def test_the_flags_reach_the_job(command):
    """``generate``, the ``denoise`` stage and the server's start flags parse the same two flags; a
    server's jobs start from its flags."""
    from wanjax.cli.main import build_parser, subcommands
    from wanjax.jobs.flags import from_namespace

    commands = subcommands()
    schema = commands[command].schema
    flags = [
        "--sparse_attention",
        "radial",
        "--sparse_option",
        "decay_factor=0.2",
        "--sparse_option",
        "dense_block=1",
    ]
    request = from_namespace(schema, build_parser(commands).parse_args([command, *flags]))
    request = request.job_base() if command == "serve" else request
    assert request.attention.sparse() == RadialAttention(0.2, dense_block=1)


@pytest.mark.slow
def test_plan_compiles_the_sparse_step_and_reports_its_density(tmp_path, capsys):
    """``plan --compile --sparse_attention radial``: the sparse step compiles for the TPU beside the
    dense one, its analytic FLOPs the sparse step's, the JSON's density the mask's."""
    import json

    from wanjax.cli.main import main
    from wanjax.models.registry import transformer_preset
    from wanjax.tools.flops import dit_step_flops, sparse_step_flops

    out = tmp_path / "plan.json"
    args = ["plan", "--model", "1.3B", "--height", "128", "--width", "256", "--frames", "33"]
    args += ["--compile", "v6e-8", "--programs", "step", "--sparse_attention", "radial", "--json", str(out)]
    assert main(args) == 0, capsys.readouterr().err
    report = json.loads(out.read_text())
    assert report["attention_density"] == pytest.approx(radial_block_mask(9, 128, 1.0).mean())
    flops = {p["name"]: p["analytic_flops"] for p in report["programs"] if p["compiled"]}
    step = dit_step_flops(transformer_preset("1.3B"), (1, 16, 9, 16, 32), context_cached=True)
    sparse = sparse_step_flops(transformer_preset("1.3B"), (1, 16, 9, 16, 32), step, RadialAttention())
    assert flops == {"step": step.total, "step_sparse": sparse.total}
    assert "radial attention: 67.9% of the self-attention blocks kept" in capsys.readouterr().out
