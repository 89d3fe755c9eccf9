"""What each ``wanjax`` subcommand does with its request (:mod:`wanjax.cli.requests`).

``generate`` runs the three stages in memory; ``encode``, ``denoise`` and ``decode`` run one each and
pass their results through the files of a stage directory (:mod:`wanjax.pipeline.stages`). Both paths
call the same :class:`~wanjax.pipeline.pipeline.WanPipeline` methods on the same values, so they give
the same frames. Each ends with a :class:`~wanjax.runtime.timing.RunReport` recording the request's
flags and the run's environment (``info`` and ``plan`` are in :mod:`wanjax.cli.describe`).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from wanjax.cli import preflight as validation
from wanjax.cli.outputs import clip_infos, fresh_video_name, record_file, write_outputs
from wanjax.cli.requests import (
    DEFAULT_DTYPE,
    DEFAULT_MODEL,
    OUTPUT_SUFFIXES,
    AttentionFlags,
    CacheFlags,
    CommonFlags,
    DecodeRequest,
    DenoiseRequest,
    EncodeRequest,
    GenerateRequest,
    ImageFlags,
    LoraFlags,
    MemoryFlags,
    ParallelFlags,
    PipelineRequest,
    PromptFlags,
    Request,
    SamplingFlags,
    VaeFlags,
)
from wanjax.errors import ConfigError, WanjaxError
from wanjax.io.atomic import write_text
from wanjax.kernels.attention import AttentionSpec, resolve_backend
from wanjax.kernels.common import check_block
from wanjax.models.config import TransformerConfig
from wanjax.models.registry import Defaults
from wanjax.parallel.layouts import to_host
from wanjax.parallel.mesh import MeshSpec, mesh_spec_from_flags, parse_mesh
from wanjax.parallel.multihost import initialize, is_primary
from wanjax.pipeline import stages
from wanjax.pipeline.components import IMAGE_COMPONENTS
from wanjax.pipeline.conditioning import check_image_size, open_image
from wanjax.pipeline.demo import demo_variants
from wanjax.pipeline.hub import ModelSource
from wanjax.pipeline.inputs import check_conditioning, check_image_input
from wanjax.pipeline.pipeline import WanPipeline
from wanjax.pipeline.prompts import negative_prompt, read_prompt_file
from wanjax.pipeline.step_cache import resolve as resolve_cache
from wanjax.runtime.environment import environment
from wanjax.runtime.timing import RunReport

if TYPE_CHECKING:
    from PIL import Image

    from wanjax.pipeline.sampler import ImageConditioning

STAGE_COMPONENTS = {"encode": "text_encoder", "denoise": "transformer", "decode": "vae"}
Writing = TypeVar("Writing", GenerateRequest, DecodeRequest)  # the commands that write videos


# ----------------------------------------------------------------------------------------------
# Shared pieces


def begin(parallel: ParallelFlags) -> float:
    """Join the other processes of a multi-process run (before anything touches a device); the
    start time of the run."""
    initialize(parallel.coordinator_address, parallel.num_processes, parallel.process_id)
    return time.perf_counter()


def model_label(source: ModelSource) -> str:
    """How a model is recorded in stage configs: ``demo``, a hub id, or an absolute path."""
    if source.is_demo and source.name in demo_variants():
        return source.name
    return source.name if not Path(source.name).exists() else str(Path(source.name).resolve())


def open_pipeline(
    common: CommonFlags,
    model: str | None,
    dtype: str | None,
    mesh: MeshSpec | str | None,
    fsdp: bool,
    *,
    precision: str | None = None,
    revision: str | None = None,
    memory: MemoryFlags = MemoryFlags(),  # noqa: B008 (frozen)
    vae: VaeFlags = VaeFlags(),  # noqa: B008 (frozen)
    attention: AttentionFlags = AttentionFlags(),  # noqa: B008 (frozen)
    adapters: LoraFlags = LoraFlags(),  # noqa: B008 (frozen)
) -> WanPipeline:
    """The pipeline of ``model`` (a hub model at ``revision``, else ``--revision``); its LoRAs are read
    and checked against the transformer's config here, before any weight."""
    from wanjax.models.vae import Tiling

    return WanPipeline.from_pretrained(
        model or DEFAULT_MODEL,
        dtype or DEFAULT_DTYPE,
        vae_dtype=vae.vae_dtype,
        vae_weights_dtype=vae.vae_weights_dtype,
        precision=precision,
        vae_precision=vae.vae_precision,
        vae_decode_chunk=vae.vae_decode_chunk,
        vae_tiling=Tiling.parse(vae.vae_tiling) if vae.vae_tiling else None,
        attention_backend=attention_spec(attention),
        # the CLI opts in to the compilation cache (the library leaves jax.config alone unless asked)
        jax_cache_dir=common.jax_cache_dir if common.jax_cache_dir is not None else True,
        mesh=mesh,
        fsdp=fsdp,
        revision=revision or common.revision,
        download=common.download,
        offload=memory.offload,
        weights_dtype=memory.weights_dtype,
        loras=adapters.loras(),
        loras_2=adapters.loras_2(),
    )


