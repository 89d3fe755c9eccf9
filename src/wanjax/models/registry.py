"""The model registry: one entry per Wan variant, the one place a variant's numbers live.

An entry (:class:`Variant`) holds the component configs of the released checkpoint (so ``plan`` and
``bench`` work without weights), its experts and their boundary, whether it expands timesteps (Wan
2.2 TI2V), its hub repository, its MagCache curves and the video and sampling defaults every entry
point uses (:class:`Defaults`). A checkpoint on disk is matched to its entry by its transformer's
architecture and expert count (:func:`match`), the hub name breaking ties (Wan 2.1 I2V 480P and 720P
share one architecture); :func:`defaults_for` gives the defaults of any checkpoint, recognised or not.
Real runs still read every dimension from the checkpoint's ``config.json``.

Defaults are diffusers' (``WanPipeline.__call__``: 832x480, 81 frames, 50 steps, guidance 5.0; its Wan
examples: 1280x720 for the 720P checkpoints, 16 fps) and, for TI2V-5B, the authors' (1280x704, 121
frames at 24 fps, the Wan2.2-TI2V-5B-Diffusers model card). The flow shift is always the checkpoint's
``scheduler/scheduler_config.json`` (diffusers' default).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from wanjax.errors import ConfigError
from wanjax.models.clip_vision import CLIPVisionConfig
from wanjax.models.config import TransformerConfig
from wanjax.models.defaults import Defaults
from wanjax.models.umt5 import UMT5Config
from wanjax.models.vae.config import VAEConfig

# ----------------------------------------------------------------------------------------------
# The released checkpoints' components

UMT5_XXL = UMT5Config(vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64)
CLIP_VIT_H_14 = CLIPVisionConfig(
    hidden_size=1280,
    intermediate_size=5120,
    num_hidden_layers=32,
    num_attention_heads=16,
    image_size=224,
    patch_size=14,
    hidden_act="gelu",
)
WAN21_VAE = VAEConfig()
WAN22_VAE = VAEConfig(  # its latent statistics, which change no shape, left neutral
    base_dim=160,
    decoder_base_dim=256,
    z_dim=48,
    is_residual=True,
    patch_size=2,
    in_channels=12,
    out_channels=12,
    scale_factor_spatial=16,
    latents_mean=(0.0,) * 48,
    latents_std=(1.0,) * 48,
)
WAN21_1_3B = TransformerConfig(num_attention_heads=12, ffn_dim=8960, num_layers=30)
WAN21_14B = TransformerConfig(num_attention_heads=40, ffn_dim=13824, num_layers=40)
WAN21_I2V_14B = dataclasses.replace(WAN21_14B, in_channels=36, image_dim=1280, added_kv_proj_dim=5120)
# VACE (Wan2.1-VACE-*-diffusers' transformer configs): control blocks after every other layer (1.3B)
# or every fifth (14B), reading 96 channels (two VAE encodings of the control video, the 8x8 mask)
VACE_CHANNELS = 96
WAN21_VACE_1_3B = dataclasses.replace(
    WAN21_1_3B, vace_layers=tuple(range(0, 30, 2)), vace_in_channels=VACE_CHANNELS
)
WAN21_VACE_14B = dataclasses.replace(
    WAN21_14B, vace_layers=tuple(range(0, 40, 5)), vace_in_channels=VACE_CHANNELS
)
# Wan 2.2 Animate 14B (Wan2.2-Animate-14B-Diffusers' transformer config): the I2V 14B's blocks, pose
# latents' patch embedding, a 512x512 face motion encoder, face adapters after every fifth block
WAN22_ANIMATE_14B = dataclasses.replace(
    WAN21_I2V_14B,
    latent_channels=16,
    motion_encoder_size=512,
    motion_style_dim=512,
    motion_dim=20,
    motion_encoder_dim=512,
    face_encoder_hidden_dim=1024,
    face_encoder_num_heads=4,
    inject_face_latents_blocks=5,
    motion_encoder_batch_size=8,
)
WAN22_5B = TransformerConfig(
    num_attention_heads=24, ffn_dim=14336, num_layers=30, in_channels=48, out_channels=48
)
# The smallest architecture: tests and benchmarks only, not a variant.
TINY = TransformerConfig(
    num_attention_heads=2, attention_head_dim=12, text_dim=32, freq_dim=16, ffn_dim=32, num_layers=2
)

# ----------------------------------------------------------------------------------------------
# The built-in smoke models' components (their text encoder is sized to the demo's vocabulary)

DEMO_TRANSFORMER = TransformerConfig(
    num_attention_heads=4,
    attention_head_dim=32,
    text_dim=64,
    freq_dim=64,
    ffn_dim=256,
    num_layers=4,
    rope_max_seq_len=1024,
    metadata={"_class_name": "WanTransformer3DModel"},
)
DEMO_IMAGE_ENCODER = dataclasses.replace(  # CLIP ViT-H/14, small
    CLIP_VIT_H_14,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    image_size=28,
)
DEMO_VAE = VAEConfig(
    base_dim=8,
    z_dim=16,
    dim_mult=(1, 2, 4, 4),
    num_res_blocks=1,
    temperal_downsample=(False, True, True),
    metadata={"_class_name": "AutoencoderKLWan"},
)
DEMO_VAE22 = VAEConfig(  # the Wan 2.2 VAE's layout (residual blocks, 2x2 patches), narrow
    base_dim=8,
    decoder_base_dim=12,
    z_dim=16,
    dim_mult=(1, 2, 4, 4),
    num_res_blocks=1,
    temperal_downsample=(False, True, True),
    is_residual=True,
    patch_size=2,
    in_channels=12,
    out_channels=12,
    scale_factor_spatial=16,
    metadata={"_class_name": "AutoencoderKLWan"},
)
_DEMO_CONDITIONED = DEMO_TRANSFORMER.out_channels + 4 + DEMO_VAE.z_dim  # noise, mask, image latents


# ----------------------------------------------------------------------------------------------
# Entries


HD = Defaults(height=720, width=1280)
DMD_PIPELINE_CLASS = "WanDMDPipeline"  # FastVideo's pipeline class in a FastWan checkpoint's model_index.json
FASTWAN = dict(num_inference_steps=3, guidance_scale=1.0, scheduler="dmd")  # DmdDenoisingStage: no CFG
DEMO_DEFAULTS = Defaults(height=128, width=192, frames=17, num_inference_steps=10, segment_frame_length=9)


@dataclasses.dataclass(frozen=True)
class Variant:
    """One Wan variant: its components, experts, conditioning, defaults, MagCache curves and TeaCache
    coefficients."""

    name: str  # what ``plan --model``, ``bench --arch`` and ``--model`` (demo) call it
    title: str
    transformer: TransformerConfig
    vae: VAEConfig
    text_encoder: UMT5Config | None = UMT5_XXL  # None: the demo generator sizes it to its vocabulary
    image_encoder: CLIPVisionConfig | None = None
    boundary_ratio: float | None = None  # two experts (model_index.json's): the switch
    expand_timesteps: bool = False  # Wan 2.2 TI2V: an optional first frame, a timestep per frame
    repo: str | None = None  # the Hugging Face repository of the diffusers-layout checkpoint
    defaults: Defaults = Defaults()
    mag_ratios: str | None = None  # the MagCache curve (sampling/cache/mag_ratios.json), text only
    mag_ratios_image: str | None = None  # ... with an image as its first frame (TI2V)
    teacache: str | None = None  # the TeaCache coefficients (sampling/cache/teacache.json)
    demo: bool = False  # a built-in smoke model (random weights)

    @property
    def experts(self) -> int:
        return 1 if self.boundary_ratio is None else 2

    @property
    def dmd(self) -> bool:
        """A FastWan model (its checkpoint a ``WanDMDPipeline``), run by FastWan's DMD sampler."""
        return self.defaults.scheduler == "dmd"

    @property
    def image(self) -> bool:
        """The VAE encodes an image's conditioning in the encode stage (image to video, TI2V)."""
        return self.transformer.image_to_video or self.expand_timesteps

    @property
    def pipeline_class(self) -> str:
        """diffusers' pipeline class, as ``model_index.json`` names it."""
        if self.transformer.vace:
            return "WanVACEPipeline"
        if self.transformer.animate:
            return "WanAnimatePipeline"
        if self.dmd:
            return DMD_PIPELINE_CLASS
        i2v = self.transformer.image_to_video and not self.expand_timesteps
        return "WanImageToVideoPipeline" if i2v else "WanPipeline"

    @property
    def transformer_class(self) -> str:
        """diffusers' transformer class, as the transformer's ``config.json`` and ``model_index.json`` name it."""
        if self.transformer.animate:
            return "WanAnimateTransformer3DModel"
        return "WanVACETransformer3DModel" if self.transformer.vace else "WanTransformer3DModel"

    def mag_curve(self, first_frame: bool = False) -> str | None:
        """The published MagCache curve of this variant (with an image as first frame, for TI2V)."""
        return self.mag_ratios_image if first_frame and self.expand_timesteps else self.mag_ratios


