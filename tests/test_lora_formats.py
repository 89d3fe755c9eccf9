"""LoRA files: every Wan layout diffusers loads is read, and each module's delta equals the one diffusers
fuses into a WanTransformer3DModel (``load_lora_weights`` + ``fuse_lora``); unreadable files are one-line
CheckpointErrors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers.lora import WAN_BLOCK, WAN_I2V, _Pipe, add_factors, peft_transformer, rand, wan_original
from helpers.models import TINY_DIT
from safetensors import safe_open
from safetensors.torch import save_file

from wanjax.errors import CheckpointError
from wanjax.io.lora import LoraFile, describe, read_lora

pytest.importorskip("peft")

from diffusers import WanTransformer3DModel
from diffusers.loaders import WanLoraLoaderMixin
from peft import LoraConfig
from peft.utils import get_peft_model_state_dict

I2V = dict(TINY_DIT, image_dim=20, added_kv_proj_dim=24)


def diffusers_deltas(path, config=TINY_DIT, prefix="transformer") -> dict[str, dict[str, np.ndarray]]:
    """``{module: {"weight": delta, "bias": delta}}``: what diffusers' fuse_lora changes in a transformer.

    ``prefix="transformer"`` loads as a Wan pipeline does; None as ``load_lora_adapter(prefix=None)``
    (files written by ``save_lora_adapter``)."""
    torch.manual_seed(0)
    model = WanTransformer3DModel(**config).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    if prefix == "transformer":
        _Pipe(model).load_lora_weights(str(path))
    else:
        # use_safetensors=True: without it load_lora_adapter reads the file without its metadata
        model.load_lora_adapter(str(path), prefix=prefix, use_safetensors=True)
    model.fuse_lora()
    model.unload_lora()  # fused weights stay; the LoRA layers go, so names match ``before``
    after = model.state_dict()
    assert after.keys() == before.keys()
    deltas: dict[str, dict[str, np.ndarray]] = {}
    for name, value in before.items():
        change = (after[name] - value).numpy()
        if np.any(change != 0):
            module, kind = name.rsplit(".", 1)
            deltas.setdefault(module, {})[kind] = change
    return deltas


def assert_matches_diffusers(lora: LoraFile, expected: dict[str, dict[str, np.ndarray]]) -> None:
    ours = {}
    for module, update in lora.updates.items():
        parts = {"weight": update.delta(), "bias": update.bias_delta()}
        ours[module] = {k: v for k, v in parts.items() if v is not None}
    assert sorted(ours) == sorted(expected)
    for module, parts in expected.items():
        assert sorted(ours[module]) == sorted(parts), module
        for kind, value in parts.items():
            got = ours[module][kind]
            assert got.dtype == np.float32 and got.shape == value.shape, (module, kind)
            np.testing.assert_allclose(got, value, rtol=1e-6, atol=1e-6, err_msg=f"{module}.{kind}")


def one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


# ----------------------------------------------------------------------------------------------
# diffusers / PEFT files


def test_diffusers_save_lora_adapter(tmp_path):
    """Unprefixed keys and metadata (save_lora_adapter), with rank/alpha patterns: scale = alpha / r per module."""
    config = LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=["to_q", "to_k", "to_v", "to_out.0", "net.0.proj", "net.2", "proj_out", "time_proj"],
        rank_pattern={"ffn.net.2": 2},
        alpha_pattern={"to_out.0": 3},
    )
    peft_transformer(config).save_lora_adapter(tmp_path)
    path = tmp_path / "pytorch_lora_weights.safetensors"
    lora = read_lora(path)
    assert lora.format == "diffusers"
    assert lora.ranks == {2, 4} and lora.alphas == {3.0, 8.0}
    assert lora.updates["blocks.0.attn1.to_q"].scale == 2.0
    assert lora.updates["blocks.1.ffn.net.2"].scale == 4.0
    assert lora.updates["blocks.1.attn2.to_out.0"].scale == 0.75
    assert_matches_diffusers(lora, diffusers_deltas(path, prefix=None))
    assert (
        read_lora(tmp_path).targets() == lora.targets()
    )  # a directory: its pytorch_lora_weights.safetensors


@pytest.mark.filterwarnings(
    "ignore:Adapter 'default'.*invalid shape"
)  # PEFT on lora_B.bias: not a sharding issue
def test_diffusers_pipeline_file_with_bias_rslora_and_text_encoder_keys(tmp_path):
    """WanPipeline.save_lora_weights: "transformer."-prefixed keys and metadata; lora_B.bias; rsLoRA.
    Keys of other components are ignored, as Wan's load_lora_weights loads only the transformer."""
    config = LoraConfig(
        r=4, lora_alpha=6, target_modules=["to_q", "to_v", "net.0.proj"], lora_bias=True, use_rslora=True
    )
    model = peft_transformer(config)
    WanLoraLoaderMixin.save_lora_weights(
        tmp_path,
        transformer_lora_layers=get_peft_model_state_dict(model),
        transformer_lora_adapter_metadata=model.peft_config["default"].to_dict(),
    )
    path = tmp_path / "pytorch_lora_weights.safetensors"
    with safe_open(path, framework="pt") as f:
        tensors, metadata = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()  # noqa: SIM118
    assert json.loads(metadata["lora_adapter_metadata"])["transformer.use_rslora"] is True
    tensors["text_encoder.encoder.block.0.layer.0.SelfAttention.q.lora_A.weight"] = torch.ones(4, 32)
    save_file(tensors, path, metadata=metadata)
    lora = read_lora(path)
    assert lora.format == "diffusers"
    assert lora.ignored == ("text_encoder.encoder.block.0.layer.0.SelfAttention.q.lora_A.weight",)
    assert lora.updates["blocks.0.attn1.to_q"].scale == 3.0  # 6 / sqrt(4)
    assert lora.updates["blocks.0.attn1.to_q"].diff_b is not None
    assert_matches_diffusers(lora, diffusers_deltas(path))


