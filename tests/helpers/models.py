"""Tiny random diffusers models: random weights, the shared tiny DiT, starting noise."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


def randomize_(module: torch.nn.Module, seed: int, std: float = 0.3) -> torch.nn.Module:
    """Give every parameter random values (norm weights and modulation tables included)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * std)
    return module


def save_transformer(root, seed: int = 0, max_shard_size: str | None = None, **config):
    """Build a random WanTransformer3DModel, save it under ``root/transformer``; return the torch model."""
    from diffusers import WanTransformer3DModel

    model = randomize_(WanTransformer3DModel(**config), seed).eval()
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(root / "transformer", **kwargs)
    return model


# The one tiny DiT of the tests (diffusers WanTransformer3DModel arguments); variants override fields.
TINY_DIT = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=2,
    attention_head_dim=12,
    in_channels=16,
    out_channels=16,
    text_dim=32,
    freq_dim=16,
    ffn_dim=32,
    num_layers=2,
    rope_max_seq_len=32,
)


def noise_file(tmp_path_factory: pytest.TempPathFactory, shape: tuple[int, ...]) -> tuple[torch.Tensor, Path]:
    """Starting noise of ``shape`` as torch draws it (seed 0), and in a safetensors file (key
    ``latents``) for the command line's ``--init_latents``."""
    from safetensors.numpy import save_file

    latents = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    path = tmp_path_factory.mktemp("noise") / "noise.safetensors"
    save_file({"latents": latents.numpy()}, str(path))
    return latents, path


def original_state(model: torch.nn.Module, prefix: str = "") -> dict:
    """A diffusers transformer's tensors under the original Wan names (float32 NumPy)."""
    from wanjax.models.dit_layouts import WAN_TRANSFORMER

    return {prefix + WAN_TRANSFORMER.file_name(k): v.float().numpy() for k, v in model.state_dict().items()}


def original_animate_state(state: dict, prefix: str = "") -> dict:
    """A diffusers ``WanAnimateTransformer3DModel``'s tensors (float32 NumPy, by name) as the authors'
    files hold them, written out independently of wanjax's layout: the DiT's original names, the
    motion encoder's ``enc.net_app.convs`` stack with ``(1, C, 1, 1)`` activation biases, the face
    adapters' fused ``linear1_kv`` (the inverse of diffusers' ``convert_wan_transformer_to_diffusers``)."""
    import re

    import numpy as np

    from wanjax.models.dit_layouts import WAN_TRANSFORMER

    app = "motion_encoder.enc.net_app.convs"
    blocks = 1 + max(
        int(m.group(1)) for k in state if (m := re.match(r"motion_encoder\.res_blocks\.(\d+)", k))
    )
    out: dict = {}
    for name, value in state.items():
        m = re.fullmatch(
            r"motion_encoder\.res_blocks\.(\d+)\.(conv1|conv2|conv_skip)\.(weight|act_fn\.bias)", name
        )
        if m:
            i, conv, what = int(m.group(1)) + 1, m.group(2), m.group(3)
            part = {("conv1", "weight"): "conv1.0.weight", ("conv1", "act_fn.bias"): "conv1.1.bias",
                    ("conv2", "weight"): "conv2.1.weight", ("conv2", "act_fn.bias"): "conv2.2.bias",
                    ("conv_skip", "weight"): "skip.1.weight"}[conv, what]  # fmt: skip
            out[f"{app}.{i}.{part}"] = value.reshape(1, -1, 1, 1) if "bias" in part else value
            continue
        m = re.fullmatch(r"face_adapter\.(\d+)\.(to_q|to_k|to_v|to_out|norm_q|norm_k)\.(weight|bias)", name)
        if m:
            i, part, what = m.groups()
            if part == "to_v":
                continue
            if part == "to_k":
                fused = np.concatenate([value, state[f"face_adapter.{i}.to_v.{what}"]])
                out[f"face_adapter.fuser_blocks.{i}.linear1_kv.{what}"] = fused
                continue
            new = {"to_q": "linear1_q", "to_out": "linear2", "norm_q": "q_norm", "norm_k": "k_norm"}[part]
            out[f"face_adapter.fuser_blocks.{i}.{new}.{what}"] = value
            continue
        fixed = {
            "motion_encoder.conv_in.weight": f"{app}.0.0.weight",
            "motion_encoder.conv_in.act_fn.bias": f"{app}.0.1.bias",
            "motion_encoder.conv_out.weight": f"{app}.{blocks + 1}.weight",
            "motion_encoder.motion_synthesis_weight": "motion_encoder.dec.direction.weight",
        }
        if name in fixed:
            out[fixed[name]] = value.reshape(1, -1, 1, 1) if name.endswith("bias") else value
        elif name.startswith("motion_encoder.motion_network."):
            out[name.replace("motion_network", "enc.fc")] = value
        elif re.match(r"face_encoder\.(conv1_local|conv2|conv3)\.", name):
            out[re.sub(r"^face_encoder\.(\w+)\.", r"face_encoder.\1.conv.", name)] = value
        else:
            out[WAN_TRANSFORMER.file_name(name)] = value
    return {prefix + k: v for k, v in out.items()}
