"""``wanjax plan``: per-device memory from abstract shapes, with a verdict against the device memory."""

from __future__ import annotations

import re

import jax

from wanjax.cli.main import main
from wanjax.io.checkpoint import abstract_params
from wanjax.models import dit
from wanjax.models.config import transformer_preset
from wanjax.parallel.mesh import parse_mesh
from wanjax.tools.plan import GiB, model_configs, plan

ARGS = ["plan", "--model", "14B", "--height", "720", "--width", "1280", "--frames", "81"]


def test_14b_720p_on_8_devices_names_a_fitting_mesh(capsys):
    assert main([*ARGS, "--num_devices", "8", "--device_memory", "32GiB"]) == 0
    out = capsys.readouterr().out
    assert "14B: 1280x720, 81 frames, 8 devices" in out
    suggested = re.search(r"suggested: --mesh (\S+) \(peak ([\d.]+) GiB\)", out)
    assert suggested and suggested.group(1) == "dp=2,sp=1,tp=4", out
    assert float(suggested.group(2)) < 0.9 * 32
    verdicts = re.findall(r"mesh (\S+):\n(?:.*\n){3}.*: (fits|does NOT fit)", out)
    assert len(verdicts) == 10  # every (dp, sp, tp) factorisation of 8
    assert dict(verdicts)["dp=8,sp=1,tp=1"] == "does NOT fit"  # 14B replicated: 27 GiB of weights alone


def test_a_non_fitting_mesh_is_reported(capsys):
    assert main([*ARGS, "--mesh", "dp=8,sp=1,tp=1", "--device_memory", "32GiB"]) == 1
    out = capsys.readouterr().out
    assert "does NOT fit" in out and "dp=8,sp=1,tp=1" in out
    assert main([*ARGS, "--mesh", "dp=2,sp=1,tp=4", "--device_memory", "32GiB"]) == 0
    assert main([*ARGS, "--mesh", "dp=2,sp=1,tp=4", "--device_memory", "8GiB"]) == 1


def test_weights_per_device_follow_the_rules():
    model = model_configs("14B")
    abstract = abstract_params(dit.checkpoint_spec(transformer_preset("14B")), "bfloat16")
    total = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(abstract))
    kwargs = dict(height=720, width=1280, frames=81, device_memory=32 * GiB)
    one = plan(model, parse_mesh("dp=1,sp=1,tp=1"), **kwargs)
    four = plan(model, parse_mesh("dp=2,sp=1,tp=4"), **kwargs)
    fsdp = plan(model, parse_mesh("dp=2,sp=1,tp=4", fsdp=True), **kwargs)
    assert one.stages["denoise"].weights == total  # float32-kept leaves included
    assert total / 4 <= four.stages["denoise"].weights < 1.01 * total / 4
    assert fsdp.stages["denoise"].weights < 0.51 * four.stages["denoise"].weights
    # sequence parallelism shrinks the DiT activations, spatial sharding the VAE's
    sp = plan(model, parse_mesh("dp=1,sp=8,tp=1"), **kwargs)
    assert sp.stages["denoise"].activations < one.stages["denoise"].activations / 4
    assert sp.stages["decode"].activations * 8 == one.stages["decode"].activations


def test_bad_plan_flags_are_one_line_errors(capsys):
    assert main([*ARGS, "--mesh", "dp=2,tp=2", "--num_devices", "8"]) == 2
    assert main([*ARGS, "--num_devices", "8", "--device_memory", "lots"]) == 2
    assert main(["plan", "--model", "nope", "--num_devices", "8"]) == 2
    err = capsys.readouterr().err
    assert err.count("wanjax: error:") == 3 and len(err.strip().splitlines()) == 3


def test_vae_decode_activations_include_the_causal_cache():
    """The causal cache (two frames of every causal conv's input) dominates the decoder's live set:
    ~0.9 GiB at 240x416 (the 830 MiB measured in BENCHMARKS.md, plus conv_out's 96-channel site)."""
    from wanjax.models.vae.config import VAEConfig
    from wanjax.tools.plan import vae_cache_bytes

    assert 0.85 * GiB < vae_cache_bytes(VAEConfig(), 240, 416) < 0.95 * GiB
    model = model_configs("14B")
    kwargs = dict(height=720, width=1280, frames=81, device_memory=32 * GiB)
    eight = plan(model, parse_mesh("dp=2,sp=1,tp=4"), **kwargs)
    assert eight.stages["decode"].activations > vae_cache_bytes(model.vae, 720, 1280) / 8
