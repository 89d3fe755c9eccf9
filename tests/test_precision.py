"""The float32 precision setting (``highest | high | default``): parsing, per-platform defaults, that
each setting reaches every convolution and matmul of the lowered programs, that ``highest`` stays
exact against the references, the error bound of the platforms' fast settings, and that 16-bit VAE
convolutions take 16-bit operands."""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import shutil
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from diffusers import AutoencoderKLWan
from helpers.compare import relative_error
from helpers.compare import relative_error as dit_relative_error
from helpers.dit import reference_inputs, run_ours
from helpers.models import randomize_
from helpers.text_encoder import CASES as UMT5_CASES
from helpers.text_encoder import padded_batch, save_text_encoder
from helpers.tokenizer import make_tokenizer_dir
from helpers.vae import CONFIGS, LATENT_HW, assert_not_saturated, randn

import wanjax
from wanjax.errors import ConfigError
from wanjax.io.checkpoint import random_params
from wanjax.kernels.common import Platform
from wanjax.kernels.precision import (
    PRECISIONS,
    default_precision,
    lax_precision,
    parse_precision,
    resolve_precision,
)
from wanjax.kernels.xla import xla_attention
from wanjax.models import dit, umt5
from wanjax.models.registry import transformer_preset
from wanjax.models.settings import RunSettings
from wanjax.models.vae import VAEConfig, WanVAE, checkpoint_spec, decode_uint8, load_vae
from wanjax.models.vae import programs as vae_programs
from wanjax.models.vae.ops import CONV_IMPLS, default_conv, f32_conv_output
from wanjax.pipeline.pipeline import WanPipeline

# ----------------------------------------------------------------------------------------------
# The setting


def test_parse_precision():
    assert PRECISIONS == ("highest", "high", "default")
    for name in PRECISIONS:
        assert parse_precision(name) == name
        assert parse_precision(name.upper()) == name
    for bad in ("fastest", "tf32", "", None, 3):
        with pytest.raises(ConfigError, match="unknown precision") as err:
            parse_precision(bad)
        assert "\n" not in str(err.value) and "highest, high, default" in str(err.value)


@pytest.mark.parametrize(
    ("platform", "expected"),
    [
        ("cpu", {"transformer": "highest", "text_encoder": "highest", "vae": "highest"}),
        ("gpu", {"transformer": "highest", "text_encoder": "highest", "vae": "default"}),
        ("cuda", {"transformer": "highest", "text_encoder": "highest", "vae": "default"}),
        ("rocm", {"transformer": "highest", "text_encoder": "highest", "vae": "default"}),
        ("tpu", {"transformer": "highest", "text_encoder": "highest", "vae": "high"}),
    ],
)
def test_default_precision_per_platform(platform, expected):
    assert {c: default_precision(platform, c) for c in expected} == expected
    assert {c: resolve_precision(None, c, platform) for c in expected} == expected
    assert resolve_precision("High", "vae", platform) == "high"  # an explicit setting wins


def test_default_precision_errors_and_this_platform():
    with pytest.raises(ConfigError, match="unknown component"):
        default_precision("cpu", "scheduler")
    assert resolve_precision(None, "vae") == default_precision(jax.default_backend(), "vae")


def test_lax_precision_only_for_float32():
    assert lax_precision("highest", jnp.float32) == jax.lax.Precision.HIGHEST
    assert lax_precision("high", jnp.float32) == jax.lax.Precision.HIGH
    assert lax_precision("default", jnp.float32) == jax.lax.Precision.DEFAULT
    assert lax_precision("highest", jnp.bfloat16) is None
    assert lax_precision("highest", jnp.float16) is None


def test_vae_numerics_per_platform():
    assert f32_conv_output("cpu") and f32_conv_output("tpu")
    assert not f32_conv_output("gpu") and not f32_conv_output("cuda")
    assert default_conv("cpu") == "taps"
    assert {default_conv(p) for p in ("gpu", "cuda", "rocm", "tpu")} == {"ring"}
    assert WanVAE(TINY_VAE, tiny_vae_params("float32")).numerics.conv == default_conv(jax.default_backend())


