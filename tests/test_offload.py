"""Weight offloading: stage-wise residency (``offload="model"``) and the DiT's streamed layers
(``offload="blocks"``) give the resident run's results, on one device and on an 8-device mesh, and
a streamed step holds a fraction of the resident step's device memory.

``python tests/test_offload.py`` prints the measurements quoted in the report (memory of the 1.3B
step program per mode, step time per mode).
"""

from __future__ import annotations

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wanjax import WanPipeline
from wanjax.errors import ConfigError
from wanjax.io.checkpoint import abstract_params, random_params
from wanjax.models import dit, umt5
from wanjax.models.offload import (
    HOST,
    OFFLOAD_MODES,
    host_bytes,
    memory_kind,
    offload_sharding,
    parse_offload,
    program_memory,
    stream_layers,
    streamed_path,
    streams_layers,
)
from wanjax.models.offload import streamed as streamed_leaf
from wanjax.models.registry import transformer_preset
from wanjax.models.settings import RunSettings
from wanjax.parallel.rules import per_device_param_bytes
from wanjax.sampling.context_cache import cache_bytes
from wanjax.sampling.sampler import Sampler
from wanjax.sampling.scheduler import SchedulerConfig, make_scheduler


def kinds(tree) -> set[str]:
    return {memory_kind(a) for a in jax.tree.leaves(tree)}


def test_parse_offload():
    assert [parse_offload(m) for m in ("none", "MODEL", "blocks", None)] == [
        "none",
        "model",
        "blocks",
        "none",
    ]
    with pytest.raises(ConfigError, match=r"unknown offload 'layers'; use one of none, model, blocks$"):
        parse_offload("layers")
    with pytest.raises(ConfigError):
        WanPipeline.from_pretrained("demo", offload="host", jax_cache_dir=False)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("prefetch", [True, False])
def test_streamed_layers_equal_the_scan(dtype, prefetch):
    """A pytree of stacked leaves in host memory (mixed dtypes, an int leaf), streamed: the scan's result."""
    rng = np.random.default_rng(0)
    host = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind=HOST)
    layers = {
        "w": jnp.asarray(rng.standard_normal((5, 8, 8)) / 3, dtype),
        "b": jnp.asarray(rng.standard_normal((5, 8)), jnp.float32),
        "k": jnp.arange(5, dtype=jnp.int32),
    }
    on_host = jax.device_put(layers, host)
    assert kinds(on_host) == {HOST}

    def body(h, p):
        return (jnp.tanh(h @ p["w"]) + p["b"] * p["k"].astype(h.dtype)).astype(h.dtype)

    x = jnp.asarray(rng.standard_normal((3, 8)), dtype)
    want = jax.jit(lambda x, ls: jax.lax.scan(lambda h, p: (body(h, p), None), x, ls)[0])(x, layers)
    got = jax.jit(lambda x, ls: stream_layers(body, x, ls, prefetch=prefetch))(x, on_host)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


def _assert_kernels_stream(params, stacked: str) -> None:
    """The stacked matmul kernels in host memory (most of the stack's bytes), every other leaf on the
    device (the stacked norms and biases included)."""
    leaves = jax.tree_util.tree_leaves_with_path(params[stacked])
    host = [a for path, a in leaves if streamed_path(path)]
    assert kinds(host) == {HOST} and kinds([a for path, a in leaves if not streamed_path(path)]) == {"device"}
    assert sum(a.nbytes for a in host) > 0.8 * sum(a.nbytes for _, a in leaves)
    assert kinds({k: v for k, v in params.items() if k != stacked}) == {"device"}


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_blocks_transformer_equals_resident(dtype):
    cfg = transformer_preset("tiny", num_layers=3)
    spec = dit.checkpoint_spec(cfg)
    resident = dit.WanTransformer(cfg, random_params(spec, dtype, seed=1), RunSettings(dtype))
    params = random_params(spec, dtype, seed=1, sharding=offload_sharding(None, "blocks"))
    streamed = dit.WanTransformer(cfg, params, RunSettings(dtype, offload="blocks"))
    _assert_kernels_stream(params, "blocks")
    latents = jax.random.normal(jax.random.key(0), (2, 16, 2, 8, 8))
    text = jax.random.normal(jax.random.key(1), (2, 7, cfg.text_dim))
    want = np.asarray(resident(latents, 500.0, text), np.float32)
    got = np.asarray(streamed(latents, 500.0, text), np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-6 if dtype == "float32" else 1e-2, atol=1e-6)


