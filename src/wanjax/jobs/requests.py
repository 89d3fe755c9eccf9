"""What a job is asked to do: typed requests (``generate``, ``encode``, ``denoise``, ``decode``).

Every default of a job lives here. A request field is named as its flag
(``--num_inference_steps`` -> ``num_inference_steps``); flags jobs share sit in groups
(:class:`VideoFlags`, :class:`SamplingFlags`, ...). ``None`` means "not given": the value then comes
from an earlier stage, the ``--init_latents`` shape, the checkpoint, or the model's defaults
(``WanPipeline.defaults``: the model registry's, :mod:`wanjax.models.registry`). Whoever builds a
request (the command line from its flags, the server from a request body) checks its values
(:meth:`Request.check`), so a job never sees a bad one.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, ClassVar

from wanjax.errors import ConfigError, WanjaxError

DEFAULT_MODEL = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
DEFAULT_DTYPE = "bfloat16"
STAGE_DIR = "stage_outputs"
OUTPUT_SUFFIXES = {
    "output_video": ".mp4",
    "frames_out": ".npy",
    "preview": ".png",
    "cache_calibrate": ".json",
}


# ----------------------------------------------------------------------------------------------
# Flag groups


@dataclasses.dataclass(frozen=True)
class CommonFlags:
    """Every pipeline command: the model (and its hub revision, downloaded when asked), the
    compilation cache, the metrics file."""

    model: str | None = None
    revision: str | None = None
    download: bool = False
    jax_cache_dir: str | None = None
    metrics_json: str | None = None


@dataclasses.dataclass(frozen=True)
class ParallelFlags:
    """Devices and processes: ``--mesh`` or the reference's aliases; multi-process set-up."""

    mesh: str | None = None
    use_dp: bool = False
    sp_num: int | None = None
    use_fsdp: bool = False
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None


@dataclasses.dataclass(frozen=True)
class PromptFlags:
    """The text: prompts (a batch), or a file of them (one is required), and the negative prompt
    (a text, or a name of :data:`wanjax.pipeline.prompts.NAMED_NEGATIVE_PROMPTS`)."""

    prompt: tuple[str, ...] = ()
    prompt_file: str | None = None
    negative_prompt: str | None = None
    max_sequence_length: int = 512


@dataclasses.dataclass(frozen=True)
class VideoFlags:
    """The video's size and frame rate (``None``: see the module docstring)."""

    height: int | None = None
    width: int | None = None
    frames: int | None = None
    fps: float | None = None


@dataclasses.dataclass(frozen=True)
class ImageFlags:
    """An image-to-video model's first frame (and a first-last-frame model's last frame): image files."""

    image: str | None = None
    last_image: str | None = None


@dataclasses.dataclass(frozen=True)
class SamplingFlags:
    """Denoising: steps, guidance, seed, flow shift, or given starting latents."""

    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    guidance_scale_2: float | None = None
    boundary_ratio: float | None = None
    seed: int | None = None
    scheduler: str | None = None
    flow_shift: float | None = None
    init_latents: str | None = None


@dataclasses.dataclass(frozen=True)
class AttentionFlags:
    """The attention backend and its kernel options."""

    attention: str = "auto"
    use_custom_attention: bool = False
    bqsize: int | None = None
    bkvsize: int | None = None
    bkvcomputesize: int | None = None
    bkvcomputeinsize: int | None = None
    use_k_smooth: bool = False
    window_size: int | None = None

    @property
    def backend(self) -> str:
        """``--attention``, or ``splash_exp2`` under its alias ``--use_custom_attention``."""
        return "splash_exp2" if self.use_custom_attention else self.attention

    def blocks(self) -> dict[str, int]:
        """The kernel block sizes given, by flag name."""
        sizes = {
            "bqsize": self.bqsize,
            "bkvsize": self.bkvsize,
            "bkvcomputesize": self.bkvcomputesize,
            "bkvcomputeinsize": self.bkvcomputeinsize,
        }
        return {name: value for name, value in sizes.items() if value is not None}


@dataclasses.dataclass(frozen=True)
class MemoryFlags:
    """Where weights wait between uses, and how the matmul kernels are stored."""

    offload: str = "none"
    weights_dtype: str = "bf16"


