"""GGUF kernels kept on the device as the file stores them (``--weights_dtype gguf``): the blocks
dequantised by JAX as the gguf package dequantises them, a transformer run as diffusers runs its GGUF
model, LoRAs unmerged as the float merge, meshes as one device."""

from __future__ import annotations

import gguf
import jax
import numpy as np
import pytest
import torch
from helpers.compare import relative_error
from helpers.dit import reference_inputs, run_ours
from helpers.gguf_files import (
    GGUF_DIT,
    RANDOM_BLOCKS,
    Q,
    dequantized_in_float32,
    random_blocks,
    write_transformer,
)
from helpers.models import TINY_DIT, original_state, save_transformer

from wanjax.io.gguf_blocks import DEQUANTIZERS, block_shape, dequantize
from wanjax.io.gguf_kernel import GGUFKernel
from wanjax.models.dit import load_transformer

SHAPE, TEXT_LEN = (2, 16, 3, 6, 8), 7


@pytest.mark.parametrize("qtype", sorted(DEQUANTIZERS))
def test_blocks_dequantize_bit_for_bit_as_the_gguf_package(qtype):
    """Random blocks (finite scales where the helper knows them, else any bytes: NaN and inf where
    the package gives them) over two leading axes."""
    rng = np.random.default_rng(1)
    block, size = block_shape(qtype)
    q = Q[qtype]
    if q in RANDOM_BLOCKS:
        raw = random_blocks(q, (3, 5 * block), rng).reshape(3, 5, size)
    else:
        raw = rng.integers(0, 256, (3, 5, size), dtype=np.uint8)
    expected = gguf.quants.dequantize(raw.reshape(3, -1), q)
    got = np.asarray(jax.jit(dequantize, static_argnums=1)(raw, qtype))
    assert got.dtype == np.float32 and got.shape == (3, 5 * block)
    np.testing.assert_array_equal(got, expected)


@pytest.fixture(scope="module")
def gguf_model(tmp_path_factory):
    """A tiny diffusers transformer (256-wide matmul inputs) and its GGUF files at Q8_0 and Q4_K
    (random blocks whose scales keep the activations in float32's range)."""
    root = tmp_path_factory.mktemp("gguf_kept")
    model = save_transformer(root, seed=5, **{**TINY_DIT, **GGUF_DIT})
    state = original_state(model)
    files = {q: write_transformer(root / f"wan-{q}.gguf", state, Q[q], scale=1e-3) for q in ("Q8_0", "Q4_K")}
    return root, files


def kernels(params) -> list[GGUFKernel]:
    leaves = jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, GGUFKernel))
    return [leaf for leaf in leaves if isinstance(leaf, GGUFKernel)]


@pytest.mark.parametrize("qtype", ["Q8_0", pytest.param("Q4_K", marks=pytest.mark.slow)])
def test_a_kept_gguf_transformer_runs_as_diffusers_gguf_model(gguf_model, qtype, monkeypatch):
    """Every matmul kernel stays the file's bytes on the device; the forward equals diffusers'
    ``from_single_file`` with ``GGUFQuantizationConfig`` (float32 compute) on the same file, its
    dequantisers run in float32 as ggml's are (left to themselves they multiply the float16 scales
    in float16: 7e-4 from this; ``helpers.gguf_files.diffusers_values`` does the same)."""
    from diffusers import GGUFQuantizationConfig, WanTransformer3DModel
    from diffusers.quantizers.gguf import gguf_quantizer, utils

    monkeypatch.setattr(utils, "dequantize_gguf_tensor", dequantized_in_float32)  # the layers' forward
    monkeypatch.setattr(gguf_quantizer, "dequantize_gguf_tensor", dequantized_in_float32)  # float32-kept

    root, files = gguf_model
    path = files[qtype]
    model = load_transformer(path, "float32", weights_dtype="gguf", config=_config(root))
    kept = kernels(model.params)
    quantised = {t.name: t for t in gguf.GGUFReader(path).tensors if t.tensor_type == Q[qtype]}
    assert kept and all(k.qtype == qtype for k in kept)
    assert sum(k.blocks.nbytes for k in kept) == sum(int(t.n_bytes) for t in quantised.values())

    reference = WanTransformer3DModel.from_single_file(
        str(path),
        config=str(root),
        subfolder="transformer",
        quantization_config=GGUFQuantizationConfig(compute_dtype=torch.float32),
    )
    inputs = reference_inputs(SHAPE, TEXT_LEN, GGUF_DIT["text_dim"], seed=6)
    with torch.no_grad():
        expected = reference(*inputs).sample.numpy()
    # 1.2e-5: this 256-wide model's float32 forward differs from diffusers' by that much in the
    # diffusers layout too (1.24e-5, no GGUF involved); kept vs dequantised on loading: 8e-7
    assert relative_error(run_ours(model, inputs), expected) <= 2e-5