@pytest.mark.parametrize("mode", ["model", "blocks"])
def test_streamed_text_encoder_equals_resident(mode):
    """Under ``model`` and ``blocks`` the text encoder's layers are read into host memory and
    streamed: the resident encoder's embeddings, bit for bit in float32."""
    cfg = umt5.UMT5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=24, num_layers=3, num_heads=2)
    spec = umt5.checkpoint_spec(cfg)
    resident = umt5.UMT5Encoder(cfg, random_params(spec, "float32", seed=2), None)
    params = random_params(spec, "float32", seed=2, sharding=offload_sharding(None, mode, per_step=False))
    streamed = umt5.UMT5Encoder(cfg, params, None, offload=mode)
    _assert_kernels_stream(params, "layers")
    ids = np.random.default_rng(0).integers(0, 64, (2, 9))
    mask = np.ones_like(ids)
    mask[1, 5:] = 0
    want = np.asarray(resident.encode_ids(ids, mask))
    np.testing.assert_array_equal(np.asarray(streamed.encode_ids(ids, mask)), want)
    streamed.to_host()
    assert kinds(streamed.params) == {HOST}
    streamed.to_device()
    _assert_kernels_stream(streamed.params, "layers")


def test_which_models_stream():
    assert [streams_layers(m) for m in OFFLOAD_MODES] == [False, False, True]
    assert [streams_layers(m, per_step=False) for m in OFFLOAD_MODES] == [False, True, True]


def step_memory(mode: str, num_layers: int = 8, dtype: str = "bfloat16") -> dict[str, int]:
    """Memory of the guided 1.3B step program (as the pipeline compiles it) for abstract weights."""
    cfg = transformer_preset("1.3B", num_layers=num_layers)
    sharding = dit.transformer_sharding(None, False, mode) or offload_sharding(None, "none")
    params = abstract_params(dit.checkpoint_spec(cfg), dtype, sharding)
    model = dit.WanTransformer(cfg, params, RunSettings(dtype, offload=mode))
    latents = jax.ShapeDtypeStruct((1, 16, 3, 16, 16), jnp.float32)
    text = jax.ShapeDtypeStruct((1, 512, cfg.text_dim), dtype)
    program = Sampler(model).compile(make_scheduler(SchedulerConfig(), 4), latents, text, text)
    shardings = jax.tree.leaves(program.input_shardings[0][0])
    host = sum(s.memory_kind == HOST for s in shardings)
    kernels = sum(streamed_path(path) for path, _ in jax.tree_util.tree_leaves_with_path(params["blocks"]))
    assert host == (kernels if mode == "blocks" else 0), "memory kinds lost"
    return program_memory(program)


@pytest.mark.slow
@pytest.mark.parametrize("dtype,num_layers", [("bfloat16", 8), ("float32", 30)])
@pytest.mark.bit_for_bit
def test_streamed_step_memory_is_a_quarter_of_the_resident_step(dtype, num_layers):
    """The 1.3B dims: the streamed step's device memory holds the non-stacked weights, the inputs,
    two layers' weights and the activations; the stacked weights are host arguments (the resident
    step also reads the text K/V cache, off where the weights are offloaded). What ``wanjax plan``
    can count without compiling: the device-resident leaves' bytes."""
    resident, streamed = (step_memory(mode, num_layers, dtype) for mode in ("none", "blocks"))
    cfg = transformer_preset("1.3B", num_layers=num_layers)
    spec = dit.checkpoint_spec(cfg)
    on_device, _ = per_device_param_bytes(spec, dtype, {}, where=lambda s: not streamed_leaf(s, "blocks"))
    everything, _ = per_device_param_bytes(spec, dtype, {})
    inputs = 32 << 20  # latents, scheduler state and the two (1, 512, 4096) prompt embeddings
    text_kv = cache_bytes(cfg, 2, 512, 0, jnp.dtype(dtype).itemsize)  # resident only (default_on)
    assert resident["host_argument"] == 0
    assert everything + text_kv <= resident["argument"] <= everything + text_kv + inputs
    assert streamed["host_argument"] == everything - on_device
    assert on_device <= streamed["argument"] <= on_device + inputs
    assert streamed["total"] <= resident["total"] / 4, (streamed, resident)


