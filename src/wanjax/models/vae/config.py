"""``vae/config.json`` of a Wan 2.1 or Wan 2.2 ``AutoencoderKLWan`` and the layer plan derived from it.

The plan lists the encoder's and decoder's modules in call order, named as in the checkpoint
(``decoder.up_blocks.1.resnets.0`` ...), so the forward code, the checkpoint spec and the causal
cache all walk the same list. The Wan 2.2 VAE (``is_residual``) wraps each level in a residual
block whose parameter-free shortcut (``AvgDown3D`` / ``DupUp3D``) spans the level: a ``skip``
layer marks where the block's input is kept, and a shortcut layer after the level's resampler adds
the shortcut of that input.
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
    # Wan 2.2 configs say False; diffusers 0.42.1 has no such option and always clamps the decoded
    # video to [-1, 1], so the field is read and ignored (wanjax clamps as diffusers does).
    clip_output: bool = True

    @property
    def patch(self) -> int:
        """Side of the pixel patches folded into channels before the encoder (1: none)."""
        return self.patch_size or 1

    @property
    def resampling_factor(self) -> int:
        """Pixels of the encoder's input / decoder's output per latent (2 per down/up-sampling level)."""
        return 2 ** (len(self.dim_mult) - 1)

    @property
    def spatial_factor(self) -> int:
        """Video pixels per latent along H and W: the levels' factor times the patch side."""
        return self.resampling_factor * self.patch

    @property
    def video_channels(self) -> int:
        """Channels of the video encoded (``in_channels`` are those of its patches)."""
        return self.in_channels // self.patch**2

    @property
    def output_channels(self) -> int:
        """Channels of the decoded video (``out_channels`` are those of its patches)."""
        return self.out_channels // self.patch**2

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
        self._validate_patches(source)
        self._validate_shortcuts(source)
        for name, declared, actual in (
            ("scale_factor_spatial", self.scale_factor_spatial, self.spatial_factor),
            ("scale_factor_temporal", self.scale_factor_temporal, self.temporal_factor),
        ):
            if declared is not None and declared != actual:
                raise ConfigError(
                    f"{source}: {name}={declared} but dim_mult/temperal_downsample/patch_size give {actual}"
                )

    def _validate_patches(self, source: str) -> None:
        """``patch_size`` must divide the channels: diffusers' (un)patchify folds ``patch**2`` pixels
        into each of them."""
        if self.patch_size is not None and (isinstance(self.patch_size, bool) or self.patch_size < 1):
            raise ConfigError(
                f"{source}: patch_size must be a positive integer or null, got {self.patch_size!r}"
            )
        area = self.patch**2
        for name, channels in (("in_channels", self.in_channels), ("out_channels", self.out_channels)):
            if channels < 1 or channels % area:
                raise ConfigError(
                    f"{source}: {name}={channels} must be a positive multiple of patch_size**2 = {area}"
                )

    def _validate_shortcuts(self, source: str) -> None:
        """The residual blocks' shortcuts exist only where diffusers can build them: ``AvgDown3D``
        averages whole groups of ``in * factor`` channels, ``DupUp3D`` repeats each channel a whole
        number of times."""
        for layer in (*encoder_plan(self), *decoder_plan(self)):
            if not layer.is_shortcut:
                continue
            factor_t, factor_s = layer.factors
            factor = factor_t * factor_s * factor_s
            if layer.kind.startswith("avg"):
                ok, what = layer.dim_in * factor % layer.dim_out == 0, "in * factor % out"
            else:
                ok, what = layer.dim_out * factor % layer.dim_in == 0, "out * factor % in"
            if not ok:
                raise ConfigError(
                    f"{source}: {layer.name} ({layer.dim_in} -> {layer.dim_out} channels, factor {factor}) "
                    f"needs {what} == 0; the reference cannot build it"
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

Kind = Literal[
    "conv",
    "res",
    "attn",
    "up2d",
    "up3d",
    "up_time",
    "down2d",
    "down3d",
    "head",
    "skip",
    "avg_down3d",
    "avg_down2d",
    "avg_channels",
    "dup_up3d",
    "dup_up2d",
]

# Shortcut layers of the Wan 2.2 residual blocks -> (factor_t, factor_s) of their AvgDown3D / DupUp3D
SHORTCUT_FACTORS: dict[str, tuple[int, int]] = {
    "avg_down3d": (2, 2),
    "avg_down2d": (1, 2),
    "avg_channels": (1, 1),
    "dup_up3d": (2, 2),
    "dup_up2d": (1, 2),
}


@dataclasses.dataclass(frozen=True)
class Layer:
    """One module in call order. ``name`` is its checkpoint prefix (``decoder.up_blocks.0.resnets.1``)."""

    kind: Kind
    name: str
    dim_in: int
    dim_out: int

    @property
    def is_shortcut(self) -> bool:
        """Whether this layer adds a residual block's shortcut (of the input its ``skip`` kept)."""
        return self.kind in SHORTCUT_FACTORS

    @property
    def has_params(self) -> bool:
        """Whether the checkpoint holds weights for this layer (the shortcuts and ``skip`` have none)."""
        return self.kind != "skip" and not self.is_shortcut

    @property
    def factors(self) -> tuple[int, int]:
        """``(factor_t, factor_s)`` of a shortcut layer."""
        return SHORTCUT_FACTORS[self.kind]

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
    layers = [Layer("conv", "decoder.conv_in", cfg.z_dim, dims[0])]
    layers += _mid_block("decoder.mid_block", dims[0])
    for i, (d_in, d_out) in enumerate(itertools.pairwise(dims)):
        block = f"decoder.up_blocks.{i}"
        up = i != len(cfg.dim_mult) - 1
        temporal = up and cfg.temperal_downsample[::-1][i]
        if cfg.is_residual:
            layers += _residual_up_block(block, d_in, d_out, cfg.num_res_blocks, up, temporal)
            continue
        d_in = d_in // 2 if i > 0 else d_in
        layers += _resnets(f"{block}.resnets", d_in, d_out, cfg.num_res_blocks + 1)
        if up:
            layers.append(Layer("up3d" if temporal else "up2d", f"{block}.upsamplers.0", d_out, d_out // 2))
    layers.append(Layer("head", "decoder.conv_out", dims[-1], cfg.out_channels))
    return tuple(layers)


def _residual_up_block(
    block: str, d_in: int, d_out: int, n_res: int, up: bool, temporal: bool
) -> list[Layer]:
    """``WanResidualUpBlock``: resnets, then (if ``up``) the upsampler (``d_out`` channels kept)
    and the ``DupUp3D`` shortcut of the block's input."""
    if not up:
        return _resnets(f"{block}.resnets", d_in, d_out, n_res + 1)
    return [
        Layer("skip", block, d_in, d_in),
        *_resnets(f"{block}.resnets", d_in, d_out, n_res + 1),
        Layer("up3d" if temporal else "up2d", f"{block}.upsampler", d_out, d_out),
        Layer("dup_up3d" if temporal else "dup_up2d", f"{block}.avg_shortcut", d_in, d_out),
    ]


def encoder_plan(cfg: VAEConfig) -> tuple[Layer, ...]:
    """``WanEncoder3d`` in call order; Wan 2.1's ``down_blocks`` is the reference's flat list
    (indices kept), Wan 2.2's one residual block per level."""
    dims = cfg.encoder_dims
    layers = [Layer("conv", "encoder.conv_in", cfg.in_channels, dims[0])]
    index, scale = 0, 1.0
    for i, (d_in, d_out) in enumerate(itertools.pairwise(dims)):
        down = i != len(cfg.dim_mult) - 1
        temporal = down and cfg.temperal_downsample[i]
        if cfg.is_residual:
            layers += _residual_down_block(
                f"encoder.down_blocks.{i}", d_in, d_out, cfg.num_res_blocks, down, temporal
            )
            continue
        for _ in range(cfg.num_res_blocks):
            layers.append(Layer("res", f"encoder.down_blocks.{index}", d_in, d_out))
            index += 1
            if any(math.isclose(scale, s) for s in cfg.attn_scales):
                layers.append(Layer("attn", f"encoder.down_blocks.{index}", d_out, d_out))
                index += 1
            d_in = d_out
        if down:
            layers.append(
                Layer("down3d" if temporal else "down2d", f"encoder.down_blocks.{index}", d_out, d_out)
            )
            index += 1
            scale /= 2.0
    layers += _mid_block("encoder.mid_block", dims[-1])
    layers.append(Layer("head", "encoder.conv_out", dims[-1], 2 * cfg.z_dim))
    return tuple(layers)


def _residual_down_block(
    block: str, d_in: int, d_out: int, n_res: int, down: bool, temporal: bool
) -> list[Layer]:
    """``WanResidualDownBlock``: resnets, the downsampler (if ``down``), plus the ``AvgDown3D``
    shortcut of the block's input (no attention, whatever ``attn_scales`` say)."""
    layers = [Layer("skip", block, d_in, d_in), *_resnets(f"{block}.resnets", d_in, d_out, n_res)]
    if down:
        layers.append(Layer("down3d" if temporal else "down2d", f"{block}.downsampler", d_out, d_out))
    kind = ("avg_down3d" if temporal else "avg_down2d") if down else "avg_channels"
    layers.append(Layer(kind, f"{block}.avg_shortcut", d_in, d_out))
    return layers


def _resnets(prefix: str, d_in: int, d_out: int, count: int) -> list[Layer]:
    """``count`` residual blocks ``prefix.0 ...``, the first ``d_in -> d_out``, the others ``d_out``."""
    return [Layer("res", f"{prefix}.{j}", d_in if j == 0 else d_out, d_out) for j in range(count)]


def _mid_block(name: str, dim: int) -> list[Layer]:
    return [
        Layer("res", f"{name}.resnets.0", dim, dim),
        Layer("attn", f"{name}.attentions.0", dim, dim),
        Layer("res", f"{name}.resnets.1", dim, dim),
    ]
