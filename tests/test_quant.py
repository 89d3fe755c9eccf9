"""8-bit weights (``--weights_dtype int8|fp8``): quantisation round trips, quantised matmuls against a
float reference, the scan over stacked quantised layers, sharded loading, and float8 checkpoints
(``F8_E4M3`` safetensors files) read and loaded.

docs/design.md gives the velocity errors measured on the 1.3B dimensions
(``benchmarks/quantization_error.py``). Here: per matmul, relative error vs the float kernel ≤ 1e-2
(int8) and ≤ 4e-2 (fp8, weight-only); the tiny DiT's velocity vs bf16 ≤ 2e-2 (int8) and ≤ 5e-2 (fp8;
7e-2 multiplied in fp8).
"""

from __future__ import annotations

import copy
import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import wanjax.models.layers as layers
from wanjax.errors import ConfigError
from wanjax.io.checkpoint import abstract_params, open_component, open_safetensors, random_params
from wanjax.io.quant import (
    FP8,
    INT8,
    QuantizedKernel,
    abstract_quantized_params,
    dequantize,
    leaf_builder,
    quantize,
)
from wanjax.kernels.common import Platform
from wanjax.models import dit, umt5
from wanjax.models.layers import linear, native_fp8, quantized_matmul
from wanjax.models.registry import transformer_preset
from wanjax.models.settings import RunSettings

MATMUL_BOUND = {"int8": 1e-2, "fp8": 4e-2}
VELOCITY_BOUND = {"int8": 2e-2, "fp8": 5e-2}
QDTYPE = {"int8": INT8, "fp8": FP8}
WEIGHTS = "diffusion_pytorch_model.safetensors"


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def kernel_like(shape, seed=0) -> np.ndarray:
    """Random kernel ``(..., in, out)`` whose output channels differ in scale by 1000x."""
    rng = np.random.default_rng(seed)
    channel_scale = np.exp(rng.uniform(-3.5, 3.5, shape[-1])).astype(np.float32)
    return rng.standard_normal(shape, dtype=np.float32) * channel_scale


# ----------------------------------------------------------------------------------------------
# Round trips


def test_int8_round_trip_error_is_at_most_half_a_step_per_channel():
    w = kernel_like((3, 96, 40))
    values, scale = quantize(w, INT8)
    assert values.dtype == np.int8 and values.shape == w.shape
    assert scale.dtype == np.float32 and scale.shape == (3, 40)
    assert values.min() >= -128 and values.max() <= 127  # torchao's symmetric int8: absmax is 127.5 steps
    error = np.abs(dequantize(values, scale) - w)
    assert np.all(error <= scale[:, None, :] * (0.5 + 1e-5))
    np.testing.assert_allclose(np.abs(w).max(axis=1), 127.5 * scale, rtol=1e-6)


def test_fp8_round_trip_relative_error_of_normal_values_is_at_most_2_to_the_minus_4():
    w = kernel_like((2, 128, 48), seed=1)
    values, scale = quantize(w, FP8)
    assert values.dtype == FP8 and scale.shape == (2, 48)
    assert not np.isnan(values.astype(np.float32)).any()
    back = dequantize(values, scale)
    scaled = np.abs(w) / scale[:, None, :]
    normal = scaled >= float(ml_dtypes.finfo(FP8).smallest_normal)
    assert normal.mean() > 0.95
    relative = np.abs(back - w)[normal] / np.abs(w)[normal]
    assert relative.max() <= 2.0**-4 * (1 + 1e-6)
    # subnormals: at most half the subnormal step, 2^-10, in scaled units
    sub_error = (np.abs(back - w) / scale[:, None, :])[~normal]
    assert sub_error.max(initial=0) <= 2.0**-10 * (1 + 1e-6)
    np.testing.assert_allclose(np.abs(back).max(axis=1), np.abs(w).max(axis=1), rtol=2.0**-4)