def attention_spec(flags: AttentionFlags) -> AttentionSpec:
    """The attention backend and options, checked against this platform now (an unavailable
    backend fails before any weight is read)."""
    spec = AttentionSpec(
        flags.backend,
        block_q=flags.bqsize,
        block_kv=flags.bkvsize,
        block_kv_compute=flags.bkvcomputesize,
        block_kv_compute_in=flags.bkvcomputeinsize,
        k_smooth=flags.use_k_smooth,
        window_size=flags.window_size,
    )
    resolve_backend(spec.backend)
    for name, value in flags.blocks().items():
        check_block(name, value)
    return spec


def mesh_request(parallel: ParallelFlags) -> tuple[MeshSpec | str | None, bool]:
    """``(mesh, fsdp)`` from ``--mesh`` or the reference's aliases; ``auto`` when more than one device
    is visible and nothing is said, one device otherwise."""
    import jax

    mesh, fsdp = parallel.mesh, parallel.use_fsdp
    if parallel.use_dp or parallel.sp_num:
        spec = mesh_spec_from_flags(mesh, jax.device_count(), use_dp=parallel.use_dp, sp_num=parallel.sp_num)
        return spec, fsdp
    if mesh is None:
        return ("auto" if jax.device_count() > 1 or fsdp else None), fsdp
    return (mesh if mesh == "auto" else parse_mesh(mesh)), fsdp  # a bad string fails now, before any work


def check_devices(mesh: MeshSpec | str | None, heads: int | None) -> None:
    """The requested mesh fits the visible devices (and splits the heads), before any weight is read."""
    import jax

    validation.check_mesh(mesh, jax.device_count(), heads)


def check_attention(pipe: WanPipeline, cfg: TransformerConfig) -> None:
    """The attention backend can run the transformer's attention in this dtype, before any work."""
    from wanjax.kernels.attention import check_backend
    from wanjax.models.dit import attention_shapes

    spec = pipe.attention_backend
    window = spec.window_size if isinstance(spec, AttentionSpec) else None
    check_backend(spec, attention_shapes(cfg, pipe.dtype, window))


def check_output_paths(request: Request, **more: str | Path | None) -> None:
    """Every file the command will write can be written (checked before any work)."""
    flags = request.flags()
    outputs = {f"--{key}": flags.get(key) for key in (*OUTPUT_SUFFIXES, "metrics_json")}
    validation.check_outputs({**outputs, **more})
    validation.check_distinct({**outputs, **more})


def video_record(request: Writing) -> Path:
    """The JSON record a video-writing run leaves (``--output_video`` must be resolved)."""
    return record_file(request.outputs.output_video, request.common.metrics_json)


def check_vae_tiling(pipe: WanPipeline) -> None:
    """``--vae_tiling`` against the VAE's config (read without weights), before any work."""
    if pipe.vae_tiling is not None:
        try:
            pipe.vae_tiling.check_stride(pipe.geometry.spatial)
        except ConfigError as e:
            raise ConfigError(f"--vae_tiling {e}") from None


