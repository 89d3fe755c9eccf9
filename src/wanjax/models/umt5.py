"""The UMT5 text encoder (transformers ``UMT5EncoderModel``, google/umt5-xxl) and prompt encoding.

``forward(params, cfg, input_ids, attention_mask)`` is the encoder's ``last_hidden_state``:
token embedding (no scaling), then per layer a pre-norm self-attention with its own relative
position bias (T5 buckets, no ``1/sqrt(d)`` score scaling, padded keys masked) and a pre-norm gated
tanh-GELU feed-forward, then a final T5 RMSNorm. Layers are stacked and run with ``lax.scan``, or
streamed from host memory one at a time under ``offload="model"``/``"blocks"``
(:func:`~wanjax.models.offload.streams_layers`: the encoder runs once per stage).

:class:`UMT5Encoder` adds what ``WanPipeline.encode_prompt`` does around it: prompt cleaning,
tokenisation to ``max_sequence_length`` and exact zeros at positions past each prompt's length.
Precision follows a transformers model loaded in that dtype: bf16 weights and activations, norm
statistics, softmax and matmul accumulation in float32; float32 matmuls at ``precision`` (static, see
:mod:`wanjax.kernels.precision`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from wanjax.errors import CheckpointError, ConfigError, WanjaxError
from wanjax.io.checkpoint import REPLICATED, LeafSource, ShardingFn, stacked, stacked_linear
from wanjax.io.component import Component
from wanjax.kernels.precision import Precision, resolve_precision
from wanjax.models import offload as placement
from wanjax.models.config import TRANSFORMERS_GENERIC_FIELDS, ComponentConfig, parse_dtype
from wanjax.models.defaults import TEXT_LENGTH
from wanjax.models.encoder_layouts import LLAMA_CPP_T5_LAYOUT, WAN_T5_LAYOUT
from wanjax.models.layers import Params, gelu_tanh, linear, matmul, scan_layers
from wanjax.models.tokenizer import Tokenizer, load_tokenizer
from wanjax.parallel.layouts import batch_spec, constrain, params_mesh
from wanjax.runtime.compile_effort import once_per_video

# ----------------------------------------------------------------------------------------------
# Config


@dataclasses.dataclass(frozen=True)
class UMT5Config(ComponentConfig):
    """``text_encoder/config.json`` of a transformers ``UMT5EncoderModel``.

    Defaults are transformers' ``UMT5Config`` defaults (what it assumes for a missing field);
    :data:`wanjax.models.registry.UMT5_XXL` is the encoder Wan uses.
    """

    vocab_size: int = 250112
    d_model: int = 512
    d_kv: int = 64
    d_ff: int = 1024
    num_layers: int = 8
    num_heads: int = 6
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6
    feed_forward_proj: str = "gated-gelu"
    model_type: str = "umt5"
    is_decoder: bool = False

    # Accepted and deliberately ignored: they do not change the encoder's output.
    _IGNORED_FIELDS: ClassVar[frozenset[str]] = TRANSFORMERS_GENERIC_FIELDS | frozenset(
        {
            # derived by transformers from feed_forward_proj (any stored value is overwritten)
            "dense_act_fn",
            "is_gated_act",
            # training only
            "dropout_rate",
            "classifier_dropout",
            "initializer_factor",
            # decoder / generation side of the encoder-decoder model
            "is_encoder_decoder",
            "num_decoder_layers",
            "decoder_start_token_id",
            "use_cache",
            "output_past",
            "scale_decoder_outputs",  # transformers >= 5.24: scales the decoder's output before lm_head
            # the encoder's input embedding is always the shared one (transformers forces the tie)
            "tie_word_embeddings",
            # token ids the tokenizer uses; the encoder has no padding_idx
            "pad_token_id",
            "eos_token_id",
            "bos_token_id",
            "tokenizer_class",
            # T5X training option that transformers' UMT5 does not read
            "scalable_attention",
        }
    )

    @property
    def inner_dim(self) -> int:
        return self.num_heads * self.d_kv

    def validate(self, source: str) -> None:
        if self.model_type != "umt5":
            raise ConfigError(
                f"{source}: model_type {self.model_type!r} is not supported; wanjax runs UMT5 encoders "
                "('umt5', one relative position bias per layer)"
            )
        if self.is_decoder:
            raise ConfigError(f"{source}: is_decoder=true; the text encoder must be an encoder")
        if self.feed_forward_proj not in ("gated-gelu", "gated-gelu_new"):
            raise ConfigError(
                f"{source}: feed_forward_proj {self.feed_forward_proj!r} is not supported "
                "(only the gated tanh-GELU feed-forward of UMT5, 'gated-gelu')"
            )
        sizes = ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads")
        for name in sizes:
            if getattr(self, name) < 1:
                raise ConfigError(f"{source}: {name} must be positive, got {getattr(self, name)}")
        buckets, distance = self.relative_attention_num_buckets, self.relative_attention_max_distance
        if buckets < 4 or distance <= buckets // 4:
            raise ConfigError(
                f"{source}: relative_attention_num_buckets={buckets} must be >= 4 and "
                f"relative_attention_max_distance={distance} greater than num_buckets // 4"
            )


# ----------------------------------------------------------------------------------------------
# Checkpoint layout

# The embedding is tied, so a checkpoint may hold either name or both; when both are stored,
# transformers 5 runs the encoder with encoder.embed_tokens.weight.
_EMBEDDING_NAMES = ("encoder.embed_tokens.weight", "shared.weight")


def checkpoint_spec(cfg: UMT5Config, embedding: str = "shared.weight") -> Params:
    """Which transformers tensors build each params leaf, with each leaf's logical axes; ``embedding``
    names the stored embedding (the 256k-token table splits its vocabulary over ``tp``, or its model
    dim when ``tp`` does not divide the vocabulary)."""
    n, d, inner, ff = cfg.num_layers, cfg.d_model, cfg.inner_dim, cfg.d_ff

    def lin(name: str, n_in: int, n_out: int, axes: tuple[str, str]) -> Params:
        return stacked_linear(f"encoder.block.{{i}}.{name}", n, n_in, n_out, axes, bias=False)

    def norm(name: str) -> Params:
        return {"scale": stacked(f"encoder.block.{{i}}.{name}.weight", n, (d,), axes=("layers", "embed"))}

    attn = "layer.0.SelfAttention"
    ffn = "layer.1.DenseReluDense"
    return {
        "embedding": LeafSource(
            (embedding,), (cfg.vocab_size, d), axes=("vocab", "embed"), alt_axes=((None, "embed_tp"),)
        ),
        "layers": {
            "attn_norm": norm("layer.0.layer_norm"),
            "q": lin(f"{attn}.q", d, inner, ("embed", "heads")),
            "k": lin(f"{attn}.k", d, inner, ("embed", "heads")),
            "v": lin(f"{attn}.v", d, inner, ("embed", "heads")),
            "o": lin(f"{attn}.o", inner, d, ("heads", "embed")),
            "rel_bias": stacked(
                f"encoder.block.{{i}}.{attn}.relative_attention_bias.weight",
                n,
                (cfg.relative_attention_num_buckets, cfg.num_heads),
                axes=("layers", None, None),
            ),
            "ffn_norm": norm("layer.1.layer_norm"),
            "wi_0": lin(f"{ffn}.wi_0", d, ff, ("embed", "mlp")),
            "wi_1": lin(f"{ffn}.wi_1", d, ff, ("embed", "mlp")),
            "wo": lin(f"{ffn}.wo", ff, d, ("mlp", "embed")),
        },
        "final_norm": {"scale": LeafSource(("encoder.final_layer_norm.weight",), (d,), axes=REPLICATED)},
    }


def _stored_spec(cfg: UMT5Config, names: Collection[str]) -> Params:
    """:func:`checkpoint_spec` for the embedding name the checkpoint stores."""
    return checkpoint_spec(cfg, next((n for n in _EMBEDDING_NAMES if n in names), "shared.weight"))


def _ignored_tensor(name: str) -> bool:
    """The second copy of the tied embedding and decoder-side weights of a full UMT5 checkpoint."""
    return name in _EMBEDDING_NAMES or name.startswith(("decoder.", "lm_head."))


TEXT_ENCODER = Component(
    "text_encoder",
    config=UMT5Config,
    weight_stems=("model",),
    spec=_stored_spec,
    ignore=_ignored_tensor,
    layouts=(WAN_T5_LAYOUT, LLAMA_CPP_T5_LAYOUT),
)


# ----------------------------------------------------------------------------------------------
# Forward


def relative_position_buckets(length: int, num_buckets: int, max_distance: int) -> np.ndarray:
    """``(length, length)`` int32 bucket of ``key - query`` for a bidirectional T5 encoder.

    transformers' ``_relative_position_bucket``, computed host-side the same way: the log ratio in
    float32, truncated toward zero.
    """
    pos = np.arange(length, dtype=np.int64)
    rel = pos[None, :] - pos[:, None]
    half = num_buckets // 2
    buckets = (rel > 0).astype(np.int64) * half
    dist = np.abs(rel)
    max_exact = half // 2
    with np.errstate(divide="ignore"):  # log(0) on the small distances, discarded below
        ratio = np.log(dist.astype(np.float32) / np.float32(max_exact))
    ratio = ratio / np.float32(math.log(max_distance / max_exact)) * np.float32(half - max_exact)
    large = np.minimum(max_exact + np.trunc(np.where(dist < max_exact, 0, ratio)).astype(np.int64), half - 1)
    return (buckets + np.where(dist < max_exact, dist, large)).astype(np.int32)


def t5_rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """T5 LayerNorm: ``x * rsqrt(mean(x²) + eps)`` in float32, rounded to the weight dtype, times the weight."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
    return scale * y.astype(scale.dtype)