def test_diffusers_keys_without_metadata(tmp_path):
    """Hand-made PEFT keys, mixed ranks, no config: diffusers uses alpha = rank (scale 1) everywhere."""
    gen = torch.Generator().manual_seed(4)
    sd = {}
    for i in range(2):
        for module, shape in (
            ("attn1.to_q", (24, 24)),
            ("attn2.to_k", (24, 24)),
            ("ffn.net.0.proj", (32, 24)),
        ):
            add_factors(
                sd, gen, f"transformer.blocks.{i}.{module}", shape, 2 + 2 * i, names=("lora_A", "lora_B")
            )
    add_factors(
        sd,
        gen,
        "transformer.condition_embedder.text_embedder.linear_1",
        (24, 32),
        3,
        names=("lora_A", "lora_B"),
    )
    save_file(sd, tmp_path / "lora.safetensors")
    lora = read_lora(tmp_path / "lora.safetensors")
    assert lora.format == "diffusers" and lora.ranks == {2, 3, 4} and lora.alphas is None
    assert {u.scale for u in lora.updates.values()} == {1.0}
    assert_matches_diffusers(lora, diffusers_deltas(tmp_path / "lora.safetensors"))


def test_dora_refused(tmp_path):
    model = peft_transformer(LoraConfig(r=4, lora_alpha=4, target_modules=["to_q"], use_dora=True))
    model.save_lora_adapter(tmp_path)
    with pytest.raises(CheckpointError, match="DoRA") as excinfo:
        read_lora(tmp_path / "pytorch_lora_weights.safetensors")
    one_line(excinfo)


