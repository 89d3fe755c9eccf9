"""The Wan transformer's checkpoint layout: which diffusers tensors build each params leaf and the
leaf's logical axes (:class:`~wanjax.io.checkpoint.LeafSource`), for the plain, image-to-video and
VACE transformers, and the ``transformer`` component (:class:`~wanjax.io.component.Component`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from wanjax.io.checkpoint import REPLICATED, Axes, LeafSource, linear_kernel, stacked, stacked_linear
from wanjax.io.component import Component
from wanjax.models.animate_spec import animate_spec
from wanjax.models.config import TransformerConfig
from wanjax.models.dit_layouts import WAN_TRANSFORMER
from wanjax.models.layers import Params

__all__ = ["TRANSFORMER", "TRANSFORMER_2", "checkpoint_spec"]


def _patch_kernel(weight: np.ndarray) -> np.ndarray:
    """Conv3d weight ``(D, C, pt, ph, pw)`` -> ``(C*pt*ph*pw, D)``; patch vectors ordered (c, t, h, w)."""
    return weight.reshape(weight.shape[0], -1).T


def _squeeze_leading(a: np.ndarray) -> np.ndarray:
    return a[0]


def _linear_spec(name: str, n_in: int, n_out: int, axes: Axes, bias: Axes, **kw: Any) -> Params:
    return {
        "kernel": LeafSource((f"{name}.weight",), (n_out, n_in), linear_kernel, axes=axes, **kw),
        "bias": LeafSource((f"{name}.bias",), (n_out,), axes=bias, **kw),
    }


def _patch_spec(name: str, cfg: TransformerConfig, channels: int) -> Params:
    """A patch embedding (Conv3d over patches) as a linear of the patch vectors."""
    d = cfg.inner_dim
    return {
        "kernel": LeafSource(
            (f"{name}.weight",), (d, channels, *cfg.patch_size), _patch_kernel, axes=(None, "embed")
        ),
        "bias": LeafSource((f"{name}.bias",), (d,), axes=REPLICATED),
    }


def _blocks_spec(cfg: TransformerConfig, prefix: str, n: int, out_projection: bool = False) -> Params:
    """The ``n`` stacked blocks named ``{prefix}.{i}`` (a ``WanTransformerBlock`` each; a VACE block
    has its output projection too, ``out_projection``)."""
    d, ff = cfg.inner_dim, cfg.ffn_dim
    keep = {"keep_fp32": True}

    def block_lin(name: str, n_in: int, n_out: int, axes: tuple[str | None, str | None]) -> Params:
        return stacked_linear(f"{prefix}.{{i}}.{name}", n, n_in, n_out, axes)

    def block_vec(name: str, axis: str, **kw: Any) -> LeafSource:
        return stacked(f"{prefix}.{{i}}.{name}", n, (d,), axes=("layers", axis), **kw)

    def attn(name: str) -> Params:
        return {
            **{
                proj: block_lin(f"{name}.{proj}", d, d, ("embed", "heads"))
                for proj in ("to_q", "to_k", "to_v")
            },
            "to_out": block_lin(f"{name}.to_out.0", d, d, ("heads", "embed")),
            "norm_q": {"scale": block_vec(f"{name}.norm_q.weight", "heads")},
            "norm_k": {"scale": block_vec(f"{name}.norm_k.weight", "heads")},
        }

    blocks: Params = {
        "scale_shift_table": stacked(
            f"{prefix}.{{i}}.scale_shift_table",
            n,
            (1, 6, d),
            layout=_squeeze_leading,
            axes=("layers", None, "embed"),
            **keep,
        ),
        "attn1": attn("attn1"),
        "attn2": attn("attn2"),
        "ffn": {
            "proj_in": block_lin("ffn.net.0.proj", d, ff, ("embed", "mlp")),
            "proj_out": block_lin("ffn.net.2", ff, d, ("mlp", "embed")),
        },
    }
    if cfg.image_tokens:  # the image tokens' own keys and values in the cross-attention
        blocks["attn2"]["add_k_proj"] = block_lin("attn2.add_k_proj", d, d, ("embed", "heads"))
        blocks["attn2"]["add_v_proj"] = block_lin("attn2.add_v_proj", d, d, ("embed", "heads"))
        blocks["attn2"]["norm_added_k"] = {"scale": block_vec("attn2.norm_added_k.weight", "heads")}
    if cfg.cross_attn_norm:
        blocks["norm2"] = {
            "scale": block_vec("norm2.weight", "embed", **keep),
            "bias": block_vec("norm2.bias", "embed", **keep),
        }
    if out_projection:
        blocks["proj_out"] = block_lin("proj_out", d, d, ("embed", None))
    return blocks


def checkpoint_spec(cfg: TransformerConfig) -> Params:
    """Which diffusers tensors build each params leaf, and each leaf's logical axes (see
    :class:`wanjax.io.checkpoint.LeafSource`): Q/K/V and FFN-in column-parallel over ``heads``/``mlp``,
    the output projections row-parallel, ``embed`` dims FSDP-able. A VACE model adds its control
    patch embedding, blocks (each with an output projection) and the first one's input projection; an
    Animate model its pose patch embedding and :func:`~wanjax.models.animate_spec.animate_spec`'s."""
    d = cfg.inner_dim
    keep = {"keep_fp32": True}
    embedder = "condition_embedder"
    spec = {
        "patch_embedding": _patch_spec("patch_embedding", cfg, cfg.in_channels),
        "time_embedder": {
            "linear_1": _linear_spec(
                f"{embedder}.time_embedder.linear_1", cfg.freq_dim, d, (None, "mlp"), ("mlp",), **keep
            ),
            "linear_2": _linear_spec(
                f"{embedder}.time_embedder.linear_2", d, d, ("mlp", "embed"), (None,), **keep
            ),
        },
        "time_proj": _linear_spec(f"{embedder}.time_proj", d, 6 * d, ("embed", "mlp"), ("mlp",)),
        "text_embedder": {
            "linear_1": _linear_spec(
                f"{embedder}.text_embedder.linear_1", cfg.text_dim, d, (None, "mlp"), ("mlp",)
            ),
            "linear_2": _linear_spec(f"{embedder}.text_embedder.linear_2", d, d, ("mlp", "embed"), (None,)),
        },
        "blocks": _blocks_spec(cfg, "blocks", cfg.num_layers),
        "scale_shift_table": LeafSource(
            ("scale_shift_table",), (1, 2, d), _squeeze_leading, axes=REPLICATED, **keep
        ),
        "proj_out": _linear_spec(
            "proj_out", d, cfg.out_channels * cfg.patch_volume, ("embed", None), (None,)
        ),
        **({"image_embedder": _image_embedder_spec(cfg)} if cfg.image_tokens else {}),
    }
    if cfg.vace:
        assert cfg.vace_layers is not None and cfg.vace_in_channels is not None
        spec["vace_patch_embedding"] = _patch_spec("vace_patch_embedding", cfg, cfg.vace_in_channels)
        spec["vace_proj_in"] = _linear_spec("vace_blocks.0.proj_in", d, d, ("embed", None), (None,))
        spec["vace_blocks"] = _blocks_spec(cfg, "vace_blocks", len(cfg.vace_layers), out_projection=True)
    if cfg.animate:
        spec["pose_patch_embedding"] = _patch_spec("pose_patch_embedding", cfg, cfg.pose_channels)
        spec.update(animate_spec(cfg))
    return spec


