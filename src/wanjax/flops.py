"""Analytic FLOP counts (multiply-adds × 2) of the DiT and the UMT5 encoder.

Only matrix products are counted: the linear layers (patch embedding and output projection
included) and the two products of every attention core (``Q·Kᵀ`` and ``P·V``). Norms, softmax,
RoPE, modulation and activations add a few FLOPs per element, well under 1% of a Wan step at video
lengths. These counts turn measured seconds into achieved FLOP/s (``wanjax bench``) and into
projections for other hardware.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from wanjax.config import TransformerConfig
from wanjax.models.umt5 import UMT5Config


def matmul_flops(m: int, k: int, n: int) -> int:
    """FLOPs of an ``(m, k) @ (k, n)`` product."""
    return 2 * m * k * n


@dataclasses.dataclass(frozen=True)
class Flops:
    """FLOPs split into linear layers and attention cores."""

    linear: int = 0
    attention: int = 0

    @property
    def total(self) -> int:
        return self.linear + self.attention

    def __add__(self, other: Flops) -> Flops:
        return Flops(self.linear + other.linear, self.attention + other.attention)

    def __mul__(self, factor: int) -> Flops:
        return Flops(self.linear * factor, self.attention * factor)

    __rmul__ = __mul__


def attention_flops(batch: int, heads: int, q_len: int, kv_len: int, head_dim: int) -> int:
    """``Q·Kᵀ`` and ``P·V`` of one attention core."""
    return 2 * batch * heads * matmul_flops(q_len, head_dim, kv_len)


def dit_tokens(cfg: TransformerConfig, latent_shape: Sequence[int]) -> int:
    """Number of video tokens for latents ``(B, C, T, H, W)`` or ``(T, H, W)``."""
    t, h, w = latent_shape[-3:]
    pt, ph, pw = cfg.patch_size
    return (t // pt) * (h // ph) * (w // pw)


def dit_forward_flops(
    cfg: TransformerConfig, latent_shape: Sequence[int], text_len: int = 512, batch: int | None = None
) -> Flops:
    """One DiT forward over latents ``(B, C, T, H, W)`` with ``text_len`` text tokens per sample."""
    b = latent_shape[0] if batch is None else batch
    tokens = dit_tokens(cfg, latent_shape)
    d, heads, hd = cfg.inner_dim, cfg.num_attention_heads, cfg.attention_head_dim
    patch_in = cfg.in_channels * cfg.patch_volume
    patch_out = cfg.out_channels * cfg.patch_volume
    embed = (
        matmul_flops(b * tokens, patch_in, d)  # patch embedding
        + matmul_flops(b * text_len, cfg.text_dim, d)
        + matmul_flops(b * text_len, d, d)  # text embedder
        + matmul_flops(b, cfg.freq_dim, d)
        + matmul_flops(b, d, d)  # time embedder
        + matmul_flops(b, d, 6 * d)  # time projection
        + matmul_flops(b * tokens, d, patch_out)  # output projection
    )
    block_linear = (
        4 * matmul_flops(b * tokens, d, d)  # self-attention q, k, v, o
        + 2 * matmul_flops(b * tokens, d, d)  # cross-attention q, o
        + 2 * matmul_flops(b * text_len, d, d)  # cross-attention k, v (text)
        + 2 * matmul_flops(b * tokens, d, cfg.ffn_dim)  # FFN up and down
    )
    block_attention = attention_flops(b, heads, tokens, tokens, hd) + attention_flops(
        b, heads, tokens, text_len, hd
    )
    return Flops(embed, 0) + cfg.num_layers * Flops(block_linear, block_attention)


def dit_step_flops(
    cfg: TransformerConfig,
    latent_shape: Sequence[int],
    text_len: int = 512,
    guidance: bool = True,
) -> Flops:
    """One denoising step: the forward over the batch, twice the batch with classifier-free guidance
    (the scheduler update is a handful of elementwise operations)."""
    batch = latent_shape[0] * (2 if guidance else 1)
    return dit_forward_flops(cfg, latent_shape, text_len, batch=batch)


def umt5_flops(cfg: UMT5Config, batch: int, length: int) -> Flops:
    """One UMT5 encoder pass over ``batch`` sequences of ``length`` tokens (the embedding is a gather)."""
    d, inner = cfg.d_model, cfg.inner_dim
    rows = batch * length
    layer_linear = 4 * matmul_flops(rows, d, inner) + 3 * matmul_flops(rows, d, cfg.d_ff)
    layer_attention = attention_flops(batch, cfg.num_heads, length, length, cfg.d_kv)
    return cfg.num_layers * Flops(layer_linear, layer_attention)


def achieved(flops: Flops | int, seconds: float) -> float:
    """FLOP/s for ``flops`` done in ``seconds`` (``nan`` when no time was measured)."""
    total = flops.total if isinstance(flops, Flops) else flops
    return total / seconds if seconds > 0 else math.nan
