"""Analytic FLOP counts against the matrix products the traced programs actually contain."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import pytest
from jax.extend import core as jex_core

from wanjax.io.checkpoint import abstract_params
from wanjax.models import dit, umt5, vae
from wanjax.models.config import ANIMATE_FIELDS, TransformerConfig
from wanjax.models.settings import RunSettings
from wanjax.models.vae.config import VAEConfig
from wanjax.models.vae.ops import Numerics
from wanjax.tools.flops import (
    Flops,
    achieved,
    clip_vision_flops,
    context_kv_flops,
    dit_forward_flops,
    dit_step_flops,
    umt5_flops,
    vae_decode_flops,
)


def _sub_jaxprs(params: dict) -> list[jex_core.Jaxpr]:
    found = []
    for value in params.values():
        for v in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(v, jex_core.ClosedJaxpr):
                found.append(v.jaxpr)
            elif isinstance(v, jex_core.Jaxpr):
                found.append(v)
    return found


def traced_matmul_flops(jaxpr: jex_core.Jaxpr) -> int:
    """2 x multiply-adds of every dot_general and conv_general_dilated in ``jaxpr`` (a convolution:
    ``2 x out_elements x kernel_volume x in_channels / groups``), loops multiplied by their trip
    counts."""
    total = 0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            (lhs_contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            contract = math.prod(lhs[i] for i in lhs_contract)
            total += 2 * math.prod(eqn.outvars[0].aval.shape) * contract
            continue
        if name == "conv_general_dilated":
            assert eqn.params["batch_group_count"] == 1
            rhs = eqn.invars[1].aval.shape  # the kernel's in-feature dim is already in_channels / groups
            out_feature_dim = eqn.params["dimension_numbers"].rhs_spec[0]
            per_output = math.prod(rhs) // rhs[out_feature_dim]  # kernel_volume x in_channels / groups
            total += 2 * math.prod(eqn.outvars[0].aval.shape) * per_output
            continue
        if name == "while":
            raise AssertionError("a while loop: trip count unknown to this counter")
        inner = sum(traced_matmul_flops(j) for j in _sub_jaxprs(eqn.params))
        total += inner * (eqn.params["length"] if name == "scan" else 1)
    return total


DIT = TransformerConfig(
    num_attention_heads=3,
    attention_head_dim=16,
    in_channels=4,
    out_channels=4,
    text_dim=24,
    freq_dim=32,
    ffn_dim=80,
    num_layers=3,
)
XLA_ATTENTION = RunSettings(attention="xla")


def _forward_jaxpr(cfg, params, inputs):
    """The jaxpr of the DiT's forward (attention ``xla``) for these abstract inputs."""
    return jax.make_jaxpr(lambda p, i: dit.forward(p, cfg, i, settings=XLA_ATTENTION))(params, inputs).jaxpr


@pytest.mark.parametrize("latent_shape", [(1, 4, 1, 4, 6), (2, 4, 3, 6, 4)])
def test_dit_forward_count_equals_traced_matmuls(latent_shape):
    params = abstract_params(dit.checkpoint_spec(DIT), jnp.float32)
    text_len = 7

    inputs = dit.DitInputs(
        jax.ShapeDtypeStruct(latent_shape, jnp.float32),
        jax.ShapeDtypeStruct(latent_shape[:1], jnp.float32),
        jax.ShapeDtypeStruct((latent_shape[0], text_len, DIT.text_dim), jnp.float32),
    )
    traced = traced_matmul_flops(_forward_jaxpr(DIT, params, inputs))
    assert dit_forward_flops(DIT, latent_shape, text_len).total == traced


@pytest.mark.parametrize("images", [1, 2])  # image to video, and first-last frame (two images' tokens)
def test_image_to_video_dit_count_equals_traced_matmuls(images):
    tokens = 5
    cfg = dataclasses.replace(
        DIT,
        in_channels=12,
        image_dim=20,
        added_kv_proj_dim=DIT.inner_dim,
        pos_embed_seq_len=2 * tokens if images == 2 else None,
    )
    params = abstract_params(dit.checkpoint_spec(cfg), jnp.float32)
    latent_shape, text_len = (2, 12, 2, 4, 6), 7

    inputs = dit.DitInputs(
        jax.ShapeDtypeStruct(latent_shape, jnp.float32),
        jax.ShapeDtypeStruct(latent_shape[:1], jnp.float32),
        jax.ShapeDtypeStruct((2, text_len, cfg.text_dim), jnp.float32),
        jax.ShapeDtypeStruct((2 * images, tokens, cfg.image_dim), jnp.float32),
    )
    traced = traced_matmul_flops(_forward_jaxpr(cfg, params, inputs))
    assert dit_forward_flops(cfg, latent_shape, text_len, image_len=images * tokens).total == traced


