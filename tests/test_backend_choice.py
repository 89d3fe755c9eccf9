"""Which attention backend runs each call: a pure function of the platform and the call's shape.

Platforms are simulated (``Platform("gpu", (9, 0))`` is an H100), so every rule is checked on a CPU.
The models' own calls are found by tracing them (weights abstract, nothing computed): each
``attention()`` call runs in a named scope that records its shape (``AttentionShape.label``).
"""

from __future__ import annotations

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractMesh

from wanjax.errors import ConfigError
from wanjax.io.checkpoint import abstract_params
from wanjax.kernels.attention import (
    BACKENDS,
    AttentionShape,
    AttentionSpec,
    Platform,
    attention,
    available,
    backend_limit,
    check_backend,
    resolve_backend,
)
from wanjax.models import dit, umt5
from wanjax.models.registry import UMT5_XXL, transformer_preset
from wanjax.models.settings import RunSettings
from wanjax.models.vae import functional
from wanjax.models.vae.config import VAEConfig
from wanjax.models.vae.layout import checkpoint_spec as vae_checkpoint_spec
from wanjax.models.vae.ops import Numerics
from wanjax.parallel.attention import sequence_mode, sharded_attention
from wanjax.parallel.layouts import token_layout

H100 = Platform("gpu", (9, 0))
A100 = Platform("gpu", (8, 0))
V100 = Platform("gpu", (7, 0))
ROCM = Platform("gpu")  # a GPU without CUDA
TPU = Platform("tpu")
CPU = Platform("cpu")
PLATFORMS = {"h100": H100, "a100": A100, "v100": V100, "rocm": ROCM, "tpu": TPU, "cpu": CPU}

# Wan 2.1 1.3B at 480x832x81: 32,760 video tokens, 512 text tokens, 12 heads of 128.
DIT_SELF = AttentionShape(128, "bfloat16", 2, 32760, 32760, 12)
DIT_CROSS = AttentionShape(128, "bfloat16", 2, 32760, 512, 12)
# The VAE's mid-block attention: one 384-dim head over a 60x104 latent frame.
VAE = AttentionShape(384, "bfloat16", 1, 6240, 6240, 1)
DTYPES = ("bfloat16", "float16", "float32")


def shape(**change) -> AttentionShape:
    return dataclasses.replace(DIT_SELF, **change)


# ---- the rules, platform by platform --------------------------------------------------------------


@pytest.mark.parametrize(
    "platform,problem,expected",
    [
        (H100, DIT_SELF, "cudnn"),
        (H100, DIT_CROSS, "cudnn"),
        (H100, shape(dtype="float16"), "cudnn"),
        (H100, VAE, "xla"),  # head dim 384 > 256
        (H100, shape(head_dim=256), "cudnn"),
        (H100, shape(head_dim=192), "cudnn"),
        (H100, shape(head_dim=264), "xla"),
        (H100, shape(head_dim=100), "xla"),  # not a multiple of 8
        (H100, shape(dtype="float32"), "xla"),
        (H100, dataclasses.replace(VAE, dtype="float32"), "xla"),
        (H100, shape(window=300), "xla"),  # cuDNN has no two-sided window
        (A100, DIT_SELF, "cudnn"),
        (A100, shape(head_dim=192), "xla"),  # 128 before Hopper
        (V100, DIT_SELF, "xla"),  # cuDNN flash attention needs sm80+
        (ROCM, DIT_SELF, "xla"),
        (TPU, DIT_SELF, "splash"),
        (TPU, VAE, "xla"),  # head dim 384 > 256: the TPU kernels' blocks would not fit in VMEM
        (TPU, shape(head_dim=256), "splash"),
        (TPU, shape(head_dim=264), "xla"),
        (TPU, shape(dtype="float32"), "splash"),
        (TPU, shape(head_dim=100, window=300), "splash"),
        (CPU, DIT_SELF, "xla"),
        (CPU, VAE, "xla"),
    ],
)
def test_auto_picks_the_fastest_capable_backend(platform, problem, expected):
    assert resolve_backend("auto", problem, platform=platform) == expected


def cudnn_runs(platform: Platform, p: AttentionShape) -> bool:
    """JAX's checks before cuDNN flash attention (``check_layout``, ``check_is_flash_attention``,
    ``dot_product_attention``'s window rule), restated independently of wanjax's."""
    if platform.cuda is None or platform.cuda < (8, 0):
        return False
    top = 256 if platform.cuda >= (9, 0) else 128
    return (
        p.dtype in ("bfloat16", "float16") and p.head_dim <= top and p.head_dim % 8 == 0 and p.window is None
    )


