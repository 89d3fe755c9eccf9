"""The Wan 2.1 VAE through wanjax equals diffusers' AutoencoderKLWan on the same (random) weights.

Tiny configs saved with ``save_pretrained``; every weight is random, RMS-norm gammas included. All
expected values come from diffusers (or its pipeline's post-processing), never from wanjax.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from diffusers import AutoencoderKLWan
from helpers.compare import relative_error
from helpers.models import randomize_
from helpers.vae import CONFIGS, LATENT_HW, assert_not_saturated, pipeline_frames, randn

from wanjax.errors import CheckpointError, ConfigError
from wanjax.io.checkpoint import abstract_params
from wanjax.models import vae as vae_module
from wanjax.models.vae import Tiling, VAEConfig, WanVAE, checkpoint_spec, load_vae
from wanjax.models.vae import model as vae_model
from wanjax.models.vae import programs as vae_programs
from wanjax.runtime import child_compile, programs
from wanjax.runtime.timing import CompileMeter
from wanjax.tools.flops import vae_decode_flops


@pytest.fixture(scope="module", params=["small", pytest.param("wan_like", marks=pytest.mark.slow)])
def case(request, tmp_path_factory):
    """(model root, diffusers model, config name) for each tiny config."""
    root = tmp_path_factory.mktemp(request.param)
    model = randomize_(AutoencoderKLWan(**CONFIGS[request.param]), seed=7, std=0.2).eval()
    model.save_pretrained(root / "vae")
    return root, model, request.param


@pytest.fixture(scope="module")
def vae(case) -> WanVAE:
    return load_vae(case[0])


@pytest.mark.parametrize(
    "latent_frames", [pytest.param(1, marks=pytest.mark.slow), 2, pytest.param(5, marks=pytest.mark.slow)]
)
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


@pytest.mark.slow
def test_decode_uint8_matches_pipeline_postprocessing(case, vae):
    """Normalised latents in, frames out, as WanPipeline's denormalisation + VideoProcessor + PIL."""
    _, model, name = case
    normalized = randn((2, CONFIGS[name]["z_dim"], 5, *LATENT_HW), seed=11)
    video, ref = pipeline_frames(model, normalized)
    ours = vae.decode_uint8(jnp.asarray(normalized.numpy()))
    assert ours.dtype == jnp.uint8 and ours.shape == ref.shape == (2, 17, 24, 40, 3)
    assert_not_saturated(video)
    assert ref.std() > 20  # frames span the range
    assert np.abs(np.asarray(ours, np.int16) - ref).max() <= 1


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.bit_for_bit
@pytest.mark.parametrize("first_frame", ["alone", "scan"])
def test_decode_chunk_sizes_give_identical_frames(small, first_frame):
    """Bit-identical: inside a chunk the decoder still runs one latent frame at a time, so every
    operation has the same shape (and XLA the same kernel and summation order) whatever the chunk;
    also where the scan decodes the first latent frame in its first chunk (a TPU's)."""
    _, _, base = small
    z = jnp.asarray(randn((2, 4, 5, *LATENT_HW), seed=21).numpy())  # 4 latent frames after the first
    frames, videos = [], []
    for chunk in (1, 3, "all"):  # 3: a padded last chunk
        vae = WanVAE(base.cfg, base.params, decode_chunk=chunk, first_frame=first_frame)
        frames.append(np.asarray(vae.decode_uint8(z)))
        videos.append(np.asarray(vae.decode(z)))
    assert frames[0].shape == (2, 17, 24, 40, 3)
    for out, video in zip(frames[1:], videos[1:], strict=True):
        np.testing.assert_array_equal(out, frames[0])
        np.testing.assert_array_equal(video, videos[0])