def test_vace_dit_count_equals_traced_matmuls():
    """The control blocks' count too: patch embedding, input projection, blocks and their projections."""
    cfg = dataclasses.replace(DIT, vace_layers=(0, 2), vace_in_channels=10)
    params = abstract_params(dit.checkpoint_spec(cfg), jnp.float32)
    latent_shape, text_len = (2, 4, 2, 4, 6), 7

    inputs = dit.DitInputs(
        jax.ShapeDtypeStruct(latent_shape, jnp.float32),
        jax.ShapeDtypeStruct(latent_shape[:1], jnp.float32),
        jax.ShapeDtypeStruct((2, text_len, cfg.text_dim), jnp.float32),
        control=dit.VaceControl(jax.ShapeDtypeStruct((2, 10, *latent_shape[2:]), jnp.float32)),
    )
    traced = traced_matmul_flops(_forward_jaxpr(cfg, params, inputs))
    assert (
        dit_forward_flops(cfg, latent_shape, text_len).total
        == traced
        > dit_forward_flops(DIT, latent_shape, text_len).total
    )


def test_animate_dit_count_equals_traced_matmuls():
    """An Animate model's own work too: pose patch embedding, motion encoder (convolutions, blurs,
    linears) on every face frame, face encoder, face adapters (one after every block here: the
    traced count holds the adapter of each layer's ``lax.cond``)."""
    cfg = dataclasses.replace(
        DIT, in_channels=12, out_channels=4, image_dim=20, added_kv_proj_dim=DIT.inner_dim, latent_channels=4,
        motion_encoder_channel_sizes=(("16", 8), ("8", 12), ("4", 16)), motion_encoder_size=16,
        motion_style_dim=16, motion_dim=6, motion_encoder_dim=16, face_encoder_hidden_dim=8,
        face_encoder_num_heads=2, inject_face_latents_blocks=1, motion_encoder_batch_size=3,
    )  # fmt: skip
    params = abstract_params(dit.checkpoint_spec(cfg), jnp.float32)
    latent_shape, text_len, tokens = (2, 12, 3, 4, 6), 7, 5

    inputs = dit.DitInputs(
        jax.ShapeDtypeStruct(latent_shape, jnp.float32),
        jax.ShapeDtypeStruct(latent_shape[:1], jnp.float32),
        jax.ShapeDtypeStruct((2, text_len, cfg.text_dim), jnp.float32),
        jax.ShapeDtypeStruct((2, tokens, cfg.image_dim), jnp.float32),
        dit.AnimateControl(
            jax.ShapeDtypeStruct((2, 4, 2, 4, 6), jnp.float32),
            jax.ShapeDtypeStruct((2, 3, 5, 16, 16), jnp.float32),
        ),
    )
    traced = traced_matmul_flops(_forward_jaxpr(cfg, params, inputs))
    plain = dataclasses.replace(cfg, **{k: None for k in ANIMATE_FIELDS})
    assert (
        dit_forward_flops(cfg, latent_shape, text_len, image_len=tokens).total
        == traced
        > dit_forward_flops(plain, latent_shape, text_len, image_len=tokens).total
    )


@pytest.mark.parametrize("kind", ["t2v", "i2v", "vace"])
def test_text_kv_cache_count_equals_traced_matmuls(kind):
    """The text K/V cache's program: the text (and image) embedder and every block's (and control
    block's) keys and values of the context."""
    cfg = {
        "t2v": DIT,
        "i2v": dataclasses.replace(DIT, in_channels=12, image_dim=20, added_kv_proj_dim=DIT.inner_dim),
        "vace": dataclasses.replace(DIT, vace_layers=(0, 2), vace_in_channels=10),
    }[kind]
    params = abstract_params(dit.checkpoint_spec(cfg), jnp.float32)
    rows, text_len, image_len = 4, 7, 5 if kind == "i2v" else 0
    text = jax.ShapeDtypeStruct((rows, text_len, cfg.text_dim), jnp.float32)
    image = jax.ShapeDtypeStruct((rows, image_len, cfg.image_dim), jnp.float32) if image_len else None

    def fn(p, c, i):
        return dit.context_kv(p, cfg, c, settings=XLA_ATTENTION, image_embeds=i)

    traced = traced_matmul_flops(jax.make_jaxpr(fn)(params, text, image).jaxpr)
    assert context_kv_flops(cfg, rows, text_len, image_len).total == traced > 0