@dataclasses.dataclass(frozen=True)
class LoraFlags:
    """LoRA adapters merged into the transformer, ``--lora PATH[:WEIGHT]``, and into a two-expert
    model's low-noise expert, ``--lora_2 PATH[:WEIGHT]``; both repeatable."""

    lora: tuple[str, ...] = ()
    lora_2: tuple[str, ...] = ()

    def loras(self) -> list[tuple[str, float]]:
        """``(path, weight)`` of each ``--lora`` (weight 1.0 when not given); ConfigError for a bad weight."""
        return [parse_lora(value) for value in self.lora]

    def loras_2(self) -> list[tuple[str, float]]:
        """``(path, weight)`` of each ``--lora_2``, as :meth:`loras`."""
        return [parse_lora(value, "--lora_2") for value in self.lora_2]


def parse_lora(value: str, flag: str = "--lora") -> tuple[str, float]:
    """``PATH[:WEIGHT]`` -> ``(PATH, WEIGHT)``: the text after the last ``:`` is the weight when it is a
    number (a path may itself hold colons)."""
    path, sep, tail = value.rpartition(":")
    if not sep or not path:
        return value, 1.0
    try:
        weight = float(tail)
    except ValueError:
        return value, 1.0
    if not math.isfinite(weight):
        raise ConfigError(f"{flag} {value}: the weight must be a finite number")
    return path, weight


@dataclasses.dataclass(frozen=True)
class CacheFlags:
    """The step cache (:mod:`wanjax.pipeline.step_cache`): policy and settings, MagCache's curve,
    and calibration's output file."""

    cache: str = "off"
    cache_threshold: float | None = None
    cache_max_skip: int | None = None
    cache_retention: float | None = None
    mag_ratios: str | None = None
    cache_calibrate: str | None = None

    def config(self) -> Any:
        """The :class:`~wanjax.pipeline.step_cache.CacheConfig` (ConfigError naming a bad value);
        ``--cache_calibrate`` runs MagCache's calibration."""
        from wanjax.pipeline.step_cache import CacheConfig

        if self.cache_calibrate is not None and self.cache not in ("off", "magcache"):
            raise ConfigError(
                f"--cache_calibrate measures MagCache's ratios; it cannot run with --cache {self.cache}"
            )
        policy = "magcache" if self.cache_calibrate is not None else self.cache
        return CacheConfig(
            policy,
            threshold=self.cache_threshold,
            max_skip_steps=self.cache_max_skip,
            retention_ratio=self.cache_retention,
            mag_ratios=self.mag_ratios,
            calibrate=self.cache_calibrate is not None,
        )


@dataclasses.dataclass(frozen=True)
class VaeFlags:
    """The VAE's dtypes, decode chunk and tiling."""

    vae_dtype: str = "float32"
    vae_weights_dtype: str | None = None
    vae_precision: str | None = None
    vae_decode_chunk: str = "1"
    vae_tiling: str | None = None


@dataclasses.dataclass(frozen=True)
class OutputFlags:
    """The files a decoding command writes (``output_video`` is resolved by the command)."""

    output_video: str | None = None
    frames_out: str | None = None
    preview: str | None = None


# ----------------------------------------------------------------------------------------------
# Requests


class Request:
    """Base of the requests: fields named as flags, checked once, recorded as flags."""

    command: ClassVar[str]

    def check(self) -> None:
        """The values are valid (WanjaxError naming the flag otherwise): :func:`check_flags`."""
        check_flags(self)

    def flags(self) -> dict[str, Any]:
        """Every flag value by flag name (the groups' fields merged)."""
        return _flags(self)

    def arguments(self) -> dict[str, Any]:
        """The command and its flags as JSON values, keys sorted: what a run records."""
        recorded = {"command": self.command, **self.flags()}
        return {key: _json_value(recorded[key]) for key in sorted(recorded)}