def test_sampler_compile_is_the_program_a_call_runs():
    cfg = transformer_preset("tiny", num_layers=2)
    spec = dit.checkpoint_spec(cfg)
    params = random_params(spec, "float32", sharding=offload_sharding(None, "blocks"))
    sampler = Sampler(dit.WanTransformer(cfg, params, RunSettings("float32", offload="blocks")))
    scheduler = make_scheduler(SchedulerConfig(), 2)
    latents = np.random.default_rng(0).standard_normal((1, 16, 1, 4, 4)).astype(np.float32)
    text = jnp.ones((1, 8, cfg.text_dim), jnp.float32)
    abstract = jax.ShapeDtypeStruct(latents.shape, latents.dtype)
    compiled = sampler.compile(scheduler, abstract, jax.ShapeDtypeStruct(text.shape, text.dtype), text)
    sampler(scheduler, latents, text, text, 5.0)
    assert sampler.programs() == (compiled,)


# ----------------------------------------------------------------------------------------------
# The pipeline

GEN = dict(height=32, width=48, num_frames=5, num_inference_steps=2, progress=False)


def run(pipe: WanPipeline, check=lambda stage: None) -> tuple[np.ndarray, np.ndarray]:
    """encode, denoise, decode; ``check(stage)`` after each."""
    pos, neg = pipe.encode_prompt(["a red cat", "a dog"], max_sequence_length=16)
    check("encode")
    noise = pipe.prepare_latents(2, GEN["height"], GEN["width"], GEN["num_frames"], 1)
    latents = pipe.denoise(pos, neg, noise, num_inference_steps=2, progress=False).latents
    check("denoise")
    frames = pipe.decode(latents)
    check("decode")
    return np.asarray(latents), frames


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.bit_for_bit
def test_pipeline_offload_modes_equal_the_resident_run(demo_env, dtype):
    """``model``: the same latents and frames bit for bit, each component in device memory only
    during its stage, and a second prompt compiles nothing (the weights come back with the
    shardings the programs were compiled for); ``blocks``: the same, the transformer's layers
    always on the host, and the resident run's results to float rounding."""
    runs = {}
    for mode in OFFLOAD_MODES:
        pipe = WanPipeline.from_pretrained("demo", dtype=dtype, jax_cache_dir=False, offload=mode)
        runs[mode] = run(pipe)
        if mode == "none":
            assert host_bytes(pipe.text_encoder.params) == host_bytes(pipe.transformer.params) == 0
            continue

        def check(stage: str, pipe=pipe, mode=mode) -> None:
            encoder, transformer = pipe.text_encoder.params, pipe.transformer.params
            blocks = transformer["blocks"]
            rest = {k: v for k, v in transformer.items() if k != "blocks"}
            if stage == "encode":  # the encoder streams its layers' kernels under both modes
                _assert_kernels_stream(encoder, "layers")
                assert kinds(transformer) == {HOST}
            elif stage == "denoise":
                assert kinds(encoder) == {HOST} and kinds(rest) == {"device"}
                if mode == "blocks":
                    _assert_kernels_stream(transformer, "blocks")
                else:
                    assert kinds(blocks) == {"device"}
            else:
                assert kinds(encoder) == kinds(transformer) == {HOST}

        check("decode")
        before = {s: t.programs for s, t in pipe.timings.items()}
        second = run(pipe, check)
        assert {s: t.programs for s, t in pipe.timings.items()} == before
        assert len(pipe._sampler.programs()) == 1
        np.testing.assert_array_equal(second[0], runs[mode][0])
        np.testing.assert_array_equal(second[1], runs[mode][1])
    latents, frames = runs["none"]
    np.testing.assert_array_equal(runs["model"][0], latents)
    np.testing.assert_array_equal(runs["model"][1], frames)
    np.testing.assert_allclose(runs["blocks"][0], latents, rtol=0, atol=1e-5 if dtype == "float32" else 5e-2)
    assert np.abs(runs["blocks"][1].astype(int) - frames).max() <= 1


