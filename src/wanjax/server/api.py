"""The HTTP API's values: a request body read into a job's parameters, a job as an OpenAI-style video
object, and errors as JSON.

A body's fields are checked for type here, then turned into the :class:`GenerateRequest` the command
line would build for the same values (:func:`generate_request`), so the server runs the CLI's own
checks (:func:`~wanjax.jobs.requests.check_flags`, :func:`~wanjax.jobs.generate.check_generate`)
and its messages, with flag names given as the API's field names.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from wanjax.io.video import fps_problem
from wanjax.jobs.animate_flags import AnimateFlags
from wanjax.jobs.groups import ImageFlags, LoraFlags, OutputFlags, SourceVideoFlags, VaceFlags, VideoFlags
from wanjax.jobs.requests import GenerateRequest
from wanjax.models.registry import Defaults
from wanjax.pipeline.animate import VIDEO_INPUTS as ANIMATE_VIDEOS
from wanjax.pipeline.options import RunOptions
from wanjax.server.errors import ApiError
from wanjax.server.loras import LORA_FIELDS, lora_entries
from wanjax.server.store import Job

SIZE = re.compile(r"([0-9]{1,5})x([0-9]{1,5})")  # fullmatch: ASCII digits, nothing around them
SURROGATE = re.compile(r"[\ud800-\udfff]")  # lone: a str holds a pair as one astral character
DATA_URL = re.compile(r"^data:(?:image|video)/[\w.+-]+;base64,")
NUMBER_FIELDS = {"fps", "guidance_scale", "seconds", "strength", "conditioning_scale"}
ANIMATE_VALUES = ("mode", "segment_frame_length", "prev_segment_conditioning_frames")  # an Animate model's
INT_FIELDS = {"frames", "num_inference_steps", "seed", *ANIMATE_VALUES[1:]}
IMAGE_FIELDS = ("image", "last_image")
UPLOADS = {
    "image": "an image",
    "last_image": "an image",
    "video": "a video",
    "mask": "an image or a video",
    **dict.fromkeys(ANIMATE_VIDEOS, "a video"),
}  # saved as the job's input files
REFERENCES = "reference_images"  # a VACE model's: a list of images, each saved as an input file
MAX_REFERENCES = 4
TEXT_FIELDS = {"prompt", "negative_prompt", "size", "model", ANIMATE_VALUES[0], *UPLOADS}
LIST_FIELDS = {REFERENCES}
REFERENCES_KIND = f"a list of up to {MAX_REFERENCES} images"


def reference_input(i: int) -> str:
    """The input file name of a job's reference image ``i``."""
    return f"{REFERENCES}.{i}"


INPUT_NAMES = (*UPLOADS, *map(reference_input, range(MAX_REFERENCES)))  # a job's input files


def upload_names(params: Mapping[str, Any]) -> list[str]:
    """The input files a job holds: its uploads, and each reference image (:func:`reference_input`)."""
    return [n for n in UPLOADS if params.get(n)] + [
        reference_input(i) for i in range(params.get(REFERENCES, 0))
    ]


REMIX_FIELDS = {
    *LORA_FIELDS,
    "prompt",
    "negative_prompt",
    "num_inference_steps",
    "guidance_scale",
    "seed",
    "strength",
    "model",
}
FIELDS = NUMBER_FIELDS | INT_FIELDS | TEXT_FIELDS | LIST_FIELDS | set(LORA_FIELDS)
OPENAI_NAMES = {"input_reference": "image", "input_reference[image_url]": "image"}  # the first frame


@dataclasses.dataclass(frozen=True)
class Limits:
    """The largest request the server accepts (``--max_frames``, ``--max_pixels``, ``--max_steps``) and
    its queue and body limits."""

    max_frames: int
    max_pixels: int
    max_steps: int
    max_queue: int
    max_body_bytes: int


