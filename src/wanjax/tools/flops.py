"""Analytic FLOP counts (multiply-adds × 2) of the DiT, the UMT5 encoder and the VAE decoder.

Only matrix products are counted: the linear layers (patch embedding and output projection
included), the convolutions of the VAE (a convolution is a matrix product per output element:
``2 x out_elements x kernel_volume x in_channels``) and the two products of every attention core
(``Q·Kᵀ`` and ``P·V``). Norms, softmax, RoPE, modulation, activations and biases add a few FLOPs per
element, well under 1% of a Wan step at video lengths. These counts turn measured seconds into
achieved FLOP/s (``wanjax bench``) and into projections for other hardware.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from wanjax.kernels.radial import RadialAttention
from wanjax.models.clip_vision import CLIPVisionConfig
from wanjax.models.config import TransformerConfig
from wanjax.models.defaults import TEXT_LENGTH
from wanjax.models.umt5 import UMT5Config
from wanjax.models.vae.causal_conv import caches_owed_sums
from wanjax.models.vae.config import VAEConfig, decoder_plan
from wanjax.models.vae.ops import Numerics
from wanjax.models.vae.upsampling import caches_lowres_input


def matmul_flops(m: int, k: int, n: int) -> int:
    """FLOPs of an ``(m, k) @ (k, n)`` product."""
    return 2 * m * k * n


@dataclasses.dataclass(frozen=True)
class Flops:
    """FLOPs split into linear layers (convolutions included) and attention cores."""

    linear: int = 0
    attention: int = 0

    @property
    def total(self) -> int:
        return self.linear + self.attention

    def __add__(self, other: Flops) -> Flops:
        return Flops(self.linear + other.linear, self.attention + other.attention)

    def __sub__(self, other: Flops) -> Flops:
        return Flops(self.linear - other.linear, self.attention - other.attention)

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
    cfg: TransformerConfig,
    latent_shape: Sequence[int],
    text_len: int = TEXT_LENGTH,
    batch: int | None = None,
    image_len: int = 0,
    context_cached: bool = False,
) -> Flops:
    """One DiT forward over latents ``(B, C, T, H, W)`` with ``text_len`` text tokens per sample (and,
    image to video, ``image_len`` image-encoder tokens: the image embedder, and per block their keys,
    values and the cross-attention over them; a VACE model: its control patch embedding, the first
    control block's input projection and each control block with its output projection).
    ``context_cached``: the text K/V cache's part (:func:`context_kv_flops`) left out, as a step
    that reads the cache runs it."""
    b = latent_shape[0] if batch is None else batch
    if context_cached:
        whole = dit_forward_flops(cfg, latent_shape, text_len, b, image_len)
        return whole - context_kv_flops(cfg, b, text_len, image_len)
    tokens = dit_tokens(cfg, latent_shape)
    d = cfg.inner_dim
    patch_in = cfg.in_channels * cfg.patch_volume
    patch_out = cfg.out_channels * cfg.patch_volume
    embed = (
        matmul_flops(b * tokens, patch_in, d)  # patch embedding
        + _context_embed_flops(cfg, b, text_len, image_len)
        + matmul_flops(b, cfg.freq_dim, d)
        + matmul_flops(b, d, d)  # time embedder
        + matmul_flops(b, d, 6 * d)  # time projection
        + matmul_flops(b * tokens, d, patch_out)  # output projection
    )
    block = block_flops(cfg, tokens, b, text_len, image_len)
    total = Flops(embed, 0) + cfg.num_layers * block
    if cfg.vace_layers is not None and cfg.vace_in_channels is not None:
        control = matmul_flops(b * tokens, cfg.vace_in_channels * cfg.patch_volume, d)
        control += matmul_flops(b * tokens, d, d)  # the first control block's input projection
        hint = matmul_flops(b * tokens, d, d)  # each control block's output projection
        total += Flops(control, 0) + len(cfg.vace_layers) * (block + Flops(hint, 0))
    if cfg.animate:
        total += animate_flops(cfg, latent_shape, b)
    return total


def animate_flops(cfg: TransformerConfig, latent_shape: Sequence[int], b: int) -> Flops:
    """An Animate forward's own work over ``b`` rows of latents ``(B, C, T + 1, H, W)`` (the reference's
    frame first): the pose patch embedding; the motion encoder on each of the segment's ``4 (T - 1) +
    1`` face frames (its convolutions, their blurs as per-channel 4x4 filters, its linears); the face
    encoder; the face adapters (projections and per-frame attention to ``heads + 1`` face tokens)."""
    assert cfg.motion_encoder_size is not None and cfg.face_encoder_num_heads is not None
    assert cfg.face_encoder_hidden_dim is not None and cfg.motion_style_dim is not None
    assert cfg.motion_dim is not None and cfg.motion_encoder_dim is not None
    assert cfg.inject_face_latents_blocks is not None
    d, t = cfg.inner_dim, latent_shape[-3]
    tokens = dit_tokens(cfg, latent_shape)
    frames = 4 * (t - 2) + 1  # the face frames of a segment of t - 1 latent frames
    pose = matmul_flops(b * tokens * (t - 1) // t, cfg.pose_channels * cfg.patch_volume, d)
    sizes, widths = cfg.motion_sizes, [cfg.motion_channels[str(s)] for s in cfg.motion_sizes]
    motion = matmul_flops(sizes[0] ** 2, 3, widths[0])  # conv_in (1x1)
    for s, c_in, c_out in zip(sizes, widths, widths[1:], strict=False):
        half = s // 2
        motion += matmul_flops(s * s, 9 * c_in, c_in)  # conv1 (3x3)
        motion += 2 * ((s + 1) ** 2 + (s - 1) ** 2) * 16 * c_in  # the two blurs (4x4, per channel)
        motion += matmul_flops(half * half, 9 * c_in, c_out) + matmul_flops(half * half, c_in, c_out)
    motion += matmul_flops(1, 16 * widths[-1], cfg.motion_style_dim)  # conv_out (4x4 to one pixel)
    motion += matmul_flops(4, cfg.motion_style_dim, cfg.motion_style_dim)  # four linears, then one more
    motion += matmul_flops(1, cfg.motion_style_dim, cfg.motion_dim) + matmul_flops(
        1, cfg.motion_dim, cfg.motion_encoder_dim
    )
    heads, hidden = cfg.face_encoder_num_heads, cfg.face_encoder_hidden_dim
    face = matmul_flops(frames, 3 * cfg.motion_encoder_dim, heads * hidden)  # conv1_local
    after_two = (frames - 1) // 2 + 1
    face += heads * matmul_flops(after_two, 3 * hidden, hidden)  # conv2 (stride 2)
    face += heads * matmul_flops(t - 1, 3 * hidden, hidden) + heads * matmul_flops(t - 1, hidden, d)
    adapters = cfg.num_layers // cfg.inject_face_latents_blocks
    keys = t * (heads + 1)
    adapter = Flops(
        2 * matmul_flops(b * tokens, d, d) + 2 * matmul_flops(b * keys, d, d),  # q, o; k, v
        attention_flops(b * t, cfg.num_attention_heads, tokens // t, heads + 1, cfg.attention_head_dim),
    )
    return Flops(pose + b * (frames * motion + face), 0) + adapters * adapter


def block_flops(cfg: TransformerConfig, tokens: int, b: int, text_len: int, image_len: int = 0) -> Flops:
    """One transformer block over ``b`` rows of ``tokens`` tokens, its cross-attention's keys and
    values of the context included."""
    d, heads, hd = cfg.inner_dim, cfg.num_attention_heads, cfg.attention_head_dim
    linear = (
        4 * matmul_flops(b * tokens, d, d)  # self-attention q, k, v, o
        + 2 * matmul_flops(b * tokens, d, d)  # cross-attention q, o
        + _block_context_kv_flops(cfg, b, text_len, image_len)
        + 2 * matmul_flops(b * tokens, d, cfg.ffn_dim)  # FFN up and down
    )
    attention = attention_flops(b, heads, tokens, tokens, hd) + attention_flops(
        b, heads, tokens, text_len, hd
    )
    if image_len:
        attention += attention_flops(b, heads, tokens, image_len, hd)
    return Flops(linear, attention)


def context_kv_flops(
    cfg: TransformerConfig, rows: int, text_len: int = TEXT_LENGTH, image_len: int = 0
) -> Flops:
    """The text K/V cache of ``rows`` forward rows (:mod:`wanjax.sampling.context_cache`): the text
    (and image) embedder and every block's (and control block's) keys and values of the context."""
    embed = _context_embed_flops(cfg, rows, text_len, image_len)
    blocks = cfg.num_layers + len(cfg.vace_layers or ())
    return Flops(embed + blocks * _block_context_kv_flops(cfg, rows, text_len, image_len), 0)


def _context_embed_flops(cfg: TransformerConfig, rows: int, text_len: int, image_len: int) -> int:
    """The text embedder's MLP (text_dim -> D -> D) and the image embedder's (image_dim -> image_dim -> D)."""
    d = cfg.inner_dim
    text = matmul_flops(rows * text_len, cfg.text_dim, d) + matmul_flops(rows * text_len, d, d)
    if not image_len:
        return text
    return (
        text
        + matmul_flops(rows * image_len, cfg.image_dim, cfg.image_dim)
        + matmul_flops(rows * image_len, cfg.image_dim, d)
    )


def _block_context_kv_flops(cfg: TransformerConfig, rows: int, text_len: int, image_len: int) -> int:
    """A block's cross-attention keys and values of the text (k, v) and the image tokens (add_k, add_v)."""
    d = cfg.inner_dim
    return 2 * matmul_flops(rows * text_len, d, d) + 2 * matmul_flops(rows * image_len, d, d)


