"""The encoders' original Wan layouts (:mod:`wanjax.models.encoder_layouts`): every tensor of the Wan
source's ``T5Encoder`` and CLIP ``VisionTransformer`` named with its shape, and a file in each layout
loading as the diffusers folder does and computing what the Wan source computes from it."""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
import pytest
import torch
from helpers.compare import assert_same_params, relative_error
from helpers.models import randomize_
from helpers.text_encoder import CASES, padded_batch, save_text_encoder
from safetensors.torch import load_file, save_file
from transformers import CLIPVisionConfig as HFConfig
from transformers import CLIPVisionModel
from wan_reference_modules import UMT5_XXL_ENCODER, VIT_H_14_VISUAL, T5Encoder, VisionTransformer

from wanjax.io.checkpoint import Index
from wanjax.io.key_layouts import rename_spec, spec_names
from wanjax.io.tensor_views import ReshapedRef, RowsRef
from wanjax.models import umt5
from wanjax.models.clip_vision import (
    IMAGE_ENCODER,
    CLIPVisionConfig,
    checkpoint_spec,
    penultimate_hidden_states,
)
from wanjax.models.encoder_layouts import WAN_CLIP_LAYOUT, WAN_T5_LAYOUT
from wanjax.models.registry import CLIP_VIT_H_14, UMT5_XXL
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
    assert_same_params(file_params, params)


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


# ----------------------------------------------------------------------------------------------
# CLIP vision encoder

# Wan's ViT-H/14 shrunk (exact GELU, patch 14), at 56 px: 17 tokens
TINY_CLIP = dict(
    hidden_size=32,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    patch_size=14,
    image_size=56,
    hidden_act="gelu",
)


def _wan_visual(cfg: CLIPVisionConfig) -> VisionTransformer:
    """The Wan source's ``visual`` of these sizes (``head``: a projection to 16)."""
    return VisionTransformer(
        image_size=cfg.image_size,
        patch_size=cfg.patch_size,
        dim=cfg.hidden_size,
        mlp_ratio=cfg.intermediate_size / cfg.hidden_size,
        out_dim=16,
        num_heads=cfg.num_attention_heads,
        num_layers=cfg.num_hidden_layers,
        activation=cfg.hidden_act,
        norm_eps=cfg.layer_norm_eps,
    )


def test_vit_h_14_names_and_shapes_are_the_wan_sources():
    """Renamed, the spec of the registry's ViT-H/14 (either spelling) reads the state dict of Wan's
    ``clip_xlm_roberta_vit_h_14`` ``visual`` plus the model's ``log_scale``, as Kijai's file holds
    them: each tensor it names is one of them or a view of one, with its shape; the rest (fused
    q/k/v and the embeddings with their batch axes, read through the views; the pooled output's norm
    and projection; the logit scale) are exactly the ones the layout ignores."""
    with torch.device("meta"):
        wan = VisionTransformer(**VIT_H_14_VISUAL)
    stored = {f"visual.{name}": shape for name, shape in _shapes(wan).items()} | {"log_scale": ()}
    viewed = WAN_CLIP_LAYOUT.views({n: jax.ShapeDtypeStruct(s, np.float16) for n, s in stored.items()})
    as_views = {n for n in stored if ".attn.to_qkv." in n} | {"visual.cls_embedding", "visual.pos_embedding"}
    unused = {"visual.head", "visual.post_norm.weight", "visual.post_norm.bias", "log_scale"}
    unread = as_views | unused
    assert unread <= set(stored) and len(as_views) == 2 * VIT_H_14_VISUAL["num_layers"] + 2
    for prefix in ("vision_model.", ""):
        spec = rename_spec(checkpoint_spec(CLIP_VIT_H_14, prefix), WAN_CLIP_LAYOUT)
        assert spec_names(spec) == {n: tuple(ref.shape) for n, ref in viewed.items() if n not in unread}
    assert {n for n in viewed if WAN_CLIP_LAYOUT.ignore(n)} == unread
    assert WAN_CLIP_LAYOUT.ignore("textual.blocks.0.attn.q.weight")  # a whole CLIP's text tower