def job_params(
    body: Any, defaults: Defaults, temporal: int, model: str, video_to_video: bool = True
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A request body's fields checked for type, with the model's defaults for those left out:
    ``prompt, negative_prompt, width, height, frames, fps, num_inference_steps, guidance_scale, seed``,
    ``image``/``last_image``/``video`` (whether given), ``strength`` (a video's: the model's default
    when left out; None without a video); and the uploads' bytes by field. ``seconds`` becomes
    the nearest frame count the VAE takes (``temporal * n + 1``). Without ``size``, a job with an image
    or a video leaves ``width``/``height`` None: its aspect decides (as ``generate --image``)."""
    if not isinstance(body, dict):
        raise ApiError(400, 'the body must be a JSON object, e.g. {"prompt": "a cat on the grass"}')
    if isinstance(body.get("seconds"), str):  # OpenAI's type: "4"
        body = {**body, "seconds": parse_number("seconds", body["seconds"])}
    for name in body:
        if name not in FIELDS:
            raise ApiError(
                400, f"unknown field {name!r}; the fields are {', '.join(sorted(FIELDS))}", param=name
            )
    loras = {name: lora_entries(name, body[name]) for name in LORA_FIELDS if name in body}
    for name, value in body.items():
        if name in LORA_FIELDS:
            continue
        _check_type(name, value)
        for text in value if isinstance(value, list) else [value]:
            if isinstance(text, str):
                _check_text(name, text)
    if body.get("model") not in (None, model):
        raise ApiError(400, f"this server runs the model {model!r}, not {body['model']!r}", param="model")
    prompt = body.get("prompt")
    if prompt is None or not prompt.strip():
        raise ApiError(400, "'prompt' is required: what the video shows", param="prompt")
    uploads = {name: decode_upload(name, body[name]) for name in UPLOADS if name in body}
    for i, value in enumerate(body.get(REFERENCES, ())):  # each its own input file
        uploads[reference_input(i)] = decode_upload(REFERENCES, value)
    width, height = (None, None) if uploads else (defaults.width, defaults.height)
    if "size" in body:
        match = SIZE.fullmatch(body["size"])
        if not match:
            raise ApiError(400, f'size {body["size"]!r} must be WIDTHxHEIGHT, e.g. "832x480"', param="size")
        width, height = int(match[1]), int(match[2])
    to_video = "video" in uploads and video_to_video
    given = RunOptions(
        num_frames=body.get("frames"),
        num_inference_steps=body.get("num_inference_steps"),
        guidance_scale=body.get("guidance_scale"),
        seed=body.get("seed"),
        strength=body.get("strength"),
        fps=body.get("fps"),
    )
    filled = given.filled(defaults, video=to_video)
    fps = float(filled.fps)
    if problem := fps_problem(fps):
        raise ApiError(400, f"fps {problem}", param="fps")
    if "frames" in body and "seconds" in body:
        raise ApiError(400, "give frames or seconds, not both", param="seconds")
    frames = filled.num_frames
    if "seconds" in body:
        seconds = body["seconds"]
        if not (math.isfinite(seconds * fps) and seconds > 0):
            raise ApiError(
                400, f"seconds must be a positive number of reasonable size, got {seconds}", param="seconds"
            )
        frames = temporal * max(round(seconds * fps / temporal), 0) + 1
    requested = {"seconds": float(body["seconds"])} if "seconds" in body else {}
    params = {
        "prompt": prompt,
        "negative_prompt": body.get("negative_prompt", ""),
        "width": width,
        "height": height,
        "frames": frames,
        "fps": fps,
        "num_inference_steps": filled.num_inference_steps,
        "guidance_scale": float(filled.guidance_scale),
        "seed": filled.seed,
        **{name: name in uploads for name in UPLOADS},
        REFERENCES: len(body.get(REFERENCES, ())),
        "conditioning_scale": body.get("conditioning_scale"),
        **{name: body.get(name) for name in ANIMATE_VALUES},
        "strength": float(filled.strength) if to_video else filled.strength,
        **requested,  # echoed as asked (the video object's ``seconds``)
        **{name: entries for name, entries in loras.items() if entries},  # on top of the server's
    }
    return params, uploads


def animate_values(defaults: Defaults) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """An Animate model's values in ``GET /v1/server``: the segments' defaults, and the values
    ``mode`` and ``prev_segment_conditioning_frames`` take (the first mode the default)."""
    from wanjax.pipeline.animate import MODES, PREV_SEGMENT_FRAMES

    segments = {name: getattr(defaults, name) for name in ANIMATE_VALUES[1:]}
    return segments, {"mode": list(MODES), "prev_segment_conditioning_frames": list(PREV_SEGMENT_FRAMES)}


def remix_body(source: Job, body: Any, video: bytes) -> dict[str, Any]:
    """The create body of a remix of the completed job ``source`` (OpenAI's ``POST
    /v1/videos/{id}/remix``): its video (``video``, the mp4's bytes) re-made with the new ``prompt``
    at the source's size, frames and fps, and its other values unless the body changes them."""
    if not isinstance(body, dict):
        raise ApiError(400, 'the body must be a JSON object, e.g. {"prompt": "the same scene at night"}')
    for name in body:
        if name not in REMIX_FIELDS:
            raise ApiError(
                400,
                f"{name!r} is not a remix field (a remix keeps the video's size, frames and fps); the "
                f"fields are {', '.join(sorted(REMIX_FIELDS))}",
                param=name,
            )
    if "prompt" not in body:
        raise ApiError(400, "'prompt' is required: what the remixed video shows", param="prompt")
    p = source.params
    kept = ("negative_prompt", "frames", "fps", "num_inference_steps", "guidance_scale", "seed", *LORA_FIELDS)
    return {
        **{k: p[k] for k in kept if k in p},
        "size": f"{p['width']}x{p['height']}",
        **body,
        "video": video,
    }


def steps_run(params: Mapping[str, Any]) -> int:
    """The denoising steps a job runs (a video's strength runs the last ones only)."""
    from wanjax.sampling.scheduler.strength import steps_run as run

    return run(params["num_inference_steps"], params.get("strength") if params.get("video") else None)


def form_body(items: Iterable[tuple[str, str | bytes]]) -> tuple[dict[str, Any], dict[str, str]]:
    """A ``multipart/form-data`` request (what OpenAI's SDK sends) as the JSON body it stands for: the
    numbers parsed from their text, a file as an image field's bytes, OpenAI's ``input_reference``
    (a file, or ``input_reference[image_url]``) as ``image``; ``reference_images`` repeated, as a list.
    With it, the fields the form sent by OpenAI's names (``{"image": "input_reference"}``: see
    :func:`as_sent`)."""
    body: dict[str, Any] = {}
    sent_as: dict[str, str] = {}
    for sent, value in items:
        name = OPENAI_NAMES.get(sent, sent)
        if name != sent:
            sent_as[name] = sent
        if name in LIST_FIELDS:
            body.setdefault(name, []).append(value)
            continue
        if name in body:
            raise ApiError(400, f"{name} is given twice", param=name)
        numeric = name in INT_FIELDS or name in NUMBER_FIELDS
        body[name] = (
            parse_number(name, value, name in INT_FIELDS) if numeric and isinstance(value, str) else value
        )
    return body, sent_as


def as_sent(error: ApiError, sent_as: Mapping[str, str]) -> ApiError:
    """``error`` naming its field as the client sent it (``sent_as``: :func:`form_body`'s), e.g.
    ``input_reference: ...`` for a form's first frame, not the ``image`` it stands for."""
    sent = sent_as.get(error.param or "")
    if sent is None:
        return error
    message = re.sub(rf"^('?){re.escape(error.param or '')}\b", lambda m: m[1] + sent, error.message)
    return dataclasses.replace(error, message=message, param=sent)


INTEGER_TEXT = re.compile(r"[+-]?[0-9]+")
NUMBER_TEXT = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


def parse_number(name: str, text: str, integer: bool = False) -> int | float:
    """A number field sent as text (multipart, or OpenAI's ``"seconds": "4"``): ASCII digits only, as
    JSON writes numbers (no spaces, underscores, other scripts' digits, inf or nan)."""
    if not (INTEGER_TEXT if integer else NUMBER_TEXT).fullmatch(text):
        raise ApiError(
            400, f"{name} must be {'an integer' if integer else 'a number'}, got {text!r}", param=name
        )
    return int(text) if integer else float(text)


def decode_upload(name: str, value: str | bytes) -> bytes:
    """An upload field's bytes: an uploaded file's, or base64, bare or as a ``data:image/...;base64,``
    (``data:video/...``) URL."""
    if isinstance(value, bytes):
        if not value:
            raise ApiError(400, f"{name} is an empty file", param=name)
        return value
    text = value
    try:
        data = base64.b64decode(DATA_URL.sub("", text, count=1), validate=True)
    except (binascii.Error, ValueError):
        data = b""
    if not data:
        what = {**UPLOADS, REFERENCES: "an image"}[name]  # reference_images: each an image
        raise ApiError(
            400,
            f"{name} must be {what} file in base64 (or a data:{what.split()[1]}/...;base64, URL)",
            param=name,
        )
    return data


def _check_type(name: str, value: Any) -> None:
    kinds = {
        "a string": TEXT_FIELDS,
        "an integer": INT_FIELDS,
        "a number": NUMBER_FIELDS,
        REFERENCES_KIND: LIST_FIELDS,
    }
    expected = next(kind for kind, fields in kinds.items() if name in fields)
    images = isinstance(value, list) and 0 < len(value) <= MAX_REFERENCES
    ok = {
        "a string": isinstance(value, str) or (name in UPLOADS and isinstance(value, bytes)),
        "an integer": isinstance(value, int) and not isinstance(value, bool),
        "a number": isinstance(value, int | float) and not isinstance(value, bool),
        REFERENCES_KIND: images and all(isinstance(v, str | bytes) for v in value),
    }[expected]
    if not ok:
        raise ApiError(400, f"{name} must be {expected}, got {value!r}", param=name)


def _check_text(name: str, value: str) -> None:
    """Text that UTF-8 can carry: JSON's ``"\\ud800"`` parses to a lone surrogate, which no store,
    page or client could read back."""
    lone = SURROGATE.search(value)
    if lone is not None:
        raise ApiError(
            400,
            f"{name} is not valid Unicode text: a lone surrogate (U+{ord(lone[0]):04X}) at character "
            f"{lone.start()}; send UTF-8 text",
            param=name,
        )


def shown(text: str) -> str:
    """Stored text as a response can carry it: a lone surrogate (a record from before they were
    refused) as U+FFFD, so one record never breaks a listing."""
    return SURROGATE.sub("\ufffd", text)


def check_limits(params: Mapping[str, Any], limits: Limits) -> None:
    """The server's limits on frames, pixels per frame (once the size is known) and steps (400 naming
    the limit)."""
    frames, steps = params["frames"] or 0, params["num_inference_steps"]  # None: the pose video's, unread
    pixels = 0 if params["width"] is None else params["width"] * params["height"]
    if frames > limits.max_frames and "seconds" in params:  # in the field the client sent
        fps = params["fps"]
        raise ApiError(
            400,
            f"seconds {params['seconds']:g} ({frames} frames at {fps:g} fps) is over this server's limit "
            f"of {limits.max_frames} frames ({(limits.max_frames - 1) / fps:.2f} s at {fps:g} fps)",
            param="seconds",
        )
    if frames > limits.max_frames:
        raise ApiError(
            400, f"frames {frames} is over this server's limit of {limits.max_frames}", param="frames"
        )
    if pixels > limits.max_pixels:
        raise ApiError(
            400,
            f"size {params['width']}x{params['height']} is {pixels} pixels a frame, over this server's limit "
            f"of {limits.max_pixels}",
            param="size",
        )
    if steps > limits.max_steps:
        raise ApiError(
            400,
            f"num_inference_steps {steps} is over this server's limit of {limits.max_steps}",
            param="num_inference_steps",
        )


def generate_request(
    base: GenerateRequest,
    params: Mapping[str, Any],
    images: ImageFlags,
    outputs: OutputFlags,
    source: SourceVideoFlags | None = None,
    vace: VaceFlags | None = None,
    loras: Mapping[str, tuple[str, ...]] | None = None,
    animate: AnimateFlags | None = None,
) -> GenerateRequest:
    """The ``wanjax generate`` request of a job: the server's flags (model, dtype, mesh, ...) with the
    job's text, images or video to re-make, video and sampling values, its output files, and its own
    LoRAs (``--lora`` / ``--lora_2`` values) after the server's."""
    extra = loras or {}
    adapters = LoraFlags(**{name: getattr(base.adapters, name) + extra.get(name, ()) for name in LORA_FIELDS})
    return dataclasses.replace(
        base,
        adapters=adapters,
        text=dataclasses.replace(
            base.text, prompt=(params["prompt"],), prompt_file=None, negative_prompt=params["negative_prompt"]
        ),
        images=images,
        source=source or SourceVideoFlags(),
        vace=vace or VaceFlags(),
        animate=animate or AnimateFlags(),
        video=VideoFlags(params["height"], params["width"], params["frames"], params["fps"]),
        sampling=dataclasses.replace(
            base.sampling,
            num_inference_steps=params["num_inference_steps"],
            guidance_scale=params["guidance_scale"],
            seed=params["seed"],
            strength=params.get("strength"),
        ),
        outputs=outputs,
    )


FLAG = re.compile(r"--(\w+)")
FLAG_FIELDS = {"height": "size (height)", "width": "size (width)", "reference_image": REFERENCES}
PYTHON_HINT = re.compile(r" \(Python: (?:[^()]|\([^()]*\))*\)")  # the CLI's note for Python users
METAVAR = re.compile(r"(--\w+) (?:FILE|PATH|N)\b")
REPEATED_FIELD = re.compile(rf"\b({'|'.join(sorted(UPLOADS, key=len, reverse=True))}):? \1\b")


def api_message(message: str, paths: Mapping[str, Any] | None = None) -> str:
    """A CLI message in the API's terms: the flags the API takes as fields named as those fields,
    without the CLI's metavariables (``FILE``) and Python notes, and each of ``paths`` (a job's files
    on this server, by what the client calls them) as its name."""
    for name, path in (paths or {}).items():
        message = message.replace(str(path), name)
    message = METAVAR.sub(r"\1", PYTHON_HINT.sub("", message))
    api_names = FIELDS | set(FLAG_FIELDS)

    def rename(match: re.Match[str]) -> str:
        name = match[1]
        return FLAG_FIELDS.get(name, name) if name in api_names else match[0]

    return REPEATED_FIELD.sub(r"\1", FLAG.sub(rename, message))  # "--image PATH" read "image image"


def message_param(message: str, flag: str | None = None) -> str | None:
    """The field a refusal is about, its ``param``: the one ``flag`` (a check's
    :class:`~wanjax.errors.FlagError`'s) stands for, else the one the message (:func:`api_message`)
    starts with, if any."""
    first = message.split(maxsplit=1)[0].rstrip(":,") if message else ""  # "pose_video: ...": pose_video
    for name in (flag, first):
        field = {"height": "size", "width": "size", "reference_image": REFERENCES}.get(name or "", name)
        if field in FIELDS:
            return field
    return None


def video_object(job: Job, model: str) -> dict[str, Any]:
    """A job as the OpenAI video API's object (with this server's extra fields)."""
    p = job.params
    error = None if job.error_code is None else {"code": job.error_code, "message": job.error_message}
    return {
        "id": job.id,
        "object": "video",
        "model": model,
        "status": job.status,
        "progress": job.progress,
        "stage": job.stage,
        "step": job.step,
        "steps": steps_run(p),
        "created_at": int(job.created_at),
        "started_at": None if job.started_at is None else int(job.started_at),
        "completed_at": None if job.completed_at is None else int(job.completed_at),
        "prompt": shown(p["prompt"]),
        "negative_prompt": shown(p["negative_prompt"]),
        "size": f"{p['width']}x{p['height']}",
        "frames": p["frames"],
        "fps": p["fps"],
        "seconds": f"{p['seconds']:g}" if "seconds" in p else f"{p['frames'] / p['fps']:.2f}",
        "num_inference_steps": p["num_inference_steps"],
        "guidance_scale": p["guidance_scale"],
        "seed": p["seed"],
        **{name: p.get(name, False) for name in UPLOADS},
        REFERENCES: p.get(REFERENCES, 0),
        "conditioning_scale": p.get("conditioning_scale"),
        **{name: p.get(name) for name in ANIMATE_VALUES},
        "strength": p.get("strength"),
        **{name: p.get(name, []) for name in LORA_FIELDS},
        "error": error,
        "expires_at": None,
        "remixed_from_video_id": p.get("remixed_from_video_id"),
        "compiled_programs": job.compiled_programs,
        "compile_cache_hits": job.compile_cache_hits,
        "compile_seconds": job.compile_seconds,
        "run_seconds": job.run_seconds,
    }
