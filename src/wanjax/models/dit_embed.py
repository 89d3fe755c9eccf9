"""The Wan DiT's input side: latents to patch tokens, the condition embedder (timestep, text and an
image-to-video model's image tokens) and the :class:`Conditioning` every block reads; the tokens'
pinning to their layout under a mesh. Norms in float32, rounded to the activation dtype; float32
matmuls at the settings' precision (:class:`~wanjax.models.settings.RunSettings`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
from jax.sharding import Mesh

from wanjax.errors import ConfigError
from wanjax.models.config import TransformerConfig
from wanjax.models.layers import (
    Params,
    gelu,
    gelu_tanh,
    layer_norm,
    linear,
    rope_tables,
    silu,
    timestep_embedding,
)
from wanjax.models.settings import DEFAULT_SETTINGS, RunSettings
from wanjax.parallel.layouts import TokenLayout, constrain, token_layout

__all__ = [
    "IMAGE_NORM_EPS",
    "Conditioning",
    "embed",
    "embed_context",
    "embed_image",
    "embed_time",
    "patchify",
    "token_pins",
    "unpatchify",
]


def patchify(latents: jax.Array, patch: tuple[int, int, int]) -> jax.Array:
    """``(B, C, T, H, W)`` -> ``(B, L, C*pt*ph*pw)`` with patch vectors ordered (c, t, h, w)."""
    b, c, t, h, w = latents.shape
    pt, ph, pw = patch
    x = latents.reshape(b, c, t // pt, pt, h // ph, ph, w // pw, pw)
    x = x.transpose(0, 2, 4, 6, 1, 3, 5, 7)
    return x.reshape(b, (t // pt) * (h // ph) * (w // pw), c * pt * ph * pw)


def unpatchify(tokens: jax.Array, grid: tuple[int, int, int], patch: tuple[int, int, int]) -> jax.Array:
    """``(B, L, pt*ph*pw*C)`` (channel fastest) -> ``(B, C, T, H, W)``."""
    b = tokens.shape[0]
    (f, h, w), (pt, ph, pw) = grid, patch
    x = tokens.reshape(b, f, h, w, pt, ph, pw, -1)
    x = x.transpose(0, 7, 1, 4, 2, 5, 3, 6)
    return x.reshape(b, -1, f * pt, h * ph, w * pw)


@dataclasses.dataclass(frozen=True)
class Conditioning:
    """What every block reads besides the tokens (one batch of rows): the projected text
    ``context (B, Lc, D)``, the blocks' timestep modulation ``time_mod (B, 6, D)``, the time embedding
    ``temb (B, D)`` the output norm is modulated by (with a timestep per latent frame: ``(B, F, 6, D)``
    and ``(B, F, D)``), the token grid's RoPE tables and (image-to-video)
    the embedded image tokens; a VACE model's control hints, an Animate model's face tokens
    (:func:`wanjax.models.dit_control.embed_control`)."""

    context: jax.Array
    time_mod: jax.Array
    temb: jax.Array
    rope: tuple[jax.Array, jax.Array]
    grid: tuple[int, int, int]
    image_context: jax.Array | None = None  # image-to-video: the embedded image tokens (B, Li, D)
    hints: jax.Array | None = None  # VACE: the control blocks' outputs (n, B, L, D), one per vace layer
    hint_scale: jax.Array | None = None  # VACE: each hint's scale (n,), float32
    # the text K/V cache: every block's cross-attention keys and values, computed before the loop
    # (wanjax.models.dit.context_kv); the blocks then read these instead of projecting the context
    context_kv: dict[str, dict[str, jax.Array]] | None = None
    # Animate: the face adapters' tokens (B, T, heads + 1, D) (wanjax.models.animate)
    face: jax.Array | None = None


def token_pins(
    mesh: Mesh | None, batch: int, length: int, heads: int
) -> tuple[TokenLayout | None, Callable[..., jax.Array]]:
    """The tokens' layout under ``mesh`` (None without one) and ``pin(h, spec_name="tokens")``, which
    pins an activation to the layout's spec of that name (nothing without a mesh)."""
    if mesh is None:
        return None, lambda h, spec_name="tokens": h
    layout = token_layout(dict(mesh.shape), batch, length, heads)

    def pin(h: jax.Array, spec_name: str = "tokens") -> jax.Array:
        return constrain(h, mesh, getattr(layout, spec_name)())

    return layout, pin


