"""The CLIP vision encoder of Wan 2.1 image-to-video (transformers ``CLIPVisionModel``, ViT-H/14).

``forward(params, cfg, pixel_values, layers=k)`` is transformers' ``hidden_states[k]`` with
``output_hidden_states=True``: the patch embedding (a stride-``patch`` convolution without bias, run
as a matmul over flattened patches), the class token and learned position embeddings, the
pre-LayerNorm (``pre_layrnorm``: that is ``hidden_states[0]``), then ``k`` pre-norm encoder layers
(softmax attention with biased q/k/v/out projections, an ``fc1 -> gelu -> fc2`` MLP). Wan conditions
on ``hidden_states[-2]``, the output of layer ``N-2`` without the post-LayerNorm:
:func:`penultimate_hidden_states` runs only the first ``N-1`` layers. ``post_layernorm`` (the pooled
output's norm) is never used, so it is not loaded.

Precision follows a transformers model loaded in that dtype: weights and activations in the params'
dtype, LayerNorm statistics, softmax, activations and matmul accumulation in float32; float32 matmuls
at ``precision`` (static, see :mod:`wanjax.kernels.precision`; the text encoder's defaults, as this
model too is all matmuls).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection
from pathlib import Path
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from wanjax.errors import ConfigError, WanjaxError
from wanjax.io.checkpoint import REPLICATED, LeafSource, ShardingFn, stacked, stacked_linear
from wanjax.io.component import Component
from wanjax.kernels.precision import Precision, resolve_precision
from wanjax.models.config import TRANSFORMERS_GENERIC_FIELDS, ComponentConfig, parse_dtype
from wanjax.models.encoder_layouts import WAN_CLIP_LAYOUT
from wanjax.models.image_processor import ImageInput, ImageProcessor, load_image_processor
from wanjax.models.layers import Params, layer_norm, linear, matmul, scan_layers
from wanjax.models.offload import DEVICE, HOST, move
from wanjax.runtime.compile_effort import once_per_video

# ----------------------------------------------------------------------------------------------
# Config

ACTIVATIONS = ("gelu", "quick_gelu")


@dataclasses.dataclass(frozen=True)
class CLIPVisionConfig(ComponentConfig):
    """``image_encoder/config.json`` of a transformers ``CLIPVisionModel``.

    Defaults are transformers' ``CLIPVisionConfig`` defaults (ViT-B/32); :data:`wanjax.models.registry.CLIP_VIT_H_14`
    is the encoder Wan 2.1 image-to-video uses.
    """

    hidden_size: int = 768
    intermediate_size: int = 3072
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    num_channels: int = 3
    image_size: int = 224
    patch_size: int = 32
    hidden_act: str = "quick_gelu"
    layer_norm_eps: float = 1e-5
    model_type: str = "clip_vision_model"

    # Accepted and deliberately ignored: they do not change the vision encoder's hidden states.
    _IGNORED_FIELDS: ClassVar[frozenset[str]] = TRANSFORMERS_GENERIC_FIELDS | frozenset(
        {
            "projection_dim",  # the visual projection of CLIPVisionModelWithProjection / CLIPModel
            # training only
            "attention_dropout",
            "dropout",
            "initializer_range",
            "initializer_factor",
            # a chunked feed-forward computes the same values
            "chunk_size_feed_forward",
            "is_encoder_decoder",
            "tie_word_embeddings",
            "pad_token_id",
            "bos_token_id",
            "eos_token_id",
        }
    )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def grid(self) -> int:
        """Patches per side (the convolution drops any remainder of ``image_size``)."""
        return self.image_size // self.patch_size

    @property
    def num_positions(self) -> int:
        """Tokens per image: the class token and one per patch."""
        return self.grid**2 + 1

    def validate(self, source: str) -> None:
        if self.model_type != "clip_vision_model":
            raise ConfigError(
                f"{source}: model_type {self.model_type!r} is not supported; the image encoder must be a "
                "CLIP vision model ('clip_vision_model')"
            )
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(
                f"{source}: hidden_act {self.hidden_act!r} is not supported (use one of {', '.join(ACTIVATIONS)})"
            )
        sizes = (
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_channels",
            "patch_size",
        )
        for name in sizes:
            if getattr(self, name) < 1:
                raise ConfigError(f"{source}: {name} must be positive, got {getattr(self, name)}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"{source}: hidden_size {self.hidden_size} is not a multiple of "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if self.image_size < self.patch_size:
            raise ConfigError(
                f"{source}: image_size {self.image_size} is smaller than patch_size {self.patch_size}"
            )


# ----------------------------------------------------------------------------------------------
# Checkpoint layout

# transformers < 5 saves a CLIPVisionModel under ``vision_model.`` (Wan's checkpoints); 5 without it.
PREFIX = "vision_model."


def _patch_kernel(weight: np.ndarray) -> np.ndarray:
    """Conv2d weight ``(D, C, p, p)`` -> ``(C*p*p, D)``; patch vectors ordered (c, h, w)."""
    return weight.reshape(weight.shape[0], -1).T


def checkpoint_spec(cfg: CLIPVisionConfig, prefix: str = PREFIX) -> Params:
    """Which transformers tensors build each params leaf, with each leaf's logical axes; ``prefix``
    starts every stored name (``vision_model.`` or empty)."""
    n, d, ff, p = cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size, cfg.patch_size
    layer = f"{prefix}encoder.layers.{{i}}"

    def lin(name: str, n_in: int, n_out: int, axes: tuple[str, str]) -> Params:
        return stacked_linear(f"{layer}.{name}", n, n_in, n_out, axes)

    def norm(name: str) -> Params:
        return {
            part: stacked(f"{layer}.{name}.{tensor}", n, (d,), axes=("layers", "embed"))
            for part, tensor in (("scale", "weight"), ("bias", "bias"))
        }

    emb = f"{prefix}embeddings"
    return {
        "patch_embedding": {
            "kernel": LeafSource(
                (f"{emb}.patch_embedding.weight",),
                (d, cfg.num_channels, p, p),
                _patch_kernel,
                axes=(None, "embed"),
            )
        },
        "class_embedding": LeafSource((f"{emb}.class_embedding",), (d,), axes=REPLICATED),
        "position_embedding": LeafSource(
            (f"{emb}.position_embedding.weight",), (cfg.num_positions, d), axes=(None, "embed")
        ),
        "pre_norm": {
            "scale": LeafSource((f"{prefix}pre_layrnorm.weight",), (d,), axes=REPLICATED),
            "bias": LeafSource((f"{prefix}pre_layrnorm.bias",), (d,), axes=REPLICATED),
        },
        "layers": {
            "norm1": norm("layer_norm1"),
            "q": lin("self_attn.q_proj", d, d, ("embed", "heads")),
            "k": lin("self_attn.k_proj", d, d, ("embed", "heads")),
            "v": lin("self_attn.v_proj", d, d, ("embed", "heads")),
            "out": lin("self_attn.out_proj", d, d, ("heads", "embed")),
            "norm2": norm("layer_norm2"),
            "fc1": lin("mlp.fc1", d, ff, ("embed", "mlp")),
            "fc2": lin("mlp.fc2", ff, d, ("mlp", "embed")),
        },
    }


def _stored_spec(cfg: CLIPVisionConfig, names: Collection[str]) -> Params:
    """:func:`checkpoint_spec` for the name prefix the checkpoint uses."""
    return checkpoint_spec(cfg, PREFIX if any(n.startswith(PREFIX) for n in names) else "")


def _ignored_tensor(name: str) -> bool:
    """The pooled output's norm (Wan uses the hidden states), a visual projection, and the
    ``position_ids`` buffer old transformers versions saved."""
    name = name.removeprefix(PREFIX)
    return name.startswith(("post_layernorm.", "visual_projection.")) or name.endswith("position_ids")


IMAGE_ENCODER = Component(
    "image_encoder",
    config=CLIPVisionConfig,
    weight_stems=("model",),
    spec=_stored_spec,
    ignore=_ignored_tensor,
    layouts=(WAN_CLIP_LAYOUT,),
)


# ----------------------------------------------------------------------------------------------
# Forward


def _activation(name: str) -> Callable[[jax.Array], jax.Array]:
    """transformers' ``ACT2FN[name]`` in float32: exact (erf) GELU or ``x * sigmoid(1.702 x)``."""
    if name == "gelu":
        return lambda x: jax.nn.gelu(x, approximate=False)
    return lambda x: x * jax.nn.sigmoid(1.702 * x)


