"""The Wan 2.2 Animate transformer (``WanAnimateTransformer3DModel``: pose patch embedding, motion and
face encoders, face adapters) loaded through wanjax equals diffusers' on the same weights, float32,
from a diffusers directory and from a single file in the original release's names; its config is
read and checked."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from helpers.compare import relative_error
from helpers.models import TINY_DIT, original_animate_state, randomize_

import wanjax
from wanjax.errors import ConfigError
from wanjax.models.config import TransformerConfig
from wanjax.models.dit import AnimateControl

# A tiny Animate model: two face adapters (after blocks 0 and 2), a 16x16 motion encoder (two
# residual blocks), the image tokens of an image-to-video model.
ANIMATE = {
    **TINY_DIT,
    "num_layers": 4,
    "in_channels": 36,
    "latent_channels": 16,
    "image_dim": 20,
    "added_kv_proj_dim": 24,
    "motion_encoder_channel_sizes": {"16": 8, "8": 12, "4": 16},
    "motion_encoder_size": 16,
    "motion_style_dim": 16,
    "motion_dim": 6,
    "motion_encoder_dim": 16,
    "face_encoder_hidden_dim": 8,
    "face_encoder_num_heads": 2,
    "inject_face_latents_blocks": 2,
    "motion_encoder_batch_size": 3,
}
SHAPE = (2, 36, 3, 4, 6)  # latents (B, C, T + 1, H, W): the reference frame, then 2 latent frames
FACE_FRAMES = 5  # face frames of a 5-frame segment: 2 latent frames


def make_animate(seed: int = 3):
    from diffusers import WanAnimateTransformer3DModel

    model = randomize_(WanAnimateTransformer3DModel(**ANIMATE), seed=seed, std=0.2).eval()
    # the motion encoder's weights at their own init's scale (N(0, 1), scaled in the forward): smaller
    # ones would leave its output independent of the face
    randomize_(model.motion_encoder, seed=seed + 1, std=1.0)
    return model


def animate_inputs(seed: int = 5):
    g = torch.Generator().manual_seed(seed)
    b, _, t, h, w = SHAPE
    return (
        torch.randn(SHAPE, generator=g),
        torch.tensor([999.0, 250.0]),
        torch.randn((b, 512, ANIMATE["text_dim"]), generator=g),  # diffusers splits off 512 text tokens
        torch.randn((b, 5, ANIMATE["image_dim"]), generator=g),
        torch.randn((b, 16, t - 1, h, w), generator=g),
        torch.rand((b, 3, FACE_FRAMES, 16, 16), generator=g) * 2 - 1,
    )


@pytest.fixture(scope="module")
def animate(tmp_path_factory):
    root = tmp_path_factory.mktemp("animate")
    model = make_animate()
    model.save_pretrained(root / "transformer")
    return root, model, animate_inputs()


def reference(model, inputs):
    latents, timestep, text, image, pose, face = inputs
    with torch.no_grad():
        return model(latents, timestep, text, image, pose, face).sample.numpy()


def ours_output(model, inputs):
    latents, timestep, text, image, pose, face = (jnp.asarray(t.numpy()) for t in inputs)
    return np.asarray(model(latents, timestep, text, image, control=AnimateControl(pose, face)))


def test_float32_matches_diffusers(animate):
    root, model, inputs = animate
    ours = wanjax.load_transformer(root, dtype="float32")
    assert ours.cfg.animate and ours.cfg.motion_channels == {"16": 8, "8": 12, "4": 16}
    ref = reference(model, inputs)
    assert relative_error(ours_output(ours, inputs), ref) <= 1e-5
    # the face matters: the unconditional pass's face (all -1) gives another output
    *rest, face = inputs
    assert relative_error(reference(model, (*rest, face * 0 - 1)), ref) > 1e-2


def test_original_single_file_matches_diffusers(animate, tmp_path):
    """The authors' names (``motion_encoder.enc.net_app.convs...``, ``face_adapter.fuser_blocks``
    with fused ``linear1_kv``, ``(1, C, 1, 1)`` activation biases) read from one file."""
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers
    from safetensors.numpy import save_file

    root, model, inputs = animate
    path = tmp_path / "wan2.2_animate.safetensors"
    state = {k: v.float().numpy() for k, v in model.state_dict().items()}
    original = original_animate_state(state, prefix="model.diffusion_model.")
    # the file is the authors' layout: diffusers' converter takes it back to the model's names (but
    # the last motion conv, which it knows only as the 14B's convs.8)
    back = convert_wan_transformer_to_diffusers({k: torch.from_numpy(v) for k, v in original.items()})
    assert set(back) - {"motion_encoder.enc.net_app.convs.3.weight"} == set(state) - {
        "motion_encoder.conv_out.weight"
    }
    save_file(original, str(path))
    cfg = TransformerConfig.from_file(root / "transformer" / "config.json")
    ours = wanjax.load_transformer(path, dtype="float32", config=cfg)
    assert relative_error(ours_output(ours, inputs), reference(model, inputs)) <= 1e-5


def test_inputs_are_checked(animate):
    root, _, inputs = animate
    ours = wanjax.load_transformer(root, dtype="float32")
    latents, timestep, text, image, pose, face = (jnp.asarray(t.numpy()) for t in inputs)
    with pytest.raises(ConfigError, match="needs its pose latents and face pixels"):
        ours(latents, timestep, text, image)
    with pytest.raises(ConfigError, match="pose latents must be"):
        ours(latents, timestep, text, image, control=AnimateControl(pose[:, :, :1], face))
    with pytest.raises(ConfigError, match="face frames give"):
        ours(latents, timestep, text, image, control=AnimateControl(pose, face[:, :, :9][:, :, [0] * 9]))


def test_config_fields_are_checked_and_kept_out_of_plain_configs():
    raw = {k: v for k, v in ANIMATE.items()}
    cfg = TransformerConfig.from_dict(dict(raw))
    assert cfg.to_dict()["motion_encoder_channel_sizes"] == {"16": 8, "8": 12, "4": 16}
    assert "motion_encoder_size" not in TransformerConfig.from_dict(dict(TINY_DIT)).to_dict()
    for bad, message in (
        ({"in_channels": 32}, "2 \\* latent_channels \\+ 4"),
        ({"num_layers": 3}, "multiple of inject_face_latents_blocks"),
        ({"motion_encoder_channel_sizes": {"16": 8, "8": 12}}, "lacks the size"),
        ({"face_encoder_num_heads": None}, "needs face_encoder_num_heads"),
    ):
        with pytest.raises(ConfigError, match=message):
            TransformerConfig.from_dict({**raw, **bad})
