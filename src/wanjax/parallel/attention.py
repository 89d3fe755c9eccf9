"""Attention under a device mesh: :func:`wanjax.kernels.attention.attention` inside ``shard_map``.

Queries, keys and values ``(B, L, H, D)`` are split by a :class:`~wanjax.parallel.layouts.TokenLayout`:
batch over its batch axes, heads over its head axes, tokens over its sequence axes.

* self-attention with a split sequence: **Ulysses** (an all-to-all turns the token split into a
  head split, attention runs on whole sequences, a second all-to-all turns it back) when the local
  heads divide by the sequence shards; otherwise **all-gather KV** (each device attends its query
  tokens to the gathered keys and values), which works for any head count (12 heads on 8 devices);
* cross-attention: queries keep their token split, the short text keys/values are whole on every
  device of a sequence group; no communication.

A block-sparse self-attention mask (``AttentionSpec.block_mask``) applies as is under Ulysses (whole
sequences); under all-gather each device applies its own rows of it (a switch over the device's
sequence index, one branch per shard's rows).

Inside ``shard_map`` each device's :func:`~wanjax.kernels.attention.attention` sees its local shape
(whole sequences and fewer heads under Ulysses, a query shard under all-gather) and chooses its
backend for that shape, as an unsharded call would.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
from jax.sharding import Mesh

from wanjax.errors import ConfigError
from wanjax.kernels.attention import AttentionSpec, attention
from wanjax.kernels.precision import Precision
from wanjax.parallel.layouts import TokenLayout


def sequence_mode(layout: TokenLayout, sizes: dict[str, int], heads: int) -> str:
    """``"local"`` (no sequence split), ``"ulysses"`` or ``"allgather"`` for self-attention."""
    shards = math.prod(sizes[a] for a in layout.seq)
    if shards == 1:
        return "local"
    local_heads = heads // math.prod(sizes[a] for a in layout.heads)
    return "ulysses" if local_heads % shards == 0 else "allgather"


def sharded_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    mesh: Mesh,
    layout: TokenLayout,
    self_attention: bool,
    backend: str | AttentionSpec = "auto",
    precision: Precision = "highest",
) -> jax.Array:
    """``attention(q, k, v)`` over ``(B, L, H, D)`` arrays split over ``mesh`` as ``layout`` says."""
    sizes = dict(mesh.shape)
    mode = sequence_mode(layout, sizes, q.shape[2]) if self_attention else "local"
    seq = layout.seq
    if mode == "allgather" and getattr(backend, "window_size", None) is not None:
        raise ConfigError(
            f"--window_size needs whole token sequences per device, but this mesh splits them over "
            f"{'x'.join(seq)} without Ulysses ({q.shape[2]} heads); use a mesh with sp=1 or one whose "
            "sequence shards divide the heads per tp shard"
        )

    def local(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        if mode == "ulysses":
            # tokens split -> heads split: (b, L/n, h, d) -> (b, L, h/n, d), and back afterwards.
            q, k, v = (jax.lax.all_to_all(x, seq, 2, 1, tiled=True) for x in (q, k, v))
            out = attention(q, k, v, backend=backend, precision=precision)
            return jax.lax.all_to_all(out, seq, 1, 2, tiled=True)
        if mode == "allgather":
            k, v = (jax.lax.all_gather(x, seq, axis=1, tiled=True) for x in (k, v))
            mask = getattr(backend, "block_mask", None)
            if mask is not None:
                shards = math.prod(sizes[a] for a in seq)
                branches = [
                    functools.partial(
                        attention,
                        backend=dataclasses.replace(backend, block_mask=mask.shard(i, shards)),
                        precision=precision,
                    )
                    for i in range(shards)
                ]
                return jax.lax.switch(jax.lax.axis_index(seq), branches, q, k, v)
        return attention(q, k, v, backend=backend, precision=precision)

    q_spec = layout.qkv()
    kv_spec = layout.qkv(split_seq=self_attention)
    return jax.shard_map(
        local, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec), out_specs=q_spec, check_vma=False
    )(q, k, v)