def _norm(x: jax.Array, p: Params, eps: float) -> jax.Array:
    """``nn.LayerNorm`` in float32, rounded to x's dtype."""
    return layer_norm(x, eps, p["scale"], p["bias"]).astype(x.dtype)


def _heads(x: jax.Array, heads: int) -> jax.Array:
    """``(B, L, H*D)`` -> ``(B, H, L, D)``."""
    b, length, _ = x.shape
    return x.reshape(b, length, heads, -1).transpose(0, 2, 1, 3)


def embed(params: Params, cfg: CLIPVisionConfig, pixel_values: jax.Array, precision: Precision) -> jax.Array:
    """``hidden_states[0]`` ``(B, 1 + grid², D)``: patch, class and position embeddings, pre-LayerNorm."""
    dtype = params["class_embedding"].dtype
    b, c = pixel_values.shape[:2]
    g, p = cfg.grid, cfg.patch_size
    x = pixel_values[:, :, : g * p, : g * p].astype(dtype)
    x = x.reshape(b, c, g, p, g, p).transpose(0, 2, 4, 1, 3, 5).reshape(b, g * g, c * p * p)
    patches = matmul(x, params["patch_embedding"]["kernel"], precision).astype(dtype)
    cls = jnp.broadcast_to(params["class_embedding"], (b, 1, cfg.hidden_size))
    x = jnp.concatenate([cls, patches], axis=1) + params["position_embedding"]
    return _norm(x, params["pre_norm"], cfg.layer_norm_eps)


