"""The server's generation side: one pipeline, opened once, running its jobs.

:class:`Engine` checks a request body the way ``wanjax generate`` checks its flags and runs a job
through the same job (:func:`~wanjax.jobs.generate.check_generate`,
:func:`~wanjax.jobs.generate.run_generate`), so a job's video is the one ``wanjax generate`` writes
for the same values. The pipeline keeps its weights and compiled programs between jobs: a job of a
shape seen before compiles nothing (:class:`RunResult` counts the programs); jobs alike run as one
batch (:meth:`Engine.run_batch`), each job's files its own. The worker
(:mod:`~wanjax.server.worker`) takes queued jobs from the store and runs them here. With several
processes (a pod), process 0 sends each job to the others first (:class:`JobChannel`) and they run
it with it; only process 0 writes.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import io
import json
import logging
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from wanjax.errors import FlagError, WanjaxError, one_line
from wanjax.io.atomic import atomic_path
from wanjax.io.video import write_mp4
from wanjax.io.video_reader import read_frames
from wanjax.jobs.animate_flags import AnimateFlags
from wanjax.jobs.generate import GenerateWork, check_generate, generate_outputs, run_generate
from wanjax.jobs.groups import ImageFlags, LoraFlags, OutputFlags, SourceVideoFlags, VaceFlags
from wanjax.jobs.opening import defaults_of, model_label
from wanjax.jobs.record import finish
from wanjax.jobs.requests import GenerateRequest
from wanjax.models.image_processor import load_image
from wanjax.models.lora import MergedCache, set_key
from wanjax.models.registry import Defaults
from wanjax.parallel.mesh import MeshSpec
from wanjax.pipeline.conditioning import size_for_image
from wanjax.pipeline.inputs import check_video_to_video
from wanjax.pipeline.pipeline import WanPipeline, check_image_input
from wanjax.pipeline.results import Video
from wanjax.runtime.timing import CompileMeter
from wanjax.server.api import (
    ANIMATE_VALUES,
    ANIMATE_VIDEOS,
    IMAGE_FIELDS,
    INPUT_NAMES,
    REFERENCES,
    UPLOADS,
    ApiError,
    Limits,
    api_message,
    check_limits,
    generate_request,
    job_params,
    message_param,
    reference_input,
    upload_names,
)
from wanjax.server.loras import LORA_FIELDS, LoraLibrary

log = logging.getLogger("wanjax.serve")
VIDEOS = "videos"
INPUTS = "inputs"
BATCH_FREE = {"prompt", "seed", "seconds"}  # what may differ between jobs of one batch ("seconds": as asked)
NOT_AN_IMAGE = "not an image Pillow can read (PNG, JPEG, WebP, ...)"
NOT_A_VIDEO = "not a video PyAV can read (MP4, WebM, MOV, ...)"
# an Animate model's videos as pipeline.animate.check_inputs takes them: background and mask in replace mode
ANIMATE_INPUTS = {"pose_video": "required", "face_video": "required", "background_video": "optional",
                  "mask_video": "optional"}  # fmt: skip
FILE_SUFFIXES = {"video": ".mp4", "thumbnail": ".webp", "spritesheet": ".png", "record": ".json"}


@dataclasses.dataclass(frozen=True)
class RunResult:
    """How a job ran: XLA programs compiled (or read from the persistent compilation cache) for it,
    how many of them that cache held (a restarted server's first job of a shape), the seconds that
    took, and the job's wall time."""

    compiled_programs: int
    compile_cache_hits: int
    compile_seconds: float
    run_seconds: float


class Engine:
    """The pipeline and the server's flags; checks request bodies and runs jobs."""

    def __init__(
        self,
        pipe: WanPipeline,
        base: GenerateRequest,
        mesh: MeshSpec | str | None,
        output_dir: str | Path,
        limits: Limits,
        device_memory: int | None = None,
        loras: LoraLibrary | None = None,
        lora_cache: int = 0,
    ) -> None:
        self.pipe, self.base, self.mesh, self.limits = pipe, base, mesh, limits
        self.device_memory = device_memory
        self.loras = loras or LoraLibrary(None)
        self.lora_caches = {field: MergedCache(lora_cache) for field in LORA_FIELDS}  # one per expert
        self._loras_checked: set[tuple[str, str, float]] = set()  # (field, file, mtime) that fit
        self.videos = Path(output_dir) / VIDEOS
        self.inputs = Path(output_dir) / INPUTS
        self.model = model_label(pipe.components.source)
        self.defaults = defaults_of(pipe)

    def accept(self, job_id: str, body: Any) -> dict[str, Any]:
        """A request body as job ``job_id``'s parameters (its images saved as the job's input files),
        after every check a ``generate`` run of it would pass, the server's limits and the memory
        check (ApiError 400 with the CLI's message otherwise; nothing kept); reads no weight."""
        v2v = not self.pipe.components.transformer_config.vace  # a VACE model's video is its control
        params, images = job_params(
            body, self.defaults, self.pipe.components.geometry.temporal, self.model, v2v
        )
        if self.pipe.components.transformer_config.animate and not {"frames", "seconds"} & set(body):
            params["frames"] = None  # generate's: the pose video's, known once it is read
        check_limits(params, self.limits)  # before anything sized by them is built
        self.check_prompts(params)
        self.check_loras(params)
        for name, data in images.items():
            with atomic_path(self.input_files(job_id)[name]) as tmp:
                tmp.write_bytes(data)
        try:
            if params["frames"] is None and params["pose_video"]:
                self.check_pose_frames(job_id, params)
            video = self.work(job_id, params).video
            left = [name for name in ("height", "width", "frames") if params[name] is None]
            params.update({name: video[name] for name in left})  # an image's aspect, a pose video's frames
            check_limits(params, self.limits)
            self.check_memory(params)
        except ApiError:
            self.remove_files(job_id)
            raise
        return params

    def check_pose_frames(self, job_id: str, params: Mapping[str, Any]) -> None:
        """An Animate job without ``frames`` (its pose video's, as ``generate``'s) is within the
        server's limit of frames: ApiError 400 naming the pose video otherwise (read up to one frame
        past the limit; a file that is no video is left to the checks)."""
        limit, fps = self.limits.max_frames, params["fps"]
        try:
            frames = len(read_frames(self.input_files(job_id)["pose_video"], fps, limit + 1))
        except (WanjaxError, OSError):
            return
        if frames > limit:
            raise ApiError(
                400,
                f"pose_video gives more than {limit} frames at {fps:g} fps, over this server's limit of "
                f"{limit}: send frames (at most {limit}: the pose video's first frames) or a shorter pose video",
                param="pose_video",
            )

    def image_inputs(self) -> dict[str, str]:
        """Whether the model's jobs take each upload field (``image``, ``last_image``, a ``video`` to
        re-make, VACE's and Animate's): ``required``, ``optional`` or ``none``, as
        :func:`~wanjax.pipeline.inputs.check_image_input`,
        :func:`~wanjax.pipeline.inputs.check_video_to_video` and Animate's checks decide."""
        cfg = self.pipe.components.transformer_config
        animate = ANIMATE_INPUTS if cfg.animate else dict.fromkeys(ANIMATE_VIDEOS, "none")
        return {**self.frame_inputs(), **animate}

    def frame_inputs(self) -> dict[str, str]:
        """:meth:`image_inputs` but Animate's videos: the frames' and VACE's uploads."""
        cfg, expand = self.pipe.components.transformer_config, self.pipe.components.expand_timesteps

        def takes(image: bool, last_image: bool) -> bool:
            try:
                check_image_input(cfg, image, last_image, self.model, expand)
            except WanjaxError:
                return False
            return True

        if not takes(False, False):
            first = "required"
        else:
            first = "optional" if takes(True, False) or takes(True, True) else "none"
        last = "none" if not takes(True, True) else "optional" if takes(True, False) else "required"
        try:
            check_video_to_video(cfg, False)
        except WanjaxError:
            return {"image": first, "last_image": last, "video": "none", "mask": "none", REFERENCES: "none"}
        vace = "optional" if cfg.vace else "none"
        return {"image": first, "last_image": last, "video": "optional", "mask": vace, REFERENCES: vace}

    def size_presets(self) -> list[str]:
        """``WIDTHxHEIGHT`` sizes of the model's default area: its default, the same turned upright and
        a square (each side a multiple of the model's size step, as an image's aspect is sized), within
        ``--max_pixels``."""
        d, step = self.defaults, self.pipe.components.geometry.pixel_steps[0]
        sizes = [
            size_for_image(aspect, d.width * d.height, step)
            for aspect in ((d.width, d.height), (d.height, d.width), (1, 1))
        ]
        return list(dict.fromkeys(f"{w}x{h}" for h, w in sizes if w * h <= self.limits.max_pixels))

    def check_startup(self) -> None:
        """The server can run its model: a request of the model's defaults passes every check, and
        the largest the limits allow (the default aspect) fits a device (WanjaxError otherwise)."""
        d, limits = self.defaults, self.limits
        frames = min(d.frames, limits.max_frames)
        body = {
            "prompt": "a check of the server's settings",
            "frames": frames,
            "size": f"{d.width}x{d.height}",
        }
        for name, takes in self.image_inputs().items():
            if takes == "required":
                body[name] = base64.b64encode(blank_upload(UPLOADS[name], d, frames)).decode()
        try:
            self.accept("startup-check", body)
        except ApiError as e:
            raise WanjaxError(f"the server cannot serve {self.model} with these flags: {e.message}") from None
        scale = (limits.max_pixels / (d.height * d.width)) ** 0.5
        height, width = (max(16, int(side * scale) // 16 * 16) for side in (d.height, d.width))
        need = self.memory_needed({"height": height, "width": width, "frames": limits.max_frames})
        self.remove_files("startup-check")
        if need is not None:
            raise WanjaxError(
                f"the largest request --max_pixels and --max_frames allow ({width}x{height}, "
                f"{limits.max_frames} frames) {need}; lower them, or use --offload or more devices"
            )

    def check_prompts(self, params: Mapping[str, Any]) -> None:
        """The prompts fit the text encoder's ``--max_sequence_length`` tokens (``generate`` would cut
        the rest with a warning; a server refuses); ApiError 400 otherwise."""
        limit = self.base.text.max_sequence_length
        for name in ("prompt", "negative_prompt"):
            tokens = self._tokenizer.length(params[name])
            if tokens > limit:
                raise ApiError(
                    400,
                    f"{name} is {tokens} tokens; the model reads {limit} (the rest would be dropped): shorten it",
                    param=name,
                )

    @functools.cached_property
    def _tokenizer(self) -> Any:
        """The model's tokenizer, read once (the prompt check reads no weight)."""
        from wanjax.models.tokenizer import TOKENIZER, load_tokenizer

        return load_tokenizer(self.pipe.components.path / TOKENIZER.folder)

    def check_loras(self, params: Mapping[str, Any]) -> None:
        """The job's LoRAs are files of ``--lora_dir`` that fit the model (each file read once while
        unchanged); ApiError 400 otherwise."""
        for field in LORA_FIELDS:
            for path, weight in self.loras.specs(params, field):
                key = (field, str(path), path.stat().st_mtime)
                if key in self._loras_checked:
                    continue
                try:
                    self.pipe.components.check_loras(
                        [(path, weight)], load_into_transformer_2=field == "lora_2"
                    )
                except WanjaxError as e:  # named as the job named it, not by the server's path
                    message = api_message(one_line(e), {f"LoRA {path.stem}": path})
                    raise ApiError(400, f"{field}: {message}", param=field) from None
                self._loras_checked.add(key)

    def use_loras(self, adapters: LoraFlags) -> None:
        """The pipeline's weights with these adapters merged, unless they already are (jobs of one
        LoRA set run back to back: :meth:`JobStore.claim`)."""
        for field, specs in (("lora", adapters.loras()), ("lora_2", adapters.loras_2())):
            current = self.pipe.components.loras_2 if field == "lora_2" else self.pipe.components.loras
            if set_key(specs) != set_key(current):
                self.pipe.set_loras(
                    specs, load_into_transformer_2=field == "lora_2", cache=self.lora_caches[field]
                )

    def check_memory(self, params: Mapping[str, Any]) -> None:
        """``wanjax plan``'s per-device peak of a video of this size fits the device (when its
        memory is known: ``--device_memory`` or the device's own figure); ApiError 400 otherwise."""
        need = self.memory_needed(params)
        if need is not None:
            size = f"{params['width']}x{params['height']}, {params['frames']} frames"
            raise ApiError(400, f"{size} {need}; ask for fewer frames or a smaller size", param="size")

    def memory_needed(self, params: Mapping[str, Any], batch: int = 1) -> str | None:
        """None when ``batch`` videos of this size fit a device by ``wanjax plan``'s estimate (or the
        device's memory is unknown), else what it needs against what there is."""
        if self.device_memory is None:
            return None
        from wanjax.planning.plan import HEADROOM, plan, size_text

        base, mesh = self.base, self.pipe.components.mesh_spec
        estimate = plan(
            self._plan_model,
            mesh if mesh is not None else MeshSpec(),
            height=params["height"],
            width=params["width"],
            frames=params["frames"],
            segment_frame_length=params.get("segment_frame_length"),  # an Animate job's (plan's default)
            device_memory=self.device_memory,
            dtype=self.pipe.components.settings.dtype.name,
            vae_dtype=self.pipe.components.settings.vae_dtype.name,
            offload=base.memory.offload,
            weights_dtype=base.memory.weights_dtype,
            batch=batch,
        )
        if estimate.fits:
            return None
        return (
            f"needs about {size_text(estimate.peak)} a device by wanjax plan's estimate, but a "
            f"device has {size_text(self.device_memory)} ({HEADROOM:.0%} of it usable)"
        )

    @functools.cached_property
    def _plan_model(self) -> Any:
        """The model's configs as ``wanjax plan`` reads them (once, not per request)."""
        from wanjax.planning.models import model_configs

        return model_configs(str(self.pipe.components.path))

    def remove_partial_files(self, job_id: str | None = None) -> None:
        """Temporary files a killed server left half-written (:func:`~wanjax.io.atomic.atomic_path`):
        all of them, or the job ``job_id``'s (replicas share the folder)."""
        pattern = ".*.tmp" if job_id is None else f".{job_id}.*.tmp"
        for path in (*self.videos.glob(pattern), *self.inputs.glob(pattern)):
            path.unlink(missing_ok=True)

    def work(self, job_id: str, params: Mapping[str, Any]) -> GenerateWork:
        """The checked ``generate`` run of a job writing its files (ApiError 400 for a bad value)."""
        files, inputs = self.files(job_id), self.input_files(job_id)
        outputs = OutputFlags(
            output_video=str(files["video"]),
            preview=str(files["spritesheet"]),
            thumbnail=str(files["thumbnail"]),
        )
        images = ImageFlags(
            **{name: str(inputs[name]) if params.get(name) else None for name in IMAGE_FIELDS}
        )
        source = SourceVideoFlags(str(inputs["video"]) if params.get("video") else None)
        references = tuple(str(inputs[reference_input(i)]) for i in range(params.get(REFERENCES, 0)))
        mask = str(inputs["mask"]) if params.get("mask") else None
        vace = VaceFlags(
            mask=mask, reference_image=references, conditioning_scale=params.get("conditioning_scale")
        )
        animate = AnimateFlags(
            **{name: str(inputs[name]) if params.get(name) else None for name in ANIMATE_VIDEOS},
            **{name: params.get(name) for name in ANIMATE_VALUES},
        )
        loras = {field: self.loras.flags(params, field) for field in LORA_FIELDS}
        request = generate_request(self.base, params, images, outputs, source, vace, loras, animate)
        try:
            request.check()
            return check_generate(self.pipe, request, self.mesh)
        except WanjaxError as e:
            unreadable = self.unreadable_upload(one_line(e), job_id, params)
            if unreadable is not None:
                raise unreadable from None
            named = {**inputs, **{f"the job's {kind}": path for kind, path in files.items()}}
            message = api_message(one_line(e), named)
            flag = e.flag if isinstance(e, FlagError) else None
            raise ApiError(400, message, param=message_param(message, flag)) from None

    def unreadable_upload(self, message: str, job_id: str, params: Mapping[str, Any]) -> ApiError | None:
        """The API's one sentence for the upload a failed check's ``message`` names when it is no file
        its field takes (an image Pillow reads; a video PyAV reads; either, for a mask); None when the
        check failed for another reason."""
        inputs, names = self.input_files(job_id), upload_names(params)
        references = sum(name.startswith(f"{REFERENCES}.") for name in names)
        for name in names:
            path = inputs[name]
            if str(path) not in message:
                continue
            field, _, index = name.partition(".")
            if "video" in UPLOADS.get(field, "") and readable(read_frames, path, params["fps"], 1):
                continue
            if readable(load_image, path):
                continue  # an image: the check's own sentence says so (a video field's, or a fine image)
            if field in ANIMATE_VIDEOS:
                sentence = f"{field}: {NOT_A_VIDEO}; send the {field.replace('_', ' ')} as a video file"
            elif field == "video":
                vace = self.pipe.components.transformer_config.vace
                what = "the control video" if vace else "the video to re-make"
                sentence = f"video: {NOT_A_VIDEO}; send {what} as a video file"
            elif field == "mask":
                either = f"{NOT_AN_IMAGE.removeprefix('not ')} nor {NOT_A_VIDEO.removeprefix('not ')}"
                sentence = f"mask: neither {either}; send the mask as an image or a video file"
            elif field == REFERENCES:
                sentence = (
                    f"{field}: image {int(index) + 1} of {references} is {NOT_AN_IMAGE}; send each "
                    "reference image as an image file"
                )
            else:
                frame = "the first frame" if field == "image" else "the last frame"
                sentence = f"{field}: {NOT_AN_IMAGE}; send {frame} as an image file"
            return ApiError(400, sentence, param=field)
        return None

    def files(self, job_id: str) -> dict[str, Path]:
        """A job's files by kind: ``video`` (mp4), ``thumbnail`` (the first frame, WebP), ``spritesheet``
        (PNG contact sheet), ``record`` (JSON)."""
        return {kind: self.videos / f"{job_id}{suffix}" for kind, suffix in FILE_SUFFIXES.items()}

    def job_message(self, job_id: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """What the other processes of a multi-process server need to run a job (they may be on
        other hosts): its parameters and its uploads (base64)."""
        files = self.input_files(job_id)
        images = {name: base64.b64encode(files[name].read_bytes()).decode() for name in upload_names(params)}
        return {"id": job_id, "params": dict(params), "images": images}

    def input_files(self, job_id: str) -> dict[str, Path]:
        """A job's uploads (images, a video, a mask, reference images) as sent, by name
        (:data:`~wanjax.server.api.INPUT_NAMES`)."""
        return {name: self.inputs / f"{job_id}.{name}" for name in INPUT_NAMES}

    def remove_files(self, job_id: str) -> None:
        """A job's outputs and inputs."""
        for path in (*self.files(job_id).values(), *self.input_files(job_id).values()):
            path.unlink(missing_ok=True)

    def run(
        self, job_id: str, params: Mapping[str, Any], on_progress: Callable[[str, int], None]
    ) -> RunResult:
        """Run a job and write its files (atomically; process 0 only)."""
        return self.run_batch({job_id: self.work(job_id, params)}, on_progress)[job_id]

    def run_batch(
        self,
        works: Mapping[str, GenerateWork],
        on_progress: Callable[[str, int], None],
        wanted: Callable[[str], bool] = lambda job_id: True,
    ) -> dict[str, RunResult]:
        """Run jobs of one :meth:`batch_key` as one batch (each prompt from its own seed's noise, as
        when it runs alone), then write the files and record of each job still ``wanted`` as its own
        run's (atomically; process 0 only)."""
        start = time.perf_counter()
        ids = list(works)
        first = works[ids[0]]
        self.use_loras(first.request.adapters)
        batch = first
        if len(ids) > 1:
            prompts = [works[job_id].prompts[0] for job_id in ids]
            batch = dataclasses.replace(
                first, prompts=prompts, seeds=tuple(works[i].params["seed"] for i in ids)
            )
        with CompileMeter() as meter:
            video = run_generate(self.pipe, batch, on_progress)
            reports = {
                job_id: generate_outputs(self.pipe, works[job_id], item(video, i, len(ids)))
                for i, job_id in enumerate(ids)
                if wanted(job_id)
            }
        wall = round(time.perf_counter() - start, 3)
        result = RunResult(meter.programs, meter.cache_hits, round(meter.seconds, 3), wall)
        for job_id, report in reports.items():
            together = {"batch": ids} if len(ids) > 1 else {}
            report.extra["server"] = {"job": job_id, **together, **dataclasses.asdict(result)}
            finish(report, works[job_id].request, start, self.files(job_id)["record"])
        return dict.fromkeys(reports, result)

    def batch_key(self, params: Mapping[str, Any]) -> str | None:
        """Jobs of one key may run as one batch: the same values but their prompt and seed, no upload,
        a sampler that draws no noise of its own (its draws would be the batch's) and no step cache
        (its skips are decided for the whole batch); None: the job runs alone."""
        if upload_names(params) or self.base.cache.cache != "off" or self.draws_noise(params):
            return None
        return json.dumps({k: v for k, v in params.items() if k not in BATCH_FREE}, sort_keys=True)

    def draws_noise(self, params: Mapping[str, Any]) -> bool:
        """The job's sampler (``--scheduler``'s, or the model's) draws fresh noise at its steps."""
        kind = self.base.sampling.scheduler or "auto"
        return self.pipe.components.build_scheduler(params["num_inference_steps"], kind=kind).draws_noise

    def batch_that_fits(self, params: Mapping[str, Any], most: int) -> int:
        """The largest batch of jobs like this one, up to ``most``, that fits a device by ``wanjax
        plan``'s estimate (``most`` where the device's memory is unknown; at least 1)."""
        fits = [n for n in range(2, most + 1) if self.memory_needed(params, n) is None]
        return max(fits, default=1)


class JobChannel:
    """Process 0 tells the other processes of a multi-process server each job (and the stop) through
    ``jax.distributed``'s key-value store; they wait for the next one without holding a device."""

    PREFIX = "wanjax/serve/job/"

    def __init__(self) -> None:
        from jax._src.distributed import global_state  # the coordination service's client

        self._client = global_state.client
        self._next = 0

    def send(self, message: Mapping[str, Any] | None) -> None:
        """The next job (``{"id", "params"}``), or None: stop."""
        self._client.key_value_set(f"{self.PREFIX}{self._next}", json.dumps(message))
        self._next += 1

    def receive(self) -> dict[str, Any] | None:
        """Wait for process 0's next message."""
        import jax

        key = f"{self.PREFIX}{self._next}"
        while True:
            try:
                text = self._client.blocking_key_value_get(key, 60_000)
                break
            except jax.errors.JaxRuntimeError as e:
                if "DEADLINE_EXCEEDED" not in str(e):
                    raise
        self._next += 1
        return json.loads(text)


def follow(engine: Engine, channel: JobChannel) -> None:
    """A process other than 0: run each job process 0 sends (its images in a folder of this process
    for the run: process 0 owns ``--output_dir``), until it says stop."""
    engine.inputs = Path(tempfile.mkdtemp(prefix="wanjax-serve-inputs-"))
    while (message := channel.receive()) is not None:
        job_id = message["id"]
        try:
            for name, data in message["images"].items():
                with atomic_path(engine.input_files(job_id)[name]) as tmp:
                    tmp.write_bytes(base64.b64decode(data))
            engine.run(job_id, message["params"], lambda stage, done: None)
        except Exception:  # process 0 records the failure; keep following
            log.error("job %s failed here:\n%s", job_id, traceback.format_exc())
        finally:
            for path in engine.input_files(job_id).values():
                path.unlink(missing_ok=True)


def blank_upload(kind: str, defaults: Defaults, frames: int) -> bytes:
    """A grey file of an upload's ``kind`` (:data:`~wanjax.server.api.UPLOADS`) at the model's default
    size: a PNG, or an mp4 of ``frames`` frames at its fps (the start-up check's required inputs)."""
    size = (defaults.height, defaults.width)
    if kind == "a video":
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "blank.mp4"
            write_mp4(np.full((frames, *size, 3), 128, np.uint8), path, fps=defaults.fps)
            return path.read_bytes()
    blank = io.BytesIO()
    Image.new("RGB", size[::-1], (128, 128, 128)).save(blank, format="PNG")
    return blank.getvalue()


def readable(read: Callable[..., Any], *args: Any) -> bool:
    """``read(*args)`` reads the file (no WanjaxError)."""
    try:
        read(*args)
    except WanjaxError:
        return False
    return True


def item(video: Video, index: int, batch: int) -> Video:
    """Batch item ``index`` of a run's video (the run's denoising and timings shared)."""
    if batch == 1:
        return video
    return Video(video.frames[index : index + 1], video.denoised, video.timings)
