"""The Wan VAEs' tensor names in the original release's layout (``Wan2.1_VAE.pth``, ComfyUI's
``wan_2.1_vae.safetensors``; ``Wan2.2_VAE.pth``, ComfyUI's ``wan2.2_vae.safetensors``): the inverse of
diffusers' ``convert_wan_vae_to_diffusers`` (Wan 2.1) and of ``convert_vae_22`` in its
``scripts/convert_wan_to_diffusers.py`` (Wan 2.2). The layouts only rename: every tensor keeps its shape.

The original numbers the modules of a decoder level (Wan 2.1: of the whole decoder) in one sequence,
its resampler after its residual blocks; the indices here are those of the released VAEs (two
``num_res_blocks``: the decoder's levels hold three), as diffusers' conversions assume.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from wanjax.io.key_layouts import KeyLayout, Rule, substitutions

__all__ = ["WAN21_VAE_LAYOUT", "WAN22_VAE_LAYOUT"]

_RES_BLOCKS = 2  # num_res_blocks of the released VAEs: the encoder's levels hold 2, the decoder's 3
_RESIDUAL = {  # a residual block's layers: diffusers' name -> the original's
    "norm1": "residual.0",
    "conv1": "residual.2",
    "norm2": "residual.3",
    "conv2": "residual.6",
    "conv_shortcut": "shortcut",
}
_LAYER = r"\.(?P<layer>norm1|conv1|norm2|conv2|conv_shortcut)\.(?P<param>\w+)"


def _resnet(where: Callable[[re.Match[str]], str]) -> Callable[[re.Match[str]], str]:
    """The replacement naming a residual block's tensor: ``where(match)``, then its layer's name."""
    return lambda m: f"{where(m)}.{_RESIDUAL[m['layer']]}.{m['param']}"


def _decoder21(level: int, index: int) -> int:
    """The Wan 2.1 decoder's flat module index of ``index`` within level ``level`` (resnets, then
    the upsampler)."""
    return level * (_RES_BLOCKS + 2) + index


_SHARED: list[Rule] = [
    (r"quant_conv\.(\w+)", r"conv1.\1"),
    (r"post_quant_conv\.(\w+)", r"conv2.\1"),
    (r"(encoder|decoder)\.conv_in\.(\w+)", r"\1.conv1.\2"),
    (r"(encoder|decoder)\.norm_out\.gamma", r"\1.head.0.gamma"),
    (r"(encoder|decoder)\.conv_out\.(\w+)", r"\1.head.2.\2"),
    (r"(encoder|decoder)\.mid_block\.attentions\.0\.(.+)", r"\1.middle.1.\2"),
    (
        r"(?P<side>encoder|decoder)\.mid_block\.resnets\.(?P<j>[01])" + _LAYER,
        _resnet(lambda m: f"{m['side']}.middle.{2 * int(m['j'])}"),
    ),
]

WAN21_VAE_LAYOUT = KeyLayout(
    "Wan 2.1 VAE original",
    substitutions(
        [
            *_SHARED,
            (
                r"encoder\.down_blocks\.(?P<k>\d+)" + _LAYER,
                _resnet(lambda m: f"encoder.downsamples.{m['k']}"),
            ),
            (r"encoder\.down_blocks\.(\d+)\.(.+)", r"encoder.downsamples.\1.\2"),  # resamplers
            (
                r"decoder\.up_blocks\.(?P<i>\d+)\.resnets\.(?P<j>\d+)" + _LAYER,
                _resnet(lambda m: f"decoder.upsamples.{_decoder21(int(m['i']), int(m['j']))}"),
            ),
            (
                r"decoder\.up_blocks\.(\d+)\.upsamplers\.0\.(.+)",
                lambda m: f"decoder.upsamples.{_decoder21(int(m[1]), _RES_BLOCKS + 1)}.{m[2]}",
            ),
        ]
    ),
)

WAN22_VAE_LAYOUT = KeyLayout(
    "Wan 2.2 VAE original",
    substitutions(
        [
            *_SHARED,
            (
                r"encoder\.down_blocks\.(?P<i>\d+)\.resnets\.(?P<j>\d+)" + _LAYER,
                _resnet(lambda m: f"encoder.downsamples.{m['i']}.downsamples.{m['j']}"),
            ),
            (
                r"encoder\.down_blocks\.(\d+)\.downsampler\.(.+)",
                rf"encoder.downsamples.\1.downsamples.{_RES_BLOCKS}.\2",
            ),
            (
                r"decoder\.up_blocks\.(?P<i>\d+)\.resnets\.(?P<j>\d+)" + _LAYER,
                _resnet(lambda m: f"decoder.upsamples.{m['i']}.upsamples.{m['j']}"),
            ),
            (
                r"decoder\.up_blocks\.(\d+)\.upsampler\.(.+)",
                rf"decoder.upsamples.\1.upsamples.{_RES_BLOCKS + 1}.\2",
            ),
        ]
    ),
)
