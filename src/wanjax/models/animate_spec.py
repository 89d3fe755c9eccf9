"""Wan 2.2 Animate's own leaves of the transformer's checkpoint layout (diffusers'
``WanAnimateTransformer3DModel`` names): the pose patch embedding, the motion encoder, the face
encoder and the stacked face adapters, each with its logical axes. The rest of the model is the
image-to-video DiT's (:mod:`wanjax.models.dit_spec`)."""

from __future__ import annotations

import itertools

from wanjax.io.checkpoint import REPLICATED, LeafSource, Transpose, linear_kernel, stacked, stacked_linear
from wanjax.models.config import TransformerConfig
from wanjax.models.layers import Params

__all__ = ["animate_spec"]

CONV2D = Transpose((2, 3, 1, 0))  # torch Conv2d weight (out, in, kh, kw) -> HWIO
CONV1D = Transpose((2, 1, 0))  # torch Conv1d weight (out, in, k) -> WIO


def _linear(name: str, n_in: int, n_out: int, **kw: object) -> Params:
    return {
        "kernel": LeafSource((f"{name}.weight",), (n_out, n_in), linear_kernel, axes=REPLICATED, **kw),
        "bias": LeafSource((f"{name}.bias",), (n_out,), axes=REPLICATED, **kw),
    }


def _conv(name: str, c_in: int, c_out: int, k: int, act: bool) -> Params:
    """A ``MotionConv2d``: its weight, and its activation's bias when it has one."""
    spec = {"weight": LeafSource((f"{name}.weight",), (c_out, c_in, k, k), CONV2D, axes=REPLICATED)}
    if act:
        spec["act_bias"] = LeafSource((f"{name}.act_fn.bias",), (c_out,), axes=REPLICATED)
    return spec


def _motion_encoder(cfg: TransformerConfig) -> Params:
    name, channels, sizes = "motion_encoder", cfg.motion_channels, cfg.motion_sizes
    style, motion = cfg.motion_style_dim, cfg.motion_dim
    assert style is not None and motion is not None and cfg.motion_encoder_dim is not None
    width = [channels[str(s)] for s in sizes]
    blocks = {}
    for i, (c_in, c_out) in enumerate(itertools.pairwise(width)):
        block = f"{name}.res_blocks.{i}"
        blocks[str(i)] = {
            "conv1": _conv(f"{block}.conv1", c_in, c_in, 3, act=True),
            "conv2": _conv(f"{block}.conv2", c_in, c_out, 3, act=True),
            "conv_skip": _conv(f"{block}.conv_skip", c_in, c_out, 1, act=False),
        }
    widths = [style] * 5 + [motion]  # diffusers' motion_blocks = 5 linears, the last to motion_dim
    return {
        "conv_in": _conv(f"{name}.conv_in", 3, width[0], 1, act=True),
        "res_blocks": blocks,
        "conv_out": _conv(f"{name}.conv_out", width[-1], style, 4, act=False),
        "motion_network": {
            str(i): _linear(f"{name}.motion_network.{i}", widths[i], widths[i + 1]) for i in range(5)
        },
        "motion_synthesis_weight": LeafSource(
            (f"{name}.motion_synthesis_weight",),
            (cfg.motion_encoder_dim, motion),
            axes=REPLICATED,
            keep_fp32=True,
        ),
    }


def _face_encoder(cfg: TransformerConfig) -> Params:
    name, d = "face_encoder", cfg.inner_dim
    hidden, heads, dim = cfg.face_encoder_hidden_dim, cfg.face_encoder_num_heads, cfg.motion_encoder_dim
    assert hidden is not None and heads is not None and dim is not None

    def conv(part: str, c_in: int, c_out: int) -> Params:
        return {
            "weight": LeafSource((f"{name}.{part}.weight",), (c_out, c_in, 3), CONV1D, axes=REPLICATED),
            "bias": LeafSource((f"{name}.{part}.bias",), (c_out,), axes=REPLICATED),
        }

    return {
        "conv1_local": conv("conv1_local", dim, hidden * heads),
        "conv2": conv("conv2", hidden, hidden),
        "conv3": conv("conv3", hidden, hidden),
        "out_proj": _linear(f"{name}.out_proj", hidden, d),
        "padding_tokens": LeafSource(
            (f"{name}.padding_tokens",), (1, 1, 1, d), lambda a: a[0, 0, 0], axes=REPLICATED
        ),
    }


def _face_adapters(cfg: TransformerConfig) -> Params:
    """The ``num_layers / inject_face_latents_blocks`` face adapters, stacked."""
    assert cfg.inject_face_latents_blocks is not None
    n, d = cfg.num_layers // cfg.inject_face_latents_blocks, cfg.inner_dim
    hd = cfg.attention_head_dim

    def lin(part: str, axes: tuple[str | None, str | None]) -> Params:
        return stacked_linear(f"face_adapter.{{i}}.{part}", n, d, d, axes)

    def norm(part: str) -> Params:
        return {"scale": stacked(f"face_adapter.{{i}}.{part}.weight", n, (hd,), axes=("layers", None))}

    return {
        "to_q": lin("to_q", ("embed", "heads")),
        "to_k": lin("to_k", ("embed", "heads")),
        "to_v": lin("to_v", ("embed", "heads")),
        "to_out": lin("to_out", ("heads", "embed")),
        "norm_q": norm("norm_q"),
        "norm_k": norm("norm_k"),
    }


def animate_spec(cfg: TransformerConfig) -> Params:
    """An Animate transformer's leaves besides the image-to-video DiT's and its pose patch embedding
    (a patch embedding as the DiT's, :func:`wanjax.models.dit_spec.checkpoint_spec`)."""
    return {
        "motion_encoder": _motion_encoder(cfg),
        "face_encoder": _face_encoder(cfg),
        "face_adapter": _face_adapters(cfg),
    }
