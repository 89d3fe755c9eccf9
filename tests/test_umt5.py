"""The UMT5 encoder loaded through wanjax equals transformers' UMT5EncoderModel, and prompt
embeddings equal diffusers' WanPipeline.encode_prompt, on tiny random models saved to disk."""

from __future__ import annotations

import dataclasses
import json
import shutil
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from helpers.compare import relative_error
from helpers.models import TINY_DIT, randomize_
from helpers.text_encoder import CASES, padded_batch, save_text_encoder
from helpers.tokenizer import LONG
from safetensors.numpy import load_file, save_file
from transformers import UMT5Config as HFConfig
from transformers import UMT5EncoderModel
from transformers.models.umt5.modeling_umt5 import UMT5Attention

import wanjax.models.umt5 as umt5
from wanjax.errors import CheckpointError, ConfigError
from wanjax.models.registry import UMT5_XXL
from wanjax.models.umt5 import UMT5Config, load_text_encoder, relative_position_buckets


@pytest.fixture(scope="module", params=CASES, ids=[c[0] for c in CASES])
def case(request, tmp_path_factory, tokenizer_dir):
    name, config, lengths, padded = request.param
    root = tmp_path_factory.mktemp(name)
    model = save_text_encoder(root, seed=1, **config)
    shutil.copytree(tokenizer_dir, root / "tokenizer")
    ids, mask = padded_batch(lengths, padded, config["vocab_size"], seed=2)
    with torch.no_grad():
        ref = model(torch.from_numpy(ids), torch.from_numpy(mask)).last_hidden_state.numpy()
    return root, ids, mask, ref


def test_float32_matches_transformers(case):
    root, ids, mask, ref = case
    model = load_text_encoder(root, dtype="float32")
    out = np.asarray(model(ids, mask))
    assert out.shape == ref.shape and out.dtype == np.float32
    assert relative_error(out, ref) <= 1e-5  # padded query rows included


def test_bfloat16_close_to_transformers(case):
    root, ids, mask, ref = case
    model = load_text_encoder(root / "text_encoder")
    assert model.dtype == jnp.bfloat16
    assert all(leaf.dtype == jnp.bfloat16 for leaf in jax.tree.leaves(model.params))
    out = model(ids, mask)
    assert out.dtype == jnp.bfloat16
    assert relative_error(out.astype(jnp.float32), ref) <= 2e-2


def test_prompt_embeddings_zero_padding_and_trimming(case):
    """encode_ids = the reference hidden states up to each length, exact zeros after; trimming the
    padded batch to a shorter power of two changes nothing."""
    root, ids, mask, ref = case
    expected = np.where(mask[..., None] == 1, ref, 0.0)
    trimmed = load_text_encoder(root, dtype="float32")
    full = load_text_encoder(root, dtype="float32", trim_padding=False)
    for model in (trimmed, full):
        out = np.asarray(model.encode_ids(ids, mask))
        assert out.shape == ref.shape
        assert relative_error(out, expected) <= 1e-5
        assert (out[mask == 0] == 0).all()
    short = mask.sum(-1) <= 32  # rows a 32-token run covers
    run = umt5.compute_length(int(mask[short].sum(-1).max()), ids.shape[1])
    assert run == min(32, ids.shape[1])
    assert relative_error(trimmed.encode_ids(ids[short], mask[short]), expected[short]) <= 1e-5


@pytest.mark.parametrize(("buckets", "distance"), [(32, 128), (8, 20), (6, 5), (64, 256)])
def test_relative_buckets_match_transformers(buckets, distance):
    cfg = HFConfig(relative_attention_num_buckets=buckets, relative_attention_max_distance=distance)
    attention = UMT5Attention(cfg, has_relative_attention_bias=True)
    length = 600
    pos = torch.arange(length)
    ref = attention._relative_position_bucket(pos[None, :] - pos[:, None]).numpy()
    np.testing.assert_array_equal(relative_position_buckets(length, buckets, distance), ref)


def test_compute_length():
    assert [umt5.compute_length(n, 512) for n in (1, 32, 33, 100, 257, 512)] == [32, 32, 64, 128, 512, 512]
    assert umt5.compute_length(100, 77) == 77


@pytest.fixture(scope="module")
def small_root(tmp_path_factory, tokenizer_dir):
    root = tmp_path_factory.mktemp("variants")
    model = save_text_encoder(root, seed=3, **CASES[0][1])
    shutil.copytree(tokenizer_dir, root / "tokenizer")
    return root, model


