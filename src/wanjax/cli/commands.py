"""What the ``generate``, ``encode``, ``denoise`` and ``decode`` commands do.

``generate`` runs the three stages in memory; the stage commands run one each and pass their
results through the files of a stage directory (:mod:`wanjax.pipeline.stages`). Both paths call the same
:class:`~wanjax.pipeline.pipeline.WanPipeline` methods on the same values, so they give the same frames.
Each command ends with a :class:`~wanjax.runtime.timing.RunReport`.
"""

from __future__ import annotations

import argparse
import datetime
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from wanjax.cli import preflight as validation
from wanjax.errors import ConfigError, WanjaxError
from wanjax.io.atomic import atomic_path
from wanjax.kernels.attention import AttentionSpec, resolve_backend
from wanjax.kernels.common import check_block
from wanjax.parallel.layouts import to_host
from wanjax.parallel.mesh import MeshSpec, mesh_spec_from_flags, parse_mesh
from wanjax.parallel.multihost import is_primary
from wanjax.pipeline import stages
from wanjax.pipeline.hub import DEMO, ModelSource
from wanjax.pipeline.pipeline import WanPipeline
from wanjax.runtime.timing import RunReport

DEFAULT_MODEL = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
DEFAULT_PROMPT = "A cat walks on the grass, realistic"
DEFAULTS: dict[str, Any] = {
    "height": 480,
    "width": 832,
    "frames": 81,
    "fps": 16,
    "num_inference_steps": 50,
    "guidance_scale": 5.0,
    "seed": 42,
    "dtype": "bfloat16",
}
OUTPUT_SUFFIXES = {"output_video": ".mp4", "frames_out": ".npy", "preview": ".png"}


# ----------------------------------------------------------------------------------------------
# Shared pieces


def model_defaults(source: ModelSource) -> dict[str, Any]:
    """Defaults for this model: the reference's, or small ones for the demo model."""
    if not source.is_demo:
        return DEFAULTS
    from wanjax.pipeline.demo import DEMO_DEFAULTS

    return {**DEFAULTS, **DEMO_DEFAULTS}


def model_label(source: ModelSource) -> str:
    """How a model is recorded in stage configs: ``demo``, a hub id, or an absolute path."""
    if source.is_demo and source.name == DEMO:
        return DEMO
    return source.name if not Path(source.name).exists() else str(Path(source.name).resolve())


def open_pipeline(args: argparse.Namespace, model: str | None, dtype: str | None) -> WanPipeline:
    from wanjax.models.vae.model import Tiling

    cache = args.jax_cache_dir if args.jax_cache_dir is not None else True
    mesh, fsdp = mesh_request(args)
    tiling = getattr(args, "vae_tiling", None)
    return WanPipeline.from_pretrained(
        model or DEFAULT_MODEL,
        dtype or DEFAULTS["dtype"],
        vae_dtype=getattr(args, "vae_dtype", "float32"),
        vae_weights_dtype=getattr(args, "vae_weights_dtype", None),
        vae_decode_chunk=getattr(args, "vae_decode_chunk", 1),
        vae_tiling=Tiling.parse(tiling) if tiling else None,
        attention_backend=attention_spec(args),
        jax_cache_dir=cache,
        mesh=mesh,
        fsdp=fsdp,
    )


def attention_spec(args: argparse.Namespace) -> AttentionSpec:
    """The attention backend and options from the flags, checked against this platform now (an
    unavailable backend fails before any weight is read)."""
    name = (
        "splash_exp2" if getattr(args, "use_custom_attention", False) else getattr(args, "attention", "auto")
    )
    spec = AttentionSpec(
        name or "auto",
        block_q=getattr(args, "bqsize", None),
        block_kv=getattr(args, "bkvsize", None),
        block_kv_compute=getattr(args, "bkvcomputesize", None),
        block_kv_compute_in=getattr(args, "bkvcomputeinsize", None),
        k_smooth=bool(getattr(args, "use_k_smooth", False)),
        window_size=getattr(args, "window_size", None),
    )
    resolve_backend(spec.backend)
    for flag in ("bqsize", "bkvsize", "bkvcomputesize", "bkvcomputeinsize"):
        if getattr(args, flag, None) is not None:
            check_block(flag, getattr(args, flag))
    return spec


