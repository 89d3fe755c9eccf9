"""Weights checked for NaN and inf once loaded: a corrupted file is named, not rendered as black frames.

Weights in an accelerator's memory are checked there, by one program; weights in the host's memory
(a CPU run's) are read in place by NumPy, a few million values at a time, compiling nothing: the
program's compile left ~100 MiB in the process (the VAE decode's peak RSS at 240x416, 1,598 ->
1,716 MiB; BENCHMARKS.md).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from wanjax.errors import RuntimeFailure
from wanjax.io.checkpoint import path_name

HOST_CHUNK = 1 << 22  # values per NumPy pass over a leaf in host memory (bounds its temporary)


def _on_device(leaf: Any) -> bool:
    """Whether a leaf lives in device memory (offloaded leaves wait in host memory: not checked)."""
    return getattr(getattr(leaf, "sharding", None), "memory_kind", None) in (None, "device")


def _in_host_memory(leaf: jax.Array) -> bool:
    """Whether every shard of a leaf is on a CPU device (so NumPy reads it in place)."""
    return all(device.platform == "cpu" for device in leaf.sharding.device_set)


@jax.jit
def _all_finite(leaves: list[jax.Array]) -> list[jax.Array]:
    return [jnp.isfinite(x).all() for x in leaves]


def _finite_in_place(leaf: jax.Array) -> bool:
    """Whether a leaf in host memory is all finite: each distinct shard (replicas hold the same
    values) read in place, ``HOST_CHUNK`` values at a time."""
    seen = set()
    for shard in leaf.addressable_shards:
        if repr(shard.index) in seen:
            continue
        seen.add(repr(shard.index))
        flat = np.asarray(shard.data).reshape(-1)
        if not all(np.isfinite(flat[i : i + HOST_CHUNK]).all() for i in range(0, flat.size, HOST_CHUNK)):
            return False
    return True


def non_finite_leaves(params: Any) -> list[str]:
    """Paths (``layers/attn/q/kernel``) of the floating-point leaves in device memory holding NaN or inf."""
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    checked = [
        (path, leaf)
        for path, leaf in flat
        if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jnp.floating) and _on_device(leaf)
    ]
    on_host = [_in_host_memory(leaf) for _, leaf in checked]
    on_chips = [leaf for (_, leaf), host in zip(checked, on_host, strict=True) if not host]
    finite = iter(jax.device_get(_all_finite(on_chips)) if on_chips else [])
    ok = [
        _finite_in_place(leaf) if host else bool(next(finite))
        for (_, leaf), host in zip(checked, on_host, strict=True)
    ]
    return [path_name(path) for (path, _), good in zip(checked, ok, strict=True) if not good]


def check_finite(params: Any, where: str) -> None:
    """RuntimeFailure (exit 1) naming the first tensors of ``where`` (a component folder) with NaN or inf."""
    bad = non_finite_leaves(params)
    if bad:
        more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
        raise RuntimeFailure(
            f"{where}: NaN or inf in the weights of {bad[0]}{more} (a corrupted or incomplete file? "
            "download it again)"
        )
