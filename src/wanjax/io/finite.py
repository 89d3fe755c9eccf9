"""Weights checked for NaN and inf once loaded: a corrupted file is named, not rendered as black frames."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from wanjax.errors import RuntimeFailure
from wanjax.io.checkpoint import path_name


def _on_device(leaf: Any) -> bool:
    """Whether a leaf lives in device memory (offloaded leaves wait in host memory: not checked)."""
    return getattr(getattr(leaf, "sharding", None), "memory_kind", None) in (None, "device")


@jax.jit
def _all_finite(leaves: list[jax.Array]) -> list[jax.Array]:
    return [jnp.isfinite(x).all() for x in leaves]


def non_finite_leaves(params: Any) -> list[str]:
    """Paths (``layers/attn/q/kernel``) of the floating-point leaves in device memory holding NaN or inf."""
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    checked = [
        (path, leaf)
        for path, leaf in flat
        if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jnp.floating) and _on_device(leaf)
    ]
    if not checked:
        return []
    finite = jax.device_get(_all_finite([leaf for _, leaf in checked]))
    return [path_name(path) for (path, _), ok in zip(checked, finite, strict=True) if not ok]


def check_finite(params: Any, where: str) -> None:
    """RuntimeFailure (exit 1) naming the first tensors of ``where`` (a component folder) with NaN or inf."""
    bad = non_finite_leaves(params)
    if bad:
        more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
        raise RuntimeFailure(
            f"{where}: NaN or inf in the weights of {bad[0]}{more} (a corrupted or incomplete file? "
            "download it again)"
        )