def _heads(x: jax.Array, heads: int) -> jax.Array:
    """``(B, L, H*D)`` -> ``(B, H, L, D)``."""
    b, length, _ = x.shape
    return x.reshape(b, length, heads, -1).transpose(0, 2, 1, 3)


def _attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    bias: jax.Array,
    key_mask: jax.Array,
    precision: Precision = "highest",
) -> jax.Array:
    """``softmax(q kᵀ + bias) v`` over valid keys, ``(B, H, L, D)`` in and out; scores in float32."""
    scores = matmul(q, k.swapaxes(-1, -2), precision) + bias.astype(jnp.float32)[None]
    scores = jnp.where(key_mask[:, None, None, :], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1)
    return matmul(probs.astype(v.dtype), v, precision).astype(q.dtype)


def _layer(
    p: Params,
    x: jax.Array,
    buckets: jax.Array,
    key_mask: jax.Array,
    cfg: UMT5Config,
    precision: Precision = "highest",
) -> jax.Array:
    b, length, _ = x.shape
    heads, eps = cfg.num_heads, cfg.layer_norm_epsilon

    def lin(x: jax.Array, name: str) -> jax.Array:
        return linear(x, p[name], precision=precision)

    n = t5_rms_norm(x, p["attn_norm"]["scale"], eps)
    q, k, v = (_heads(lin(n, name), heads) for name in ("q", "k", "v"))
    bias = jnp.take(p["rel_bias"].T, buckets, axis=1)  # (H, L, L)
    a = _attention(q, k, v, bias, key_mask, precision)
    x = x + lin(a.transpose(0, 2, 1, 3).reshape(b, length, cfg.inner_dim), "o")

    n = t5_rms_norm(x, p["ffn_norm"]["scale"], eps)
    h = gelu_tanh(lin(n, "wi_0")) * lin(n, "wi_1")
    return x + lin(h, "wo")