@pytest.mark.parametrize("platform", PLATFORMS.values(), ids=PLATFORMS.keys())
def test_auto_is_the_fastest_backend_that_can_run_the_call(platform):
    head_dims, windows = (8, 40, 64, 100, 128, 192, 256, 264, 384, 512), (None, 0, 300)
    for head_dim, dtype, window in itertools.product(head_dims, DTYPES, windows):
        problem = shape(head_dim=head_dim, dtype=dtype, window=window)
        gpu_choice = "cudnn" if cudnn_runs(platform, problem) else "xla"
        tpu_choice = "splash" if head_dim <= 256 else "xla"
        expected = tpu_choice if platform.name == "tpu" else gpu_choice
        chosen = resolve_backend("auto", problem, platform=platform)
        assert chosen == expected, problem
        assert backend_limit(chosen, platform, problem) is None
        assert resolve_backend(chosen, problem, platform=platform) == chosen  # asking for it by name works


def test_the_choice_ignores_what_is_not_a_limit():
    """Batch, lengths and head count do not change the choice (a shard's local shape resolves alike)."""
    for platform in PLATFORMS.values():
        choices = {
            resolve_backend("auto", shape(batch=b, q_len=lq, k_len=lk, heads=h), platform=platform)
            for b, lq, lk, h in [(1, 1, 1, 1), (2, 32760, 512, 40), (1, 75600, 75600, 3)]
        }
        assert len(choices) == 1


def test_available_backends_per_platform():
    assert available(H100) == available(A100) == BACKENDS
    assert "cudnn" not in available(V100) + available(ROCM) + available(TPU) + available(CPU)
    assert available(CPU) == ("auto", "xla", "splash", "splash_exp2")
    assert available() == available(CPU)  # this process: the tests run on the CPU


def test_this_process_is_a_cpu():
    assert Platform.detect() == CPU
    assert resolve_backend("auto", DIT_SELF) == resolve_backend("auto", VAE) == "xla"


# ---- a backend asked for by name ------------------------------------------------------------------


@pytest.mark.parametrize(
    "platform,problem,message",
    [
        (
            H100,
            VAE,
            "--attention cudnn: head dim 384 > 256 (cuDNN's limit on compute capability 9.0+); "
            "use --attention xla or auto",
        ),
        (
            A100,
            shape(head_dim=192),
            "--attention cudnn: head dim 192 > 128 (cuDNN's limit on compute capability < 9.0); "
            "use --attention xla or auto",
        ),
        (
            H100,
            shape(head_dim=100),
            "--attention cudnn: head dim 100 is not a multiple of 8 (cuDNN's limit); use --attention xla or auto",
        ),
        (
            H100,
            shape(dtype="float32"),
            "--attention cudnn: needs bfloat16 or float16 activations (--dtype bfloat16), got float32; "
            "use --attention xla or auto",
        ),
        (
            H100,
            shape(window=300),
            "--attention cudnn: no two-sided local window in cuDNN (--window_size); use --attention xla or auto",
        ),
        (
            V100,
            DIT_SELF,
            "attention backend 'cudnn' needs an NVIDIA GPU of compute capability 8.0 or newer, this one has "
            "7.0; available: auto, xla, splash, splash_exp2",
        ),
        (
            TPU,
            DIT_SELF,
            "attention backend 'cudnn' needs an NVIDIA GPU, unavailable on tpu; "
            "available: auto, xla, splash, splash_exp2",
        ),
    ],
)
def test_a_named_backend_that_cannot_run_the_call_is_a_one_line_config_error(platform, problem, message):
    with pytest.raises(ConfigError) as err:
        resolve_backend("cudnn", problem, platform=platform)
    assert str(err.value) == message


@pytest.mark.parametrize("backend", ["splash", "splash_exp2"])
def test_the_tpu_kernels_refuse_heads_past_256(backend):
    with pytest.raises(ConfigError) as err:
        resolve_backend(backend, VAE, platform=TPU)
    assert str(err.value) == (
        f"--attention {backend}: head dim 384 > 256 (the TPU kernels' blocks would not fit in VMEM); "
        "use --attention xla or auto"
    )


def test_a_named_backend_that_can_run_the_call_is_used_as_is():
    assert resolve_backend("cudnn", DIT_SELF, platform=H100) == "cudnn"
    assert resolve_backend("xla", DIT_SELF, platform=H100) == "xla"
    assert resolve_backend("splash_exp2", DIT_SELF, platform=TPU) == "splash_exp2"
    assert resolve_backend("splash", DIT_SELF, platform=H100) == "splash"  # interpret mode, but it runs


