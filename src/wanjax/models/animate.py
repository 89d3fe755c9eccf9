"""Wan 2.2 Animate's additions to the DiT (diffusers' ``WanAnimateTransformer3DModel``), as pure
functions over the transformer's params; the blocks, embedders and output are the DiT's
(:mod:`wanjax.models.dit`).

An Animate forward reads, besides an image-to-video DiT's inputs, :class:`AnimateControl`: the pose
video's latents ``(B, z, T, H, W)`` (one frame fewer than the latents: the first is the reference
image's), patch-embedded and added to the tokens of latent frames ``1..T``; and the face video's
pixels ``(B, 3, S, size, size)`` in ``[-1, 1]``. Each face frame goes through the motion encoder (a
StyleGAN-like conv net, then linears, then a projection onto the orthonormal basis of a learned
matrix); the face encoder (causal strided 1-D convs over the frames) turns the ``S`` motion vectors
into ``T`` frames of ``heads + 1`` tokens, a zero frame put first for the reference. After every
``inject_face_latents_blocks``-th block (0, k, 2k, ...) a face adapter adds a cross-attention of
each latent frame's tokens to its frame's face tokens.

Precision as the DiT's: convolutions and matmuls take the activation dtype and accumulate in
float32, norms in float32; the motion basis (``torch.linalg.qr`` in diffusers) in float32.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from wanjax.errors import ConfigError
from wanjax.kernels.attention import attention
from wanjax.kernels.precision import Precision, lax_precision
from wanjax.models.config import TransformerConfig
from wanjax.models.dit_embed import patchify
from wanjax.models.layers import Params, layer_norm, linear, matmul, rms_norm, silu
from wanjax.models.settings import RunSettings
from wanjax.parallel.attention import sharded_attention
from wanjax.parallel.layouts import frame_layout, token_layout

__all__ = [
    "AnimateControl",
    "abstract_control",
    "embed_pose",
    "face_adapter",
    "face_tokens",
    "motion_vectors",
]

BLUR = (1.0, 3.0, 3.0, 1.0)  # the residual blocks' anti-aliasing FIR filter (upfirdn2d's)
LEAKY_SLOPE, LEAKY_GAIN = 0.2, math.sqrt(2.0)  # FusedLeakyReLU
FACE_KERNEL = 3  # the face encoder's causal conv width


class AnimateControl(NamedTuple):
    """An Animate model's motion: pose latents ``(B, latent_channels, T, H, W)`` and face pixels
    ``(B, 3, S, size, size)`` in ``[-1, 1]`` (the unconditional pass's: all ``-1``)."""

    pose_latents: jax.Array
    face_pixels: jax.Array


def abstract_control(cfg: TransformerConfig, frames: int, grid: tuple[int, int, int]) -> AnimateControl:
    """An Animate step's pose latents (a ``(T, H, W)`` latent ``grid``) and ``frames`` face frames, as
    shapes (to compile for a target)."""
    size = cfg.motion_encoder_size
    return AnimateControl(
        jax.ShapeDtypeStruct((1, cfg.pose_channels, *grid), jnp.float32),
        jax.ShapeDtypeStruct((1, 3, frames, size, size), jnp.float32),
    )


def check_control(cfg: TransformerConfig, latents_shape: tuple[int, ...], control: AnimateControl) -> None:
    """ConfigError unless the pose latents and face pixels fit latents of ``latents_shape``."""
    b, _, t, h, w = latents_shape
    pose, face = control.pose_latents.shape, control.face_pixels.shape
    if pose != (b, cfg.pose_channels, t - 1, h, w):
        raise ConfigError(
            f"pose latents must be (B, {cfg.pose_channels}, T - 1, H, W) = {(b, cfg.pose_channels, t - 1, h, w)} "
            f"for latents {latents_shape}, got {pose}"
        )
    size = cfg.motion_encoder_size
    if len(face) != 5 or face[0] != b or face[1] != 3 or face[3:] != (size, size):
        raise ConfigError(f"face pixels must be (B={b}, 3, S, {size}, {size}), got {face}")
    if _face_frames(face[2]) + 1 != t:
        raise ConfigError(f"{face[2]} face frames give {_face_frames(face[2]) + 1} latent frames, not {t}")


def _face_frames(frames: int) -> int:
    """The face encoder's output frames for ``frames`` input frames (two stride-2 causal convs)."""
    for _ in range(2):
        frames = (frames - 1) // 2 + 1
    return frames


# ----------------------------------------------------------------------------------------------
# Pose


def embed_pose(
    params: Params, cfg: TransformerConfig, x: jax.Array, pose_latents: jax.Array, settings: RunSettings
) -> jax.Array:
    """The tokens ``x (B, L, D)`` with the pose latents' patch embedding added to those of latent
    frames ``1..T`` (frame 0 is the reference image's)."""
    pose = linear(
        patchify(pose_latents.astype(settings.dtype), cfg.patch_size),
        params["pose_patch_embedding"],
        precision=settings.precision,
    )
    return x.at[:, x.shape[1] - pose.shape[1] :].add(pose)


# ----------------------------------------------------------------------------------------------
# Motion encoder: face frames -> motion vectors


def _conv2d(
    x: jax.Array, weight: jax.Array, stride: int, padding: tuple[tuple[int, int], ...], precision: Precision
) -> jax.Array:
    """NHWC ``x`` with an HWIO ``weight`` (scaled before), float32 accumulation, x's dtype out."""
    y = jax.lax.conv_general_dilated(
        x,
        weight.astype(x.dtype),
        (stride, stride),
        padding,
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
        feature_group_count=1 if weight.shape[2] == x.shape[-1] else x.shape[-1],
        preferred_element_type=jnp.float32,
        precision=lax_precision(precision, x.dtype),
    )
    return y.astype(x.dtype)


def _blur(x: jax.Array, kernel_size: int, stride: int, precision: Precision) -> jax.Array:
    """diffusers' ``MotionConv2d`` blur: the normalised 4x4 FIR filter per channel, padded as it is
    (``((p + 1) // 2, p // 2)`` as torch's (height, width) padding, both sides each)."""
    k = np.outer(BLUR, BLUR)
    k = (k / k.sum()).astype(np.float32)
    p = (len(BLUR) - stride) + (kernel_size - 1)
    pad_h, pad_w = (p + 1) // 2, p // 2
    channels = x.shape[-1]
    weight = jnp.broadcast_to(jnp.asarray(k)[:, :, None, None], (*k.shape, 1, channels))
    return _conv2d(x, weight, 1, ((pad_h, pad_h), (pad_w, pad_w)), precision)


def _leaky(x: jax.Array, bias: jax.Array) -> jax.Array:
    """FusedLeakyReLU: ``leaky_relu(x + bias, 0.2) * sqrt(2)``."""
    y = x + bias.astype(x.dtype)
    return (jnp.where(y >= 0, y, y * LEAKY_SLOPE) * LEAKY_GAIN).astype(x.dtype)


def _motion_conv(
    x: jax.Array,
    p: Params,
    stride: int = 1,
    padding: int = 0,
    blur: bool = False,
    precision: Precision = "highest",
) -> jax.Array:
    """diffusers' ``MotionConv2d``: optional blur, the conv with its weight times
    ``1 / sqrt(in * k * k)``, then the fused leaky ReLU when it has an activation bias."""
    weight = p["weight"]
    k, _, c_in, _ = weight.shape
    if blur:
        x = _blur(x, k, stride, precision)
    scaled = weight.astype(jnp.float32) * (1.0 / math.sqrt(c_in * k * k))
    y = _conv2d(x, scaled.astype(weight.dtype), stride, ((padding, padding), (padding, padding)), precision)
    return _leaky(y, p["act_bias"]) if "act_bias" in p else y


def motion_basis(p: Params) -> jax.Array:
    """The linear motion decomposition's orthonormal basis ``(motion_encoder_dim, motion_dim)``: the QR
    of the learned directions (plus 1e-8, as diffusers), in float32."""
    return jnp.linalg.qr(p["motion_synthesis_weight"].astype(jnp.float32) + 1e-8)[0]


def _motion_frames(
    p: Params, cfg: TransformerConfig, faces: jax.Array, basis: jax.Array, precision: Precision
) -> jax.Array:
    """The motion encoder on face frames ``(N, size, size, 3)`` -> motion vectors ``(N, motion_encoder_dim)``
    (``basis``: :func:`motion_basis`)."""
    x = _motion_conv(faces, p["conv_in"], precision=precision)
    for i in range(len(cfg.motion_sizes) - 1):
        block = p["res_blocks"][str(i)]
        out = _motion_conv(x, block["conv1"], padding=1, precision=precision)
        out = _motion_conv(out, block["conv2"], stride=2, blur=True, precision=precision)
        skip = _motion_conv(x, block["conv_skip"], stride=2, blur=True, precision=precision)
        x = ((out.astype(jnp.float32) + skip.astype(jnp.float32)) / math.sqrt(2.0)).astype(x.dtype)
    feat = _motion_conv(x, p["conv_out"], precision=precision)[:, 0, 0, :]  # (N, style_dim)
    for i in range(len(p["motion_network"])):
        layer = p["motion_network"][str(i)]
        y = matmul(feat, layer["kernel"], precision) * (1.0 / math.sqrt(cfg.motion_style_dim or 1))
        feat = (y + layer["bias"].astype(jnp.float32)).astype(feat.dtype)
    # Linear motion decomposition: the coefficients on the orthonormal basis of the directions
    vec = jnp.matmul(feat.astype(jnp.float32), basis.T, precision=jax.lax.Precision.HIGHEST)
    return vec.astype(faces.dtype)


def motion_vectors(
    params: Params, cfg: TransformerConfig, face_pixels: jax.Array, settings: RunSettings
) -> jax.Array:
    """Face pixels ``(B, 3, S, size, size)`` -> motion vectors ``(B, S, motion_encoder_dim)``, the
    frames through the motion encoder ``motion_encoder_batch_size`` at a time (as diffusers batches
    them: the same values, bounded memory)."""
    b, _, s, size, _ = face_pixels.shape
    faces = face_pixels.astype(settings.dtype).transpose(0, 2, 3, 4, 1).reshape(b * s, size, size, 3)

    basis = motion_basis(params["motion_encoder"])  # once, not per frame

    def encode(frame: jax.Array) -> jax.Array:
        return _motion_frames(params["motion_encoder"], cfg, frame[None], basis, settings.precision)[0]

    vectors = jax.lax.map(encode, faces, batch_size=cfg.motion_encoder_batch_size)
    return vectors.reshape(b, s, -1)


# ----------------------------------------------------------------------------------------------
# Face encoder: motion vectors -> face tokens per latent frame


def _causal_conv1d(x: jax.Array, p: Params, stride: int, precision: Precision) -> jax.Array:
    """``x (N, T, C)`` padded by repeating its first frame ``FACE_KERNEL - 1`` times, then a conv
    (weight ``(k, in, out)``) of ``stride``; float32 accumulation, x's dtype out."""
    x = jnp.pad(x, ((0, 0), (FACE_KERNEL - 1, 0), (0, 0)), mode="edge")
    y = jax.lax.conv_general_dilated(
        x,
        p["weight"].astype(x.dtype),
        (stride,),
        "VALID",
        dimension_numbers=("NWC", "WIO", "NWC"),
        preferred_element_type=jnp.float32,
        precision=lax_precision(precision, x.dtype),
    )
    return (y + p["bias"].astype(jnp.float32)).astype(x.dtype)


def face_tokens(
    params: Params, cfg: TransformerConfig, motion: jax.Array, settings: RunSettings
) -> jax.Array:
    """diffusers' ``WanAnimateFaceEncoder`` and the zero frame before it: motion vectors ``(B, S, dim)``
    -> face tokens ``(B, T, heads + 1, D)``, ``T = 1 + ceil(ceil(S / 2) / 2)`` (the first all zero)."""
    p, eps, precision = params["face_encoder"], cfg.eps, settings.precision
    b, heads = motion.shape[0], cfg.face_encoder_num_heads
    assert heads is not None

    def norm_act(x: jax.Array) -> jax.Array:
        return silu(layer_norm(x, eps).astype(x.dtype))

    x = _causal_conv1d(motion.astype(settings.dtype), p["conv1_local"], 1, precision)  # (B, S, heads*C)
    x = x.reshape(b, x.shape[1], heads, -1).transpose(0, 2, 1, 3).reshape(b * heads, x.shape[1], -1)
    x = norm_act(x)
    x = norm_act(_causal_conv1d(x, p["conv2"], 2, precision))
    x = norm_act(_causal_conv1d(x, p["conv3"], 2, precision))
    x = linear(x, p["out_proj"], precision=precision)  # (B*heads, T, D)
    x = x.reshape(b, heads, x.shape[1], -1).transpose(0, 2, 1, 3)  # (B, T, heads, D)
    padding = jnp.broadcast_to(p["padding_tokens"].astype(x.dtype), (b, x.shape[1], 1, x.shape[-1]))
    x = jnp.concatenate([x, padding], axis=2)
    return jnp.concatenate([jnp.zeros_like(x[:, :1]), x], axis=1)


def face_conditioning(
    params: Params, cfg: TransformerConfig, face_pixels: jax.Array, settings: RunSettings
) -> jax.Array:
    """Face pixels -> the face adapters' tokens ``(B, T, heads + 1, D)``."""
    return face_tokens(params, cfg, motion_vectors(params, cfg, face_pixels, settings), settings)


# ----------------------------------------------------------------------------------------------
# Face adapter


def face_adapter(
    p: Params, x: jax.Array, face: jax.Array, cfg: TransformerConfig, settings: RunSettings
) -> jax.Array:
    """diffusers' ``WanAnimateFaceBlockCrossAttention``: each latent frame's tokens of ``x (B, L, D)``
    attend to that frame's face tokens ``face (B, T, N, D)``; returns the attention's output
    projection (the caller adds it to ``x``). Queries and keys RMS-normed per head."""
    b, length, d = x.shape
    _, t, n, _ = face.shape
    heads, eps, precision = cfg.num_attention_heads, cfg.eps, settings.precision
    hd = d // heads
    xn = layer_norm(x, eps).astype(x.dtype)
    fn = layer_norm(face.reshape(b, t * n, d), eps).astype(x.dtype)
    q = rms_norm(
        linear(xn, p["to_q"], precision=precision).reshape(b, length, heads, hd), p["norm_q"]["scale"], eps
    )
    k = rms_norm(
        linear(fn, p["to_k"], precision=precision).reshape(b, t * n, heads, hd), p["norm_k"]["scale"], eps
    )
    v = linear(fn, p["to_v"], precision=precision).reshape(b, t * n, heads, hd)
    q = q.reshape(b * t, length // t, heads, hd)
    k, v = k.reshape(b * t, n, heads, hd), v.reshape(b * t, n, heads, hd)
    out = _frame_attention(q, k, v, b, length, heads, settings)
    return linear(out.reshape(b, length, d), p["to_out"], precision=precision)


def _frame_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, batch: int, length: int, heads: int, settings: RunSettings
) -> jax.Array:
    """Each row (a latent frame) of ``q (B*T, L/T, H, D)`` attending to its ``k``, ``v``; on a mesh
    under ``shard_map`` with the heads split as the DiT's attention splits them
    (:func:`~wanjax.parallel.layouts.frame_layout`)."""
    mesh, precision = settings.mesh, settings.precision
    if mesh is None:
        return attention(q, k, v, backend="xla", precision=precision)
    sizes = dict(mesh.shape)
    layout = frame_layout(token_layout(sizes, batch, length, heads), sizes, q.shape[0])
    return sharded_attention(
        q, k, v, mesh=mesh, layout=layout, self_attention=False, backend="xla", precision=precision
    )


def face_layers(cfg: TransformerConfig) -> tuple[np.ndarray, np.ndarray]:
    """Per block: the face adapter that follows it and whether one does (blocks 0, k, 2k, ...)."""
    k = cfg.inject_face_latents_blocks
    assert k is not None
    layers = np.arange(cfg.num_layers)
    return (layers // k).astype(np.int32), layers % k == 0
