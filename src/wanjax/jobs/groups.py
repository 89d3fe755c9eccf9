"""The flag groups the requests share (:mod:`wanjax.jobs.requests`), and the flags several requests
have: each declared once, with its default, help and choices (:mod:`wanjax.jobs.flags`).

``None`` means "not given": the value then comes from an earlier stage, the ``--init_latents`` shape,
the checkpoint, or the model's defaults (``WanPipeline.defaults``: the model registry's,
:mod:`wanjax.models.registry`); help texts whose default depends on the model read the registry's.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, ClassVar

from wanjax.errors import ConfigError
from wanjax.jobs.flags import library, option
from wanjax.models.defaults import TEXT_LENGTH

DEFAULT_MODEL = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
DEFAULT_DTYPE = "bfloat16"
STAGE_DIR = "stage_outputs"


# ----------------------------------------------------------------------------------------------
# What the library decides (read when a parser is built)


_precisions = library("wanjax.kernels.precision", "PRECISIONS")


_offload_modes = library("wanjax.models.offload", "OFFLOAD_MODES")


_weights_dtypes = library("wanjax.io.quantizable", "WEIGHTS_DTYPES")


_activations_dtypes = library("wanjax.models.w8a8", "ACTIVATIONS_DTYPES")


_backends = library("wanjax.kernels.attention", "BACKENDS")


_scheduler_kinds = library("wanjax.sampling.scheduler", "SCHEDULER_KINDS")


# ----------------------------------------------------------------------------------------------
# Flags several requests have: each function makes the field anew (a field belongs to one class)


def dtype_flag() -> Any:
    return option(
        help="transformer / text encoder dtype: {fallback} (default), float32",
        values=lambda: {"fallback": DEFAULT_DTYPE},
    )


def precision_flag() -> Any:
    return option(
        choices=_precisions,
        help="their float32 matmuls (default: the platform's, highest everywhere today)",
    )


def revision_flag() -> Any:
    return option(help="hub model: a branch, tag or commit (default main)")


def download_flag() -> Any:
    return option(
        False,
        help="hub model: download what is not in the local Hugging Face cache (default: never download)",
    )


def use_fsdp_flag() -> Any:
    return option(False, help="also shard weights' model dims over dp/sp")


def stage_dir_flag() -> Any:
    return option(STAGE_DIR, help="stage directory (default {default})")


# ----------------------------------------------------------------------------------------------
# Flag groups


@dataclasses.dataclass(frozen=True)
class CommonFlags:
    """Every pipeline command: the model (and its hub revision, downloaded when asked), the
    compilation cache, the metrics file."""

    model: str | None = option(
        help="diffusers model directory, hub id in the local HF cache, or demo (default {model})",
        values=lambda: {"model": DEFAULT_MODEL},
    )
    revision: str | None = revision_flag()
    download: bool = download_flag()
    jax_cache_dir: str | None = option(
        help="persistent compilation cache (default $WANJAX_JAX_CACHE_DIR or ~/.cache/wanjax/jax; 'off')",
    )
    metrics_json: str | None = option(help="also write the timing report as JSON to this file")
    quiet: bool = option(
        False,
        help="no status lines while running on a terminal (the final table only), no empty-prompt warning",
    )


@dataclasses.dataclass(frozen=True)
class ParallelFlags:
    """Devices and processes: ``--mesh`` or the reference's aliases; multi-process set-up."""

    title: ClassVar[str] = "devices and processes"
    mesh: str | None = option(help="dp=2,sp=1,tp=4 (order = device order), or auto (default with > 1 device)")
    use_dp: bool = option(False, help="alias: dp=2 (the CFG pair), the rest on tp")
    sp_num: int | None = option(help="alias: sequence-parallel shards (sp=N)")
    use_fsdp: bool = use_fsdp_flag()
    coordinator_address: str | None = option(help="multi-process: HOST:PORT of process 0, or auto")
    num_processes: int | None = option(help="multi-process: number of processes")
    process_id: int | None = option(help="multi-process: this process's index")


@dataclasses.dataclass(frozen=True)
class PromptFlags:
    """The text: prompts (a batch), or a file of them (one is required), and the negative prompt
    (a text, or a name of :data:`wanjax.pipeline.prompts.NAMED_NEGATIVE_PROMPTS`)."""

    prompt: tuple[str, ...] = option(
        (),
        help='what the video shows, quoted: --prompt "a cat on the grass" (required, or --prompt_file); '
        "repeated, the prompts run as one batch (one mp4 each: NAME_0.mp4, ...)",
        repeat=True,
    )
    prompt_file: str | None = option(
        help="a text file with one prompt per line, a batch (instead of --prompt; blank and # lines skipped)",
    )
    negative_prompt: str | None = option(
        help='what to steer away from (default "", as diffusers); {names}: the Wan authors\' negative '
        "prompt that diffusers' Wan examples use",
        values=lambda: {"names": ", ".join(_named_negative_prompts())},
    )
    max_sequence_length: int = option(
        TEXT_LENGTH, help="text tokens (default {default}, as trained; at most that)"
    )