def mesh_request(args: argparse.Namespace) -> tuple[MeshSpec | str | None, bool]:
    """``(mesh, fsdp)`` from ``--mesh`` or the reference's aliases; ``auto`` when more than one device
    is visible and nothing is said, one device otherwise."""
    import jax

    mesh, use_dp, sp_num, fsdp = (getattr(args, k, None) for k in ("mesh", "use_dp", "sp_num", "use_fsdp"))
    if use_dp or sp_num:
        return mesh_spec_from_flags(mesh, jax.device_count(), use_dp=use_dp, sp_num=sp_num), bool(fsdp)
    if mesh is None:
        mesh = "auto" if jax.device_count() > 1 or fsdp else None
    elif mesh != "auto":
        mesh = parse_mesh(mesh)  # a bad string fails now, before any work
    return mesh, bool(fsdp)


def check_output_names(args: argparse.Namespace) -> None:
    """Reject output paths with the wrong extension before any work is done."""
    for key, suffix in OUTPUT_SUFFIXES.items():
        value = getattr(args, key, None)
        if value and Path(value).suffix.lower() != suffix:
            raise WanjaxError(f"--{key} {value} must end in {suffix}")


def check_output_paths(args: argparse.Namespace, **more: str | Path | None) -> None:
    """Every file the command will write can be written (checked before any work)."""
    outputs = {f"--{key}": getattr(args, key, None) for key in (*OUTPUT_SUFFIXES, "metrics_json")}
    validation.check_outputs({**outputs, **more})


def check_vae_tiling(pipe: WanPipeline) -> None:
    """``--vae_tiling`` against the VAE's config (read without weights), before any work."""
    if pipe.vae_tiling is not None:
        try:
            pipe.vae_tiling.check_stride(pipe.geometry.spatial)
        except ConfigError as e:
            raise ConfigError(f"--vae_tiling {e}") from None


def check_pipeline_mesh(pipe: WanPipeline, heads: int | None) -> None:
    """The requested mesh fits the visible devices (and splits the heads), before any weight is read."""
    import jax

    validation.check_mesh(pipe._mesh_request, jax.device_count(), heads)


def video_flags(args: argparse.Namespace) -> dict[str, Any]:
    return {k: getattr(args, k, None) for k in stages.VIDEO_KEYS}


def resolve_video(
    pipe: WanPipeline,
    given: Mapping[str, Any],
    earlier: Mapping[str, Any],
    init: np.ndarray | None,
    batch: int,
    init_name: str | None,
) -> dict[str, int]:
    """Height, width and frames: flag > earlier stage > ``--init_latents`` shape > model default;
    checked against the init latents' shape when there are some."""
    from_init = pipe.geometry.video_size(init.shape) if init is not None else {}
    defaults = model_defaults(pipe.source)
    video = {}
    for key in ("height", "width", "frames"):
        for source in (given, earlier, from_init, defaults):
            if source.get(key) is not None:
                video[key] = int(source[key])
                break
    expected = pipe.geometry.latent_shape(batch, video["height"], video["width"], video["frames"])
    if init is not None and tuple(init.shape) != expected:
        raise WanjaxError(
            f"--init_latents {init_name} has shape {list(init.shape)} but {batch} prompt(s) at "
            f"{video['width']}x{video['height']}, {video['frames']} frames need {list(expected)}"
        )
    return video


def write_outputs(frames: np.ndarray, args: argparse.Namespace, fps: float) -> dict[str, str]:
    """mp4 (one per batch item), optional raw frames and preview, written by process 0 only;
    returns the paths."""
    from wanjax.io.video import write_mp4, write_preview

    primary = is_primary()

    def numbered(path: Path, i: int) -> Path:
        return path if frames.shape[0] == 1 else path.with_name(f"{path.stem}_{i}{path.suffix}")

    written: dict[str, str] = {}
    video = Path(args.output_video)
    for i, clip in enumerate(frames if primary else ()):
        write_mp4(clip, numbered(video, i), fps=fps)
    written["video"] = str(
        video if frames.shape[0] == 1 else numbered(video, 0).with_name(f"{video.stem}_*.mp4")
    )
    if args.frames_out and primary:
        with atomic_path(args.frames_out) as tmp, open(tmp, "wb") as f:
            np.save(f, frames)
    if args.frames_out:
        written["frames"] = args.frames_out
    if args.preview:
        for i, clip in enumerate(frames if primary else ()):
            write_preview(clip, numbered(Path(args.preview), i))
        written["preview"] = args.preview
    return written


