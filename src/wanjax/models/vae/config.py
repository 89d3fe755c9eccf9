"""``vae/config.json`` of a Wan 2.1 ``AutoencoderKLWan`` and the layer plan derived from it.

The plan lists the encoder's and decoder's modules in call order, named as in the checkpoint
(``decoder.up_blocks.1.resnets.0`` ...), so the forward code, the checkpoint spec and the causal
cache all walk the same list.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Literal

from wanjax.errors import ConfigError
from wanjax.models.config import ComponentConfig

# Wan 2.1 latent statistics (diffusers defaults = the HF checkpoints' values).
WAN21_LATENTS_MEAN = (
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
    0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
)  # fmt: skip
WAN21_LATENTS_STD = (
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
    3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160,
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class VAEConfig(ComponentConfig):
    """``vae/config.json`` of an ``AutoencoderKLWan`` (the field names, typos included, are diffusers')."""

    base_dim: int = 96
    decoder_base_dim: int | None = None
    z_dim: int = 16
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    attn_scales: tuple[float, ...] = ()
    temperal_downsample: tuple[bool, ...] = (False, True, True)
    dropout: float = 0.0  # inference: identity
    latents_mean: tuple[float, ...] = WAN21_LATENTS_MEAN
    latents_std: tuple[float, ...] = WAN21_LATENTS_STD
    is_residual: bool = False
    in_channels: int = 3
    out_channels: int = 3
    patch_size: int | None = None
    scale_factor_temporal: int | None = 4
    scale_factor_spatial: int | None = 8
    clip_output: bool = True  # Wan 2.2 configs carry it; diffusers 0.42 always clamps

    @property
    def spatial_factor(self) -> int:
        """Pixels per latent along H and W (2 per down/up-sampling level)."""
        return 2 ** (len(self.dim_mult) - 1)

    @property
    def temporal_factor(self) -> int:
        """Video frames per latent frame after the first (2 per temporal level)."""
        return 2 ** sum(bool(t) for t in self.temperal_downsample)

    def num_frames(self, latent_frames: int) -> int:
        """Decoded frames for ``latent_frames`` latent frames: ``1 + r (T' - 1)``."""
        return 1 + self.temporal_factor * (latent_frames - 1)

    def latent_frames(self, num_frames: int) -> int:
        """Latent frames encoded from ``num_frames`` (the reference drops an incomplete last group)."""
        return 1 + ((num_frames - 1) // 4) * 4 // self.temporal_factor

    def validate(self, source: str) -> None:
        if self.is_residual:
            raise ConfigError(f"{source}: is_residual=True is the Wan 2.2 VAE; wanjax runs the Wan 2.1 VAE")
        if self.patch_size is not None:
            raise ConfigError(
                f"{source}: patch_size={self.patch_size} is the Wan 2.2 VAE; wanjax runs the Wan 2.1 VAE"
            )
        if not self.clip_output:
            raise ConfigError(
                f"{source}: clip_output=False (Wan 2.2) is not supported; the Wan 2.1 VAE clamps"
            )
        levels = len(self.dim_mult)
        if levels < 1 or min(self.dim_mult) < 1 or self.base_dim < 1 or self.z_dim < 1:
            raise ConfigError(f"{source}: base_dim, z_dim and dim_mult entries must be positive")
        if (self.decoder_base_dim or self.base_dim) < 1 or self.num_res_blocks < 0:
            raise ConfigError(f"{source}: decoder_base_dim must be positive and num_res_blocks >= 0")
        if len(self.temperal_downsample) != levels - 1:
            raise ConfigError(
                f"{source}: temperal_downsample needs len(dim_mult) - 1 = {levels - 1} entries, "
                f"got {len(self.temperal_downsample)}"
            )
        if self.temporal_factor > 4:
            raise ConfigError(
                f"{source}: {sum(self.temperal_downsample)} temporal downsamplings; the reference encodes "
                "groups of 4 frames, so at most 2 are supported"
            )
        if len(self.latents_mean) != self.z_dim or len(self.latents_std) != self.z_dim:
            raise ConfigError(f"{source}: latents_mean and latents_std need z_dim = {self.z_dim} entries")
        if any(s == 0 for s in self.latents_std):
            raise ConfigError(f"{source}: latents_std has a zero entry")
        for name, declared, actual in (
            ("scale_factor_spatial", self.scale_factor_spatial, self.spatial_factor),
            ("scale_factor_temporal", self.scale_factor_temporal, self.temporal_factor),
        ):
            if declared is not None and declared != actual:
                raise ConfigError(
                    f"{source}: {name}={declared} but dim_mult/temperal_downsample give {actual}"
                )

    @property
    def encoder_dims(self) -> tuple[int, ...]:
        return tuple(self.base_dim * m for m in (1, *self.dim_mult))

    @property
    def decoder_dims(self) -> tuple[int, ...]:
        base = self.decoder_base_dim or self.base_dim
        return tuple(base * m for m in (self.dim_mult[-1], *self.dim_mult[::-1]))


# ----------------------------------------------------------------------------------------------
# Layer plans

Kind = Literal["conv", "res", "attn", "up2d", "up3d", "up_time", "down2d", "down3d", "head"]


@dataclasses.dataclass(frozen=True)
class Layer:
    """One module in call order. ``name`` is its checkpoint prefix (``decoder.up_blocks.0.resnets.1``)."""

    kind: Kind
    name: str
    dim_in: int
    dim_out: int

    @property
    def cache_sites(self) -> tuple[str, ...]:
        """Names of this layer's causal-cache entries (the reference's ``feat_cache`` slots)."""
        if self.kind in ("conv", "head"):
            return (self.name,)
        if self.kind == "res":
            return (f"{self.name}.conv1", f"{self.name}.conv2")
        if self.kind in ("up3d", "up_time", "down3d"):
            return (f"{self.name}.time_conv",)
        return ()


def decoder_plan(cfg: VAEConfig) -> tuple[Layer, ...]:
    """``WanDecoder3d`` in call order (``conv_in`` ... ``norm_out + conv_out`` as one ``head``)."""
    dims = cfg.decoder_dims
    upsample = cfg.temperal_downsample[::-1]
    layers = [Layer("conv", "decoder.conv_in", cfg.z_dim, dims[0])]
    layers += _mid_block("decoder.mid_block", dims[0])
    for i, (d_in, d_out) in enumerate(itertools.pairwise(dims)):
        d_in = d_in // 2 if i > 0 else d_in
        for j in range(cfg.num_res_blocks + 1):
            layers.append(Layer("res", f"decoder.up_blocks.{i}.resnets.{j}", d_in, d_out))
            d_in = d_out
        if i != len(cfg.dim_mult) - 1:
            kind = "up3d" if upsample[i] else "up2d"
            layers.append(Layer(kind, f"decoder.up_blocks.{i}.upsamplers.0", d_out, d_out // 2))
    layers.append(Layer("head", "decoder.conv_out", dims[-1], cfg.out_channels))
    return tuple(layers)


def encoder_plan(cfg: VAEConfig) -> tuple[Layer, ...]:
    """``WanEncoder3d`` in call order; ``down_blocks`` is the reference's flat list (indices kept)."""
    dims = cfg.encoder_dims
    layers = [Layer("conv", "encoder.conv_in", cfg.in_channels, dims[0])]
    index, scale = 0, 1.0
    for i, (d_in, d_out) in enumerate(itertools.pairwise(dims)):
        for _ in range(cfg.num_res_blocks):
            layers.append(Layer("res", f"encoder.down_blocks.{index}", d_in, d_out))
            index += 1
            if any(math.isclose(scale, s) for s in cfg.attn_scales):
                layers.append(Layer("attn", f"encoder.down_blocks.{index}", d_out, d_out))
                index += 1
            d_in = d_out
        if i != len(cfg.dim_mult) - 1:
            kind = "down3d" if cfg.temperal_downsample[i] else "down2d"
            layers.append(Layer(kind, f"encoder.down_blocks.{index}", d_out, d_out))
            index += 1
            scale /= 2.0
    layers += _mid_block("encoder.mid_block", dims[-1])
    layers.append(Layer("head", "encoder.conv_out", dims[-1], 2 * cfg.z_dim))
    return tuple(layers)


def _mid_block(name: str, dim: int) -> list[Layer]:
    return [
        Layer("res", f"{name}.resnets.0", dim, dim),
        Layer("attn", f"{name}.attentions.0", dim, dim),
        Layer("res", f"{name}.resnets.1", dim, dim),
    ]