def _i2v_demo(**fields) -> TransformerConfig:
    return dataclasses.replace(DEMO_TRANSFORMER, in_channels=_DEMO_CONDITIONED, **fields)


VARIANTS: tuple[Variant, ...] = (
    Variant(
        "1.3B",
        "Wan 2.1 T2V 1.3B",
        WAN21_1_3B,
        WAN21_VAE,
        repo="Wan-AI/Wan2.1-T2V-1.3B-Diffusers",
        mag_ratios="wan2.1-t2v-1.3b",
        teacache="wan2.1-t2v-1.3b",
    ),
    Variant(
        "14B",
        "Wan 2.1 T2V 14B",
        WAN21_14B,
        WAN21_VAE,
        repo="Wan-AI/Wan2.1-T2V-14B-Diffusers",
        mag_ratios="wan2.1-t2v-14b",
        teacache="wan2.1-t2v-14b",
    ),
    Variant(
        "I2V-14B",
        "Wan 2.1 I2V 14B 480P",
        WAN21_I2V_14B,
        WAN21_VAE,
        image_encoder=CLIP_VIT_H_14,
        repo="Wan-AI/Wan2.1-I2V-14B-480P-Diffusers",
    ),
    Variant(
        "I2V-14B-720P",
        "Wan 2.1 I2V 14B 720P",
        WAN21_I2V_14B,
        WAN21_VAE,
        image_encoder=CLIP_VIT_H_14,
        repo="Wan-AI/Wan2.1-I2V-14B-720P-Diffusers",
        defaults=HD,
    ),
    Variant(
        "FLF2V-14B",
        "Wan 2.1 FLF2V 14B 720P (first and last frame)",
        dataclasses.replace(WAN21_I2V_14B, pos_embed_seq_len=2 * CLIP_VIT_H_14.num_positions),
        WAN21_VAE,
        image_encoder=CLIP_VIT_H_14,
        repo="Wan-AI/Wan2.1-FLF2V-14B-720P-diffusers",
        defaults=HD,
    ),
    Variant(
        "A14B",
        "Wan 2.2 T2V A14B (two experts)",
        WAN21_14B,
        WAN21_VAE,
        boundary_ratio=0.875,
        repo="Wan-AI/Wan2.2-T2V-A14B-Diffusers",
        mag_ratios="wan2.2-t2v-a14b",
    ),
    Variant(
        "I2V-A14B",
        "Wan 2.2 I2V A14B (two experts)",
        dataclasses.replace(WAN21_14B, in_channels=36),
        WAN21_VAE,
        boundary_ratio=0.9,
        repo="Wan-AI/Wan2.2-I2V-A14B-Diffusers",
        mag_ratios="wan2.2-i2v-a14b",
    ),
    Variant(
        "5B",
        "Wan 2.2 TI2V 5B (text and image to video)",
        WAN22_5B,
        WAN22_VAE,
        expand_timesteps=True,
        repo="Wan-AI/Wan2.2-TI2V-5B-Diffusers",
        defaults=Defaults(height=704, width=1280, frames=121, fps=24.0),
        mag_ratios="wan2.2-ti2v-5b-t2v",
        mag_ratios_image="wan2.2-ti2v-5b-i2v",
    ),
    # FastWan (FastVideo): DMD-distilled, 3 steps without guidance; defaults from FastVideo's presets
    # (hao-ai-lab/FastVideo @ 2f3d407, fastvideo/pipelines/basic/wan/presets.py L213-229, L253-269).
    # FastVideo runs the 1.3B with its sparse attention (VSA); wanjax runs full attention.
    Variant(
        "FastWan-1.3B",
        "FastWan 2.1 T2V 1.3B (3-step DMD)",
        WAN21_1_3B,
        WAN21_VAE,
        repo="FastVideo/FastWan2.1-T2V-1.3B-Diffusers",
        defaults=Defaults(height=448, width=832, frames=61, **FASTWAN),
    ),
    Variant(
        "FastWan-5B",
        "FastWan 2.2 TI2V 5B (3-step DMD, full attention)",
        WAN22_5B,
        WAN22_VAE,
        expand_timesteps=True,
        repo="FastVideo/FastWan2.2-TI2V-5B-FullAttn-Diffusers",
        defaults=Defaults(height=704, width=1280, frames=121, fps=24.0, **FASTWAN),
    ),
    Variant(
        "VACE-1.3B",
        "Wan 2.1 VACE 1.3B (control video, mask, reference images)",
        WAN21_VACE_1_3B,
        WAN21_VAE,
        repo="Wan-AI/Wan2.1-VACE-1.3B-diffusers",
    ),
    Variant(
        "VACE-14B",
        "Wan 2.1 VACE 14B (control video, mask, reference images)",
        WAN21_VACE_14B,
        WAN21_VAE,
        repo="Wan-AI/Wan2.1-VACE-14B-diffusers",
    ),
    Variant(
        "Animate-14B",
        "Wan 2.2 Animate 14B (a character animated by pose and face videos, or replacing one)",
        WAN22_ANIMATE_14B,
        WAN21_VAE,
        image_encoder=CLIP_VIT_H_14,
        repo="Wan-AI/Wan2.2-Animate-14B-Diffusers",
        # diffusers' WanAnimatePipeline: 1280x720, 20 steps, no guidance, segments of 77 frames
        # (and its example's 30 fps)
        defaults=Defaults(
            height=720, width=1280, frames=77, fps=30.0, num_inference_steps=20, guidance_scale=1.0
        ),
    ),
    Variant(
        "demo",
        "built-in demo, Wan 2.1 T2V",
        DEMO_TRANSFORMER,
        DEMO_VAE,
        None,
        demo=True,
        defaults=DEMO_DEFAULTS,
    ),
    Variant(
        "demo-i2v",
        "built-in demo, Wan 2.1 I2V",
        _i2v_demo(image_dim=DEMO_IMAGE_ENCODER.hidden_size, added_kv_proj_dim=DEMO_TRANSFORMER.inner_dim),
        DEMO_VAE,
        None,
        DEMO_IMAGE_ENCODER,
        demo=True,
        defaults=DEMO_DEFAULTS,
    ),
    Variant(
        "demo-a14b",
        "built-in demo, Wan 2.2 A14B",
        DEMO_TRANSFORMER,
        DEMO_VAE,
        None,
        boundary_ratio=0.875,
        demo=True,
        defaults=DEMO_DEFAULTS,
    ),
    Variant(
        "demo-i2v-a14b",
        "built-in demo, Wan 2.2 I2V A14B",
        _i2v_demo(),
        DEMO_VAE,
        None,
        boundary_ratio=0.9,
        demo=True,
        defaults=DEMO_DEFAULTS,
    ),
    Variant(
        "demo-vace",
        "built-in demo, Wan 2.1 VACE",
        dataclasses.replace(DEMO_TRANSFORMER, vace_layers=(0, 2), vace_in_channels=VACE_CHANNELS),
        DEMO_VAE,
        None,
        demo=True,
        defaults=DEMO_DEFAULTS,
    ),
    Variant(
        "demo-animate",
        "built-in demo, Wan 2.2 Animate",
        _i2v_demo(
            image_dim=DEMO_IMAGE_ENCODER.hidden_size,
            added_kv_proj_dim=DEMO_TRANSFORMER.inner_dim,
            latent_channels=DEMO_VAE.z_dim,
            motion_encoder_channel_sizes=(("16", 16), ("4", 32), ("8", 32)),
            motion_encoder_size=16,
            motion_style_dim=32,
            motion_dim=8,
            motion_encoder_dim=32,
            face_encoder_hidden_dim=32,
            face_encoder_num_heads=2,
            inject_face_latents_blocks=2,
            motion_encoder_batch_size=8,
        ),
        DEMO_VAE,
        None,
        DEMO_IMAGE_ENCODER,
        demo=True,
        defaults=dataclasses.replace(DEMO_DEFAULTS, guidance_scale=1.0),
    ),
    Variant(
        "demo-ti2v",
        "built-in demo, Wan 2.2 TI2V",
        DEMO_TRANSFORMER,
        DEMO_VAE22,
        None,
        expand_timesteps=True,
        demo=True,
        defaults=DEMO_DEFAULTS,
    ),
)


