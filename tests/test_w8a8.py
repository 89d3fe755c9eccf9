"""W8A8 int8 matmuls (``--activations_dtype int8``, :mod:`wanjax.models.w8a8`) against torchao's
``Int8DynamicActivationInt8WeightConfig`` applied by ``quantize_`` to the same linears of diffusers'
``WanTransformer3DModel`` (float32), where it decides, and what ``plan --compile`` counts.

The reference is the model as ``--weights_dtype int8 --activations_dtype int8`` runs it, by
torchao: W8A8 on the blocks' attention and FFN linears, ``Int8WeightOnlyConfig`` on the other linears
int8 storage quantises. Each linear, given the input torchao's run gave it, returns torchao's output
to float32 rounding (the same int8 values, scales and order of the two scalings) but for one thing:
a row whose absmax is negative lands on -127.5 steps, a tie torchao's float32 arithmetic breaks to
-128 or -127 by the input's last bit (78% / 22% on Gaussian rows), ours as exact arithmetic does
(-128). So a float32-level change of the input (our DiT differs from diffusers' by ~1e-6) moves
torchao's own output by a third to a half of its distance from the float model; with its ties broken
as ours (the ``exact_ties`` fixture) the whole DiT and the pipeline's latents equal it to float32
rounding.
"""

from __future__ import annotations

import copy
import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from helpers.compare import relative_error
from helpers.dit import reference_inputs, run_ours
from helpers.models import TINY_DIT, save_transformer

from wanjax.errors import ConfigError
from wanjax.io.quant import INT8, QuantizedKernel, quantize
from wanjax.models.dit import load_transformer
from wanjax.models.w8a8 import int8_matmul, int8_matmuls, marked_blocks, quantize_rows
from wanjax.target import Target

torchao = pytest.importorskip("torchao.quantization")

SHAPE, TEXT_LEN = (2, 16, 3, 6, 8), 7
# the linears W8A8 multiplies, by diffusers' names (filter_fn)
W8A8_LINEARS = re.compile(
    r"blocks\.\d+\.(attn1\.(to_q|to_k|to_v|to_out\.0)|attn2\.(to_q|to_k|to_v|to_out\.0|add_k_proj|add_v_proj)"
    r"|ffn\.net\.(0\.proj|2))$"
)


