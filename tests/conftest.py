"""Shared fixtures: tiny reference models built with diffusers and saved in the diffusers layout."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest
import torch

torch.set_num_threads(max(1, os.cpu_count() or 1))


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


@pytest.fixture(scope="session")
def tiny_transformer_dir(tmp_path_factory):
    """A tiny diffusers transformer saved to disk, with its torch model."""
    root = tmp_path_factory.mktemp("tiny_dit")
    model = save_transformer(root, seed=0, **TINY_DIT)
    return root, model


@pytest.fixture(scope="module")
def demo_env(tmp_path_factory):
    """WANJAX_CACHE pointing at a fresh folder (one per test module), so the demo model is generated there."""
    cache = tmp_path_factory.mktemp("wanjax_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANJAX_CACHE", str(cache))
        yield cache


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    """A T5-style tokenizer folder as the Wan repos hold it (:func:`test_tokenizer.make_tokenizer_dir`)."""
    from test_tokenizer import make_tokenizer_dir

    return make_tokenizer_dir(tmp_path_factory.mktemp("tok") / "tokenizer")


@pytest.fixture(scope="session")
def tiny_pipeline_dir(tmp_path_factory, tokenizer_dir):
    """A tiny random diffusers WanPipeline (UniPC, CFG) saved in the diffusers layout, shared by the
    parity tests (read-only: a test that writes files puts them elsewhere)."""
    from test_pipeline_parity import build_tiny_pipeline

    root = tmp_path_factory.mktemp("wan_pipeline")
    build_tiny_pipeline(root, tokenizer_dir)
    return root


def noise_file(tmp_path_factory: pytest.TempPathFactory, shape: tuple[int, ...]) -> tuple[torch.Tensor, Path]:
    """Starting noise of ``shape`` as torch draws it (seed 0), and in a safetensors file (key
    ``latents``) for the command line's ``--init_latents``."""
    from safetensors.numpy import save_file

    latents = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    path = tmp_path_factory.mktemp("noise") / "noise.safetensors"
    save_file({"latents": latents.numpy()}, str(path))
    return latents, path
