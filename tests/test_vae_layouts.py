"""The Wan VAEs' original layouts (``wanjax.models.vae.original_layout``) are the exact inverse of
diffusers' original -> diffusers conversions, cover every leaf of wanjax's spec, and a tiny VAE saved
in them loads bit-identically to its diffusers directory."""

from __future__ import annotations

import inspect
import re

import pytest
import torch
from diffusers import AutoencoderKLWan
from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers
from helpers.compare import assert_same_params
from helpers.models import randomize_
from helpers.vae import CONFIGS
from safetensors.torch import save_file

from wanjax.io.key_layouts import KeyLayout, spec_names
from wanjax.models.registry import DEMO_VAE, DEMO_VAE22, WAN21_VAE, WAN22_VAE
from wanjax.models.vae.config import VAEConfig
from wanjax.models.vae.layout import VAE, checkpoint_spec
from wanjax.models.vae.original_layout import WAN21_VAE_LAYOUT, WAN22_VAE_LAYOUT


# Copied from huggingface/diffusers, scripts/convert_wan_to_diffusers.py, `convert_vae_22` (blob at
# commit 58eb52c0803ea9af3abec60841c2a093bdf1f951; last change to the file 2843b3d37ad7): its renaming
# loop as it is, the download before it and the model built after it left out.
def convert_vae_22(old_state_dict):
    new_state_dict = {}

    # Create mappings for specific components
    middle_key_mapping = {
        # Encoder middle block
        "encoder.middle.0.residual.0.gamma": "encoder.mid_block.resnets.0.norm1.gamma",
        "encoder.middle.0.residual.2.bias": "encoder.mid_block.resnets.0.conv1.bias",
        "encoder.middle.0.residual.2.weight": "encoder.mid_block.resnets.0.conv1.weight",
        "encoder.middle.0.residual.3.gamma": "encoder.mid_block.resnets.0.norm2.gamma",
        "encoder.middle.0.residual.6.bias": "encoder.mid_block.resnets.0.conv2.bias",
        "encoder.middle.0.residual.6.weight": "encoder.mid_block.resnets.0.conv2.weight",
        "encoder.middle.2.residual.0.gamma": "encoder.mid_block.resnets.1.norm1.gamma",
        "encoder.middle.2.residual.2.bias": "encoder.mid_block.resnets.1.conv1.bias",
        "encoder.middle.2.residual.2.weight": "encoder.mid_block.resnets.1.conv1.weight",
        "encoder.middle.2.residual.3.gamma": "encoder.mid_block.resnets.1.norm2.gamma",
        "encoder.middle.2.residual.6.bias": "encoder.mid_block.resnets.1.conv2.bias",
        "encoder.middle.2.residual.6.weight": "encoder.mid_block.resnets.1.conv2.weight",
        # Decoder middle block
        "decoder.middle.0.residual.0.gamma": "decoder.mid_block.resnets.0.norm1.gamma",
        "decoder.middle.0.residual.2.bias": "decoder.mid_block.resnets.0.conv1.bias",
        "decoder.middle.0.residual.2.weight": "decoder.mid_block.resnets.0.conv1.weight",
        "decoder.middle.0.residual.3.gamma": "decoder.mid_block.resnets.0.norm2.gamma",
        "decoder.middle.0.residual.6.bias": "decoder.mid_block.resnets.0.conv2.bias",
        "decoder.middle.0.residual.6.weight": "decoder.mid_block.resnets.0.conv2.weight",
        "decoder.middle.2.residual.0.gamma": "decoder.mid_block.resnets.1.norm1.gamma",
        "decoder.middle.2.residual.2.bias": "decoder.mid_block.resnets.1.conv1.bias",
        "decoder.middle.2.residual.2.weight": "decoder.mid_block.resnets.1.conv1.weight",
        "decoder.middle.2.residual.3.gamma": "decoder.mid_block.resnets.1.norm2.gamma",
        "decoder.middle.2.residual.6.bias": "decoder.mid_block.resnets.1.conv2.bias",
        "decoder.middle.2.residual.6.weight": "decoder.mid_block.resnets.1.conv2.weight",
    }

    # Create a mapping for attention blocks
    attention_mapping = {
        # Encoder middle attention
        "encoder.middle.1.norm.gamma": "encoder.mid_block.attentions.0.norm.gamma",
        "encoder.middle.1.to_qkv.weight": "encoder.mid_block.attentions.0.to_qkv.weight",
        "encoder.middle.1.to_qkv.bias": "encoder.mid_block.attentions.0.to_qkv.bias",
        "encoder.middle.1.proj.weight": "encoder.mid_block.attentions.0.proj.weight",
        "encoder.middle.1.proj.bias": "encoder.mid_block.attentions.0.proj.bias",
        # Decoder middle attention
        "decoder.middle.1.norm.gamma": "decoder.mid_block.attentions.0.norm.gamma",
        "decoder.middle.1.to_qkv.weight": "decoder.mid_block.attentions.0.to_qkv.weight",
        "decoder.middle.1.to_qkv.bias": "decoder.mid_block.attentions.0.to_qkv.bias",
        "decoder.middle.1.proj.weight": "decoder.mid_block.attentions.0.proj.weight",
        "decoder.middle.1.proj.bias": "decoder.mid_block.attentions.0.proj.bias",
    }

    # Create a mapping for the head components
    head_mapping = {
        # Encoder head
        "encoder.head.0.gamma": "encoder.norm_out.gamma",
        "encoder.head.2.bias": "encoder.conv_out.bias",
        "encoder.head.2.weight": "encoder.conv_out.weight",
        # Decoder head
        "decoder.head.0.gamma": "decoder.norm_out.gamma",
        "decoder.head.2.bias": "decoder.conv_out.bias",
        "decoder.head.2.weight": "decoder.conv_out.weight",
    }

    # Create a mapping for the quant components
    quant_mapping = {
        "conv1.weight": "quant_conv.weight",
        "conv1.bias": "quant_conv.bias",
        "conv2.weight": "post_quant_conv.weight",
        "conv2.bias": "post_quant_conv.bias",
    }

    # Process each key in the state dict
    for key, value in old_state_dict.items():
        # Handle middle block keys using the mapping
        if key in middle_key_mapping:
            new_key = middle_key_mapping[key]
            new_state_dict[new_key] = value
        # Handle attention blocks using the mapping
        elif key in attention_mapping:
            new_key = attention_mapping[key]
            new_state_dict[new_key] = value
        # Handle head keys using the mapping
        elif key in head_mapping:
            new_key = head_mapping[key]
            new_state_dict[new_key] = value
        # Handle quant keys using the mapping
        elif key in quant_mapping:
            new_key = quant_mapping[key]
            new_state_dict[new_key] = value
        # Handle encoder conv1
        elif key == "encoder.conv1.weight":
            new_state_dict["encoder.conv_in.weight"] = value
        elif key == "encoder.conv1.bias":
            new_state_dict["encoder.conv_in.bias"] = value
        # Handle decoder conv1
        elif key == "decoder.conv1.weight":
            new_state_dict["decoder.conv_in.weight"] = value
        elif key == "decoder.conv1.bias":
            new_state_dict["decoder.conv_in.bias"] = value
        # Handle encoder downsamples
        elif key.startswith("encoder.downsamples."):
            # Change encoder.downsamples to encoder.down_blocks
            new_key = key.replace("encoder.downsamples.", "encoder.down_blocks.")

            # Handle residual blocks - change downsamples to resnets and rename components
            if "residual" in new_key or "shortcut" in new_key:
                # Change the second downsamples to resnets
                new_key = new_key.replace(".downsamples.", ".resnets.")

                # Rename residual components
                if ".residual.0.gamma" in new_key:
                    new_key = new_key.replace(".residual.0.gamma", ".norm1.gamma")
                elif ".residual.2.weight" in new_key:
                    new_key = new_key.replace(".residual.2.weight", ".conv1.weight")
                elif ".residual.2.bias" in new_key:
                    new_key = new_key.replace(".residual.2.bias", ".conv1.bias")
                elif ".residual.3.gamma" in new_key:
                    new_key = new_key.replace(".residual.3.gamma", ".norm2.gamma")
                elif ".residual.6.weight" in new_key:
                    new_key = new_key.replace(".residual.6.weight", ".conv2.weight")
                elif ".residual.6.bias" in new_key:
                    new_key = new_key.replace(".residual.6.bias", ".conv2.bias")
                elif ".shortcut.weight" in new_key:
                    new_key = new_key.replace(".shortcut.weight", ".conv_shortcut.weight")
                elif ".shortcut.bias" in new_key:
                    new_key = new_key.replace(".shortcut.bias", ".conv_shortcut.bias")

            # Handle resample blocks - change downsamples to downsampler and remove index
            elif "resample" in new_key or "time_conv" in new_key:
                # Change the second downsamples to downsampler and remove the index
                parts = new_key.split(".")
                # Find the pattern: encoder.down_blocks.X.downsamples.Y.resample...
                # We want to change it to: encoder.down_blocks.X.downsampler.resample...
                if len(parts) >= 4 and parts[3] == "downsamples":
                    # Remove the index (parts[4]) and change downsamples to downsampler
                    new_parts = parts[:3] + ["downsampler"] + parts[5:]  # noqa: RUF005 (verbatim)
                    new_key = ".".join(new_parts)

            new_state_dict[new_key] = value

        # Handle decoder upsamples
        elif key.startswith("decoder.upsamples."):
            # Change decoder.upsamples to decoder.up_blocks
            new_key = key.replace("decoder.upsamples.", "decoder.up_blocks.")

            # Handle residual blocks - change upsamples to resnets and rename components
            if "residual" in new_key or "shortcut" in new_key:
                # Change the second upsamples to resnets
                new_key = new_key.replace(".upsamples.", ".resnets.")

                # Rename residual components
                if ".residual.0.gamma" in new_key:
                    new_key = new_key.replace(".residual.0.gamma", ".norm1.gamma")
                elif ".residual.2.weight" in new_key:
                    new_key = new_key.replace(".residual.2.weight", ".conv1.weight")
                elif ".residual.2.bias" in new_key:
                    new_key = new_key.replace(".residual.2.bias", ".conv1.bias")
                elif ".residual.3.gamma" in new_key:
                    new_key = new_key.replace(".residual.3.gamma", ".norm2.gamma")
                elif ".residual.6.weight" in new_key:
                    new_key = new_key.replace(".residual.6.weight", ".conv2.weight")
                elif ".residual.6.bias" in new_key:
                    new_key = new_key.replace(".residual.6.bias", ".conv2.bias")
                elif ".shortcut.weight" in new_key:
                    new_key = new_key.replace(".shortcut.weight", ".conv_shortcut.weight")
                elif ".shortcut.bias" in new_key:
                    new_key = new_key.replace(".shortcut.bias", ".conv_shortcut.bias")

            # Handle resample blocks - change upsamples to upsampler and remove index
            elif "resample" in new_key or "time_conv" in new_key:
                # Change the second upsamples to upsampler and remove the index
                parts = new_key.split(".")
                # Find the pattern: encoder.down_blocks.X.downsamples.Y.resample...
                # We want to change it to: encoder.down_blocks.X.downsampler.resample...
                if len(parts) >= 4 and parts[3] == "upsamples":
                    # Remove the index (parts[4]) and change upsamples to upsampler
                    new_parts = parts[:3] + ["upsampler"] + parts[5:]  # noqa: RUF005 (verbatim)
                    new_key = ".".join(new_parts)

            new_state_dict[new_key] = value
        else:
            # Keep other keys unchanged
            new_state_dict[key] = value

    return new_state_dict


