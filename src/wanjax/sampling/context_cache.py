"""The text K/V cache of a run: every block's cross-attention keys and values of the prompts (and of
an image-to-video model's image tokens), computed once per expert before its first step and read by
every step instead of being projected again (diffusers' ``TextKVCacheConfig`` idea, for Wan).

Exact: the blocks compute from these what they would have projected themselves (bit for bit on the
tiny models, ``tests/test_context_cache.py``); the step program no longer runs the text embedder nor
the keys' and values' projections. Held on the device for the run: ``2 * layers * rows * Lc * D``
values (and the image tokens' the same way), ``rows`` the step's batch (two per video with CFG).

What it saves is small beside a video's step (0.31 TFLOP of 566 for 1.3B at 480p x 81 frames, 0.05%;
4.4 of 13,047 for 14B at 720p, 0.03%; 3.3% of a single 480p frame's) and what it holds is not (with
CFG, 512 text tokens, bf16: 189 MB for 1.3B, 839 MB for 14B), so it is on by default except where
the weights are offloaded (``--offload model | blocks``): there device memory is what the run is
short of (:func:`default_on`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from wanjax.models.dit import ContextKV, WanTransformer
from wanjax.models.dit_context import kv_spec
from wanjax.models.layers import Params

ContextCache = dict[str, ContextKV]


def default_on(offload: str) -> bool:
    """Whether a run keeps the cache unless told: when its weights are not offloaded (``offload``:
    :data:`~wanjax.models.offload.OFFLOAD_MODES`, parsed)."""
    return offload == "none"


def guided_context(
    model: WanTransformer,
    prompt_embeds: jax.Array,
    negative_prompt_embeds: jax.Array | None,
    image: Any = None,
) -> tuple[jax.Array, jax.Array | None]:
    """The text rows of a step's transformer input and its image-state rows: the conditional ones,
    then (guided) the unconditional ones (``image``: an image conditioning with ``image_embeds``)."""
    states = getattr(image, "image_embeds", None)
    images = None if states is None else states.astype(model.dtype)
    if negative_prompt_embeds is None:
        return prompt_embeds, images
    embeds = jnp.concatenate([prompt_embeds, negative_prompt_embeds])
    return embeds, None if images is None else jnp.concatenate([images, images])


def context_cache(
    model: WanTransformer,
    params: Params,
    prompt_embeds: jax.Array,
    negative_prompt_embeds: jax.Array | None,
    image: Any,
    per_video: bool,
) -> ContextCache:
    """The run's cache in the rows the step reads them in: the guided batch's (``(layers, rows, Lc,
    heads, head_dim)``), or with ``per_video`` each video's own rows (``(videos, layers, rows, ...)``,
    for a step that runs the videos one after another: :func:`~wanjax.sampling.sampler.one_by_one`)."""
    if not per_video:
        return model.context_kv(params, *guided_context(model, prompt_embeds, negative_prompt_embeds, image))

    def alone(item: tuple[jax.Array, jax.Array | None]) -> ContextCache:
        cond, uncond = (None if v is None else v[None] for v in item)
        return model.context_kv(params, *guided_context(model, cond, uncond))

    return jax.lax.map(alone, (prompt_embeds, negative_prompt_embeds))


def cache_sharding(model: WanTransformer, rows: int, per_video: bool) -> NamedSharding | None:
    """Where the cache lies under the model's mesh (None without one): as the cross-attention reads
    its keys, the rows over ``dp`` where they divide, the heads over ``tp``, the layers whole."""
    mesh = model.settings.mesh
    if mesh is None:
        return None
    lead = (None, None) if per_video else (None,)
    return NamedSharding(mesh, P(*lead, *kv_spec(mesh, rows, model.cfg.num_attention_heads)))


def cache_bytes(cfg: Any, rows: int, text_len: int, image_len: int, itemsize: int) -> int:
    """The cache's bytes (all devices together) for ``rows`` forward rows of ``text_len`` text and
    ``image_len`` image tokens: keys and values of every block and control block."""
    blocks = cfg.num_layers + len(cfg.vace_layers or ())
    return 2 * blocks * rows * (text_len + image_len) * cfg.inner_dim * itemsize