def resolve_video(
    pipe: WanPipeline,
    given: Mapping[str, Any],
    earlier: Mapping[str, Any],
    init: np.ndarray | None,
    batch: int,
    init_name: str | None,
    image: Image.Image | None = None,
) -> dict[str, int]:
    """Height, width and frames: flag > earlier stage > ``--init_latents`` shape > (height and width)
    the ``--image``'s aspect at the model's default area > model default; checked against the init
    latents' shape when there are some."""
    from_init = pipe.geometry.video_size(init.shape) if init is not None else {}
    defaults = defaults_of(pipe)
    video: dict[str, int] = {}
    for key in ("height", "width", "frames"):
        for source in (given, earlier, from_init):
            if source.get(key) is not None:
                video[key] = int(source[key])
                break
    if image is not None and not {"height", "width"} <= video.keys():
        area = defaults.height * defaults.width
        video["height"], video["width"] = pipe.video_size(
            image, video.get("height"), video.get("width"), area
        )
    video = {key: video.get(key, getattr(defaults, key)) for key in ("height", "width", "frames")}
    expected = pipe.geometry.latent_shape(batch, video["height"], video["width"], video["frames"])
    if init is not None and tuple(init.shape) != expected:
        raise WanjaxError(
            f"--init_latents {init_name} has shape {list(init.shape)} but {batch} prompt(s) at "
            f"{video['width']}x{video['height']}, {video['frames']} frames need {list(expected)}"
        )
    return video


def defaults_of(pipe: WanPipeline) -> Defaults:
    """The video and sampling defaults of the pipeline's model (the registry's, as the Python API's)."""
    return pipe.defaults


def open_images(
    pipe: WanPipeline, flags: ImageFlags, cfg: TransformerConfig
) -> tuple[Image.Image | None, Image.Image | None]:
    """``--image`` and ``--last_image`` opened, after checking that the model takes them (and, when it
    does, that its image components are sound); one-line errors for unreadable or too small images."""
    given = (flags.image is not None, flags.last_image is not None)
    check_image_input(cfg, *given, model_label(pipe.source), pipe.expand_timesteps)
    if flags.image is None:
        return None, None
    validation.check_model(pipe.path, (*IMAGE_COMPONENTS, "vae") if cfg.image_tokens else ("vae",))
    step = pipe.geometry.pixel_steps[0]
    opened = []
    for name in ("image", "last_image"):
        path = getattr(flags, name)
        if path is None:
            opened.append(None)
            continue
        try:
            image = open_image(path)
        except WanjaxError as e:
            raise WanjaxError(f"--{name} {e}") from None
        check_image_size(image, step, f"--{name} {path}")
        opened.append(image)
    return opened[0], opened[1]


def image_record(flags: ImageFlags) -> dict[str, str | None]:
    """The images of a run as a stage config and a video's metadata record them: absolute paths."""
    return {
        name: None if (path := getattr(flags, name)) is None else str(Path(path).resolve())
        for name in ("image", "last_image")
    }


def with_output_video(request: Writing, default: str) -> Writing:
    """``request`` with ``--output_video`` resolved (``default`` when left out)."""
    outputs = dataclasses.replace(request.outputs, output_video=request.outputs.output_video or default)
    return dataclasses.replace(request, outputs=outputs)


def recorded(request: PipelineRequest) -> dict[str, Any]:
    """What every stage config records of its run: the arguments and the environment."""
    return {"arguments": request.arguments(), "environment": environment()}


def finish(
    report: RunReport, request: PipelineRequest, start: float, record: Path | None = None, show: bool = True
) -> RunReport:
    """Complete the report, print it (unless ``show`` is False) and write it as JSON to ``record``
    (default ``--metrics_json``; process 0 only)."""
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
    if not is_primary():
        return report
    if record is not None:
        report.write_json(record)
    if show:
        print(report.table())
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
        extra={
            "dtype": str(pipe.dtype),
            "precision": {s: pipe.precisions[c] for s, c in STAGE_COMPONENTS.items() if s in order},
            **({"mesh": pipe.mesh_usage} if pipe.mesh_usage else {}),
            **({"expert_steps": pipe.expert_steps} if pipe.boundary_ratio is not None else {}),
        },
    )


# ----------------------------------------------------------------------------------------------
# Pipeline commands


def cmd_generate(request: GenerateRequest) -> RunReport:
    """Prompt to mp4 in one process."""
    start = begin(request.parallel)
    request = with_output_video(request, fresh_video_name())
    record = video_record(request)
    check_output_paths(request, **{"--metrics_json": record})
    mesh, fsdp = mesh_request(request.parallel)
    pipe = open_generate_pipeline(request, mesh, fsdp)
    work = check_generate(pipe, request, mesh)
    frames = run_generate(pipe, work)
    return finish(generate_outputs(pipe, work, frames), request, start, record)