# ----------------------------------------------------------------------------------------------
# Original Wan names (kohya-style), LightX2V, musubi-tuner


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_wan_original_kohya(tmp_path, dtype):
    sd = wan_original(torch.Generator().manual_seed(5), dtype=dtype)
    save_file(sd, tmp_path / "lora.safetensors")
    lora = read_lora(tmp_path / "lora.safetensors")
    assert lora.format == "wan-original"
    assert lora.ranks == {4, 8} and lora.alphas == {1.0, 12.0}
    assert {u.scale for u in lora.updates.values()} == {
        1.0
    }  # alpha folded into the factors, as diffusers does
    assert "condition_embedder.time_embedder.linear_2" in lora.updates and "proj_out" in lora.updates
    assert_matches_diffusers(lora, diffusers_deltas(tmp_path / "lora.safetensors"))


def test_wan_original_lora_a_b_names_i2v(tmp_path):
    sd = wan_original(torch.Generator().manual_seed(6), names=("lora_A", "lora_B"), i2v=True)
    save_file(sd, tmp_path / "lora.safetensors")
    lora = read_lora(tmp_path / "lora.safetensors")
    assert lora.format == "wan-original"
    assert {"blocks.1.attn2.add_k_proj", "condition_embedder.image_embedder.ff.net.2"} <= set(lora.updates)
    assert_matches_diffusers(lora, diffusers_deltas(tmp_path / "lora.safetensors", config=I2V))


def test_lightx2v_diff_keys(tmp_path):
    """diff_b kept as bias deltas; head.head.diff applied; other .diff keys (norms, modulation, linear
    layers, patch embedding) dropped, as diffusers drops them."""
    gen = torch.Generator().manual_seed(7)
    sd = {}
    for i in range(2):
        for module, (out, inp) in WAN_BLOCK.items():
            key = f"diffusion_model.blocks.{i}.{module}"
            add_factors(sd, gen, key, (out, inp), 4, alpha=4.0)
            sd[f"{key}.diff_b"] = rand(gen, out)
        sd[f"diffusion_model.blocks.{i}.self_attn.q.diff"] = rand(gen, 24, 24)
        sd[f"diffusion_model.blocks.{i}.norm3.diff"] = rand(gen, 24)
        sd[f"diffusion_model.blocks.{i}.norm3.diff_b"] = rand(gen, 24)
        sd[f"diffusion_model.blocks.{i}.cross_attn.norm_k.diff"] = rand(gen, 24)
        sd[f"diffusion_model.blocks.{i}.diff_m"] = rand(gen, 1, 6, 24)
    sd["diffusion_model.head.head.diff"] = rand(gen, 64, 24)
    sd["diffusion_model.head.head.diff_b"] = rand(gen, 64)
    sd["diffusion_model.head.modulation.diff"] = rand(gen, 1, 2, 24)
    add_factors(sd, gen, "diffusion_model.time_projection.1", (144, 24), 4)
    sd["diffusion_model.time_projection.1.diff_b"] = rand(gen, 144)
    add_factors(sd, gen, "diffusion_model.text_embedding.0", (24, 32), 4)
    sd["diffusion_model.text_embedding.0.diff_b"] = rand(gen, 24)
    sd["diffusion_model.text_embedding.0.diff"] = rand(gen, 24, 32)
    sd["diffusion_model.patch_embedding.diff"] = rand(gen, 24, 16, 1, 2, 2)
    save_file(sd, tmp_path / "lora.safetensors")

    lora = read_lora(tmp_path / "lora.safetensors")
    assert lora.format == "lightx2v"
    assert lora.updates["proj_out"].diff is not None and lora.updates["proj_out"].down is None
    assert {
        "blocks.0.norm3.diff",
        "blocks.1.diff_m",
        "blocks.0.self_attn.q.diff",
        "patch_embedding.diff",
    } <= set(lora.ignored)
    assert "head.head.diff" not in lora.ignored
    info = describe(lora)
    assert info["diff"] and info["diff_b"] and info["targets"]["attn1.to_q"] == 2
    assert_matches_diffusers(lora, diffusers_deltas(tmp_path / "lora.safetensors"))