@pytest.fixture(scope="module")
def wan_clip_file(tmp_path_factory):
    """A tiny CLIPVisionModel saved by transformers, and its tensors in the Wan layout in one
    safetensors file (q/k/v concatenated, the embeddings with their batch axes, a projection and a
    logit scale): ``(model root, file)``."""
    root = tmp_path_factory.mktemp("wan_clip")
    model = randomize_(CLIPVisionModel(HFConfig(**TINY_CLIP)), seed=3).eval()
    model.save_pretrained(root / "image_encoder")
    hf = {n.removeprefix("vision_model."): t for n, t in model.state_dict().items()}
    renamed = {WAN_CLIP_LAYOUT.file_name(n): t for n, t in hf.items() if not n.endswith("position_ids")}
    tensors = {n: t for n, t in renamed.items() if ":" not in n}  # the tensors stored as they are
    for i in range(TINY_CLIP["num_hidden_layers"]):
        for kind in ("weight", "bias"):
            qkv = [hf[f"encoder.layers.{i}.self_attn.{x}_proj.{kind}"] for x in "qkv"]
            tensors[f"visual.transformer.{i}.attn.to_qkv.{kind}"] = torch.cat(qkv)
    tensors["visual.cls_embedding"] = hf["embeddings.class_embedding"].reshape(1, 1, -1)
    tensors["visual.pos_embedding"] = hf["embeddings.position_embedding.weight"][None]
    tensors["visual.head"] = torch.randn(
        TINY_CLIP["hidden_size"], 16, generator=torch.Generator().manual_seed(4)
    )
    tensors["log_scale"] = torch.tensor(math.log(1 / 0.07))
    path = root / "clip_visual.safetensors"
    save_file({name: t.contiguous() for name, t in tensors.items()}, path)
    return root, path


def _visual(path) -> dict[str, torch.Tensor]:
    """The file's ``visual.*`` tensors, unprefixed: the Wan source's ``visual`` state dict."""
    return {n.removeprefix("visual."): t for n, t in load_file(path).items() if n.startswith("visual.")}


def test_wan_clip_file_loads_into_the_wan_source_encoder(wan_clip_file):
    """The file is in the Wan layout: the Wan source's ``visual`` loads it strictly."""
    _, path = wan_clip_file
    assert set(load_file(path)) - {f"visual.{n}" for n in _visual(path)} == {"log_scale"}
    _wan_visual(CLIPVisionConfig(**TINY_CLIP)).load_state_dict(_visual(path), strict=True)


def test_wan_clip_file_params_equal_the_diffusers_folders(wan_clip_file):
    root, path = wan_clip_file
    cfg, params = IMAGE_ENCODER.load(root, "float32")
    assert IMAGE_ENCODER.file_weights(path, cfg).layout is WAN_CLIP_LAYOUT
    assert IMAGE_ENCODER.recognise(path, [("tiny", cfg)])[0] == "tiny"  # every tensor read or ignored
    file_cfg, file_params = IMAGE_ENCODER.load(
        path, "float32", config=IMAGE_ENCODER.read_config(root / "image_encoder")
    )
    assert file_cfg == cfg
    assert_same_params(file_params, params)


def test_wan_source_vision_encoder_matches_wanjax(wan_clip_file):
    """The Wan source's ``visual(x, use_31_block=True)`` (what Wan's ``CLIPModel.visual`` returns: all
    layers but the last, no post-norm) with the file's weights computes wanjax's penultimate hidden
    states from them (q, k and v in that order in ``to_qkv``, each layer's norms and MLP)."""
    _, path = wan_clip_file
    cfg = CLIPVisionConfig(**TINY_CLIP)
    wan = _wan_visual(cfg).eval()
    wan.load_state_dict(_visual(path), strict=True)
    pixels = np.random.default_rng(5).standard_normal((2, 3, cfg.image_size, cfg.image_size), np.float32)
    with torch.no_grad():
        ref = wan(torch.from_numpy(pixels), use_31_block=True).numpy()
    _, params = IMAGE_ENCODER.load(path, "float32", config=cfg)
    out = np.asarray(penultimate_hidden_states(params, cfg, pixels))
    assert out.shape == ref.shape
    assert relative_error(out, ref) <= 1e-5


@dataclasses.dataclass
class _Recording:
    """A stored tensor that records each slice read from it and refuses whole reads."""

    value: np.ndarray
    asked: list[Index] = dataclasses.field(default_factory=list)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)

    @property
    def dtype(self) -> np.dtype:
        return self.value.dtype

    def __getitem__(self, index: Index) -> np.ndarray:
        self.asked.append(index)
        return self.value[index]

    def array(self) -> np.ndarray:
        raise AssertionError("the whole tensor was read")


def test_views_read_only_the_slice_asked():
    fused = _Recording(np.arange(12 * 3, dtype=np.float32).reshape(12, 3))
    k = RowsRef(fused, 4, 8)
    assert k.shape == (4, 3) and k.dtype == np.float32
    assert np.array_equal(k[(slice(1, 3), slice(0, 2))], fused.value[5:7, 0:2])
    assert fused.asked == [(slice(5, 7, 1), slice(0, 2))]
    assert np.array_equal(k.array(), fused.value[4:8])

    pos = _Recording(np.arange(6 * 3, dtype=np.float32).reshape(1, 6, 3))
    squeezed = ReshapedRef(pos, (6, 3))
    assert np.array_equal(squeezed[(slice(2, 4), slice(1, 3))], pos.value[0, 2:4, 1:3])
    assert pos.asked == [(slice(None), slice(2, 4), slice(1, 3))]