def open_generate_pipeline(request: GenerateRequest, mesh: MeshSpec | str | None, fsdp: bool) -> WanPipeline:
    """The pipeline a ``generate`` request runs on (no weight is read yet)."""
    return open_pipeline(
        request.common,
        request.common.model,
        request.dtype,
        mesh,
        fsdp,
        precision=request.precision,
        memory=request.memory,
        vae=request.vae,
        attention=request.attention,
        adapters=request.adapters,
    )


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

    @property
    def batch(self) -> int:
        return len(self.prompts)

    def described(self, pipe: WanPipeline) -> dict[str, Any]:
        """The run's parameters as its videos' metadata records them."""
        return {
            "model": model_label(pipe.source),
            "negative_prompt": self.negative,
            **(image_record(self.request.images) if self.image is not None else {}),
            **self.video,
            "fps": self.fps,
            **self.params,
        }


def check_generate(pipe: WanPipeline, request: GenerateRequest, mesh: MeshSpec | str | None) -> GenerateWork:
    """Every check of a ``generate`` request against the pipeline's model (one-line WanjaxError), and
    the values the run will use; reads no weight."""
    configs = validation.check_model(pipe.path, ("tokenizer", "text_encoder", "transformer", "vae"))
    image, last_image = open_images(pipe, request.images, configs["transformer"])
    check_vae_tiling(pipe)
    init_name = request.sampling.init_latents
    init = stages.load_latents(init_name) if init_name else None
    prompts = batch_prompts(prompt_list(request.text), None if init is None else init.shape[0])
    video = resolve_video(pipe, dataclasses.asdict(request.video), {}, init, len(prompts), init_name, image)
    validation.check_rope(configs["transformer"], pipe.geometry, video)
    check_devices(mesh, configs["transformer"].num_attention_heads)
    check_attention(pipe, configs["transformer"])
    params = sampling_params(pipe, request.sampling)
    first_frame = image is not None and pipe.expand_timesteps
    check_cache(request.cache, configs["transformer"], params, params["guidance_scale"] > 1, first_frame)
    return GenerateWork(
        request,
        prompts,
        negative_prompt(request.text.negative_prompt),
        video,
        params,
        request.video.fps or defaults_of(pipe).fps,
        image,
        last_image,
        init,
    )


def run_generate(
    pipe: WanPipeline, work: GenerateWork, on_progress: Callable[[str, int], None] | None = None
) -> np.ndarray:
    """The three stages of a checked request in memory: uint8 frames ``[B, T, H, W, 3]``.
    ``on_progress(stage, steps_done)`` is called as each stage starts and after each denoising step."""
    report = on_progress or (lambda stage, done: None)
    pipe.reset_timings()
    report("encode", 0)
    batch = work.batch
    pos, neg = pipe.encode_prompt(
        work.prompts, [work.negative] * batch, work.request.text.max_sequence_length
    )
    conditioning = None
    if work.image is not None:
        conditioning = pipe.prepare_image(
            work.image, batch, **video_args(work.video), last_image=work.last_image
        )
    latents = work.init
    if latents is None:
        latents = pipe.prepare_latents(batch, **video_args(work.video), seed=work.params["seed"])
    report("denoise", 0)
    on_step = lambda done: report("denoise", done)  # noqa: E731
    final = denoise(pipe, pos, neg, latents, work.params, work.request.cache, conditioning, on_step)
    report("decode", work.params["num_inference_steps"])
    return pipe.decode(final)


def generate_outputs(pipe: WanPipeline, work: GenerateWork, frames: np.ndarray) -> RunReport:
    """Write a generate run's videos (and frames, previews: process 0) and its report (not yet
    finished: :func:`finish`)."""
    request, batch = work.request, work.batch
    clips = clip_infos(batch, work.prompts, work.described(pipe))
    outputs = write_outputs(frames, request.outputs, work.fps, clips)
    report = make_report("generate", pipe, {"batch": batch, **work.video, "fps": work.fps}, outputs)
    report.extra.update(sampling=work.params, prompts=work.prompts, negative_prompt=work.negative)
    cache_outputs(report, pipe, request.cache)
    return report


