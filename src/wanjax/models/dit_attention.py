"""The DiT's attention function: local or sharded over the settings' mesh, with self-attention's
block mask (radial attention) where the blocks run sparse."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax

from wanjax.kernels.attention import AttentionSpec, attention
from wanjax.kernels.block_mask import BlockMask
from wanjax.models.settings import RunSettings
from wanjax.parallel.attention import sharded_attention
from wanjax.parallel.layouts import TokenLayout

Attend = Callable[..., jax.Array]  # (q, k, v, *, self_attention) -> out, all (B, L, H, D)


def attend_fn(settings: RunSettings, layout: TokenLayout | None, mask: BlockMask | None = None) -> Attend:
    """The attention function: local without a mesh, else sharded over it as ``layout`` says;
    ``mask``: self-attention's block mask (cross-attention stays dense)."""
    spec = (
        settings.attention
        if isinstance(settings.attention, AttentionSpec)
        else AttentionSpec(settings.attention)
    )
    masked = spec if mask is None else dataclasses.replace(spec, block_mask=mask)

    def attend(q: jax.Array, k: jax.Array, v: jax.Array, self_attention: bool) -> jax.Array:
        backend = masked if self_attention else spec
        if layout is None:
            return attention(q, k, v, backend=backend, precision=settings.precision)
        return sharded_attention(
            q,
            k,
            v,
            mesh=settings.mesh,
            layout=layout,
            self_attention=self_attention,
            backend=backend,
            precision=settings.precision,
        )

    return attend
