"""The ``wanjax`` flags: an argparse parser whose mistakes are one line, the flag groups of the
pipeline subcommands, and the requests built from the parsed flags (:func:`from_flags`).

Flags use the reference scripts' names (``--num_inference_steps``) and accept hyphenated spellings
(``--num-inference-steps``). Their defaults are the requests' (:mod:`wanjax.jobs.requests`): a flag
left out parses to ``None`` and the request fills it in.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import typing
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from wanjax.cli.describe import PlanRequest
from wanjax.errors import one_line
from wanjax.jobs.requests import (
    DEFAULT_MODEL,
    STAGE_DIR,
    AttentionFlags,
    PromptFlags,
    Request,
    VaeFlags,
)
from wanjax.kernels.precision import PRECISIONS
from wanjax.models.registry import DEMO_DEFAULTS, Defaults, released
from wanjax.pipeline.prompts import NAMED_NEGATIVE_PROMPTS
from wanjax.server.request import IMAGE_BODY, TEXT_BODY, ServerFlags

_INVALID_CHOICE = re.compile(r"invalid choice: (?P<value>.*) \(choose from (?P<choices>.*)\)")


R = TypeVar("R", bound=Request)


def from_flags(cls: type[R]) -> Callable[[argparse.Namespace], R]:
    """The builder of ``cls`` requests from parsed flags, their values checked (WanjaxError naming
    the flag)."""

    def build(args: argparse.Namespace) -> R:
        request = _from_namespace(cls, args)
        request.check()
        return request

    return build


class UsageError(Exception):
    """A command-line mistake argparse found; the message is the whole line to print."""


class CliParser(argparse.ArgumentParser):
    """argparse, with a mistake raised as a one-line :class:`UsageError`
    (``wanjax generate: error: ...``) instead of the usage printed and an exit. Subcommand parsers
    are of this class too, and flags no subcommand knows are reported by the subcommand given."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("allow_abbrev", False)  # --num_inference_step is a typo, not a flag
        super().__init__(*args, **kwargs)
        self._subcommands: Any = None

    def add_subparsers(self, **kwargs: Any) -> Any:
        kwargs.setdefault("parser_class", type(self))
        self._subcommands = super().add_subparsers(**kwargs)
        return self._subcommands

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:
        namespace, unknown = self.parse_known_args(args, namespace)
        if unknown:
            self._parser_of(namespace).error(f"unrecognized arguments: {' '.join(unknown)}")
        return namespace

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: error: {one_line(_plain_choices(message))}")

    def _parser_of(self, namespace: argparse.Namespace) -> argparse.ArgumentParser:
        """The parser of the subcommand ``namespace`` holds (this one if none)."""
        if self._subcommands is None:
            return self
        return self._subcommands.choices.get(getattr(namespace, self._subcommands.dest, None), self)


def _plain_choices(message: str) -> str:
    """argparse's ``invalid choice: 'x' (choose from 'a', 'b')`` as ``invalid choice 'x' (choose
    from a, b)``."""

    def plain(match: re.Match[str]) -> str:
        choices = ", ".join(choice.strip("'") for choice in match["choices"].split(", "))
        return f"invalid choice {match['value']} (choose from {choices})"

    return _INVALID_CHOICE.sub(plain, message)


# ----------------------------------------------------------------------------------------------
# Flag groups


def flag(parser: argparse.ArgumentParser, name: str, **kwargs: Any) -> None:
    """``--name`` plus its hyphenated spelling."""
    spellings = [f"--{name}"] + ([f"--{name.replace('_', '-')}"] if "_" in name else [])
    parser.add_argument(*spellings, dest=name, **kwargs)