@pytest.mark.parametrize(
    ("platform", "channel_last"),
    [
        (Platform("cpu"), False),
        (Platform("gpu", (9, 0)), True),
        (Platform("gpu", (8, 0)), True),
        (Platform("gpu", None), False),  # ROCm: MIOpen's own layout rules
        (Platform("tpu"), False),
    ],
)
def test_vae_conv_layout_option_per_platform(platform, channel_last):
    """On CUDA the VAE's programs make XLA give every convolution channel-last layouts (its
    heuristic gives 3-D and float32 convolutions NCHW); the options are ones this XLA knows."""
    options = vae_programs.compiler_options(platform)
    assert (options or {}).get("xla_gpu_force_conv_nhwc", False) is channel_last
    if platform.name == "cpu":
        assert options["xla_cpu_scheduler_type"] == "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"
    x, k = jnp.ones((1, 3, 4, 4, 2)), jnp.ones((3, 3, 3, 2, 2))
    dims = ("NDHWC", "DHWIO", "NDHWC")
    conv = jax.jit(
        lambda x, k: jax.lax.conv_general_dilated(x, k, (1,) * 3, "SAME", dimension_numbers=dims),
        compiler_options=options,
    )
    assert conv.lower(x, k).compile()(x, k).shape == x.shape  # an unknown option name fails to compile
    assert vae_programs.compiler_options() == vae_programs.compiler_options(Platform.detect())


# ----------------------------------------------------------------------------------------------
# The lowered programs: every convolution and matmul carries the setting

HLO_PRECISION = {"highest": "HIGHEST", "high": "HIGH", "default": "DEFAULT"}


@dataclasses.dataclass(frozen=True)
class Op:
    kind: str  # "conv" or "dot"
    lhs: str  # element types
    rhs: str
    out: str
    precision: str  # of the lhs operand, as the StableHLO text writes it


def hlo_ops(lowered: jax.stages.Lowered) -> list[Op]:
    """Every ``convolution`` and ``dot_general`` of a lowered program."""
    ops = []
    for line in lowered.as_text().splitlines():
        kind = (
            "conv" if "stablehlo.convolution" in line else "dot" if "stablehlo.dot_general" in line else None
        )
        if kind is None:
            continue
        types = re.search(
            r": \(tensor<(?:\d+x)*(\w+)>, tensor<(?:\d+x)*(\w+)>\) -> tensor<(?:\d+x)*(\w+)>", line
        )
        precision = re.search(r"precision (\w+)>|precision = \[(\w+)", line)
        ops.append(Op(kind, *types.groups(), precision.group(1) or precision.group(2)))
    return ops


TINY_VAE = VAEConfig(
    base_dim=8, z_dim=4, dim_mult=(1, 2, 2, 2), num_res_blocks=1, temperal_downsample=(True, False, True)
)
TINY_LATENTS = jax.ShapeDtypeStruct((1, 4, 2, 3, 5), jnp.float32)


@functools.cache
def tiny_vae_params(dtype: str):
    return random_params(checkpoint_spec(TINY_VAE, "decoder"), jnp.dtype(dtype))


@pytest.mark.slow
@pytest.mark.parametrize("conv", CONV_IMPLS)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_vae_convs_and_matmuls_follow_the_setting(precision, conv):
    vae = WanVAE(TINY_VAE, tiny_vae_params("float32"), "float32", conv=conv, precision=precision)
    assert vae.precision == precision and vae.numerics.precision == precision
    ops = hlo_ops(vae.lower("decode", TINY_LATENTS))
    kinds = Counter(op.kind for op in ops)
    assert kinds["conv"] > 20 and kinds["dot"] > 5
    assert {op.precision for op in ops} == {HLO_PRECISION[precision]}
    assert {(op.lhs, op.rhs, op.out) for op in ops} == {("f32", "f32", "f32")}


@pytest.mark.parametrize("precision", PRECISIONS)
def test_transformer_matmuls_follow_the_setting(precision):
    cfg = transformer_preset("tiny")
    params = random_params(dit.checkpoint_spec(cfg), jnp.float32)
    model = dit.WanTransformer(cfg, params, RunSettings(jnp.float32, precision))
    assert model.settings.precision == precision
    lowered = model._forward.lower(
        params, dit.DitInputs(jnp.zeros((1, 16, 1, 4, 4)), jnp.zeros((1,)), jnp.zeros((1, 5, 32)))
    )
    ops = hlo_ops(lowered)
    assert len(ops) >= 14  # embedders, q/k/v/out and the scores/values of both attentions, FFN, proj_out
    assert {op.precision for op in ops} == {HLO_PRECISION[precision]}