def test_a_skipped_steps_count_is_the_step_without_its_blocks():
    """A step cache's skipped step runs the embeddings, the projection and a VACE model's control
    blocks (the model with no blocks); First-Block Cache one block more; TaylorSeer nothing."""
    shape = (1, 4, 2, 4, 6)
    for cfg in (DIT, dataclasses.replace(DIT, vace_layers=(0, 2), vace_in_channels=10)):
        for cached in (False, True):
            skip = dit_step_flops(cfg, shape, 7, context_cached=cached, skipped_by="magcache")
            bare = dataclasses.replace(cfg, num_layers=0)
            assert skip == dit_step_flops(bare, shape, 7, context_cached=cached)
            one = dataclasses.replace(cfg, num_layers=1)
            first = dit_step_flops(cfg, shape, 7, context_cached=cached, skipped_by="firstblock")
            assert first == dit_step_flops(one, shape, 7, context_cached=cached)
    assert dit_step_flops(DIT, shape, 7, skipped_by="taylorseer").total == 0


def test_clip_vision_count_equals_traced_matmuls():
    from wanjax.models import clip_vision

    cfg = clip_vision.CLIPVisionConfig(
        hidden_size=24,
        intermediate_size=40,
        num_hidden_layers=3,
        num_attention_heads=4,
        image_size=28,
        patch_size=14,
    )
    params = abstract_params(clip_vision.checkpoint_spec(cfg), jnp.float32)
    pixels = jax.ShapeDtypeStruct((2, 3, 28, 28), jnp.float32)
    fn = lambda p, x: clip_vision.penultimate_hidden_states(p, cfg, x, precision="highest")  # noqa: E731
    traced = traced_matmul_flops(jax.make_jaxpr(fn)(params, pixels).jaxpr)
    assert clip_vision_flops(cfg, 2).total == traced


def test_umt5_count_equals_traced_matmuls():
    cfg = umt5.UMT5Config(vocab_size=50, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4)
    params = abstract_params(umt5.checkpoint_spec(cfg), jnp.float32)
    ids = jax.ShapeDtypeStruct((2, 9), jnp.int32)
    traced = traced_matmul_flops(
        jax.make_jaxpr(lambda p, i, m: umt5.forward(p, cfg, i, m))(params, ids, ids).jaxpr
    )
    assert umt5_flops(cfg, 2, 9).total == traced


# The tiny VAE of test_pipeline_parity (channels change in up block 1: a conv_shortcut), and one
# with two residual blocks per level, a 2-D upsampler first and a 3-D one last.
VAES = [
    VAEConfig(base_dim=8, dim_mult=(1, 2, 2, 2), num_res_blocks=1, temperal_downsample=(False, True, True)),
    VAEConfig(base_dim=4, dim_mult=(1, 2, 4), num_res_blocks=2, temperal_downsample=(True, False),
              scale_factor_temporal=2, scale_factor_spatial=4),
    # a Wan 2.2 VAE: residual up blocks (parameter-free shortcuts), 2x2 patches
    VAEConfig(base_dim=8, decoder_base_dim=12, z_dim=12, dim_mult=(1, 2, 4, 4), num_res_blocks=1,
              temperal_downsample=(False, True, True), latents_mean=(0.0,) * 12, latents_std=(1.0,) * 12,
              is_residual=True, patch_size=2, in_channels=12, out_channels=12, scale_factor_spatial=16),
]  # fmt: skip