def timestamped_video_name() -> str:
    """The default output name, as the reference scripts: ``YYYYMMDD_HHMMSS.mp4`` in the working directory."""
    return datetime.datetime.now().strftime("%Y%m%d_%H%M%S") + ".mp4"


def scheduler_flow_shift(pipe: WanPipeline, flow_shift: float | None) -> float:
    from wanjax.pipeline.scheduler import load_scheduler_config

    return float(flow_shift) if flow_shift is not None else float(load_scheduler_config(pipe.path).flow_shift)


def finish(report: RunReport, args: argparse.Namespace, start: float) -> RunReport:
    import jax

    from wanjax import __version__

    report.total = time.perf_counter() - start
    report.extra.update(
        {
            "backend": jax.default_backend(),
            "wanjax_version": __version__,
            "environment": validation.environment(),
            "arguments": validation.arguments(args),
        }
    )
    if not is_primary():
        return report
    print(report.table())
    if args.metrics_json:
        report.write_json(args.metrics_json)
    return report


def make_report(command: str, pipe: WanPipeline, video: dict[str, Any], outputs: dict[str, str]) -> RunReport:
    order = [s for s in stages.STAGES if s in pipe.timings]
    return RunReport(
        command=command,
        model=model_label(pipe.source),
        smoke_model=pipe.source.is_demo,
        stages={s: pipe.timings[s] for s in order},
        steps=pipe.step_times,
        video=video,
        outputs=outputs,
        extra={"dtype": str(pipe.dtype)},
    )


# ----------------------------------------------------------------------------------------------
# Commands


def cmd_generate(args: argparse.Namespace) -> RunReport:
    """Prompt to mp4 in one process."""
    start = time.perf_counter()
    check_output_names(args)
    validation.check_flags(args)
    args.output_video = args.output_video or timestamped_video_name()
    check_output_paths(args)
    pipe = open_pipeline(args, args.model, args.dtype)
    configs = validation.check_model(pipe.path, ("tokenizer", "text_encoder", "transformer", "vae"))
    check_vae_tiling(pipe)
    init = stages.load_latents(args.init_latents) if args.init_latents else None
    prompts = batch_prompts(prompt_list(args), None if init is None else init.shape[0])
    batch = len(prompts)
    video = resolve_video(pipe, video_flags(args), {}, init, batch, args.init_latents)
    validation.check_rope(configs["transformer"], pipe.geometry, video)
    check_pipeline_mesh(pipe, configs["transformer"].num_attention_heads)
    params = sampling_params(pipe, args)
    negative = args.negative_prompt if args.negative_prompt is not None else ""
    pos, neg = pipe.encode_prompt(prompts, [negative] * batch, args.max_sequence_length)
    latents = (
        init if init is not None else pipe.prepare_latents(batch, **video_args(video), seed=params["seed"])
    )
    final = denoise(pipe, pos, neg, latents, params)
    frames = pipe.decode(final)
    fps = args.fps or DEFAULTS["fps"]
    outputs = write_outputs(frames, args, fps)
    report = make_report("generate", pipe, {"batch": batch, **video, "fps": fps}, outputs)
    report.extra["sampling"] = params
    return finish(report, args, start)


