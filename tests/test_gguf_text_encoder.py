"""A GGUF text encoder as city96 ships UMT5-XXL (llama.cpp's T5 names, the matmul weights quantised,
arch ``t5encoder``): recognised, read as transformers' model computes it, and kept quantised on the
device with ``--weights_dtype gguf``."""

from __future__ import annotations

import gguf
import jax
import numpy as np
import pytest
import torch
from helpers.compare import relative_error
from helpers.gguf_files import Q, diffusers_values, write
from helpers.text_encoder import padded_batch, save_text_encoder

from wanjax.io.gguf_kernel import GGUFKernel
from wanjax.models import umt5
from wanjax.models.encoder_layouts import LLAMA_CPP_T5_LAYOUT
from wanjax.models.umt5 import TEXT_ENCODER

# Matmul inputs of 64 and 96: whole Q8_0 blocks of 32.
CONFIG = dict(vocab_size=320, d_model=64, d_kv=16, num_heads=4, d_ff=96, num_layers=2)


@pytest.fixture(scope="module")
def gguf_encoder(tmp_path_factory):
    """A tiny UMT5EncoderModel (saved as a diffusers folder) and its tensors in a city96-style GGUF
    file: the 2-D weights but the embedding and position tables Q8_0, the rest float32."""
    root = tmp_path_factory.mktemp("gguf_t5")
    model = save_text_encoder(root, seed=3, **CONFIG)
    tensors = {}
    for name, t in model.state_dict().items():
        if name == "encoder.embed_tokens.weight":
            continue  # tied: the file holds one table
        matmul = t.ndim == 2 and "embed" not in name and "shared" not in name and "relative" not in name
        tensors[llama_cpp_name(name)] = (Q.Q8_0 if matmul else Q.F32, t.numpy())
    path = write(root / "umt5-xxl-encoder-Q8_0.gguf", tensors, arch="t5encoder")
    return root, model, path


def llama_cpp_name(name: str) -> str:
    """transformers' UMT5 name as llama.cpp's converter names it (gguf-py's tensor map)."""
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.T5ENCODER, CONFIG["num_layers"])
    return names.get_name(name.replace("encoder.embed_tokens", "shared"), try_suffixes=(".weight",))


def test_the_layout_names_every_umt5_xxl_tensor_as_llama_cpp():
    """Every tensor of the registry's UMT5-XXL under :data:`LLAMA_CPP_T5_LAYOUT` is named as llama.cpp's
    own converter (the ``gguf`` package's tensor map) names it."""
    from wanjax.io.key_layouts import spec_names
    from wanjax.models.registry import UMT5_XXL

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.T5ENCODER, UMT5_XXL.num_layers)
    ours = spec_names(TEXT_ENCODER.checkpoint_spec(UMT5_XXL, {"shared.weight"}))
    assert len(ours) == 2 + 10 * UMT5_XXL.num_layers  # the embedding, the final norm, 10 a layer
    for name in ours:
        assert LLAMA_CPP_T5_LAYOUT.file_name(name) == names.get_name(name, try_suffixes=(".weight",)), name


def _encoder(path, cfg, **options) -> umt5.UMT5Encoder:
    cfg, params = umt5.load_encoder_params(path, "float32", config=cfg, **options)
    return umt5.UMT5Encoder(cfg, params, None, precision="highest")


def _encode(encoder: umt5.UMT5Encoder, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.asarray(encoder(jax.numpy.asarray(ids), jax.numpy.asarray(mask)))


def test_a_city96_gguf_text_encoder_runs_as_transformers_does(gguf_encoder):
    """Recognised in llama.cpp's layout; the encoder's states equal transformers' UMT5EncoderModel
    holding the file's dequantised weights (float32)."""
    from transformers import UMT5Config, UMT5EncoderModel

    root, _, path = gguf_encoder
    cfg = TEXT_ENCODER.read_config(root / "text_encoder")
    assert TEXT_ENCODER.file_weights(path, cfg).layout is LLAMA_CPP_T5_LAYOUT
    reference = UMT5EncoderModel(UMT5Config(**CONFIG)).eval()
    values = diffusers_values(path)  # every tensor dequantised as diffusers/gguf do
    state = {name: torch.from_numpy(values[llama_cpp_name(name)]) for name in reference.state_dict()}
    reference.load_state_dict(state, strict=True)
    ids, mask = padded_batch((11, 4), 16, CONFIG["vocab_size"], seed=2)
    with torch.no_grad():
        expected = reference(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).last_hidden_state
    ours = _encode(_encoder(path, cfg), ids, mask)
    assert relative_error(ours * mask[..., None], expected.numpy() * mask[..., None]) < 1e-5


def test_its_kernels_kept_quantised_equal_the_dequantised_load(gguf_encoder):
    """``--weights_dtype gguf``: every matmul kernel stays the file's Q8_0 blocks on the device, and
    the states equal those of the encoder dequantised on loading."""
    root, _, path = gguf_encoder
    cfg = TEXT_ENCODER.read_config(root / "text_encoder")
    kept = _encoder(path, cfg, weights_dtype="gguf")
    kernels = [
        leaf
        for leaf in jax.tree.leaves(kept.params, is_leaf=lambda x: isinstance(x, GGUFKernel))
        if isinstance(leaf, GGUFKernel)
    ]
    assert len(kernels) == 7 and {k.qtype for k in kernels} == {"Q8_0"}  # q, k, v, o, wi_0, wi_1, wo
    ids, mask = padded_batch((11, 4), 16, CONFIG["vocab_size"], seed=2)
    dequantised = _encoder(path, cfg)
    np.testing.assert_allclose(_encode(kept, ids, mask), _encode(dequantised, ids, mask), atol=1e-5)
