"""Model configurations, parsed from a checkpoint's ``config.json``.

Every dimension comes from the checkpoint directory; the released variants' configs are in
:mod:`wanjax.models.registry`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import jax.numpy as jnp

from wanjax.errors import ConfigError

C = TypeVar("C", bound="ComponentConfig")


# Fields every transformers ``PretrainedConfig`` may store that an encoder's forward does not read:
# bookkeeping (the loader's dtype argument decides the precision) and generic output / task options.
TRANSFORMERS_GENERIC_FIELDS: frozenset[str] = frozenset(
    {
        "architectures",
        "dtype",
        "torch_dtype",
        "transformers_version",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "torchscript",
        "use_bfloat16",
        "id2label",
        "label2id",
        "problem_type",
        "finetuning_task",
        "task_specific_params",
        "prefix",
    }
)


@dataclasses.dataclass(frozen=True)
class ComponentConfig:
    """Base for configs read from a diffusers/transformers ``config.json``.

    Fields starting with ``_`` in the file (``_class_name``, ``_diffusers_version``, ...) are kept in
    ``metadata``. Any other field the class does not know is rejected: it may change the architecture,
    and silently ignoring it would produce wrong outputs.
    """

    metadata: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    # Fields that the reference accepts but that do not change the computation.
    _IGNORED_FIELDS: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def from_dict(cls: type[C], raw: dict[str, Any], source: str = "config") -> C:
        # JSON lists become tuples so configs stay hashable (usable as static jit arguments).
        known = {f.name: f for f in dataclasses.fields(cls) if f.name != "metadata"}
        metadata = {k: v for k, v in raw.items() if k.startswith("_")}
        values = {k: v for k, v in raw.items() if not k.startswith("_") and k not in cls._IGNORED_FIELDS}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ConfigError(
                f"{source}: unknown field(s) {', '.join(unknown)} for {cls.__name__}; "
                "this checkpoint may need a newer wanjax"
            )
        converted = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
        cfg = cls(metadata=metadata, **converted)
        cfg.validate(source)
        return cfg

    @classmethod
    def from_file(cls: type[C], path: str | Path) -> C:
        path = Path(path)
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"{path}: config file not found") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        return cls.from_dict(raw, source=str(path))

    def to_dict(self) -> dict[str, Any]:
        """The config as ``config.json`` would hold it (metadata included)."""
        out = dict(self.metadata)
        for f in dataclasses.fields(self):
            if f.name != "metadata":
                value = getattr(self, f.name)
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    def validate(self, source: str) -> None:  # pragma: no cover - overridden
        """Raise ConfigError when the values describe a model wanjax cannot run."""


@dataclasses.dataclass(frozen=True)
class TransformerConfig(ComponentConfig):
    """``transformer/config.json`` of a ``WanTransformer3DModel`` (or, with ``vace_layers``, a
    ``WanVACETransformer3DModel``: control blocks whose outputs are added after those layers)."""

    patch_size: tuple[int, int, int] = (1, 2, 2)
    num_attention_heads: int = 40
    attention_head_dim: int = 128
    in_channels: int = 16
    out_channels: int = 16
    text_dim: int = 4096
    freq_dim: int = 256
    ffn_dim: int = 13824
    num_layers: int = 40
    cross_attn_norm: bool = True
    qk_norm: str | None = "rms_norm_across_heads"
    eps: float = 1e-6
    image_dim: int | None = None
    added_kv_proj_dim: int | None = None
    rope_max_seq_len: int = 1024
    pos_embed_seq_len: int | None = None
    vace_layers: tuple[int, ...] | None = None  # VACE: the layers a control block's hint follows
    vace_in_channels: int | None = None  # VACE: the control latents' channels (96)
    # Wan 2.2 Animate (WanAnimateTransformer3DModel; wanjax.models.animate): a pose patch embedding,
    # a motion encoder of the face frames, a face encoder and a face adapter after every
    # ``inject_face_latents_blocks``-th block. None for the other models.
    latent_channels: int | None = None
    motion_encoder_channel_sizes: tuple[tuple[str, int], ...] | None = None  # None: diffusers' table
    motion_encoder_size: int | None = None
    motion_style_dim: int | None = None
    motion_dim: int | None = None
    motion_encoder_dim: int | None = None
    face_encoder_hidden_dim: int | None = None
    face_encoder_num_heads: int | None = None
    inject_face_latents_blocks: int | None = None
    motion_encoder_batch_size: int | None = None

    def __post_init__(self) -> None:
        sizes = self.motion_encoder_channel_sizes
        if isinstance(sizes, dict):  # as config.json holds it; a tuple of pairs keeps the config hashable
            object.__setattr__(self, "motion_encoder_channel_sizes", tuple(sorted(sizes.items())))

    @property
    def inner_dim(self) -> int:
        return self.num_attention_heads * self.attention_head_dim

    @property
    def patch_volume(self) -> int:
        pt, ph, pw = self.patch_size
        return pt * ph * pw

    @property
    def image_tokens(self) -> bool:
        """Image-encoder tokens (``image_dim`` wide) join the cross-attention (Wan 2.1 I2V, FLF2V)."""
        return self.image_dim is not None

    @property
    def condition_channels(self) -> int:
        """Channels of conditioning latents (mask, image latents) joined to the noisy ones: 20 for the
        image-to-video models that take them (Wan 2.1 I2V, Wan 2.2 I2V-A14B), else 0."""
        return self.in_channels - self.out_channels

    @property
    def image_to_video(self) -> bool:
        """A transformer that needs an image: its encoder's tokens, or conditioning latents."""
        return self.image_tokens or self.condition_channels > 0

    @property
    def vace(self) -> bool:
        """A VACE transformer (Wan2.1-VACE): control latents enter through their own blocks."""
        return self.vace_layers is not None

    def to_dict(self) -> dict[str, Any]:
        """As :meth:`ComponentConfig.to_dict`, without the VACE fields of a model that has none
        (``WanTransformer3DModel`` takes no such field)."""
        out = super().to_dict()
        if not self.vace:
            out.pop("vace_layers"), out.pop("vace_in_channels")
        if not self.animate:
            for name in ANIMATE_FIELDS:
                out.pop(name)
        elif self.motion_encoder_channel_sizes is not None:
            out["motion_encoder_channel_sizes"] = dict(self.motion_encoder_channel_sizes)
        return out

    @property
    def pose_channels(self) -> int:
        """An Animate model's pose latents' channels (diffusers derives them from ``in_channels``)."""
        return self.latent_channels if self.latent_channels is not None else (self.in_channels - 4) // 2

    @property
    def motion_sizes(self) -> tuple[int, ...]:
        """An Animate motion encoder's feature sizes: the face frames' side, halved by each residual
        block down to 4."""
        size = self.motion_encoder_size or 4
        return tuple(2**i for i in range(size.bit_length() - 1, 1, -1))

    @property
    def motion_channels(self) -> dict[str, int]:
        """An Animate motion encoder's channels at each size (its config's table, else diffusers')."""
        sizes = self.motion_encoder_channel_sizes
        return MOTION_ENCODER_CHANNEL_SIZES if sizes is None else dict(sizes)

    @property
    def animate(self) -> bool:
        """A Wan 2.2 Animate transformer: pose latents and face frames enter besides the latents."""
        return self.motion_encoder_size is not None

    @property
    def first_last_frame(self) -> bool:
        """A first-last-frame transformer (FLF2V): the states of two images per video, a position
        embedding over both (``pos_embed_seq_len``)."""
        return self.pos_embed_seq_len is not None

    def validate(self, source: str) -> None:
        if (self.image_dim is None) != (self.added_kv_proj_dim is None):
            raise ConfigError(
                f"{source}: an image-to-video model needs both image_dim and added_kv_proj_dim, got "
                f"{self.image_dim} and {self.added_kv_proj_dim}"
            )
        if self.image_tokens and self.added_kv_proj_dim != self.inner_dim:
            raise ConfigError(
                f"{source}: added_kv_proj_dim {self.added_kv_proj_dim} must equal the inner dim {self.inner_dim} "
                "(the image embedder's output feeds add_k_proj / add_v_proj)"
            )
        if self.pos_embed_seq_len is not None and not self.image_tokens:
            raise ConfigError(f"{source}: pos_embed_seq_len is for image-to-video models (first-last frame)")
        if (self.vace_layers is None) != (self.vace_in_channels is None):
            raise ConfigError(f"{source}: a VACE model needs both vace_layers and vace_in_channels")
        if self.vace_layers is not None:
            layers = list(self.vace_layers)
            if layers != sorted(set(layers)) or not layers or layers[0] != 0 or layers[-1] >= self.num_layers:
                raise ConfigError(
                    f"{source}: vace_layers {layers} must be increasing layers of 0..{self.num_layers - 1} "
                    "starting with 0"
                )
        if self.animate:
            _validate_animate(self, source)
        if len(self.patch_size) != 3:
            raise ConfigError(f"{source}: patch_size must have 3 entries, got {self.patch_size}")
        if self.attention_head_dim % 2:
            raise ConfigError(
                f"{source}: attention_head_dim must be even for RoPE, got {self.attention_head_dim}"
            )
        if self.qk_norm not in (None, "rms_norm_across_heads"):
            # diffusers 0.42 always applies RMSNorm over the full inner dim, whatever this says.
            raise ConfigError(
                f"{source}: qk_norm={self.qk_norm!r} is not supported (only 'rms_norm_across_heads')"
            )