def _named_negative_prompts() -> dict[str, str]:
    from wanjax.pipeline.prompts import NAMED_NEGATIVE_PROMPTS

    return NAMED_NEGATIVE_PROMPTS


@dataclasses.dataclass(frozen=True)
class VideoFlags:
    """The video's size and frame rate (``None``: see the module docstring)."""

    height: int | None = option(
        help="pixels, multiple of 16 (default {ref.height}; demo {demo.height})",
    )
    width: int | None = option(help="pixels, multiple of 16 (default {ref.width}; demo {demo.width})")
    frames: int | None = option(help="4n+1 frames (default {ref.frames}; demo {demo.frames})")
    fps: float | None = option(help="mp4 frame rate (default {ref.fps})")


@dataclasses.dataclass(frozen=True)
class ImageFlags:
    """An image-to-video model's first frame (and a first-last-frame model's last frame): image files."""

    title: ClassVar[str] = "image to video"
    image: str | None = option(
        help="the first frame (PNG, JPEG, ...), for an image-to-video model; without --height/--width "
        "the video keeps its aspect at the model's default area (832x480, 1280x720 for 720P models)",
    )
    last_image: str | None = option(help="the last frame, for a first-last-frame model (FLF2V)")


@dataclasses.dataclass(frozen=True)
class SourceVideoFlags:
    """Video to video: the video a text-to-video model re-makes."""

    title: ClassVar[str] = "video to video"
    video: str | None = option(
        help="a video to re-make with the prompt (any file PyAV reads; its frames at --fps, its first "
        "--frames or as many as it has), for a text-to-video model; --strength says how much; without "
        "--height/--width the video keeps its aspect at the model's default area",
    )


def _extension() -> dict[str, Any]:
    from wanjax.pipeline.extension import OVERLAP

    return {"overlap": OVERLAP}


@dataclasses.dataclass(frozen=True)
class VaceFlags:
    """A VACE model's control: --video is its control video; its mask and reference images."""

    title: ClassVar[str] = "VACE (control video, mask, reference images)"
    mask: str | None = option(
        help="VACE: the mask of --video, a video of as many frames or one image for all (white: "
        "generate, black: keep the video's pixels)",
    )
    reference_image: tuple[str, ...] = option(
        (),
        repeat=True,
        metavar="IMAGE",
        help="VACE: a reference image (of what the video shows), fitted onto a white frame of its own "
        "before the video's (dropped from the result); repeatable",
    )
    conditioning_scale: float | None = option(
        help="VACE: the control's weight (default {ref.conditioning_scale})"
    )
    extend: str | None = option(
        help="VACE: a video to continue (any file PyAV reads, at --fps): --clips clips of --frames frames, "
        "each starting from the last --overlap frames so far, appended",
    )
    clips: int | None = option(
        help="VACE: clips made one after another, each continuing the video so far (default 1; several "
        "prompts: one per clip)",
    )
    overlap: int | None = option(
        help="VACE: the frames each clip shares with the video so far (default {overlap})",
        values=_extension,
    )

    @property
    def given(self) -> bool:
        named = (self.mask, self.conditioning_scale, self.extend, self.clips, self.overlap)
        return any(value is not None for value in named) or bool(self.reference_image)

    @property
    def extending(self) -> bool:
        """The run makes a long video clip by clip (``--extend``, ``--clips``)."""
        return self.extend is not None or (self.clips or 1) > 1


def _sampling_defaults() -> dict[str, Any]:
    from wanjax.sampling.scheduler import DISTILL_SHIFT, DMD_SHIFT

    return {"distill_shift": f"{DISTILL_SHIFT:g}", "dmd_shift": f"{DMD_SHIFT:g}"}


