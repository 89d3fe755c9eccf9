"""The decode in parts (``WanVAE.decode_uint8(..., on_frames=...)``): the first latent frame, then
``decode_chunk`` at a time, each part its own call, reported as it finishes. Its frames are the one
program's bit for bit (the same operations on the same shapes): the Wan 2.1 and 2.2 VAEs, float32
and bfloat16, a padded last part, latents split in strips over 8 devices; non-finite values are
still found; a tiled decode stays one program. The terminal's count of them is in
``tests/test_first_use.py``."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from wanjax.errors import NumericalError
from wanjax.io.checkpoint import random_params
from wanjax.models.registry import DEMO_VAE, DEMO_VAE22
from wanjax.models.vae import WanVAE, checkpoint_spec
from wanjax.models.vae import programs as vae_programs
from wanjax.models.vae.tiling import Tiling

VAES = {"wan2.1": DEMO_VAE, "wan2.2": DEMO_VAE22}


def vae(name: str, dtype: str = "float32", sharding=None, **options) -> WanVAE:
    cfg = VAES[name]
    params = random_params(checkpoint_spec(cfg, "decoder"), "float32", 3, sharding)
    return WanVAE(cfg, params, dtype, **options)


def latents(name: str, frames: int, seed: int = 0) -> jnp.ndarray:
    shape = (2, VAES[name].z_dim, frames, 4, 6)
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def in_parts(model: WanVAE, z: jnp.ndarray) -> tuple[np.ndarray, list[tuple[int, int]]]:
    calls: list[tuple[int, int]] = []
    return np.asarray(model.decode_uint8(z, on_frames=lambda done, total: calls.append((done, total)))), calls


@pytest.mark.parametrize(
    ("name", "dtype", "chunk", "frames"),
    [
        ("wan2.1", "float32", 1, 4),
        ("wan2.2", "float32", 1, 3),
        ("wan2.1", "bfloat16", 2, 4),  # parts of 2 after the first: 2, then 1 padded to 2
        pytest.param("wan2.1", "float32", "all", 4, marks=pytest.mark.slow),
        pytest.param("wan2.1", "float32", 1, 1, marks=pytest.mark.slow),  # the first frame alone
    ],
)
@pytest.mark.bit_for_bit
def test_parts_give_the_one_programs_frames_bit_for_bit(name, dtype, chunk, frames):
    model = vae(name, dtype, decode_chunk=chunk)
    z = latents(name, frames)
    whole = np.asarray(model.decode_uint8(z))
    parts, calls = in_parts(model, z)
    np.testing.assert_array_equal(parts, whole)
    step = frames - 1 if chunk == "all" else chunk
    done = [1, *range(1 + step, frames, step), frames] if frames > 1 else [1]
    assert calls == [(d, frames) for d in dict.fromkeys(done)]


@pytest.mark.parametrize(
    ("name", "chunk", "frames"),
    [("wan2.1", 1, 3), ("wan2.2", 2, 3), pytest.param("wan2.1", "all", 2, marks=pytest.mark.slow)],
)
@pytest.mark.bit_for_bit
def test_parts_of_the_scan_that_decodes_the_first_frame_give_its_frames(name, chunk, frames, monkeypatch):
    """Where the scan decodes the first latent frame too (a TPU's), every part, the first included,
    is one program (parts of ``chunk`` from the first frame on; the last one padded)."""
    model = vae(name, decode_chunk=chunk, first_frame="scan")
    z = latents(name, frames)
    whole = np.asarray(model.decode_uint8(z))
    used, compiled_part = [], vae_programs.compiled_part

    def recorded(name, *args):
        used.append((name, compiled_part(name, *args)))
        return used[-1][1]

    monkeypatch.setattr(vae_programs, "compiled_part", recorded)
    parts, calls = in_parts(model, z)
    np.testing.assert_array_equal(parts, whole)
    step = frames if chunk == "all" else chunk
    assert calls == [(d, frames) for d in dict.fromkeys([*range(step, frames, step), frames])]
    assert [n for n, _ in used] == ["decode_cache", *["decode_uint8_part"] * len(calls)]
    assert len({id(program) for _, program in used[1:]}) == 1


@pytest.mark.slow
@pytest.mark.bit_for_bit
@pytest.mark.parametrize("first_frame", ["alone", "scan"])
def test_parts_on_an_8_device_mesh_decode_as_the_one_program_there(first_frame):
    """Latents split in strips over the devices (as the pipeline places them): the sharded one
    program's frames bit for bit (the first latent frame decoded alone, or by the scan's body)."""
    import jax

    from wanjax.parallel.layouts import spatial_sharding, to_global
    from wanjax.parallel.mesh import make_mesh, parse_mesh
    from wanjax.parallel.rules import replicated

    mesh = make_mesh(parse_mesh("dp=1,sp=2,tp=4"))
    alone = vae("wan2.1")
    sharded = vae("wan2.1", sharding=lambda source: replicated(mesh), first_frame=first_frame)
    z = latents("wan2.1", 3)
    wide = jnp.asarray(np.tile(np.asarray(z), (1, 1, 1, 1, 4)))  # 24 latent pixels: strips of 3
    placed = to_global(wide, spatial_sharding(mesh, wide.shape))
    assert len(placed.sharding.device_set) == jax.device_count() == 8
    parts, calls = in_parts(sharded, placed)
    np.testing.assert_array_equal(parts, np.asarray(sharded.decode_uint8(placed)))
    # one device keeps another causal-cache form (owed sums): the same frames to a level
    assert np.abs(parts.astype(int) - np.asarray(alone.decode_uint8(wide)).astype(int)).max() <= 1
    assert calls == [(1, 3), (2, 3), (3, 3)]


def test_parts_still_find_non_finite_values():
    z = latents("wan2.1", 3).at[0, 0, 2, 1, 1].set(jnp.nan)  # in the last part only
    with pytest.raises(NumericalError, match="NaN/inf"):
        vae("wan2.1").decode_uint8(z, on_frames=lambda done, total: None)


@pytest.mark.slow
def test_a_tiled_decode_stays_one_program():
    """Tiles decode each over all frames: no parts, no calls (and the tiled frames)."""
    model = vae("wan2.1", tiling=Tiling(16, 8))  # 48-pixel frames: larger than a tile
    z = latents("wan2.1", 2)
    frames, calls = in_parts(model, z)
    assert calls == []
    np.testing.assert_array_equal(frames, np.asarray(model.decode_uint8(z)))
