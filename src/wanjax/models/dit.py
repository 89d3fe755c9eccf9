"""The Wan 2.1 diffusion transformer (``WanTransformer3DModel``) as pure functions.

``forward(params, cfg, inputs, settings=...)`` maps the :class:`DitInputs`' diffusers-layout
latents ``(B, C, T, H, W)`` to the flow-matching velocity of the same shape, run as the static
:class:`~wanjax.models.settings.RunSettings` say. Inside, tokens are ``(B, L, D)`` with
``L = T/pt * H/ph * W/pw`` in row-major (frame, row, column) order; their embedding and the blocks'
conditioning are :mod:`wanjax.models.dit_embed`'s. The blocks' params are stacked on a leading layer
axis and run with ``lax.scan``, so compile time does not depend on depth.

Precision follows the reference bf16 pipeline: the time embedder, modulation tables and the affine
cross-attention norm stay float32; norms and modulation are computed in float32 and rounded to the
activation dtype; matmuls accumulate in float32, float32 ones at the settings' ``precision`` (see
:mod:`wanjax.kernels.precision`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from wanjax.errors import ConfigError
from wanjax.io.checkpoint import ShardingFn
from wanjax.kernels.attention import AttentionSpec
from wanjax.kernels.common import AttentionShape
from wanjax.kernels.precision import resolve_precision
from wanjax.models import lora
from wanjax.models.config import TransformerConfig
from wanjax.models.dit_attention import attend_fn
from wanjax.models.dit_block import block, frame_views, modulate
from wanjax.models.dit_context import ContextKV as ContextKV  # re-exported: the cache's type
from wanjax.models.dit_context import context_kv
from wanjax.models.dit_control import AnimateControl as AnimateControl  # re-exported: the inputs
from wanjax.models.dit_control import Control, after_blocks, embed_control
from wanjax.models.dit_control import VaceControl as VaceControl
from wanjax.models.dit_embed import Conditioning, embed, embed_time, token_pins, unpatchify
from wanjax.models.dit_inputs import DitInputs as DitInputs  # re-exported: the forward's inputs
from wanjax.models.dit_spec import TRANSFORMER as TRANSFORMER  # re-exported: the component
from wanjax.models.dit_spec import TRANSFORMER_2 as TRANSFORMER_2
from wanjax.models.dit_spec import checkpoint_spec as checkpoint_spec
from wanjax.models.layers import Params, linear, scan_layers
from wanjax.models.offload import (
    HOST,
    Offload,
    move,
    offload_sharding,
    parse_offload,
    run_placement,
    stream_layers,
    streams_layers,
)
from wanjax.models.settings import DEFAULT_SETTINGS, RunSettings
from wanjax.models.w8a8 import int8_matmuls, marked_blocks
from wanjax.parallel.layouts import TokenLayout, token_layout
from wanjax.parallel.rules import param_sharding

# ----------------------------------------------------------------------------------------------
# Forward


def run_blocks(
    params: Params,
    cfg: TransformerConfig,
    x: jax.Array,
    cond: Conditioning,
    start: int = 0,
    stop: int | None = None,
    *,
    settings: RunSettings = DEFAULT_SETTINGS,
) -> jax.Array:
    """Blocks ``start .. stop-1`` (default: all) on the tokens ``x (B, L, D)``, pinned to the token
    layout at every block boundary under the settings' mesh; ``offload="blocks"`` streams their weights.
    What follows each block (a VACE model's hint, an Animate model's face adapter) is
    :func:`~wanjax.models.dit_control.after_blocks`'s. Under ``settings.sparse`` the blocks before its
    ``dense_block`` run dense (today's program), the rest radial self-attention."""
    sparse, mask = settings.sparse, None
    if sparse is not None:
        end = cfg.num_layers if stop is None else stop
        split = min(max(sparse.dense_block, start), end)
        settings = dataclasses.replace(settings, sparse=None)
        if split > start:
            x = run_blocks(params, cfg, x, cond, start, split, settings=settings)
        if split == end:
            return x
        start, mask = split, sparse.block_mask(cond.grid)
    layout, pin = token_pins(settings.mesh, x.shape[0], math.prod(cond.grid), cfg.num_attention_heads)
    attend, precision = attend_fn(settings, layout, mask), settings.precision
    extras, after = after_blocks(params, cfg, cond, settings)
    layers: Params = {"block": marked_blocks(params["blocks"], settings.int8_matmuls), **extras}
    if cond.context_kv is not None:
        layers["kv"] = cond.context_kv["blocks"]

    def layer(h: jax.Array, item: Params) -> jax.Array:
        args = (cond.context, cond.time_mod, cond.rope, cfg, attend, precision, cond.image_context)
        return pin(after(block(item["block"], pin(h), *args, item.get("kv")), item))

    run_layers = stream_layers if streams_layers(settings.offload) else scan_layers
    return run_layers(layer, x, layers, start, stop)


def project(
    params: Params,
    cfg: TransformerConfig,
    x: jax.Array,
    cond: Conditioning,
    *,
    settings: RunSettings = DEFAULT_SETTINGS,
) -> jax.Array:
    """The last block's tokens -> the velocity ``(B, C, T, H, W)`` (modulated output norm, projection)."""
    temb = cond.temb.astype(jnp.float32)
    temb = temb if temb.ndim == 3 else temb[:, None]  # (B, F, D): per latent frame, or F = 1
    out_mod = params["scale_shift_table"].astype(jnp.float32) + temb[:, :, None]  # (B, F, 2, D)
    frames, tokens = frame_views(x.shape, out_mod.shape[1])
    x = tokens(modulate(frames(x), out_mod[:, :, 0:1], out_mod[:, :, 1:2], cfg.eps))
    x = linear(x, params["proj_out"], precision=settings.precision)
    return unpatchify(x, cond.grid, cfg.patch_size)


def forward(
    params: Params, cfg: TransformerConfig, inputs: DitInputs, *, settings: RunSettings = DEFAULT_SETTINGS
) -> jax.Array:
    """Velocity prediction for the :class:`DitInputs` (``latents (B, C, T, H, W)``, ``timestep (B,)``,
    ``prompt_embeds (B, L, text_dim)``; an image-to-video model's image states, a VACE model's or an
    Animate model's control, the text K/V cache): :func:`embed_inputs`, :func:`run_blocks`,
    :func:`project`, all run as ``settings`` says (static under ``jit``).

    Activations run in ``settings.dtype``; the result is returned in it as the reference does. Under
    ``settings.mesh`` the tokens are split as :func:`wanjax.parallel.layouts.token_layout` says (batch
    over dp, tokens over sp, heads over tp) and pinned so at every block boundary. ``precision``: of
    float32 matmuls. ``offload="blocks"``: ``params["blocks"]`` lie in host memory and each layer's
    weights are brought to the device inside the loop (:func:`~wanjax.models.offload.stream_layers`);
    the other modes run the resident scan. The numerics are the same either way.
    """
    x, cond = embed_inputs(params, cfg, inputs, settings=settings)
    x = run_blocks(params, cfg, x, cond, settings=settings)
    return project(params, cfg, x, cond, settings=settings)


def embed_inputs(
    params: Params, cfg: TransformerConfig, inputs: DitInputs, *, settings: RunSettings = DEFAULT_SETTINGS
) -> tuple[jax.Array, Conditioning]:
    """The tokens entering the first block and the blocks' conditioning:
    :func:`~wanjax.models.dit_embed.embed`, and a VACE model's hints or an Animate model's pose and
    face (:func:`~wanjax.models.dit_control.embed_control`); with the inputs' ``kv`` (the run's
    :func:`context_kv`) the blocks read it (the context's projection left unused, so the compiler
    drops it)."""
    latents, text, image = inputs.latents, inputs.prompt_embeds, inputs.image_embeds
    x, cond = embed(params, cfg, latents, inputs.timestep, text, settings=settings, image_embeds=image)
    if inputs.kv is not None:
        cond = dataclasses.replace(cond, context_kv=inputs.kv)
    return embed_control(params, cfg, x, cond, inputs.control, tuple(latents.shape), settings)


# ----------------------------------------------------------------------------------------------
# Loading and the callable model


class WanTransformer:
    """A loaded Wan transformer: ``model(latents, timestep, prompt_embeds) -> velocity``.

    Inputs use the diffusers layout (``latents (B, C, T, H, W)``, ``timestep (B,)``,
    ``prompt_embeds (B, L, text_dim)``); the forward is compiled once per input shape and runs as
    ``settings`` says (:class:`~wanjax.models.settings.RunSettings`: dtype, float32 precision,
    attention backend, mesh, offload).

    ``settings.offload`` (see :mod:`wanjax.models.offload`): with ``"blocks"`` the stacked layer
    weights (``params["blocks"]``) are expected in host memory (``load_transformer(...,
    offload="blocks")`` puts them there) and are streamed to the device one layer at a time;
    :meth:`to_host` and :meth:`to_device` move the weights between stages (``"model"`` and ``"blocks"``).
    """

    def __init__(self, cfg: TransformerConfig, params: Params, settings: RunSettings = DEFAULT_SETTINGS):
        self.cfg = cfg
        self.params = params
        self.settings = settings
        self.loras: list[tuple[Path, float]] = []  # the LoRA adapters merged (set_loras)
        self._lora_base: dict[Any, jax.Array] = {}  # the base of each leaf they changed, in host memory
        self._forward = jax.jit(self.apply)

    @property
    def dtype(self) -> jnp.dtype:
        """The activations' (and the velocity's) dtype."""
        return self.settings.dtype

    def __call__(
        self,
        latents: jax.Array,
        timestep: jax.Array,
        prompt_embeds: jax.Array,
        image_embeds: jax.Array | None = None,
        control: Control | None = None,
    ) -> jax.Array:
        self.check_shape(tuple(latents.shape))
        timestep = jnp.asarray(timestep)
        if timestep.ndim < 2:  # a scalar or one per sample; (B, F): one per latent frame
            timestep = jnp.broadcast_to(timestep, (latents.shape[0],))
        return self._forward(self.params, DitInputs(latents, timestep, prompt_embeds, image_embeds, control))

    def apply(self, params: Params, inputs: DitInputs) -> jax.Array:
        """The forward (:func:`forward`: :meth:`embed`, :meth:`blocks`, :meth:`project`) for use inside a
        caller's ``jit``; pass ``params`` as a traced argument there."""
        x, cond = self.embed(params, inputs)
        return self.project(params, self.blocks(params, x, cond), cond)

    def embed(self, params: Params, inputs: DitInputs) -> tuple[jax.Array, Conditioning]:
        """:func:`embed_inputs` with this model's settings (inside a caller's ``jit``, like :meth:`apply`)."""
        return embed_inputs(params, self.cfg, inputs, settings=self.settings)

    def context_kv(
        self, params: Params, prompt_embeds: jax.Array, image_embeds: jax.Array | None = None
    ) -> dict[str, ContextKV]:
        """:func:`context_kv` (the text K/V cache) with this model's settings."""
        return context_kv(params, self.cfg, prompt_embeds, settings=self.settings, image_embeds=image_embeds)

    def embed_time(self, params: Params, timestep: jax.Array) -> tuple[jax.Array, jax.Array]:
        """:func:`~wanjax.models.dit_embed.embed_time` (``temb``, ``time_mod``) with this model's settings."""
        return embed_time(params, self.cfg, timestep, self.settings)

    def blocks(
        self, params: Params, x: jax.Array, cond: Conditioning, start: int = 0, stop: int | None = None
    ) -> jax.Array:
        """:func:`run_blocks` with this model's settings."""
        return run_blocks(params, self.cfg, x, cond, start, stop, settings=self.settings)

    def project(self, params: Params, x: jax.Array, cond: Conditioning) -> jax.Array:
        """:func:`project` with this model's settings."""
        return project(params, self.cfg, x, cond, settings=self.settings)

    def set_loras(self, loras: Sequence[lora.LoraSpec], cache: lora.MergedCache | None = None) -> None:
        """Merge these LoRA adapters (``(file, weight)`` pairs; :mod:`wanjax.models.lora`) into the
        weights, in place of any merged before: the weights they change are rebuilt from the base kept
        for them, not read again. The base of every leaf an adapter changes stays in host memory
        (pinned, same sharding) while merged: the size of those leaves in host RAM, nothing on the
        device. An empty list restores the base weights. With a ``cache``, the merged leaves of a set
        used before are taken from it (and this set's kept in it). CheckpointError / ConfigError
        before any weight changes for a file that does not fit this model."""
        files = lora.load_loras(loras)
        plan = lora.plan_updates(checkpoint_spec(self.cfg), files)
        key = lora.set_key(files)
        merged = None if cache is None else cache.get(key)
        if merged is None:
            params = lora.restore(self.params, self._lora_base)
            self.params = lora.merge(params, plan)
            self._lora_base = {path: move(leaf, HOST) for path, leaf in lora.leaves_at(params, plan).items()}
            if cache is not None:
                cache.put(key, lora.leaves_at(self.params, plan))
        else:  # base back where the new set changes nothing; the leaves it changes from the cache
            base = self._lora_base
            params = lora.restore(self.params, {p: b for p, b in base.items() if p not in merged})
            fresh = lora.leaves_at(params, [p for p in merged if p not in base])
            self._lora_base = {p: base[p] for p in merged if p in base} | {
                p: move(leaf, HOST) for p, leaf in fresh.items()
            }
            self.params = lora.restore(params, merged)
        self.loras = [(f.path, w) for f, w in files]

    def to_host(self, block: bool = True) -> None:
        """Move every weight to pinned host memory (same devices and partitioning); with ``block``,
        return once the device copies are free."""
        self.params = move(self.params, HOST, block=block)

    def to_device(self, block: bool = False) -> None:
        """Move the weights back to where the forward runs them: all in device memory, except the
        stacked layers under ``offload="blocks"`` (they stay on the host and are streamed).
        Asynchronous unless ``block``: the next program waits for its arguments."""
        self.params = run_placement(self.params, "blocks", streams_layers(self.settings.offload), block=block)

    def check_shape(self, shape: tuple[int, ...]) -> None:
        """Raise ConfigError unless ``shape`` is a latent shape this model can run."""
        check_latent_shape(self.cfg, shape)

    def token_layout(self, shape: tuple[int, ...]) -> TokenLayout | None:
        """How the forward splits the tokens of latents of ``shape`` over the mesh (None: no mesh)."""
        mesh = self.settings.mesh
        if mesh is None:
            return None
        length = math.prod(s // p for s, p in zip(shape[2:], self.cfg.patch_size, strict=True))
        return token_layout(dict(mesh.shape), shape[0], length, self.cfg.num_attention_heads)


def check_latent_shape(cfg: TransformerConfig, shape: tuple[int, ...]) -> None:
    """Raise ConfigError unless latents of ``shape`` fit the transformer: channels, patch multiples,
    and no more patches along an axis than its RoPE table has positions."""
    if len(shape) != 5 or shape[1] != cfg.in_channels:
        raise ConfigError(f"latents must be (B, {cfg.in_channels}, T, H, W), got {shape}")
    for size, p, axis in zip(shape[2:], cfg.patch_size, "THW", strict=True):
        if size % p:
            raise ConfigError(f"latent {axis}={size} is not a multiple of the patch size {p}")
    excess = rope_excess(cfg, shape)
    if excess is not None:
        axis, _ = excess
        raise ConfigError(
            f"latent {'THW'[axis]}={shape[2 + axis]} exceeds the RoPE table "
            f"({cfg.rope_max_seq_len} positions of patch {cfg.patch_size[axis]}); use a smaller size"
        )


def attention_shapes(
    cfg: TransformerConfig, dtype: Any, window_size: int | None = None
) -> tuple[AttentionShape, AttentionShape]:
    """The transformer's self- and cross-attention problems (sizes left open): what an attention
    backend must be able to run for this model."""
    head = {"head_dim": cfg.attention_head_dim, "dtype": dtype, "heads": cfg.num_attention_heads}
    return AttentionShape(**head, window=window_size), AttentionShape(**head)


def rope_excess(cfg: TransformerConfig, shape: tuple[int, ...]) -> tuple[int, int] | None:
    """``(axis, positions)`` of the first latent axis (0: T, 1: H, 2: W) of ``(B, C, T, H, W)`` that
    needs more RoPE positions than the table has; None when every axis fits."""
    for axis, (size, p) in enumerate(zip(shape[2:], cfg.patch_size, strict=True)):
        if size // p > cfg.rope_max_seq_len:
            return axis, size // p
    return None


def load_transformer(
    path: str | Path,
    dtype: str | jnp.dtype = "bfloat16",
    *,
    attention_backend: str | AttentionSpec = "auto",
    sharding: ShardingFn | None = None,
    mesh: Mesh | None = None,
    fsdp: bool = False,
    precision: str | None = None,
    offload: Offload | str = "none",
    weights_dtype: str = "bf16",
    activations_dtype: str = "auto",
    config: TransformerConfig | None = None,
) -> WanTransformer:
    """Load ``transformer/`` of a diffusers-layout Wan model (``path`` = model root or that folder),
    or one transformer file of any layout and format ``config`` describes (see
    :meth:`~wanjax.io.component.Component.stored`).

    With ``mesh``, each weight is read straight into its shards (the axes of :func:`checkpoint_spec`;
    ``fsdp`` also splits ``embed`` dimensions over the non-tp axes) and the forward runs on the mesh.
    ``precision``: of float32 matmuls (None: the platform's default, see
    :func:`~wanjax.kernels.precision.default_precision`).
    ``offload="blocks"``: the stacked layer weights are read straight into pinned host memory (the
    same sharding, memory kind ``pinned_host``; :func:`transformer_sharding`) and streamed to the
    device per layer; ``"model"`` loads like ``"none"`` (the pipeline moves the weights between
    stages). ``weights_dtype`` (``bf16 | int8 | fp8``): ``int8``/``fp8`` store the matmul kernels in
    8 bits with per-channel scales, quantised as they are read (:mod:`wanjax.io.quant`);
    ``activations_dtype``: whether the blocks' int8 kernels multiply as W8A8 (:mod:`wanjax.models.w8a8`).
    With ``dtype``, ``precision``, ``attention_backend``, ``mesh``, ``offload`` they make its settings.
    """
    int8 = int8_matmuls(activations_dtype, weights_dtype)
    precision = resolve_precision(precision, "transformer")
    settings = RunSettings(dtype, precision, attention_backend, mesh, offload, int8_matmuls=int8)
    sharding = transformer_sharding(mesh, fsdp, settings.offload, sharding)
    cfg, params = TRANSFORMER.load(path, settings.dtype, sharding, weights_dtype, config)
    return WanTransformer(cfg, params, settings)


def transformer_sharding(
    mesh: Mesh | None = None,
    fsdp: bool = False,
    offload: Offload | str = "none",
    sharding: ShardingFn | None = None,
) -> ShardingFn | None:
    """The :data:`~wanjax.io.checkpoint.ShardingFn` :func:`load_transformer` reads each weight into
    (None: the first device, as :func:`~wanjax.io.checkpoint.load_params` defaults to): ``sharding``
    if given, else the mesh's :func:`~wanjax.parallel.rules.param_sharding`; under
    ``offload="blocks"`` the stacked leaves get memory kind ``pinned_host``. Also for planning:
    ``abstract_params(checkpoint_spec(cfg), dtype, transformer_sharding(...))``."""
    offload = parse_offload(offload)
    if mesh is not None and sharding is None:
        sharding = param_sharding(mesh, fsdp)
    return offload_sharding(sharding, offload) if streams_layers(offload) else sharding