def _layer(p: Params, x: jax.Array, cfg: CLIPVisionConfig, precision: Precision) -> jax.Array:
    b, length, d = x.shape
    heads, eps = cfg.num_attention_heads, cfg.layer_norm_eps

    def lin(x: jax.Array, name: str) -> jax.Array:
        return linear(x, p[name], precision=precision)

    n = _norm(x, p["norm1"], eps)
    q, k, v = (_heads(lin(n, name), heads) for name in ("q", "k", "v"))
    scores = matmul(q, k.swapaxes(-1, -2), precision) * (cfg.head_dim**-0.5)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    a = matmul(probs, v, precision).astype(x.dtype)
    x = x + lin(a.transpose(0, 2, 1, 3).reshape(b, length, d), "out")

    n = _norm(x, p["norm2"], eps)
    h = linear(n, p["fc1"], jnp.float32, precision)
    return x + lin(_activation(cfg.hidden_act)(h).astype(x.dtype), "fc2")


def forward(
    params: Params,
    cfg: CLIPVisionConfig,
    pixel_values: jax.Array,
    *,
    layers: int | None = None,
    precision: Precision = "highest",
) -> jax.Array:
    """transformers' ``hidden_states[layers]`` ``(B, 1 + grid², hidden_size)`` for ``pixel_values
    (B, C, image_size, image_size)``: the embeddings then the first ``layers`` encoder layers (default
    all of them: ``last_hidden_state``). Activations in the params' dtype."""
    n = cfg.num_hidden_layers if layers is None else layers
    if not 0 <= n <= cfg.num_hidden_layers:
        raise ValueError(f"layers must lie in [0, {cfg.num_hidden_layers}], got {n}")
    x = embed(params, cfg, pixel_values, precision)

    def layer(h: jax.Array, p: Params) -> jax.Array:
        return _layer(p, h, cfg, precision)

    return scan_layers(layer, x, params["layers"], stop=n)


def penultimate_hidden_states(
    params: Params, cfg: CLIPVisionConfig, pixel_values: jax.Array, *, precision: Precision = "highest"
) -> jax.Array:
    """``hidden_states[-2]``, what Wan's image-to-video pipeline conditions on: only the first
    ``num_hidden_layers - 1`` layers run."""
    return forward(params, cfg, pixel_values, layers=cfg.num_hidden_layers - 1, precision=precision)


# ----------------------------------------------------------------------------------------------
# Loading and image encoding


