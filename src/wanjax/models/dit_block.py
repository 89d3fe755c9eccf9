"""One Wan DiT block (diffusers' ``WanTransformerBlock``) as a pure function, and the attention it
calls: self-attention with RoPE, cross-attention to the text (and an image-to-video model's image
tokens), the feed-forward, each modulated by the timestep (per sample, or per latent frame). Shared
by the DiT's blocks (:mod:`wanjax.models.dit`) and a VACE model's control blocks
(:mod:`wanjax.models.dit_control`)."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from wanjax.kernels.precision import Precision
from wanjax.models.config import TransformerConfig
from wanjax.models.dit_attention import Attend
from wanjax.models.dit_context import ContextKV, cross_kv, project_heads
from wanjax.models.layers import Params, apply_rope, gelu_tanh, layer_norm, linear

__all__ = ["attention_block", "block", "frame_views", "modulate"]


def modulate(x: jax.Array, shift: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """``LayerNorm(x) * (1 + scale) + shift`` in float32, rounded to x's dtype."""
    return (layer_norm(x, eps) * (1.0 + scale) + shift).astype(x.dtype)


def attention_block(
    p: Params,
    x: jax.Array,
    context: jax.Array,
    heads: int,
    eps: float,
    rope: tuple[jax.Array, jax.Array] | None,
    attend: Attend,
    precision: Precision,
    image_context: jax.Array | None = None,
    kv: ContextKV | None = None,
) -> jax.Array:
    """Self-attention (with ``rope``) or cross-attention to ``context`` (its keys and values ``kv`` when
    computed before); an image-to-video model's cross-attention also attends to ``image_context`` with
    its own keys and values (``add_k_proj``, ``add_v_proj``, ``norm_added_k``) and adds the two
    results, as diffusers' ``WanAttnProcessor``."""
    b, length, d = x.shape
    q = project_heads(p, "to_q", x, heads, eps, precision)
    if rope is not None:
        k, v = (
            project_heads(p, "to_k", x, heads, eps, precision),
            project_heads(p, "to_v", x, heads, eps, precision),
        )
        out = attend(apply_rope(q, *rope), apply_rope(k, *rope), v, self_attention=True)
    else:
        kv = cross_kv(p, context, image_context, heads, eps, precision) if kv is None else kv
        out = attend(q, kv["k"], kv["v"], self_attention=False)
        if "k_img" in kv:
            out = out + attend(q, kv["k_img"], kv["v_img"], self_attention=False)
    return linear(out.reshape(b, length, d), p["to_out"], precision=precision)


def block(
    p: Params,
    x: jax.Array,
    context: jax.Array,
    time_mod: jax.Array,
    rope: tuple[jax.Array, jax.Array],
    cfg: TransformerConfig,
    attend: Attend,
    precision: Precision,
    image_context: jax.Array | None = None,
    kv: ContextKV | None = None,
) -> jax.Array:
    # (B, 6, D), or per latent frame (B, F, 6, D): each (B, F, 1, D), applied to the tokens as frames
    mod = p["scale_shift_table"].astype(jnp.float32) + time_mod.astype(jnp.float32)
    mod = mod if mod.ndim == 4 else mod[:, None]
    shift, scale, gate, c_shift, c_scale, c_gate = (mod[:, :, i : i + 1] for i in range(6))
    heads, eps, dtype = cfg.num_attention_heads, cfg.eps, x.dtype
    frames, tokens = frame_views(x.shape, mod.shape[1])

    n = tokens(modulate(frames(x), shift, scale, eps))
    a = attention_block(p["attn1"], n, n, heads, eps, rope, attend, precision)
    x = tokens((frames(x).astype(jnp.float32) + frames(a) * gate).astype(dtype))

    n = layer_norm(x, eps, p["norm2"]["scale"], p["norm2"]["bias"]).astype(dtype) if "norm2" in p else x
    x = x + attention_block(p["attn2"], n, context, heads, eps, None, attend, precision, image_context, kv)

    n = tokens(modulate(frames(x), c_shift, c_scale, eps))
    f = linear(
        gelu_tanh(linear(n, p["ffn"]["proj_in"], precision=precision)),
        p["ffn"]["proj_out"],
        precision=precision,
    )
    return tokens((frames(x).astype(jnp.float32) + frames(f).astype(jnp.float32) * c_gate).astype(dtype))


def frame_views(
    shape: tuple[int, ...], frames: int
) -> tuple[Callable[[jax.Array], jax.Array], Callable[[jax.Array], jax.Array]]:
    """``(to_frames, to_tokens)``: tokens ``(B, L, D)`` viewed as ``(B, F, L / F, D)`` (frame-major
    token order), so a per-frame modulation ``(B, F, 1, D)`` broadcasts over each frame's tokens;
    ``F = 1`` is the per-sample modulation."""
    b, length, d = shape
    return (lambda h: h.reshape(b, frames, length // frames, d)), (lambda h: h.reshape(b, length, d))
