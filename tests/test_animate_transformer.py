"""The Wan 2.2 Animate transformer (``WanAnimateTransformer3DModel``: pose patch embedding, motion and
face encoders, face adapters) loaded through wanjax equals diffusers' on the same weights, float32,
from a diffusers directory and from a single file in the original release's names; its config is
read and checked."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from helpers.compare import relative_error
from helpers.lora import save_factors
from helpers.models import TINY_DIT, original_animate_state, randomize_
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import wanjax
from wanjax.errors import ConfigError
from wanjax.models.animate import face_adapter
from wanjax.models.config import TransformerConfig
from wanjax.models.dit import AnimateControl
from wanjax.models.settings import RunSettings
from wanjax.parallel.layouts import frame_layout, token_layout
from wanjax.parallel.mesh import make_mesh, parse_mesh
from wanjax.parallel.rules import num_shards

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


def test_a_lora_reaches_the_blocks_and_the_face_adapters(animate, tmp_path):
    """A LoRA in diffusers' layout on a block and on a face adapter (diffusers' names for an Animate
    model's modules): each kernel moves by ``weight x B @ A``."""

    root, _, _ = animate
    rng = np.random.default_rng(4)
    d, rank = 24, 4
    modules = {
        "blocks.1.attn1.to_q": ("blocks", "attn1", 1),
        "face_adapter.1.to_q": ("face_adapter", None, 1),
    }
    factors = {
        m: (rng.standard_normal((rank, d), np.float32), rng.standard_normal((d, rank), np.float32))
        for m in modules
    }
    save_factors(tmp_path / "lora.safetensors", factors)
    model = wanjax.load_transformer(root, dtype="float32")

    def kernel(module):
        group, attn, layer = modules[module]
        p = model.params[group]
        return np.asarray((p[attn] if attn else p)["to_q"]["kernel"][layer])

    before = {m: kernel(m) for m in modules}
    model.set_loras([(tmp_path / "lora.safetensors", 0.5)])
    for module, (a, b) in factors.items():
        np.testing.assert_allclose(kernel(module) - before[module], 0.5 * (b @ a).T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("offload", ["model", "blocks"])
def test_offloaded_gives_the_resident_output(animate, offload):
    """Offloaded (the blocks streamed under ``blocks``; the face adapters stay on the device)."""
    root, _, inputs = animate
    resident = ours_output(wanjax.load_transformer(root, dtype="float32"), inputs)
    moved = wanjax.load_transformer(root, dtype="float32", offload=offload)
    moved.to_device()
    assert relative_error(ours_output(moved, inputs), resident) <= 1e-6


def test_int8_weights_are_close_to_bf16(animate):
    """``weights_dtype="int8"``: the matmul kernels (the blocks', the face adapters', the motion
    encoder's linears) in 8 bits; the velocity about as close to bf16's as the DiT's is."""
    from wanjax.io.quant import QuantizedKernel

    root, _, inputs = animate
    bf16 = wanjax.load_transformer(root, dtype="bfloat16")
    int8 = wanjax.load_transformer(root, dtype="bfloat16", weights_dtype="int8")
    assert isinstance(int8.params["face_adapter"]["to_q"]["kernel"], QuantizedKernel)
    assert isinstance(int8.params["motion_encoder"]["motion_network"]["0"]["kernel"], QuantizedKernel)
    reference = ours_output(bf16, inputs).astype(np.float32)
    error = relative_error(ours_output(int8, inputs).astype(np.float32), reference)
    assert 1e-4 < error < 2e-2  # tests/test_quant.py's bound for the DiT


# The relighting LoRA's modules: every Linear of the blocks but the modulation (original names ->
# diffusers' WanAnimateTransformer3DModel's), the face adapters left out
RELIGHTING = {
    **{f"self_attn.{o}": f"attn1.{c}" for o, c in (("q", "to_q"), ("k", "to_k"), ("v", "to_v"), ("o", "to_out.0"))},
    **{f"cross_attn.{o}": f"attn2.{c}" for o, c in (("q", "to_q"), ("k", "to_k"), ("v", "to_v"), ("o", "to_out.0"))},
    "cross_attn.k_img": "attn2.add_k_proj",
    "cross_attn.v_img": "attn2.add_v_proj",
    "ffn.0": "ffn.net.0.proj",
    "ffn.2": "ffn.net.2",
}  # fmt: skip


def test_the_relighting_lora_layout_matches_diffusers(animate, tmp_path):
    """Wan 2.2 Animate's ``relighting_lora/``: PEFT's ``save_pretrained`` of the original model
    (``base_model.model.blocks.N.self_attn.q.lora_A.weight``..., ``r`` and ``lora_alpha`` in
    ``adapter_config.json`` beside it). diffusers reads no ``base_model.model.`` keys, so its side is
    the same factors under the prefix its own converter takes (``diffusion_model.``, the config's
    alpha as its ``.alpha`` keys), loaded by ``load_lora_adapter``; wanjax reads the folder itself."""
    import copy
    import json

    from diffusers.loaders.lora_conversion_utils import _convert_non_diffusers_wan_lora_to_diffusers
    from safetensors.numpy import save_file

    from wanjax.io.lora import read_lora

    root, model, inputs = animate
    rank, alpha = 4, 8.0
    rng = np.random.default_rng(11)
    factors = {}
    for i in range(ANIMATE["num_layers"]):
        for theirs, ours in RELIGHTING.items():
            out_dim, in_dim = model.get_submodule(f"blocks.{i}.{ours}").weight.shape
            factors[f"blocks.{i}.{theirs}"] = (
                rng.standard_normal((rank, in_dim), np.float32) / np.sqrt(in_dim),
                rng.standard_normal((out_dim, rank), np.float32) * 0.1,
            )
    folder = tmp_path / "relighting_lora"
    folder.mkdir()
    save_file(
        {
            f"base_model.model.{m}.lora_{n}.weight": f
            for m, ab in factors.items()
            for n, f in zip("AB", ab, strict=True)
        },
        str(folder / "adapter_model.safetensors"),
    )
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": sorted(factors)}
    (folder / "adapter_config.json").write_text(json.dumps(config))

    original = {}
    for m, (a, b) in factors.items():
        original |= {f"diffusion_model.{m}.lora_A.weight": torch.from_numpy(a)}
        original |= {f"diffusion_model.{m}.lora_B.weight": torch.from_numpy(b)}
        original |= {f"diffusion_model.{m}.alpha": torch.tensor(alpha)}
    with_lora = copy.deepcopy(model)
    with_lora.load_lora_adapter(_convert_non_diffusers_wan_lora_to_diffusers(original), prefix="transformer")
    expected = reference(with_lora, inputs)
    assert relative_error(expected, reference(model, inputs)) > 1e-2  # the LoRA moves the output

    lora = read_lora(folder)
    assert lora.format == "peft-wan" and len(lora.updates) == len(factors) and lora.alphas == {alpha}
    ours = wanjax.load_transformer(root, dtype="float32")
    ours.set_loras([(folder, 1.0)])
    assert relative_error(ours_output(ours, inputs), expected) <= 1e-5


@pytest.mark.parametrize(
    "mesh, frames",
    [("dp=2,sp=1,tp=4", 4), ("dp=2,sp=2,tp=2", 4), ("dp=1,sp=8,tp=1", 4), ("dp=2,sp=2,tp=2", 3)],
)
def test_the_face_adapter_on_a_mesh_keeps_its_heads_split(mesh, frames):
    """On 8 devices, the weights and tokens laid out as the DiT's, the face adapter equals one
    device's (3 frames: rows ``sp`` cannot split, computed on each of its devices); where ``tp``
    splits the heads each device's temporaries stay about one token array of the frames it attends
    (its per-frame attention's queries with all heads on every device made them three to five)."""
    heads, head_dim, batch, frame_tokens, face_tokens = 8, 16, 2, 256, 3
    cfg = TransformerConfig(num_attention_heads=heads, attention_head_dim=head_dim)
    d, rng = heads * head_dim, np.random.default_rng(0)
    params = {
        name: {"kernel": rng.normal(size=(d, d)) / np.sqrt(d), "bias": rng.normal(size=(d,))}
        for name in ("to_q", "to_k", "to_v", "to_out")
    }
    params |= {name: {"scale": rng.normal(size=(head_dim,))} for name in ("norm_q", "norm_k")}
    params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)
    x = jnp.asarray(rng.normal(size=(batch, frames * frame_tokens, d)), jnp.float32)
    face = jnp.asarray(rng.normal(size=(batch, frames, face_tokens, d)), jnp.float32)
    alone = face_adapter(params, x, face, cfg, RunSettings())

    device_mesh = make_mesh(parse_mesh(mesh))
    sizes = dict(device_mesh.shape)
    layout = token_layout(sizes, batch, x.shape[1], heads)
    column = {"kernel": P(None, "tp"), "bias": P("tp")}
    specs = {"to_q": column, "to_k": column, "to_v": column, "to_out": {"kernel": P("tp", None), "bias": P()}}
    specs |= {"norm_q": {"scale": P()}, "norm_k": {"scale": P()}}
    put = lambda a, spec: jax.device_put(a, NamedSharding(device_mesh, spec))  # noqa: E731
    args = (jax.tree.map(put, params, specs), put(x, layout.tokens()), put(face, P(layout.tokens()[0])))
    settings = RunSettings(mesh=device_mesh)
    compiled = jax.jit(lambda p, x, f: face_adapter(p, x, f, cfg, settings)).lower(*args).compile()
    assert relative_error(np.asarray(compiled(*args)), np.asarray(alone)) <= 1e-6
    if layout.heads:  # the tokens of the frames a device attends, all features
        local_tokens = x.nbytes // num_shards(P(frame_layout(layout, sizes, batch * frames).batch), sizes)
        assert compiled.memory_analysis().temp_size_in_bytes <= 1.5 * local_tokens