@pytest.mark.slow
def test_decode_float_chunks_and_steps_agree_to_rounding(small):
    """One latent frame per step and one video frame per inner step vs. everything at once."""
    _, _, base = small
    z = jnp.asarray(randn((2, 4, 5, *LATENT_HW), seed=22).numpy())
    one = base.decode(z)
    whole = WanVAE(base.cfg, base.params, decode_chunk="all", frames_per_step=4).decode(z)
    assert np.abs(np.asarray(one) - np.asarray(whole)).max() <= 1e-5


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.bit_for_bit
def test_encode_chunk_sizes_give_identical_latents(small):
    _, _, base = small
    video = torch.rand((2, 3, 17, 24, 40), generator=torch.Generator().manual_seed(2)) * 2 - 1
    outs = []
    for chunk in (1, 3, "all"):
        vae = WanVAE(base.cfg, base.params, encoder_params=base.encoder_params, encode_chunk=chunk)
        outs.append(np.asarray(vae.encode(jnp.asarray(video.numpy()))))
    for out in outs[1:]:
        np.testing.assert_array_equal(out, outs[0])


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.bit_for_bit
@pytest.mark.parametrize("first_frame", ["alone", "scan"])
def test_ring_cache_matches_diffusers(case, vae, first_frame):
    """The accelerators' formulation (3-D convolutions over three-frame ring caches, the kernel's
    taps rotated to the slots): decode and encode equal diffusers (one-frame steps write into the
    ring; the encoder's two-frame steps take its frames in order), and the frames do not depend on
    the chunk size; with the first latent frame decoded alone (GPUs) or by the scan's body from a
    zero cache (TPUs: its skipped steps leave the cache as it was)."""
    _, model, name = case
    options = dict(conv="ring", first_frame=first_frame)
    ring = WanVAE(vae.cfg, vae.params, encoder_params=vae.encoder_params, **options)
    z = randn((2, CONFIGS[name]["z_dim"], 5, *LATENT_HW), seed=31)
    video = torch.rand((2, 3, 17, 24, 40), generator=torch.Generator().manual_seed(32)) * 2 - 1
    with torch.no_grad():
        ref = model.decode(z).sample.numpy()
        ref_latents = model.encode(video).latent_dist.mean.numpy()
    decoded = np.asarray(ring.decode(jnp.asarray(z.numpy())))
    assert_not_saturated(ref)
    assert relative_error(decoded, ref) <= 1e-5
    assert relative_error(ring.encode(jnp.asarray(video.numpy())), ref_latents) <= 1e-5
    whole = WanVAE(vae.cfg, vae.params, decode_chunk="all", **options)
    np.testing.assert_array_equal(np.asarray(whole.decode(jnp.asarray(z.numpy()))), decoded)


@pytest.mark.slow
def test_ring_cache_is_written_in_place():
    """The compiled float32 decode: the concatenated form builds a 3-frame window per causal conv and
    shifts its cache by copying frames; the ring writes each new frame into its cache in place (a
    dynamic-update-slice of the loop carry): no window, no output-resolution frame copied, no
    larger program. The norm and SiLU before each conv are computed inside that write: no
    output-resolution frame is made by a fusion of its own."""
    cfg = VAEConfig(
        base_dim=8, z_dim=4, dim_mult=(1, 2, 2, 2), latents_mean=(0.0,) * 4, latents_std=(1.0,) * 4
    )
    params = abstract_params(checkpoint_spec(cfg, "decoder"), jnp.float32)
    z = jax.ShapeDtypeStruct((1, 4, 3, 12, 16), jnp.float32)
    compiled = {
        conv: WanVAE(cfg, params, conv=conv).lower("decode_uint8", z).compile() for conv in ("conv3d", "ring")
    }

    def ops(conv: str, shape: str, kind: str) -> int:
        pattern = rf"= f32\[{shape}\]\{{[^}}]*\}} {kind}\("
        return len(re.findall(pattern, compiled[conv].as_text()))

    window, frame = r"1,3,\d+,\d+,\d+", "1,96,128,8"  # the decoder's output-resolution frames
    assert ops("conv3d", window, "concatenate") > 0 and ops("conv3d", frame, "copy") > 0
    assert ops("ring", window, "concatenate") == 0 and ops("ring", frame, "copy") == 0
    assert ops("conv3d", frame, "fusion") > 0 and ops("ring", frame, "fusion") == 0
    assert ops("ring", window, "dynamic-update-slice") >= 7  # one per output-resolution conv at least
    temp = {conv: c.memory_analysis().temp_size_in_bytes for conv, c in compiled.items()}
    assert temp["ring"] <= temp["conv3d"]


@pytest.mark.slow
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
# Compiling: before the weights are read, and in a child process


@pytest.mark.slow
def test_weights_are_read_after_the_program_is_compiled(small, monkeypatch):
    """load_vae checks the checkpoint but reads each part's weights on first use, after that call's
    program is compiled (for the same program the eager weights give), so they can take the heap
    the compiler freed."""
    root, _, base = small
    events = []
    real_load, real_compiled = vae_model.load_params, vae_programs.compiled
    monkeypatch.setattr(vae_model, "load_params", lambda *a, **k: events.append("read") or real_load(*a, **k))
    monkeypatch.setattr(vae_programs, "compiled", lambda *a: events.append("compile") or real_compiled(*a))
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