def test_without_a_shape_only_the_platform_is_checked():
    """What the command line can check before reading the model's config."""
    assert resolve_backend("cudnn", platform=H100) == "cudnn"
    assert resolve_backend("auto", platform=H100) == "cudnn"
    assert resolve_backend("auto", platform=CPU) == "xla"
    with pytest.raises(ConfigError, match="needs an NVIDIA GPU, unavailable on cpu"):
        resolve_backend("cudnn", platform=CPU)
    with pytest.raises(
        ConfigError, match=r"^unknown attention backend 'flash9'; available: auto, xla, cudnn"
    ):
        resolve_backend("flash9", platform=H100)


def test_check_backend_is_the_pre_flight():
    """The transformer's calls, from its config and dtype: an explicit backend that cannot run one of
    them fails before any weight is read; ``auto`` never does."""
    cfg = transformer_preset("14B")

    def dit_shapes(dtype, window=None):
        self_attn = AttentionShape(
            cfg.attention_head_dim, dtype, heads=cfg.num_attention_heads, window=window
        )
        return [self_attn, AttentionShape(cfg.attention_head_dim, dtype, heads=cfg.num_attention_heads)]

    check_backend(AttentionSpec("cudnn"), dit_shapes(jnp.bfloat16), platform=H100)
    check_backend("auto", dit_shapes(jnp.float32, window=7), platform=H100)
    with pytest.raises(ConfigError, match=r"^--attention cudnn: needs bfloat16 or float16 activations"):
        check_backend(AttentionSpec("cudnn"), dit_shapes(jnp.float32), platform=H100)
    with pytest.raises(ConfigError, match=r"^--attention cudnn: no two-sided local window"):
        check_backend(
            AttentionSpec("cudnn", window_size=7), dit_shapes(jnp.bfloat16, window=7), platform=H100
        )
    with pytest.raises(ConfigError, match="needs an NVIDIA GPU, unavailable on cpu"):
        check_backend("cudnn", [], platform=CPU)


def test_attention_refuses_a_named_backend_before_running():
    q = jnp.zeros((1, 4, 1, 8))
    with pytest.raises(ConfigError, match="needs an NVIDIA GPU, unavailable on cpu"):
        attention(q, q, q, backend="cudnn")


# ---- the calls the models make --------------------------------------------------------------------


def _name_stacks(jaxpr, out: set[str]) -> set[str]:
    for eqn in jaxpr.eqns:
        out.add(str(eqn.source_info.name_stack))
        for param in eqn.params.values():
            for inner in param if isinstance(param, tuple | list) else (param,):
                inner = getattr(inner, "jaxpr", inner)
                if hasattr(inner, "eqns"):
                    _name_stacks(inner, out)
    return out


def attention_calls(fn, *args) -> set[AttentionShape]:
    """The shapes of the ``attention()`` calls tracing ``fn(*args)`` makes (nothing is computed)."""
    stacks = _name_stacks(jax.make_jaxpr(fn)(*args).jaxpr, set())
    return {found for stack in stacks for _, found in AttentionShape.parse(stack)}


def test_label_round_trips():
    for problem in (DIT_SELF, DIT_CROSS, VAE, shape(window=0), shape(dtype="float32", head_dim=100)):
        label = problem.label("splash_exp2")
        assert AttentionShape.parse(f"jit(f)/vmap({label})/dot_general") == [("splash_exp2", problem)]