@pytest.mark.parametrize("precision", PRECISIONS)
def test_text_encoder_matmuls_follow_the_setting(precision):
    cfg = umt5.UMT5Config(**UMT5_CASES[0][1])
    params = random_params(umt5.checkpoint_spec(cfg), jnp.float32)
    encoder = umt5.UMT5Encoder(cfg, params, None, precision=precision)
    assert encoder.precision == precision
    ids = jnp.zeros((2, 8), jnp.int32)
    ops = hlo_ops(encoder._forward.lower(params, ids, ids))
    assert len(ops) >= 9  # q, k, v, scores, values, o, wi_0, wi_1, wo
    assert {op.precision for op in ops} == {HLO_PRECISION[precision]}


@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("blockwise", [False, True])
@pytest.mark.parametrize("precision", PRECISIONS)
def test_xla_attention_follows_the_setting(precision, blockwise, per_head):
    q = jax.ShapeDtypeStruct((1, 40, 2, 8), jnp.float32)
    limit = 16 if blockwise else 1 << 26

    def attend(q, k, v):
        return xla_attention(
            q,
            k,
            v,
            scale=0.3,
            block_q=16,
            block_k=16,
            dense_limit=limit,
            per_head=per_head,
            precision=precision,
        )

    ops = hlo_ops(jax.jit(attend).lower(q, q, q))
    assert len(ops) == 2
    assert {op.precision for op in ops} == {HLO_PRECISION[precision]}


def test_sixteen_bit_operands_carry_no_precision():
    """bf16 matmuls and convolutions are exact products on every backend: no attribute, whatever the
    setting; their operands stay bf16."""
    vae = WanVAE(TINY_VAE, tiny_vae_params("bfloat16"), "bfloat16", conv="conv3d", precision="highest")
    ops = hlo_ops(vae.lower("decode", TINY_LATENTS))
    assert {op.precision for op in ops} == {"DEFAULT"}
    assert {(op.lhs, op.rhs) for op in ops} == {("bf16", "bf16")}
    cfg = transformer_preset("tiny")
    params = random_params(dit.checkpoint_spec(cfg), jnp.bfloat16)
    model = dit.WanTransformer(cfg, params, RunSettings(jnp.bfloat16, "highest"))
    lowered = model._forward.lower(
        params, dit.DitInputs(jnp.zeros((1, 16, 1, 4, 4)), jnp.zeros((1,)), jnp.zeros((1, 5, 32)))
    )
    bf16 = [op for op in hlo_ops(lowered) if op.lhs == "bf16"]
    assert len(bf16) > 10 and {op.precision for op in bf16} == {"DEFAULT"}


# ----------------------------------------------------------------------------------------------
# bf16 VAE convolutions: bf16 operands, and a result XLA's GPU compiler keeps in bf16


def gpu_style(vae: WanVAE) -> WanVAE:
    """``vae`` with the numerics it gets on a GPU (convolutions return the activation dtype)."""
    nm = dataclasses.replace(vae.numerics, f32_conv_output=False)
    vae.numerics = nm
    vae._statics = {m: tuple((k, nm if k == "nm" else v) for k, v in s) for m, s in vae._statics.items()}
    return vae


@pytest.mark.parametrize("conv", CONV_IMPLS)
def test_bfloat16_vae_convolutions_take_bfloat16_operands(conv):
    """XLA's GPU compiler widens the operands of a mixed-precision (bf16 x bf16 -> f32) convolution
    to float32 (``ConvBfloat16Support::SupportsMixedPrecisions`` is false for convolutions), which
    ran every VAE conv of a bf16 decode as a float32/TF32 cuDNN kernel. On GPUs the convolutions are
    bf16 -> bf16 (cuDNN accumulates in float32); elsewhere bf16 -> f32. Never float32 operands."""
    here = WanVAE(TINY_VAE, tiny_vae_params("bfloat16"), "bfloat16", conv=conv)
    convs = [op for op in hlo_ops(here.lower("decode", TINY_LATENTS)) if op.kind == "conv"]
    assert convs and {(op.lhs, op.rhs, op.out) for op in convs} == {("bf16", "bf16", "f32")}

    gpu = gpu_style(WanVAE(TINY_VAE, tiny_vae_params("bfloat16"), "bfloat16", conv=conv))
    convs = [op for op in hlo_ops(gpu.lower("decode", TINY_LATENTS)) if op.kind == "conv"]
    assert convs and {(op.lhs, op.rhs, op.out) for op in convs} == {("bf16", "bf16", "bf16")}


