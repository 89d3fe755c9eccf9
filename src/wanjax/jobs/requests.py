"""What a job is asked to do: typed requests (``generate``, ``encode``, ``denoise``, ``decode``).

A request is the schema of its command's flags (:mod:`wanjax.jobs.flags`): each field is the flag of
its name (``--num_inference_steps`` -> ``num_inference_steps``) with its default and help; flags jobs
share sit in groups (:mod:`wanjax.jobs.groups`: :class:`VideoFlags`, :class:`SamplingFlags`, ...),
where ``None`` means "not given". Whoever builds a
request (the command line from its flags, the server from a request body) checks its values
(:meth:`Request.check`), so a job never sees a bad one.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import warnings
from pathlib import Path
from typing import Any, ClassVar

from wanjax.errors import ConfigError, WanjaxError
from wanjax.io.video import fps_problem
from wanjax.jobs.animate_flags import AnimateFlags
from wanjax.jobs.cache_flags import CacheFlags
from wanjax.jobs.groups import (
    AttentionFlags,
    CommonFlags,
    ComponentFileFlags,
    ImageFlags,
    LoraFlags,
    MemoryFlags,
    OutputFlags,
    ParallelFlags,
    PromptFlags,
    SamplingFlags,
    SourceVideoFlags,
    VaceFlags,
    VaeFlags,
    VideoFlags,
    dtype_flag,
    parse_lora,
    precision_flag,
    stage_dir_flag,
)

OUTPUT_SUFFIXES = {
    "output_video": ".mp4",
    "frames_out": ".npy",
    "preview": ".png",
    "thumbnail": ".webp",
    "cache_calibrate": ".json",
}

LATER_MODEL_HELP = "model (default: the one the stage directory was made with)"  # a later stage's --model


# ----------------------------------------------------------------------------------------------
# Requests


class Request:
    """Base of the requests: fields named as flags, checked once, recorded as flags."""

    command: ClassVar[str]
    help_sections: ClassVar[tuple[type, ...]] = (
        ImageFlags,
        SourceVideoFlags,
        VaceFlags,
        AnimateFlags,
        AttentionFlags,
        VaeFlags,
        ComponentFileFlags,
        LoraFlags,
        CacheFlags,
        MemoryFlags,
        ParallelFlags,
    )  # the order of the titled groups in --help (:func:`~wanjax.jobs.flags.add_flags`)

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
class ModelRequest(Request):
    """The flags of a command that loads a model's transformer or text encoder: the model and their
    dtypes."""

    common: CommonFlags = dataclasses.field(default_factory=CommonFlags)
    dtype: str | None = dtype_flag()
    precision: str | None = precision_flag()


@dataclasses.dataclass(frozen=True)
class RunRequest(ModelRequest):
    """The flags of a command that runs the transformer (``generate``, ``denoise``, ``serve``): its
    attention, the VAE, component files, LoRA, step cache, memory and devices."""

    attention: AttentionFlags = dataclasses.field(default_factory=AttentionFlags)
    vae: VaeFlags = dataclasses.field(default_factory=VaeFlags)  # denoise: an Animate model's segments
    files: ComponentFileFlags = dataclasses.field(default_factory=ComponentFileFlags)
    adapters: LoraFlags = dataclasses.field(default_factory=LoraFlags)
    cache: CacheFlags = dataclasses.field(default_factory=CacheFlags)
    memory: MemoryFlags = dataclasses.field(default_factory=MemoryFlags)
    parallel: ParallelFlags = dataclasses.field(default_factory=ParallelFlags)


@dataclasses.dataclass(frozen=True)
class InputsRequest(ModelRequest):
    """The flags of a command that takes a run's inputs: the prompts, the images, a source or control
    video, the video's size and an Animate model's videos (``generate`` and ``encode``)."""

    text: PromptFlags = dataclasses.field(default_factory=PromptFlags)
    images: ImageFlags = dataclasses.field(default_factory=ImageFlags)
    source: SourceVideoFlags = dataclasses.field(default_factory=SourceVideoFlags)
    vace: VaceFlags = dataclasses.field(default_factory=VaceFlags)
    video: VideoFlags = dataclasses.field(default_factory=VideoFlags)
    animate: AnimateFlags = dataclasses.field(default_factory=AnimateFlags)


@dataclasses.dataclass(frozen=True)
class GenerateRequest(InputsRequest, RunRequest):
    """``wanjax generate``: prompt to mp4 in one run."""

    command: ClassVar[str] = "generate"
    sampling: SamplingFlags = dataclasses.field(default_factory=SamplingFlags)
    outputs: OutputFlags = dataclasses.field(default_factory=OutputFlags)


@dataclasses.dataclass(frozen=True)
class EncodeRequest(InputsRequest):
    """``wanjax encode``: prompts to the stage directory's embeddings."""

    command: ClassVar[str] = "encode"
    vae: VaeFlags = dataclasses.field(default_factory=VaeFlags)
    output_dir: str = stage_dir_flag()
    files: ComponentFileFlags = dataclasses.field(default_factory=ComponentFileFlags)
    memory: MemoryFlags = dataclasses.field(default_factory=MemoryFlags)
    parallel: ParallelFlags = dataclasses.field(default_factory=ParallelFlags)


