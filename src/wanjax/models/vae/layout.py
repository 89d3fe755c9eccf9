"""Checkpoint layout of the Wan 2.1 and 2.2 VAEs: which tensors of ``vae/`` make which params, and how
PyTorch's conv weights become channel-last kernels (NumPy views only); and the component's
:class:`~wanjax.io.component.Component` description."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from wanjax.io.checkpoint import REPLICATED, LeafSource
from wanjax.io.component import Component
from wanjax.models.layers import Params
from wanjax.models.vae.config import Layer, VAEConfig, decoder_plan, encoder_plan
from wanjax.models.vae.original_layout import WAN21_VAE_LAYOUT, WAN22_VAE_LAYOUT

__all__ = ["VAE", "checkpoint_spec"]


def _conv3d_kernel(a: np.ndarray) -> np.ndarray:
    return a.transpose(2, 3, 4, 1, 0)  # (O, I, kt, kh, kw) -> (kt, kh, kw, I, O)


def _conv2d_kernel(a: np.ndarray) -> np.ndarray:
    return a.transpose(2, 3, 1, 0)  # (O, I, kh, kw) -> (kh, kw, I, O)


def _time_kernel(a: np.ndarray) -> np.ndarray:
    return a[:, :, :, 0, 0].transpose(2, 1, 0)  # (O, I, 3, 1, 1) -> (3, I, O)


def _pointwise_kernel(a: np.ndarray) -> np.ndarray:
    return a.reshape(a.shape[0], a.shape[1]).T  # (O, I, 1, 1[, 1]) -> (I, O)


def _vector(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1)  # RMS gamma (C, 1, 1[, 1]) -> (C,)


# The VAE's (small) weights are replicated on every device.
def _conv(name: str, shape: tuple[int, ...], layout: Callable[[np.ndarray], np.ndarray]) -> Params:
    return {
        "kernel": LeafSource((f"{name}.weight",), shape, layout, axes=REPLICATED),
        "bias": LeafSource((f"{name}.bias",), (shape[0],), axes=REPLICATED),
    }


def _gamma(name: str, dim: int, images: bool = False) -> LeafSource:
    return LeafSource((f"{name}.gamma",), (dim, 1, 1) if images else (dim, 1, 1, 1), _vector, axes=REPLICATED)


def _layer_spec(layer: Layer) -> Params:
    name, d_in, d_out = layer.name, layer.dim_in, layer.dim_out
    if layer.kind == "conv":
        return _conv(name, (d_out, d_in, 3, 3, 3), _conv3d_kernel)
    if layer.kind == "res":
        spec = {
            "norm1": _gamma(f"{name}.norm1", d_in),
            "conv1": _conv(f"{name}.conv1", (d_out, d_in, 3, 3, 3), _conv3d_kernel),
            "norm2": _gamma(f"{name}.norm2", d_out),
            "conv2": _conv(f"{name}.conv2", (d_out, d_out, 3, 3, 3), _conv3d_kernel),
        }
        if d_in != d_out:
            spec["conv_shortcut"] = _conv(f"{name}.conv_shortcut", (d_out, d_in, 1, 1, 1), _pointwise_kernel)
        return spec
    if layer.kind == "attn":
        return {
            "norm": _gamma(f"{name}.norm", d_in, images=True),
            "to_qkv": _conv(f"{name}.to_qkv", (3 * d_in, d_in, 1, 1), _pointwise_kernel),
            "proj": _conv(f"{name}.proj", (d_in, d_in, 1, 1), _pointwise_kernel),
        }
    if layer.kind == "head":
        return {
            "norm_out": _gamma(name.replace("conv_out", "norm_out"), d_in),
            "conv_out": _conv(name, (d_out, d_in, 3, 3, 3), _conv3d_kernel),
        }
    spec = {"resample": _conv(f"{name}.resample.1", (d_out, d_in, 3, 3), _conv2d_kernel)}
    if layer.kind == "up3d":
        spec["time_conv"] = _conv(f"{name}.time_conv", (2 * d_in, d_in, 3, 1, 1), _time_kernel)
    elif layer.kind == "down3d":
        spec["time_conv"] = _conv(f"{name}.time_conv", (d_in, d_in, 3, 1, 1), _time_kernel)
    return spec


def checkpoint_spec(cfg: VAEConfig, part: str = "all") -> Params:
    """Spec tree (module name -> params) of the ``decoder`` (+ ``post_quant_conv``), the ``encoder``
    (+ ``quant_conv``), or ``all``. Module names are the checkpoint prefixes; layers without weights
    (the Wan 2.2 residual blocks' shortcuts) have no entry."""
    z = cfg.z_dim
    spec: Params = {}
    if part in ("decoder", "all"):
        spec["post_quant_conv"] = _conv("post_quant_conv", (z, z, 1, 1, 1), _pointwise_kernel)
        spec.update({layer.name: _layer_spec(layer) for layer in decoder_plan(cfg) if layer.has_params})
    if part in ("encoder", "all"):
        spec["quant_conv"] = _conv("quant_conv", (2 * z, 2 * z, 1, 1, 1), _pointwise_kernel)
        spec.update({layer.name: _layer_spec(layer) for layer in encoder_plan(cfg) if layer.has_params})
    return spec


VAE = Component(
    "vae",
    config=VAEConfig,
    weight_stems=("diffusion_pytorch_model", "model"),
    spec=lambda cfg, names: checkpoint_spec(cfg),
    layouts=(WAN21_VAE_LAYOUT, WAN22_VAE_LAYOUT),
)