def dit_step_flops(
    cfg: TransformerConfig,
    latent_shape: Sequence[int],
    text_len: int = TEXT_LENGTH,
    guidance: bool = True,
    image_len: int = 0,
    context_cached: bool = False,
    skipped_by: str | None = None,
) -> Flops:
    """One denoising step: the forward over the batch, twice the batch with classifier-free guidance
    (the scheduler update is a handful of elementwise operations); ``context_cached``: reading the
    text K/V cache (:func:`context_kv_flops`, once per run) instead of projecting the context.
    ``skipped_by``: a step whose blocks that step-cache policy skips, which still runs the
    embeddings, the output projection and a VACE model's control blocks (First-Block Cache its first
    block too; a step TaylorSeer predicts runs nothing)."""
    if skipped_by == "taylorseer":
        return Flops()
    batch = latent_shape[0] * (2 if guidance else 1)
    full = dit_forward_flops(cfg, latent_shape, text_len, batch, image_len, context_cached)
    if skipped_by is None:
        return full
    block = block_flops(cfg, dit_tokens(cfg, latent_shape), batch, text_len, image_len)
    if context_cached:  # the block's keys and values of the context come from the cache
        block -= Flops(_block_context_kv_flops(cfg, batch, text_len, image_len), 0)
    kept = 1 if skipped_by == "firstblock" else 0
    return full - block * (cfg.num_layers - kept)