def _layout(cfg: VAEConfig) -> KeyLayout:
    return WAN22_VAE_LAYOUT if cfg.is_residual else WAN21_VAE_LAYOUT


def _diffusers_kwargs(cfg: VAEConfig) -> dict:
    """``cfg`` as ``AutoencoderKLWan``'s arguments (diffusers 0.42.1 has no ``clip_output``)."""
    known = inspect.signature(AutoencoderKLWan.__init__).parameters
    return {k: v for k, v in cfg.to_dict().items() if k in known}


CONFIGS_BY_NAME = {"wan21": WAN21_VAE, "wan22": WAN22_VAE, "demo": DEMO_VAE, "demo22": DEMO_VAE22}


@pytest.mark.parametrize("name", list(CONFIGS_BY_NAME))
def test_layout_is_the_inverse_of_diffusers_conversion(name):
    cfg = CONFIGS_BY_NAME[name]
    with torch.device("meta"):
        model = AutoencoderKLWan(**_diffusers_kwargs(cfg))  # names and shapes only
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    layout = _layout(cfg)
    original = {layout.file_name(k): k for k in expected}
    assert len(original) == len(expected)  # injective
    convert = convert_vae_22 if cfg.is_residual else convert_wan_vae_to_diffusers
    assert convert(original) == {k: k for k in expected}  # each tensor back under its own name
    assert spec_names(checkpoint_spec(cfg)) == expected  # the spec covers every leaf, same shapes