@pytest.mark.parametrize("variant", ["sharded", "both_names_differ", "embed_tokens_only", "full_model"])
def test_checkpoint_variants_match_transformers(small_root, tmp_path, variant):
    """Shards, a tied embedding stored under one or both names, decoder weights to ignore."""
    src, model = small_root
    root = tmp_path / variant
    shutil.copytree(src / "tokenizer", root / "tokenizer")
    te = root / "text_encoder"
    if variant == "sharded":
        model.save_pretrained(te, max_shard_size="20KB")
        assert (te / "model.safetensors.index.json").exists()
    else:
        shutil.copytree(src / "text_encoder", te)
        tensors = load_file(te / "model.safetensors")
        rng = np.random.default_rng(4)
        if variant == "both_names_differ":
            tensors["encoder.embed_tokens.weight"] = rng.normal(size=tensors["shared.weight"].shape).astype(
                np.float32
            )
        elif variant == "embed_tokens_only":
            tensors["encoder.embed_tokens.weight"] = tensors.pop("shared.weight")
        else:
            tensors["decoder.final_layer_norm.weight"] = np.ones(32, np.float32)
            tensors["lm_head.weight"] = tensors["shared.weight"].copy()
        save_file(tensors, te / "model.safetensors", metadata={"format": "pt"})
    ids, mask = padded_batch((12, 7), 12, 320, seed=5)
    with torch.no_grad():
        ref_model = UMT5EncoderModel.from_pretrained(te).eval()
        ref = ref_model(torch.from_numpy(ids), torch.from_numpy(mask)).last_hidden_state.numpy()
    out = load_text_encoder(root, dtype="float32")(ids, mask)
    assert relative_error(out, ref) <= 1e-5


# Wan2.1's text_encoder/config.json is written by transformers 4 with these fields.
WAN_STYLE_CONFIG = {
    "_name_or_path": "google/umt5-xxl", "architectures": ["UMT5EncoderModel"], "classifier_dropout": 0.0,
    "d_ff": 10240, "d_kv": 64, "d_model": 4096, "decoder_start_token_id": 0, "dense_act_fn": "gelu_new",
    "dropout_rate": 0.1, "eos_token_id": 1, "feed_forward_proj": "gated-gelu", "initializer_factor": 1.0,
    "is_encoder_decoder": True, "is_gated_act": True, "layer_norm_epsilon": 1e-06, "model_type": "umt5",
    "num_decoder_layers": 24, "num_heads": 64, "num_layers": 24, "output_past": True, "pad_token_id": 0,
    "relative_attention_max_distance": 128, "relative_attention_num_buckets": 32, "scalable_attention": True,
    "tie_word_embeddings": False, "tokenizer_class": "T5Tokenizer", "torch_dtype": "bfloat16",
    "transformers_version": "4.49.0.dev0", "use_cache": True, "vocab_size": 256384,
}  # fmt: skip


def test_config_reads_wan_style_config():
    cfg = UMT5Config.from_dict(WAN_STYLE_CONFIG)
    assert dataclasses.replace(cfg, metadata={}) == UMT5_XXL
    assert cfg.metadata == {"_name_or_path": "google/umt5-xxl"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"feed_forward_proj": "relu"}, "feed_forward_proj"),
        ({"feed_forward_proj": "gated-silu"}, "feed_forward_proj"),
        ({"model_type": "t5"}, "model_type"),
        ({"is_decoder": True}, "is_decoder"),
        ({"relative_attention_num_buckets": 2}, "relative_attention_num_buckets"),
        ({"rotary_dim": 64}, "unknown field"),
    ],
)
def test_config_rejects_unsupported(change, message):
    with pytest.raises(ConfigError, match=message):
        UMT5Config.from_dict({**WAN_STYLE_CONFIG, **change})


def test_loader_errors(small_root, tmp_path):
    src, _ = small_root
    with pytest.raises(ConfigError, match="float16"):
        load_text_encoder(src, dtype="float16")
    alone = tmp_path / "alone"
    shutil.copytree(src / "text_encoder", alone / "text_encoder")
    with pytest.raises(CheckpointError, match="no tokenizer/ folder"):
        load_text_encoder(alone)
    load_text_encoder(alone / "text_encoder", tokenizer=src / "tokenizer")  # explicit tokenizer path
    small = tmp_path / "small_vocab"
    shutil.copytree(src, small)
    config = json.loads((small / "text_encoder" / "config.json").read_text())
    (small / "text_encoder" / "config.json").write_text(json.dumps({**config, "vocab_size": 300}))
    with pytest.raises(CheckpointError, match="tokenizer has 310 tokens"):
        load_text_encoder(small)