# ----------------------------------------------------------------------------------------------
# highest stays exact against the references (the parity tests' own tolerances)


@pytest.fixture(scope="module")
def small_vae(tmp_path_factory):
    """(model root, diffusers model) of test_vae's ``small`` config."""
    root = tmp_path_factory.mktemp("precision_vae")
    model = randomize_(AutoencoderKLWan(**CONFIGS["small"]), seed=7, std=0.2).eval()
    model.save_pretrained(root / "vae")
    return root, model


@pytest.mark.slow
def test_vae_highest_matches_diffusers(small_vae):
    root, model = small_vae
    z = randn((2, CONFIGS["small"]["z_dim"], 2, *LATENT_HW), seed=2)
    with torch.no_grad():
        ref = model.decode(z).sample.numpy()
    vae = wanjax.load_vae(root, precision="highest")
    assert vae.numerics.precision == "highest"
    assert_not_saturated(ref)
    assert relative_error(vae.decode(jnp.asarray(z.numpy())), ref) <= 1e-5


def test_bfloat16_gpu_style_decode_close_to_float32_reference(small_vae):
    """The bf16 -> bf16 convolutions GPUs run, here on the CPU: as close as test_vae's bf16 bound."""
    root, model = small_vae
    z = randn((2, 4, 1, *LATENT_HW), seed=4)
    with torch.no_grad():
        ref = model.decode(z).sample.numpy()
    vae = gpu_style(load_vae(root, dtype="bfloat16", compile_in_child=False))
    out = vae.decode(jnp.asarray(z.numpy()))
    assert out.dtype == jnp.bfloat16
    assert relative_error(out.astype(jnp.float32), ref) <= 3e-2


def test_transformer_highest_matches_diffusers(tiny_transformer_dir):
    root, torch_model = tiny_transformer_dir
    inputs = reference_inputs((2, 16, 3, 6, 8), 7, 32, seed=2)
    with torch.no_grad():
        ref = torch_model(*inputs).sample.numpy()
    model = wanjax.load_transformer(root, dtype="float32", precision="highest")
    assert model.settings.precision == "highest"
    assert dit_relative_error(run_ours(model, inputs), ref) <= 1e-5


def test_text_encoder_highest_matches_transformers(tmp_path):
    _, config, lengths, padded = UMT5_CASES[0]
    torch_model = save_text_encoder(tmp_path, seed=1, **config)
    make_tokenizer_dir(tmp_path / "tokenizer")
    ids, mask = padded_batch(lengths, padded, config["vocab_size"], seed=2)
    with torch.no_grad():
        ref = torch_model(torch.from_numpy(ids), torch.from_numpy(mask)).last_hidden_state.numpy()
    encoder = wanjax.load_text_encoder(tmp_path, dtype="float32", precision="highest")
    assert encoder.precision == "highest"
    assert relative_error(encoder(ids, mask), ref) <= 1e-5


# ----------------------------------------------------------------------------------------------
# The fast settings' error bound, emulated on the CPU: float32 operands rounded as the hardware does


def _tf32(x: jax.Array) -> jax.Array:
    """Round float32 to TF32's 10 mantissa bits (nearest, ties to even)."""
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    bits = (bits + jnp.uint32(0xFFF) + ((bits >> 13) & 1)) & jnp.uint32(0xFFFFE000)
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


def _bf16(x: jax.Array) -> jax.Array:
    return x.astype(jnp.bfloat16).astype(jnp.float32)


def emulating(op, platform: str):
    """``op`` (a convolution or matmul) computing float32 below ``HIGHEST`` as ``platform`` does:
    GPU: TF32 operands; TPU: ``high`` = 3 bf16 passes (hi*hi + hi*lo + lo*hi), ``default`` = 1."""

    def run(a, b, *args, precision=None, **kw):
        exact = functools.partial(op, *(), precision=jax.lax.Precision.HIGHEST, **kw)
        if a.dtype != jnp.float32 or precision == jax.lax.Precision.HIGHEST:
            return op(a, b, *args, precision=precision, **kw)
        if platform == "gpu":
            return exact(_tf32(a), _tf32(b), *args)
        a_hi, b_hi = _bf16(a), _bf16(b)
        if precision == jax.lax.Precision.HIGH:
            a_lo, b_lo = _bf16(a - a_hi), _bf16(b - b_hi)
            return exact(a_hi, b_hi, *args) + (exact(a_hi, b_lo, *args) + exact(a_lo, b_hi, *args))
        return exact(a_hi, b_hi, *args)

    return run