@dataclasses.dataclass(frozen=True)
class SamplingFlags:
    """Denoising: steps, guidance, seed, flow shift, or given starting latents."""

    num_inference_steps: int | None = option(
        help="denoising steps (default {ref.num_inference_steps}; demo {demo.num_inference_steps})",
    )
    guidance_scale: float | None = option(
        help="classifier-free guidance (default {ref.guidance_scale}; <= 1: off)",
    )
    guidance_scale_2: float | None = option(
        help="two-expert models (Wan 2.2 A14B): the low-noise expert's guidance (default --guidance_scale)",
    )
    boundary_ratio: float | None = option(
        help="two-expert models: the high-noise expert runs while timestep >= ratio x 1000 "
        "(default: the checkpoint's model_index.json)",
    )
    seed: int | None = option(help="noise seed (default {ref.seed}; batch item i uses seed + i)")
    scheduler: str | None = option(
        choices=_scheduler_kinds,
        help="sampler (default auto: the checkpoint's scheduler config, UniPC for Wan 2.1; a FastWan "
        "checkpoint's DMD); unipc, euler: regardless of it; distill: the few-step re-noising sampler of "
        "step-distilled models and LoRAs (LightX2V: --num_inference_steps 4 --guidance_scale 1); dmd: "
        "FastWan's 3 steps; rcm: TurboWan's 1 to 4 steps (--guidance_scale 1); rcm_ode: its deterministic "
        "update (TurboDiffusion's image-to-video example)",
    )
    flow_shift: float | None = option(
        help="flow shift (default: the checkpoint's, 3.0; distill {distill_shift}; dmd {dmd_shift}; rcm has none)",
        values=_sampling_defaults,
    )
    init_latents: str | None = option(
        help="start from this noise (safetensors, key 'latents') instead of --seed"
    )
    strength: float | None = option(
        help="video to video: how much of the video is re-made, over 0 to 1: the last "
        "int(steps x strength) steps run, from the video noised to the first (default {ref.strength})",
    )


_sparse_kinds = library("wanjax.kernels.radial", "SPARSE_ATTENTION")


def _sparse_defaults() -> dict[str, Any]:
    from wanjax.kernels.radial import RadialAttention

    return {"sparse_options": ", ".join(f.name for f in dataclasses.fields(RadialAttention))}


def _block_flag(what: str) -> Any:
    return option(help=f"TPU kernel {what}, a multiple of 128 (default: tuned/preset)")


@dataclasses.dataclass(frozen=True)
class AttentionFlags:
    """The attention backend and its kernel options."""

    title: ClassVar[str] = "attention"
    attention: str = option("auto", choices=_backends, help="backend (default {default}: by platform)")
    use_custom_attention: bool = option(False, help="alias: --attention splash_exp2")
    bqsize: int | None = _block_flag("query block")
    bkvsize: int | None = _block_flag("key/value block")
    bkvcomputesize: int | None = _block_flag("kv compute block")
    bkvcomputeinsize: int | None = _block_flag("inner kv compute block (splash_exp2)")
    use_k_smooth: bool = option(False, help="subtract the mean key first (exact)")
    window_size: int | None = option(help="self-attention to keys within this many tokens only")
    sparse_attention: str = option(
        "off",
        choices=_sparse_kinds,
        help="block-sparse self-attention (default {default}): radial (Li et al. 2025, the authors' mask "
        "in blocks of 128; --sparse_option)",
    )
    sparse_option: tuple[str, ...] = option(
        (),
        repeat=True,
        metavar="NAME=VALUE",
        help="radial attention's settings by the authors' names ({sparse_options}), e.g. --sparse_option "
        "decay_factor=0.2 --sparse_option dense_timestep=12 --sparse_option dense_block=1",
        values=_sparse_defaults,
    )

    def sparse(self) -> Any:
        """The :class:`~wanjax.kernels.radial.RadialAttention` asked for (None: dense); ConfigError
        naming an unknown option or a bad value."""
        from wanjax.kernels.radial import RadialAttention

        if self.sparse_attention == "off":
            if self.sparse_option:
                raise ConfigError("--sparse_option needs --sparse_attention radial")
            return None
        options = {}
        for value in self.sparse_option:
            name, sep, text = value.partition("=")
            if not sep or not name.strip():
                raise ConfigError(f"--sparse_option {value!r} must be NAME=VALUE, e.g. decay_factor=0.2")
            options[name.strip()] = text.strip()
        return RadialAttention.of(options)

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


def _streamed_layers() -> dict[str, Any]:
    from wanjax.models.offload import STREAMED_LAYERS

    return {"streamed": STREAMED_LAYERS}


@dataclasses.dataclass(frozen=True)
class MemoryFlags:
    """Where weights wait between uses, and how the matmul kernels are stored."""

    title: ClassVar[str] = "memory"
    offload: str = option(
        "none",
        choices=_offload_modes,
        help="where weights wait (default {default}: all on the device); model: each component on the "
        "device only for its stage, the text encoder's layers streamed from host memory, {streamed} at a "
        "time (frames identical); blocks: the DiT's layers streamed too",
        values=_streamed_layers,
    )
    weights_dtype: str = option(
        "bf16",
        choices=_weights_dtypes,
        help="matmul kernels of the DiT and text encoder (default {default}: in --dtype); "
        "int8, fp8: 8-bit with a float32 scale per output channel; gguf: a GGUF file's quantised "
        "kernels kept as stored, dequantised per layer where they are used",
    )
    activations_dtype: str = option(
        "auto",
        choices=_activations_dtypes,
        help="what the DiT blocks' attention and FFN matmuls multiply (default {default}: int8 where "
        "--weights_dtype is int8 and the chip multiplies int8 faster than bf16: TPU v5e, v6e, v5p, "
        "GPUs of compute capability 8.x; else --dtype); int8: W8A8, the activations quantised per "
        "token and int8 x int8 dots (with --weights_dtype int8 or gguf); a float dtype: weight-only, "
        "in --dtype",
    )

    def check(self) -> None:
        """ConfigError naming the flag of a value the library refuses."""
        from wanjax.io.quantizable import weights_dtype
        from wanjax.models.offload import parse_offload
        from wanjax.models.w8a8 import check_activations

        parse_offload(self.offload, "--offload")
        weights_dtype(self.weights_dtype, "--weights_dtype")
        check_activations(self.activations_dtype, self.weights_dtype, "--activations_dtype")


