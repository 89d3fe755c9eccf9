"""The cross-attention's keys and values of the context, and the text K/V cache: every block's of a
run's prompts (and image tokens) computed once, stacked on the layer axis, which the blocks then read
instead of projecting the context at every step (:mod:`wanjax.sampling.context_cache` runs it)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec

from wanjax.kernels.precision import Precision
from wanjax.models.config import TransformerConfig
from wanjax.models.dit_embed import embed_context
from wanjax.models.layers import Params, linear, rms_norm, scan_layers
from wanjax.models.offload import stream_layers, streams_layers
from wanjax.models.settings import DEFAULT_SETTINGS, RunSettings
from wanjax.models.w8a8 import marked_blocks
from wanjax.parallel.layouts import TokenLayout, constrain, token_layout

_NORMS = {"to_q": "norm_q", "to_k": "norm_k", "add_k_proj": "norm_added_k"}
# the cross-attention weights its keys and values are projected with
CONTEXT_KV_WEIGHTS = ("to_k", "to_v", "norm_k", "add_k_proj", "add_v_proj", "norm_added_k")

ContextKV = dict[str, jax.Array]  # "k", "v" (and "k_img", "v_img"): (B, Lc, heads, head_dim) each


def project_heads(
    p: Params, name: str, src: jax.Array, heads: int, eps: float, precision: Precision
) -> jax.Array:
    """``src (B, L, D)`` through the projection ``name`` (and its RMS norm) as ``(B, L, heads, D/heads)``."""
    y = linear(src, p[name], precision=precision)
    if name in _NORMS:
        y = rms_norm(y, p[_NORMS[name]]["scale"], eps)
    return y.reshape(*y.shape[:2], heads, y.shape[-1] // heads)


def cross_kv(
    p: Params,
    context: jax.Array,
    image_context: jax.Array | None,
    heads: int,
    eps: float,
    precision: Precision,
) -> ContextKV:
    """A cross-attention's keys and values of the text (and of an image-to-video model's image tokens)."""
    kv = {
        "k": project_heads(p, "to_k", context, heads, eps, precision),
        "v": project_heads(p, "to_v", context, heads, eps, precision),
    }
    if image_context is not None:
        kv["k_img"] = project_heads(p, "add_k_proj", image_context, heads, eps, precision)
        kv["v_img"] = project_heads(p, "add_v_proj", image_context, heads, eps, precision)
    return kv


def context_kv(
    params: Params,
    cfg: TransformerConfig,
    prompt_embeds: jax.Array,
    *,
    settings: RunSettings = DEFAULT_SETTINGS,
    image_embeds: jax.Array | None = None,
) -> dict[str, ContextKV]:
    """The text K/V cache: every block's (and a VACE model's every control block's) cross-attention
    keys and values of the text (and image) context, stacked on the layer axis (``(layers, B, Lc,
    heads, head_dim)`` each, under ``"blocks"`` and ``"vace_blocks"``). The context does not change
    from step to step, so a run computes these once and passes them as the conditioning's
    ``context_kv``; the blocks then compute exactly what they would have projected."""
    context, image_context = embed_context(params, cfg, prompt_embeds, settings, image_embeds)
    out = {"blocks": _stacked_kv(params["blocks"], cfg, context, image_context, settings, True)}
    if cfg.vace:
        out["vace_blocks"] = _stacked_kv(params["vace_blocks"], cfg, context, image_context, settings, False)
    return out


def _stacked_kv(
    layers: Params,
    cfg: TransformerConfig,
    context: jax.Array,
    image_context: jax.Array | None,
    settings: RunSettings,
    may_stream: bool,
) -> ContextKV:
    """:func:`cross_kv` of each stacked layer, written into one buffer per name by a loop over the
    layers (their weights streamed from the host under ``offload="blocks"`` where ``may_stream``)."""
    layers = marked_blocks(layers, settings.int8_matmuls)
    n = jax.tree.leaves(layers)[0].shape[0]
    sources = {"k": context, "v": context}
    if image_context is not None:
        sources |= {"k_img": image_context, "v_img": image_context}
    heads, head_dim = cfg.num_attention_heads, cfg.attention_head_dim
    buffers = {
        name: jnp.zeros((n, *src.shape[:2], heads, head_dim), settings.dtype) for name, src in sources.items()
    }
    weights = {
        "attn2": {k: v for k, v in layers["attn2"].items() if k in CONTEXT_KV_WEIGHTS},
        "index": jnp.arange(n, dtype=jnp.int32),
    }

    mesh = settings.mesh
    spec = None if mesh is None else kv_spec(mesh, context.shape[0], heads)

    def body(buf: ContextKV, item: Params) -> ContextKV:
        kv = cross_kv(item["attn2"], context, image_context, heads, cfg.eps, settings.precision)
        if mesh is not None:  # as the cross-attention reads them
            kv = {name: constrain(x, mesh, spec) for name, x in kv.items()}
        return {name: buf[name].at[item["index"]].set(kv[name]) for name in buf}

    run_layers = stream_layers if may_stream and streams_layers(settings.offload) else scan_layers
    return run_layers(body, buffers, weights)


def _layout(mesh: Mesh, rows: int, heads: int) -> TokenLayout:
    """The token layout of ``rows`` forward rows (its context spec; the sequence is left whole)."""
    return token_layout(dict(mesh.shape), rows, 1, heads)


def kv_spec(mesh: Mesh, rows: int, heads: int) -> PartitionSpec:
    """How a cross-attention's keys or values ``(rows, Lc, heads, head_dim)`` are split over ``mesh``:
    as the attention reads them (rows over dp where they divide, heads over tp)."""
    return _layout(mesh, rows, heads).qkv(split_seq=False)