@pytest.mark.slow
def test_programs_compiled_in_a_child_decode_and_encode_identically(small, monkeypatch):
    """The child compiles the same programs: identical frames and latents, and the child did run."""
    _, _, base = small
    built = []
    real = child_compile.compile_in_child
    monkeypatch.setattr(child_compile, "compile_in_child", lambda *a: built.append(a[1]) or real(*a))
    z = jnp.asarray(randn((1, 4, 3, *LATENT_HW), seed=41).numpy())
    video = jnp.asarray(
        (torch.rand((1, 3, 9, 24, 40), generator=torch.Generator().manual_seed(42)) * 2 - 1).numpy()
    )
    parts = {"encoder_params": base.encoder_params}
    here = WanVAE(base.cfg, base.params, **parts, compile_in_child=False)
    there = WanVAE(base.cfg, base.params, **parts, compile_in_child=True)
    for method, x in (("decode_uint8", z), ("decode", z), ("encode", video)):
        np.testing.assert_array_equal(
            np.asarray(getattr(there, method)(x)), np.asarray(getattr(here, method)(x))
        )
    assert built == ["decode_uint8", "decode", "encode"]


@pytest.mark.slow
def test_a_failing_child_compile_falls_back_to_this_process(small, monkeypatch):
    """No interpreter for the child, or a child that fails: one warning naming why, then the
    program is compiled here and decodes as usual."""
    _, _, base = small
    with pytest.raises(child_compile.ChildCompileError, match=r"AttributeError.*no_such_builder"):
        child_compile.compile_in_child("wanjax.models.vae.programs:no_such_builder")
    monkeypatch.setattr(child_compile.sys, "executable", "/nonexistent/python")
    z = jnp.asarray(randn((1, 4, 2, *LATENT_HW), seed=43).numpy())
    vae = WanVAE(base.cfg, base.params, compile_in_child=True, decode_chunk=2)  # a program of its own
    with pytest.warns(RuntimeWarning, match=r"could not start a child process.*compiling in this process"):
        out = np.asarray(vae.decode(z))
    np.testing.assert_array_equal(out, np.asarray(WanVAE(base.cfg, base.params, decode_chunk=2).decode(z)))


def _child_program(vae: WanVAE, x: jax.Array) -> tuple:
    """The builder arguments ``WanVAE.compile`` gives a child for ``decode`` of ``x``."""
    unplaced = programs.unplaced(programs.signature(vae.params))
    return (
        "wanjax.models.vae.programs:lower_program",
        "decode",
        vae._statics_for("decode", x),
        unplaced,
        (x.shape, x.dtype, None),
    )


@pytest.mark.slow
def test_child_keeps_executables_in_a_store_and_reuses_them(small, tmp_path, monkeypatch):
    """A second child takes the serialized executable the first stored (nothing recompiled), and
    the run report counts both; a damaged entry is reported (so the VAE compiles here instead); a
    store that cannot be written is skipped."""
    _, _, base = small
    store = tmp_path / "executables"
    monkeypatch.setattr(child_compile, "executable_store", lambda: store)
    z = jnp.asarray(randn((1, 4, 3, *LATENT_HW), seed=44).numpy())
    expected = np.asarray(WanVAE(base.cfg, base.params, compile_in_child=False).decode(z))
    program = _child_program(base, z)
    with CompileMeter() as built:
        first = child_compile.compile_in_child(*program)
    (entry,) = store.iterdir()
    stamp = entry.stat().st_mtime_ns
    with CompileMeter() as stored:
        second = child_compile.compile_in_child(*program)
    assert list(store.iterdir()) == [entry] and entry.stat().st_mtime_ns == stamp
    # reported as JAX's own compiles are: a program each time, a cache hit the second time
    assert (built.programs, built.cache_hits, stored.programs, stored.cache_hits) == (1, 0, 1, 1)
    assert built.seconds > 0 and stored.seconds > 0
    for compiled in (first, second):
        np.testing.assert_array_equal(np.asarray(compiled(base.params, vae_latents=z)), expected)
    entry.write_bytes(b"not an executable")
    with pytest.raises(child_compile.ChildCompileError, match="loading the executable"):
        child_compile.compile_in_child(*program)
    blocked = tmp_path / "a_file"  # a store that cannot be made: the program is still built
    blocked.write_text("")
    monkeypatch.setattr(child_compile, "executable_store", lambda: blocked / "executables")
    compiled = child_compile.compile_in_child(*program)
    np.testing.assert_array_equal(np.asarray(compiled(base.params, vae_latents=z)), expected)