def _config(root):
    from wanjax.models.dit import TRANSFORMER

    return TRANSFORMER.read_config(root / "transformer")


@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=pytest.mark.slow)])
def test_kept_and_dequantised_on_loading_give_the_same_output(gguf_model, dtype):
    """The kernel rounded to the model dtype once either way: the same weights, the same forward."""
    root, files = gguf_model
    inputs = reference_inputs(SHAPE, TEXT_LEN, GGUF_DIT["text_dim"], seed=7)
    kept = load_transformer(files["Q4_K"], dtype, weights_dtype="gguf", config=_config(root))
    loaded = load_transformer(files["Q4_K"], dtype, config=_config(root))
    for k in kernels(kept.params)[:3]:
        assert k.dequantize().dtype == np.dtype(dtype)
    tolerance = 1e-6 if dtype == "float32" else 1e-2
    assert relative_error(run_ours(kept, inputs), run_ours(loaded, inputs)) <= tolerance


def test_a_lora_on_kept_kernels_equals_the_float_merge(gguf_model, tmp_path):
    """The factors ride unmerged and are added where the blocks are dequantised: the forward equals
    the LoRA merged into the dequantised float32 weights; setting no LoRA gives the base back."""
    from safetensors.numpy import save_file

    root, files = gguf_model
    rng = np.random.default_rng(8)
    state = {}
    for block in range(TINY_DIT["num_layers"]):
        for module, (out, inp) in {"self_attn.q": (256, 256), "ffn.2": (256, 256)}.items():
            state[f"diffusion_model.blocks.{block}.{module}.lora_down.weight"] = rng.normal(0, 0.3, (4, inp))
            state[f"diffusion_model.blocks.{block}.{module}.lora_up.weight"] = rng.normal(0, 0.3, (out, 4))
    lora = tmp_path / "lora.safetensors"
    save_file({k: v.astype(np.float32) for k, v in state.items()}, lora)
    inputs = reference_inputs(SHAPE, TEXT_LEN, GGUF_DIT["text_dim"], seed=9)

    kept = load_transformer(files["Q8_0"], "float32", weights_dtype="gguf", config=_config(root))
    base = run_ours(kept, inputs)
    merged = load_transformer(files["Q8_0"], "float32", config=_config(root))
    merged.set_loras([(lora, 0.7)])
    kept.set_loras([(lora, 0.7)])
    assert sum(k.up is not None for k in kernels(kept.params)) == 2
    with_lora = run_ours(kept, inputs)
    assert relative_error(with_lora, run_ours(merged, inputs)) <= 1e-6
    assert relative_error(with_lora, base) > 1e-3
    kept.set_loras([])
    assert all(k.up is None for k in kernels(kept.params))
    np.testing.assert_array_equal(run_ours(kept, inputs), base)