def forward(
    params: Params,
    cfg: UMT5Config,
    input_ids: jax.Array,
    attention_mask: jax.Array,
    *,
    precision: Precision = "highest",
    stream: bool = False,
) -> jax.Array:
    """``last_hidden_state (B, L, d_model)`` for ``input_ids (B, L)`` and ``attention_mask (B, L)``.

    Activations run in the params' dtype, float32 matmuls at ``precision``. Keys with mask 0 are
    ignored; padded query rows are still computed (as in the reference) and are not meaningful.
    ``stream``: ``params["layers"]`` lie in host memory and are brought to the device one layer at a
    time (:func:`~wanjax.models.offload.stream_layers`); the numerics are the same.
    """
    length = input_ids.shape[1]
    buckets = jnp.asarray(
        relative_position_buckets(
            length, cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance
        )
    )
    key_mask = attention_mask.astype(bool)
    x = jnp.take(params["embedding"], input_ids, axis=0)

    def layer(h: jax.Array, p: Params) -> jax.Array:
        return _layer(p, h, buckets, key_mask, cfg, precision)

    x = (placement.stream_layers if stream else scan_layers)(layer, x, params["layers"])
    return t5_rms_norm(x, params["final_norm"]["scale"], cfg.layer_norm_epsilon)


def prompt_embeddings(
    params: Params, cfg: UMT5Config, input_ids: jax.Array, attention_mask: jax.Array, **options: Any
) -> jax.Array:
    """:func:`forward` (``options``: its ``precision``, ``stream``) with positions at or past each
    row's length (``mask.sum()``) set to exact zeros."""
    hidden = forward(params, cfg, input_ids, attention_mask, **options)
    lengths = attention_mask.astype(jnp.int32).sum(axis=-1)
    keep = jnp.arange(input_ids.shape[1])[None, :] < lengths[:, None]
    return jnp.where(keep[..., None], hidden, jnp.zeros((), hidden.dtype))


