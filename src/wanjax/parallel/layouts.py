"""Where activations live on a mesh, and moving arrays between the host and the mesh.

DiT tokens ``(B, L, H, D)``: the batch over ``dp`` (the CFG pair), the heads over ``tp``, the token
sequence over ``sp`` and over any axis that cannot split the batch or the heads (so every mesh runs
for every head count). VAE frames: split spatially over every device. Host values become global
arrays and back, across processes too.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


@dataclasses.dataclass(frozen=True)
class TokenLayout:
    """How ``(B, L, H, D)`` token activations are split: mesh axes for batch, sequence and heads.

    Mesh axes that divide none of them compute redundantly (replicated)."""

    batch: tuple[str, ...]
    seq: tuple[str, ...]
    heads: tuple[str, ...]

    @staticmethod
    def _entry(axes: tuple[str, ...]) -> Any:
        return None if not axes else axes[0] if len(axes) == 1 else axes

    def tokens(self) -> P:
        """``(B, L, D)``."""
        return P(self._entry(self.batch), self._entry(self.seq))

    def qkv(self, split_seq: bool = True) -> P:
        """``(B, L, H, D)``; keys of cross-attention keep their (short) sequence whole."""
        return P(
            self._entry(self.batch), self._entry(self.seq) if split_seq else None, self._entry(self.heads)
        )

    def describe(self, sizes: dict[str, int]) -> str:
        """How each mesh axis is used, e.g. ``dp=2: batch, sp=2: tokens, tp=2: tokens`` (an axis
        that cannot split the heads or the batch joins the token split; one that splits nothing
        computes redundantly)."""
        roles = {**{a: "tokens" for a in self.seq}, **{a: "batch" for a in self.batch}}
        roles.update({a: "heads" for a in self.heads})
        return ", ".join(
            f"{a}={n}: {roles.get(a, 'replicated')}" if n > 1 else f"{a}=1" for a, n in sizes.items()
        )

    def context(self) -> P:
        """``(B, L_text, D)`` text context: split over the batch only."""
        return P(self._entry(self.batch))


def token_layout(sizes: dict[str, int], batch: int, length: int, heads: int) -> TokenLayout:
    """``dp`` on the batch (the CFG pair) when it divides it, ``tp`` on the heads when it divides them,
    then ``sp`` and every axis left over on the token sequence while the product divides ``length``."""
    dp, tp = sizes.get("dp", 1), sizes.get("tp", 1)
    batch_axes = ("dp",) if dp > 1 and batch % dp == 0 else ()
    head_axes = ("tp",) if tp > 1 and heads % tp == 0 else ()
    seq: list[str] = []
    for a in ("sp", "dp", "tp"):
        size = sizes.get(a, 1)
        if (
            size > 1
            and a not in batch_axes + head_axes
            and length % (math.prod(sizes[s] for s in seq) * size) == 0
        ):
            seq.append(a)
    return TokenLayout(batch_axes, tuple(seq), head_axes)


def frame_layout(layout: TokenLayout, sizes: dict[str, int], rows: int) -> TokenLayout:
    """The layout of per-frame attention ``(B*T, L/T, H, D)`` (each latent frame's tokens as one row)
    from the tokens' ``layout``: the heads as the tokens', the rows over the batch axes, then over the
    sequence axes while they divide the ``rows`` (the token split of whole frames); a sequence axis
    that does not computes redundantly. Attention would merge rows and heads into one dimension,
    which XLA's partitioner cannot split over both: under ``shard_map`` each device keeps its heads."""
    batch = list(layout.batch)
    for a in layout.seq:
        if rows % (math.prod(sizes[s] for s in batch) * sizes[a]) == 0:
            batch.append(a)
    return TokenLayout(tuple(batch), (), layout.heads)


def params_mesh(tree: Any) -> Mesh | None:
    """The mesh a params tree is laid out on (its first named sharding's); None off any mesh."""
    for leaf in jax.tree.leaves(tree):
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, NamedSharding):
            return sharding.mesh
    return None


def batch_spec(mesh: Mesh | None, batch: int) -> P:
    """``(B, ...)`` split over ``dp`` when it divides the batch (the prompt and its negative), else whole."""
    dp = 1 if mesh is None else dict(mesh.shape).get("dp", 1)
    return P("dp") if dp > 1 and batch % dp == 0 else P()


def constrain(x: jax.Array, mesh: Mesh | None, spec: P) -> jax.Array:
    """``with_sharding_constraint`` under ``mesh`` (identity without a mesh)."""
    return x if mesh is None else jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def to_global(x: Any, sharding: NamedSharding) -> jax.Array:
    """A global array with ``sharding`` from a value every process holds in full (host or local)."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return x if x.sharding == sharding else jax.device_put(x, sharding)
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def to_host(x: jax.Array) -> np.ndarray:
    """The full value of ``x`` on every process (gathered across hosts when needed)."""
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
        return np.asarray(x)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


MIN_STRIP = 2  # latent pixels across a VAE strip at the least (see spatial_sharding)


def spatial_sharding(mesh: Mesh, shape: Sequence[int]) -> NamedSharding:
    """VAE activations ``(B, C, T, H, W)`` split into strips along one spatial axis (see
    :func:`strip_axes`); the batch stays whole: each device decodes a strip of every video."""
    height, width = strip_axes(_mesh_sizes(mesh), shape)
    entry = TokenLayout._entry
    return NamedSharding(mesh, P(None, None, None, entry(height), entry(width)))


def strip_axes(sizes: dict[str, int], shape: Sequence[int]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The mesh axes (``sizes``: name -> size, in mesh order) splitting ``(..., H, W)`` VAE frames
    into strips, as ``(height axes, width axes)``, one of them empty: along W or H, whichever the
    mesh axes that divide it split the more (W on a tie), each strip at least :data:`MIN_STRIP`
    pixels across. XLA's partitioner decoded small frames split into one-pixel strips, or over both
    axes, wrongly (frames off by up to 236 levels; tests/test_sharding.py); strips of real videos are
    tens of pixels."""

    def axes_dividing(dim: int) -> tuple[str, ...]:
        chosen: list[str] = []
        for a in (a for a in sizes if sizes[a] > 1):
            parts = math.prod(sizes[c] for c in chosen) * sizes[a]
            if dim % parts == 0 and dim // parts >= MIN_STRIP:
                chosen.append(a)
        return tuple(chosen)

    width, height = axes_dividing(shape[-1]), axes_dividing(shape[-2])
    split = lambda axes: math.prod(sizes[a] for a in axes)  # noqa: E731
    return (height, ()) if split(height) > split(width) else ((), width)


def strip_count(sizes: dict[str, int], shape: Sequence[int]) -> int:
    """How many strips :func:`spatial_sharding` cuts ``(..., H, W)`` frames into on a mesh of these
    ``sizes`` (1: the frames stay whole on every device)."""
    height, width = strip_axes(sizes, shape)
    return math.prod(sizes[a] for a in height + width)


def _mesh_sizes(mesh: Mesh) -> dict[str, int]:
    return dict(mesh.shape)