ANIMATE_FIELDS = (
    "latent_channels",
    "motion_encoder_channel_sizes",
    "motion_encoder_size",
    "motion_style_dim",
    "motion_dim",
    "motion_encoder_dim",
    "face_encoder_hidden_dim",
    "face_encoder_num_heads",
    "inject_face_latents_blocks",
    "motion_encoder_batch_size",
)


def _validate_animate(cfg: TransformerConfig, source: str) -> None:
    """An Animate config's fields: all given, the latents' channels ``2 * latent + 4`` (noise,
    then the reference's mask and latents), a face adapter after every ``inject_face_latents_blocks``-th
    block of a whole number of them, image tokens with their own keys and values."""
    missing = [name for name in ANIMATE_FIELDS[2:] if getattr(cfg, name) is None]
    if missing:
        raise ConfigError(f"{source}: an Animate transformer needs {', '.join(missing)}")
    if cfg.in_channels != 2 * cfg.pose_channels + 4:
        raise ConfigError(
            f"{source}: an Animate transformer's in_channels ({cfg.in_channels}) must be "
            f"2 * latent_channels + 4 (latent_channels {cfg.pose_channels})"
        )
    if cfg.num_layers % cfg.inject_face_latents_blocks:  # diffusers indexes past its face adapters
        raise ConfigError(
            f"{source}: num_layers {cfg.num_layers} is not a multiple of inject_face_latents_blocks "
            f"{cfg.inject_face_latents_blocks}"
        )
    if not cfg.image_tokens:
        raise ConfigError(f"{source}: an Animate transformer needs image_dim and added_kv_proj_dim")
    size = cfg.motion_encoder_size
    if size < 4 or size & (size - 1):
        raise ConfigError(f"{source}: motion_encoder_size {size} must be a power of two, at least 4")
    table = cfg.motion_channels
    absent = [str(s) for s in cfg.motion_sizes if str(s) not in table]
    if absent:
        raise ConfigError(f"{source}: motion_encoder_channel_sizes lacks the size(s) {', '.join(absent)}")


# diffusers' WAN_ANIMATE_MOTION_ENCODER_CHANNEL_SIZES: the motion encoder's channels at each size
MOTION_ENCODER_CHANNEL_SIZES = {
    "4": 512, "8": 512, "16": 512, "32": 512, "64": 256, "128": 128, "256": 64, "512": 32, "1024": 16,
}  # fmt: skip


DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def parse_dtype(dtype: str | jnp.dtype) -> jnp.dtype:
    """``"bfloat16"``/``"bf16"``/``jnp.bfloat16``... -> a JAX dtype; ConfigError for anything else."""
    aliases = {"fp32": "float32", "f32": "float32", "bf16": "bfloat16", "fp16": "float16", "f16": "float16"}
    name = aliases.get(dtype.lower(), dtype.lower()) if isinstance(dtype, str) else jnp.dtype(dtype).name
    if name not in DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    return jnp.dtype(DTYPES[name])