def traced_vae_decode_flops(cfg: VAEConfig, latent_shape, nm: Numerics, chunk, frames) -> int:
    params = abstract_params(vae.checkpoint_spec(cfg, "decoder"), jnp.float32)

    def fn(p, z):
        return vae.decode(p, cfg, z, nm=nm, chunk=chunk, frames=frames)

    jaxpr = jax.make_jaxpr(fn)(params, jax.ShapeDtypeStruct(latent_shape, jnp.float32))
    assert jaxpr.out_avals[0].shape[2] == cfg.num_frames(latent_shape[2])
    return traced_matmul_flops(jaxpr.jaxpr)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("cfg", "latent_shape", "chunk", "frames"),
    [
        (VAES[0], (1, 16, 1, 2, 3), 1, 1),  # the first chunk alone: one frame out
        (VAES[0], (2, 16, 3, 2, 4), 1, 1),  # wanjax's default chunking
        (VAES[0], (1, 16, 3, 3, 2), None, 4),  # all later latent frames in one chunk
        (VAES[1], (1, 16, 4, 3, 3), 1, 2),
        (VAES[2], (1, 12, 3, 2, 3), 1, 1),
    ],
)
def test_vae_decode_count_equals_traced_convs(cfg, latent_shape, chunk, frames):
    """The reference formulation (3-D convs, upsample then conv) has exactly the analytic count;
    wanjax's CPU formulation (taps skipping the first frame's zero padding except where owed sums
    are cached, sub-pixel upsampling) the count for those numerics."""
    reference = Numerics(jnp.float32, "conv3d", "repeat")
    traced = traced_vae_decode_flops(cfg, latent_shape, reference, chunk, frames)
    assert vae_decode_flops(cfg, latent_shape).total == traced
    cpu = Numerics(jnp.float32, "taps", "subpixel")
    sharded = dataclasses.replace(cpu, owed_cache=False)
    for numerics in (cpu, sharded, dataclasses.replace(cpu, lowres_cache=False)):
        traced = traced_vae_decode_flops(cfg, latent_shape, numerics, chunk, frames)
        executed = vae_decode_flops(cfg, latent_shape, numerics, frames)
        assert executed.total == traced
        assert executed.attention == vae_decode_flops(cfg, latent_shape).attention > 0
    count = lambda **kw: vae_decode_flops(cfg, latent_shape, dataclasses.replace(cpu, **kw), frames).total  # noqa: E731
    assert count(lowres_cache=False) > count(lowres_cache=False, owed_cache=False)  # owed sums: all taps
    # later frames upsample the cached low-resolution frames again (never in Wan 2.2's residual blocks)
    if frames == 1 and latent_shape[2] > 1 and not cfg.is_residual:
        assert count() > count(lowres_cache=False)


def test_wan_vae_decode_by_hand():
    """The real Wan 2.1 VAE at 240x416x17: the conv_in and conv_out terms, frame counts and scale."""
    cfg = VAEConfig()
    full = vae_decode_flops(cfg, (1, 16, 5, 30, 52))
    one = vae_decode_flops(cfg, (1, 16, 1, 30, 52))
    two = vae_decode_flops(cfg, (1, 16, 2, 30, 52))
    # every latent frame after the first costs the same (4 frames); the first ~1/3 of that
    assert full.total == one.total + 4 * (two.total - one.total)
    assert 0.25 < one.total / (two.total - one.total) < 0.35
    # attention: 1 head of 384 channels over the 30x52 pixels of each of the 5 latent frames
    assert full.attention == 5 * 4 * (30 * 52) ** 2 * 384
    no_out = vae_decode_flops(dataclasses.replace(cfg, out_channels=0), (1, 16, 5, 30, 52))
    assert full.linear - no_out.linear == 2 * 17 * 240 * 416 * 27 * 96 * 3  # conv_out: 96 -> 3, 17 frames
    assert 14e12 < full.total < 15e12  # 14.6 TFLOP
    executed = vae_decode_flops(cfg, (1, 16, 5, 30, 52), Numerics(jnp.float32, "taps", "subpixel"))
    assert executed.total < full.total


def test_wan_1_3b_step_by_hand():
    """1.3B at 480x832x81 with CFG: 21x30x52 = 32,760 tokens; attention dominates."""
    cfg = TransformerConfig(num_attention_heads=12, ffn_dim=8960, num_layers=30)
    step = dit_step_flops(cfg, (1, 16, 21, 60, 104))
    tokens, d, batch = 32_760, 1536, 2
    self_attn = 4 * batch * tokens * tokens * d  # QK^T and PV, 2 FLOPs per multiply-add
    cross_attn = 4 * batch * tokens * 512 * d
    assert step.attention == 30 * (self_attn + cross_attn)  # 0.40 PFLOP
    assert step.attention > 2 * step.linear
    assert dit_step_flops(cfg, (1, 16, 21, 60, 104), guidance=False).total * 2 == step.total


def test_flops_arithmetic():
    f = Flops(3, 4) + 2 * Flops(1, 1)
    assert (f.linear, f.attention, f.total) == (5, 6, 11)
    assert achieved(f, 0.5) == 22 and math.isnan(achieved(f, 0))