@dataclasses.dataclass(frozen=True)
class GenerateRequest(Request):
    """``wanjax generate``: prompt to mp4 in one run."""

    command: ClassVar[str] = "generate"
    common: CommonFlags = dataclasses.field(default_factory=CommonFlags)
    dtype: str | None = None
    precision: str | None = None
    text: PromptFlags = dataclasses.field(default_factory=PromptFlags)
    images: ImageFlags = dataclasses.field(default_factory=ImageFlags)
    video: VideoFlags = dataclasses.field(default_factory=VideoFlags)
    sampling: SamplingFlags = dataclasses.field(default_factory=SamplingFlags)
    attention: AttentionFlags = dataclasses.field(default_factory=AttentionFlags)
    vae: VaeFlags = dataclasses.field(default_factory=VaeFlags)
    outputs: OutputFlags = dataclasses.field(default_factory=OutputFlags)
    adapters: LoraFlags = dataclasses.field(default_factory=LoraFlags)
    cache: CacheFlags = dataclasses.field(default_factory=CacheFlags)
    memory: MemoryFlags = dataclasses.field(default_factory=MemoryFlags)
    parallel: ParallelFlags = dataclasses.field(default_factory=ParallelFlags)


@dataclasses.dataclass(frozen=True)
class EncodeRequest(Request):
    """``wanjax encode``: prompts to the stage directory's embeddings."""

    command: ClassVar[str] = "encode"
    common: CommonFlags = dataclasses.field(default_factory=CommonFlags)
    dtype: str | None = None
    precision: str | None = None
    text: PromptFlags = dataclasses.field(default_factory=PromptFlags)
    images: ImageFlags = dataclasses.field(default_factory=ImageFlags)
    video: VideoFlags = dataclasses.field(default_factory=VideoFlags)
    vae: VaeFlags = dataclasses.field(default_factory=VaeFlags)
    output_dir: str = STAGE_DIR
    memory: MemoryFlags = dataclasses.field(default_factory=MemoryFlags)
    parallel: ParallelFlags = dataclasses.field(default_factory=ParallelFlags)


@dataclasses.dataclass(frozen=True)
class DenoiseRequest(Request):
    """``wanjax denoise``: the stage directory's embeddings to its latents."""

    command: ClassVar[str] = "denoise"
    common: CommonFlags = dataclasses.field(default_factory=CommonFlags)
    dtype: str | None = None
    precision: str | None = None
    video: VideoFlags = dataclasses.field(default_factory=VideoFlags)
    sampling: SamplingFlags = dataclasses.field(default_factory=SamplingFlags)
    attention: AttentionFlags = dataclasses.field(default_factory=AttentionFlags)
    input_dir: str = STAGE_DIR
    adapters: LoraFlags = dataclasses.field(default_factory=LoraFlags)
    cache: CacheFlags = dataclasses.field(default_factory=CacheFlags)
    memory: MemoryFlags = dataclasses.field(default_factory=MemoryFlags)
    parallel: ParallelFlags = dataclasses.field(default_factory=ParallelFlags)


@dataclasses.dataclass(frozen=True)
class DecodeRequest(Request):
    """``wanjax decode``: the stage directory's latents to mp4."""

    command: ClassVar[str] = "decode"
    common: CommonFlags = dataclasses.field(default_factory=CommonFlags)
    video: VideoFlags = dataclasses.field(default_factory=VideoFlags)
    vae: VaeFlags = dataclasses.field(default_factory=VaeFlags)
    outputs: OutputFlags = dataclasses.field(default_factory=OutputFlags)
    input_dir: str = STAGE_DIR
    parallel: ParallelFlags = dataclasses.field(default_factory=ParallelFlags)


PipelineRequest = GenerateRequest | EncodeRequest | DenoiseRequest | DecodeRequest


def _flags(group: Any) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for field in dataclasses.fields(group):
        value = getattr(group, field.name)
        values.update(_flags(value) if dataclasses.is_dataclass(value) else {field.name: value})
    return values


def _json_value(value: Any) -> Any:
    if isinstance(value, tuple):
        value = list(value)
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value


# ----------------------------------------------------------------------------------------------
# Checks


def check_flags(request: Request) -> None:
    """Value checks of the flags a request has: output file names, numbers, dtypes, VAE options."""
    flags = request.flags()
    _check_prompts(flags)
    _check_output_names(flags)
    _check_numbers(flags)
    _check_dtypes(flags)
    _check_precisions(flags)
    _check_vae_options(flags)
    _check_cache(request)
    for name in ("lora", "lora_2"):
        for value in flags.get(name, ()):
            parse_lora(value, f"--{name}")