def add_common(
    parser: argparse.ArgumentParser,
    *,
    model_help: str,
    dtype: bool = True,
    vae: bool = False,
    metrics: bool = True,
) -> None:
    flag(parser, "model", help=model_help)
    add_hub(parser)
    if dtype:
        flag(parser, "dtype", help="transformer / text encoder dtype: bfloat16 (default), float32")
        flag(
            parser,
            "precision",
            choices=PRECISIONS,
            help="their float32 matmuls (default: the platform's, highest everywhere today)",
        )
    if vae:
        add_vae(parser)
    flag(
        parser,
        "jax_cache_dir",
        help="persistent compilation cache (default $WANJAX_JAX_CACHE_DIR or ~/.cache/wanjax/jax; 'off')",
    )
    if metrics:
        flag(parser, "metrics_json", help="also write the timing report as JSON to this file")
    add_parallel(parser)


def add_hub(parser: argparse.ArgumentParser) -> None:
    flag(parser, "revision", help="hub model: a branch, tag or commit (default main)")
    flag(
        parser,
        "download",
        action="store_true",
        help="hub model: download what is not in the local Hugging Face cache (default: never download)",
    )


def add_vae(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("VAE")
    flag(group, "vae_dtype", help=f"VAE dtype (default {VaeFlags.vae_dtype}, as the reference)")
    flag(group, "vae_weights_dtype", help="VAE weights dtype (default: --vae_dtype)")
    flag(
        group,
        "vae_precision",
        choices=PRECISIONS,
        help="the VAE's float32 convolutions and matmuls (default: the platform's: highest on CPU, "
        "default (TF32) on GPU as torch, high on TPU)",
    )
    flag(
        group,
        "vae_decode_chunk",
        help=f"latent frames per VAE decode step, or all (default {VaeFlags.vae_decode_chunk}; "
        "the frames are the same)",
    )
    flag(
        group,
        "vae_tiling",
        nargs="?",
        const="256:192",
        metavar="SIZE[:STRIDE]",
        help="decode in blended tiles of SIZE pixels every STRIDE (alone: 256:192, as diffusers), "
        "for frames too large to decode whole; seams differ slightly from a whole-frame decode",
    )


def add_memory(parser: argparse.ArgumentParser) -> None:
    """Where weights wait and how they are stored (the choices are the library's)."""
    from wanjax.io.quantizable import UNQUANTIZED, WEIGHTS_DTYPES
    from wanjax.models.offload import OFFLOAD_MODES, STREAMED_LAYERS

    group = parser.add_argument_group("memory")
    flag(
        group,
        "offload",
        choices=OFFLOAD_MODES,
        help="where weights wait (default none: all on the device); model: each component on the device "
        f"only for its stage, the text encoder's layers streamed from host memory, {STREAMED_LAYERS} at a "
        "time (frames identical); blocks: the DiT's layers streamed too",
    )
    flag(
        group,
        "weights_dtype",
        choices=WEIGHTS_DTYPES,
        help=f"matmul kernels of the DiT and text encoder (default {UNQUANTIZED}: in --dtype); "
        "int8, fp8: 8-bit with a float32 scale per output channel",
    )


def add_lora(parser: argparse.ArgumentParser) -> None:
    flag(
        parser,
        "lora",
        action="append",
        metavar="PATH[:WEIGHT]",
        help="merge this LoRA (safetensors: diffusers/PEFT, original Wan / kohya, LightX2V, musubi) into "
        "the transformer with this weight (default 1.0); repeatable",
    )
    flag(
        parser,
        "lora_2",
        action="append",
        metavar="PATH[:WEIGHT]",
        help="as --lora, into the low-noise expert (transformer_2) of a two-expert model (Wan 2.2 A14B, "
        "whose LoRAs come as high-noise / low-noise pairs: --lora HIGH --lora_2 LOW); repeatable",
    )


def add_cache(parser: argparse.ArgumentParser) -> None:
    """Step caching (the choices and defaults are the library's)."""
    from wanjax.pipeline.step_cache import FIRST_BLOCK_THRESHOLD, MAG_DEFAULTS, POLICIES, presets

    group = parser.add_argument_group("step cache")
    mag = MAG_DEFAULTS
    flag(
        group,
        "cache",
        choices=POLICIES,
        help="skip the DiT's blocks at steps where they barely change (default off): magcache (a "
        "magnitude-ratio curve) or firstblock (the first block's change)",
    )
    flag(
        group,
        "cache_threshold",
        type=float,
        help=f"skip while the change stays within this (default: the curve's preset, else magcache "
        f"{mag['threshold']}, firstblock {FIRST_BLOCK_THRESHOLD})",
    )
    flag(
        group,
        "cache_max_skip",
        type=int,
        help=f"magcache: skips in a row at most (default {mag['max_skip_steps']})",
    )
    flag(
        group,
        "cache_retention",
        type=float,
        help=f"magcache: fraction of the first steps that always compute (default {mag['retention_ratio']})",
    )
    flag(
        group,
        "mag_ratios",
        metavar="NAME|FILE.json",
        help=f"magcache's curve: a preset ({', '.join(presets())}; default: this model's) or a JSON list",
    )
    flag(
        group,
        "cache_calibrate",
        metavar="FILE.json",
        help="run uncached and write the measured magcache ratios here (per branch; --mag_ratios reads it)",
    )


def add_parallel(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("devices and processes")
    for name, kwargs in (
        ("mesh", dict(help="dp=2,sp=1,tp=4 (order = device order), or auto (default with > 1 device)")),
        ("use_dp", dict(action="store_true", help="alias: dp=2 (the CFG pair), the rest on tp")),
        ("sp_num", dict(type=int, help="alias: sequence-parallel shards (sp=N)")),
        ("use_fsdp", dict(action="store_true", help="also shard weights' model dims over dp/sp")),
        ("coordinator_address", dict(help="multi-process: HOST:PORT of process 0, or auto")),
        ("num_processes", dict(type=int, help="multi-process: number of processes")),
        ("process_id", dict(type=int, help="multi-process: this process's index")),
    ):
        flag(group, name, **kwargs)


def add_attention(parser: argparse.ArgumentParser) -> None:
    from wanjax.kernels.attention import BACKENDS

    group = parser.add_argument_group("attention")
    default = AttentionFlags.attention
    flag(group, "attention", choices=BACKENDS, help=f"backend (default {default}: by platform)")
    flag(group, "use_custom_attention", action="store_true", help="alias: --attention splash_exp2")
    for name, what in (
        ("bqsize", "query block"),
        ("bkvsize", "key/value block"),
        ("bkvcomputesize", "kv compute block"),
        ("bkvcomputeinsize", "inner kv compute block (splash_exp2)"),
    ):
        flag(group, name, type=int, help=f"TPU kernel {what}, a multiple of 128 (default: tuned/preset)")
    flag(group, "use_k_smooth", action="store_true", help="subtract the mean key first (exact)")
    flag(group, "window_size", type=int, help="self-attention to keys within this many tokens only")


def add_prompt(parser: argparse.ArgumentParser) -> None:
    flag(
        parser,
        "prompt",
        nargs="+",
        help="what the video shows (required, or --prompt_file); several prompts run as one batch "
        "(one mp4 each: NAME_0.mp4, ...)",
    )
    flag(
        parser,
        "prompt_file",
        help="a text file with one prompt per line, a batch (instead of --prompt; blank and # lines skipped)",
    )
    names = ", ".join(NAMED_NEGATIVE_PROMPTS)
    flag(
        parser,
        "negative_prompt",
        help=f'what to steer away from (default "", as diffusers); {names}: the Wan authors\' negative '
        "prompt that diffusers' Wan examples use",
    )
    length = PromptFlags.max_sequence_length
    flag(parser, "max_sequence_length", type=int, help=f"text tokens (default {length}, as trained)")


def add_video(parser: argparse.ArgumentParser) -> None:
    ref, demo = Defaults(), DEMO_DEFAULTS
    flag(
        parser, "height", type=int, help=f"pixels, multiple of 16 (default {ref.height}; demo {demo.height})"
    )
    flag(parser, "width", type=int, help=f"pixels, multiple of 16 (default {ref.width}; demo {demo.width})")
    flag(parser, "frames", type=int, help=f"4n+1 frames (default {ref.frames}; demo {demo.frames})")
    flag(parser, "fps", type=float, help=f"mp4 frame rate (default {ref.fps})")


def add_images(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("image to video")
    flag(
        group,
        "image",
        help="the first frame (PNG, JPEG, ...), for an image-to-video model; without --height/--width "
        "the video keeps its aspect at the model's default area (480x832, 720x1280 for 720P models)",
    )
    flag(group, "last_image", help="the last frame, for a first-last-frame model (FLF2V)")


def add_sampling(parser: argparse.ArgumentParser) -> None:
    ref, demo = Defaults(), DEMO_DEFAULTS
    steps = f"default {ref.num_inference_steps}; demo {demo.num_inference_steps}"
    flag(parser, "num_inference_steps", type=int, help=f"denoising steps ({steps})")
    guidance = f"default {ref.guidance_scale}; <= 1: off"
    flag(parser, "guidance_scale", type=float, help=f"classifier-free guidance ({guidance})")
    flag(
        parser,
        "guidance_scale_2",
        type=float,
        help="two-expert models (Wan 2.2 A14B): the low-noise expert's guidance (default --guidance_scale)",
    )
    flag(
        parser,
        "boundary_ratio",
        type=float,
        help="two-expert models: the high-noise expert runs while timestep >= ratio x 1000 "
        "(default: the checkpoint's model_index.json)",
    )
    flag(parser, "seed", type=int, help=f"noise seed (default {ref.seed}; batch item i uses seed + i)")
    from wanjax.pipeline.scheduler import DISTILL_SHIFT, SCHEDULER_KINDS

    flag(
        parser,
        "scheduler",
        choices=SCHEDULER_KINDS,
        help="sampler (default auto: the checkpoint's scheduler config, UniPC for Wan 2.1); unipc, euler: "
        "regardless of it; distill: the few-step re-noising sampler of step-distilled models and LoRAs "
        "(LightX2V: --num_inference_steps 4 --guidance_scale 1)",
    )
    flag(
        parser,
        "flow_shift",
        type=float,
        help=f"flow shift (default: the checkpoint's, 3.0; distill {DISTILL_SHIFT:g})",
    )
    flag(parser, "init_latents", help="start from this noise (safetensors, key 'latents') instead of --seed")


def add_outputs(parser: argparse.ArgumentParser, default_video: str) -> None:
    flag(parser, "output_video", help=f"mp4 to write (default {default_video})")
    flag(parser, "frames_out", help="also save the uint8 [B,T,H,W,3] frames as .npy")
    flag(parser, "preview", help="also write a PNG contact sheet of the frames")


def add_stage_dir(parser: argparse.ArgumentParser, name: str) -> None:
    flag(parser, name, help=f"stage directory (default {STAGE_DIR})")


# ----------------------------------------------------------------------------------------------
# The subcommands' flags

MODEL_HELP = f"diffusers model directory, hub id in the local HF cache, or demo (default {DEFAULT_MODEL})"
LATER_MODEL_HELP = "model (default: the one the stage directory was made with)"


def generate_flags(parser: argparse.ArgumentParser) -> None:
    add_common(parser, model_help=MODEL_HELP, vae=True)
    add_prompt(parser)
    add_images(parser)
    add_video(parser)
    add_sampling(parser)
    add_attention(parser)
    add_lora(parser)
    add_cache(parser)
    add_outputs(parser, "YYYYMMDD_HHMMSS.mp4")
    add_memory(parser)


def serve_flags(parser: argparse.ArgumentParser) -> None:
    add_common(parser, model_help=MODEL_HELP, vae=True, metrics=False)
    add_attention(parser)
    add_lora(parser)
    add_cache(parser)
    add_memory(parser)
    server = ServerFlags()
    group = parser.add_argument_group("server")
    flag(group, "host", help=f"address to listen on (default {server.host}: this machine only)")
    flag(group, "port", type=int, help=f"TCP port (default {server.port}; 0: any free port)")
    flag(group, "output_dir", help=f"job records (SQLite) and videos (default {server.output_dir})")
    flag(
        group,
        "api_key",
        help="require 'Authorization: Bearer KEY' on every API request (default $WANJAX_API_KEY; none)",
    )
    flag(
        group, "max_queue", type=int, help=f"jobs waiting at most; more get 429 (default {server.max_queue})"
    )
    flag(group, "max_frames", type=int, help="frames a video at most (default: the model's default)")
    flag(group, "max_pixels", type=int, help="width x height at most (default: the model's default size)")
    flag(group, "max_steps", type=int, help=f"denoising steps at most (default {server.max_steps})")
    flag(
        group,
        "max_body_bytes",
        type=int,
        help=f"request body size at most (default {TEXT_BODY // 1024} KiB; {IMAGE_BODY // 2**20} MiB "
        "for a model taking images)",
    )
    flag(
        group,
        "device_memory",
        help="a device's memory, e.g. 80GiB: the largest request must fit it by `wanjax plan`'s estimate "
        "(default: the device's own figure where JAX reports one)",
    )


def encode_flags(parser: argparse.ArgumentParser) -> None:
    add_common(parser, model_help=MODEL_HELP, vae=True)
    add_prompt(parser)
    add_images(parser)
    add_video(parser)
    add_stage_dir(parser, "output_dir")
    add_memory(parser)


def denoise_flags(parser: argparse.ArgumentParser) -> None:
    add_common(parser, model_help=LATER_MODEL_HELP)
    add_video(parser)
    add_sampling(parser)
    add_attention(parser)
    add_lora(parser)
    add_cache(parser)
    add_stage_dir(parser, "input_dir")
    add_memory(parser)


def decode_flags(parser: argparse.ArgumentParser) -> None:
    add_common(parser, model_help=LATER_MODEL_HELP, dtype=False, vae=True)
    add_video(parser)
    add_outputs(parser, "INPUT_DIR/output_video.mp4")
    add_stage_dir(parser, "input_dir")


def plan_flags(parser: argparse.ArgumentParser) -> None:
    d = PlanRequest
    presets = ", ".join(released())
    flag(
        parser,
        "model",
        help=f"a registry variant ({presets}) or a diffusers model directory (default {d.model})",
    )
    flag(parser, "mesh", help="dp=2,sp=1,tp=4 (default: every mesh of --num_devices, best one named)")
    flag(parser, "num_devices", type=int, help="devices (default: the mesh's size, else those visible)")
    flag(parser, "device_memory", help=f"memory per device (default {d.device_memory}, a TPU v6e chip)")
    flag(parser, "height", type=int, help=f"pixels (default {d.height})")
    flag(parser, "width", type=int, help=f"pixels (default {d.width})")
    flag(parser, "frames", type=int, help=f"frames (default {d.frames})")
    flag(parser, "dtype", help=f"transformer / text encoder dtype (default {d.dtype})")
    flag(parser, "vae_dtype", help=f"VAE dtype (default {d.vae_dtype})")
    flag(parser, "use_fsdp", action="store_true", help="also shard weights' model dims over dp/sp")
    add_memory(parser)


def info_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model", help="model directory (or one component folder), hub id in the HF cache, or demo"
    )
    add_hub(parser)


def _from_namespace(cls: type[Any], args: argparse.Namespace) -> Any:
    """``cls`` with each field from the flag of its name (groups recursively); a flag left out
    (``None``) keeps the field's default. Lists (``nargs``) become tuples."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[field.name]):
            values[field.name] = _from_namespace(hints[field.name], args)
        elif (value := getattr(args, field.name, None)) is not None:  # a flag the command lacks: default
            values[field.name] = tuple(value) if isinstance(value, list) else value
    return cls(**values)
