"""What a job records of its run: the stage configs' arguments and environment, and the
:class:`~wanjax.runtime.timing.RunReport` written as JSON (process 0)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from wanjax.jobs.groups import ImageFlags, SourceVideoFlags, VaceFlags
from wanjax.jobs.opening import model_label
from wanjax.jobs.requests import DenoiseRequest, PipelineRequest
from wanjax.jobs.sampling import cache_outputs
from wanjax.models.w8a8 import activations_name
from wanjax.parallel.multihost import is_primary
from wanjax.pipeline import stages
from wanjax.pipeline.pipeline import WanPipeline
from wanjax.runtime.environment import environment
from wanjax.runtime.timing import RunReport, StageTiming
from wanjax.sampling.results import Denoised

STAGE_COMPONENTS = {"encode": "text_encoder", "denoise": "transformer", "decode": "vae"}


def image_record(flags: ImageFlags) -> dict[str, str | None]:
    """The images of a run as a stage config and a video's metadata record them: absolute paths."""
    return {
        name: None if (path := getattr(flags, name)) is None else str(Path(path).resolve())
        for name in ("image", "last_image")
    }


def source_record(flags: SourceVideoFlags) -> dict[str, str | None]:
    """Video to video's source as a stage config and a video's metadata record it: an absolute path."""
    return {"video": None if flags.video is None else str(Path(flags.video).resolve())}


def vace_record(flags: VaceFlags) -> dict[str, Any]:
    """A VACE run's mask and reference images as a video's metadata records them: absolute paths."""
    return {
        "mask": None if flags.mask is None else str(Path(flags.mask).resolve()),
        "reference_images": [str(Path(p).resolve()) for p in flags.reference_image],
    }


def prompt_record(
    pipe: WanPipeline, request: PipelineRequest, prompts: list[str], negative: Any, length: int
) -> dict[str, Any]:
    """What the encode stage's entry says of its model and prompts."""
    return {
        "model": model_label(pipe.components.source),
        "revision": request.common.revision,
        "dtype": pipe.components.settings.text_encoder_dtype.name,
        "prompt": prompts[0] if len(prompts) == 1 else prompts,
        "negative_prompt": negative,
        "max_sequence_length": length,
    }


def finish_denoise(
    request: DenoiseRequest,
    pipe: WanPipeline,
    config: dict[str, Any],
    entry: dict[str, Any],
    params: dict[str, Any],
    latents: Path,
    denoised: Denoised,
    shape: dict[str, Any],
    start: float,
) -> RunReport:
    """The denoise stage's end: its ``entry`` in the stage directory's config (process 0), and the
    run's report with the sampling ``params`` and the step cache's decisions."""
    if is_primary():
        stages.write_config(latents.parent, stages.record_stage(config, "denoise", entry))
    report = make_report("denoise", pipe, shape, {"latents": str(latents)}, denoised)
    report.extra["sampling"] = params
    cache_outputs(report, denoised, request.cache)
    return finish(report, request, start)


def recorded(request: PipelineRequest) -> dict[str, Any]:
    """What every stage config records of its run: the arguments and the environment."""
    return {"arguments": request.arguments(), "environment": environment()}


def finish(
    report: RunReport, request: PipelineRequest, start: float, record: Path | None = None
) -> RunReport:
    """Complete the report and write it as JSON to ``record`` (default ``--metrics_json``; process 0
    only)."""
    import jax

    from wanjax.version import __version__

    report.total = time.perf_counter() - start
    report.extra.update(
        {
            "backend": jax.default_backend(),
            "wanjax_version": __version__,
            "environment": environment(),
            "arguments": request.arguments(),
        }
    )
    record = record or (Path(request.common.metrics_json) if request.common.metrics_json else None)
    if record is not None:
        report.outputs["record"] = str(record)
    if record is not None and is_primary():
        report.write_json(record)
    return report


def make_report(
    command: str,
    pipe: WanPipeline,
    video: dict[str, Any],
    outputs: dict[str, str],
    denoised: Denoised | None = None,
    timings: Mapping[str, StageTiming] | None = None,
) -> RunReport:
    """A run's report: its stage timings (default: the pipeline's; a long video's: its clips' summed),
    and what its denoising returned (if it ran)."""
    timings, c = pipe.timings if timings is None else timings, pipe.components
    order = [s for s in stages.STAGES if s in timings]
    return RunReport(
        command=command,
        model=model_label(pipe.components.source),
        smoke_model=pipe.components.source.is_demo,
        stages={s: timings[s] for s in order},
        steps=None if denoised is None else denoised.step_times,
        video=video,
        outputs=outputs,
        extra={
            "dtype": str(pipe.components.settings.dtype),
            "precision": {
                s: pipe.components.precisions[c] for s, c in STAGE_COMPONENTS.items() if s in order
            },
            # what the transformer blocks' attention and FFN matmuls multiplied (int8: W8A8)
            **(
                {"activations_dtype": activations_name(c.transformer.settings.int8_matmuls, c.settings.dtype)}
                if "denoise" in order
                else {}
            ),
            **({"mesh": denoised.mesh_usage} if denoised and denoised.mesh_usage else {}),
            **(
                {
                    "sparse_attention": {
                        "kind": "radial",
                        "sparse_steps": list(denoised.sparse_steps),
                        "sparse_blocks_from": denoised.sparse_attention.dense_block,
                        "decay_factor": denoised.sparse_attention.decay_factor,
                    }
                }
                if denoised and denoised.sparse_attention
                else {}
            ),
            **(
                {"expert_steps": list(denoised.expert_steps)}
                if denoised and pipe.components.boundary_ratio
                else {}
            ),
        },
    )