def test_wan22_resamplers_follow_their_levels_residual_blocks():
    """The original numbers a level's resampler after its residual blocks (an index diffusers'
    conversion drops, so the round trip above cannot check it)."""
    for side, seq in (("encoder", "downsamples"), ("decoder", "upsamples")):
        levels: dict[str, dict[bool, set[int]]] = {}
        for name in spec_names(checkpoint_spec(WAN22_VAE)):
            m = re.fullmatch(
                rf"{side}\.{seq}\.(\d+)\.{seq}\.(\d+)\.(\w+)\..+", WAN22_VAE_LAYOUT.file_name(name)
            )
            if m:
                levels.setdefault(m[1], {}).setdefault(m[3] in ("resample", "time_conv"), set()).add(
                    int(m[2])
                )
        assert len(levels) == 4
        for level in levels.values():
            assert level.get(True, {len(level[False])}) == {len(level[False])}
            assert level[False] == set(range(len(level[False])))


def _tiny(tmp_path_factory, config: dict, seed: int) -> tuple[AutoencoderKLWan, object, object]:
    """A random tiny VAE saved as ``root/vae`` and as one file in its original layout:
    ``(model, vae directory, file)``."""
    root = tmp_path_factory.mktemp("vae_layout")
    torch.manual_seed(0)
    model = randomize_(AutoencoderKLWan(**config), seed=seed, std=0.2).eval()
    model.save_pretrained(root / "vae")
    cfg = VAEConfig.from_file(root / "vae" / "config.json")
    layout = _layout(cfg)
    renamed = {layout.file_name(k): v.contiguous() for k, v in model.state_dict().items()}
    save_file(renamed, root / "original.safetensors")
    return model, root / "vae", root / "original.safetensors"


WAN21_TINY = CONFIGS["wan_like"]  # the released layout (two res blocks), narrow
WAN22_TINY = dict(
    WAN21_TINY, is_residual=True, patch_size=2, in_channels=12, out_channels=12, scale_factor_spatial=16
)


@pytest.mark.parametrize("config", [WAN21_TINY, WAN22_TINY], ids=["wan21", "wan22"])
def test_original_file_loads_like_the_directory(config, tmp_path_factory):
    _, directory, file = _tiny(tmp_path_factory, config, seed=3)
    cfg = VAE.read_config(directory)
    assert VAE.stored(file, cfg)[1].layout is _layout(cfg)
    _, from_file = VAE.load(file, "float32", config=cfg)
    _, from_dir = VAE.load(directory, "float32")
    assert_same_params(from_file, from_dir)


def test_diffusers_reads_the_wan21_file(tmp_path_factory):
    """The file really is in the layout diffusers' ``from_single_file`` reads."""
    model, directory, file = _tiny(tmp_path_factory, WAN21_TINY, seed=4)
    loaded = AutoencoderKLWan.from_single_file(str(file), config=str(directory))
    expected, got = model.state_dict(), loaded.state_dict()
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in expected)