def torchao_w8a8(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` as ``--weights_dtype int8 --activations_dtype int8`` runs it, by torchao:
    W8A8 on :data:`W8A8_LINEARS`, weight-only int8 (``Int8WeightOnlyConfig``, the same per-channel
    rule) on the other linears ``--weights_dtype int8`` stores in 8 bits (all but the float32 time
    embedder)."""
    quantized = copy.deepcopy(model)

    def linear(m: torch.nn.Module, name: str, w8a8: bool) -> bool:
        return isinstance(m, torch.nn.Linear) and (W8A8_LINEARS.search(name) is not None) == w8a8

    torchao.quantize_(
        quantized, torchao.Int8DynamicActivationInt8WeightConfig(), filter_fn=lambda m, n: linear(m, n, True)
    )
    torchao.quantize_(
        quantized,
        torchao.Int8WeightOnlyConfig(),
        filter_fn=lambda m, n: linear(m, n, False) and "time_embedder" not in n,
    )
    return quantized


@pytest.fixture
def exact_ties(monkeypatch):
    """torchao's activation quantiser with a row's -127.5-step tie broken as exact arithmetic does
    (-128), as ours is: torchao's float32 arithmetic breaks it by the input's last bit."""
    from torchao.quantization.quantize_.workflows.int8 import int8_tensor

    quantise = int8_tensor._choose_quant_func_and_quantize_tensor

    def exact(x: torch.Tensor, kwargs, **options):
        q = quantise(x, kwargs, **options)
        tie = (x == -x.abs().amax(-1, keepdim=True)) & (x != 0)
        q.qdata = torch.where(tie, torch.tensor(-128, dtype=torch.int8), q.qdata)
        return q

    monkeypatch.setattr(int8_tensor, "_choose_quant_func_and_quantize_tensor", exact)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("w8a8_dit")
    model = save_transformer(root, seed=1, **TINY_DIT)
    inputs = reference_inputs(SHAPE, TEXT_LEN, TINY_DIT["text_dim"], seed=2)
    return root, model, inputs


def test_each_linear_equals_torchao_on_its_inputs(tiny):
    """Every W8A8 linear of torchao's run, fed the input it saw there: the same int8 kernel values and
    scales, the same int8 activations but where torchao broke a row's -127.5 tie to -127 (we break it
    as exact arithmetic does, to -128), and on every other row torchao's output to float32 rounding."""
    from torchao.quantization.quantize_.common.quantize_tensor_kwargs import (
        _choose_quant_func_and_quantize_tensor as torchao_activations,
    )

    _, model, inputs = tiny
    weights = {
        n: m.weight.detach().numpy().copy() for n, m in model.named_modules() if W8A8_LINEARS.search(n)
    }
    quantized, seen = torchao_w8a8(model), {}
    for name, module in quantized.named_modules():
        if name in weights:
            module.register_forward_hook(
                lambda m, args, out, name=name: seen.__setitem__(name, (args[0].clone(), out.numpy()))
            )
    with torch.no_grad():
        quantized(*inputs)
    assert len(seen) == len(weights) == 20  # 2 blocks x (4 + 4 + 2)
    ties = rows = 0
    for name, (x, expected) in seen.items():
        module = dict(quantized.named_modules())[name]
        values, scale = quantize(weights[name].T, INT8)
        np.testing.assert_array_equal(values, module.weight.qdata.numpy().T)
        np.testing.assert_array_equal(scale, module.weight.scale.numpy().ravel())
        theirs = torchao_activations(x, module.weight.act_quant_kwargs)
        ours_q, ours_scale = (np.asarray(a) for a in quantize_rows(jnp.asarray(x.numpy())))
        np.testing.assert_array_equal(ours_scale.ravel(), theirs.scale.numpy().ravel())
        differ = ours_q != theirs.qdata.numpy()
        at_tie = x.numpy() == -np.abs(x.numpy()).max(-1, keepdims=True)
        assert (
            np.all(at_tie[differ])
            and np.all(ours_q[differ] == -128)
            and np.all(theirs.qdata.numpy()[differ] == -127)
        )
        same_rows = ~differ.any(-1)
        ours = np.asarray(int8_matmul(jnp.asarray(x.numpy()), jnp.asarray(values), jnp.asarray(scale)))
        ours = ours + module.bias.detach().numpy()
        assert relative_error(ours[same_rows], expected[same_rows]) <= 1e-6, name
        ties, rows = ties + int(differ.any(-1).sum()), rows + same_rows.size
    assert 0 < ties < rows / 4  # torchao broke a fifth of the negative rows' ties to -127


def test_dit_equals_torchao_with_ties_broken_exactly(tiny, exact_ties):
    """The DiT's output equals torchao's run of the same model (ties broken as ours are) to float32
    rounding: 1e-5, the bound of the float32 DiT against diffusers' (tests/test_dit_parity.py; the
    int8 arithmetic is exact and each linear is torchao's), a thousandth of W8A8's distance from the
    float model; weight-only int8 is as far from it as W8A8 is from float."""
    root, model, inputs = tiny
    with torch.no_grad():
        ref, ao = model(*inputs).sample.numpy(), torchao_w8a8(model)(*inputs).sample.numpy()
    own = relative_error(ao, ref)
    assert own > 5e-3
    runs = {
        a: run_ours(load_transformer(root, "float32", weights_dtype="int8", activations_dtype=a), inputs)
        for a in ("int8", "float32")
    }
    assert relative_error(runs["int8"], ao) <= 1e-5
    assert relative_error(runs["float32"], ao) > own / 3


def test_dit_within_torchao_own_sensitivity(tiny):
    """Against torchao as it is: its ties follow the last bit of its float32 input, so a 1e-6 change
    of the latents moves its output by a fifth of its distance from the float model or more (the
    float model: 1e-6); ours is within twice that movement of it."""
    _, model, inputs = tiny
    latents, timestep, text = inputs
    nudged = latents * (1 + 1e-6 * torch.randn(latents.shape, generator=torch.Generator().manual_seed(5)))
    quantized = torchao_w8a8(model)
    with torch.no_grad():
        ref, ao = model(*inputs).sample.numpy(), quantized(*inputs).sample.numpy()
        movement = relative_error(quantized(nudged, timestep, text).sample.numpy(), ao)
    assert movement > relative_error(ao, ref) / 5
    root = tiny[0]
    ours = run_ours(load_transformer(root, "float32", weights_dtype="int8", activations_dtype="int8"), inputs)
    assert relative_error(ours, ao) <= 2 * movement


@pytest.mark.slow
def test_pipeline_latents_nearer_torchao_than_a_quarter_of_its_own_distance(tiny_pipeline_dir, exact_ties):
    """The tiny pipeline's final latents (``denoise``, 4 UniPC steps, float32) with W8A8 are nearer
    diffusers' W8A8 run (torchao, ties broken as ours; the text encoder's linears weight-only int8,
    as ``--weights_dtype int8`` stores them) than a quarter of that run's distance from diffusers'
    float run (measured: 5% of it; weight-only int8: 34%, so the bound tells them apart). Frames
    cannot tell (W8A8 moves a tiny model's frames by 2 levels). Guidance 1: with CFG at 5 one
    rounding flip anywhere (W8A8 is discontinuous) is multiplied by the guidance at every step, and
    torchao's own run moves by 74% of its distance from float under a 1e-6 change of the noise."""
    from diffusers import WanPipeline as DiffusersPipeline
    from helpers.pipelines import NEGATIVE, PROMPT, reference_run

    from wanjax import WanPipeline

    height, width, frames, steps = 48, 64, 9, 4
    noise = torch.randn((1, 16, 3, height // 8, width // 8), generator=torch.Generator().manual_seed(0))
    reference = DiffusersPipeline.from_pretrained(tiny_pipeline_dir)
    float_latents, _ = reference_run(reference, height, width, frames, steps, noise, guidance_scale=1.0)
    reference.transformer = torchao_w8a8(reference.transformer)
    # --weights_dtype int8 stores the text encoder's linears in 8 bits too (weight-only)
    torchao.quantize_(reference.text_encoder, torchao.Int8WeightOnlyConfig())
    ao, _ = reference_run(reference, height, width, frames, steps, noise, guidance_scale=1.0)
    pipe = WanPipeline.from_pretrained(
        tiny_pipeline_dir,
        dtype="float32",
        weights_dtype="int8",
        activations_dtype="int8",
        jax_cache_dir=False,
    )
    pos, neg = pipe.encode_prompt(PROMPT, NEGATIVE)
    ours = pipe.denoise(
        pos, neg, noise.numpy(), num_inference_steps=steps, progress=False, guidance_scale=1.0
    )
    assert relative_error(np.asarray(ours.latents), ao) < relative_error(ao, float_latents) / 4


def test_float_activations_keep_the_weight_only_path(tiny):
    """``activations_dtype`` float32 (or auto on this CPU) runs today's weight-only int8; int8 another
    program whose blocks multiply int8 x int8."""
    root, _, inputs = tiny
    runs = {
        a: run_ours(load_transformer(root, "float32", weights_dtype="int8", activations_dtype=a), inputs)
        for a in ("float32", "auto", "int8")
    }
    np.testing.assert_array_equal(runs["float32"], runs["auto"])
    assert relative_error(runs["int8"], runs["float32"]) > 1e-3


def test_marked_blocks_flag_only_attention_and_ffn_kernels(tiny):
    root, _, _ = tiny
    model = load_transformer(root, "float32", weights_dtype="int8", activations_dtype="int8")
    assert model.settings.int8_matmuls
    blocks = marked_blocks(model.params["blocks"], True)

    def flagged(tree) -> set[bool]:
        kernels = jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, QuantizedKernel))
        return {k.w8a8 for k in kernels if isinstance(k, QuantizedKernel)}

    assert flagged({k: blocks[k] for k in ("attn1", "attn2", "ffn")}) == {True}
    assert flagged(model.params) == {False}  # the loaded tree: the forward flags them as it runs
    assert marked_blocks(model.params["blocks"], False) is model.params["blocks"]


def test_w8a8_dots_are_int8_by_int8_into_int32():
    x = jnp.ones((3, 64), jnp.bfloat16)
    values, scale = quantize(np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32), INT8)
    kernel = QuantizedKernel(jnp.asarray(values), jnp.asarray(scale), np.dtype(jnp.bfloat16), w8a8=True)
    from wanjax.models.layers import matmul

    jaxpr = jax.make_jaxpr(matmul)(x, kernel)
    dots = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"]
    assert [
        (str(e.invars[0].aval.dtype), str(e.invars[1].aval.dtype), str(e.outvars[0].aval.dtype)) for e in dots
    ] == [("int8", "int8", "int32")]
    weight_only = jax.make_jaxpr(matmul)(x, dataclasses.replace(kernel, w8a8=False))
    assert all(
        e.invars[0].aval.dtype == jnp.bfloat16
        for e in weight_only.jaxpr.eqns
        if e.primitive.name == "dot_general"
    )


@pytest.mark.parametrize(
    ("platform", "kind", "cuda", "expected"),
    [
        ("tpu", "TPU v6 lite", None, True),
        ("tpu", "TPU v5 lite", None, True),
        ("tpu", "TPU v5", None, True),
        ("tpu", "TPU v4", None, False),
        ("tpu", "TPU7x", None, False),
        ("gpu", "NVIDIA A100-SXM4-80GB", (8, 0), True),
        ("gpu", "NVIDIA L4", (8, 9), True),
        ("gpu", "NVIDIA H100 80GB HBM3", (9, 0), False),
        ("cpu", "cpu", None, False),
    ],
)
def test_auto_is_int8_where_the_chip_multiplies_int8(platform, kind, cuda, expected):
    target = Target(platform, kind, cuda=cuda)
    assert target.multiplies_int8 == expected
    assert int8_matmuls("auto", "int8", target) == expected
    assert not int8_matmuls("auto", "bf16", target) and not int8_matmuls("auto", "fp8", target)
    assert int8_matmuls("int8", "int8", target) and not int8_matmuls("bfloat16", "int8", target)


def test_int8_activations_need_int8_weights():
    with pytest.raises(ConfigError, match="the weights are fp8; add weights_dtype int8"):
        int8_matmuls("int8", "fp8", Target("cpu", "cpu"))
    with pytest.raises(ConfigError, match="unknown activations_dtype 'int4'"):
        int8_matmuls("int4", "int8")


def test_cli_refuses_int8_activations_without_int8_weights(capsys):
    from wanjax.cli.main import main

    assert main(["generate", "--prompt", "x", "--activations_dtype", "int8"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("add --weights_dtype int8 (or leave --activations_dtype at auto)") and "\n" not in err


def test_a_mesh_of_8_devices_equals_one(tiny):
    """dp=1,sp=2,tp=4: the int8 kernels and their scales split by output channel (row-parallel ones by
    input channel: int32 partial sums, exact), tokens over sp. Each block linear equals one device's
    to float32 rounding; the whole DiT as nearly as its float32 parts allow: another summation order
    tips rounding ties, which moves this tiny W8A8 DiT as much as a 1e-6 change of its input does."""
    from wanjax.models.layers import linear
    from wanjax.parallel.mesh import make_mesh, parse_mesh

    root, _, inputs = tiny
    kwargs = dict(weights_dtype="int8", activations_dtype="int8")
    single = load_transformer(root, "float32", **kwargs)
    sharded = load_transformer(root, "float32", mesh=make_mesh(parse_mesh("dp=1,sp=2,tp=4")), **kwargs)
    x = jax.random.normal(
        jax.random.key(0), (2, 36, TINY_DIT["num_attention_heads"] * TINY_DIT["attention_head_dim"])
    )
    for name in ("to_q", "to_out"):
        one = marked_blocks(single.params["blocks"], True)["attn1"][name]
        split = marked_blocks(sharded.params["blocks"], True)["attn1"][name]
        if name == "to_q":  # column-parallel: the scales split with their channels
            assert tuple(split["kernel"].scale.sharding.spec) == (None, "tp")
        layer = lambda p, x: linear(x, jax.tree.map(lambda a: a[0], p))  # noqa: E731
        np.testing.assert_allclose(jax.jit(layer)(split, x), jax.jit(layer)(one, x), rtol=1e-6, atol=1e-6)
    latents, timestep, text = inputs
    nudged = latents * (1 + 1e-6 * torch.randn(latents.shape, generator=torch.Generator().manual_seed(5)))
    one = run_ours(single, inputs)
    sensitivity = relative_error(run_ours(single, (nudged, timestep, text)), one)
    assert relative_error(run_ours(sharded, inputs), one) <= 2 * sensitivity


def test_gguf_blocks_requantised_in_the_program_as_the_host_quantises(tmp_path):
    """``--weights_dtype gguf --activations_dtype int8``: each kept Q8_0 kernel of the blocks is
    dequantised and requantised per channel inside the program to the int8 values and scales the
    host's rule gives its dequantised weights (:func:`wanjax.io.quant.quantize`), and multiplies
    W8A8 (the forward moves off the weight-only one)."""
    from helpers.gguf_files import GGUF_DIT, Q, write_transformer
    from helpers.models import original_state

    from wanjax.io.gguf_kernel import GGUFKernel
    from wanjax.models.dit import TRANSFORMER
    from wanjax.models.w8a8 import w8a8_matmul

    model = save_transformer(tmp_path, seed=5, **{**TINY_DIT, **GGUF_DIT})
    path = write_transformer(tmp_path / "wan-Q8_0.gguf", original_state(model), Q.Q8_0, scale=1e-3)
    config = TRANSFORMER.read_config(tmp_path / "transformer")
    kept = load_transformer(path, "float32", weights_dtype="gguf", activations_dtype="int8", config=config)
    x = jax.random.normal(jax.random.key(1), (2, 5, 256))
    for name in ("to_q", "to_out"):
        stacked = kept.params["blocks"]["attn1"][name]["kernel"]
        assert isinstance(stacked, GGUFKernel)
        layer = jax.tree.map(lambda a: a[1], stacked)
        values, scale = quantize(np.asarray(layer.dequantize(jnp.float32)), INT8)
        got_values, got_scale = jax.jit(lambda w: quantize(w, INT8, jnp))(layer.dequantize(jnp.float32))
        np.testing.assert_array_equal(np.asarray(got_values), values)
        np.testing.assert_array_equal(np.asarray(got_scale), scale)
        flagged = dataclasses.replace(layer, w8a8=True)
        np.testing.assert_array_equal(
            np.asarray(jax.jit(w8a8_matmul)(x, flagged)), np.asarray(jax.jit(int8_matmul)(x, values, scale))
        )
    inputs = reference_inputs(SHAPE, TEXT_LEN, GGUF_DIT["text_dim"], seed=10)
    weight_only = run_ours(load_transformer(path, "float32", weights_dtype="gguf", config=config), inputs)
    assert relative_error(run_ours(kept, inputs), weight_only) > 1e-3


def test_offload_blocks_streams_the_int8_kernels(tiny):
    """``--offload blocks``: the stacked int8 kernels stream from host memory per layer and multiply
    W8A8 as resident ones do (the same program but for the transfers)."""
    root, _, inputs = tiny
    kwargs = dict(weights_dtype="int8", activations_dtype="int8")
    resident = run_ours(load_transformer(root, "float32", **kwargs), inputs)
    streamed = run_ours(load_transformer(root, "float32", offload="blocks", **kwargs), inputs)
    assert relative_error(streamed, resident) <= 1e-6


def test_a_lora_merged_into_int8_kernels_multiplies_w8a8(tiny, tmp_path):
    """A LoRA is merged into the int8 kernels (dequantised, merged in float32, requantised) and the
    W8A8 forward multiplies the merged ones: as near the float model with the LoRA as W8A8 is to the
    float model without it, and the LoRA moves the output far more than that."""
    from helpers.lora import diffusers_lora_for

    root, _, inputs = tiny
    lora = tmp_path / "lora.safetensors"
    float_model = load_transformer(root, "float32")
    diffusers_lora_for(float_model.cfg, lora, seed=3, std=0.3)
    runs = {}
    for name, kwargs in {"float": {}, "w8a8": dict(weights_dtype="int8", activations_dtype="int8")}.items():
        model = load_transformer(root, "float32", **kwargs)
        runs[name] = run_ours(model, inputs)
        model.set_loras([(lora, 1.0)])
        runs[f"{name}+lora"] = run_ours(model, inputs)
    w8a8_error = relative_error(runs["w8a8"], runs["float"])
    assert relative_error(runs["w8a8+lora"], runs["float+lora"]) < 2 * w8a8_error
    assert relative_error(runs["float+lora"], runs["float"]) > 10 * w8a8_error


@pytest.mark.slow
def test_two_experts_run_w8a8_and_the_record_says_so(demo_env, tmp_path):
    """``generate`` of the two-expert demo with ``--weights_dtype int8 --activations_dtype int8``:
    both experts' blocks multiply int8 (one setting loads both) and the record says what ran; the
    default on this CPU records the model dtype."""
    import json

    from wanjax import WanPipeline
    from wanjax.cli.main import main

    small = ["--height", "32", "--width", "32", "--frames", "5", "--num_inference_steps", "2"]
    args = ["generate", "--model", "demo-a14b", "--prompt", "a cat", *small, "--weights_dtype", "int8"]
    records = {}
    for activations in ("int8", "auto"):
        video = tmp_path / f"{activations}.mp4"
        assert main([*args, "--activations_dtype", activations, "--output_video", str(video)]) == 0
        records[activations] = json.loads(video.with_suffix(".json").read_text())
    assert records["int8"]["activations_dtype"] == "int8" and records["int8"]["expert_steps"] == [0, 1]
    assert records["auto"]["activations_dtype"] == "bfloat16"
    pipe = WanPipeline.from_pretrained("demo-a14b", weights_dtype="int8", activations_dtype="int8")
    experts = (pipe.components.transformer, pipe.components.transformer_2)
    assert all(e.settings.int8_matmuls for e in experts)