@pytest.mark.slow
def test_pipeline_call_with_model_offload_compiles_once(demo_env):
    pipe = WanPipeline.from_pretrained("demo", dtype="float32", jax_cache_dir=False, offload="model")
    resident = WanPipeline.from_pretrained("demo", dtype="float32", jax_cache_dir=False)
    a = pipe(["a red cat"], **GEN, seed=3)
    b = pipe(["a red cat"], **GEN, seed=3)
    assert {s: t.programs for s, t in b.timings.items()} == {"encode": 0, "denoise": 0, "decode": 0}
    np.testing.assert_array_equal(a.frames, b.frames)
    np.testing.assert_array_equal(a.frames, resident(["a red cat"], **GEN, seed=3).frames)


# ----------------------------------------------------------------------------------------------
# On an 8-device mesh


def _mesh_runs(mesh: str, fsdp: bool) -> dict[str, dict]:
    """A demo run on ``mesh`` per offload mode, against the resident run."""
    runs = {}
    for mode in ("none", "model", "blocks"):
        pipe = WanPipeline.from_pretrained(
            "demo", dtype="float32", jax_cache_dir=False, mesh=mesh, fsdp=fsdp, offload=mode
        )
        pos, neg = pipe.encode_prompt("a red cat walks", None, max_sequence_length=16)
        noise = pipe.prepare_latents(1, 32, 64, 5, 0)
        latents = pipe.denoise(pos, neg, noise, num_inference_steps=2, progress=False).latents
        frames = pipe.decode(latents)
        q = pipe.transformer.params["blocks"]["attn1"]["to_q"]["kernel"]
        runs[mode] = (np.asarray(latents), frames, memory_kind(q), str(q.sharding.spec))
    ref = runs["none"]
    return {
        mode: {
            "latents_max": float(np.abs(r[0] - ref[0]).max()),
            "latents_scale": float(np.abs(ref[0]).max()),
            "frames_max": int(np.abs(r[1].astype(int) - ref[1]).max()),
            "kind_after": r[2],
            "spec": r[3],
        }
        for mode, r in runs.items()
    }


@pytest.mark.slow
@pytest.mark.parametrize("mesh, fsdp", [("dp=2,sp=1,tp=4", True), ("dp=1,sp=2,tp=4", False)])
@pytest.mark.bit_for_bit
def test_offload_on_an_8_device_mesh(demo_env, mesh, fsdp):
    modes = _mesh_runs(mesh, fsdp)
    assert modes["model"]["latents_max"] == 0 and modes["model"]["frames_max"] == 0, modes
    blocks = modes["blocks"]
    assert blocks["latents_max"] <= 1e-5 * max(1.0, blocks["latents_scale"]), blocks
    assert blocks["frames_max"] <= 1, blocks
    # the stacked weights keep their partitioning in host memory (after decoding: all on the host)
    assert modes["model"]["kind_after"] == blocks["kind_after"] == HOST
    assert blocks["spec"] == modes["none"]["spec"], modes


# ----------------------------------------------------------------------------------------------
# Measurements (not a test): python tests/test_offload.py