def prompt_list(args: argparse.Namespace) -> list[str]:
    """The prompts of this run: ``--prompt_file`` (one per non-empty line) or the ``--prompt`` values."""
    if not getattr(args, "prompt_file", None):
        return list(args.prompt)
    try:
        text = Path(args.prompt_file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise WanjaxError(f"--prompt_file {args.prompt_file}: cannot read it ({e})") from None
    prompts = [line.strip() for line in text.splitlines() if line.strip()]
    if not prompts:
        raise WanjaxError(f"--prompt_file {args.prompt_file} holds no prompt (one per line)")
    return prompts


def batch_prompts(prompts: list[str], batch: int | None) -> list[str]:
    """``prompts`` for a batch of ``batch`` latents (``None``: one per prompt); one prompt is repeated."""
    if batch is None or len(prompts) == batch:
        return prompts
    if len(prompts) == 1:
        return prompts * batch
    raise WanjaxError(
        f"--init_latents holds {batch} starting latents but {len(prompts)} prompts were given; "
        "give one prompt, or one per latent"
    )


def cmd_encode(args: argparse.Namespace) -> RunReport:
    """Stage 1: prompts -> ``stage1_embeddings.safetensors``."""
    start = time.perf_counter()
    out = Path(args.output_dir)
    validation.check_flags(args)
    check_output_paths(args, **{"--output_dir": out / stages.EMBEDDINGS_FILE})
    pipe = open_pipeline(args, args.model, args.dtype)
    validation.check_model(pipe.path, ("tokenizer", "text_encoder"))
    check_pipeline_mesh(pipe, None)
    given = {k: v for k, v in video_flags(args).items() if v is not None}
    if {"height", "width", "frames"} & given.keys():
        defaults = model_defaults(pipe.source)
        pipe.geometry.check(*(given.get(k, defaults[k]) for k in ("height", "width", "frames")))
    negative = args.negative_prompt if args.negative_prompt is not None else ""
    prompts = prompt_list(args)
    pos, neg = (
        to_host(e) for e in pipe.encode_prompt(prompts, [negative] * len(prompts), args.max_sequence_length)
    )
    path = stages.save_embeddings(out, pos, neg) if is_primary() else out / stages.EMBEDDINGS_FILE
    params = {
        "model": model_label(pipe.source),
        "dtype": pipe.text_encoder_dtype.name,
        "prompt": prompts[0] if len(prompts) == 1 else prompts,
        "negative_prompt": negative,
        "max_sequence_length": args.max_sequence_length,
        **given,
        "arguments": validation.arguments(args),
        "environment": validation.environment(),
    }
    if is_primary():
        stages.write_config(out, stages.record_stage({}, "encode", params))
    shape = {"batch": int(pos.shape[0]), "tokens": int(pos.shape[1]), "text_dim": int(pos.shape[2])}
    return finish(make_report("encode", pipe, shape, {"embeddings": str(path)}), args, start)


def cmd_denoise(args: argparse.Namespace) -> RunReport:
    """Stage 2: embeddings (+ noise) -> ``stage2_latents.safetensors``."""
    start = time.perf_counter()
    directory = Path(args.input_dir)
    validation.check_flags(args)
    config = stages.read_config(directory)
    pos, neg = stages.load_embeddings(directory)
    check_output_paths(args, **{"--input_dir": directory / stages.LATENTS_FILE})
    stages.check_video_flags(config, "denoise", video_flags(args), directory)
    earlier = {k: v for k, (v, _) in stages.upstream(config, "denoise").items()}
    pipe = open_pipeline(args, args.model or earlier.get("model"), args.dtype or earlier.get("dtype"))
    cfg = validation.check_model(pipe.path, ("transformer",))["transformer"]
    if pos.shape[2] != cfg.text_dim:
        raise WanjaxError(
            f"{directory / stages.EMBEDDINGS_FILE}: embeddings of width {pos.shape[2]} but the transformer of "
            f"{model_label(pipe.source)} takes {cfg.text_dim}; they come from another model (re-run "
            "`wanjax encode` with this model)"
        )
    init = stages.load_latents(args.init_latents) if args.init_latents else None
    batch = pos.shape[0]
    video = resolve_video(pipe, video_flags(args), earlier, init, batch, args.init_latents)
    validation.check_rope(cfg, pipe.geometry, video)
    check_pipeline_mesh(pipe, cfg.num_attention_heads)
    params = sampling_params(pipe, args)
    latents = (
        init if init is not None else pipe.prepare_latents(batch, **video_args(video), seed=params["seed"])
    )
    final = denoise(pipe, pos, neg, latents, params)
    final = to_host(final)
    path = directory / stages.LATENTS_FILE
    if is_primary():
        stages.save_latents(path, final)
    recorded = {
        "model": model_label(pipe.source),
        "dtype": pipe.dtype.name,
        **video,
        **({"fps": args.fps} if args.fps else {}),
        **params,
        "arguments": validation.arguments(args),
        "environment": validation.environment(),
    }
    if is_primary():
        stages.write_config(directory, stages.record_stage(config, "denoise", recorded))
    report = make_report("denoise", pipe, {"batch": batch, **video}, {"latents": str(path)})
    report.extra["sampling"] = params
    return finish(report, args, start)


def cmd_decode(args: argparse.Namespace) -> RunReport:
    """Stage 3: ``stage2_latents.safetensors`` -> mp4 (and raw frames / preview)."""
    start = time.perf_counter()
    check_output_names(args)
    validation.check_flags(args)
    directory = Path(args.input_dir)
    config = stages.read_config(directory)
    latents_path = directory / stages.LATENTS_FILE
    latents = stages.load_latents(latents_path)
    args.output_video = args.output_video or str(directory / "output_video.mp4")
    check_output_paths(args, **{"--input_dir": directory / stages.CONFIG_FILE})
    stages.check_video_flags(config, "decode", {"fps": args.fps}, directory)
    earlier = {k: v for k, (v, _) in stages.upstream(config, "decode").items()}
    pipe = open_pipeline(args, args.model or earlier.get("model"), None)
    vae_cfg = validation.check_model(pipe.path, ("vae",))["vae"]
    check_vae_tiling(pipe)
    if latents.shape[1] != vae_cfg.z_dim:
        raise WanjaxError(
            f"{latents_path}: latents have {latents.shape[1]} channels but the VAE of "
            f"{model_label(pipe.source)} decodes {vae_cfg.z_dim}; they come from another model"
        )
    check_pipeline_mesh(pipe, None)
    size = pipe.geometry.video_size(latents.shape)
    for key in ("height", "width", "frames"):
        value = getattr(args, key)
        if value is not None and value != size[key]:
            raise WanjaxError(
                f"--{key} {value} contradicts {latents_path} (latents {list(latents.shape)} decode to "
                f"{size['frames']} frames of {size['width']}x{size['height']}); leave --{key} out"
            )
    frames = pipe.decode(latents)
    fps = args.fps or earlier.get("fps") or DEFAULTS["fps"]
    outputs = write_outputs(frames, args, fps)
    recorded = {
        "model": model_label(pipe.source),
        "vae_dtype": pipe.vae_dtype.name,
        "vae_weights_dtype": pipe.vae_weights_dtype.name,
        "fps": fps,
        "output_video": outputs["video"],
        "frames_out": args.frames_out,
        "preview": args.preview,
        "arguments": validation.arguments(args),
        "environment": validation.environment(),
    }
    if is_primary():
        stages.write_config(directory, stages.record_stage(config, "decode", recorded))
    return finish(make_report("decode", pipe, {**size, "fps": fps}, outputs), args, start)


# ----------------------------------------------------------------------------------------------
# Denoising parameters


def sampling_params(pipe: WanPipeline, args: argparse.Namespace) -> dict[str, Any]:
    """Steps, guidance, flow shift (the checkpoint's unless given), seed (None with init latents)."""
    defaults = model_defaults(pipe.source)
    steps = (
        args.num_inference_steps if args.num_inference_steps is not None else defaults["num_inference_steps"]
    )
    if steps < 1:
        raise WanjaxError(f"--num_inference_steps must be at least 1, got {steps}")
    if args.guidance_scale is not None and not args.guidance_scale >= 0:
        raise WanjaxError(f"--guidance_scale must be >= 0, got {args.guidance_scale}")
    if args.flow_shift is not None and not args.flow_shift > 0:
        raise WanjaxError(
            f"--flow_shift must be positive (3.0 for 480p, 5.0 for 720p), got {args.flow_shift}"
        )
    return {
        "num_inference_steps": steps,
        "guidance_scale": args.guidance_scale
        if args.guidance_scale is not None
        else defaults["guidance_scale"],
        "flow_shift": scheduler_flow_shift(pipe, args.flow_shift),
        "seed": None if args.init_latents else (args.seed if args.seed is not None else defaults["seed"]),
        "init_latents": str(Path(args.init_latents).resolve()) if args.init_latents else None,
    }


def video_args(video: Mapping[str, int]) -> dict[str, int]:
    return {"height": video["height"], "width": video["width"], "num_frames": video["frames"]}


def denoise(pipe: WanPipeline, pos: Any, neg: Any, latents: Any, params: Mapping[str, Any]) -> Any:
    return pipe.denoise(
        pos,
        neg,
        latents,
        num_inference_steps=params["num_inference_steps"],
        guidance_scale=params["guidance_scale"],
        flow_shift=params["flow_shift"],
    )


COMMANDS: dict[str, Callable[[argparse.Namespace], Any]] = {
    "generate": cmd_generate,
    "encode": cmd_encode,
    "denoise": cmd_denoise,
    "decode": cmd_decode,
}