@pytest.mark.parametrize("name", ["int8", "fp8"])
def test_zero_channels_and_bad_dtypes(name):
    w = np.zeros((8, 3), np.float32)
    w[:, 1] = np.linspace(-1, 1, 8)
    values, scale = quantize(w, QDTYPE[name])
    assert scale[0] == scale[2] == 1 and np.all(values[:, [0, 2]].astype(np.float32) == 0)
    np.testing.assert_allclose(dequantize(values, scale)[:, 1], w[:, 1], atol=2**-4)
    with pytest.raises(ValueError, match="cannot quantise"):
        quantize(w, np.float16)


# ----------------------------------------------------------------------------------------------
# Matmuls


def quantized(w: np.ndarray, name: str, dtype=jnp.bfloat16) -> QuantizedKernel:
    values, scale = quantize(w, QDTYPE[name])
    return QuantizedKernel(jnp.asarray(values), jnp.asarray(scale), np.dtype(dtype))


@pytest.mark.parametrize("name", ["int8", "fp8"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_quantized_matmul_matches_the_float_reference(name, dtype):
    w = kernel_like((256, 64), seed=2)
    x = np.random.default_rng(3).standard_normal((4, 10, 256), dtype=np.float32)
    k = quantized(w, name, dtype)
    xd = jnp.asarray(x, dtype)
    y = linear(xd, {"kernel": k}, out_dtype=jnp.float32, precision="highest")
    # exactly the dequantised kernel's matmul (up to float32 rounding)...
    deq = np.asarray(xd, np.float32) @ dequantize(np.asarray(k.values), np.asarray(k.scale))
    assert rel(y, deq) < (1e-6 if dtype == jnp.float32 else 1e-5)
    # ...and within the stated bound of the float kernel's
    ref = np.asarray(xd, np.float32) @ w
    assert rel(y, ref) < MATMUL_BOUND[name]
    assert rel(y, ref) > 1e-4  # it did quantise


def test_stacked_kernel_matmul_and_bias():
    w = kernel_like((3, 32, 16), seed=4)
    k = quantized(w, "int8", jnp.float32)
    x = np.random.default_rng(5).standard_normal((3, 7, 32), dtype=np.float32)
    y = layers.matmul(jnp.asarray(x), k)
    assert rel(y, x @ w) < MATMUL_BOUND["int8"]
    bias = np.ones(16, np.float32)
    y = linear(jnp.asarray(x[0]), {"kernel": quantized(w[0], "int8", jnp.float32), "bias": jnp.asarray(bias)})
    assert rel(y, x[0] @ w[0] + bias) < MATMUL_BOUND["int8"]


H100, A100, ROCM, CPU, TPU = (
    Platform("gpu", (9, 0)),
    Platform("gpu", (8, 0)),
    Platform("gpu"),  # no CUDA capability: ROCm
    Platform("cpu"),
    Platform("tpu"),
)


def test_native_fp8_platforms():
    assert native_fp8(H100) and native_fp8(Platform("gpu", (10, 0)))
    assert not native_fp8(A100) and not native_fp8(ROCM) and not native_fp8(CPU)
    assert native_fp8(TPU, "TPU7x") and native_fp8(TPU, "TPU v8")
    assert not native_fp8(TPU, "TPU v6 lite") and not native_fp8(TPU, "TPU v5") and not native_fp8(TPU)
    assert not native_fp8()  # this (CPU) process


def _dots(jaxpr, within: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """``(primitives enclosing it, operand dtypes)`` of every dot_general in a jaxpr, nested ones too."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            found.append((within, tuple(str(v.aval.dtype) for v in eqn.invars)))
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    found += _dots(inner, (*within, eqn.primitive.name))
    return found


def _dot_operand_dtypes(fn, *args) -> list[tuple[str, ...]]:
    return [dtypes for _, dtypes in _dots(jax.make_jaxpr(fn)(*args).jaxpr)]


@pytest.mark.parametrize("platform", [H100, A100, CPU], ids=["h100", "a100", "cpu"])
def test_fp8_multiplies_in_fp8_only_where_native(platform):
    w = kernel_like((128, 32), seed=6)
    x = jnp.asarray(np.random.default_rng(7).standard_normal((9, 128), dtype=np.float32), jnp.bfloat16)
    k = quantized(w, "fp8")
    dots = _dot_operand_dtypes(lambda x, k: quantized_matmul(x, k, platform=platform), x, k)
    native = platform == H100
    assert dots == [("float8_e4m3fn", "float8_e4m3fn") if native else ("bfloat16", "bfloat16")]
    y = quantized_matmul(x, k, platform=platform)  # XLA:CPU runs the fp8 dot too
    assert y.dtype == jnp.float32
    # fp8 activations add their own rounding: the bound is the weight-only one plus as much again
    assert rel(y, np.asarray(x, np.float32) @ w) < MATMUL_BOUND["fp8"] * (2 if native else 1)
    # int8 kernels stay weight-only everywhere
    dots = _dot_operand_dtypes(
        lambda x, k: quantized_matmul(x, k, platform=platform), x, quantized(w, "int8")
    )
    assert dots == [("bfloat16", "bfloat16")]


# ----------------------------------------------------------------------------------------------
# Models: the scan over stacked quantised layers


def _dit_inputs(cfg, shape=(1, 16, 3, 8, 8), text=8):
    rng = np.random.default_rng(1)
    latents = jnp.asarray(rng.standard_normal(shape, dtype=np.float32))
    embeds = jnp.asarray(rng.standard_normal((1, text, cfg.text_dim), dtype=np.float32))
    return latents, jnp.asarray([700.0]), embeds


@pytest.fixture(scope="module")
def tiny_bf16_velocity():
    cfg = transformer_preset("tiny")
    params = random_params(dit.checkpoint_spec(cfg), jnp.bfloat16)
    return cfg, np.asarray(
        dit.WanTransformer(cfg, params, RunSettings(jnp.bfloat16))(*_dit_inputs(cfg)), np.float32
    )


@pytest.mark.parametrize("name", ["int8", "fp8"])
def test_tiny_dit_with_8_bit_weights_is_close_to_bf16(tiny_bf16_velocity, name):
    cfg, reference = tiny_bf16_velocity
    spec = dit.checkpoint_spec(cfg)
    params = random_params(spec, jnp.bfloat16, build=leaf_builder(name))  # the same draws, quantised
    blocks = params["blocks"]
    assert isinstance(blocks["attn1"]["to_q"]["kernel"], QuantizedKernel)
    assert blocks["ffn"]["proj_in"]["kernel"].values.dtype == QDTYPE[name]
    assert blocks["ffn"]["proj_in"]["kernel"].scale.shape == (cfg.num_layers, cfg.ffn_dim)
    # not matmul kernels, or kept float32: as bf16 loads them
    assert params["patch_embedding"]["kernel"].dtype == jnp.bfloat16
    assert params["time_embedder"]["linear_1"]["kernel"].dtype == jnp.float32
    assert params["blocks"]["attn1"]["to_q"]["bias"].dtype == jnp.bfloat16
    # the tree is what abstract_quantized_params says, and holds 8 bits per quantised weight
    shapes = jax.tree.map(lambda a: (a.shape, a.dtype), params)
    assert shapes == jax.tree.map(
        lambda a: (a.shape, a.dtype), abstract_quantized_params(spec, jnp.bfloat16, name)
    )
    kernels = jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, QuantizedKernel))
    kernels = [k for k in kernels if isinstance(k, QuantizedKernel)]
    assert len(kernels) == 10 + 1 + 2 + 1  # 10 stacked in the blocks, time_proj, text_embedder x2, proj_out
    assert all(k.values.nbytes == np.prod(k.shape) for k in kernels)

    velocity = dit.WanTransformer(cfg, params, RunSettings(jnp.bfloat16))(*_dit_inputs(cfg))
    error = rel(velocity, reference)
    assert 1e-4 < error < VELOCITY_BOUND[name]


def test_tiny_dit_multiplying_in_fp8_where_native(tiny_bf16_velocity, monkeypatch):
    """Where fp8 is native (an H100: test_native_fp8_platforms) the scanned blocks' matmuls run in fp8
    and stay within the bound."""
    cfg, reference = tiny_bf16_velocity
    monkeypatch.setattr(layers, "native_fp8", lambda platform=None, device_kind=None: native_fp8(H100))
    params = random_params(dit.checkpoint_spec(cfg), jnp.bfloat16, build=leaf_builder("fp8"))
    model = dit.WanTransformer(cfg, params, RunSettings(jnp.bfloat16))
    inputs = _dit_inputs(cfg)
    dots = _dots(jax.make_jaxpr(model.apply)(params, dit.DitInputs(*inputs)).jaxpr)
    fp8 = ("float8_e4m3fn", "float8_e4m3fn")
    assert sum(d == fp8 for within, d in dots if "scan" in within) == 10  # the blocks' kernels
    assert sum(d == fp8 for within, d in dots if "scan" not in within) == 4  # time_proj, text, proj_out
    assert 1e-4 < rel(model(*inputs), reference) < 7e-2


@pytest.mark.slow
def test_umt5_with_int8_weights_is_about_as_close_to_bf16_as_bf16_is_to_float32():
    """A random UMT5 amplifies any perturbation (bf16 rounding alone moves its output by ~1.4%), so
    its bound is relative: int8 weights move it less than 3x as much as bf16 rounding does."""
    cfg = umt5.UMT5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=48, num_layers=3, num_heads=4)
    spec = umt5.checkpoint_spec(cfg)
    ids = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 12)), jnp.int32)
    mask = jnp.ones((2, 12), jnp.int32)
    outs = {}
    for name, dtype in (("bf16", jnp.bfloat16), ("int8", jnp.bfloat16), ("bf16", jnp.float32)):
        params = random_params(spec, dtype, build=leaf_builder(name))
        outs[name, dtype] = np.asarray(umt5.forward(params, cfg, ids, mask), np.float32)
        if name == "int8":
            assert isinstance(params["layers"]["wo"]["kernel"], QuantizedKernel)
            assert params["embedding"].dtype == jnp.bfloat16
    bf16 = outs["bf16", jnp.bfloat16]
    rounding = rel(bf16, outs["bf16", jnp.float32])
    assert 1e-4 < rel(outs["int8", jnp.bfloat16], bf16) < 3 * rounding


def test_unknown_weights_dtype_is_a_config_error(tiny_transformer_dir):
    root, _ = tiny_transformer_dir
    with pytest.raises(ConfigError, match="unknown weights dtype 'int4'"):
        dit.load_transformer(root, weights_dtype="int4")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["int8", "fp8"])
def test_load_transformer_quantises_the_checkpoint_as_read(tiny_transformer_dir, name):
    root, torch_model = tiny_transformer_dir
    model = dit.load_transformer(root, "float32", weights_dtype=name)
    kernel = model.params["blocks"]["ffn"]["proj_out"]["kernel"]
    stored = np.stack([b.ffn.net[2].weight.detach().numpy().T for b in torch_model.blocks])
    values, scale = quantize(stored, QDTYPE[name])
    assert np.asarray(kernel.values).tobytes() == values.tobytes()
    np.testing.assert_array_equal(np.asarray(kernel.scale), scale)
    reference = dit.load_transformer(root, "float32")
    inputs = _dit_inputs(model.cfg)
    assert rel(model(*inputs), reference(*inputs)) < VELOCITY_BOUND[name]


# ----------------------------------------------------------------------------------------------
# float8 checkpoints


def test_f8_safetensors_tensors_are_read(tmp_path):
    w = torch.randn(6, 5)
    tensors = {
        "e4m3": w.to(torch.float8_e4m3fn),
        "e5m2": w.to(torch.float8_e5m2),
        "plain": w,
        "empty": torch.zeros(0, 3).to(torch.float8_e4m3fn),
    }
    save_file(tensors, tmp_path / "model.safetensors")
    refs = open_safetensors(tmp_path / "model.safetensors")
    assert refs["e4m3"].dtype == FP8 and refs["e5m2"].dtype == np.dtype(ml_dtypes.float8_e5m2)
    assert refs["plain"].dtype == np.float32
    for name in ("e4m3", "e5m2"):
        bits = tensors[name].view(torch.uint8).numpy()
        assert refs[name].array().view(np.uint8).tobytes() == bits.tobytes()
        part = refs[name][(slice(1, 4), slice(0, 5, 2))]
        assert part.view(np.uint8).tobytes() == np.ascontiguousarray(bits[1:4, 0:5:2]).tobytes()
    assert refs["empty"].array().shape == (0, 3) and refs["empty"][(slice(None), slice(1, 2))].shape == (0, 1)
    np.testing.assert_array_equal(refs["plain"].array(), w.numpy())


@pytest.fixture(scope="module")
def fp8_checkpoint(tiny_transformer_dir, tmp_path_factory):
    """The tiny transformer with every 2-D ``.weight`` (the Linear weights) stored ``F8_E4M3``
    without scales, as downloadable "fp8 e4m3fn" checkpoints are."""
    root, torch_model = tiny_transformer_dir
    out = tmp_path_factory.mktemp("fp8") / "transformer"
    out.mkdir()
    (out / "config.json").write_text((root / "transformer" / "config.json").read_text())
    state = {k: v.detach().clone().contiguous() for k, v in torch_model.state_dict().items()}
    fp8 = {
        k: v.to(torch.float8_e4m3fn) if k.endswith(".weight") and v.ndim == 2 else v for k, v in state.items()
    }
    save_file(fp8, out / WEIGHTS)
    return out.parent, fp8


@pytest.mark.slow
def test_fp8_checkpoint_loads_as_fp8_values_with_unit_scales(fp8_checkpoint):
    root, tensors = fp8_checkpoint
    model = dit.load_transformer(root, "float32", weights_dtype="fp8")
    kernel = model.params["blocks"]["attn1"]["to_q"]["kernel"]
    stored = np.stack(
        [tensors[f"blocks.{i}.attn1.to_q.weight"].view(torch.uint8).numpy().T for i in range(2)]
    )
    assert kernel.values.dtype == FP8
    assert np.asarray(kernel.values).view(np.uint8).tobytes() == np.ascontiguousarray(stored).tobytes()
    np.testing.assert_array_equal(np.asarray(kernel.scale), np.ones((2, kernel.shape[-1]), np.float32))

    # bf16/float32 weights: the same values, dequantised as read; the forwards agree
    plain = dit.load_transformer(root, "float32")
    as_float = plain.params["blocks"]["attn1"]["to_q"]["kernel"]
    np.testing.assert_array_equal(np.asarray(as_float), np.asarray(kernel.values).astype(np.float32))
    inputs = _dit_inputs(model.cfg)
    np.testing.assert_allclose(np.asarray(model(*inputs)), np.asarray(plain(*inputs)), rtol=1e-5, atol=1e-5)

    # int8 requantises the fp8 values
    int8 = dit.load_transformer(root, "float32", weights_dtype="int8")
    assert int8.params["blocks"]["attn1"]["to_q"]["kernel"].values.dtype == np.int8
    assert rel(int8(*inputs), plain(*inputs)) < VELOCITY_BOUND["int8"]


def test_fp8_checkpoint_stores_f8_e4m3(fp8_checkpoint):
    root, _ = fp8_checkpoint
    path = root / "transformer" / WEIGHTS
    with open(path, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    assert header["blocks.1.ffn.net.0.proj.weight"]["dtype"] == "F8_E4M3"
    refs = open_component(root / "transformer", ["diffusion_pytorch_model"])
    assert refs["blocks.1.ffn.net.0.proj.weight"].dtype == FP8
    assert refs["blocks.1.ffn.net.0.proj.bias"].dtype == np.float32


# ----------------------------------------------------------------------------------------------
# Sharded loading


@pytest.mark.parametrize("name", ["int8", "fp8"])
def test_sharded_quantised_load_equals_quantising_the_whole_kernel(tmp_path, name):
    """8 devices, kernels split along both axes: every values/scale shard equals the slice of the
    whole kernel's quantisation, bit for bit; the scale is split as the kernel's output axis, in
    the kernel's memory kind."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    from safetensors.numpy import save_file as save_numpy

    from wanjax.io.checkpoint import LeafSource, linear_kernel, load_params, random_checkpoint, stacked

    spec = {
        "stacked": stacked(
            "blocks.{i}.w", 4, (24, 16), layout=linear_kernel, axes=("layers", "embed", "heads")
        ),
        "kernel": LeafSource(("proj.weight",), (40, 16), linear_kernel, axes=("embed", "mlp")),
        "vector": LeafSource(("proj.bias",), (40,), axes=("mlp",)),
    }
    partition = {  # mesh x=2, y=4: the input axis split too (a scale needs every input row)
        "blocks.0.w": P("x", "y"), "proj.weight": P("x", "y"), "proj.bias": P("y"),
    }  # fmt: skip
    assert len(jax.devices()) == 8
    mesh = jax.make_mesh((2, 4), ("x", "y"))
    tensors = random_checkpoint(spec)
    save_numpy(tensors, str(tmp_path / "model.safetensors"))
    refs = open_component(tmp_path, ["model"])

    def sharding(s):
        kind = "pinned_host" if s.stacked else None
        return NamedSharding(mesh, partition[s.names[0]], memory_kind=kind)

    params = load_params(refs, spec, np.float32, "test", sharding, build=leaf_builder(name))
    specs = {}
    for key in ("stacked", "kernel"):
        source, leaf = spec[key], params[key]
        if source.stacked:
            full = np.stack([source.layout(tensors[n]) for n in source.names])
        else:
            full = source.layout(tensors[source.names[0]])
        values, scale = quantize(full, leaf.values.dtype)
        for shard in leaf.values.addressable_shards:
            assert np.asarray(shard.data).tobytes() == values[shard.index].tobytes(), (key, shard.index)
        for shard in leaf.scale.addressable_shards:
            assert np.asarray(shard.data).tobytes() == scale[shard.index].tobytes(), (key, shard.index)
        specs[key] = [
            str(tuple(leaf.values.sharding.spec)),
            str(tuple(leaf.scale.sharding.spec)),
            leaf.values.sharding.memory_kind,
            leaf.scale.sharding.memory_kind,
        ]
    assert np.asarray(params["vector"]).tobytes() == tensors["proj.bias"].tobytes()
    assert specs == {
        "stacked": ["('x', 'y')", "('x', None)", "pinned_host", "pinned_host"],  # layers, in; out whole
        "kernel": ["('x', 'y')", "('y',)", "device", "device"],
    }


def test_abstract_quantized_params_carry_the_scale_sharding():
    cfg = transformer_preset("tiny")
    spec = dit.checkpoint_spec(cfg)
    device = jax.devices()[0]
    tree = abstract_quantized_params(
        spec, jnp.bfloat16, "fp8", lambda s: jax.sharding.SingleDeviceSharding(device)
    )
    kernel = tree["blocks"]["attn2"]["to_out"]["kernel"]
    assert kernel.values.dtype == FP8 and kernel.scale.shape == (cfg.num_layers, cfg.inner_dim)
    assert kernel.scale.sharding == jax.sharding.SingleDeviceSharding(device)
    assert abstract_quantized_params(spec, jnp.bfloat16, "bf16") == abstract_params(spec, jnp.bfloat16)


def test_quantized_kernel_is_a_pytree_of_its_arrays():
    k = quantized(kernel_like((8, 4)), "int8")
    assert copy.deepcopy(k).dtype == k.dtype
    leaves, treedef = jax.tree.flatten(k)
    assert [leaf.dtype for leaf in leaves] == [np.int8, np.float32]
    assert jax.tree.unflatten(treedef, leaves).dtype == jnp.bfloat16
