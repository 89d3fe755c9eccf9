"""The Wan 2.1 VAE through wanjax equals diffusers' AutoencoderKLWan on the same (random) weights.

Tiny configs saved with ``save_pretrained``; every weight is random, RMS-norm gammas included. All
expected values come from diffusers (or its pipeline's post-processing), never from wanjax.
"""

from __future__ import annotations

import dataclasses
import inspect
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from conftest import randomize_
from diffusers import AutoencoderKLWan

from wanjax.checkpoint import abstract_params
from wanjax.errors import ConfigError
from wanjax.flops import vae_decode_flops
from wanjax.models import vae as vae_module
from wanjax.models.vae import Tiling, VAEConfig, WanVAE, checkpoint_spec, load_vae

CONFIGS = {
    # temporal downsampling at non-default levels, z_dim 4 with custom latent statistics
    "small": dict(
        base_dim=8,
        z_dim=4,
        dim_mult=[1, 2, 2, 2],
        num_res_blocks=1,
        temperal_downsample=[True, False, True],
        latents_mean=[0.1, -0.2, 0.3, 0.5],
        latents_std=[2.0, 0.5, 1.5, 1.1],
    ),
    # the real architecture's shape (z_dim 16, dim_mult 1,2,4,4, two res blocks), narrow, with a
    # decoder wider than the encoder
    "wan_like": dict(
        base_dim=8,
        decoder_base_dim=12,
        z_dim=16,
        dim_mult=[1, 2, 4, 4],
        num_res_blocks=2,
        temperal_downsample=[False, True, True],
    ),
}
LATENT_HW = (3, 5)  # 24 x 40 frames: non-square, odd latent sizes


def relative_error(ours, ref) -> float:
    ours = np.asarray(ours, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))