def prompt_list(text: PromptFlags) -> list[str]:
    """The prompts of this run: ``--prompt_file``'s (see :func:`read_prompt_file`) or the ``--prompt`` values."""
    if not text.prompt_file:
        return list(text.prompt)
    try:
        return read_prompt_file(text.prompt_file)
    except WanjaxError as e:
        raise WanjaxError(f"--prompt_file {e}") from None


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


def cmd_encode(request: EncodeRequest) -> RunReport:
    """Stage 1: prompts -> ``stage1_embeddings.safetensors``; with ``--image``, also the image
    conditioning -> ``stage1_image.safetensors`` (the video's size is then fixed here)."""
    start = begin(request.parallel)
    out = Path(request.output_dir)
    image_file = out / stages.IMAGE_FILE if request.images.image else None
    check_output_paths(request, **{"--output_dir": out / stages.EMBEDDINGS_FILE, "--image": image_file})
    mesh, fsdp = mesh_request(request.parallel)
    pipe = open_pipeline(
        request.common,
        request.common.model,
        request.dtype,
        mesh,
        fsdp,
        precision=request.precision,
        memory=request.memory,
        vae=request.vae,
    )
    validation.check_model(pipe.path, ("tokenizer", "text_encoder"))
    image, last_image = open_images(pipe, request.images, pipe.transformer_config)
    check_devices(mesh, None)
    given = {k: v for k, v in dataclasses.asdict(request.video).items() if v is not None}
    prompts = prompt_list(request.text)
    if image is not None:  # the conditioning latents fix the video's size
        given = {**given, **resolve_video(pipe, given, {}, None, len(prompts), None, image)}
    elif {"height", "width", "frames"} & given.keys():
        defaults = dataclasses.asdict(defaults_of(pipe))
        pipe.geometry.check(*(given.get(k, defaults[k]) for k in ("height", "width", "frames")))
    negative = negative_prompt(request.text.negative_prompt)
    length = request.text.max_sequence_length
    pos, neg = (to_host(e) for e in pipe.encode_prompt(prompts, [negative] * len(prompts), length))
    conditioning = None
    if image is not None:
        conditioning = pipe.prepare_image(image, 1, **video_args(given), last_image=last_image)
        conditioning = jax_tree_to_host(conditioning)
    path = out / stages.EMBEDDINGS_FILE
    if is_primary():
        stages.save_embeddings(out, pos, neg)
        stages.save_image_conditioning(out, conditioning)
    params = {
        "model": model_label(pipe.source),
        "revision": request.common.revision,
        "dtype": pipe.text_encoder_dtype.name,
        "prompt": prompts[0] if len(prompts) == 1 else prompts,
        "negative_prompt": negative,
        "max_sequence_length": length,
        **(image_record(request.images) if image is not None else {}),
        **given,
        **recorded(request),
    }
    if is_primary():
        stages.write_config(out, stages.record_stage({}, "encode", params))
    shape = {"batch": int(pos.shape[0]), "tokens": int(pos.shape[1]), "text_dim": int(pos.shape[2])}
    outputs = {"embeddings": str(path), **({"image": str(image_file)} if image_file else {})}
    return finish(make_report("encode", pipe, shape, outputs), request, start)


def jax_tree_to_host(tree: Any) -> Any:
    """Every array of ``tree`` as a NumPy array on this host (gathered from a mesh)."""
    import jax

    return jax.tree.map(to_host, tree)