# ----------------------------------------------------------------------------------------------
# Loading and prompt encoding

MIN_BUCKET = 32


def compute_length(longest: int, max_length: int) -> int:
    """Sequence length actually run: the next power of two >= ``longest`` (>= 32), capped at ``max_length``.

    Positions past the longest prompt are masked keys for every row and zeros in the output, and the
    relative bias depends on distances only, so a shorter padded batch gives the same embeddings
    (to float rounding) for a fraction of the cost, with at most log2(max_length) compiled shapes.
    """
    return min(max_length, max(MIN_BUCKET, 1 << max(longest - 1, 0).bit_length()))


class UMT5Encoder:
    """A loaded UMT5 encoder with its tokenizer.

    ``encode(prompts)`` equals diffusers' ``WanPipeline.encode_prompt`` (``[B, max_sequence_length,
    d_model]`` in the model dtype); ``model(ids, mask)`` is the bare ``last_hidden_state``.
    With ``trim_padding`` (default) the encoder runs on the shortest power-of-two length holding
    every prompt of the batch and the result is zero-padded, which gives the same embeddings.
    ``precision``: of float32 matmuls (``highest | high | default``; None: this platform's default,
    see :func:`~wanjax.kernels.precision.default_precision`). ``offload`` (:mod:`wanjax.models.offload`):
    under ``"model"`` and ``"blocks"`` the stacked layer weights (``params["layers"]``) are expected in
    host memory (``load_text_encoder(..., offload=...)`` puts them there) and are streamed to the
    device one layer at a time; :meth:`to_host` and :meth:`to_device` move the weights between stages.
    """

    def __init__(
        self,
        cfg: UMT5Config,
        params: Params,
        tokenizer: Tokenizer | None,
        *,
        trim_padding: bool = True,
        precision: str | None = None,
        offload: placement.Offload | str = "none",
    ):
        self.cfg = cfg
        self.params = params
        self.tokenizer = tokenizer
        self.trim_padding = trim_padding
        self.precision = resolve_precision(precision, "text_encoder")
        self.stream = placement.streams_layers(placement.parse_offload(offload), per_step=False)
        self.mesh = params_mesh(params)  # the prompts' batch is split over its dp
        options = once_per_video() or None  # a video's prompts are encoded once
        self._forward = jax.jit(self.apply, compiler_options=options)
        self._embed = jax.jit(self._embed_impl, static_argnames="out_length", compiler_options=options)

    @property
    def dtype(self) -> jnp.dtype:
        return self.params["embedding"].dtype

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array) -> jax.Array:
        return self._forward(self.params, input_ids, attention_mask)

    def apply(self, params: Params, input_ids: jax.Array, attention_mask: jax.Array) -> jax.Array:
        """The forward for use inside a caller's ``jit``; pass ``params`` as a traced argument there."""
        return forward(
            params, self.cfg, input_ids, attention_mask, precision=self.precision, stream=self.stream
        )

    def to_host(self, block: bool = True) -> None:
        """Move every weight to pinned host memory (same devices and partitioning); with ``block``,
        return once the device copies are free."""
        self.params = placement.move(self.params, placement.HOST, block=block)

    def to_device(self, block: bool = False) -> None:
        """Move the weights back to where the forward runs them: all in device memory, except the
        streamed layers (they stay on the host). Asynchronous unless ``block``."""
        self.params = placement.run_placement(self.params, "layers", self.stream, block=block)

    def _embed_impl(self, params: Params, ids: jax.Array, mask: jax.Array, out_length: int) -> jax.Array:
        """The prompts split over ``dp`` where the weights' mesh has it and it divides the batch."""
        spec = batch_spec(self.mesh, ids.shape[0])
        ids, mask = constrain(ids, self.mesh, spec), constrain(mask, self.mesh, spec)
        emb = prompt_embeddings(params, self.cfg, ids, mask, precision=self.precision, stream=self.stream)
        return jnp.pad(constrain(emb, self.mesh, spec), ((0, 0), (0, out_length - ids.shape[1]), (0, 0)))

    def lower(self, batch: int, length: int = TEXT_LENGTH) -> jax.stages.Lowered:
        """The program :meth:`encode_ids` runs for ``batch`` prompts of ``length`` tokens (none
        trimmed), lowered from abstract inputs (e.g. to compile for another target)."""
        ids = jax.ShapeDtypeStruct((batch, length), jnp.int32)
        return self._embed.lower(self.params, ids, ids, out_length=length)

    def encode_ids(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> jax.Array:
        """Prompt embeddings of tokenised, right-padded prompts (``(B, L)`` ids and mask)."""
        input_ids, attention_mask = np.asarray(input_ids), np.asarray(attention_mask)
        if input_ids.shape != attention_mask.shape or input_ids.ndim != 2:
            raise WanjaxError(f"ids {input_ids.shape} and mask {attention_mask.shape} must both be (B, L)")
        if input_ids.size and (input_ids.min() < 0 or input_ids.max() >= self.cfg.vocab_size):
            raise WanjaxError(f"token ids must lie in [0, {self.cfg.vocab_size}), got {input_ids.max()}")
        out_length = input_ids.shape[1]
        run = out_length
        if self.trim_padding:
            run = compute_length(int(attention_mask.astype(bool).sum(-1).max()), out_length)
            # Trimming keeps every valid key only if the padding is on the right.
            if attention_mask[:, run:].any():
                run = out_length
        ids = jnp.asarray(input_ids[:, :run], jnp.int32)
        mask = jnp.asarray(attention_mask[:, :run], jnp.int32)
        return self._embed(self.params, ids, mask, out_length=out_length)

    def encode(self, prompts: str | Sequence[str], max_sequence_length: int = TEXT_LENGTH) -> jax.Array:
        """``[B, max_sequence_length, d_model]`` embeddings of cleaned, tokenised prompts (model dtype)."""
        if self.tokenizer is None:
            raise WanjaxError("this text encoder was built without a tokenizer; use encode_ids")
        tokens = self.tokenizer(prompts, max_sequence_length)
        return self.encode_ids(tokens.ids, tokens.mask)

    def encode_prompt(
        self,
        prompt: str | Sequence[str],
        negative_prompt: str | Sequence[str] | None = None,
        max_sequence_length: int = TEXT_LENGTH,
    ) -> tuple[jax.Array, jax.Array]:
        """Positive and negative embeddings in one batched call, as ``WanPipeline.encode_prompt`` with CFG.

        The negative prompt defaults to ``""``; one string is used for every prompt, a list must
        have one entry per prompt.
        """
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        negative = "" if negative_prompt is None else negative_prompt
        negatives = [negative] * len(prompts) if isinstance(negative, str) else list(negative)
        if len(negatives) != len(prompts):
            raise WanjaxError(
                f"{len(negatives)} negative prompts for {len(prompts)} prompts; give one per prompt or one string"
            )
        both = self.encode(prompts + negatives, max_sequence_length)
        return both[: len(prompts)], both[len(prompts) :]


def load_encoder_params(
    path: str | Path,
    dtype: str | jnp.dtype = "bfloat16",
    *,
    sharding: ShardingFn | None = None,
    weights_dtype: str = "bf16",
    offload: placement.Offload | str = "none",
    config: UMT5Config | None = None,
) -> tuple[UMT5Config, Params]:
    """Config and params of ``text_encoder/`` (``path`` = model root or that folder, or one weights
    file ``config`` describes), no tokenizer;
    ``weights_dtype`` ``int8``/``fp8``: the matmul kernels in 8 bits (:mod:`wanjax.io.quant`);
    ``offload`` ``"model"``/``"blocks"``: the stacked layers read straight into pinned host memory."""
    dtype = parse_dtype(dtype)
    if dtype == jnp.float16:
        raise ConfigError(
            "float16 is not supported for the UMT5 encoder (its activations overflow float16); "
            "use bfloat16 or float32"
        )
    sharding = placement.offload_sharding(sharding, placement.parse_offload(offload), per_step=False)
    return TEXT_ENCODER.load(path, dtype, sharding, weights_dtype, config)


def load_text_encoder(
    path: str | Path,
    dtype: str | jnp.dtype = "bfloat16",
    *,
    tokenizer: str | Path | Tokenizer | None = None,
    sharding: ShardingFn | None = None,
    trim_padding: bool = True,
    precision: str | None = None,
    weights_dtype: str = "bf16",
    offload: placement.Offload | str = "none",
    config: UMT5Config | None = None,
) -> UMT5Encoder:
    """Load ``text_encoder/`` and its tokenizer from a diffusers-layout Wan model.

    ``path`` is the model root or the ``text_encoder`` folder; the tokenizer is read from
    ``tokenizer`` when given, else from the ``tokenizer/`` folder next to the text encoder.
    ``precision``: of float32 matmuls (None: the platform's default; see :class:`UMT5Encoder`).
    ``weights_dtype`` (``bf16 | int8 | fp8``): ``int8``/``fp8`` store the matmul kernels in 8 bits
    with per-channel scales, quantised as they are read (:mod:`wanjax.io.quant`). ``offload``: see
    :class:`UMT5Encoder`. ``path`` may also be one weights file of any layout ``config`` describes
    (``tokenizer`` then required).
    """
    precision = resolve_precision(precision, "text_encoder")
    directory, cfg = TEXT_ENCODER.location(path), TEXT_ENCODER.config_at(path, config)
    if tokenizer is None:
        tokenizer = directory.parent / "tokenizer"
        if not tokenizer.is_dir():
            raise CheckpointError(
                f"{directory.parent}: no tokenizer/ folder next to text_encoder/; pass tokenizer=<its path>"
            )
    if not isinstance(tokenizer, Tokenizer):
        tokenizer = load_tokenizer(tokenizer)
    if tokenizer.vocab_size > cfg.vocab_size:
        raise CheckpointError(
            f"{directory}: the tokenizer has {tokenizer.vocab_size} tokens but the encoder embeds only "
            f"{cfg.vocab_size}; they belong to different models"
        )
    cfg, params = load_encoder_params(
        path, dtype, sharding=sharding, weights_dtype=weights_dtype, offload=offload, config=cfg
    )
    return UMT5Encoder(
        cfg, params, tokenizer, trim_padding=trim_padding, precision=precision, offload=offload
    )