def embed(
    params: Params,
    cfg: TransformerConfig,
    latents: jax.Array,
    timestep: jax.Array,
    prompt_embeds: jax.Array,
    *,
    settings: RunSettings = DEFAULT_SETTINGS,
    image_embeds: jax.Array | None = None,
) -> tuple[jax.Array, Conditioning]:
    """The patch-embedded tokens ``(B, L, D)`` entering the first block, and the blocks' conditioning
    (``image_embeds``: an image-to-video model's image encoder states, see :func:`embed_image`)."""
    b, _, t, h, w = latents.shape
    pt, ph, pw = cfg.patch_size
    grid = (t // pt, h // ph, w // pw)
    dtype = settings.dtype
    _, pin = token_pins(settings.mesh, b, math.prod(grid), cfg.num_attention_heads)

    def lin(x: jax.Array, p: Params) -> jax.Array:
        return linear(x, p, precision=settings.precision)

    x = pin(lin(patchify(latents.astype(dtype), cfg.patch_size), params["patch_embedding"]))

    # Condition embedding: the time embedder runs in its own (float32) dtype, then is cast like the text.
    # A timestep per latent frame (B, F) (expand_timesteps) gives each frame's tokens their modulation.
    if timestep.ndim == 2 and timestep.shape[1] != grid[0]:
        raise ConfigError(
            f"timestep {timestep.shape}: one per sample (B,) or per latent frame (B, {grid[0]})"
        )
    temb, time_mod = embed_time(params, cfg, timestep, settings)
    context, image_context = embed_context(params, cfg, prompt_embeds, settings, image_embeds)
    rope = rope_tables(grid, cfg.attention_head_dim, cfg.rope_max_seq_len)
    return x, Conditioning(context, time_mod, temb, rope, grid, image_context)


def embed_context(
    params: Params,
    cfg: TransformerConfig,
    prompt_embeds: jax.Array,
    settings: RunSettings = DEFAULT_SETTINGS,
    image_embeds: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array | None]:
    """The text embedder's ``context (B, Lc, D)`` and an image-to-video model's embedded image tokens
    (:func:`embed_image`; None for another model), under the settings' mesh laid out as the blocks
    read them (the rows split as the tokens', the rest whole)."""

    def lin(x: jax.Array, p: Params) -> jax.Array:
        return linear(x, p, precision=settings.precision)

    _, pin = token_pins(settings.mesh, prompt_embeds.shape[0], 1, cfg.num_attention_heads)
    tx = params["text_embedder"]
    context = lin(gelu_tanh(lin(prompt_embeds.astype(settings.dtype), tx["linear_1"])), tx["linear_2"])
    if not cfg.image_tokens:
        return pin(context, "context"), None
    if image_embeds is None:
        raise ConfigError("an image-to-video transformer needs image_embeds (the image encoder's states)")
    image_context = embed_image(params["image_embedder"], cfg, image_embeds, settings)
    return pin(context, "context"), pin(image_context, "context")


def embed_time(
    params: Params, cfg: TransformerConfig, timestep: jax.Array, settings: RunSettings = DEFAULT_SETTINGS
) -> tuple[jax.Array, jax.Array]:
    """diffusers' time embedding ``temb (*T, D)`` and the blocks' modulation ``time_mod (*T, 6, D)`` of
    ``timestep (*T)`` (the original Wan code's ``e`` and ``e0``): the embedder runs in float32, its
    output is rounded to the activation dtype."""

    def lin(x: jax.Array, p: Params) -> jax.Array:
        return linear(x, p, precision=settings.precision)

    t_emb = timestep_embedding(timestep.reshape(-1), cfg.freq_dim)
    te = params["time_embedder"]
    temb = lin(silu(lin(t_emb, te["linear_1"])), te["linear_2"]).astype(settings.dtype)
    time_mod = lin(silu(temb), params["time_proj"]).reshape(*timestep.shape, 6, cfg.inner_dim)
    return temb.reshape(*timestep.shape, cfg.inner_dim), time_mod


IMAGE_NORM_EPS = 1e-5  # WanImageEmbedding's FP32LayerNorm: torch's default eps


def embed_image(
    p: Params, cfg: TransformerConfig, image_embeds: jax.Array, settings: RunSettings
) -> jax.Array:
    """diffusers' ``WanImageEmbedding``: the image encoder's ``(B, Li, image_dim)`` states -> ``(B, Li, D)``
    (first-last-frame models: both images' tokens ``(2B, Li, image_dim)`` side by side as ``(B, 2Li, ...)``
    plus the position table). Norms in float32, rounded to the settings' dtype; exact GELU."""
    dtype, precision = settings.dtype, settings.precision
    x = image_embeds.astype(dtype)
    if "pos_embed" in p:
        x = x.reshape(-1, cfg.pos_embed_seq_len, x.shape[-1]) + p["pos_embed"].astype(dtype)
    x = layer_norm(x, IMAGE_NORM_EPS, p["norm1"]["scale"], p["norm1"]["bias"]).astype(dtype)
    x = linear(gelu(linear(x, p["proj_in"], precision=precision)), p["proj_out"], precision=precision)
    return layer_norm(x, IMAGE_NORM_EPS, p["norm2"]["scale"], p["norm2"]["bias"]).astype(dtype)