def measure(num_layers: int = 8, repeats: int = 3) -> None:
    print("step program memory, 1.3B dims, latents (1,16,3,16,16) with CFG (batch 2), 512 text tokens")
    for dtype in ("bfloat16", "float32"):
        for layers in (num_layers, 30):
            got = {mode: step_memory(mode, layers, dtype) for mode in ("none", "blocks")}
            ratio = got["blocks"]["total"] / got["none"]["total"]
            for mode, m in got.items():
                print(f"  {dtype:8} layers={layers:2} {mode:6} " + json.dumps(m))
            print(f"  {dtype:8} layers={layers:2} blocks/none total: {ratio:.3f}")
    cfg = transformer_preset("1.3B", num_layers=num_layers)
    spec = dit.checkpoint_spec(cfg)
    scheduler = make_scheduler(SchedulerConfig(), 3)
    rng = np.random.default_rng(0)
    latents = rng.standard_normal((1, 16, 3, 16, 16)).astype(np.float32)
    text = jnp.asarray(rng.standard_normal((1, 512, cfg.text_dim)), jnp.bfloat16)
    print(f"step seconds (steady steps, {repeats} runs of 3 steps each), bf16, {num_layers} layers:")
    times: dict[str, list[float]] = {}
    outs = {}
    for mode in ("none", "blocks"):
        params = random_params(spec, "bfloat16", seed=0, sharding=offload_sharding(None, mode))
        sampler = Sampler(dit.WanTransformer(cfg, params, RunSettings("bfloat16", offload=mode)))
        for _ in range(repeats):
            result = sampler(scheduler, latents, text, text, 5.0)
            times.setdefault(mode, []).extend(result.step_times.steady)
        outs[mode] = np.asarray(result.latents)
        del params, sampler
    for i in range(len(times["none"])):
        print(f"  none {times['none'][i]:.3f} s   blocks {times['blocks'][i]:.3f} s")
    med = {m: float(np.median(v)) for m, v in times.items()}
    print(
        f"  median: none {med['none']:.3f} s, blocks {med['blocks']:.3f} s, ratio {med['blocks'] / med['none']:.3f}"
    )
    print(f"  final latents max |blocks - none|: {np.abs(outs['blocks'] - outs['none']).max():.3g}")


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    measure(*map(int, sys.argv[1:]))


@pytest.mark.slow
@pytest.mark.bit_for_bit
def test_cli_offload_and_8bit_flags_run_and_are_recorded(demo_env, tmp_path, capsys):
    """``--offload model`` gives the resident run's frames; ``--offload blocks --weights_dtype int8``
    runs and is recorded; a bad value is a one-line error."""
    from wanjax.cli.main import main

    small = ["--height", "32", "--width", "32", "--frames", "5", "--num_inference_steps", "2", "--dtype", "float32"]  # fmt: skip
    base = ["generate", "--model", "demo", "--prompt", "a cat", *small]
    frames = {}
    for name, flags in (
        ("none", []),
        ("model", ["--offload", "model"]),
        ("int8", ["--offload", "blocks", "--weights_dtype", "int8"]),
    ):
        out = ["--output_video", str(tmp_path / f"{name}.mp4"), "--frames_out", str(tmp_path / f"{name}.npy")]
        assert main([*base, *out, *flags]) == 0, capsys.readouterr().err
        frames[name] = np.load(tmp_path / f"{name}.npy")
    np.testing.assert_array_equal(frames["model"], frames["none"])
    record = json.loads((tmp_path / "int8.json").read_text())
    assert (record["arguments"]["offload"], record["arguments"]["weights_dtype"]) == ("blocks", "int8")
    capsys.readouterr()
    assert main([*base, "--weights_dtype", "int4"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--weights_dtype" in err, err


def test_program_memory_of_a_program_that_leaves_an_argument_unread():
    """An argument the program does not read has no input sharding (None); the split still pairs each
    argument with its own (it raised on the Wan 2.2 VAE's encode program)."""
    compiled = jax.jit(lambda a, b, c: a * 2 + c).lower(jnp.ones(3), jnp.ones(4), jnp.ones(3)).compile()
    memory = program_memory(compiled)
    assert memory["host_argument"] == 0
    assert memory["argument"] == compiled.memory_analysis().argument_size_in_bytes
