"""The ``denoise`` job, stage 2: a stage directory's embeddings (and image conditioning, or a source
video's latents) + noise or given latents -> ``stage2_latents.safetensors``; an Animate model's
segments, its VAE loaded too (:mod:`wanjax.jobs.animate_stages`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from wanjax.errors import WanjaxError
from wanjax.jobs import preflight as validation
from wanjax.jobs.animate_stages import denoise_animate, stage_animate
from wanjax.jobs.checks import (
    check_attention,
    check_cache,
    check_devices,
    check_output_paths,
    resolve_video,
)
from wanjax.jobs.groups import VaeFlags
from wanjax.jobs.opening import begin, files_record, mesh_request, model_label, open_pipeline, stage_files
from wanjax.jobs.record import finish_denoise, recorded
from wanjax.jobs.requests import DenoiseRequest
from wanjax.jobs.sampling import denoise_latents, sampling_params, steps_run, video_args
from wanjax.jobs.status import Status, headline
from wanjax.models.config import TransformerConfig
from wanjax.parallel.layouts import to_host
from wanjax.parallel.multihost import is_primary
from wanjax.pipeline import stages
from wanjax.pipeline.inputs import check_conditioning, check_video_latents
from wanjax.pipeline.pipeline import WanPipeline
from wanjax.runtime.timing import RunReport

if TYPE_CHECKING:
    from wanjax.models.dit import VaceControl
    from wanjax.sampling.guidance import ImageConditioning


def denoise(request: DenoiseRequest) -> RunReport:
    """Stage 2: embeddings (+ noise) -> ``stage2_latents.safetensors``."""
    start = begin(request.parallel)
    directory = Path(request.input_dir)
    config = stages.read_config(directory)
    pos, neg = stages.load_embeddings(directory)
    check_output_paths(request, **{"--input_dir": directory / stages.LATENTS_FILE})
    given = dataclasses.asdict(request.video)
    stages.check_video_flags(config, "denoise", given, directory)
    earlier = {k: v for k, (v, _) in stages.upstream(config, "denoise").items()}
    mesh, fsdp = mesh_request(request.parallel)
    model, dtype = request.common.model or earlier.get("model"), request.dtype or earlier.get("dtype")
    revision = None if request.common.model else earlier.get("revision")
    files = stage_files(request.files, earlier)
    pipe = open_pipeline(request, mesh, fsdp, model=model, dtype=dtype, revision=revision, files=files)
    cfg = pipe.components.sources.check(("transformer",))["transformer"]
    animate = stage_animate(pipe, cfg, directory)
    vae_flags = [f"--{k}" for k, v in dataclasses.asdict(request.vae).items() if v != getattr(VaeFlags(), k)]
    if animate is None and vae_flags:
        raise WanjaxError(
            f"{', '.join(vae_flags)}: the VAE flags are for an Animate model's denoise (its VAE decodes each "
            f"segment's last frames); {model_label(pipe.components.source)} denoises without the VAE: give "
            "them to `wanjax decode`"
        )
    control = stage_vace(pipe, cfg, directory)
    references = int(earlier.get("reference_frames", 0))
    if pos.shape[2] != cfg.text_dim:
        raise WanjaxError(
            f"{directory / stages.EMBEDDINGS_FILE}: embeddings of width {pos.shape[2]} but the transformer of "
            f"{model_label(pipe.components.source)} takes {cfg.text_dim}; they come from another model (re-run "
            "`wanjax encode` with this model)"
        )
    init_name = request.sampling.init_latents
    init = stages.load_latents(init_name) if init_name else None
    identity = {
        "model": model_label(pipe.components.source),
        "revision": revision or request.common.revision,
        "dtype": pipe.components.settings.dtype.name,
    }
    if animate is not None:  # in segments, the VAE decoding each one's last frames for the next
        record = {**identity, **files_record(files)}
        args = (directory, config, (pos, neg), init, animate, mesh, start, record)
        return denoise_animate(request, pipe, cfg, *args)
    batch = pos.shape[0]
    video = resolve_video(pipe, given, earlier, init, batch, init_name, None, references)
    latent_shape = pipe.components.geometry.latent_shape(batch, **video_args(video))
    noised = (
        video["frames"] + references * pipe.components.geometry.temporal
    )  # a latent frame per VACE reference
    noised_shape = pipe.components.geometry.latent_shape(1, video["height"], video["width"], noised)
    if control is not None and control.latents.shape[2:] != noised_shape[2:]:
        raise WanjaxError(
            f"{directory / stages.VACE_FILE}: control latents {list(control.latents.shape)} do not fit the "
            f"video ({video['width']}x{video['height']}, {video['frames']} frames); re-run `wanjax encode`"
        )
    conditioning = stage_image(pipe, cfg, directory, latent_shape)
    source = stage_video(pipe, cfg, directory, latent_shape)
    validation.check_rope(cfg, pipe.components.geometry, video)
    check_devices(mesh, cfg.num_attention_heads)
    check_attention(pipe, cfg)
    params = sampling_params(pipe, request.sampling, video=source is not None)
    first_frame = conditioning is not None and pipe.components.expand_timesteps
    check_cache(request.cache, cfg, params, params["guidance_scale"] > 1, first_frame)
    if init is None:
        init = pipe.prepare_latents(batch, video["height"], video["width"], noised, seed=params["seed"])
    latents = init
    if conditioning is not None:
        conditioning = conditioning.repeat(batch)
    steps = steps_run(params)
    with Status.for_terminal("denoise", steps, request.common.quiet) as status:
        status.header(headline(model_label(pipe.components.source), batch, video, steps))
        denoised = denoise_latents(
            pipe,
            pos,
            neg,
            latents,
            params,
            request.cache,
            conditioning,
            status,
            progress=False,
            video_latents=source,
            vace=control,
            sparse=request.attention.sparse(),
        )
        final = to_host(denoised.latents)
        path = directory / stages.LATENTS_FILE
        status("write", 0)
        if is_primary():
            stages.save_latents(path, final)
        fps = request.video.fps
        entry = {
            **identity,
            **video,
            **({"fps": fps} if fps else {}),
            **params,
            **files_record(files),
            **recorded(request),
        }
        shape = {"batch": batch, **video}
        return finish_denoise(request, pipe, config, entry, params, path, denoised, shape, start)


def stage_vace(pipe: WanPipeline, cfg: TransformerConfig, directory: Path) -> VaceControl | None:
    """The stage directory's VACE control, which a VACE model needs and no other model takes."""
    control = stages.load_vace(directory)
    if cfg.vace and control is None:
        raise WanjaxError(
            f"{directory}: no {stages.VACE_FILE}, and {model_label(pipe.components.source)} is a VACE model; "
            f"run `wanjax encode --model ... --output_dir {directory}` with it first"
        )
    if control is not None and not cfg.vace:
        raise WanjaxError(
            f"{directory / stages.VACE_FILE}: a VACE model's control, but {model_label(pipe.components.source)} is not "
            "one; denoise with the VACE model that encoded it (--model)"
        )
    return control


