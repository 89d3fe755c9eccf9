"""The Wan DiT's inputs for one forward, as one value (a pytree, so it passes through ``jit``,
``lax.map`` and ``lax.cond`` whole): what :func:`wanjax.models.dit.forward`, the model's ``apply`` and
``embed`` and the sampler's guided batch all take."""

from __future__ import annotations

import dataclasses

import jax

from wanjax.models.dit_context import ContextKV
from wanjax.models.dit_control import Control

__all__ = ["DitInputs"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DitInputs:
    """One forward's inputs, in diffusers' layout: ``latents (B, C, T, H, W)`` (an image-to-video
    model's conditioning latents joined along C), ``timestep (B,)`` or one per latent frame
    ``(B, T/pt)``, ``prompt_embeds (B, L, text_dim)``; an image-to-video model's image encoder states
    ``image_embeds (B, Li, image_dim)`` (a first-last-frame model's: ``(2B, Li, image_dim)``); a VACE
    model's :class:`~wanjax.models.dit_control.VaceControl` or an Animate model's
    :class:`~wanjax.models.animate.AnimateControl` ``control``; ``kv``: the run's text K/V cache
    (:func:`~wanjax.models.dit_context.context_kv` of these prompts), which the blocks then read
    instead of projecting the context. A field left None is absent from the pytree."""

    latents: jax.Array
    timestep: jax.Array
    prompt_embeds: jax.Array
    image_embeds: jax.Array | None = None
    control: Control | None = None
    kv: dict[str, ContextKV] | None = None
