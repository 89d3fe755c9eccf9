"""What ``wanjax bench`` runs (:class:`BenchConfig`, its flags) and what a stage measures
(:class:`StageResult`)."""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from wanjax.errors import WanjaxError
from wanjax.jobs.cache_flags import CacheFlags
from wanjax.jobs.flags import option
from wanjax.jobs.groups import DEFAULT_DTYPE, AttentionFlags, MemoryFlags, PromptFlags, VaeFlags
from wanjax.models.clip_vision import CLIPVisionConfig
from wanjax.models.config import TransformerConfig
from wanjax.models.registry import Variant, released
from wanjax.models.umt5 import UMT5Config
from wanjax.models.vae.config import VAEConfig
from wanjax.sampling.cache.step_cache import CacheConfig
from wanjax.tools.flops import (
    Flops,
    achieved,
)

BENCH_VOCAB = 32_128
STAGE_NAMES = ("encode", "image", "denoise", "decode")  # the pipeline's stages, in order
RANDOM_WEIGHTS = ("auto", "numpy", "device")
CPU_DEVICE_DRAW_MIN_PARAMS = 300_000_000  # --random_weights auto on a CPU: jax.random from this size


def _cpu_draw_min() -> dict[str, str]:
    return {"min_params": f"{CPU_DEVICE_DRAW_MIN_PARAMS // 10**6}M"}


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """What to run (the ``wanjax bench`` flags); the defaults are the issue's quick CPU run."""

    arch: str = option(
        "1.3B", choices=lambda: tuple(released()), help="a registry variant (default {default})"
    )
    layers: int | None = option(help="DiT/UMT5/CLIP layers, at least 1 (default: all)")
    height: int = option(240, help="pixels, multiple of 16 (default {default})")
    width: int = option(416, help="pixels, multiple of 16 (default {default})")
    frames: int = option(17, help="4n+1 frames (default {default})")
    num_inference_steps: int = option(
        2, help="denoising steps per timed run, and in the pipeline line (default {default})"
    )
    guidance_scale: float = option(
        5.0, help="classifier-free guidance; > 1 batches the CFG pair (default {default})"
    )
    dtype: str = option(DEFAULT_DTYPE, help="DiT / UMT5 dtype (default {default})")
    vae_dtype: str = option(VaeFlags.vae_dtype, help="VAE dtype (default {default})")
    max_sequence_length: int = option(
        PromptFlags.max_sequence_length, help="text tokens of the encoded prompt (default {default})"
    )
    repeats: int = option(2, help="timed runs per stage after the warm-up (default {default})")
    stages: tuple[str, ...] = option(
        STAGE_NAMES,
        choices=STAGE_NAMES,
        help="stages to time (default: {default}; image: image-to-video archs only)",
    )
    random_weights: str = option(
        "auto",
        choices=RANDOM_WEIGHTS,
        help="draw the random weights with numpy (host, then copied) or on the device (jax.random, "
        "straight into place); auto: on the device, except models under {min_params} weights on a CPU "
        "(default {default})",
        values=_cpu_draw_min,
    )
    memory: MemoryFlags = dataclasses.field(default_factory=MemoryFlags)
    cache: CacheFlags = dataclasses.field(default_factory=CacheFlags)
    attention: AttentionFlags = dataclasses.field(default_factory=AttentionFlags)

    def cache_config(self) -> CacheConfig:
        """The step cache the denoise stage runs with (bench times steps: nothing calibrates)."""
        if self.cache.cache_calibrate is not None:
            raise WanjaxError(
                "bench times steps and writes no curve: calibrate with wanjax generate --cache_calibrate"
            )
        return self.cache.config()

    @property
    def variant(self) -> Variant:
        """The architecture's registry entry (:func:`wanjax.models.registry.released`)."""
        return released()[self.arch]

    @property
    def vae(self) -> VAEConfig:
        """The architecture's VAE (the Wan 2.2 VAE's shapes for TI2V-5B)."""
        return self.variant.vae

    def text_config(self) -> UMT5Config:
        """The text encoder drawn: ``--layers`` of its layers (at most all), a small vocabulary."""
        text = self.variant.text_encoder
        layers = min(self.layers or text.num_layers, text.num_layers)
        return dataclasses.replace(text, num_layers=layers, vocab_size=BENCH_VOCAB)

    def image_encoder_config(self) -> CLIPVisionConfig | None:
        """The CLIP encoder drawn (``--layers`` of its layers, at most all); None: the model has none."""
        clip = self.variant.image_encoder
        if clip is None:
            return None
        layers = min(self.layers or clip.num_hidden_layers, clip.num_hidden_layers)
        return dataclasses.replace(clip, num_hidden_layers=layers)

    def transformer_config(self) -> TransformerConfig:
        """The DiT drawn: ``--layers`` blocks (default all; a VACE model keeps the control blocks of
        those layers)."""
        base = self.variant.transformer
        layers = self.layers or base.num_layers
        if base.vace_layers is None:
            return dataclasses.replace(base, num_layers=layers)
        vace = tuple(i for i in base.vace_layers if i < layers)
        return dataclasses.replace(base, num_layers=layers, vace_layers=vace)

    def latent_shape(self) -> tuple[int, int, int, int, int]:
        f = self.vae.spatial_factor
        if self.height % (2 * f) or self.width % (2 * f) or (self.frames - 1) % 4:
            raise WanjaxError(
                f"{self.width}x{self.height}, {self.frames} frames: width and height must be multiples of "
                f"{2 * f} and frames 4n+1"
            )
        return (1, self.vae.z_dim, (self.frames - 1) // 4 + 1, self.height // f, self.width // f)


# StageResult's optional fields the summary writes as they are, when set: (field, JSON key), in key order.
_SUMMARY_KEYS: tuple[tuple[str, str], ...] = (
    ("weights_bytes", "weights_bytes"),
    ("text_kv", "text_kv"),
    ("to_device_s", "weights_to_device_s"),
    ("effective_step_s", "s_per_step_effective"),
    ("cache", "cache"),
    ("tflop_known", "tflop_clip"),
    ("expert_steps", "expert_steps"),
    ("sparse", "sparse_attention"),
)


@dataclasses.dataclass
class StageResult:
    """Timings of one stage: warm-up (compile + first run) and steady runs, in seconds."""

    warmup: float
    steady: list[float]
    flops: Flops | None = None
    per_step: list[float] | None = None  # denoise: the steady steps
    executed_flops: Flops | None = None  # decode: what wanjax's formulation computes, if not ``flops``
    program_memory: dict[str, int] | None = None  # memory_analysis() of the stage's compiled program
    allocator_peak_bytes: int | None = None  # the device allocator's peak so far, after the stage
    weights: tuple[str, float] | None = None  # how the random weights were drawn, and the seconds it took
    weights_bytes: dict[str, int] | None = None  # the weights' bytes in device and in host memory
    to_device_s: float | None = None  # offload model/blocks: the weights' move back to the device
    cache: dict[str, Any] | None = None  # denoise with a step cache: what it skipped (CacheReport JSON)
    effective_step_s: float | None = None  # denoise: a whole loop's seconds / its steps (median loop)
    tflop_known: float | None = None  # image: the CLIP encoder's TFLOP (the VAE encode's not counted)
    expert_steps: list[int] | None = None  # denoise, two experts: which one ran each step
    text_kv: dict[str, Any] | None = None  # denoise: the text K/V cache (the TFLOP each step saves, bytes)
    sparse: dict[str, Any] | None = None  # denoise, radial attention: its density, sparse steps and TFLOP

    def summary(self) -> dict[str, Any]:
        med = statistics.median(self.steady) if self.steady else float("nan")
        out: dict[str, Any] = {
            "warmup_s": self.warmup,
            "steady_median_s": med,
            "steady_min_s": min(self.steady, default=float("nan")),
            "steady_max_s": max(self.steady, default=float("nan")),
            "program_memory": self.program_memory,
            "allocator_peak_bytes": self.allocator_peak_bytes,
        }
        if self.weights is not None:
            out["random_weights"], out["random_weights_s"] = self.weights
        for field, key in _SUMMARY_KEYS:
            if (value := getattr(self, field)) is not None:
                out[key] = value
        if self.per_step is not None:
            out["s_per_step_median"] = statistics.median(self.per_step) if self.per_step else float("nan")
            out["s_per_step_spread"] = [min(self.per_step, default=0.0), max(self.per_step, default=0.0)]
        if self.flops is not None:
            seconds = out.get("s_per_step_median", med)
            out["tflop"] = self.flops.total / 1e12
            out["tflop_attention"] = self.flops.attention / 1e12
            if self.cache is None:  # a cached step computes less than a step's FLOPs
                out["achieved_tflops"] = achieved(self.flops, seconds) / 1e12
        if self.executed_flops is not None:
            out["tflop_executed"] = self.executed_flops.total / 1e12
            out["achieved_tflops_executed"] = achieved(self.executed_flops, med) / 1e12
        return out
