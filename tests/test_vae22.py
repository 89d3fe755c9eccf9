"""The Wan 2.2 VAE (residual blocks, 2x2 patches, 48 latent channels) through wanjax equals diffusers'
AutoencoderKLWan on the same (random) weights.

Tiny configs saved with ``save_pretrained`` (plus the ``clip_output: false`` real Wan 2.2 configs
carry, which diffusers 0.42.1 ignores) and loaded through ``load_vae``. All expected values come from
diffusers (or its pipeline's post-processing), never from wanjax. Relative error: max|a - b| / max|b|.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from diffusers import AutoencoderKLWan
from helpers.models import randomize_
from helpers.vae import assert_not_saturated, pipeline_frames, randn

from wanjax.errors import ConfigError
from wanjax.io.checkpoint import abstract_params
from wanjax.models.vae import Tiling, VAEConfig, WanVAE, checkpoint_spec, load_vae

WAN22 = dict(is_residual=True, patch_size=2, in_channels=12, out_channels=12, scale_factor_spatial=16)
CONFIGS = {
    # the real layout (temporal up/downsampling at the real levels, a decoder wider than the
    # encoder), narrow; as in the real VAE, every temporal DupUp3D repeats whole channels
    "wan22_like": dict(
        WAN22,
        base_dim=8,
        decoder_base_dim=12,
        z_dim=12,
        dim_mult=[1, 2, 4, 4],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
        latents_mean=[0.05 * i - 0.3 for i in range(12)],
        latents_std=[0.5 + 0.1 * i for i in range(12)],
    ),
    # a temporal DupUp3D that halves the channels (each output frame phase repeats other inputs),
    # a temporal AvgDown3D at full resolution, and a last encoder block that averages channel pairs
    "phases": dict(
        WAN22,
        base_dim=8,
        z_dim=8,
        dim_mult=[1, 2, 4, 2],
        num_res_blocks=1,
        temperal_downsample=[True, False, True],
        latents_mean=[0.1 * i for i in range(8)],
        latents_std=[1.0 + 0.1 * i for i in range(8)],
    ),
}
LATENT_HW = (3, 5)  # 48 x 80 frames: non-square, odd latent sizes


def relative_error(ours, ref) -> float:
    ours = np.asarray(ours, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


def random_video(num_frames: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand((2, 3, num_frames, 16 * LATENT_HW[0], 16 * LATENT_HW[1]), generator=gen) * 2 - 1


def save(model: AutoencoderKLWan, root) -> None:
    """``model`` saved as ``root/vae``, its config saying ``clip_output: false`` as Wan 2.2's does."""
    model.save_pretrained(root / "vae")
    path = root / "vae" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "clip_output": False}))


def build(name: str, tmp_path_factory) -> tuple[AutoencoderKLWan, WanVAE]:
    root = tmp_path_factory.mktemp(name)
    torch.manual_seed(0)
    model = randomize_(AutoencoderKLWan(**CONFIGS[name]), seed=7, std=0.2).eval()
    save(model, root)
    return model, load_vae(root)


@pytest.fixture(scope="module")
def wan22(tmp_path_factory):
    """(diffusers model, wanjax VAE, model root) of the ``wan22_like`` config."""
    return build("wan22_like", tmp_path_factory)


@pytest.fixture(scope="module")
def phases(tmp_path_factory):
    return build("phases", tmp_path_factory)


@pytest.mark.slow
@pytest.mark.parametrize("latent_frames", [1, 2, 3])
def test_decode_matches_diffusers(wan22, latent_frames):
    model, vae = wan22
    z = randn((2, 12, latent_frames, *LATENT_HW), seed=latent_frames)
    with torch.no_grad():
        ref = model.decode(z).sample.numpy()
    ours = np.asarray(vae.decode(jnp.asarray(z.numpy())))
    assert ref.shape == (2, 3, 1 + 4 * (latent_frames - 1), 48, 80)
    assert ours.shape == ref.shape and ours.dtype == np.float32
    assert_not_saturated(ref)
    assert relative_error(ours, ref) <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("num_frames", [1, 5, 9])