def _component_file(component: str) -> Any:
    return option(
        metavar="FILE",
        help=f"the {component} from this file (safetensors or GGUF; diffusers', the original Wan or "
        "ComfyUI's layout; fp8-scaled) instead of --model's",
    )


@dataclasses.dataclass(frozen=True)
class ComponentFileFlags:
    """Components read from single files (``--transformer FILE``, ...) over ``--model``, which supplies
    the rest; without ``--model``, the transformer file's variant (the model registry's) does."""

    title: ClassVar[str] = "components from single files"
    transformer: str | None = _component_file("transformer (the high-noise expert of Wan 2.2 A14B)")
    transformer_2: str | None = _component_file("low-noise expert of a two-expert model")
    vae: str | None = _component_file("VAE")
    text_encoder: str | None = _component_file("UMT5 text encoder")
    image_encoder: str | None = _component_file("CLIP image encoder")

    def given(self) -> dict[str, str]:
        """The component files given, by component."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name)}


@dataclasses.dataclass(frozen=True)
class LoraFlags:
    """LoRA adapters merged into the transformer, ``--lora PATH[:WEIGHT]``, and into a two-expert
    model's low-noise expert, ``--lora_2 PATH[:WEIGHT]``; both repeatable."""

    title: ClassVar[str] = "LoRA"
    lora: tuple[str, ...] = option(
        (),
        repeat=True,
        metavar="PATH[:WEIGHT]",
        help="merge this LoRA (safetensors: diffusers/PEFT, original Wan / kohya, LightX2V, musubi) into "
        "the transformer with this weight (default 1.0); repeatable",
    )
    lora_2: tuple[str, ...] = option(
        (),
        repeat=True,
        metavar="PATH[:WEIGHT]",
        help="as --lora, into the low-noise expert (transformer_2) of a two-expert model (Wan 2.2 A14B, "
        "whose LoRAs come as high-noise / low-noise pairs: --lora HIGH --lora_2 LOW); repeatable",
    )

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
        if Path(value).exists() or not (Path(path).exists() or path.endswith(".safetensors")):
            return value, 1.0
        raise ConfigError(f"{flag} {value}: the weight after ':' must be a number, e.g. {path}:0.8") from None
    if not math.isfinite(weight):
        raise ConfigError(f"{flag} {value}: the weight must be a finite number")
    return path, weight


def _whole_tiling() -> str:
    """``--vae_tiling`` given alone: the library's tiles (diffusers')."""
    from wanjax.models.vae import Tiling

    return f"{Tiling.size}:{Tiling.stride}"


@dataclasses.dataclass(frozen=True)
class VaeFlags:
    """The VAE's dtypes, decode chunk and tiling."""

    title: ClassVar[str] = "VAE"
    vae_dtype: str = option("float32", help="VAE dtype (default {default}, as the reference)")
    vae_weights_dtype: str | None = option(help="VAE weights dtype (default: --vae_dtype)")
    vae_precision: str | None = option(
        choices=_precisions,
        help="the VAE's float32 convolutions and matmuls (default: the platform's: highest on CPU, "
        "default (TF32) on GPU as torch, high on TPU)",
    )
    vae_decode_chunk: str = option(
        "1", help="latent frames per VAE decode step, or all (default {default}; the frames are the same)"
    )
    vae_tiling: str | None = option(
        const=_whole_tiling,
        metavar="SIZE[:STRIDE]",
        help="decode in blended tiles of SIZE pixels every STRIDE (alone: {const}, as diffusers), "
        "for frames too large to decode whole; seams differ slightly from a whole-frame decode",
    )


@dataclasses.dataclass(frozen=True)
class OutputFlags:
    """The files a decoding command writes (``output_video`` is resolved by the command)."""

    output_video: str | None = option(help="mp4 to write (default YYYYMMDD_HHMMSS.mp4)")
    frames_out: str | None = option(help="also save the uint8 [B,T,H,W,3] frames as .npy")
    preview: str | None = option(help="also write a PNG contact sheet of the frames")
    thumbnail: str | None = option(help="also write the first frame as a WebP image")
