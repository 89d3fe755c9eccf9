"""The three stages on a Wan 2.2 Animate model, the pieces of ``generate``'s run
(:mod:`wanjax.pipeline.animate`) on the stage directory's files: ``encode`` prepares what no segment
changes (``stage1_animate``: the videos' pixels, the character's CLIP states and reference latents,
the segments), checked as ``generate`` checks it; ``denoise`` runs the segments, loading the VAE too
(each segment is conditioned on the last decoded frames of the one before), and writes every
segment's latents; ``decode`` decodes each segment, as ``generate`` did, and joins them. So the
three give ``generate``'s frames bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from wanjax.errors import WanjaxError
from wanjax.jobs import preflight as validation
from wanjax.jobs.animate import (
    animate_options,
    animate_video,
    check_init,
    open_animate_inputs,
)
from wanjax.jobs.checks import (
    check_attention,
    check_cache,
    check_devices,
    check_vae_tiling,
    open_images,
    open_source_video,
    open_vace_inputs,
    prompt_list,
)
from wanjax.jobs.groups import VaeFlags
from wanjax.jobs.opening import defaults_of, files_record, model_label
from wanjax.jobs.record import finish, finish_denoise, image_record, make_report, prompt_record, recorded
from wanjax.jobs.requests import DenoiseRequest, EncodeRequest
from wanjax.jobs.sampling import sampling_params, steps_run
from wanjax.jobs.status import ENCODE_WORK, Status, headline
from wanjax.parallel.layouts import to_host
from wanjax.parallel.multihost import is_primary
from wanjax.pipeline import stages
from wanjax.pipeline.animate import (
    VIDEO_INPUTS,
    AnimateConditioning,
    joined,
    prepare_conditioning,
    run_segments,
)
from wanjax.pipeline.pipeline import WanPipeline
from wanjax.pipeline.prompts import negative_prompt
from wanjax.runtime.timing import RunReport


def encode_animate(request: EncodeRequest, pipe: WanPipeline, mesh: Any, start: float) -> RunReport:
    """Stage 1 on an Animate model: the prompts' embeddings and ``stage1_animate.safetensors``, its
    inputs checked with ``generate``'s checks before any work."""
    out = Path(request.output_dir)
    cfg = pipe.components.sources.check(("transformer", "vae"))["transformer"]
    check_vae_tiling(pipe)
    fps = request.video.fps or defaults_of(pipe).fps
    open_source_video(pipe, request.source, cfg, fps, request.video.frames)
    image, _ = open_images(pipe, request.images, cfg)
    inputs = open_animate_inputs(pipe, request, cfg, fps, None)
    assert inputs is not None and image is not None
    video = animate_video(pipe, request, inputs)
    pipe.components.geometry.check(video["height"], video["width"], inputs.segments.length)
    open_vace_inputs(pipe, request.vace, cfg, video["frames"], fps)
    check_devices(mesh, None)
    prompts = prompt_list(request.text)
    negative = negative_prompt(request.text.negative_prompt)
    length = request.text.max_sequence_length
    segments = inputs.segments
    with Status.for_terminal("encode", 0, request.common.quiet, ENCODE_WORK) as status:
        many = "s" * (len(prompts) > 1)
        status.header(
            f"model {model_label(pipe.components.source)}, {len(prompts)} prompt{many}, {inputs.mode} mode, "
            f"{segments.count} segments of {segments.length} frames"
        )
        status("encode", 0)
        pos, neg = (to_host(e) for e in pipe.encode_prompt(prompts, [negative] * len(prompts), length))
        status("animate", 0)
        conditioning = prepare_conditioning(
            pipe.components, image, inputs.videos, video["height"], video["width"], segments
        )
        status("write", 0)
        if is_primary():
            stages.save_embeddings(out, pos, neg)
            stages.save_animate(out, conditioning)
            for stale in (stages.save_image_conditioning, stages.save_video_latents, stages.save_vace):
                stale(out, None)
        flags = request.animate
        params = {
            **prompt_record(pipe, request, prompts, negative, length),
            **image_record(request.images),
            "mode": inputs.mode,
            **{
                name: str(Path(path).resolve())
                for name in VIDEO_INPUTS
                if (path := getattr(flags, name)) is not None
            },
            "segment_frame_length": segments.length,
            "prev_segment_conditioning_frames": segments.overlap,
            **video,
            "fps": fps,
            **files_record(request.files),
            **recorded(request),
        }
        if is_primary():
            stages.write_config(out, stages.record_stage({}, "encode", params))
        shape = {"batch": int(pos.shape[0]), "tokens": int(pos.shape[1]), "text_dim": int(pos.shape[2])}
        outputs = {"embeddings": str(out / stages.EMBEDDINGS_FILE), "animate": str(out / stages.ANIMATE_FILE)}
        return finish(make_report("encode", pipe, shape, outputs), request, start)