def stage_video(
    pipe: WanPipeline, cfg: TransformerConfig, directory: Path, latent_shape: tuple[int, ...]
) -> np.ndarray | None:
    """The stage directory's source video latents (video to video), checked against the model and the
    video; None when it holds none."""
    source = stages.load_video_latents(directory)
    if source is not None:
        try:
            check_video_latents(cfg, False, source.shape, latent_shape)
        except WanjaxError as e:
            raise WanjaxError(
                f"{directory / stages.VIDEO_FILE}: {e} ({model_label(pipe.components.source)})"
            ) from None
    return source


def stage_image(
    pipe: WanPipeline, cfg: TransformerConfig, directory: Path, latent_shape: tuple[int, ...]
) -> ImageConditioning | None:
    """The stage directory's image conditioning (one video) when the model takes an image, checked
    against the model and the video; None for a text-to-video model (whose directory must hold none)."""
    path = directory / stages.IMAGE_FILE
    expand = pipe.components.expand_timesteps  # Wan 2.2 TI2V: an image is optional
    if not cfg.image_to_video and not expand:
        if path.exists():
            raise WanjaxError(
                f"{path}: the stage directory holds an image's conditioning but {model_label(pipe.components.source)} "
                "is a text-to-video model; denoise with the image-to-video model that encoded it (--model)"
            )
        return None
    if not path.exists():
        if expand:
            return None
        raise WanjaxError(
            f"{directory}: no {stages.IMAGE_FILE}, and {model_label(pipe.components.source)} is an image-to-video model; "
            f"run `wanjax encode --image IMAGE --output_dir {directory}` first"
        )
    conditioning = dataclasses.replace(stages.load_image_conditioning(directory), first_frame=expand)
    check_conditioning(cfg, conditioning, latent_shape, str(path))
    return conditioning