@dataclasses.dataclass(frozen=True)
class DenoiseRequest(RunRequest):
    """``wanjax denoise``: the stage directory's embeddings to its latents."""

    command: ClassVar[str] = "denoise"
    flag_help: ClassVar[dict[str, str]] = {"model": LATER_MODEL_HELP}
    video: VideoFlags = dataclasses.field(default_factory=VideoFlags)
    sampling: SamplingFlags = dataclasses.field(default_factory=SamplingFlags)
    input_dir: str = stage_dir_flag()


@dataclasses.dataclass(frozen=True)
class DecodeRequest(Request):
    """``wanjax decode``: the stage directory's latents to mp4."""

    command: ClassVar[str] = "decode"
    flag_help: ClassVar[dict[str, str]] = {
        "model": LATER_MODEL_HELP,
        "output_video": "mp4 to write (default INPUT_DIR/output_video.mp4)",
    }
    common: CommonFlags = dataclasses.field(default_factory=CommonFlags)
    video: VideoFlags = dataclasses.field(default_factory=VideoFlags)
    vae: VaeFlags = dataclasses.field(default_factory=VaeFlags)
    outputs: OutputFlags = dataclasses.field(default_factory=OutputFlags)
    input_dir: str = stage_dir_flag()
    files: ComponentFileFlags = dataclasses.field(default_factory=ComponentFileFlags)
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
    if isinstance(memory := getattr(request, "memory", None), MemoryFlags):
        memory.check()  # the library's offload, weights and activations checks, naming the flag
    attention = getattr(request, "attention", None)
    if attention is not None:
        attention.sparse()  # a bad --sparse_option fails here, before any weight is read
        if attention.window_size is not None and attention.sparse_attention != "off":
            raise ConfigError("--window_size and --sparse_attention cannot be combined; give one")
    for name in ("lora", "lora_2"):
        for value in flags.get(name, ()):
            parse_lora(value, f"--{name}")


def _check_cache(request: Request) -> None:
    """The step-cache flags make a valid policy, and a given ``--mag_ratios`` or
    ``--teacache_coefficients`` reads."""
    flags = getattr(request, "cache", None)
    if flags is None:
        return
    from wanjax.sampling.cache.step_cache import read_mag_ratios
    from wanjax.sampling.cache.teacache import read_coefficients

    try:
        config = flags.config()
        if config.mag_ratios is not None:
            read_mag_ratios(config.mag_ratios)
        if config.coefficients is not None:
            read_coefficients(config.coefficients)
    except ConfigError as e:
        raise ConfigError(f"--cache {flags.cache}: {e}") from None