# ----------------------------------------------------------------------------------------------
# Lookups (they read VARIANTS when called, so an entry added there appears everywhere)


def registry() -> dict[str, Variant]:
    """Every variant by name, in the table's order."""
    return {v.name: v for v in VARIANTS}


def released() -> dict[str, Variant]:
    """The variants of released checkpoints (the ``plan`` and ``bench`` presets), by name."""
    return {name: v for name, v in registry().items() if not v.demo}


def variant(name: str) -> Variant:
    """The variant called ``name``; ConfigError naming the known ones otherwise."""
    try:
        return registry()[name]
    except KeyError:
        raise ConfigError(f"unknown model variant {name!r}; choose one of {', '.join(registry())}") from None


def component_configs(folder: str) -> list[tuple[str, Any]]:
    """``(variant names, config)`` of every distinct config the registry holds for a component folder
    (``transformer``, ``transformer_2``, ``vae``, ``text_encoder``, ``image_encoder``), released
    variants first: what a single file of that component is recognised against."""
    field = {"transformer_2": "transformer"}.get(folder, folder)
    names: dict[Any, list[str]] = {}
    for v in sorted(VARIANTS, key=lambda v: v.demo):
        cfg = getattr(v, field, None)
        if cfg is not None and (folder != "transformer_2" or v.experts == 2):
            names.setdefault(cfg, []).append(v.name)
    return [(", ".join(labels), cfg) for cfg, labels in names.items()]