@pytest.fixture(scope="module")
def emulation_case(small_vae):
    """(frames at a precision, the exact frames) for a 3-latent-frame decode of ``small``."""
    vae = load_vae(small_vae[0], compile_in_child=False)
    z = jnp.asarray(randn((2, 4, 3, *LATENT_HW), seed=11).numpy())

    def frames(precision: str) -> np.ndarray:
        nm = dataclasses.replace(vae.numerics, precision=precision)
        run = jax.jit(lambda p, z: decode_uint8(p, vae.cfg, z, nm=nm, chunk=1, frames=1)[0])  # a fresh trace
        return np.asarray(run(vae.params, z), np.int16)

    return frames, frames("highest")


@pytest.mark.slow
@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_vae_default_precision_within_two_levels_of_exact(emulation_case, platform, monkeypatch):
    """The platform's default VAE precision (GPU: TF32, TPU: 3-pass bf16) gives frames within 2 uint8
    levels of the exact decode (1 on these weights)."""
    frames, exact = emulation_case
    assert exact.std() > 20
    monkeypatch.setattr(jax.lax, "conv_general_dilated", emulating(jax.lax.conv_general_dilated, platform))
    monkeypatch.setattr(jnp, "matmul", emulating(jnp.matmul, platform))
    fast = frames(default_precision(platform, "vae"))
    assert 0 < np.abs(fast - exact).max() <= 2  # and the emulation did change something


# ----------------------------------------------------------------------------------------------
# The pipeline and the loaders


def test_pipeline_precisions(tiny_transformer_dir):
    root, _ = tiny_transformer_dir
    pipe = WanPipeline.from_pretrained(root, jax_cache_dir=False)
    platform = jax.default_backend()
    assert pipe.components.precisions == {
        c: default_precision(platform, c) for c in ("transformer", "text_encoder", "vae")
    }

    pipe = WanPipeline.from_pretrained(
        root, dtype="float32", precision="default", vae_precision="HIGH", jax_cache_dir=False
    )
    assert pipe.components.precisions == {"transformer": "default", "text_encoder": "default", "vae": "high"}
    assert pipe.transformer.settings.precision == "default"
    with pytest.raises(ConfigError, match="unknown precision 'tf32'"):
        WanPipeline.from_pretrained(root, vae_precision="tf32", jax_cache_dir=False)


def test_loaders_take_precision(tiny_transformer_dir, small_vae, tmp_path):
    root, _ = tiny_transformer_dir
    assert wanjax.load_transformer(root, precision="high").settings.precision == "high"
    assert wanjax.load_transformer(root).settings.precision == default_precision(
        jax.default_backend(), "transformer"
    )
    with pytest.raises(ConfigError, match="unknown precision"):
        wanjax.load_transformer(root, precision="fast")
    vae_root, _ = small_vae
    assert wanjax.load_vae(vae_root, precision="default").numerics.precision == "default"
    assert wanjax.load_vae(vae_root).precision == default_precision(jax.default_backend(), "vae")
    shutil.copytree(vae_root / "vae", tmp_path / "vae")  # any model name the loaders take
    assert wanjax.load_vae(tmp_path / "vae", precision="high").precision == "high"


@pytest.mark.slow
def test_cli_precision_flags_reach_the_run_and_its_record(demo_env, tmp_path, capsys):
    from wanjax.cli.main import main

    out = ("--output_video", tmp_path / "v.mp4")
    small = ("--height", "32", "--width", "32", "--frames", "5", "--num_inference_steps", "1")
    args = ["generate", "--model", "demo", "--prompt", "a cat", *small, *out]
    assert main([str(a) for a in (*args, "--precision", "high", "--vae_precision", "default")]) == 0
    record = json.loads((tmp_path / "v.json").read_text())
    assert record["precision"] == {"encode": "high", "denoise": "high", "decode": "default"}
    assert record["arguments"]["vae_precision"] == "default"
    capsys.readouterr()
    assert main([str(a) for a in (*args, "--vae_precision", "exact")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--vae_precision" in err and "highest" in err, err