# ----------------------------------------------------------------------------------------------
# End to end: WanPipeline.encode_prompt on a saved tiny pipeline


@pytest.fixture(scope="module", params=["saved", "wan_repo_tokenizer"])
def pipeline_dir(request, tmp_path_factory, tokenizer_dir):
    """A tiny WanPipeline saved with save_pretrained; ``wan_repo_tokenizer`` then swaps in a tokenizer
    folder written like the Wan repos' (a transformers 4 tokenizer.json)."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("pipeline")
    text_encoder = randomize_(UMT5EncoderModel(HFConfig(**CASES[1][1])), seed=6).eval()
    pipe = WanPipeline(
        tokenizer=AutoTokenizer.from_pretrained(tokenizer_dir),
        text_encoder=text_encoder,
        vae=AutoencoderKLWan(
            base_dim=3,
            z_dim=16,
            dim_mult=[1, 1, 1, 1],
            num_res_blocks=1,
            temperal_downsample=[False, True, True],
        ),
        scheduler=UniPCMultistepScheduler(
            prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0
        ),
        transformer=WanTransformer3DModel(**{**TINY_DIT, "text_dim": 24, "num_layers": 1}),
    )
    pipe.save_pretrained(root)
    if request.param == "wan_repo_tokenizer":
        shutil.rmtree(root / "tokenizer")
        shutil.copytree(tokenizer_dir, root / "tokenizer")
    reference = WanPipeline.from_pretrained(root)
    return root, reference


PROMPTS = ["A cat &amp; a dog  run\tover the\n lazy fox ", "東京の猫 café ﬁsh", LONG]


@pytest.mark.parametrize(
    ("negative", "max_length"), [(None, 512), ("the dog, ugly &lt;b&gt;", 512), (["x", "", "猫 猫"], 24)]
)
def test_encode_prompt_matches_diffusers(pipeline_dir, negative, max_length):
    root, reference = pipeline_dir
    ours = load_text_encoder(root, dtype="float32")
    with torch.no_grad():
        ref_pos, ref_neg = reference.encode_prompt(
            PROMPTS, negative, max_sequence_length=max_length, device="cpu"
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # LONG is truncated at 24 tokens
        pos, neg = ours.encode_prompt(PROMPTS, negative, max_sequence_length=max_length)
        alone = ours.encode(PROMPTS, max_sequence_length=max_length)
    for out, ref in ((pos, ref_pos), (neg, ref_neg), (alone, ref_pos)):
        out, ref = np.asarray(out), ref.numpy()
        assert out.shape == ref.shape == (3, max_length, 24)
        assert relative_error(out, ref) <= 1e-5
        np.testing.assert_array_equal(out == 0, ref == 0)  # exact zeros past each prompt


def test_encode_bfloat16_close_to_diffusers(pipeline_dir):
    root, reference = pipeline_dir
    with torch.no_grad():
        ref_pos, ref_neg = reference.encode_prompt(PROMPTS[:2], max_sequence_length=512, device="cpu")
    pos, neg = load_text_encoder(root).encode_prompt(PROMPTS[:2], max_sequence_length=512)
    assert pos.dtype == neg.dtype == jnp.bfloat16
    assert relative_error(pos.astype(jnp.float32), ref_pos.numpy()) <= 2e-2
    assert relative_error(neg.astype(jnp.float32), ref_neg.numpy()) <= 2e-2


def test_truncation_warning_from_encode(pipeline_dir):
    root, _ = pipeline_dir
    with pytest.warns(UserWarning, match="were dropped"):
        load_text_encoder(root, dtype="float32").encode([LONG], max_sequence_length=24)


def test_bfloat16_program_keeps_stacked_weights_in_bfloat16():
    """The layer scan must not make a float32 copy of the stacked weights (XLA:CPU does for bf16 xs)."""
    from wanjax.io.checkpoint import abstract_params

    cfg = dataclasses.replace(UMT5Config(**CASES[0][1]), d_ff=72)
    params = abstract_params(umt5.checkpoint_spec(cfg), jnp.bfloat16)
    ids = jax.ShapeDtypeStruct((2, 16), jnp.int32)
    hlo = jax.jit(lambda p, i, m: umt5.forward(p, cfg, i, m)).lower(params, ids, ids).compile().as_text()
    n = cfg.num_layers
    assert f"bf16[{n},32,72]" in hlo  # the stacked wi_0/wi_1 kernels ...
    assert f"f32[{n},32,72]" not in hlo and f"f32[{n},72,32]" not in hlo  # ... and no float32 copy