def test_attention_records_its_shape_and_backend():
    q = jax.ShapeDtypeStruct((1, 130, 2, 64), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((1, 40, 2, 64), jnp.bfloat16)
    spec = AttentionSpec("xla", window_size=3)
    stacks = _name_stacks(jax.make_jaxpr(lambda q, k: attention(q, k, k, backend=spec))(q, k).jaxpr, set())
    assert {p for s in stacks for p in AttentionShape.parse(s)} == {
        ("xla", AttentionShape(64, "bfloat16", 1, 130, 40, 2))  # cross-attention: no window
    }


def dit_calls(dtype) -> set[AttentionShape]:
    cfg = transformer_preset("1.3B")
    params = abstract_params(dit.checkpoint_spec(cfg), dtype)
    latents = jax.ShapeDtypeStruct((2, 16, 3, 16, 16), jnp.float32)
    timestep = jax.ShapeDtypeStruct((2,), jnp.float32)
    text = jax.ShapeDtypeStruct((2, 512, cfg.text_dim), jnp.float32)
    inputs = dit.DitInputs(latents, timestep, text)
    return attention_calls(lambda p, i: dit.forward(p, cfg, i, settings=RunSettings(dtype)), params, inputs)


def test_dit_calls_run_on_cudnn_on_a_gpu_in_bfloat16():
    calls = dit_calls(jnp.bfloat16)
    # self-attention over the 3x8x8 token grid and cross-attention to the 512 text tokens
    assert {(c.q_len, c.k_len) for c in calls} == {(192, 192), (192, 512)}
    assert {(c.heads, c.head_dim, c.dtype) for c in calls} == {(12, 128, "bfloat16")}
    for platform, expected in ((H100, "cudnn"), (A100, "cudnn"), (TPU, "splash"), (CPU, "xla")):
        assert {resolve_backend("auto", c, platform=platform) for c in calls} == {expected}


def test_dit_calls_in_float32_run_on_xla_on_a_gpu():
    calls = dit_calls(jnp.float32)
    assert {c.dtype for c in calls} == {"float32"}
    assert {resolve_backend("auto", c, platform=H100) for c in calls} == {"xla"}


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("method", ["decode", "encode"])
def test_vae_attention_runs_on_a_capable_backend(method, dtype):
    """The Wan 2.1 VAE's mid blocks: one 384-dim head, beyond cuDNN's 256 (the H100 crash)."""
    cfg = VAEConfig()
    nm = Numerics(jnp.dtype(dtype))
    if method == "decode":
        params = abstract_params(vae_checkpoint_spec(cfg, "decoder"), dtype)
        x = jax.ShapeDtypeStruct((1, cfg.z_dim, 2, 8, 8), dtype)
        fn = lambda p, z: functional.decode(p, cfg, z, nm=nm, chunk=1, frames=1)  # noqa: E731
    else:
        params = abstract_params(vae_checkpoint_spec(cfg, "encoder"), dtype)
        x = jax.ShapeDtypeStruct((1, 3, 5, 64, 64), dtype)
        fn = lambda p, v: functional.encode(p, cfg, v, nm=nm, chunk=1, frames=1)  # noqa: E731
    calls = attention_calls(fn, params, x)
    assert {(c.heads, c.head_dim, c.dtype, c.q_len) for c in calls} == {(1, 384, jnp.dtype(dtype).name, 64)}
    for platform in PLATFORMS.values():
        for call in calls:
            chosen = resolve_backend("auto", call, platform=platform)
            assert backend_limit(chosen, platform, call) is None
    assert {resolve_backend("auto", c, platform=H100) for c in calls} == {"xla"}
    assert {resolve_backend("auto", c, platform=TPU) for c in calls} == {"xla"}
    with pytest.raises(ConfigError, match=r"^--attention cudnn: "):
        check_backend("cudnn", calls, platform=H100)


def test_umt5_makes_no_attention_call():
    """UMT5 runs its own attention (relative position bias and a key mask, which ``attention()`` does
    not take) as plain XLA matmuls, whatever the platform."""
    cfg = UMT5_XXL
    params = abstract_params(umt5.checkpoint_spec(cfg), jnp.bfloat16)
    ids = jax.ShapeDtypeStruct((2, 16), jnp.int32)
    assert attention_calls(lambda p, i, m: umt5.forward(p, cfg, i, m), params, ids, ids) == set()


@pytest.mark.parametrize(
    "sizes,mode,local",
    [
        # Ulysses: whole sequences, heads split over sp and tp (12 / 2 / 2)
        ({"dp": 2, "sp": 2, "tp": 2}, "ulysses", (4096, 4096, 3)),
        # all-gather KV: 6 heads per tp shard do not split over sp=4, queries stay split
        ({"dp": 1, "sp": 4, "tp": 2}, "allgather", (1024, 4096, 6)),
    ],
)
def test_sharded_attention_resolves_per_local_shape(sizes, mode, local):
    mesh = AbstractMesh(tuple(sizes.values()), tuple(sizes))
    layout = token_layout(sizes, 2, 4096, 12)
    assert sequence_mode(layout, sizes, 12) == mode
    q = jax.ShapeDtypeStruct((2, 4096, 12, 128), jnp.bfloat16)
    text = jax.ShapeDtypeStruct((2, 512, 12, 128), jnp.bfloat16)

    def calls(k, self_attention):
        return attention_calls(
            lambda q, k: sharded_attention(q, k, k, mesh=mesh, layout=layout, self_attention=self_attention),
            q,
            k,
        )

    (self_call,) = calls(q, True)
    (cross_call,) = calls(text, False)
    assert (self_call.q_len, self_call.k_len, self_call.heads) == local
    assert (cross_call.q_len, cross_call.k_len) == (4096 // sizes["sp"], 512)
    for call in (self_call, cross_call):
        assert resolve_backend("auto", call, platform=H100) == "cudnn"