def test_time_projection_bias_without_weights_dropped(tmp_path):
    """AccVideo-style: time_projection diff_b with no LoRA weights there; diffusers drops it."""
    gen = torch.Generator().manual_seed(8)
    sd = {}
    add_factors(sd, gen, "diffusion_model.blocks.0.self_attn.q", (24, 24), 4)
    sd["diffusion_model.time_projection.1.diff_b"] = rand(gen, 144)
    save_file(sd, tmp_path / "lora.safetensors")
    lora = read_lora(tmp_path / "lora.safetensors")
    assert lora.format == "lightx2v" and lora.targets() == ["blocks.0.attn1.to_q"]
    assert lora.ignored == ("time_projection.1.diff_b",)
    assert_matches_diffusers(lora, diffusers_deltas(tmp_path / "lora.safetensors"))


def test_bias_only_module(tmp_path):
    """A diff_b with no LoRA factors on its module: diffusers changes only that module's bias."""
    gen = torch.Generator().manual_seed(13)
    sd = {}
    add_factors(sd, gen, "diffusion_model.blocks.0.self_attn.q", (24, 24), 4)
    sd["diffusion_model.blocks.0.self_attn.q.diff_b"] = rand(gen, 24)
    sd["diffusion_model.blocks.1.ffn.2.diff_b"] = rand(gen, 24)
    save_file(sd, tmp_path / "lora.safetensors")
    lora = read_lora(tmp_path / "lora.safetensors")
    assert lora.updates["blocks.1.ffn.net.2"].delta() is None
    assert_matches_diffusers(lora, diffusers_deltas(tmp_path / "lora.safetensors"))


@pytest.mark.parametrize("i2v", [False, True])
def test_musubi(tmp_path, i2v):
    gen = torch.Generator().manual_seed(9)
    sd = {}
    for i in range(2):
        for module, shape in {**WAN_BLOCK, **(WAN_I2V if i2v else {})}.items():
            add_factors(sd, gen, f"lora_unet_blocks_{i}_{module.replace('.', '_')}", shape, 4, alpha=1.0 + i)
    save_file(sd, tmp_path / "lora.safetensors")
    lora = read_lora(tmp_path / "lora.safetensors")
    assert lora.format == "musubi" and lora.ranks == {4} and lora.alphas == {1.0, 2.0}
    assert len(lora.updates) == 2 * (12 if i2v else 10)
    assert_matches_diffusers(
        lora, diffusers_deltas(tmp_path / "lora.safetensors", config=I2V if i2v else TINY_DIT)
    )

    del sd["lora_unet_blocks_1_ffn_2.alpha"]
    save_file(sd, tmp_path / "partial.safetensors")
    with pytest.raises(CheckpointError, match=r"lora_unet_blocks_1_ffn_2\.alpha missing") as excinfo:
        read_lora(tmp_path / "partial.safetensors")
    one_line(excinfo)


def test_describe(tmp_path):
    save_file(wan_original(torch.Generator().manual_seed(10)), tmp_path / "lora.safetensors")
    info = describe(read_lora(tmp_path / "lora.safetensors"))
    assert info["format"] == "wan-original" and info["ranks"] == [4, 8] and info["alphas"] == [1.0, 12.0]
    assert info["modules"] == 2 * 10 + 6
    assert info["targets"]["attn1.to_q"] == 2 and info["targets"]["proj_out"] == 1
    assert info["diff"] is False and info["diff_b"] is False
    json.dumps(info)


# ----------------------------------------------------------------------------------------------
# Files that are not readable LoRAs


def test_pickle_refused(tmp_path):
    torch.save({"blocks.0.attn1.to_q.lora_A.weight": torch.ones(2, 2)}, tmp_path / "lora.bin")
    (tmp_path / "renamed.safetensors").write_bytes((tmp_path / "lora.bin").read_bytes())
    for name in ("lora.bin", "renamed.safetensors"):
        with pytest.raises(
            CheckpointError, match="pickle file; wanjax reads LoRAs from safetensors only"
        ) as excinfo:
            read_lora(tmp_path / name)
        one_line(excinfo)


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="cannot read") as excinfo:
        read_lora(tmp_path)  # a directory without pytorch_lora_weights.safetensors
    one_line(excinfo)