def randn(shape, seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def assert_not_saturated(video: np.ndarray) -> None:
    """The reference output must mostly lie inside (-1, 1), or a clamp could hide any difference."""
    assert np.mean(np.abs(video) < 0.999) > 0.9


@pytest.fixture(scope="module", params=list(CONFIGS))
def case(request, tmp_path_factory):
    """(model root, diffusers model, config name) for each tiny config."""
    root = tmp_path_factory.mktemp(request.param)
    model = randomize_(AutoencoderKLWan(**CONFIGS[request.param]), seed=7, std=0.2).eval()
    model.save_pretrained(root / "vae")
    return root, model, request.param


@pytest.fixture(scope="module")
def vae(case) -> WanVAE:
    return load_vae(case[0])


@pytest.mark.parametrize("latent_frames", [1, 2, 5])
def test_decode_matches_diffusers(case, vae, latent_frames):
    _, model, name = case
    z = randn((2, CONFIGS[name]["z_dim"], latent_frames, *LATENT_HW), seed=latent_frames)
    with torch.no_grad():
        ref = model.decode(z).sample.numpy()
    ours = np.asarray(vae.decode(jnp.asarray(z.numpy())))
    assert ref.shape == (2, 3, 1 + 4 * (latent_frames - 1), 24, 40)
    assert ours.shape == ref.shape and ours.dtype == np.float32
    assert_not_saturated(ref)
    assert relative_error(ours, ref) <= 1e-5


def test_decode_uint8_matches_pipeline_postprocessing(case, vae):
    """Normalised latents in, frames out, as WanPipeline's denormalisation + VideoProcessor + PIL."""
    _, model, name = case
    normalized = randn((2, CONFIGS[name]["z_dim"], 5, *LATENT_HW), seed=11)
    cfg = model.config
    mean = torch.tensor(cfg.latents_mean).view(1, cfg.z_dim, 1, 1, 1)
    inv_std = 1.0 / torch.tensor(cfg.latents_std).view(1, cfg.z_dim, 1, 1, 1)
    with torch.no_grad():
        video = model.decode(normalized / inv_std + mean).sample
    frames = (video * 0.5 + 0.5).clamp(0, 1).permute(0, 2, 3, 4, 1).numpy()
    ref = (frames * 255).round().astype(np.uint8)

    ours = vae.decode_uint8(jnp.asarray(normalized.numpy()))
    assert ours.dtype == jnp.uint8 and ours.shape == ref.shape == (2, 17, 24, 40, 3)
    assert_not_saturated(video.numpy())
    assert ref.std() > 20  # frames span the range
    assert np.abs(np.asarray(ours, np.int16) - ref).max() <= 1


@pytest.mark.parametrize("num_frames", [1, 7, 17])
def test_encode_matches_diffusers(case, vae, num_frames):
    """Posterior mean; 7 frames also checks that the incomplete last group is dropped as upstream."""
    _, model, _ = case
    video = (
        torch.rand((2, 3, num_frames, 24, 40), generator=torch.Generator().manual_seed(num_frames)) * 2 - 1
    )
    with torch.no_grad():
        ref = model.encode(video).latent_dist.mean.numpy()
    ours = np.asarray(vae.encode(jnp.asarray(video.numpy())))
    assert ours.shape == ref.shape == (2, model.config.z_dim, 1 + (num_frames - 1) // 4, *LATENT_HW)
    assert relative_error(ours, ref) <= 1e-5


def test_latent_normalisation_round_trip(case, vae):
    _, _model, name = case
    latents = jnp.asarray(randn((1, CONFIGS[name]["z_dim"], 2, *LATENT_HW), seed=3).numpy())
    back = vae.denormalize_latents(vae.normalize_latents(latents))
    np.testing.assert_allclose(np.asarray(back), np.asarray(latents), rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------------------------
# Chunking: every chunk size is the same computation


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """(model root, diffusers model, wanjax VAE) of the ``small`` config."""
    root = tmp_path_factory.mktemp("small_chunks")
    model = randomize_(AutoencoderKLWan(**CONFIGS["small"]), seed=5, std=0.2).eval()
    model.save_pretrained(root / "vae")
    return root, model, load_vae(root)


def test_decode_chunk_sizes_give_identical_frames(small):
    """Bit-identical: inside a chunk the decoder still runs one latent frame at a time, so every
    operation has the same shape (and XLA the same kernel and summation order) whatever the chunk."""
    _, _, base = small
    z = jnp.asarray(randn((2, 4, 5, *LATENT_HW), seed=21).numpy())  # 4 latent frames after the first
    frames, videos = [], []
    for chunk in (1, 2, 3, "all"):
        vae = WanVAE(base.cfg, base.params, decode_chunk=chunk)
        frames.append(np.asarray(vae.decode_uint8(z)))
        videos.append(np.asarray(vae.decode(z)))
    assert frames[0].shape == (2, 17, 24, 40, 3)
    for out, video in zip(frames[1:], videos[1:], strict=True):
        np.testing.assert_array_equal(out, frames[0])
        np.testing.assert_array_equal(video, videos[0])


def test_decode_float_chunks_and_steps_agree_to_rounding(small):
    """One latent frame per step and one video frame per inner step vs. everything at once."""
    _, _, base = small
    z = jnp.asarray(randn((2, 4, 5, *LATENT_HW), seed=22).numpy())
    one = base.decode(z)
    whole = WanVAE(base.cfg, base.params, decode_chunk="all", frames_per_step=4).decode(z)
    assert np.abs(np.asarray(one) - np.asarray(whole)).max() <= 1e-5


def test_cache_forms_decode_alike(small):
    """The causal cache forms (owed partial sums of C -> C convs; the low-resolution frames of a
    residual block right after an upsampling, recomputed; plain input frames, as when sharded)
    decode the same video, up to float32 rounding of the sums' order."""
    _, _, base = small
    z = jnp.asarray(randn((1, 4, 4, *LATENT_HW), seed=23).numpy())
    nm = base.numerics
    assert nm.owed_cache and nm.lowres_cache
    without_lowres = dataclasses.replace(nm, lowres_cache=False)
    # this config has blocks that recompute (counted exactly against the trace in test_flops)
    assert (
        vae_decode_flops(base.cfg, z.shape, nm).total
        > vae_decode_flops(base.cfg, z.shape, without_lowres).total
    )
    run = jax.jit(vae_module.decode, static_argnames=("cfg", "nm", "chunk", "frames"))
    plain = dataclasses.replace(nm, owed_cache=False, lowres_cache=False)
    ref = np.asarray(run(base.params, base.cfg, z, nm=plain, chunk=1, frames=1))
    for form in (nm, without_lowres, dataclasses.replace(nm, owed_cache=False)):
        assert relative_error(run(base.params, base.cfg, z, nm=form, chunk=1, frames=1), ref) <= 1e-6


def test_encode_chunk_sizes_give_identical_latents(small):
    _, _, base = small
    video = torch.rand((2, 3, 17, 24, 40), generator=torch.Generator().manual_seed(2)) * 2 - 1
    outs = []
    for chunk in (1, 3, "all"):
        vae = WanVAE(base.cfg, base.params, encoder_params=base.encoder_params, encode_chunk=chunk)
        outs.append(np.asarray(vae.encode(jnp.asarray(video.numpy()))))
    for out in outs[1:]:
        np.testing.assert_array_equal(out, outs[0])


def test_decode_memory_does_not_grow_with_length():
    """The compiled program's scratch memory is the same for 3 and 17 latent frames, apart from the
    (uint8) output itself, and less than two full-resolution activations of the whole video (what a
    whole-sequence decode needs at the least)."""
    cfg = VAEConfig(
        base_dim=8, z_dim=4, dim_mult=(1, 2, 2, 2), latents_mean=(0.0,) * 4, latents_std=(1.0,) * 4
    )
    params = abstract_params(checkpoint_spec(cfg, "decoder"), jnp.float32)
    vae = WanVAE(cfg, params)

    def memory(latent_frames: int):
        z = jax.ShapeDtypeStruct((1, 4, latent_frames, 12, 16), jnp.float32)
        stats = vae.lower("decode_uint8", z).compile().memory_analysis()
        return stats.temp_size_in_bytes, stats.output_size_in_bytes

    (temp_short, out_short), (temp_long, out_long) = memory(3), memory(17)
    assert out_long - out_short == (65 - 9) * 96 * 128 * 3  # uint8 frames
    assert temp_long - temp_short <= 2 * (out_long - out_short)
    whole_video_activation = 65 * 96 * 128 * 8 * 4  # float32, 8 channels at full resolution
    assert temp_long < 2 * whole_video_activation


def test_tiled_decode_matches_diffusers_tiling(small):
    """Blended spatial tiles, against diffusers' own tiled decode with the same tile geometry
    (32-pixel tiles every 24: clipped edge tiles, 8-pixel blends)."""
    root, model, _ = small
    model.enable_tiling(32, 32, 24, 24)
    normalized = randn((2, 4, 1, 5, 7), seed=31)  # one frame: the temporal path is tested above
    cfg = model.config
    mean = torch.tensor(cfg.latents_mean).view(1, cfg.z_dim, 1, 1, 1)
    inv_std = 1.0 / torch.tensor(cfg.latents_std).view(1, cfg.z_dim, 1, 1, 1)
    try:
        with torch.no_grad():
            ref = model.decode(normalized / inv_std + mean).sample.numpy()
    finally:
        model.disable_tiling()
    vae = load_vae(root, tiling=Tiling(size=32, stride=24))
    frames = np.asarray(vae.decode_uint8(jnp.asarray(normalized.numpy())))
    ref_frames = (np.clip(ref.transpose(0, 2, 3, 4, 1) * 0.5 + 0.5, 0, 1) * 255).round().astype(np.int16)
    assert frames.shape == ref_frames.shape == (2, 1, 40, 56, 3)
    assert np.abs(frames.astype(np.int16) - ref_frames).max() <= 1


# ----------------------------------------------------------------------------------------------
# Precision options


def test_weights_are_read_after_the_program_is_compiled(small, monkeypatch):
    """load_vae checks the checkpoint but reads each part's weights on first use, after that call's
    program is compiled (for the same program the eager weights give), so they can take the heap
    the compiler freed."""
    root, _, base = small
    events = []
    real_load, real_compiled = vae_module.load_params, vae_module._compiled
    monkeypatch.setattr(
        vae_module, "load_params", lambda *a, **k: events.append("read") or real_load(*a, **k)
    )
    monkeypatch.setattr(vae_module, "_compiled", lambda *a: events.append("compile") or real_compiled(*a))
    vae = load_vae(root)
    assert events == []
    z = jnp.asarray(randn((1, 4, 2, *LATENT_HW), seed=8).numpy())
    out = np.asarray(vae.decode(z))
    assert events == ["compile", "read"]
    vae.decode(z)
    assert events == ["compile", "read", "compile"]  # read once; the program comes from the cache
    eager = WanVAE(base.cfg, base.params)  # weights given as arrays: programs compiled for them
    assert vae.compile("decode", z) is eager.compile("decode", z)
    np.testing.assert_array_equal(out, np.asarray(eager.decode(z)))


def test_bfloat16_activations_close_to_float32_reference(small):
    root, model, _ = small
    z = randn((2, 4, 1, *LATENT_HW), seed=4)
    with torch.no_grad():
        ref = model.decode(z).sample.numpy()
    vae = load_vae(root, dtype="bfloat16")
    assert vae.params["decoder.conv_in"]["kernel"].dtype == jnp.bfloat16
    out = vae.decode(jnp.asarray(z.numpy()))
    assert out.dtype == jnp.bfloat16
    assert relative_error(out.astype(jnp.float32), ref) <= 3e-2


def test_bfloat16_weights_float32_activations(small):
    root, model, _ = small
    z = randn((2, 4, 1, *LATENT_HW), seed=4)
    with torch.no_grad():
        ref = model.decode(z).sample.numpy()
    vae = load_vae(root, dtype="float32", weights_dtype="bf16")
    assert vae.params["decoder.conv_in"]["kernel"].dtype == jnp.bfloat16
    out = vae.decode(jnp.asarray(z.numpy()))
    assert out.dtype == jnp.float32
    assert 1e-6 < relative_error(out, ref) <= 3e-2  # weights rounded, math in float32


# ----------------------------------------------------------------------------------------------
# Config and checkpoint layout


def test_config_defaults_equal_diffusers():
    defaults = {
        name: p.default
        for name, p in inspect.signature(AutoencoderKLWan.__init__).parameters.items()
        if name != "self"
    }
    ours = VAEConfig().to_dict()
    for name, value in defaults.items():
        assert ours[name] == (list(value) if isinstance(value, tuple) else value), name


def test_checkpoint_spec_names_and_shapes_equal_diffusers():
    with torch.device("meta"):
        model = AutoencoderKLWan()  # the real architecture, no memory
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    spec = checkpoint_spec(VAEConfig())
    ours = {n: s.shape for s in jax.tree.leaves(spec) for n in s.names}
    assert ours == expected
    assert len(ours) == 194


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("is_residual", True, "Wan 2.2"),
        ("patch_size", 2, "Wan 2.2"),
        ("clip_output", False, "clip_output"),
        ("temperal_downsample", [False, True], r"needs len\(dim_mult\) - 1 = 3"),
        ("temperal_downsample", [True, True, True], "at most 2"),
        ("latents_mean", [0.0] * 3, "latents_mean"),
        ("scale_factor_spatial", 16, "scale_factor_spatial=16"),
        ("num_experts", 2, "unknown field"),
    ],
)
def test_config_errors(field, value, message):
    raw = VAEConfig().to_dict()
    raw[field] = value
    with pytest.raises(ConfigError, match=message):
        VAEConfig.from_dict(raw)


def test_unsupported_checkpoint_rejected_on_load(tmp_path, case):
    root, _, _ = case
    vae_dir = tmp_path / "vae"
    vae_dir.mkdir()
    raw = json.loads((root / "vae" / "config.json").read_text())
    raw["is_residual"] = True
    (vae_dir / "config.json").write_text(json.dumps(raw))
    (vae_dir / "diffusion_pytorch_model.safetensors").symlink_to(
        root / "vae" / "diffusion_pytorch_model.safetensors"
    )
    with pytest.raises(ConfigError, match="is_residual"):
        load_vae(tmp_path)


def test_bad_options_and_inputs(case, vae):
    root, _, _ = case
    for bad in (0, -1, "some", 1.5, True):
        with pytest.raises(ConfigError, match="decode_chunk"):
            load_vae(root, decode_chunk=bad)
    with pytest.raises(ConfigError, match="latents must be"):
        vae.decode(jnp.zeros((1, 3, 2, 3, 5)))
    with pytest.raises(ConfigError, match="video must be"):
        vae.encode(jnp.zeros((1, 4, 5, 24, 40)))
    with pytest.raises(ConfigError, match="unknown dtype"):
        load_vae(root, dtype="float8")
