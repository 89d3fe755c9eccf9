"""The ``generate`` job: prompt to mp4 in one process, the three stages in memory.

:func:`check_generate` decides every value of a run before any work; :func:`run_generate` runs it and
:func:`generate_outputs` writes its files. ``wanjax generate`` (:func:`generate`) and ``wanjax serve``
both run these, so a server's job makes the video the command line makes for the same values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from wanjax.errors import WanjaxError
from wanjax.jobs import preflight as validation
from wanjax.jobs.animate import AnimateInputs, animate_video, open_animate_inputs, run_animate
from wanjax.jobs.checks import (
    check_attention,
    check_cache,
    check_devices,
    check_output_paths,
    check_vae_tiling,
    open_images,
    open_source_video,
    open_vace_inputs,
    prompt_list,
    resolve_video,
)
from wanjax.jobs.opening import begin, defaults_of, mesh_request, model_label, open_pipeline
from wanjax.jobs.outputs import clip_infos, fresh_video_name, video_record, with_output_video, write_outputs
from wanjax.jobs.record import finish, image_record, make_report, source_record, vace_record
from wanjax.jobs.requests import GenerateRequest
from wanjax.jobs.sampling import cache_outputs, denoise_latents, sampling_params, steps_run, video_args
from wanjax.jobs.status import Status, headline
from wanjax.parallel.mesh import MeshSpec
from wanjax.pipeline import preparation, stages
from wanjax.pipeline.pipeline import WanPipeline
from wanjax.pipeline.prompts import negative_prompt
from wanjax.pipeline.results import Video
from wanjax.planning.models import model_configs
from wanjax.planning.run_memory import check_fits
from wanjax.runtime.timing import RunReport, StageTiming, StepTimes

if TYPE_CHECKING:
    from PIL import Image

    from wanjax.jobs.checks import VaceInputs


def generate(
    request: GenerateRequest, preflight: Callable[[WanPipeline, GenerateWork], None] | None = None
) -> RunReport:
    """Prompt to mp4 in one process; ``preflight(pipe, work)`` checks the checked run before any
    weight is read (the command line's: :func:`fits_memory_here`)."""
    start = begin(request.parallel)
    request = with_output_video(request, fresh_video_name())
    record = video_record(request)
    check_output_paths(request, **{"--metrics_json": record})
    mesh, fsdp = mesh_request(request.parallel)
    pipe = open_pipeline(request, mesh, fsdp)
    work = check_generate(pipe, request, mesh)
    if preflight is not None:
        preflight(pipe, work)
    frames = (
        0 if work.extension else pipe.components.geometry.latent_frames(work.video["frames"])
    )  # clips: inside
    with Status.for_terminal(
        "generate", steps_run(work.params), request.common.quiet, frames=frames
    ) as status:
        status.header(work.headline(pipe))
        video = run_generate(pipe, work, status, count_frames=status.in_place)
        status("write", 0)
        return finish(generate_outputs(pipe, work, video), request, start, record)


def fits_memory_here(pipe: WanPipeline, work: GenerateWork) -> None:
    """WanjaxError in one line when ``plan`` says the checked run cannot fit the memory here, naming a
    flag that makes it fit (:func:`~wanjax.planning.run_memory.check_fits`). A CPU's devices share one
    RAM: the whole run's bytes count; an accelerator's: one device's share on the run's mesh."""
    request = work.request
    arguments: dict[str, Any] = {
        "height": work.video["height"],
        "width": work.video["width"],
        "frames": work.video["frames"],
        # an Animate run: one segment at a time (plan adds the reference's latent frame)
        "segment_frame_length": None if work.animate is None else work.animate.segments.length,
        "dtype": pipe.components.settings.dtype.name,
        "vae_dtype": pipe.components.settings.vae_dtype.name,
        "batch": work.batch,
        "cfg": work.params["guidance_scale"] > 1,
        "max_sequence_length": request.text.max_sequence_length,
        "offload": request.memory.offload,
        "weights_dtype": request.memory.weights_dtype,
    }
    mesh = MeshSpec() if jax.devices()[0].platform == "cpu" else pipe.components.mesh_spec or MeshSpec()
    check_fits(model_configs(str(pipe.components.path), request.files.given()), mesh, arguments)


@dataclasses.dataclass(frozen=True)
class GenerateWork:
    """A ``generate`` request checked against its model: every value the run uses, decided before
    any work (``wanjax generate`` and ``wanjax serve`` both run these)."""

    request: GenerateRequest
    prompts: list[str]
    negative: str
    video: dict[str, int]
    params: dict[str, Any]
    fps: float
    image: Image.Image | None = None
    last_image: Image.Image | None = None
    init: np.ndarray | None = None
    source: list[Image.Image] | None = None  # video to video: the frames re-made (VACE: the control video)
    vace: VaceInputs | None = None  # a VACE model's mask, references and weight
    extension: Extending | None = None  # a long video made clip by clip
    seeds: tuple[int, ...] | None = None  # one per prompt (a server's batch of jobs), else seed + i
    animate: AnimateInputs | None = None  # an Animate model's mode, videos and segments

    @property
    def batch(self) -> int:
        """Videos made: one per prompt, or one long video whose clips take the prompts in turn."""
        return 1 if self.extension is not None else len(self.prompts)

    def headline(self, pipe: WanPipeline) -> str:
        """What the run makes, in one line (see :func:`wanjax.jobs.status.headline`); a long video's
        frames in all, and its clips."""
        e, label, steps = self.extension, model_label(pipe.components.source), steps_run(self.params)
        if e is None:
            return headline(label, self.batch, self.video, steps)
        frames = self.video["frames"]
        given = 0 if e.video is None else len(e.video)
        total = (given or frames) + (e.clips - (0 if given else 1)) * (frames - e.overlap)
        line = headline(label, 1, {**self.video, "frames": total}, steps)
        return (
            f"{line} per clip, in {e.clips} clips of {frames} frames ({e.overlap} shared with the one before)"
        )

    def described(self, pipe: WanPipeline) -> dict[str, Any]:
        """The run's parameters as its videos' metadata records them."""
        return {
            "model": model_label(pipe.components.source),
            "negative_prompt": self.negative,
            **(image_record(self.request.images) if self.image is not None else {}),
            **(source_record(self.request.source) if self.source is not None else {}),
            **(vace_record(self.request.vace) if self.vace is not None else {}),
            **self.video,
            "fps": self.fps,
            **self.params,
        }


def check_generate(pipe: WanPipeline, request: GenerateRequest, mesh: MeshSpec | str | None) -> GenerateWork:
    """Every check of a ``generate`` request against the pipeline's model (one-line WanjaxError), and
    the values the run will use; reads no weight."""
    configs = pipe.components.sources.check(("tokenizer", "text_encoder", "transformer", "vae"))
    check_vae_tiling(pipe)
    fps = request.video.fps or defaults_of(pipe).fps
    source = open_source_video(pipe, request.source, configs["transformer"], fps, request.video.frames)
    image, last_image = open_images(pipe, request.images, configs["transformer"])
    init_name = request.sampling.init_latents
    init = stages.load_latents(init_name) if init_name else None
    prompts = batch_prompts(prompt_list(request.text), None if init is None else init.shape[0])
    given = dataclasses.asdict(request.video) | ({} if source is None else {"frames": len(source)})
    shaped_by = image if source is None else source[0]  # what the size left out keeps the aspect of
    extension = check_extension(pipe, request, configs["transformer"], fps, prompts, init)
    if extension is not None and extension.video is not None:
        shaped_by = extension.video[0]
    references = len(request.vace.reference_image) if configs["transformer"].vace else 0
    animate = open_animate_inputs(pipe, request, configs["transformer"], fps, init)
    if animate is None:
        video = resolve_video(pipe, given, {}, init, len(prompts), init_name, shaped_by, references)
        rope_video = video
    else:  # the pose video's frames, made in segments of a latent frame more (the reference's)
        video = animate_video(pipe, request, animate)
        temporal = pipe.components.geometry.temporal
        rope_video = {**video, "frames": animate.segments.length + temporal}
        pipe.components.geometry.check(video["height"], video["width"], animate.segments.length)
    if extension is not None and extension.overlap >= video["frames"]:
        raise WanjaxError(f"--overlap {extension.overlap} must be under the clip's {video['frames']} frames")
    vace = open_vace_inputs(pipe, request.vace, configs["transformer"], video["frames"], fps)
    validation.check_rope(configs["transformer"], pipe.components.geometry, rope_video)
    check_devices(mesh, configs["transformer"].num_attention_heads)
    check_attention(pipe, configs["transformer"])
    params = sampling_params(pipe, request.sampling, video=source is not None and vace is None)
    if vace is not None:
        params["conditioning_scale"] = vace.scale
    first_frame = image is not None and pipe.components.expand_timesteps
    check_cache(request.cache, configs["transformer"], params, params["guidance_scale"] > 1, first_frame)
    return GenerateWork(
        request,
        prompts,
        negative_prompt(request.text.negative_prompt),
        video,
        params,
        fps,
        image,
        last_image,
        init,
        source,
        vace,
        extension,
        animate=animate,
    )


@dataclasses.dataclass(frozen=True)
class Extending:
    """A long video made clip by clip on a VACE model (:mod:`wanjax.pipeline.extension`): the video
    continued (None: from the first prompt), the clips and the frames each shares with the video so far."""

    video: list[Image.Image] | None
    clips: int
    overlap: int


def check_extension(
    pipe: WanPipeline, request: GenerateRequest, cfg: Any, fps: float, prompts: list[str], init: Any
) -> Extending | None:
    """``--extend``/``--clips``/``--overlap`` checked (one-line WanjaxError): a VACE model, no control of
    the user's beside them, a prompt or one per clip; the video to continue read at ``fps``."""
    from wanjax.pipeline.extension import OVERLAP
    from wanjax.pipeline.video_input import video_frames

    flags = request.vace
    if not flags.extending:
        if flags.overlap is not None:
            raise WanjaxError("--overlap is for --extend or --clips")
        return None
    if not cfg.vace:
        raise WanjaxError(
            f"--extend and --clips continue a video with a VACE model's control; {model_label(pipe.components.source)} is not one"
        )
    if request.source.video or flags.mask or flags.reference_image:
        raise WanjaxError(
            "--extend and --clips make each clip's control; leave --video, --mask and --reference_image out"
        )
    if init is not None:
        raise WanjaxError("--init_latents is one clip's noise; leave it out with --extend or --clips")
    clips = flags.clips or 1
    if len(prompts) not in (1, clips):
        raise WanjaxError(f"{len(prompts)} prompts for {clips} clips: give one, or one per clip")
    frames = None
    if flags.extend is not None:
        if not Path(flags.extend).is_file():
            raise WanjaxError(f"--extend {flags.extend}: file not found")
        try:
            frames = video_frames(flags.extend, fps, 1 << 30)
        except WanjaxError as e:
            raise WanjaxError(f"--extend: {e}") from None
    return Extending(frames, clips, flags.overlap or OVERLAP)


def run_generate(
    pipe: WanPipeline,
    work: GenerateWork,
    on_progress: Callable[[str, int], None] | None = None,
    count_frames: bool = False,
) -> Video:
    """The three stages of a checked request in memory: uint8 frames ``[B, T, H, W, 3]``, as
    ``WanPipeline.__call__`` returns them.
    ``on_progress(stage, steps_done)`` is called as each stage starts and after each denoising step
    (without it, the denoising bar shows on a terminal); with ``count_frames`` also after each part
    of the decode, with the latent frames decoded (the decode then runs in parts)."""
    report = on_progress or (lambda stage, done: None)
    pipe.components.timings.clear()
    if work.extension is not None:
        return run_extension(pipe, work, report)
    if work.animate is not None:
        return run_animate(pipe, work, report)
    report("encode", 0)
    batch = work.batch
    pos, neg = pipe.encode_prompt(
        work.prompts, [work.negative] * batch, work.request.text.max_sequence_length
    )
    conditioning = source = vace = None
    if work.image is not None:
        conditioning = preparation.image_conditioning(
            pipe.components, work.image, batch, **video_args(work.video), last_image=work.last_image
        )
    height, width, frames = work.video["height"], work.video["width"], work.video["frames"]
    references = 0
    if work.vace is not None:
        inputs = work.vace
        vace = preparation.vace_control(
            pipe.components, work.source, inputs.masks, inputs.references, height, width, frames, inputs.scale
        )
        references = len(inputs.references)
    elif work.source is not None:
        source = preparation.video_latents(pipe.components, work.source, height, width)
    latents = work.init
    if latents is None:  # a VACE model's references: a latent frame each, before the video's
        noised = frames + references * pipe.components.geometry.temporal
        if work.seeds is None:
            latents = pipe.prepare_latents(batch, height, width, noised, seed=work.params["seed"])
        else:  # each item from its own seed's noise, as when it runs alone
            items = [pipe.prepare_latents(1, height, width, noised, seed=seed) for seed in work.seeds]
            latents = jnp.concatenate(items)
    denoised = denoise_latents(
        pipe,
        pos,
        neg,
        latents,
        work.params,
        work.request.cache,
        conditioning,
        report,
        on_progress is None,
        video_latents=source,
        vace=vace,
        sparse=work.request.attention.sparse(),
    )
    report("decode", steps_run(work.params))
    on_frames = (lambda done: report("decode", done)) if count_frames else None
    frames = pipe.decode(denoised.latents[:, :, references:], on_frames=on_frames)
    return Video(frames, denoised, pipe.timings_so_far())


def run_extension(pipe: WanPipeline, work: GenerateWork, report: Callable[[str, int], None]) -> Video:
    """A long video's clips in turn (:meth:`WanPipeline.extend`), each reported as it starts and step
    by step: its frames, the last clip's denoising with every clip's steps, the clips' timings summed."""
    e, params = work.extension, work.params
    assert e is not None and work.vace is not None

    steps = steps_run(params)

    def step(done: int) -> None:
        if done == 1:  # the clip's steps start (its prompt is encoded)
            report("denoise", 0)
        report("denoise", done)
        if done == steps:  # the clip's decode follows
            report("decode", 0)

    out = pipe.extend(
        work.prompts if len(work.prompts) > 1 else work.prompts[0],
        e.video,
        clips=e.clips,
        overlap=e.overlap,
        num_frames=work.video["frames"],
        height=work.video["height"],
        width=work.video["width"],
        fps=work.fps,
        seed=params["seed"],
        negative_prompt=work.negative,
        num_inference_steps=params["num_inference_steps"],
        guidance_scale=params["guidance_scale"],
        flow_shift=params["flow_shift"],
        scheduler=params["scheduler"],
        max_sequence_length=work.request.text.max_sequence_length,
        conditioning_scale=work.vace.scale,
        progress=False,
        on_clip=lambda i: report(f"clip {i + 1}/{e.clips}", 0),
        on_step=step,
    )
    timings: dict[str, StageTiming] = {}
    for clip in out.clips:
        for stage, t in clip.timings.items():
            timings[stage] = timings.get(stage, StageTiming()) + t
    joined = StepTimes.joined([clip.denoised.step_times for clip in out.clips])
    denoised = dataclasses.replace(out.clips[-1].denoised, step_times=joined)
    return Video(out.frames, denoised, timings, out.report())


def generate_outputs(pipe: WanPipeline, work: GenerateWork, video: Video) -> RunReport:
    """Write a generate run's videos (and frames, previews: process 0) and its report (not yet
    finished: :func:`finish`)."""
    request, batch = work.request, work.batch
    clips = clip_infos(batch, work.prompts, work.described(pipe))
    outputs = write_outputs(video.frames, request.outputs, work.fps, clips)
    size = {"batch": batch, **work.video, "frames": int(video.frames.shape[1]), "fps": work.fps}
    report = make_report("generate", pipe, size, outputs, video.denoised, video.timings)
    report.extra.update(sampling=work.params, prompts=work.prompts, negative_prompt=work.negative)
    cache_outputs(report, video.denoised, request.cache)
    if video.clips:  # a long video: what each clip compiled (the first, all) and how it continued
        report.extra["clips"] = video.clips
    return report


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