def clip_vision_flops(cfg: CLIPVisionConfig, images: int) -> Flops:
    """The penultimate hidden states of ``images`` images: the patch embedding and ``N - 1`` layers."""
    tokens, d = cfg.num_positions, cfg.hidden_size
    rows = images * tokens
    embed = matmul_flops(images * cfg.grid**2, cfg.num_channels * cfg.patch_size**2, d)
    layer_linear = 4 * matmul_flops(rows, d, d) + 2 * matmul_flops(rows, d, cfg.intermediate_size)
    layer_attention = attention_flops(images, cfg.num_attention_heads, tokens, tokens, cfg.head_dim)
    return Flops(embed, 0) + (cfg.num_hidden_layers - 1) * Flops(layer_linear, layer_attention)


def umt5_flops(cfg: UMT5Config, batch: int, length: int) -> Flops:
    """One UMT5 encoder pass over ``batch`` sequences of ``length`` tokens (the embedding is a gather)."""
    d, inner = cfg.d_model, cfg.inner_dim
    rows = batch * length
    layer_linear = 4 * matmul_flops(rows, d, inner) + 3 * matmul_flops(rows, d, cfg.d_ff)
    layer_attention = attention_flops(batch, cfg.num_heads, length, length, cfg.d_kv)
    return cfg.num_layers * Flops(layer_linear, layer_attention)


