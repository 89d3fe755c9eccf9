"""Comparing our arrays with the references'."""

from __future__ import annotations

import numpy as np


def relative_error(ours, ref) -> float:
    """``|ours - ref| / |ref|`` in the Frobenius norm, computed in float64."""
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))


def to_uint8(video: np.ndarray) -> np.ndarray:
    """diffusers' float frames in [0, 1] -> uint8, as its PIL output does."""
    return (video * 255).round().astype(np.uint8)


def assert_same_params(ours, reference) -> None:
    """Two params trees of the same structure, leaf by leaf the same dtype and bits."""
    import jax

    assert jax.tree.structure(ours) == jax.tree.structure(reference)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(reference), strict=True):
        assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b))