def transformer_preset(name: str, **overrides) -> TransformerConfig:
    """A variant's transformer (or ``tiny``, :data:`TINY`), with optional field overrides."""
    base = TINY if name == "tiny" else variant(name).transformer
    return dataclasses.replace(base, **overrides)


def _architecture(cfg: TransformerConfig) -> tuple:
    """What tells variants apart: widths, depth, channels, patch, image tokens (not eps, RoPE length...)."""
    return (
        cfg.num_attention_heads,
        cfg.attention_head_dim,
        cfg.ffn_dim,
        cfg.num_layers,
        cfg.in_channels,
        cfg.out_channels,
        cfg.text_dim,
        cfg.patch_size,
        cfg.image_dim,
        cfg.first_last_frame,
        cfg.vace_layers,
        cfg.animate,
    )


def _by_name(candidates: list[Variant], name: str) -> Variant | None:
    """The candidate whose repository is named in ``name`` (a hub id or a folder), else the first."""
    lowered = name.lower()
    named = [v for v in candidates if v.repo and v.repo.split("/")[-1].lower() in lowered]
    return (named or candidates or [None])[0]


def _kind(cfg: TransformerConfig, experts: int, expand_timesteps: bool) -> tuple:
    return (
        experts,
        expand_timesteps,
        cfg.image_tokens,
        cfg.first_last_frame,
        cfg.condition_channels > 0,
        cfg.animate,
    )