def vae_decode_flops(
    cfg: VAEConfig, latent_shape: Sequence[int], numerics: Numerics | None = None, frames_per_step: int = 1
) -> Flops:
    """The Wan VAE decoder over latents ``(B, z, T', h, w)`` -> ``1 + 4 (T' - 1)`` frames (Wan 2.1).

    Follows ``WanDecoder3d`` (``models/vae/blocks.py``): ``post_quant_conv`` (1x1x1), ``conv_in`` and
    every residual block's two 3x3x3 causal convolutions (one output frame per input frame: the
    causal cache, or zeros before frame 0, pads time), 1x1x1 shortcuts where channels change, the
    mid block's single-head attention over each frame's pixels (``to_qkv``, ``Q·Kᵀ``, ``P·V``,
    ``proj``), the upsamplers' per-frame nearest-x2 + 3x3 convolutions, their ``time_conv`` (3x1x1
    conv to twice the channels, run on every latent chunk but the first, which stays one frame, so
    the first latent frame yields 1 frame and every later one 4), and ``conv_out``.

    Without ``numerics``: the reference architecture (what diffusers computes, and wanjax with
    ``conv="conv3d", upsample="repeat"``), the model FLOPs. With it: what that formulation executes
    on one device. ``upsample="subpixel"`` runs the upsampling conv as four 2x2 convs on the
    low-resolution frame (16/36 of the reference's); ``conv="taps"`` skips the two temporal taps of
    the first frame that only read the zero padding, except in convs caching owed partial sums
    (:func:`~wanjax.models.vae.causal_conv.caches_owed_sums`), which run every tap of every frame;
    residual blocks caching their low-resolution input (one-frame steps,
    :func:`~wanjax.models.vae.upsampling.caches_lowres_input`) run their upsampling twice more per
    frame after the first.
    Padding of the last chunk (``decode_chunk`` > 1 not dividing ``T' - 1``) is not counted;
    spatial tiling neither.
    """
    upsample = "repeat" if numerics is None else numerics.upsample
    numerics = None if numerics is None else numerics.for_steps(frames_per_step)
    if upsample not in ("repeat", "subpixel"):
        raise ValueError(f"upsample must be 'repeat' or 'subpixel', got {upsample!r}")
    b, z, t, h, w = latent_shape
    first, rest = min(t, 1), max(t - 1, 0)  # frames from the first latent chunk and from the others
    linear = matmul_flops(b * t * h * w, z, z)  # post_quant_conv
    attention = 0

    def causal(c_in: int, c_out: int, owed: bool | None = None) -> int:
        """One 3x3x3 causal conv over the current frames."""
        skips_zeros = numerics is not None and numerics.conv == "taps"
        owed = skips_zeros and caches_owed_sums(c_in, c_out, numerics) if owed is None else owed
        taps_first = 1 if skips_zeros and not owed else 3
        return matmul_flops(b * (rest * 3 + first * taps_first) * h * w, 9 * c_in, c_out)

    def upsampling(frames: int, c_in: int, c_out: int) -> int:
        """The x2 upsampling conv of ``frames`` frames of ``h x w`` pixels."""
        if upsample == "repeat":
            return matmul_flops(frames * 4 * h * w, 9 * c_in, c_out)
        return 4 * matmul_flops(frames * h * w, 4 * c_in, c_out)

    plan = decoder_plan(cfg)
    for i, layer in enumerate(plan):
        c_in, c_out = layer.dim_in, layer.dim_out
        pixels = b * (first + rest) * h * w
        after_up = i > 0 and plan[i - 1].kind in ("up2d", "up3d")
        if layer.kind in ("conv", "head"):
            linear += causal(c_in, c_out)
        elif layer.kind == "res":
            up = plan[i - 1]
            lowres = (
                numerics is not None
                and after_up
                and any(later.kind.startswith("up") for later in plan[i + 1 :])
                and caches_lowres_input(up.dim_in, c_in, c_out, numerics)
            )
            linear += causal(c_in, c_out, owed=False if lowres else None) + causal(c_out, c_out)
            if lowres:  # the two cached low-resolution frames upsampled again, every frame but the first
                h, w = h // 2, w // 2
                linear += 2 * upsampling(b * rest, up.dim_in, up.dim_out)
                h, w = 2 * h, 2 * w
            if c_in != c_out:
                linear += matmul_flops(pixels, c_in, c_out)  # conv_shortcut
        elif layer.kind == "attn":
            linear += matmul_flops(pixels, c_in, 3 * c_in) + matmul_flops(pixels, c_in, c_in)
            attention += attention_flops(b * (first + rest), 1, h * w, h * w, c_in)
        elif layer.kind in ("up2d", "up3d"):
            if layer.kind == "up3d":
                linear += matmul_flops(b * rest * h * w, 3 * c_in, 2 * c_in)  # time_conv
                rest *= 2
            linear += upsampling(b * (first + rest), c_in, c_out)
            h, w = 2 * h, 2 * w
        elif layer.kind == "skip" or layer.is_shortcut:
            continue  # Wan 2.2's residual shortcuts: a rearrangement and a mean, no products
        else:
            raise ValueError(f"unexpected decoder layer kind {layer.kind!r}")
    return Flops(linear, attention)