def cmd_denoise(request: DenoiseRequest) -> RunReport:
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
    pipe = open_pipeline(
        request.common,
        model,
        dtype,
        mesh,
        fsdp,
        precision=request.precision,
        revision=revision,
        memory=request.memory,
        attention=request.attention,
        adapters=request.adapters,
    )
    cfg = validation.check_model(pipe.path, ("transformer",))["transformer"]
    if pos.shape[2] != cfg.text_dim:
        raise WanjaxError(
            f"{directory / stages.EMBEDDINGS_FILE}: embeddings of width {pos.shape[2]} but the transformer of "
            f"{model_label(pipe.source)} takes {cfg.text_dim}; they come from another model (re-run "
            "`wanjax encode` with this model)"
        )
    init_name = request.sampling.init_latents
    init = stages.load_latents(init_name) if init_name else None
    batch = pos.shape[0]
    video = resolve_video(pipe, given, earlier, init, batch, init_name)
    conditioning = stage_image(pipe, cfg, directory, pipe.geometry.latent_shape(batch, **video_args(video)))
    validation.check_rope(cfg, pipe.geometry, video)
    check_devices(mesh, cfg.num_attention_heads)
    check_attention(pipe, cfg)
    params = sampling_params(pipe, request.sampling)
    first_frame = conditioning is not None and pipe.expand_timesteps
    check_cache(request.cache, cfg, params, params["guidance_scale"] > 1, first_frame)
    latents = (
        init if init is not None else pipe.prepare_latents(batch, **video_args(video), seed=params["seed"])
    )
    if conditioning is not None:
        conditioning = conditioning.repeat(batch)
    final = to_host(denoise(pipe, pos, neg, latents, params, request.cache, conditioning))
    path = directory / stages.LATENTS_FILE
    if is_primary():
        stages.save_latents(path, final)
    fps = request.video.fps
    entry = {
        "model": model_label(pipe.source),
        "revision": revision or request.common.revision,
        "dtype": pipe.dtype.name,
        **video,
        **({"fps": fps} if fps else {}),
        **params,
        **recorded(request),
    }
    if is_primary():
        stages.write_config(directory, stages.record_stage(config, "denoise", entry))
    report = make_report("denoise", pipe, {"batch": batch, **video}, {"latents": str(path)})
    report.extra["sampling"] = params
    cache_outputs(report, pipe, request.cache)
    return finish(report, request, start)


def stage_image(
    pipe: WanPipeline, cfg: TransformerConfig, directory: Path, latent_shape: tuple[int, ...]
) -> ImageConditioning | None:
    """The stage directory's image conditioning (one video) when the model takes an image, checked
    against the model and the video; None for a text-to-video model (whose directory must hold none)."""
    path = directory / stages.IMAGE_FILE
    expand = pipe.expand_timesteps  # Wan 2.2 TI2V: an image is optional
    if not cfg.image_to_video and not expand:
        if path.exists():
            raise WanjaxError(
                f"{path}: the stage directory holds an image's conditioning but {model_label(pipe.source)} "
                "is a text-to-video model; denoise with the image-to-video model that encoded it (--model)"
            )
        return None
    if not path.exists():
        if expand:
            return None
        raise WanjaxError(
            f"{directory}: no {stages.IMAGE_FILE}, and {model_label(pipe.source)} is an image-to-video model; "
            f"run `wanjax encode --image IMAGE --output_dir {directory}` first"
        )
    conditioning = dataclasses.replace(stages.load_image_conditioning(directory), first_frame=expand)
    check_conditioning(cfg, conditioning, latent_shape, str(path))
    return conditioning


def cmd_decode(request: DecodeRequest) -> RunReport:
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
    mesh, fsdp = mesh_request(request.parallel)
    model = request.common.model or earlier.get("model")
    revision = None if request.common.model else earlier.get("revision")
    pipe = open_pipeline(request.common, model, None, mesh, fsdp, revision=revision, vae=request.vae)
    vae_cfg = validation.check_model(pipe.path, ("vae",))["vae"]
    check_vae_tiling(pipe)
    if latents.shape[1] != vae_cfg.z_dim:
        raise WanjaxError(
            f"{latents_path}: latents have {latents.shape[1]} channels but the VAE of "
            f"{model_label(pipe.source)} decodes {vae_cfg.z_dim}; they come from another model"
        )
    check_devices(mesh, None)
    size = pipe.geometry.video_size(latents.shape)
    given = dataclasses.asdict(request.video)
    for key in ("height", "width", "frames"):
        if given[key] is not None and given[key] != size[key]:
            raise WanjaxError(
                f"--{key} {given[key]} contradicts {latents_path} (latents {list(latents.shape)} decode to "
                f"{size['frames']} frames of {size['width']}x{size['height']}); leave --{key} out"
            )
    frames = pipe.decode(latents)
    fps = request.video.fps or earlier.get("fps") or defaults_of(pipe).fps
    batch = latents.shape[0]
    described = {**earlier, **size, "fps": fps}
    outputs = write_outputs(frames, request.outputs, fps, clip_infos(batch, earlier.get("prompt"), described))
    entry = {
        "model": model_label(pipe.source),
        "revision": revision or request.common.revision,
        "vae_dtype": pipe.vae_dtype.name,
        "vae_weights_dtype": pipe.vae_weights_dtype.name,
        "fps": fps,
        "output_video": request.outputs.output_video,
        "frames_out": request.outputs.frames_out,
        "preview": request.outputs.preview,
        "written": outputs,
        **recorded(request),
    }
    if is_primary():
        stages.write_config(directory, stages.record_stage(config, "decode", entry))
    return finish(
        make_report("decode", pipe, {"batch": batch, **size, "fps": fps}, outputs), request, start, record
    )


