"""What a DiT reads besides the latents, text and image, and what it adds around the blocks: a VACE
model's control (control blocks whose hints follow the vace layers, as diffusers'
``WanVACETransformer3DModel``) and an Animate model's motion (pose tokens added to the latents', face
adapters after every ``inject_face_latents_blocks``-th block, as ``WanAnimateTransformer3DModel``;
:mod:`wanjax.models.animate`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from wanjax.errors import ConfigError
from wanjax.models import animate
from wanjax.models.animate import AnimateControl
from wanjax.models.config import TransformerConfig
from wanjax.models.dit_attention import attend_fn
from wanjax.models.dit_block import block
from wanjax.models.dit_embed import Conditioning, patchify, token_pins
from wanjax.models.layers import Params, linear
from wanjax.models.settings import DEFAULT_SETTINGS, RunSettings
from wanjax.models.w8a8 import marked_blocks

__all__ = ["AnimateControl", "Control", "VaceControl", "after_blocks", "embed_control"]


class VaceControl(NamedTuple):
    """A VACE model's control: latents ``(B, vace_in_channels, T, H, W)`` and the scale of each vace
    layer's hint ``(n,)`` (None: 1)."""

    latents: jax.Array
    scale: jax.Array | None = None


def embed_vace(
    params: Params,
    cfg: TransformerConfig,
    x: jax.Array,
    cond: Conditioning,
    vace: VaceControl,
    *,
    settings: RunSettings = DEFAULT_SETTINGS,
) -> Conditioning:
    """A VACE model's hints in ``cond``: the control latents patch-embedded (padded with zero tokens
    to ``x``'s length), the first block's input projection plus the tokens ``x`` entering the first
    block, then each control block (a transformer block on the same conditioning) and its output
    projection: one hint per vace layer, with its scale."""
    assert cfg.vace_layers is not None
    control, control_scale = vace
    if control.ndim != 5 or control.shape[1] != cfg.vace_in_channels:
        raise ConfigError(
            f"control latents must be (B, {cfg.vace_in_channels}, T, H, W), got {control.shape}"
        )
    layout, pin = token_pins(settings.mesh, x.shape[0], x.shape[1], cfg.num_attention_heads)
    attend, precision = attend_fn(settings, layout), settings.precision
    c = linear(
        patchify(control.astype(settings.dtype), cfg.patch_size),
        params["vace_patch_embedding"],
        precision=precision,
    )
    if c.shape[1] > x.shape[1]:
        raise ConfigError(f"control latents of {c.shape[1]} tokens for latents of {x.shape[1]}")
    c = jnp.pad(c, ((0, 0), (0, x.shape[1] - c.shape[1]), (0, 0)))
    c = pin(linear(c, params["vace_proj_in"], precision=precision) + x)

    def control_block(c: jax.Array, item: Params) -> tuple[jax.Array, jax.Array]:
        p = item["block"]
        args = (cond.context, cond.time_mod, cond.rope, cfg, attend, precision, cond.image_context)
        c = pin(block(p, c, *args, item.get("kv")))
        return c, pin(linear(c, p["proj_out"], precision=precision))

    items = {"block": marked_blocks(params["vace_blocks"], settings.int8_matmuls)}
    if cond.context_kv is not None:
        items["kv"] = cond.context_kv["vace_blocks"]
    _, hints = jax.lax.scan(control_block, c, items)
    n = len(cfg.vace_layers)
    scale = jnp.ones((n,), jnp.float32) if control_scale is None else jnp.asarray(control_scale, jnp.float32)
    if scale.shape != (n,):
        raise ConfigError(
            f"the control scale must hold one scale per vace layer ({n}), got shape {scale.shape}"
        )
    return dataclasses.replace(cond, hints=hints, hint_scale=scale)


Control = VaceControl | AnimateControl  # a VACE model's control, or an Animate model's motion


def embed_control(
    params: Params,
    cfg: TransformerConfig,
    x: jax.Array,
    cond: Conditioning,
    control: Control | None,
    latents_shape: tuple[int, ...],
    settings: RunSettings = DEFAULT_SETTINGS,
) -> tuple[jax.Array, Conditioning]:
    """The tokens and conditioning with the model's control: a VACE model's hints
    (:func:`embed_vace`); an Animate model's pose tokens added and its face tokens. ConfigError when
    the control is not the model's kind or does not fit latents of ``latents_shape``."""
    kind = VaceControl if cfg.vace else AnimateControl if cfg.animate else None
    if kind is None and control is not None:
        raise ConfigError("control latents are for a VACE transformer, pose and face for an Animate one")
    if kind is not None and not isinstance(control, kind):
        raise ConfigError(
            "a VACE transformer needs control latents (control=...)"
            if cfg.vace
            else "an Animate transformer needs its pose latents and face pixels (control=AnimateControl(...))"
        )
    if isinstance(control, VaceControl):
        return x, embed_vace(params, cfg, x, cond, control, settings=settings)
    if isinstance(control, AnimateControl):
        animate.check_control(cfg, latents_shape, control)
        x = animate.embed_pose(params, cfg, x, control.pose_latents, settings)
        face = animate.face_conditioning(params, cfg, control.face_pixels, settings)
        return x, dataclasses.replace(cond, face=face)
    return x, cond


After = Callable[[jax.Array, Params], jax.Array]  # (block output, the layer's items) -> next tokens


def after_blocks(
    params: Params, cfg: TransformerConfig, cond: Conditioning, settings: RunSettings
) -> tuple[Params, After]:
    """What follows each block: per-layer items (scanned with the blocks' weights) and the function
    applying them. A VACE model's hint: ``x + scale * hint`` in float32 (0 after a layer without
    one); an Animate model's face adapter after blocks 0, k, 2k, ... (skipped after the others)."""
    items: Params = {}
    if cond.hints is not None:  # per layer: which hint follows it and its scale (0 where none does)
        assert cfg.vace_layers is not None and cond.hint_scale is not None
        index, on = np.zeros(cfg.num_layers, np.int32), np.zeros(cfg.num_layers, np.float32)
        index[list(cfg.vace_layers)], on[list(cfg.vace_layers)] = np.arange(len(cfg.vace_layers)), 1
        scale = jnp.asarray(on) * cond.hint_scale.astype(jnp.float32)[index]
        items["hint"] = {"index": jnp.asarray(index), "scale": scale}
    if cond.face is not None:
        index, on = animate.face_layers(cfg)
        items["face"] = {"index": jnp.asarray(index), "on": jnp.asarray(on)}

    def after(out: jax.Array, item: Params) -> jax.Array:
        if "hint" in item:
            hint = cond.hints[item["hint"]["index"]].astype(jnp.float32) * item["hint"]["scale"]
            out = (out.astype(jnp.float32) + hint).astype(out.dtype)
        if "face" in item:
            adapter = jax.tree.map(lambda a: a[item["face"]["index"]], params["face_adapter"])

            def add_face(h: jax.Array) -> jax.Array:
                return h + animate.face_adapter(adapter, h, cond.face, cfg, settings)

            out = jax.lax.cond(item["face"]["on"], add_face, lambda h: h, out)
        return out

    return items, after