@pytest.mark.slow
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K"])
def test_kept_kernels_on_an_8_device_mesh_equal_one_device(gguf_model, qtype):
    """dp=1,sp=2,tp=4: the blocks split by output channel and (Q8_0: 8 blocks a row) by input
    channel over whole blocks; Q4_K's one block a row stays whole, its row-parallel kernels split by
    output channel instead. The same output as one device."""
    from wanjax.parallel.mesh import make_mesh, parse_mesh

    root, files = gguf_model
    inputs = reference_inputs(SHAPE, TEXT_LEN, GGUF_DIT["text_dim"], seed=10)
    single = load_transformer(files[qtype], "float32", weights_dtype="gguf", config=_config(root))
    mesh = make_mesh(parse_mesh("dp=1,sp=2,tp=4"))
    sharded = load_transformer(files[qtype], "float32", weights_dtype="gguf", config=_config(root), mesh=mesh)
    specs = {tuple(k.blocks.sharding.spec) for k in kernels(sharded.params)}
    assert any(len(s) > 2 and s[-2] is not None for s in specs) == (qtype == "Q8_0")
    if qtype == "Q4_K":  # a row of one block cannot split: row-parallel kernels split their outputs
        assert all(k.blocks.sharding.spec[1] == "tp" for k in kernels(sharded.params["blocks"]))
    assert relative_error(run_ours(sharded, inputs), run_ours(single, inputs)) <= 1e-6


@pytest.mark.parametrize(
    "mesh_flag", ["dp=1,sp=1,tp=1", pytest.param("dp=1,sp=2,tp=4", marks=pytest.mark.slow)]
)
def test_plan_counts_the_bytes_the_kept_transformer_holds(gguf_model, mesh_flag):
    """``plan``'s transformer bytes under ``--weights_dtype gguf`` (the types read from the file's
    header) are the bytes the loaded model holds on a device: the kept blocks and the float leaves."""
    from wanjax.parallel.mesh import make_mesh, parse_mesh
    from wanjax.planning import models as planning_models
    from wanjax.planning import weights as planning_weights

    root, files = gguf_model
    spec = parse_mesh(mesh_flag)
    model = planning_models.model_configs(str(root), {"transformer": str(files["Q4_K"])})
    assert set(model.gguf) == {"transformer"}
    planned = planning_weights.transformer_bytes(
        model.transformer, np.float32, spec.sizes, weights="gguf", kept=model.gguf["transformer"]
    )
    mesh = make_mesh(spec) if spec.num_devices > 1 else None
    loaded = load_transformer(files["Q4_K"], "float32", weights_dtype="gguf", config=_config(root), mesh=mesh)
    device = jax.devices()[0]
    held = sum(
        shard.data.nbytes
        for leaf in jax.tree.leaves(loaded.params)
        for shard in leaf.addressable_shards
        if shard.device == device
    )
    assert planned.total == held
    if mesh is None:  # every layer's kernels kept whole: Q4_K's 144 bytes a block of 256 float32s
        floats = planning_weights.transformer_bytes(model.transformer, np.float32, spec.sizes)
        assert planned.layer * 256 * 4 == floats.layer * 144


