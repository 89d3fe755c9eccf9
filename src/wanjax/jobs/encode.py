"""The ``encode`` job, stage 1: prompts -> ``stage1_embeddings.safetensors`` (and, with an image, its
conditioning -> ``stage1_image.safetensors``; with a video to re-make, its latents ->
``stage1_video.safetensors``; an Animate model's inputs -> ``stage1_animate.safetensors``:
:mod:`wanjax.jobs.animate_stages`) in a stage directory (:mod:`wanjax.pipeline.stages`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from wanjax.errors import WanjaxError
from wanjax.jobs.animate import open_animate_inputs
from wanjax.jobs.animate_stages import encode_animate
from wanjax.jobs.checks import (
    check_devices,
    check_output_paths,
    open_images,
    open_source_video,
    open_vace_inputs,
    prompt_list,
    resolve_video,
)
from wanjax.jobs.opening import begin, defaults_of, files_record, mesh_request, model_label, open_pipeline
from wanjax.jobs.record import (
    finish,
    image_record,
    make_report,
    prompt_record,
    recorded,
    source_record,
    vace_record,
)
from wanjax.jobs.requests import EncodeRequest
from wanjax.jobs.sampling import video_args
from wanjax.jobs.status import ENCODE_WORK, Status
from wanjax.parallel.layouts import to_host
from wanjax.parallel.multihost import is_primary
from wanjax.pipeline import preparation, stages
from wanjax.pipeline.prompts import negative_prompt
from wanjax.runtime.timing import RunReport


def encode(request: EncodeRequest) -> RunReport:
    """Stage 1: prompts -> ``stage1_embeddings.safetensors``; with ``--image``, also the image
    conditioning -> ``stage1_image.safetensors``, with ``--video`` the video's latents ->
    ``stage1_video.safetensors`` (the video's size is then fixed here)."""
    start = begin(request.parallel)
    out = Path(request.output_dir)
    image_file = out / stages.IMAGE_FILE if request.images.image else None
    video_file = out / stages.VIDEO_FILE if request.source.video else None
    check_output_paths(
        request,
        **{"--output_dir": out / stages.EMBEDDINGS_FILE, "--image": image_file, "--video": video_file},
    )
    mesh, fsdp = mesh_request(request.parallel)
    pipe = open_pipeline(request, mesh, fsdp)
    pipe.components.sources.check(("tokenizer", "text_encoder"))
    cfg = pipe.components.transformer_config
    if request.vace.extending or request.vace.overlap is not None:
        raise WanjaxError(
            "--extend, --clips and --overlap make a long video in `wanjax generate`; the stages make one clip"
        )
    if cfg.animate:
        return encode_animate(request, pipe, mesh, start)
    fps = request.video.fps or defaults_of(pipe).fps
    open_animate_inputs(pipe, request, cfg, fps, None)  # none given: not an Animate model
    source = open_source_video(
        pipe, request.source, pipe.components.transformer_config, fps, request.video.frames
    )
    image, last_image = open_images(pipe, request.images, pipe.components.transformer_config)
    check_devices(mesh, None)
    given = {k: v for k, v in dataclasses.asdict(request.video).items() if v is not None}
    prompts = prompt_list(request.text)
    if source is not None:  # the source latents fix the video's size
        given = {**given, "frames": len(source)}
        given = {**given, **resolve_video(pipe, given, {}, None, len(prompts), None, source[0])}
    elif image is not None:  # the conditioning latents fix the video's size
        given = {**given, **resolve_video(pipe, given, {}, None, len(prompts), None, image)}
    elif cfg.vace:  # the control latents fix the video's size
        given = {**given, **resolve_video(pipe, given, {}, None, len(prompts), None, None)}
    elif {"height", "width", "frames"} & given.keys():
        defaults = dataclasses.asdict(defaults_of(pipe))
        pipe.components.geometry.check(*(given.get(k, defaults[k]) for k in ("height", "width", "frames")))
    vace = open_vace_inputs(pipe, request.vace, cfg, given.get("frames", 0), fps)  # None: not VACE
    negative = negative_prompt(request.text.negative_prompt)
    length = request.text.max_sequence_length
    with Status.for_terminal("encode", 0, request.common.quiet, ENCODE_WORK) as status:
        given_input = (
            ", an image" if image is not None else ", a video to re-make" if source is not None else ""
        )
        status.header(
            f"model {model_label(pipe.components.source)}, {len(prompts)} prompt{'s' * (len(prompts) > 1)}{given_input}"
        )
        status("encode", 0)
        pos, neg = (to_host(e) for e in pipe.encode_prompt(prompts, [negative] * len(prompts), length))
        conditioning = video_latents = control = None
        if image is not None:
            status("image", 0)
            conditioning = preparation.image_conditioning(
                pipe.components, image, 1, **video_args(given), last_image=last_image
            )
            conditioning = jax_tree_to_host(conditioning)
        if vace is not None:
            status("vace", 0)
            args = (
                source,
                vace.masks,
                vace.references,
                given["height"],
                given["width"],
                given["frames"],
                vace.scale,
            )
            control = jax_tree_to_host(preparation.vace_control(pipe.components, *args))
        elif source is not None:
            status("video", 0)
            video_latents = preparation.video_latents(
                pipe.components, source, given["height"], given["width"]
            )
        status("write", 0)
        path = out / stages.EMBEDDINGS_FILE
        if is_primary():
            stages.save_embeddings(out, pos, neg)
            stages.save_image_conditioning(out, conditioning)
            stages.save_video_latents(out, video_latents)
            stages.save_vace(out, control)
            stages.save_animate(out, None)
        params = {
            **prompt_record(pipe, request, prompts, negative, length),
            **(image_record(request.images) if image is not None else {}),
            **(source_record(request.source) if source is not None else {}),
            **(vace_record(request.vace) if vace is not None else {}),
            **({"reference_frames": len(vace.references), "conditioning_scale": vace.scale} if vace else {}),
            **given,
            **files_record(request.files),
            **recorded(request),
        }
        if is_primary():
            stages.write_config(out, stages.record_stage({}, "encode", params))
        shape = {"batch": int(pos.shape[0]), "tokens": int(pos.shape[1]), "text_dim": int(pos.shape[2])}
        outputs = {
            "embeddings": str(path),
            **({"image": str(image_file)} if image_file else {}),
            **({"video": str(video_file)} if video_file and control is None else {}),
            **({"vace": str(out / stages.VACE_FILE)} if control is not None else {}),
        }
        return finish(make_report("encode", pipe, shape, outputs), request, start)


def jax_tree_to_host(tree: Any) -> Any:
    """Every array of ``tree`` as a NumPy array on this host (gathered from a mesh)."""
    import jax

    return jax.tree.map(to_host, tree)