def stage_animate(pipe: WanPipeline, cfg: Any, directory: Path) -> AnimateConditioning | None:
    """The stage directory's Animate inputs, which an Animate model needs and no other model takes."""
    path = directory / stages.ANIMATE_FILE
    label = model_label(pipe.components.source)
    if cfg.animate and not path.exists():
        raise WanjaxError(
            f"{directory}: no {stages.ANIMATE_FILE}, and {label} is an Animate model; run `wanjax encode "
            f"--image IMAGE --pose_video POSE --face_video FACE --output_dir {directory}` with it first"
        )
    if path.exists() and not cfg.animate:
        raise WanjaxError(
            f"{path}: an Animate model's inputs, but {label} is not one; denoise with the Animate model that "
            "encoded it (--model), or re-run `wanjax encode` with this one"
        )
    return stages.load_animate(directory) if cfg.animate else None


SEGMENT_VAE_FLAGS = ("vae_dtype", "vae_weights_dtype", "vae_precision", "vae_tiling")  # change its frames


def vae_record(flags: VaeFlags) -> dict[str, Any]:
    """The VAE flags an Animate denoise decoded each segment's last frames with (None included)."""
    return {key: getattr(flags, key) for key in SEGMENT_VAE_FLAGS}


def check_segment_vae(flags: VaeFlags, earlier: dict[str, Any], where: Path) -> None:
    """``decode`` of an Animate run decodes with the VAE settings ``denoise`` conditioned the segments
    with (``generate``'s frames then); WanjaxError naming the flag to give otherwise."""
    for key in SEGMENT_VAE_FLAGS:
        given, recorded = getattr(flags, key), earlier.get(key)
        if given != recorded:
            fix = f"give --{key} {recorded}" if recorded is not None else f"leave --{key} out"
            raise WanjaxError(
                f"--{key} {given} differs from the VAE `wanjax denoise` decoded the segments' last frames with "
                f"({key} {recorded}, {where / stages.CONFIG_FILE}); {fix} so the video is generate's"
            )


def denoise_animate(
    request: DenoiseRequest,
    pipe: WanPipeline,
    cfg: Any,
    directory: Path,
    config: dict[str, Any],
    embeds: tuple[np.ndarray, np.ndarray],
    init: np.ndarray | None,
    conditioning: AnimateConditioning,
    mesh: Any,
    start: float,
    record: dict[str, Any],
) -> RunReport:
    """Stage 2 on an Animate model: each segment denoised (its conditioning frames decoded from the one
    before by the VAE, loaded here too) -> every segment's latents in ``stage2_latents.safetensors``."""
    pipe.components.sources.check(("vae",))
    check_vae_tiling(pipe)
    pos, neg = embeds
    segments, geometry = conditioning.videos.segments, pipe.components.geometry
    height, width = conditioning.videos.size
    video = {"height": height, "width": width, "frames": segments.frames}
    for key, value in video.items():
        given = getattr(request.video, key)
        if given is not None and given != value:
            raise WanjaxError(
                f"--{key} {given} contradicts {directory / stages.ANIMATE_FILE} ({key} {value} from "
                f"`wanjax encode`); leave --{key} out or re-run `wanjax encode`"
            )
    batch = pos.shape[0]
    if init is not None:
        check_init(pipe, init, batch, height, width, segments)
    validation.check_rope(cfg, geometry, {**video, "frames": segments.length + geometry.temporal})
    check_devices(mesh, cfg.num_attention_heads)
    check_attention(pipe, cfg)
    params = sampling_params(pipe, request.sampling)
    check_cache(request.cache, cfg, params, params["guidance_scale"] > 1, False)
    run = animate_options(pipe, params, request.sampling.seed, request.cache, height=height, width=width)
    steps = steps_run(params)
    with Status.for_terminal("denoise", steps, request.common.quiet) as status:
        line = headline(model_label(pipe.components.source), batch, video, steps)
        status.header(f"{line} per segment, {segments.count} segments of {segments.length} frames")
        status("denoise", 0)
        on_step = lambda done: status("denoise", done)  # noqa: E731
        pipe.components.timings.clear()
        done = [d for d, _ in run_segments(pipe, conditioning, pos, neg, run, init, on_step, False, False)]
        latents = [to_host(d.latents) for d in done]
        denoised = joined(done)
        path = directory / stages.LATENTS_FILE
        status("write", 0)
        if is_primary():
            stages.save_segment_latents(path, latents, segments)
        fps = {"fps": request.video.fps} if request.video.fps else {}
        entry = {**record, **video, **fps, **params, **vae_record(request.vae), **recorded(request)}
        shape = {"batch": batch, **video}
        return finish_denoise(request, pipe, config, entry, params, path, denoised, shape, start)