# ----------------------------------------------------------------------------------------------
# Denoising parameters


def sampling_params(pipe: WanPipeline, sampling: SamplingFlags) -> dict[str, Any]:
    """Steps, guidance, the scheduler and its flow shift (as the scheduler the run builds says: the
    checkpoint's, or the distill sampler's, unless given), seed (None with init latents); the flags'
    values were checked when the request was built."""
    from wanjax.pipeline.scheduler import make_scheduler

    defaults = defaults_of(pipe)
    init = sampling.init_latents
    steps = _given_or(sampling.num_inference_steps, defaults.num_inference_steps)
    kind = sampling.scheduler or "auto"
    scheduler = make_scheduler(pipe.path, steps, sampling.flow_shift, kind=kind)
    experts = {}
    if pipe.boundary_ratio is not None:  # two experts: the switch and the second guidance
        experts = {
            "boundary_ratio": _given_or(sampling.boundary_ratio, pipe.boundary_ratio),
            "guidance_scale_2": sampling.guidance_scale_2,
        }
    elif sampling.boundary_ratio is not None or sampling.guidance_scale_2 is not None:
        raise WanjaxError(
            f"--boundary_ratio and --guidance_scale_2 are for two-expert models (Wan 2.2 A14B); "
            f"{model_label(pipe.source)} has one transformer"
        )
    return {
        "num_inference_steps": steps,
        "guidance_scale": _given_or(sampling.guidance_scale, defaults.guidance_scale),
        **experts,
        "scheduler": kind if kind != "auto" else scheduler.kind,
        "flow_shift": float(scheduler.config.flow_shift),
        "seed": None if init else _given_or(sampling.seed, defaults.seed),
        "init_latents": str(Path(init).resolve()) if init else None,
    }


def _given_or(value: Any, default: Any) -> Any:
    return value if value is not None else default


def video_args(video: Mapping[str, int]) -> dict[str, int]:
    return {"height": video["height"], "width": video["width"], "num_frames": video["frames"]}


def denoise(
    pipe: WanPipeline,
    pos: Any,
    neg: Any,
    latents: Any,
    params: Mapping[str, Any],
    cache: CacheFlags,
    image: ImageConditioning | None = None,
    on_step: Callable[[int], None] | None = None,
) -> Any:
    """The pipeline's denoise with these parameters, step cache and image conditioning; with
    ``--cache_calibrate`` the measured MagCache ratios are written there (process 0, atomically)."""
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
    )
    report = pipe.cache_report
    if cache.cache_calibrate and report is not None and is_primary():
        write_text(cache.cache_calibrate, json.dumps(report.ratios, indent=1) + "\n")
    return out


def check_cache(
    cache: CacheFlags, cfg: TransformerConfig, params: Mapping[str, Any], guided: bool, first_frame: bool
) -> None:
    """The step cache resolves for this model and run (a MagCache curve exists for it) before any
    work; ``first_frame``: an image is the run's first latent frame (TI2V)."""
    steps = params["num_inference_steps"]
    experts = [0] * steps if "boundary_ratio" in params else None  # the curve is what is checked here
    try:
        resolve_cache(cache.config(), cfg, steps, guided, experts, first_frame)
    except ConfigError as e:
        raise ConfigError(f"--cache {cache.cache}: {e}") from None


def cache_outputs(report: RunReport, pipe: WanPipeline, cache: CacheFlags) -> None:
    """The step cache's decisions in the run's record, and the calibration file among its outputs."""
    if pipe.cache_report is not None:
        report.extra["cache"] = pipe.cache_report.as_json()
    if cache.cache_calibrate:
        report.outputs["mag_ratios"] = cache.cache_calibrate