def _check_prompts(flags: dict[str, Any]) -> None:
    """A command that encodes text is given exactly one of ``--prompt`` and ``--prompt_file``; an empty
    prompt is warned of (unless ``--quiet``)."""
    if "prompt" not in flags:
        return
    if not flags["prompt"] and not flags["prompt_file"]:
        raise WanjaxError('no prompt: give --prompt "what the video shows" (or --prompt_file FILE)')
    if flags["prompt"] and flags["prompt_file"]:
        raise WanjaxError("--prompt and --prompt_file both given; give one of them")
    if any(not p.strip() for p in flags["prompt"]) and not flags.get("quiet"):
        if any(flags.get(name) for name in ("image", "video", "reference_image", "extend")):
            problem = "the video follows no text (diffusers allows it)"  # but the image or video
        else:
            problem = "the video will be unconditioned (it follows no text; diffusers allows it)"
        warnings.warn(f'--prompt is empty: {problem}; give --prompt "what it shows"', stacklevel=2)
    _hint_negative_name(flags.get("negative_prompt"))
    if flags.get("last_image") and not flags.get("image"):
        raise WanjaxError("--last_image needs --image (the first frame) too")
    if (flags.get("mask") or flags.get("reference_image")) and flags.get("image"):
        raise WanjaxError(
            "--mask and --reference_image are a VACE model's; --image is an image-to-video model's"
        )
    if flags.get("video") and flags.get("image"):
        raise WanjaxError("--video and --image both given: re-make a video (--video) or start from an image")


def _hint_negative_name(text: str | None) -> None:
    """A warning when a --negative_prompt used as text looks like a misspelt name of a named one."""
    from wanjax.pipeline.prompts import NAMED_NEGATIVE_PROMPTS

    if not text or text in NAMED_NEGATIVE_PROMPTS or " " in text.strip():
        return
    close = difflib.get_close_matches(text.strip().lower(), list(NAMED_NEGATIVE_PROMPTS), n=1, cutoff=0.7)
    if close:
        warnings.warn(
            f"--negative_prompt {text!r} is used as the text itself; did you mean the named prompt {close[0]!r}?",
            stacklevel=3,
        )


def _check_output_names(flags: dict[str, Any]) -> None:
    for key, suffix in OUTPUT_SUFFIXES.items():
        value = flags.get(key)
        if value and Path(value).suffix.lower() != suffix:
            raise WanjaxError(f"--{key} {value} must end in {suffix}")


def _check_numbers(flags: dict[str, Any]) -> None:
    from wanjax.models.defaults import TEXT_LENGTH, Defaults

    steps = flags.get("num_inference_steps")
    if steps is not None and steps < 1:
        raise WanjaxError(f"--num_inference_steps must be at least 1, got {steps}")
    guidance = flags.get("guidance_scale")
    if guidance is not None and not (math.isfinite(guidance) and guidance >= 0):
        raise WanjaxError(
            f"--guidance_scale must be >= 0 ({Defaults().guidance_scale} is the default; <= 1 turns CFG off), "
            f"got {guidance}"
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
    if fps is not None and (problem := fps_problem(fps)):
        raise WanjaxError(f"--fps {problem}")
    length = flags.get("max_sequence_length")
    if length is not None and length < 1:
        trained = PromptFlags.max_sequence_length
        raise WanjaxError(f"--max_sequence_length must be at least 1 ({trained} as trained), got {length}")
    for name in ("height", "width", "frames"):
        value = flags.get(name)
        if value is not None and value < 1:
            raise WanjaxError(f"--{name} must be positive, got {value}")
    length = flags.get("max_sequence_length")
    if length is not None and not 1 <= length <= TEXT_LENGTH:
        raise WanjaxError(
            f"--max_sequence_length must be 1 to {TEXT_LENGTH} (the text tokens Wan was trained on), got {length}"
        )
    for name in ("clips", "overlap"):
        if flags.get(name) is not None and flags[name] < 1:
            raise WanjaxError(f"--{name} must be at least 1, got {flags[name]}")
    scale = flags.get("conditioning_scale")
    if scale is not None and not math.isfinite(scale):
        raise WanjaxError(f"--conditioning_scale must be a finite number (1.0 is the default), got {scale}")
    strength = flags.get("strength")
    if strength is not None and not 0 < strength <= 1:
        raise WanjaxError(
            f"--strength must be over 0 and at most 1 ({Defaults().strength} is the default), got {strength}"
        )
    seed = flags.get("seed")
    if seed is not None and not 0 <= seed < 2**63:
        raise WanjaxError(f"--seed must be an integer from 0 to 2**63-1 ({2**63 - 1}), got {seed}")


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