def _check_cache(request: Request) -> None:
    """The step-cache flags make a valid policy, and a given ``--mag_ratios`` reads."""
    flags = getattr(request, "cache", None)
    if flags is None:
        return
    from wanjax.pipeline.step_cache import read_mag_ratios

    try:
        config = flags.config()
        if config.mag_ratios is not None:
            read_mag_ratios(config.mag_ratios)
    except ConfigError as e:
        raise ConfigError(f"--cache {flags.cache}: {e}") from None


def _check_prompts(flags: dict[str, Any]) -> None:
    """A command that encodes text is given exactly one of ``--prompt`` and ``--prompt_file``."""
    if "prompt" not in flags:
        return
    if not flags["prompt"] and not flags["prompt_file"]:
        raise WanjaxError('no prompt: give --prompt "what the video shows" (or --prompt_file FILE)')
    if flags["prompt"] and flags["prompt_file"]:
        raise WanjaxError("--prompt and --prompt_file both given; give one of them")
    if flags.get("last_image") and not flags.get("image"):
        raise WanjaxError("--last_image needs --image (the first frame) too")


def _check_output_names(flags: dict[str, Any]) -> None:
    for key, suffix in OUTPUT_SUFFIXES.items():
        value = flags.get(key)
        if value and Path(value).suffix.lower() != suffix:
            raise WanjaxError(f"--{key} {value} must end in {suffix}")


def _check_numbers(flags: dict[str, Any]) -> None:
    steps = flags.get("num_inference_steps")
    if steps is not None and steps < 1:
        raise WanjaxError(f"--num_inference_steps must be at least 1, got {steps}")
    guidance = flags.get("guidance_scale")
    if guidance is not None and not (math.isfinite(guidance) and guidance >= 0):
        raise WanjaxError(
            f"--guidance_scale must be >= 0 (5.0 is the default; <= 1 turns CFG off), got {guidance}"
        )
    guidance_2 = flags.get("guidance_scale_2")
    if guidance_2 is not None and not (math.isfinite(guidance_2) and guidance_2 >= 0):
        raise WanjaxError(f"--guidance_scale_2 must be >= 0 (default: --guidance_scale), got {guidance_2}")
    boundary = flags.get("boundary_ratio")
    if boundary is not None and not 0 < boundary < 1:
        raise WanjaxError(
            f"--boundary_ratio must be between 0 and 1 (0.875 for Wan2.2-T2V-A14B), got {boundary}"
        )
    shift = flags.get("flow_shift")
    if shift is not None and not (math.isfinite(shift) and shift > 0):
        raise WanjaxError(f"--flow_shift must be positive (3.0 for 480p, 5.0 for 720p), got {shift}")
    fps = flags.get("fps")
    if fps is not None and not (math.isfinite(fps) and fps > 0):
        raise WanjaxError(f"--fps must be positive (e.g. 16), got {fps}")
    length = flags.get("max_sequence_length")
    if length is not None and length < 1:
        raise WanjaxError(f"--max_sequence_length must be at least 1 (512 as trained), got {length}")
    for name in ("height", "width", "frames"):
        value = flags.get(name)
        if value is not None and value < 1:
            raise WanjaxError(f"--{name} must be positive, got {value}")
    seed = flags.get("seed")
    if seed is not None and not 0 <= seed < 2**63:
        raise WanjaxError(f"--seed must be a non-negative integer, got {seed}")


def _check_dtypes(flags: dict[str, Any]) -> None:
    from wanjax.models.config import parse_dtype

    for name in ("dtype", "vae_dtype", "vae_weights_dtype"):
        if flags.get(name) is not None:
            try:
                parse_dtype(flags[name])
            except ConfigError as e:
                raise ConfigError(f"--{name}: {e}") from None


def _check_precisions(flags: dict[str, Any]) -> None:
    from wanjax.kernels.precision import parse_precision

    for name in ("precision", "vae_precision"):
        if flags.get(name) is not None:
            try:
                parse_precision(flags[name])
            except ConfigError as e:
                raise ConfigError(f"--{name}: {e}") from None


def _check_vae_options(flags: dict[str, Any]) -> None:
    from wanjax.models.vae import Tiling, parse_chunk

    if flags.get("vae_decode_chunk") is not None:
        parse_chunk(flags["vae_decode_chunk"], "--vae_decode_chunk")
    if flags.get("vae_tiling") is not None:
        try:
            Tiling.parse(flags["vae_tiling"])
        except ConfigError as e:
            raise ConfigError(f"--vae_tiling: {e}") from None