@pytest.mark.slow
def test_child_never_compiles_through_the_jax_cache(small, tmp_path, monkeypatch):
    """An executable loaded from JAX's persistent cache serializes without its kernels on the CPU;
    a child that took the program from there would hand over one that fails when run. With that
    cache on in the environment (and no store), a second child compile of the same program runs."""
    _, _, base = small
    monkeypatch.setattr(child_compile, "executable_store", lambda: None)
    for name, value in (
        ("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax")),
        ("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0"),
        ("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1"),
    ):
        monkeypatch.setenv(name, value)
    z = jnp.asarray(randn((1, 4, 2, *LATENT_HW), seed=45).numpy())
    expected = np.asarray(WanVAE(base.cfg, base.params, compile_in_child=False).decode(z))
    for _ in range(2):
        compiled = child_compile.compile_in_child(*_child_program(base, z))
        np.testing.assert_array_equal(np.asarray(compiled(base.params, vae_latents=z)), expected)


def test_executable_store_follows_the_jax_cache_setting(tmp_path):
    saved = {k: getattr(jax.config, k) for k in ("jax_enable_compilation_cache", "jax_compilation_cache_dir")}
    try:  # nothing is compiled while the settings are changed
        jax.config.update("jax_enable_compilation_cache", True)
        jax.config.update("jax_compilation_cache_dir", str(tmp_path / "jax"))
        assert child_compile.executable_store() == tmp_path / "jax-executables"
        jax.config.update("jax_compilation_cache_dir", "gs://bucket/jax")
        assert child_compile.executable_store() is None
        jax.config.update("jax_compilation_cache_dir", str(tmp_path / "jax"))
        jax.config.update("jax_enable_compilation_cache", False)
        assert child_compile.executable_store() is None
    finally:
        for key, value in saved.items():
            jax.config.update(key, value)


def test_programs_for_large_frames_compile_in_a_child_by_default(small):
    """Default: frames of at least 256 x 256 pixels (8x the latents when decoding); never when
    switched off. Deciding compiles nothing."""
    _, _, base = small
    auto, never = WanVAE(base.cfg, base.params), WanVAE(base.cfg, base.params, compile_in_child=False)
    signature = programs.signature(base.params)
    decides = lambda vae, method, shape: vae._compiles_in_child(method, jnp.zeros(shape), signature)  # noqa: E731
    assert child_compile.available()
    assert decides(auto, "decode", (1, 4, 2, 32, 32)) and decides(auto, "decode_uint8", (1, 4, 2, 16, 64))
    assert not decides(auto, "decode", (1, 4, 2, 31, 32)) and not decides(auto, "decode", (1, 4, 9, 3, 5))
    assert decides(auto, "encode", (1, 3, 5, 256, 256)) and not decides(auto, "encode", (1, 3, 5, 32, 32))
    assert not decides(never, "decode", (1, 4, 2, 64, 64))


# ----------------------------------------------------------------------------------------------
# Precision options


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
        ("patch_size", 2, r"in_channels=3 must be a positive multiple of patch_size\*\*2 = 4"),
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
    """A Wan 2.1 checkpoint whose config says Wan 2.2 (is_residual) fails the checkpoint check."""
    root, _, _ = case
    vae_dir = tmp_path / "vae"
    vae_dir.mkdir()
    raw = json.loads((root / "vae" / "config.json").read_text())
    raw["is_residual"] = True
    (vae_dir / "config.json").write_text(json.dumps(raw))
    (vae_dir / "diffusion_pytorch_model.safetensors").symlink_to(
        root / "vae" / "diffusion_pytorch_model.safetensors"
    )
    with pytest.raises(CheckpointError, match=r"does not match its config.json: missing tensors"):
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
    with pytest.raises(ConfigError, match="stride 4 is less than one latent pixel"):
        load_vae(root, tiling=Tiling(16, 4))


def test_tiling_and_chunk_options_parse_as_the_cli_gives_them():
    assert Tiling.parse("256") == Tiling(256, 192) and Tiling.parse("384:320") == Tiling(384, 320)
    for bad in ("", "big", "256:", "-8:4", "256:192:1"):
        with pytest.raises(ConfigError, match="SIZE or SIZE:STRIDE"):
            Tiling.parse(bad)
    assert (vae_module.parse_chunk("3", "c"), vae_module.parse_chunk("all", "c")) == (3, None)