def achieved(flops: Flops | int, seconds: float) -> float:
    """FLOP/s for ``flops`` done in ``seconds`` (``nan`` when no time was measured)."""
    total = flops.total if isinstance(flops, Flops) else flops
    return total / seconds if seconds > 0 else math.nan


def attention_density(cfg: TransformerConfig, latent_shape: Sequence[int], sparse: RadialAttention) -> float:
    """The kept fraction of the radial mask's self-attention blocks for latents ``(..., T, H, W)``."""
    return sparse.block_mask(_token_grid(cfg, latent_shape)).density


def sparse_step_flops(
    cfg: TransformerConfig,
    latent_shape: Sequence[int],
    step: Flops,
    sparse: RadialAttention,
    guidance: bool = True,
) -> Flops:
    """A sparse step's FLOPs: ``step`` (:func:`dit_step_flops`) with the self-attention of the blocks
    from ``sparse.dense_block`` on cut to the query-key pairs the mask keeps (its kept blocks'
    tokens: a partial last block counts its tokens only)."""
    mask = sparse.block_mask(_token_grid(cfg, latent_shape))
    sizes = np.full(mask.table.shape[0], mask.block, np.int64)
    sizes[-1] = mask.length - mask.block * (len(sizes) - 1)
    kept = float(sizes @ mask.table.astype(np.int64) @ sizes) / mask.length**2
    rows = latent_shape[0] * (2 if guidance else 1)
    self_attention = attention_flops(
        rows, cfg.num_attention_heads, mask.length, mask.length, cfg.attention_head_dim
    )
    sparse_blocks = max(0, cfg.num_layers - sparse.dense_block)
    return step - Flops(0, round(sparse_blocks * self_attention * (1 - kept)))


def _token_grid(cfg: TransformerConfig, latent_shape: Sequence[int]) -> tuple[int, int, int]:
    t, h, w = latent_shape[-3:]
    pt, ph, pw = cfg.patch_size
    return t // pt, h // ph, w // pw
