"""The HTTP side of ``wanjax serve``: a Starlette app over the job store and the worker.

Routes follow OpenAI's video API (``/v1/videos``; see the README's "Serving" section), plus
``/v1/server`` (the model, its defaults and the limits), ``/v1/videos/{id}/events`` (server-sent
events of a job's progress), the web page at ``/`` and ``/openapi.json`` (the OpenAPI description of
the video endpoints, written from OpenAI's: ``openapi.json`` beside this module). Every answer other
than success is JSON ``{"error": {"message", "type", "param", "code"}}`` with a 4xx (5xx for the
server's own faults, which never stop it). With an API key, every ``/v1`` request needs
``Authorization: Bearer KEY``.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
import logging
import traceback
import uuid
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    MalformedRangeHeader,
    RangeNotSatisfiable,
    Response,
    StreamingResponse,
)
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from wanjax.server import json_text
from wanjax.server.api import (
    INPUT_NAMES,
    ApiError,
    Limits,
    animate_values,
    as_sent,
    form_body,
    remix_body,
    video_object,
)
from wanjax.server.engine import Engine
from wanjax.server.loras import lora_group
from wanjax.server.store import COMPLETED, IN_PROGRESS, QUEUED, Job, JobStore, QueueFull
from wanjax.server.worker import Worker, delete_job

log = logging.getLogger("wanjax.serve")
EVENT_POLL_SECONDS = 0.25
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "request_too_large",
    429: "rate_limit_error",
}


def error_response(error: ApiError, headers: dict[str, str] | None = None) -> JSONResponse:
    """The error's JSON body and status; ``headers`` (a 405's ``Allow``) beside ``WWW-Authenticate``
    on a 401."""
    headers = {**(headers or {}), **({"WWW-Authenticate": "Bearer"} if error.status == 401 else {})}
    return JSONResponse(error.body(), status_code=error.status, headers=headers or None)


class BearerAuth:
    """ASGI middleware: ``/v1`` requests need ``Authorization: Bearer KEY`` (401 otherwise)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app, self.expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                message = "missing or wrong API key: send the header 'Authorization: Bearer KEY'"
                await error_response(ApiError(401, message, "authentication_error"))(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(engine: Engine, store: JobStore, worker: Worker, api_key: str | None = None) -> Starlette:
    """The server's ASGI app."""
    limits: Limits = engine.limits
    page = resources.files("wanjax.server").joinpath("page.html").read_text()
    description = resources.files("wanjax.server").joinpath("openapi.json").read_bytes()

    def find(job_id: str) -> Job:
        job = store.get(job_id)
        if job is None:
            raise ApiError(
                404, f"no video {job_id!r} on this server", "not_found_error", code="video_not_found"
            )
        return job

    def as_object(job: Job) -> dict[str, Any]:
        return video_object(job, engine.model)

    async def index(request: Request) -> Response:
        return HTMLResponse(page)

    async def openapi(request: Request) -> Response:
        return Response(description, media_type="application/json")

    async def server_info(request: Request) -> Response:
        d = engine.defaults
        animate = engine.pipe.components.transformer_config.animate  # frames: the pose video's
        segments, choices = animate_values(d) if animate else ({}, {})
        return JSONResponse(
            {
                "object": "server",
                "model": engine.model,
                "defaults": {
                    "size": f"{d.width}x{d.height}",
                    "frames": None if animate else d.frames,
                    "fps": d.fps,
                    "num_inference_steps": d.num_inference_steps,
                    "guidance_scale": d.guidance_scale,
                    "seed": d.seed,
                    "negative_prompt": "",
                    **segments,
                },
                "inputs": engine.image_inputs(),
                "choices": choices,
                "smoke_model": engine.pipe.components.source.is_demo,
                "size_presets": engine.size_presets(),
                "limits": {
                    "max_frames": limits.max_frames,
                    "max_pixels": limits.max_pixels,
                    "max_steps": limits.max_steps,
                    "max_queue": limits.max_queue,
                    "max_body_bytes": limits.max_body_bytes,
                },
                "queue": {
                    k: v
                    for k, v in (await run_in_threadpool(store.counts)).items()
                    if k in (QUEUED, IN_PROGRESS)
                },
            }
        )

    async def parsed_body(request: Request) -> tuple[Any, dict[str, str]]:
        """The request's body as JSON stands for it, and the fields a form sent by OpenAI's names
        (:func:`~wanjax.server.api.form_body`)."""
        body = await read_body(request, limits.max_body_bytes)
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media == "multipart/form-data":
            return form_body(await form_items(request, body))
        if media != "application/json":
            raise ApiError(
                415,
                f"a body of type {media or '(none given)'} is not read: send JSON with Content-Type: "
                "application/json, or multipart/form-data",
            )
        try:
            return json_text.loads(body), {}
        except json_text.TooDeep as e:
            raise ApiError(
                400, f"the body's JSON has {e}; a request's fields nest 3 levels at most"
            ) from None
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
            raise ApiError(400, f"the body is not JSON: {e}") from None

    async def create(request: Request) -> Response:
        body, sent_as = await parsed_body(request)
        try:
            return await submit(body)
        except ApiError as e:
            raise as_sent(e, sent_as) from None

    async def remix(request: Request) -> Response:
        source = find(request.path_params["id"])
        if source.status != COMPLETED:
            raise ApiError(
                409,
                f"video {source.id} is {source.status}; it can be remixed once its status is completed",
                "conflict_error",
                code="video_not_ready",
            )
        body, sent_as = await parsed_body(request)
        path = engine.files(source.id)["video"]
        if not path.is_file():
            raise ApiError(404, f"the video of {source.id} is missing on the server", "not_found_error")
        video = await run_in_threadpool(path.read_bytes)
        try:
            return await submit(remix_body(source, body, video), {"remixed_from_video_id": source.id})
        except ApiError as e:
            raise as_sent(e, sent_as) from None

    async def submit(body: Any, extra: dict[str, Any] | None = None) -> Response:
        """Queue the job of a create body (202 with its video object)."""
        job_id = uuid.uuid4().hex
        params = {**await run_in_threadpool(engine.accept, job_id, body), **(extra or {})}
        try:
            batch_key = engine.batch_key(params) if worker.max_batch > 1 else None
            add = functools.partial(store.add, lora_set=lora_group(params), batch_key=batch_key)
            job = await run_in_threadpool(add, job_id, params, limits.max_queue)
        except QueueFull:
            await run_in_threadpool(engine.remove_files, job_id)
            raise ApiError(
                429,
                f"the queue is full ({limits.max_queue} jobs waiting); retry when one has started",
                "rate_limit_error",
                code="queue_full",
            ) from None
        worker.notify()
        return JSONResponse(as_object(job), status_code=202)

    async def list_videos(request: Request) -> Response:
        query = request.query_params
        text = query.get("limit", "20")
        if not (text.isascii() and text.isdigit()) or int(text) > 100:  # OpenAI's 0..100
            raise ApiError(400, f"limit must be a whole number from 0 to 100, got {text!r}", param="limit")
        limit = int(text)
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise ApiError(400, f"order must be asc or desc, got {order!r}", param="order")
        try:
            jobs, more = await run_in_threadpool(store.page, limit, query.get("after"), order == "desc")
        except LookupError:
            raise ApiError(400, f"after: no video {query['after']!r} on this server", param="after") from None
        data = [as_object(j) for j in jobs]
        return JSONResponse(
            {
                "object": "list",
                "data": data,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
                "has_more": more,
            }
        )

    async def get_video(request: Request) -> Response:
        return JSONResponse(as_object(find(request.path_params["id"])))

    async def delete_video(request: Request) -> Response:
        job = find(request.path_params["id"])
        if not await run_in_threadpool(delete_job, store, engine, job.id):
            find(job.id)  # deleted meanwhile by another request: the same 404
        return JSONResponse({"id": job.id, "object": "video.deleted", "deleted": True})

    async def content(request: Request) -> Response:
        job = find(request.path_params["id"])
        variant = request.query_params.get("variant", "video")
        kinds = {"video": "video/mp4", "thumbnail": "image/webp", "spritesheet": "image/png"}
        if variant not in kinds:
            raise ApiError(
                400, f"variant must be video, thumbnail or spritesheet, got {variant!r}", param="variant"
            )
        if job.status != COMPLETED:
            raise ApiError(
                409,
                f"video {job.id} is {job.status}; its content is there once its status is completed",
                "conflict_error",
                code="video_not_ready",
            )
        path = engine.files(job.id)[variant]
        if not path.is_file():
            raise ApiError(
                404, f"the {variant} of video {job.id} is missing on the server", "not_found_error"
            )
        return MediaFile(
            path,
            media_type=kinds[variant],
            filename=f"{job.id}{path.suffix}",
            content_disposition_type="inline",
        )

    async def events(request: Request) -> Response:
        job = find(request.path_params["id"])

        async def stream():
            last = None
            while True:
                current = await run_in_threadpool(store.get, job.id)
                if current is None:
                    yield f"event: deleted\ndata: {json.dumps({'id': job.id})}\n\n"
                    return
                obj = as_object(current)
                if obj != last:
                    yield f"data: {json.dumps(obj)}\n\n"
                    last = obj
                if current.finished or await request.is_disconnected():
                    return
                await asyncio.sleep(EVENT_POLL_SECONDS)

        return StreamingResponse(
            stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return error_response(exc, exc.headers)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        status = exc.status_code
        message = {
            404: f"no route {request.url.path}",
            405: f"{request.method} is not allowed on {request.url.path}",
        }
        return error_response(
            ApiError(
                status, message.get(status, str(exc.detail)), ERROR_TYPES.get(status, "invalid_request_error")
            ),
            headers=dict(exc.headers or {}),  # a 405's Allow: the methods the path takes
        )

    async def server_error(request: Request, exc: Exception) -> Response:
        log.error("%s %s failed:\n%s", request.method, request.url.path, traceback.format_exc())
        return error_response(ApiError(500, f"internal error: {type(exc).__name__}", "server_error"))

    app = Starlette(
        routes=[
            Route("/", index),
            Route("/openapi.json", openapi),
            Route("/v1/server", server_info),
            Route("/v1/videos", by_method(GET=list_videos, POST=create), methods=["GET", "POST"]),
            Route(
                "/v1/videos/{id}", by_method(GET=get_video, DELETE=delete_video), methods=["GET", "DELETE"]
            ),
            Route("/v1/videos/{id}/content", content),
            Route("/v1/videos/{id}/remix", remix, methods=["POST"]),
            Route("/v1/videos/{id}/events", events),
        ],
        exception_handlers={ApiError: api_error, HTTPException: http_error, Exception: server_error},
    )
    if api_key:
        app.add_middleware(BearerAuth, api_key=api_key)
    return app


class MediaFile(FileResponse):
    """A video's file, served with byte ranges as Starlette serves them, but a ``Range`` header it
    refuses is the API's JSON error (400, or 416 with ``Content-Range``), not Starlette's plain text.
    (Starlette's own hook, private: tests/test_serve.py's byte-range test notices if it goes.)"""

    @classmethod
    def _parse_range_header(cls, http_range: str, file_size: int) -> list[tuple[int, int]]:
        try:
            return super()._parse_range_header(http_range, file_size)
        except MalformedRangeHeader as e:
            raise ApiError(400, f"the Range header {http_range!r} cannot be read: {e.content}") from None
        except RangeNotSatisfiable:
            raise ApiError(
                416,
                f"the Range header {http_range!r} starts past the end of the file ({file_size} bytes)",
                "invalid_request_error",
                code="range_not_satisfiable",
                headers={"Content-Range": f"bytes */{file_size}"},
            ) from None


def by_method(
    **handlers: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """One endpoint for a path's methods (HEAD as GET), so that a 405 names all of them in ``Allow``."""

    async def handle(request: Request) -> Response:
        method = "GET" if request.method == "HEAD" else request.method
        return await handlers[method](request)

    return handle


class StrictParser(MultiPartParser):
    """Starlette's parser, refusing a text field its charset cannot decode (Starlette reads such
    bytes as Latin-1: text the client never sent)."""

    def on_part_end(self) -> None:
        part = self._current_part
        if part.file is None:
            try:
                bytes(part.data).decode(self._charset)
            except (UnicodeDecodeError, LookupError):
                raise MultiPartException(
                    f"the field {part.field_name!r} is not {self._charset} text; send UTF-8"
                ) from None
        super().on_part_end()


async def form_items(request: Request, body: bytes) -> list[tuple[str, str | bytes]]:
    """The fields of a ``multipart/form-data`` body (files as their bytes)."""

    async def chunks():
        yield body

    try:
        files = len(INPUT_NAMES)  # as many as a job holds: e.g. Animate's character and four videos
        form = await StrictParser(request.headers, chunks(), max_files=files, max_fields=32).parse()
    except MultiPartException as e:
        raise ApiError(400, f"the multipart body cannot be read: {e.message}") from None
    return [
        (name, await value.read() if isinstance(value, UploadFile) else value)
        for name, value in form.multi_items()
    ]


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body; 413 once it is over ``limit`` bytes (announced or sent)."""
    declared = request.headers.get("content-length")
    too_large = ApiError(413, f"the body is over this server's limit of {limit} bytes", "request_too_large")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)