def _image_embedder_spec(cfg: TransformerConfig) -> Params:
    """diffusers' ``WanImageEmbedding``: float32 LayerNorm, GELU MLP (image_dim -> image_dim -> D),
    float32 LayerNorm; first-last-frame models add a learned position table over both images' tokens."""
    d, i = cfg.inner_dim, cfg.image_dim
    name = "condition_embedder.image_embedder"

    def norm(part: str, width: int) -> Params:
        return {
            "scale": LeafSource((f"{name}.{part}.weight",), (width,), axes=REPLICATED, keep_fp32=True),
            "bias": LeafSource((f"{name}.{part}.bias",), (width,), axes=REPLICATED, keep_fp32=True),
        }

    def lin(part: str, n_in: int, n_out: int, axes: Axes) -> Params:
        return {
            "kernel": LeafSource((f"{name}.{part}.weight",), (n_out, n_in), linear_kernel, axes=axes),
            "bias": LeafSource((f"{name}.{part}.bias",), (n_out,), axes=axes[1:]),
        }

    spec = {
        "norm1": norm("norm1", i),
        "proj_in": lin("ff.net.0.proj", i, i, (None, "mlp")),
        "proj_out": lin("ff.net.2", i, d, ("mlp", "embed")),
        "norm2": norm("norm2", d),
    }
    if cfg.pos_embed_seq_len is not None:
        spec["pos_embed"] = LeafSource(
            (f"{name}.pos_embed",), (1, cfg.pos_embed_seq_len, i), _squeeze_leading, axes=REPLICATED
        )
    return spec


TRANSFORMER = Component(
    "transformer",
    config=TransformerConfig,
    weight_stems=("diffusion_pytorch_model", "model"),
    spec=lambda cfg, names: checkpoint_spec(cfg),
    # diffusers' _keys_to_ignore_on_load_unexpected: an unused query norm some I2V files carry
    ignore=lambda name: name.endswith("attn2.norm_added_q.weight"),
    layouts=(WAN_TRANSFORMER,),
)
# A Wan 2.2 two-expert model's low-noise expert: the same architecture and layout in its own folder.
TRANSFORMER_2 = dataclasses.replace(TRANSFORMER, folder="transformer_2")
