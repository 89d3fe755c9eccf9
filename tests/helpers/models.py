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
