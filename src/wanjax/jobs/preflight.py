"""Checks run before any weight is loaded or any program compiled.

Each raises :class:`~wanjax.errors.WanjaxError` with one line naming the problem and the fix:
output paths that cannot be written, a model directory whose components, shard indexes,
safetensors headers or tensor shapes are wrong (only the headers are read), video sizes beyond the
transformer's RoPE table, and meshes that do not fit the devices or the attention heads. (Flag
values are checked when a request is built: :func:`wanjax.jobs.requests.check_flags`.)
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from wanjax.errors import WanjaxError

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
    else:  # a real probe here too: root may write anywhere but in /proc, a read-only mount, ...
        first = existing / folder.relative_to(existing).parts[0]
        try:
            first.mkdir()
            first.rmdir()
        except OSError as e:
            raise WanjaxError(
                f"{flag} {path}: cannot create {folder} ({e.strerror or e} in {existing})"
            ) from None


def check_outputs(outputs: Mapping[str, str | Path | None]) -> None:
    """:func:`check_writable` for each ``flag -> path`` given."""
    for flag, path in outputs.items():
        if path:
            check_writable(path, flag)


def check_distinct(outputs: Mapping[str, str | Path | None]) -> None:
    """Raise when two outputs would be the same file (one would overwrite the other)."""
    seen: dict[Path, str] = {}
    for flag, path in outputs.items():
        if not path:
            continue
        resolved = Path(path).resolve()
        if resolved in seen:
            raise WanjaxError(f"{flag} {path} is also {seen[resolved]}'s file; give each output its own name")
        seen[resolved] = flag


# ----------------------------------------------------------------------------------------------
# Model checks (the components themselves: WanPipeline.check_components)


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
