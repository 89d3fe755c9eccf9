"""Denoising a request's latents: its sampling parameters (flags, else the model's and the
scheduler's defaults), the pipeline's denoise with them, and the step cache's record."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wanjax.errors import ConfigError, WanjaxError
from wanjax.io.atomic import write_text
from wanjax.jobs.cache_flags import CacheFlags
from wanjax.jobs.groups import SamplingFlags
from wanjax.jobs.opening import defaults_of, model_label
from wanjax.kernels.radial import RadialAttention
from wanjax.parallel.multihost import is_primary
from wanjax.pipeline.options import RunOptions
from wanjax.pipeline.pipeline import WanPipeline
from wanjax.runtime.timing import RunReport
from wanjax.sampling.results import Denoised
from wanjax.sampling.scheduler.few_step import StepCountError

if TYPE_CHECKING:
    from wanjax.sampling.guidance import ImageConditioning


def sampling_params(pipe: WanPipeline, sampling: SamplingFlags, video: bool = False) -> dict[str, Any]:
    """Steps, guidance, the scheduler and its flow shift (as the scheduler the run builds says: the
    checkpoint's, or the distill sampler's, unless given), seed (None with init latents), and for
    video to video (``video``) the strength; the flags' values were checked when the request was
    built."""
    init = sampling.init_latents
    if sampling.strength is not None and not video:
        raise WanjaxError("--strength is for video to video: give the video too (--video FILE)")
    given = RunOptions(
        num_inference_steps=sampling.num_inference_steps,
        guidance_scale=sampling.guidance_scale,
        seed=sampling.seed,
        strength=sampling.strength,
    )
    o = given.filled(defaults_of(pipe), video=video)
    steps, kind = o.num_inference_steps, sampling.scheduler or "auto"
    strength = {"strength": o.strength} if video else {}
    try:
        scheduler = pipe.components.build_scheduler(steps, sampling.flow_shift, kind, **strength)
    except StepCountError as e:  # the rule is the schedule's; the flags to change are named here
        whose = "" if sampling.scheduler else " (the model's)"
        fewer = " or fewer" if e.fewer else ""
        raise ConfigError(
            f"--scheduler {e.kind}{whose} runs {e.steps}; set --num_inference_steps {e.most}{fewer}, "
            f"not {e.given}"
        ) from None
    except ConfigError as e:
        raise ConfigError(f"--{e}" if strength and str(e).startswith("strength") else str(e)) from None
    experts = {}
    if pipe.components.boundary_ratio is not None:  # two experts: the switch and the second guidance
        experts = {
            "boundary_ratio": _given_or(sampling.boundary_ratio, pipe.components.boundary_ratio),
            "guidance_scale_2": sampling.guidance_scale_2,
        }
    elif sampling.boundary_ratio is not None or sampling.guidance_scale_2 is not None:
        raise WanjaxError(
            f"--boundary_ratio and --guidance_scale_2 are for two-expert models (Wan 2.2 A14B); "
            f"{model_label(pipe.components.source)} has one transformer"
        )
    return {
        "num_inference_steps": steps,
        "guidance_scale": o.guidance_scale,
        **experts,
        "scheduler": scheduler.kind,
        "flow_shift": float(scheduler.config.flow_shift),
        "seed": None if init else o.seed,
        "init_latents": str(Path(init).resolve()) if init else None,
        **strength,
    }


def steps_run(params: Mapping[str, Any]) -> int:
    """The denoising steps a run of these parameters takes (fewer than its steps for video to video)."""
    from wanjax.sampling.scheduler.strength import steps_run as run

    return run(params["num_inference_steps"], params.get("strength"))


def _given_or(value: Any, default: Any) -> Any:
    return value if value is not None else default


def video_args(video: Mapping[str, int]) -> dict[str, int]:
    return {"height": video["height"], "width": video["width"], "num_frames": video["frames"]}


def denoise_latents(
    pipe: WanPipeline,
    pos: Any,
    neg: Any,
    latents: Any,
    params: Mapping[str, Any],
    cache: CacheFlags,
    image: ImageConditioning | None = None,
    report: Callable[[str, int], None] | None = None,
    progress: bool = True,
    video_latents: Any = None,
    vace: Any = None,
    sparse: RadialAttention | None = None,
) -> Denoised:
    """The pipeline's denoise with these parameters, step cache and image conditioning, or a source
    video's latents; ``report`` is told ``("denoise", steps done)`` from 0 (``progress``: a bar on a
    terminal); with ``--cache_calibrate`` the measured MagCache ratios are written there (process 0,
    atomically)."""
    on_step = None
    if report is not None:
        report("denoise", 0)
        on_step = lambda done: report("denoise", done)  # noqa: E731
    out = pipe.denoise(
        pos,
        neg,
        latents,
        num_inference_steps=params["num_inference_steps"],
        guidance_scale=params["guidance_scale"],
        flow_shift=params["flow_shift"],
        scheduler=params["scheduler"],
        seed=params["seed"] or 0,
        cache=cache.config(),
        image=image,
        guidance_scale_2=params.get("guidance_scale_2"),
        boundary_ratio=params.get("boundary_ratio"),
        on_step=on_step,
        progress=progress,
        video_latents=video_latents,
        strength=params.get("strength"),
        vace=vace,
        sparse_attention=sparse,
    )
    report = out.cache_report
    if cache.cache_calibrate and report is not None and is_primary():
        write_text(cache.cache_calibrate, json.dumps(report.ratios, indent=1) + "\n")
    return out


def cache_outputs(report: RunReport, denoised: Denoised, cache: CacheFlags) -> None:
    """The step cache's decisions in the run's record, and the calibration file among its outputs."""
    if denoised.cache_report is not None:
        report.extra["cache"] = denoised.cache_report.as_json()
    if cache.cache_calibrate:
        report.outputs["mag_ratios"] = cache.cache_calibrate
