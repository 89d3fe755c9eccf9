"""The text encoder's original Wan layout (:mod:`wanjax.models.encoder_layouts`): every tensor of the
Wan source's ``T5Encoder`` named with its shape, and a file in that layout loading as the diffusers
folder does."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
from helpers.compare import relative_error
from helpers.text_encoder import CASES, padded_batch, save_text_encoder
from safetensors.torch import load_file, save_file
from wan_reference_modules import UMT5_XXL_ENCODER, T5Encoder

from wanjax.io.key_layouts import rename_spec, spec_names
from wanjax.models import umt5
from wanjax.models.encoder_layouts import WAN_T5_LAYOUT
from wanjax.models.registry import UMT5_XXL
from wanjax.models.umt5 import TEXT_ENCODER, UMT5Config

TINY = CASES[1][1]  # inner dim 48 != d_model 24; transformers' bucket defaults, which Wan hard-codes


def _shapes(module: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {name: tuple(t.shape) for name, t in module.state_dict().items()}


def _wan_encoder(cfg: UMT5Config, **kwargs: object) -> T5Encoder:
    return T5Encoder(
        vocab=cfg.vocab_size,
        dim=cfg.d_model,
        dim_attn=cfg.inner_dim,
        dim_ffn=cfg.d_ff,
        num_heads=cfg.num_heads,
        num_layers=cfg.num_layers,
        num_buckets=cfg.relative_attention_num_buckets,
        shared_pos=False,
        **kwargs,
    )


def test_umt5_xxl_names_and_shapes_are_the_wan_sources():
    """Renamed, the spec of the registry's UMT5-XXL is the state dict of Wan's ``umt5_xxl`` encoder:
    the same names, each with its shape (the tied embedding, both of its names, is one table)."""
    with torch.device("meta"):
        wan = T5Encoder(**UMT5_XXL_ENCODER)
    for stored in ({"shared.weight"}, {"encoder.embed_tokens.weight"}):
        spec = rename_spec(TEXT_ENCODER.checkpoint_spec(UMT5_XXL, stored), WAN_T5_LAYOUT)
        assert spec_names(spec) == _shapes(wan)


@pytest.fixture(scope="module")
def wan_file(tmp_path_factory):
    """A tiny UMT5EncoderModel saved by transformers, and its state dict renamed to the Wan layout in
    one safetensors file: ``(model root, file)``."""
    root = tmp_path_factory.mktemp("wan_t5")
    model = save_text_encoder(root, seed=7, **TINY)
    tensors = {WAN_T5_LAYOUT.file_name(name): t for name, t in model.state_dict().items()}
    assert len(tensors) == len(model.state_dict()) - 1  # shared.weight and embed_tokens: one table
    path = root / "umt5-xxl-enc.safetensors"
    save_file({name: t.contiguous() for name, t in tensors.items()}, path)
    return root, path


def test_wan_file_loads_into_the_wan_source_encoder(wan_file):
    """The file is in the Wan layout: the Wan source's encoder loads it strictly."""
    _, path = wan_file
    _wan_encoder(UMT5Config(**TINY)).load_state_dict(load_file(path), strict=True)


def test_wan_file_params_equal_the_diffusers_folders(wan_file):
    root, path = wan_file
    cfg, params = TEXT_ENCODER.load(root, "float32")
    assert TEXT_ENCODER.file_weights(path, cfg).layout is WAN_T5_LAYOUT
    file_cfg, file_params = TEXT_ENCODER.load(
        path, "float32", config=TEXT_ENCODER.read_config(root / "text_encoder")
    )
    assert file_cfg == cfg
    assert jax.tree.structure(file_params) == jax.tree.structure(params)
    for ours, ref in zip(jax.tree.leaves(file_params), jax.tree.leaves(params), strict=True):
        assert ours.dtype == ref.dtype and np.array_equal(np.asarray(ours), np.asarray(ref))


def test_wan_source_encoder_matches_wanjax(wan_file):
    """The Wan source's encoder with the file's weights computes what wanjax computes from them (the
    names mean the same tensors: the gated GELU branch, the linear one, each layer's position table)."""
    _, path = wan_file
    cfg = UMT5Config(**TINY)
    wan = _wan_encoder(cfg, dropout=0.0).eval()
    wan.load_state_dict(load_file(path), strict=True)
    ids, mask = padded_batch((20, 9), 20, cfg.vocab_size, seed=8)
    with torch.no_grad():
        ref = wan(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    _, params = TEXT_ENCODER.load(path, "float32", config=cfg)
    out = np.asarray(umt5.forward(params, cfg, ids, mask))
    valid = mask.astype(bool)
    assert relative_error(out[valid], ref[valid]) <= 1e-5
