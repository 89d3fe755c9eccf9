"""Checks run before any weight is loaded or any program compiled.

Each raises :class:`~wanjax.errors.WanjaxError` with one line naming the problem and the fix:
flag values (steps, guidance, fps, dtypes, ...), output paths that cannot be written, a model
directory whose components, shard indexes, safetensors headers or tensor shapes are wrong (only
the headers are read), video sizes beyond the transformer's RoPE table, and meshes that do not fit
the devices or the attention heads. Also what every run records for reproducibility
(:func:`environment`, :func:`arguments`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from wanjax.errors import ConfigError, WanjaxError

# ----------------------------------------------------------------------------------------------
# Flags


def check_flags(args: argparse.Namespace) -> None:
    """Value checks of the numeric and dtype flags a command has (absent flags are skipped)."""
    from wanjax.models.config import parse_dtype

    def given(name: str) -> Any:
        return getattr(args, name, None)

    steps = given("num_inference_steps")
    if steps is not None and steps < 1:
        raise WanjaxError(f"--num_inference_steps must be at least 1, got {steps}")
    guidance = given("guidance_scale")
    if guidance is not None and not (math.isfinite(guidance) and guidance >= 0):
        raise WanjaxError(
            f"--guidance_scale must be >= 0 (5.0 is the default; <= 1 turns CFG off), got {guidance}"
        )
    shift = given("flow_shift")
    if shift is not None and not (math.isfinite(shift) and shift > 0):
        raise WanjaxError(f"--flow_shift must be positive (3.0 for 480p, 5.0 for 720p), got {shift}")
    fps = given("fps")
    if fps is not None and not (math.isfinite(fps) and fps > 0):
        raise WanjaxError(f"--fps must be positive (e.g. 16), got {fps}")
    length = given("max_sequence_length")
    if length is not None and length < 1:
        raise WanjaxError(f"--max_sequence_length must be at least 1 (512 as trained), got {length}")
    for name in ("height", "width", "frames"):
        value = given(name)
        if value is not None and value < 1:
            raise WanjaxError(f"--{name} must be positive, got {value}")
    seed = given("seed")
    if seed is not None and not 0 <= seed < 2**63:
        raise WanjaxError(f"--seed must be a non-negative integer, got {seed}")
    for name in ("dtype", "vae_dtype", "vae_weights_dtype"):
        if given(name) is not None:
            try:
                parse_dtype(given(name))
            except ConfigError as e:
                raise ConfigError(f"--{name}: {e}") from None
    if given("vae_decode_chunk") is not None:
        from wanjax.models.vae.model import parse_chunk

        parse_chunk(given("vae_decode_chunk"), "--vae_decode_chunk")
    if given("vae_tiling") is not None:
        from wanjax.models.vae.model import Tiling

        try:
            Tiling.parse(given("vae_tiling"))
        except ConfigError as e:
            raise ConfigError(f"--vae_tiling: {e}") from None


# ----------------------------------------------------------------------------------------------
# Outputs


def check_writable(path: str | Path, flag: str) -> None:
    """Raise unless a file can be created at ``path`` (its folder exists and is writable, or can be
    made); nothing is left behind."""
    path = Path(path)
    if path.is_dir():
        raise WanjaxError(f"{flag} {path} is a directory; name a file")
    folder = path.parent if str(path.parent) else Path(".")
    existing = folder
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        raise WanjaxError(f"{flag} {path}: {existing} is not a directory")
    if existing == folder:
        try:  # a real probe: os.access ignores read-only mounts and says yes to root
            with tempfile.TemporaryFile(dir=folder, prefix=".wanjax-probe-"):
                pass
        except OSError as e:
            raise WanjaxError(f"{flag} {path}: cannot write to {folder} ({e.strerror or e})") from None
    elif not os.access(existing, os.W_OK | os.X_OK):
        raise WanjaxError(f"{flag} {path}: cannot create {folder} ({existing} is not writable)")


def check_outputs(outputs: Mapping[str, str | Path | None]) -> None:
    """:func:`check_writable` for each ``flag -> path`` given."""
    for flag, path in outputs.items():
        if path:
            check_writable(path, flag)


# ----------------------------------------------------------------------------------------------
# Model directories


def check_component(root: str | Path, name: str) -> Any:
    """Check one component of a model directory from its config and safetensors headers only
    (:meth:`wanjax.io.component.Component.check`); returns its config."""
    from wanjax.pipeline.components import COMPONENTS

    return COMPONENTS[name].check(root)


def check_model(root: str | Path, components: Iterable[str]) -> dict[str, Any]:
    """:func:`check_component` for each component a command needs; their configs by name."""
    return {name: check_component(root, name) for name in components}


def check_rope(cfg: Any, geometry: Any, video: Mapping[str, int]) -> None:
    """Raise when the video's latent grid needs more positions than the transformer's RoPE table
    (:func:`wanjax.models.dit.rope_excess` decides), naming the largest size that fits."""
    from wanjax.models.dit import rope_excess

    excess = rope_excess(cfg, geometry.latent_shape(1, video["height"], video["width"], video["frames"]))
    if excess is None:
        return
    axis, positions = excess
    key, limit, patch = ("frames", "height", "width")[axis], cfg.rope_max_seq_len, cfg.patch_size[axis]
    if key == "frames":
        largest = geometry.temporal * (limit * patch - 1) + 1
    else:
        largest = limit * patch * geometry.spatial
    raise WanjaxError(
        f"{key} {video[key]} needs {positions} positions along {key} but the transformer's RoPE "
        f"table has {limit} (rope_max_seq_len); use {key} <= {largest}"
    )


def check_mesh(request: Any, num_devices: int, heads: int | None) -> Any:
    """The mesh a run will use (None: one device); raise when it does not use exactly the visible
    devices, suggesting one that does. Any such mesh runs: an axis that cannot split the attention
    heads or the CFG pair joins the token split (:func:`wanjax.parallel.layouts.token_layout`)."""
    from wanjax.parallel.mesh import MeshSpec, check_device_count, mesh_spec_from_flags

    if request is None:
        return None
    spec = (
        request if isinstance(request, MeshSpec) else mesh_spec_from_flags(request, num_devices, heads=heads)
    )
    check_device_count(spec, num_devices, heads)
    return spec


# ----------------------------------------------------------------------------------------------
# What a run records


def environment() -> dict[str, Any]:
    """Versions and platform: what reproducing a run needs besides its arguments and seed."""
    import jax
    import jaxlib

    from wanjax import __version__

    return {
        "wanjax": __version__,
        "jax": jax.__version__,
        "jaxlib": getattr(jaxlib, "__version__", None) or _jaxlib_version(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "backend": jax.default_backend(),
        "devices": [f"{d.platform}:{getattr(d, 'device_kind', '')}" for d in jax.devices()[:1]]
        + ([f"x{jax.device_count()}"] if jax.device_count() > 1 else []),
    }


def _jaxlib_version() -> str | None:
    try:
        from jaxlib import version

        return version.__version__
    except ImportError:  # pragma: no cover
        return None


def arguments(args: argparse.Namespace) -> dict[str, Any]:
    """Every argument of the command as JSON values (``debug`` left out)."""
    out = {}
    for key, value in sorted(vars(args).items()):
        if key == "debug":
            continue
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            value = str(value)
        out[key] = value
    return out