def match(
    cfg: TransformerConfig,
    experts: int = 1,
    name: str = "",
    *,
    expand_timesteps: bool | None = None,
    demo: bool = False,
    dmd: bool = False,
) -> Variant | None:
    """The variant of this transformer architecture and expert count (and ``expand_timesteps`` unless
    None) among the released ones (``demo``: the demo models; ``dmd``: FastWan's, a ``WanDMDPipeline``
    checkpoint), or None; ``name``, the model's hub id or folder, picks between variants of one
    architecture."""
    arch = _architecture(cfg)
    same = [
        v
        for v in registry().values()
        if v.demo == demo
        and v.dmd == dmd
        and v.experts == experts
        and expand_timesteps in (None, v.expand_timesteps)
        and _architecture(v.transformer) == arch
    ]
    return _by_name(same, name)


def defaults_for(
    cfg: TransformerConfig,
    experts: int = 1,
    expand_timesteps: bool = False,
    name: str = "",
    *,
    demo: bool = False,
    dmd: bool = False,
) -> Defaults:
    """The defaults of a checkpoint: its variant's (:func:`match`), else those of the variants of its
    kind (experts, TI2V, image tokens, first and last frame, conditioning latents; ``name`` picks
    among them), else diffusers' ``WanPipeline`` defaults."""
    found = match(cfg, experts, name, expand_timesteps=expand_timesteps, demo=demo, dmd=dmd)
    if found is None:
        kind = _kind(cfg, experts, expand_timesteps)
        pool = [v for v in registry().values() if v.demo == demo and v.dmd == dmd]
        found = _by_name(
            [v for v in pool if _kind(v.transformer, v.experts, v.expand_timesteps) == kind], name
        )
    if found is None:
        return Defaults(**FASTWAN) if dmd else Defaults()
    return found.defaults