def test_truncated_file(tmp_path):
    save_file(wan_original(torch.Generator().manual_seed(11)), tmp_path / "lora.safetensors")
    data = (tmp_path / "lora.safetensors").read_bytes()
    (tmp_path / "lora.safetensors").write_bytes(data[:-100])
    with pytest.raises(CheckpointError, match="truncated file") as excinfo:
        read_lora(tmp_path / "lora.safetensors")
    one_line(excinfo)


def test_unrelated_keys(tmp_path):
    save_file(
        {"model.layers.0.weight": torch.ones(2, 2), "model.layers.1.weight": torch.ones(2)},
        tmp_path / "x.safetensors",
    )
    with pytest.raises(
        CheckpointError, match=r"unrecognised LoRA key 'model\.layers\.0\.weight' \(.*0 of 2 keys"
    ) as excinfo:
        read_lora(tmp_path / "x.safetensors")
    one_line(excinfo)


def test_unknown_wan_module(tmp_path):
    gen = torch.Generator().manual_seed(12)
    sd = {}
    add_factors(sd, gen, "diffusion_model.blocks.0.self_attn.q", (24, 24), 4)
    add_factors(sd, gen, "diffusion_model.blocks.0.self_attn.qkv", (72, 24), 4)
    save_file(sd, tmp_path / "lora.safetensors")
    with pytest.raises(
        CheckpointError, match=r"'diffusion_model\.blocks\.0\.self_attn\.qkv\..*2 of 4 keys"
    ) as excinfo:
        read_lora(tmp_path / "lora.safetensors")
    one_line(excinfo)


def test_peft_save_pretrained_of_the_original_model(tmp_path):
    """Wan 2.2 Animate's ``relighting_lora/`` layout (PEFT ``save_pretrained`` of the original model:
    ``base_model.model.blocks...`` keys, ``adapter_config.json`` beside them): each delta is diffusers'
    for the same factors under ``diffusion_model.`` (its converter's names), times the config's
    ``lora_alpha / r``; without a config, times 1; a folder is read by PEFT's file name; per-module
    patterns over the original names, and diffusers' names under the prefix, are refused in one line."""
    gen = torch.Generator().manual_seed(12)
    factors: dict = {}
    for i in range(2):
        for module, shape in {**WAN_BLOCK, **WAN_I2V}.items():
            add_factors(factors, gen, f"blocks.{i}.{module}", shape, 4, names=("lora_A", "lora_B"))
    save_file({f"diffusion_model.{k}": v for k, v in factors.items()}, tmp_path / "reference.safetensors")
    expected = diffusers_deltas(tmp_path / "reference.safetensors", config=I2V)
    folder = tmp_path / "relighting_lora"
    folder.mkdir()
    save_file({f"base_model.model.{k}": v for k, v in factors.items()}, folder / "adapter_model.safetensors")

    lora = read_lora(folder)
    assert lora.format == "peft-wan" and lora.alphas is None
    assert_matches_diffusers(lora, expected)
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 2}))
    lora = read_lora(folder / "adapter_model.safetensors")
    assert lora.alphas == {2.0}
    halved = {m: {k: v / 2 for k, v in parts.items()} for m, parts in expected.items()}
    assert_matches_diffusers(lora, halved)
    config = {"peft_type": "LORA", "r": 4, "lora_alpha": 4, "rank_pattern": {"ffn.0": 8}}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="rank_pattern") as excinfo:
        read_lora(folder)
    one_line(excinfo)
    # diffusers' names under PEFT's prefix: no layout diffusers reads; refused naming the file's key
    other = tmp_path / "other.safetensors"
    save_file({"base_model.model.blocks.0.attn1.to_q.lora_A.weight": rand(gen, 4, 24)}, other)
    with pytest.raises(CheckpointError, match=r"'base_model\.model\.blocks\.0\.attn1\.to_q\.lora_A\.weight'"):
        read_lora(other)
