"""The Wan DiT loaded through wanjax equals diffusers' WanTransformer3DModel on the same weights."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from helpers.compare import relative_error
from helpers.dit import reference_inputs, run_ours
from helpers.models import TINY_DIT, save_transformer

import wanjax

# (name, diffusers config, latent shape, text length)
CASES = [
    ("tiny", TINY_DIT, (2, 16, 3, 6, 8), 7),
    ("head128", {**TINY_DIT, "attention_head_dim": 128, "text_dim": 24, "freq_dim": 32, "ffn_dim": 96,
                 "num_layers": 3, "rope_max_seq_len": 64}, (2, 16, 4, 4, 10), 9),
    ("no_cross_norm_patch2", {**TINY_DIT, "patch_size": (2, 2, 2), "num_attention_heads": 3,
                              "attention_head_dim": 16, "in_channels": 8, "out_channels": 4, "text_dim": 16,
                              "ffn_dim": 40, "num_layers": 1, "cross_attn_norm": False, "rope_max_seq_len": 16},
     (2, 8, 4, 6, 4), 5),
]  # fmt: skip


@pytest.fixture(scope="module", params=CASES, ids=[c[0] for c in CASES])
def case(request, tmp_path_factory):
    name, config, shape, text_len = request.param
    root = tmp_path_factory.mktemp(name)
    model = save_transformer(root, seed=1, **config)
    inputs = reference_inputs(shape, text_len, config["text_dim"], seed=2)
    with torch.no_grad():
        ref = model(*inputs).sample.numpy()
    return root, inputs, ref


def test_float32_matches_diffusers(case):
    root, inputs, ref = case
    ours = run_ours(wanjax.load_transformer(root, dtype="float32"), inputs)
    assert ours.shape == ref.shape
    assert relative_error(ours, ref) <= 1e-5


def test_bfloat16_close_to_diffusers_float32(case):
    root, inputs, ref = case
    model = wanjax.load_transformer(root / "transformer", dtype="bfloat16")
    ours = run_ours(model, inputs)
    assert relative_error(ours, ref) <= 2e-2


def test_bfloat16_keeps_reference_fp32_modules(case):
    root, _, _ = case
    params = wanjax.load_transformer(root, dtype="bfloat16").params
    assert params["time_embedder"]["linear_1"]["kernel"].dtype == jnp.float32
    assert params["blocks"]["scale_shift_table"].dtype == jnp.float32
    assert params["scale_shift_table"].dtype == jnp.float32
    assert params["blocks"]["attn1"]["to_q"]["kernel"].dtype == jnp.bfloat16
    assert params["time_proj"]["kernel"].dtype == jnp.bfloat16
    if "norm2" in params["blocks"]:
        assert params["blocks"]["norm2"]["scale"].dtype == jnp.float32


def test_bfloat16_matches_diffusers_bfloat16(tiny_transformer_dir):
    """Against the reference's own bf16 load (fp32-kept modules and all), the bf16 path is tighter."""
    from diffusers import WanTransformer3DModel

    root, _ = tiny_transformer_dir
    ref_model = WanTransformer3DModel.from_pretrained(root / "transformer", torch_dtype=torch.bfloat16)
    latents, timestep, text = reference_inputs((2, 16, 3, 6, 8), 7, 32, seed=3)
    with torch.no_grad():
        ref = ref_model(latents.bfloat16(), timestep, text.bfloat16()).sample.float().numpy()
    ours = run_ours(wanjax.load_transformer(root, dtype="bfloat16"), (latents, timestep, text))
    assert relative_error(ours, ref) <= 1e-2


def test_sharded_checkpoint_loads_identically(tmp_path, tiny_transformer_dir):
    root, model = tiny_transformer_dir
    sharded_root = tmp_path / "sharded"
    model.save_pretrained(sharded_root / "transformer", max_shard_size="20KB")
    files = sorted(p.name for p in (sharded_root / "transformer").iterdir())
    assert "diffusion_pytorch_model.safetensors.index.json" in files
    assert sum(name.endswith(".safetensors") for name in files) > 1
    single = wanjax.load_transformer(root, dtype="float32").params
    sharded = wanjax.load_transformer(sharded_root, dtype="float32").params
    for a, b in zip(jax_leaves(single), jax_leaves(sharded), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def jax_leaves(tree):
    import jax

    return jax.tree.leaves(tree)


def test_timestep_is_broadcast_and_batch_items_independent(tiny_transformer_dir):
    root, _ = tiny_transformer_dir
    model = wanjax.load_transformer(root, dtype="float32")
    latents, _, text = (jnp.asarray(t.numpy()) for t in reference_inputs((2, 16, 3, 6, 8), 7, 32, 4))
    both = model(latents, jnp.asarray(500), text)
    first = model(latents[:1], jnp.asarray([500]), text[:1])
    np.testing.assert_allclose(np.asarray(both[:1]), np.asarray(first), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("dtype, tolerance", [("float32", 1e-5), ("bfloat16", None)])
def test_a_timestep_per_latent_frame_equals_diffusers_per_token_timesteps(
    tiny_transformer_dir, dtype, tolerance
):
    """Wan 2.2 TI2V's ``expand_timesteps``: diffusers takes ``(B, L)`` per-token timesteps (the first
    latent frame's tokens at 0); ours one per latent frame ``(B, F)``, the same for each frame's
    tokens. float32: diffusers' output; bfloat16: the tokens of frame 0 modulated as at timestep 0
    (equal to a scalar-0 run's there)."""
    root, reference = tiny_transformer_dir
    shape = (2, 16, 3, 6, 8)
    latents, _, text = reference_inputs(shape, 7, 32, 5)
    per_frame = torch.tensor([[0.0, 750.0, 750.0], [0.0, 320.0, 320.0]])
    tokens_per_frame = (shape[3] // 2) * (shape[4] // 2)
    model = wanjax.load_transformer(root, dtype=dtype)
    ours = np.asarray(
        model(jnp.asarray(latents.numpy()), jnp.asarray(per_frame.numpy()), jnp.asarray(text.numpy()))
    )
    if tolerance is not None:
        with torch.no_grad():
            ref = reference(
                latents, per_frame.repeat_interleave(tokens_per_frame, dim=1), text
            ).sample.numpy()
        assert relative_error(ours, ref) <= tolerance
    scalar = model(jnp.asarray(latents.numpy()), jnp.asarray([750.0, 320.0]), jnp.asarray(text.numpy()))
    assert not np.allclose(ours[:, :, :1], np.asarray(scalar)[:, :, :1])  # frame 0 runs at timestep 0