def test_plan_on_the_command_line_keeps_a_gguf_file_and_refuses_gguf_without_one(gguf_model, capsys):
    """``plan --weights_dtype gguf`` with a GGUF transformer: its mode's column beside bf16's, smaller;
    without a GGUF file: one line naming the fix, exit 2."""
    from wanjax.cli.main import main

    root, files = gguf_model
    size = ["--model", str(root), "--height", "64", "--width", "64", "--frames", "5", "--num_devices", "1"]
    assert main(["plan", *size, "--transformer", str(files["Q4_K"]), "--weights_dtype", "gguf"]) == 0
    out = capsys.readouterr().out
    assert "--weights_dtype gguf" in out.splitlines()[0]
    assert "gguf" in next(line for line in out.splitlines() if "bf16" in line and "gguf" in line)
    assert main(["plan", *size, "--weights_dtype", "gguf"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--transformer FILE.gguf" in err[0], err


@pytest.mark.parametrize("offload", [pytest.param("model", marks=pytest.mark.slow), "blocks"])
def test_kept_kernels_streamed_from_host_memory_give_the_resident_output(gguf_model, offload):
    """``--offload model|blocks``: the blocks wait in host memory (``blocks``: streamed a layer at a
    time as the scan runs) and the output is the resident model's, bit for bit."""
    root, files = gguf_model
    inputs = reference_inputs(SHAPE, TEXT_LEN, GGUF_DIT["text_dim"], seed=11)
    resident = load_transformer(files["Q4_K"], "float32", weights_dtype="gguf", config=_config(root))
    streamed = load_transformer(
        files["Q4_K"], "float32", weights_dtype="gguf", config=_config(root), offload=offload
    )
    if offload == "blocks":
        assert (
            streamed.params["blocks"]["attn1"]["to_q"]["kernel"].blocks.sharding.memory_kind == "pinned_host"
        )
    np.testing.assert_array_equal(run_ours(streamed, inputs), run_ours(resident, inputs))


@pytest.fixture(scope="module")
def demo_gguf(tmp_path_factory):
    """The demo variant's transformer as a Q8_0 GGUF file (its 64-, 128- and 256-wide matmul inputs
    are whole blocks of 32)."""
    from diffusers import WanTransformer3DModel
    from helpers.models import randomize_

    from wanjax.models.registry import DEMO_TRANSFORMER

    config = {k: v for k, v in DEMO_TRANSFORMER.to_dict().items() if not k.startswith("_")}
    model = randomize_(WanTransformer3DModel(**config), 0).eval()
    path = tmp_path_factory.mktemp("demo_gguf") / "demo-Q8_0.gguf"
    return write_transformer(path, original_state(model), Q.Q8_0)


def test_plan_compiles_the_kept_blocks_for_a_tpu_slice(demo_gguf, tmp_path):
    """``plan --compile --weights_dtype gguf`` compiles the step over the file's blocks for the slice:
    uint8 arguments holding the bytes ``plan`` counts (the 14B's figures at 720p: BENCHMARKS.md)."""
    import json

    from wanjax.chips import SLICES
    from wanjax.cli.main import main
    from wanjax.models.registry import registry
    from wanjax.parallel.mesh import parse_mesh
    from wanjax.planning import models as planning_models
    from wanjax.planning import weights as planning_weights
    from wanjax.target import building_for
    from wanjax.tools.compile_target import RunSpec, run_programs, slice_target

    mesh = "dp=2,sp=1,tp=4"
    out = tmp_path / "report.json"
    size = ["--height", "64", "--width", "64", "--frames", "5", "--mesh", mesh]
    kept = ["--transformer", str(demo_gguf), "--weights_dtype", "gguf"]
    only = ["--compile", "v6e-8", "--programs", "step", "--json", str(out)]
    assert main(["plan", "--model", "demo", *size, *kept, *only]) == 0
    (step,) = json.loads(out.read_text())["programs"]
    assert step["compiled"] and step["tpu_custom_calls"] > 0, step

    model = planning_models.model_configs("demo", {"transformer": str(demo_gguf)})
    assert set(model.gguf["transformer"].values()) == {"Q8_0"}
    run = RunSpec(registry()["demo"], 64, 64, 5, parse_mesh(mesh), weights_dtype="gguf", gguf=model.gguf)
    target = slice_target(SLICES["v6e-8"])
    with building_for(target):
        program = next(p for p in run_programs(run, target) if p.name == "step")
        lowered = program.lower().as_text()
    kept_bytes = planning_weights.transformer_bytes(
        model.transformer,
        np.dtype("bfloat16"),
        parse_mesh(mesh).sizes,
        weights="gguf",
        kept=model.gguf["transformer"],
    )
    assert program.weights_bytes == kept_bytes.total
    assert "xui8>" in lowered  # the blocks, dequantised inside the step
