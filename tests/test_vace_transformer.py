"""The VACE transformer (``WanVACETransformer3DModel``: control blocks whose hints follow the vace
layers) loaded through wanjax equals diffusers' on the same weights, float32; its config is read and
checked, and a plain transformer's config is written back without the VACE fields."""

from __future__ import annotations

import jax.numpy as jnp
import pytest
import torch
from helpers.compare import relative_error
from helpers.lora import save_factors
from helpers.models import TINY_DIT, randomize_

import wanjax
from wanjax.errors import ConfigError
from wanjax.models.config import TransformerConfig
from wanjax.models.dit import VaceControl

VACE = {**TINY_DIT, "num_layers": 4, "vace_layers": [0, 2], "vace_in_channels": 12}
SHAPE = (2, 16, 3, 6, 8)  # latents (B, C, T, H, W)


@pytest.fixture(scope="module")
def vace(tmp_path_factory):
    from diffusers import WanVACETransformer3DModel

    root = tmp_path_factory.mktemp("vace")
    model = randomize_(WanVACETransformer3DModel(**VACE), seed=3, std=0.2).eval()
    model.save_pretrained(root / "transformer")
    g = torch.Generator().manual_seed(5)
    latents = torch.randn(SHAPE, generator=g)
    control = torch.randn((SHAPE[0], VACE["vace_in_channels"], *SHAPE[2:]), generator=g)
    text = torch.randn((SHAPE[0], 7, VACE["text_dim"]), generator=g)
    timestep = torch.tensor([999.0, 250.0])
    return root, model, (latents, timestep, text, control)


@pytest.mark.parametrize("scale", [None, [0.7, 1.3]], ids=["scale-1", "scale-0.7-1.3"])
def test_float32_matches_diffusers(vace, scale):
    root, model, (latents, timestep, text, control) = vace
    with torch.no_grad():
        ref = model(
            latents,
            timestep,
            text,
            control_hidden_states=control,
            control_hidden_states_scale=None if scale is None else torch.tensor(scale),
        ).sample.numpy()
    ours = wanjax.load_transformer(root, dtype="float32")
    assert ours.cfg.vace_layers == (0, 2) and ours.cfg.vace_in_channels == 12
    out = ours(
        jnp.asarray(latents.numpy()),
        jnp.asarray(timestep.numpy()),
        jnp.asarray(text.numpy()),
        control=VaceControl(jnp.asarray(control.numpy()), None if scale is None else jnp.asarray(scale)),
    )
    assert relative_error(out, ref) <= 1e-5
    if scale is not None:  # the hints matter: without them the output is another one
        with torch.no_grad():
            plain = model(latents, timestep, text, control_hidden_states=control * 0).sample.numpy()
        assert relative_error(plain, ref) > 1e-2


def test_control_latents_are_required_and_checked(vace):
    root, _, (latents, timestep, text, control) = vace
    ours = wanjax.load_transformer(root, dtype="float32")
    args = (jnp.asarray(latents.numpy()), jnp.asarray(timestep.numpy()), jnp.asarray(text.numpy()))
    with pytest.raises(ConfigError, match="a VACE transformer needs control latents"):
        ours(*args)
    with pytest.raises(ConfigError, match=r"control latents must be \(B, 12, T, H, W\)"):
        ours(*args, control=VaceControl(jnp.zeros((2, 16, *SHAPE[2:]))))
    with pytest.raises(ConfigError, match=r"one scale per vace layer \(2\)"):
        ours(*args, control=VaceControl(jnp.asarray(control.numpy()), jnp.ones(3)))


def test_vace_config_fields_are_checked_and_kept_out_of_plain_configs():
    for bad in (
        {"vace_layers": [1, 2], "vace_in_channels": 96},
        {"vace_layers": [0, 9], "vace_in_channels": 96},
        {"vace_layers": [0, 2]},
    ):
        with pytest.raises(ConfigError, match="vace"):
            TransformerConfig.from_dict({**TINY_DIT, "num_layers": 4, **bad})
    plain = TransformerConfig.from_dict(dict(TINY_DIT))
    assert (
        not plain.vace and "vace_layers" not in plain.to_dict() and "vace_in_channels" not in plain.to_dict()
    )
    vace = TransformerConfig.from_dict(dict(VACE))
    assert vace.vace and vace.to_dict()["vace_layers"] == [0, 2]


def test_a_lora_reaches_the_control_blocks_too(vace, tmp_path):
    """A LoRA in diffusers' layout on a main block and on a control block: each kernel moves by
    ``weight x B @ A`` (the loader maps the control blocks' names as any block's)."""
    import numpy as np

    root, _, _ = vace
    rng = np.random.default_rng(4)
    d, rank = VACE["num_attention_heads"] * VACE["attention_head_dim"], 4
    factors = {}
    for module in ("blocks.1.attn1.to_q", "vace_blocks.0.attn1.to_q"):
        factors[module] = (
            rng.standard_normal((rank, d), np.float32),
            rng.standard_normal((d, rank), np.float32),
        )
    save_factors(tmp_path / "lora.safetensors", factors)
    model = wanjax.load_transformer(root, dtype="float32")
    before = {
        "blocks.1.attn1.to_q": np.asarray(model.params["blocks"]["attn1"]["to_q"]["kernel"][1]),
        "vace_blocks.0.attn1.to_q": np.asarray(model.params["vace_blocks"]["attn1"]["to_q"]["kernel"][0]),
    }
    model.set_loras([(tmp_path / "lora.safetensors", 0.5)])
    after = {
        "blocks.1.attn1.to_q": np.asarray(model.params["blocks"]["attn1"]["to_q"]["kernel"][1]),
        "vace_blocks.0.attn1.to_q": np.asarray(model.params["vace_blocks"]["attn1"]["to_q"]["kernel"][0]),
    }
    for module, (a, b) in factors.items():
        np.testing.assert_allclose(after[module] - before[module], 0.5 * (b @ a).T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("offload", ["model", "blocks"])
def test_offloaded_control_blocks_give_the_resident_output(vace, offload):
    """Offloaded (the main blocks streamed under ``blocks``; the control blocks stay on the device)."""
    root, _, (latents, timestep, text, control) = vace
    args = (jnp.asarray(latents.numpy()), jnp.asarray(timestep.numpy()), jnp.asarray(text.numpy()))
    resident = wanjax.load_transformer(root, dtype="float32")(
        *args, control=VaceControl(jnp.asarray(control.numpy()))
    )
    moved = wanjax.load_transformer(root, dtype="float32", offload=offload)
    moved.to_device()
    out = moved(*args, control=VaceControl(jnp.asarray(control.numpy())))
    assert relative_error(out, resident) <= 1e-6