class CLIPVisionEncoder:
    """A loaded CLIP vision encoder, with the image processor of its model when there is one.

    ``encode(pixel_values)`` equals ``image_encoder(pixel_values, output_hidden_states=True)
    .hidden_states[-2]`` (``[B, 1 + grid², hidden_size]`` in the model dtype); ``encode_images(images)``
    preprocesses first, which is diffusers' ``WanImageToVideoPipeline.encode_image``.
    ``precision``: of float32 matmuls (``highest | high | default``; None: this platform's default
    for the text encoder, see :func:`~wanjax.kernels.precision.default_precision`).
    """

    def __init__(
        self,
        cfg: CLIPVisionConfig,
        params: Params,
        processor: ImageProcessor | None = None,
        *,
        precision: str | None = None,
    ):
        self.cfg = cfg
        self.params = params
        self.processor = processor
        self.precision = resolve_precision(precision, "text_encoder")
        self._encode = jax.jit(self.apply, compiler_options=once_per_video() or None)  # once a video

    @property
    def dtype(self) -> jnp.dtype:
        return self.params["class_embedding"].dtype

    def apply(self, params: Params, pixel_values: jax.Array) -> jax.Array:
        """The penultimate hidden states for use inside a caller's ``jit``."""
        return penultimate_hidden_states(params, self.cfg, pixel_values, precision=self.precision)

    def encode(self, pixel_values: np.ndarray | jax.Array) -> jax.Array:
        """``hidden_states[-2]`` of ``(B, num_channels, image_size, image_size)`` pixel values."""
        cfg = self.cfg
        if not isinstance(pixel_values, jax.Array):
            pixel_values = np.asarray(pixel_values)
        expected = (cfg.num_channels, cfg.image_size, cfg.image_size)
        if pixel_values.ndim != 4 or tuple(pixel_values.shape[1:]) != expected:
            raise WanjaxError(
                f"pixel values of shape {tuple(pixel_values.shape)}; the image encoder takes (B, {', '.join(map(str, expected))})"
            )
        return self._encode(self.params, jnp.asarray(pixel_values))

    __call__ = encode

    def lower(self, images: int) -> jax.stages.Lowered:
        """The program :meth:`encode` runs for ``images`` images, lowered from abstract inputs."""
        cfg = self.cfg
        pixels = jax.ShapeDtypeStruct((images, cfg.num_channels, cfg.image_size, cfg.image_size), jnp.float32)
        return self._encode.lower(self.params, pixels)

    def to_host(self, block: bool = True) -> None:
        """Move the weights to pinned host memory (same devices and partitioning); with ``block``,
        return once the device copies are free."""
        self.params = move(self.params, HOST, block=block)

    def to_device(self, block: bool = False) -> None:
        """Move the weights back to device memory (asynchronous unless ``block``)."""
        self.params = move(self.params, DEVICE, block=block)

    def encode_images(self, images: ImageInput | list[ImageInput]) -> jax.Array:
        """``encode(processor(images))``: an image, a file path, or a list of them."""
        if self.processor is None:
            raise WanjaxError("this image encoder has no image processor; preprocess and use encode")
        return self.encode(self.processor(images))


def load_image_encoder(
    path: str | Path,
    dtype: str | jnp.dtype = "bfloat16",
    *,
    sharding: ShardingFn | None = None,
    precision: str | None = None,
    weights_dtype: str = "bf16",
    processor: str | Path | ImageProcessor | None = None,
    config: CLIPVisionConfig | None = None,
) -> CLIPVisionEncoder:
    """Load ``image_encoder/`` from a diffusers-layout Wan image-to-video model.

    ``path`` is the model root or the ``image_encoder`` folder. ``processor``: the image processor (or
    its folder); by default ``image_processor/`` next to the encoder when it exists, else none.
    (diffusers' Wan example loads this encoder in ``float32``; ``bfloat16`` halves its memory.)
    ``weights_dtype`` ``int8``/``fp8``: the linear kernels in 8 bits (:mod:`wanjax.io.quant`).
    ``path`` may also be one weights file of any layout ``config`` describes.
    """
    directory = IMAGE_ENCODER.location(path)
    if processor is None:
        beside = directory.parent / "image_processor"
        processor = beside if (beside / "preprocessor_config.json").is_file() else None
    if processor is not None and not isinstance(processor, ImageProcessor):
        processor = load_image_processor(processor)
    cfg, params = IMAGE_ENCODER.load(path, parse_dtype(dtype), sharding, weights_dtype, config)
    return CLIPVisionEncoder(cfg, params, processor, precision=precision)
