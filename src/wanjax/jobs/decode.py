"""The ``decode`` job, stage 3: a stage directory's latents -> mp4 (and raw frames, previews), the
video's record beside it; an Animate run's segments each decoded and joined as ``generate`` joins them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from wanjax.errors import WanjaxError
from wanjax.jobs.animate_stages import check_segment_vae
from wanjax.jobs.checks import check_devices, check_output_paths, check_vae_tiling
from wanjax.jobs.opening import (
    begin,
    defaults_of,
    files_record,
    mesh_request,
    model_label,
    open_pipeline,
    stage_files,
)
from wanjax.jobs.outputs import clip_infos, video_record, with_output_video, write_outputs
from wanjax.jobs.record import finish, make_report, recorded
from wanjax.jobs.requests import DecodeRequest
from wanjax.jobs.status import Status, headline
from wanjax.parallel.multihost import is_primary
from wanjax.pipeline import stages
from wanjax.pipeline.animate import decode_segments
from wanjax.runtime.timing import RunReport


def decode(request: DecodeRequest) -> RunReport:
    """Stage 3: ``stage2_latents.safetensors`` -> mp4 (and raw frames / preview)."""
    start = begin(request.parallel)
    directory = Path(request.input_dir)
    config = stages.read_config(directory)
    latents_path = directory / stages.LATENTS_FILE
    latents = stages.load_latents(latents_path)
    request = with_output_video(request, str(directory / "output_video.mp4"))
    record = video_record(request)
    check_output_paths(request, **{"--input_dir": directory / stages.CONFIG_FILE, "--metrics_json": record})
    stages.check_video_flags(config, "decode", {"fps": request.video.fps}, directory)
    earlier = {k: v for k, (v, _) in stages.upstream(config, "decode").items()}
    segmented = stages.load_segments(latents_path, latents)  # an Animate run's segments
    if segmented is not None:
        check_segment_vae(request.vae, earlier, directory)
    mesh, fsdp = mesh_request(request.parallel)
    model = request.common.model or earlier.get("model")
    revision = None if request.common.model else earlier.get("revision")
    files = stage_files(request.files, earlier)
    pipe = open_pipeline(request, mesh, fsdp, model=model, revision=revision, files=files)
    vae_cfg = pipe.components.sources.check(("vae",))["vae"]
    check_vae_tiling(pipe)
    if latents.shape[1] != vae_cfg.z_dim:
        raise WanjaxError(
            f"{latents_path}: latents have {latents.shape[1]} channels but the VAE of "
            f"{model_label(pipe.components.source)} decodes {vae_cfg.z_dim}; they come from another model"
        )
    check_devices(mesh, None)
    if segmented is None:  # a VACE run's references: not video
        latents = latents[:, :, int(earlier.get("reference_frames", 0)) :]
        size = pipe.components.geometry.video_size(latents.shape)
    else:  # each segment's first latent frame is the reference's: not video
        segments, parts = segmented
        size = {**pipe.components.geometry.video_size(parts[0][:, :, 1:].shape), "frames": segments.frames}
    given = dataclasses.asdict(request.video)
    for key in ("height", "width", "frames"):
        if given[key] is not None and given[key] != size[key]:
            raise WanjaxError(
                f"--{key} {given[key]} contradicts {latents_path} (latents {list(latents.shape)} decode to "
                f"{size['frames']} frames of {size['width']}x{size['height']}); leave --{key} out"
            )
    batch = latents.shape[0]
    with Status.for_terminal("decode", 0, request.common.quiet, frames=latents.shape[2]) as status:
        status.header(f"{headline(model_label(pipe.components.source), batch, size)}, from {latents_path}")
        status("decode", 0)
        if segmented is None:
            on_frames = (lambda done: status("decode", done)) if status.in_place else None
            frames = pipe.decode(latents, on_frames=on_frames)
        else:
            frames = decode_segments(pipe.components, *segmented)
        fps = request.video.fps or earlier.get("fps") or defaults_of(pipe).fps
        described = {**earlier, **size, "fps": fps}
        status("write", 0)
        outputs = write_outputs(
            frames, request.outputs, fps, clip_infos(batch, earlier.get("prompt"), described)
        )
        entry = {
            "model": model_label(pipe.components.source),
            "revision": revision or request.common.revision,
            "vae_dtype": pipe.components.settings.vae_dtype.name,
            "vae_weights_dtype": pipe.components.settings.vae_weights_dtype.name,
            "fps": fps,
            "output_video": request.outputs.output_video,
            "frames_out": request.outputs.frames_out,
            "preview": request.outputs.preview,
            "written": outputs,
            **files_record(files),
            **recorded(request),
        }
        if is_primary():
            stages.write_config(directory, stages.record_stage(config, "decode", entry))
        return finish(
            make_report("decode", pipe, {"batch": batch, **size, "fps": fps}, outputs), request, start, record
        )