def test_encode_matches_diffusers(wan22, num_frames):
    model, vae = wan22
    video = random_video(num_frames, seed=num_frames)
    with torch.no_grad():
        ref = model.encode(video).latent_dist.mode().numpy()
    ours = np.asarray(vae.encode(jnp.asarray(video.numpy())))
    assert ours.shape == ref.shape == (2, 12, 1 + (num_frames - 1) // 4, *LATENT_HW)
    assert relative_error(ours, ref) <= 1e-5


@pytest.mark.slow
def test_decode_uint8_matches_pipeline_postprocessing(wan22):
    """Normalised latents in (48-style statistics, one per channel), frames out, as WanPipeline's
    denormalisation + VideoProcessor + PIL."""
    model, vae = wan22
    normalized = randn((2, 12, 3, *LATENT_HW), seed=11)
    video, ref = pipeline_frames(model, normalized)
    ours = vae.decode_uint8(jnp.asarray(normalized.numpy()))
    assert ours.dtype == jnp.uint8 and ours.shape == ref.shape == (2, 9, 48, 80, 3)
    assert_not_saturated(video)
    assert ref.std() > 20  # frames span the range
    assert np.abs(np.asarray(ours, np.int16) - ref).max() <= 1


@pytest.mark.slow
@pytest.mark.parametrize(("conv", "first_frame"), [("auto", "auto"), ("ring", "alone"), ("ring", "scan")])
def test_shortcut_phases_match_diffusers(phases, conv, first_frame):
    """Decode where each frame of a temporal DupUp3D repeats other input channels, and encode with a
    temporal AvgDown3D on the first level (frame 0 averaged with a zero frame) and a last block
    averaging channel pairs; also with the accelerators' ring caches (the encoder's steps after a
    temporal downsampling take the ring's frames in order) and the TPU's first latent frame in the
    scan (its one frame takes DupUp3D's last phase)."""
    model, vae = phases
    if conv != "auto":
        options = dict(conv=conv, first_frame=first_frame)
        vae = WanVAE(vae.cfg, vae.params, encoder_params=vae.encoder_params, **options)
    z = randn((2, 8, 3, *LATENT_HW), seed=5)
    video = random_video(5, seed=6)
    with torch.no_grad():
        ref = model.decode(z).sample.numpy()
        ref_latents = model.encode(video).latent_dist.mode().numpy()
    assert_not_saturated(ref)
    assert relative_error(vae.decode(jnp.asarray(z.numpy())), ref) <= 1e-5
    assert relative_error(vae.encode(jnp.asarray(video.numpy())), ref_latents) <= 1e-5


@pytest.mark.slow
def test_decode_in_larger_steps_matches_diffusers(phases):
    """All latent frames in one scan step and four video frames per inner step: the doubled frames
    and their shortcut frames (both phases) made several at a time."""
    model, base = phases
    vae = WanVAE(base.cfg, base.params, decode_chunk="all", frames_per_step=4)
    z = randn((2, 8, 3, *LATENT_HW), seed=7)
    with torch.no_grad():
        ref = model.decode(z).sample.numpy()
    assert relative_error(vae.decode(jnp.asarray(z.numpy())), ref) <= 1e-5


@pytest.mark.slow
def test_tiled_decode_matches_diffusers_tiling(phases):
    """Blended spatial tiles, against diffusers' own tiled decode with the same geometry (64-pixel
    tiles every 48: latent tiles of 4 every 3, blended and cropped in patch pixels, then unpatched).
    Two tiles, one above the other (the horizontal blend is the same code, tested in test_vae.py)."""
    model, base = phases
    z = randn((2, 8, 1, 5, 3), seed=31)
    model.enable_tiling(64, 64, 48, 48)
    try:
        with torch.no_grad():
            ref = model.decode(z).sample.numpy()
    finally:
        model.disable_tiling()
    vae = WanVAE(base.cfg, base.params, tiling=Tiling(size=64, stride=48))
    ours = np.asarray(vae.decode(jnp.asarray(z.numpy())))
    assert ours.shape == ref.shape == (2, 3, 1, 80, 48)
    assert relative_error(ours, ref) <= 1e-5


@pytest.mark.slow
def test_decode_memory_does_not_grow_with_length():
    """The compiled program's scratch memory is the same for 3 and 17 latent frames, apart from the
    (uint8) output itself, and less than two activations of the whole video at the decoder's output
    resolution (what a whole-sequence decode needs at the least)."""
    cfg = VAEConfig(
        **{**WAN22, "base_dim": 8, "z_dim": 8, "dim_mult": (1, 2, 2, 2)},
        latents_mean=(0.0,) * 8,
        latents_std=(1.0,) * 8,
    )
    params = abstract_params(checkpoint_spec(cfg, "decoder"), jnp.float32)
    vae = WanVAE(cfg, params)

    def memory(latent_frames: int):
        z = jax.ShapeDtypeStruct((1, 8, latent_frames, 6, 8), jnp.float32)
        stats = vae.lower("decode_uint8", z).compile().memory_analysis()
        return stats.temp_size_in_bytes, stats.output_size_in_bytes

    (temp_short, out_short), (temp_long, out_long) = memory(3), memory(17)
    assert out_long - out_short == (65 - 9) * 96 * 128 * 3  # uint8 frames
    assert temp_long - temp_short <= 2 * (out_long - out_short)
    whole_video_activation = 65 * 48 * 64 * 8 * 4  # float32, 8 channels at 48 x 64 (patches)
    assert temp_long < 2 * whole_video_activation


# ----------------------------------------------------------------------------------------------
# Config and checkpoint layout

REAL_WAN22 = dict(
    WAN22,
    base_dim=160,
    decoder_base_dim=256,
    z_dim=48,
    latents_mean=[0.0] * 48,
    latents_std=[1.0] * 48,
)


@pytest.mark.parametrize("config", ["real", *CONFIGS])
def test_checkpoint_spec_names_and_shapes_equal_diffusers(config):
    raw = REAL_WAN22 if config == "real" else CONFIGS[config]
    with torch.device("meta"):
        model = AutoencoderKLWan(**raw)  # no memory
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    spec = checkpoint_spec(VAEConfig.from_dict({**raw, "clip_output": False}))
    ours = {n: s.shape for s in jax.tree.leaves(spec) for n in s.names}
    assert ours == expected
    if config == "real":
        assert len(ours) == 196


def test_real_config_factors():
    """The pipeline maps video sizes to latents with these: 16 pixels per latent (8 from the levels,
    2 from the patches), 4 frames, 48 channels; video of 3 channels (12 per patch)."""
    cfg = VAEConfig.from_dict({**REAL_WAN22, "clip_output": False})
    assert (cfg.spatial_factor, cfg.resampling_factor, cfg.temporal_factor) == (16, 8, 4)
    assert (cfg.z_dim, cfg.video_channels, cfg.output_channels) == (48, 3, 3)
    assert (cfg.num_frames(31), cfg.latent_frames(121)) == (121, 31)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"in_channels": 3}, r"in_channels=3 must be a positive multiple of patch_size\*\*2 = 4"),
        ({"out_channels": 6}, r"out_channels=6 must be a positive multiple"),
        ({"patch_size": 0}, "patch_size must be a positive integer"),
        (
            {"scale_factor_spatial": 8},
            r"scale_factor_spatial=8 but dim_mult/temperal_downsample/patch_size give 16",
        ),
        # diffusers cannot build these shortcuts: 2 -> 4 channels averaged, 8 -> 1 repeated 1/2 times
        ({"dim_mult": [1, 2, 2, 4]}, r"encoder.down_blocks.3.avg_shortcut .*in \* factor % out"),
        ({"dim_mult": [1, 1, 8, 8]}, r"decoder.up_blocks.2.avg_shortcut .*out \* factor % in"),
    ],
)
def test_config_errors(changes, message):
    with pytest.raises(ConfigError, match=message):
        VAEConfig.from_dict({**REAL_WAN22, **changes})


def test_encode_needs_whole_shortcut_grids(wan22):
    """The residual blocks halve H and W exactly at every level: diffusers cannot encode other sizes."""
    _, vae = wan22
    with pytest.raises(ConfigError, match=r"multiples of 16, got \(40, 80\)"):
        vae.encode(jnp.zeros((1, 3, 1, 40, 80)))
    with pytest.raises(ConfigError, match=r"video must be \(B, 3, T, H, W\)"):
        vae.encode(jnp.zeros((1, 12, 1, 48, 80)))
