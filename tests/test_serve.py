"""``wanjax serve``: a real server process on 127.0.0.1 with the demo model, driven over HTTP.

A job's video is ``wanjax generate``'s for the same values (its contact sheet pixel for pixel, its mp4
decoded frame for frame); a second job of a shape compiles nothing; progress, list, delete; every
refusal is a JSON error with its status; a server killed with SIGKILL mid-job loses no finished
video and no record, and runs the interrupted jobs after a restart.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import av
import numpy as np
import pytest
from helpers.processes import xla_flags
from helpers.serve_process import TERMINATED, Server, multipart, serve_mistake
from helpers.small_video import SMALL_GENERATE, SMALL_JOB
from PIL import Image

from wanjax.server.sqlite_store import SqliteJobStore

KEY = "test-key-123"
PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
PROMPT = "A red fox runs through fresh snow"
NO_ANIMATE_VIDEOS = dict.fromkeys(("pose_video", "face_video", "background_video", "mask_video"), "none")


def generate_in_a_process(*args: str) -> int:
    """``wanjax generate`` in a new process, on the devices a server process has (this one has 8)."""
    command = [sys.executable, "-m", "wanjax.cli", "generate", *args]
    return subprocess.run(command, stdin=subprocess.DEVNULL, check=False).returncode


@pytest.fixture(scope="module")
def server(demo_env, tmp_path_factory):
    """One server for the module: an API key, a queue of 2, small request bodies."""
    out = tmp_path_factory.mktemp("serve")
    flags = ("--max_queue", "2", "--max_body_bytes", "1024", "--max_steps", "60")
    server = Server(out, *flags, api_key=KEY, env={"WANJAX_CACHE": str(demo_env)}).start()
    yield server
    assert server.stop() == TERMINATED, server.stderr


def assert_error(status: int, body, expected: int, words: str) -> None:
    assert status == expected, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert words in error["message"] and "\n" not in error["message"], error


@pytest.mark.slow
def test_a_job_is_the_generate_run_and_its_second_shape_compiles_nothing(server, tmp_path):
    fields = dict(prompt=PROMPT, negative_prompt="blurry", num_inference_steps=3, seed=7, guidance_scale=4.0)
    job = server.submit(**fields)
    assert job["object"] == "video" and job["status"] in ("queued", "in_progress")
    assert len(job["id"]) == 32 and job["size"] == "192x128" and job["frames"] == 17
    done = server.wait(job["id"])
    assert done["progress"] == 100 and done["step"] == 3 and done["completed_at"] >= done["created_at"]
    status, video, headers = server.request("GET", f"/v1/videos/{job['id']}/content")
    assert status == 200 and headers["content-type"] == "video/mp4"
    status, sheet, headers = server.request("GET", f"/v1/videos/{job['id']}/content?variant=spritesheet")
    assert status == 200 and headers["content-type"] == "image/png"
    status, thumbnail, headers = server.request("GET", f"/v1/videos/{job['id']}/content?variant=thumbnail")
    assert status == 200 and headers["content-type"] == "image/webp"

    args = ["--prompt", PROMPT, "--negative_prompt", "blurry", "--num_inference_steps", "3", "--seed", "7"]
    args += ["--guidance_scale", "4.0", "--output_video", str(tmp_path / "cli.mp4")]
    args += ["--preview", str(tmp_path / "cli.png"), "--thumbnail", str(tmp_path / "cli.webp")]
    assert generate_in_a_process("--model", "demo", *args) == 0
    assert thumbnail == (tmp_path / "cli.webp").read_bytes()  # the first frame, encoded alike
    (tmp_path / "job.png").write_bytes(sheet)
    # The contact sheet holds every raw frame: equal pixels are equal frames.
    np.testing.assert_array_equal(
        np.asarray(Image.open(tmp_path / "job.png")), np.asarray(Image.open(tmp_path / "cli.png"))
    )
    assert video == (tmp_path / "cli.mp4").read_bytes()  # the job's mp4 is the file generate writes

    again = server.wait(server.submit(prompt="another prompt", num_inference_steps=3, seed=8)["id"])
    assert done["compiled_programs"] > 0  # the first job of the shape (or read from the disk cache)
    assert again["compiled_programs"] == 0 and again["compile_seconds"] == 0

    # OpenAI's remix (its SDK): video to video of the finished video, as `generate --video` of its mp4
    from openai import OpenAI

    client = OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
    remixed = client.videos.remix(job["id"], prompt="the same fox at night", extra_body={"strength": 0.7})
    remixed = server.wait(remixed.id)
    assert remixed["remixed_from_video_id"] == job["id"] and remixed["video"] and remixed["strength"] == 0.7
    assert (remixed["size"], remixed["frames"], remixed["seed"]) == ("192x128", 17, 7)
    assert remixed["steps"] == remixed["step"] == 2  # the last int(3 x 0.7) steps
    _, remix_sheet, _ = server.request("GET", f"/v1/videos/{remixed['id']}/content?variant=spritesheet")
    args[1] = "the same fox at night"
    args += ["--video", str(tmp_path / "cli.mp4"), "--strength", "0.7"]
    args[args.index("--preview") + 1] = str(tmp_path / "remix.png")
    args[args.index("--output_video") + 1] = str(tmp_path / "remix.mp4")
    args[args.index("--thumbnail") + 1] = str(tmp_path / "remix.webp")
    assert generate_in_a_process("--model", "demo", *args) == 0
    (tmp_path / "job_remix.png").write_bytes(remix_sheet)
    np.testing.assert_array_equal(
        np.asarray(Image.open(tmp_path / "job_remix.png")), np.asarray(Image.open(tmp_path / "remix.png"))
    )


@pytest.mark.slow
def test_progress_streams_as_server_sent_events(server):
    job = server.submit(prompt=PROMPT, num_inference_steps=40, seed=1)
    request = urllib.request.Request(
        f"{server.url}/v1/videos/{job['id']}/events", headers={"Authorization": f"Bearer {KEY}"}
    )
    events = []
    with urllib.request.urlopen(request, timeout=120) as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        for line in stream:
            if line.startswith(b"data: "):
                events.append(json.loads(line[6:]))
    assert events[-1]["status"] == "completed" and events[-1]["progress"] == 100
    running = [e for e in events if e["status"] == "in_progress"]
    middle = {e["step"] for e in running if 0 < e["step"] < 40}
    assert len(middle) >= 2, [(e["stage"], e["step"]) for e in events]  # the steps show as they run
    progress = [e["progress"] for e in events]
    assert progress == sorted(progress)
    assert [e["stage"] for e in running if e["stage"] == "denoise"]


@pytest.mark.slow
@pytest.mark.filterwarnings(
    "ignore:The Sora API:DeprecationWarning"
)  # OpenAI's hosted service, not its API shape
def test_the_openai_sdk_drives_it(server, tmp_path):
    """OpenAI's own client (multipart/form-data requests, its paging and its download)."""
    from openai import NotFoundError, OpenAI

    client = OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
    video = client.videos.create(
        prompt=PROMPT, seconds="1", size="192x128", extra_body={"num_inference_steps": 2}
    )
    assert video.object == "video" and video.seconds == "1" and video.size == "192x128"  # as asked: 17 frames
    done = server.wait(video.id)
    assert client.videos.retrieve(video.id).status == "completed"
    data = client.videos.download_content(video.id).read()
    assert data == server.request("GET", f"/v1/videos/{video.id}/content")[1]
    thumbnail = client.videos.download_content(video.id, variant="thumbnail").read()
    assert thumbnail.startswith(b"RIFF") and thumbnail[8:12] == b"WEBP"
    sheet = client.videos.download_content(video.id, variant="spritesheet").read()
    assert sheet.startswith(b"\x89PNG")
    assert client.videos.list(limit=1).data[0].id == video.id
    assert done["frames"] == 17 and done["num_inference_steps"] == 2
    assert client.videos.delete(video.id).deleted
    with pytest.raises(NotFoundError):
        client.videos.retrieve(video.id)


@pytest.mark.slow
def test_list_pages_and_delete(server):
    ids = [
        server.wait(server.submit(prompt=f"clip {i}", num_inference_steps=2)["id"])["id"] for i in range(2)
    ]
    status, page, _ = server.request("GET", "/v1/videos?limit=1")
    assert status == 200 and page["object"] == "list" and page["has_more"]
    assert [v["id"] for v in page["data"]] == [ids[1]]  # newest first
    status, page, _ = server.request("GET", f"/v1/videos?limit=1&after={ids[1]}")
    assert [v["id"] for v in page["data"]] == [ids[0]]
    status, page, _ = server.request("GET", "/v1/videos?limit=100&order=asc")
    assert [v["id"] for v in page["data"]][-2:] == ids and not page["has_more"]
    status, page, _ = server.request("GET", "/v1/videos?limit=0")  # OpenAI's spec allows 0
    assert status == 200 and page["data"] == [] and page["first_id"] is None and page["has_more"]
    for bad in ("101", "-1", "1.5", "%D9%A1", "+5"):  # over, negative, not whole, Arabic-Indic 1, signed
        assert_error(
            *server.request("GET", f"/v1/videos?limit={bad}")[:2], 400, "limit must be a whole number"
        )

    files = sorted(p.name for p in (server.output_dir / "videos").glob(f"{ids[0]}.*"))
    assert files == [f"{ids[0]}.{suffix}" for suffix in ("json", "mp4", "png", "webp")]
    status, body, _ = server.request("DELETE", f"/v1/videos/{ids[0]}")
    assert status == 200 and body == {"id": ids[0], "object": "video.deleted", "deleted": True}
    assert not list((server.output_dir / "videos").glob(f"{ids[0]}.*"))
    assert_error(*server.request("GET", f"/v1/videos/{ids[0]}")[:2], 404, "no video")
    assert_error(*server.request("GET", f"/v1/videos/{ids[0]}/content")[:2], 404, "no video")
    assert_error(*server.request("DELETE", f"/v1/videos/{ids[0]}")[:2], 404, "no video")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"negative_prompt": "x"}, "'prompt' is required"),
        ({"prompt": "a", "size": "big"}, "must be WIDTHxHEIGHT"),
        ({"prompt": "a", "size": "192x128\n"}, "must be WIDTHxHEIGHT"),
        (
            {"prompt": "a", "size": "\u0661\u0669\u0662x\u0661\u0662\u0668"},
            "must be WIDTHxHEIGHT",
        ),  # Arabic-Indic
        (
            {"prompt": "a \ud800"},
            "prompt is not valid Unicode text: a lone surrogate (U+D800) at character 2",
        ),
        ({"prompt": "a", "negative_prompt": "\udfff"}, "negative_prompt is not valid Unicode text"),
        ({"prompt": "a", "fps": 1e-300}, "fps must be a frame rate from 0.1 to 1000"),
        ({"prompt": "a", "seconds": "\u0664"}, "seconds must be a number"),  # Arabic-Indic 4
        ({"prompt": "a", "seconds": "1_0"}, "seconds must be a number"),
        ({"prompt": "a", "seconds": "nan"}, "seconds must be a number"),
        ({"prompt": "ab" * 300}, "prompt is 601 tokens; the model reads 512"),  # one a character here
        ({"prompt": "a", "negative_prompt": "ab" * 300}, "negative_prompt is 601 tokens"),
        ({"prompt": "a", "fps": 0.099}, "fps must be a frame rate from 0.1 to 1000"),
        ({"prompt": "a", "fps": 1000.5}, "fps must be a frame rate from 0.1 to 1000"),
        ({"prompt": "a", "fps": 1e300}, "fps must be a frame rate from 0.1 to 1000"),
        ({"prompt": "a", "size": "100x128"}, "multiple of 16"),
        ({"prompt": "a", "frames": 6}, "4n+1"),
        ({"prompt": "a", "frames": 9, "seconds": 1}, "not both"),
        ({"prompt": "a", "frames": 21}, "over this server's limit of 17"),
        (
            {"prompt": "a", "seconds": 3},
            "seconds 3 (49 frames at 16 fps) is over this server's limit of 17 frames (1.00 s",
        ),
        ({"prompt": "a", "size": "256x256"}, "over this server's limit"),
        ({"prompt": "a", "num_inference_steps": 61}, "limit of 60"),
        ({"prompt": "a", "num_inference_steps": 10**15}, "limit of 60"),
        ({"prompt": "a", "seconds": 1e308}, "seconds must be a positive number"),
        ({"prompt": "a", "num_inference_steps": 0}, "at least 1"),
        ({"prompt": "a", "seed": "7"}, "seed must be an integer"),
        ({"prompt": "a", "guidance_scale": -1}, "guidance_scale must be >= 0"),
        ({"prompt": "a", "image": "cat.png"}, "image must be an image file in base64"),
        ({"prompt": "a", "reference_images": ["", ""]}, "reference_images must be an image file in base64"),
        ({"prompt": "a", "reference_images": []}, "reference_images must be a list of up to 4 images"),
        ({"prompt": "a", "mask": PNG}, "mask, reference_images and conditioning_scale are for a VACE model"),
        ({"prompt": "a", "image": PNG}, "demo is a text-to-video model: it takes no image"),
        ({"prompt": "a", "lora": "style.safetensors"}, "lora must be a list of up to 8"),
        ({"prompt": "a", "lora": [{"name": "style"}]}, "started without a folder of LoRAs"),
        ({"prompt": "a", "lora": [{"name": "../x"}]}, "is not a LoRA's name"),
        ({"prompt": "a", "lora_2": [{"name": "x", "scale": "high"}]}, "scale of x must be a finite number"),
        ({"prompt": "a", "output_video": "/etc/x.mp4"}, "unknown field 'output_video'"),
        ({"prompt": "a", "model": "Wan-AI/other"}, "runs the model 'demo'"),
        (["a list"], "must be a JSON object"),
    ],
)
def test_bad_requests_get_400_with_the_reason(server, body, words):
    stored = len(server.request("GET", "/v1/videos?limit=100")[1]["data"])
    status, error, _ = server.request("POST", "/v1/videos", body)
    assert_error(status, error, 400, words)
    assert len(server.request("GET", "/v1/videos?limit=100")[1]["data"]) == stored  # nothing stored
    assert "--" not in error["error"]["message"]  # the API's field names, not the CLI's flags
    if error["error"]["param"] is not None:  # the field at fault, as OpenAI's errors name it
        assert error["error"]["param"] in {*body, "size", "prompt"}


@pytest.mark.slow
def test_a_second_server_on_the_folder_is_a_one_line_error(server, demo_env):
    """Two servers on one folder would both run its queue; the second stops before loading a model."""
    second = Server(server.output_dir, env={"WANJAX_CACHE": str(demo_env)}).launch()
    assert second.process.wait(120) == 2
    lines = second.read_stderr().strip().splitlines()
    assert len(lines) == 1 and f"is in use by another wanjax serve (process {server.process.pid})" in lines[0]
    assert server.request("GET", "/v1/server")[0] == 200  # the first one serves on


@pytest.mark.slow
def test_errors_from_the_cli_checks_name_their_field(server):
    for body, param in (({"frames": 6}, "frames"), ({"size": "100x128"}, "size"), ({"seed": -1}, "seed")):
        status, error, _ = server.request("POST", "/v1/videos", {"prompt": "a", **body})
        assert status == 400 and error["error"]["param"] == param, error


@pytest.mark.slow
def test_a_stored_record_with_a_lone_surrogate_does_not_break_the_listing(demo_env, tmp_path):
    """A record stored before lone surrogates were refused: listed and served, shown as U+FFFD."""
    store = SqliteJobStore(tmp_path)
    params = dict(negative_prompt="", width=48, height=32, frames=5, fps=16.0, num_inference_steps=2)
    params |= dict(guidance_scale=5.0, seed=0, image=False, last_image=False)
    for job_id, prompt in (("poisoned", "a \ud800 cat"), ("plain", "a dog")):
        store.add(job_id, {**params, "prompt": prompt}, max_queued=5)
        assert store.claim().id == job_id
        store.fail(job_id, "server_error", "failed before the restart")
    store.close()
    server = Server(tmp_path, env={"WANJAX_CACHE": str(demo_env)}).start()
    try:
        status, page, _ = server.request("GET", "/v1/videos")
        assert status == 200 and [v["id"] for v in page["data"]] == ["plain", "poisoned"], page
        status, video, _ = server.request("GET", "/v1/videos/poisoned")
        assert status == 200 and video["prompt"] == "a \ufffd cat"
    finally:
        assert server.stop() == TERMINATED, server.stderr


@pytest.mark.slow
def test_refusals_are_json_with_their_status(server):
    assert_error(*server.request("POST", "/v1/videos", raw=b"{not json")[:2], 400, "not JSON")
    for media in ("text/plain", "application/x-www-form-urlencoded"):  # JSON inside, another type declared
        sent = server.request("POST", "/v1/videos", raw=b'{"prompt": "a"}', headers={"Content-Type": media})
        assert_error(*sent[:2], 415, f"a body of type {media} is not read")
    latin1 = b'--B\r\nContent-Disposition: form-data; name="prompt"\r\n\r\ncaf\xe9\r\n--B--\r\n'
    sent = server.request(
        "POST", "/v1/videos", raw=latin1, headers={"Content-Type": "multipart/form-data; boundary=B"}
    )
    assert_error(*sent[:2], 400, "the field 'prompt' is not utf-8 text; send UTF-8")  # not read as 'café'
    host, port = server.url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as raw:  # below the app: uvicorn's
        raw.sendall(b"GET /v1/videos HTTP/1.1\r\nHost: x\r\nX-Bad: a\x00b\r\n\r\n")
        answer = b"".join(iter(lambda: raw.recv(65536), b""))
    head, body = answer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 400") and b"content-type: application/json" in head.lower(), head
    assert_error(400, json.loads(body), 400, "the request is not valid HTTP: ")
    assert_error(*server.request("GET", "/v1/videos", key=None)[:2], 401, "API key")
    assert_error(*server.request("GET", "/v1/server", key="wrong")[:2], 401, "API key")
    status, body, headers = server.request("POST", "/v1/videos", {"prompt": "a"}, key=None)
    assert status == 401 and headers["www-authenticate"] == "Bearer"
    assert_error(*server.request("GET", "/v1/videos/nope")[:2], 404, "no video 'nope'")
    assert_error(*server.request("GET", "/v1/nothing")[:2], 404, "no route")
    assert_error(
        *server.request("POST", "/v1/videos", {"prompt": "x" * 2000})[:2], 413, "limit of 1024 bytes"
    )
    status, body, headers = server.request("PUT", "/v1/videos")
    assert_error(status, body, 405, "not allowed")
    allow = {m.strip() for m in {k.lower(): v for k, v in headers.items()}["allow"].split(",")}
    assert allow == {"GET", "HEAD", "POST"}, headers  # every method the path takes
    status, page, _ = server.request("GET", "/", key=None)  # the page needs no key; the API does
    assert status == 200 and b"<html" in page.lower()

    running = server.submit(prompt="a long one", num_inference_steps=60)
    queued = [server.submit(prompt=f"waiting {i}", num_inference_steps=2) for i in range(2)]
    status, body, _ = server.request("POST", "/v1/videos", {"prompt": "one too many"})
    assert_error(status, body, 429, "queue is full")
    assert_error(*server.request("GET", f"/v1/videos/{queued[0]['id']}/content")[:2], 409, "is queued")
    for job in (*queued, running):  # a queued job leaves the queue; the running one stops at a step
        assert server.request("DELETE", f"/v1/videos/{job['id']}")[0] == 200
    deadline = time.monotonic() + 60
    while server.request("GET", f"/v1/videos/{running['id']}")[0] != 404:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert not list((server.output_dir / "videos").glob(f"{running['id']}*"))
    after = server.submit(prompt="after the refusals", num_inference_steps=2, seconds=1)
    assert after["seconds"] == "1" and after["frames"] == 17  # echoed as asked (16 fps: 17 frames)
    remix = f"/v1/videos/{after['id']}/remix"
    assert_error(
        *server.request("POST", remix, {"prompt": "too soon"})[:2], 409, "once its status is completed"
    )
    assert server.wait(after["id"])["seconds"] == "1"
    assert_error(
        *server.request("POST", "/v1/videos/nope/remix", {"prompt": "a"})[:2], 404, "no video 'nope'"
    )
    assert_error(*server.request("POST", remix, {})[:2], 400, "'prompt' is required")
    sized = server.request("POST", remix, {"prompt": "a", "size": "64x64"})[:2]
    assert_error(*sized, 400, "'size' is not a remix field (a remix keeps the video's size, frames and fps)")
    strong = server.request("POST", remix, {"prompt": "a", "strength": 1.5})[:2]
    assert_error(*strong, 400, "strength must be over 0 and at most 1")
    alone = server.request("POST", "/v1/videos", {"prompt": "a", "strength": 0.5})[:2]
    assert_error(*alone, 400, "strength is for video to video: give the video too (video)")


@pytest.mark.slow
def test_the_openapi_description_is_served(server):
    """``/openapi.json``: the video operations, written from OpenAI's description (no key needed)."""
    status, doc, headers = server.request("GET", "/openapi.json", key=None)
    assert status == 200 and headers["content-type"] == "application/json"
    assert doc["openapi"].startswith("3.1")
    description = doc["info"]["description"]
    assert "github.com/openai/openai-openapi" in description
    assert "f85dbe223d40e1a31cba812ab2d755c7e98a92a3" in description
    operations = {(method.upper(), path) for path, item in doc["paths"].items() for method in item}
    assert operations == {
        ("POST", "/v1/videos"),
        ("GET", "/v1/videos"),
        ("GET", "/v1/videos/{video_id}"),
        ("DELETE", "/v1/videos/{video_id}"),
        ("GET", "/v1/videos/{video_id}/content"),
        ("POST", "/v1/videos/{video_id}/remix"),
    }
    assert doc["components"]["securitySchemes"]["ApiKeyAuth"]["scheme"] == "bearer"


@pytest.mark.slow
def test_a_refused_byte_range_is_a_json_error(server):
    """Starlette answers a ``Range`` it refuses in plain text (found with the OpenAPI description's
    ``Range``); the API answers its JSON error: 400, or 416 with ``Content-Range``."""
    job = server.wait(server.submit(prompt=PROMPT, num_inference_steps=2)["id"])
    url = f"/v1/videos/{job['id']}/content"
    status, video, _ = server.request("GET", url)
    assert status == 200
    status, part, headers = server.request("GET", url, headers={"Range": "bytes=0-9"})
    assert status == 206 and part == video[:10] and headers["content-range"] == f"bytes 0-9/{len(video)}"
    for bad in ("bytes=5-2", "items=0-1", "garbage"):
        assert_error(
            *server.request("GET", url, headers={"Range": bad})[:2], 400, f"the Range header {bad!r}"
        )
    status, body, headers = server.request("GET", url, headers={"Range": f"bytes={len(video)}-"})
    assert_error(status, body, 416, "starts past the end of the file")
    assert body["error"]["code"] == "range_not_satisfiable"
    assert headers["content-range"] == f"bytes */{len(video)}"


@pytest.mark.slow
def test_a_killed_server_loses_no_finished_job(demo_env, tmp_path, tmp_path_factory):
    env = {"WANJAX_CACHE": str(demo_env)}
    flags = ("--jax_cache_dir", str(tmp_path_factory.mktemp("jax_cache")))  # starts empty
    # small videos (SMALL_JOB): the jobs' steps are what matter
    first = Server(tmp_path, *flags, env=env).start()
    try:
        finished = first.wait(
            first.submit(prompt="finished before the kill", num_inference_steps=2, **SMALL_JOB)["id"]
        )
        _, video, _ = first.request("GET", f"/v1/videos/{finished['id']}/content")
        running = first.submit(prompt="running at the kill", num_inference_steps=60, seed=3, **SMALL_JOB)
        waiting = first.submit(prompt="waiting at the kill", num_inference_steps=2, **SMALL_JOB)
        deadline = time.monotonic() + 120
        while first.request("GET", f"/v1/videos/{running['id']}")[1]["step"] < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        first.kill()

    second = Server(tmp_path, *flags, env=env).start()
    try:
        assert second.listening.endswith(
            "(took back 1 job a server left running: it runs again from the start)"
        )
        _, page, _ = second.request("GET", "/v1/videos?order=asc")
        assert [v["id"] for v in page["data"]] == [finished["id"], running["id"], waiting["id"]]
        assert page["data"][0] == {**finished}  # the finished record, unchanged
        assert [v["status"] for v in page["data"][1:]] in (
            ["queued", "queued"],
            ["in_progress", "queued"],
            ["completed", "queued"],
            ["completed", "in_progress"],
            ["completed", "completed"],
        )
        status, again, _ = second.request("GET", f"/v1/videos/{finished['id']}/content")
        assert status == 200 and again == video
        rerun = second.wait(running["id"])
        assert second.wait(waiting["id"])["status"] == "completed"
        assert rerun["step"] == 60
        # the restarted server's programs come from the persistent compilation cache
        assert rerun["compiled_programs"] > 0 and rerun["compile_cache_hits"] == rerun["compiled_programs"]
        stopped = second.submit(prompt="running at a SIGTERM", num_inference_steps=60, **SMALL_JOB)
        while second.request("GET", f"/v1/videos/{stopped['id']}")[1]["step"] < 2:
            assert time.monotonic() < deadline + 120
            time.sleep(0.05)
    finally:
        assert second.stop() == TERMINATED, second.stderr
    assert second.stderr.splitlines()[-1] == (
        "wanjax serve: stopped by SIGTERM; the job it was running is back in the queue, to run again "
        "from the start; 1 job waits for the next start"
    )
    assert not list(tmp_path.glob("videos/.*"))  # no half-written file left
    store = SqliteJobStore(tmp_path)  # a clean stop puts the running job back in the queue
    assert store.get(stopped["id"]).status == "queued" and store.get(rerun["id"]).status == "completed"
    store.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("stop", "status", "by"),
    [(signal.SIGINT, 130, "Ctrl-C (SIGINT)"), (signal.SIGTERM, TERMINATED, "SIGTERM")],
)
def test_a_signal_stops_it_with_one_line_and_its_exit_status(demo_env, tmp_path, stop, status, by):
    """Ctrl-C or SIGTERM: the running job goes back to the queue and the server says so, and how many
    jobs wait, in one line on stderr, exiting as any wanjax command that signal stops (130, 143). A
    start over the folder of a server that died running a job says it took that job back."""
    store = SqliteJobStore(tmp_path)
    params = dict(prompt="running when its server died", negative_prompt="", width=64, height=64, frames=5)
    params |= dict(fps=16.0, num_inference_steps=2, guidance_scale=5.0, seed=0, image=False, last_image=False)
    store.add("interrupted", params, max_queued=5)
    assert store.claim().id == "interrupted"  # in progress, its server gone
    store.close()
    server = Server(tmp_path, "--max_steps", "1000", env={"WANJAX_CACHE": str(demo_env)}).start()
    try:
        assert server.listening == (
            f"wanjax serve: listening on {server.url} (took back 1 job a server left running: it runs "
            "again from the start)"
        )
        assert server.wait("interrupted")["step"] == 2
        running = server.submit(prompt="running at the signal", num_inference_steps=1000, **SMALL_JOB)
        waiting = server.submit(prompt="waiting at the signal", num_inference_steps=2, **SMALL_JOB)
        deadline = time.monotonic() + 120
        while server.request("GET", f"/v1/videos/{running['id']}")[1]["step"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        server.process.send_signal(stop)
        assert server.stop(signal_it=False) == status, server.stderr
    finally:
        server.kill()
    assert server.stderr.splitlines()[-1] == (
        f"wanjax serve: stopped by {by}; the job it was running is back in the queue, to run again from "
        "the start; 2 jobs wait for the next start"
    )
    assert "Traceback" not in server.stderr
    store = SqliteJobStore(tmp_path)
    assert [store.get(job["id"]).status for job in (running, waiting)] == ["queued", "queued"]
    store.close()


@pytest.mark.slow
def test_a_deeply_nested_body_is_a_400_as_any_malformed_body(demo_env, tmp_path):
    """JSON nested past the parser's recursion limit (a prompt of 100,000 brackets), or just under it
    (the next function walking the value would hit it), as the body or as a form's lora field: a 400
    in the API's error shape, nothing stored, no traceback in the server's log."""
    deep = "[" * 100_000 + "]" * 100_000
    under = "[" * 990 + "]" * 990
    server = Server(tmp_path, env={"WANJAX_CACHE": str(demo_env)}).start()
    try:
        for body in (
            '{"prompt": ' + deep + "}",
            '{"prompt": "a", "lora": [{"name": "x", "scale": ' + under + "}]}",
        ):
            status, error, _ = server.request("POST", "/v1/videos", raw=body.encode())
            assert_error(
                status, error, 400, "the body's JSON has arrays and objects nested more than 64 levels"
            )
            assert error["error"]["param"] is None
        for lora in (deep, under):  # JSON text in a field: a form's, or a JSON body's string
            form, headers = multipart(prompt="a", lora=lora)
            text = json.dumps({"prompt": "a", "lora": lora}).encode()
            answers = [server.request("POST", "/v1/videos", raw=form, headers=headers)]
            answers.append(server.request("POST", "/v1/videos", raw=text))
            for status, error, _ in answers:
                assert_error(
                    status, error, 400, "got JSON with arrays and objects nested more than 64 levels"
                )
                assert error["error"]["message"].startswith("lora must be a list of up to 8")
                assert error["error"]["param"] == "lora"
        assert server.request("GET", "/v1/videos")[1]["data"] == []  # nothing stored
        assert not list(tmp_path.glob("inputs/*"))
    finally:
        assert server.stop() == TERMINATED, server.stderr
    assert "Traceback" not in server.stderr and "RecursionError" not in server.stderr, server.stderr


@pytest.mark.slow
def test_two_processes_serve_one_model(demo_env, tmp_path):
    """Process 0 serves HTTP and sends each job (its image too) to process 1, as if on another host
    (its own --output_dir); they run it on a mesh spanning both (one CPU device each); only process 0
    writes. The frames are those of ``wanjax generate`` with the same mesh in one process (to
    XLA:CPU's rounding across process layouts: see test_multihost)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (128, 192, 3), dtype=np.uint8)).save(
        tmp_path / "a.png"
    )
    image = base64.b64encode((tmp_path / "a.png").read_bytes()).decode()
    env = {"WANJAX_CACHE": str(demo_env), "XLA_FLAGS": xla_flags(1)}
    flags = ("--mesh", "sp=2", "--coordinator_address", f"127.0.0.1:{port}", "--num_processes", "2")
    follower = Server(tmp_path / "host1", *flags, "--process_id", "1", model="demo-i2v", env=env).launch()
    leader = Server(tmp_path / "host0", *flags, "--process_id", "0", model="demo-i2v", env=env)
    try:
        leader.start()
        job = leader.wait(
            leader.submit(prompt=PROMPT, image=image, num_inference_steps=2, seed=5, **SMALL_JOB)["id"]
        )
        _, sheet, _ = leader.request("GET", f"/v1/videos/{job['id']}/content?variant=spritesheet")
    finally:
        assert leader.stop() == TERMINATED, leader.stderr
        assert follower.stop(signal_it=False) == 0, follower.stderr  # told to stop by process 0
    assert not [p for p in (tmp_path / "host1").rglob("*") if p.is_file()]  # process 1 kept no file
    args = [
        "generate",
        "--model",
        "demo-i2v",
        "--prompt",
        PROMPT,
        "--image",
        "a.png",
        "--num_inference_steps",
        "2",
    ]
    args += ["--seed", "5", "--mesh", "sp=2", "--output_video", "one.mp4", "--preview", "one.png"]
    args += SMALL_GENERATE
    subprocess.run(
        [sys.executable, "-m", "wanjax.cli", *args],
        cwd=tmp_path,
        env={**os.environ, **env, "XLA_FLAGS": xla_flags(2)},
        check=True,
        capture_output=True,
    )
    (tmp_path / "job.png").write_bytes(sheet)
    served, one = (np.asarray(Image.open(tmp_path / f"{n}.png")).astype(int) for n in ("job", "one"))
    diff = np.abs(served - one)
    assert diff.max() <= 1 and np.mean(diff > 0) < 1e-3


def test_start_up_mistakes_are_one_line(demo_env, tmp_path, capsys, monkeypatch):
    assert "--port must be between 0" in serve_mistake(capsys, "--port", "70000")
    assert "--max_queue must be at least 1" in serve_mistake(capsys, "--max_queue", "0")
    assert "--cache_calibrate" in serve_mistake(capsys, "--cache_calibrate", "x.json")
    (tmp_path / "file").write_text("")
    assert "--output_dir" in serve_mistake(
        capsys, "--model", "demo", "--output_dir", str(tmp_path / "file" / "x")
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        err = serve_mistake(capsys, "--model", "demo", "--port", port, "--output_dir", str(tmp_path / "out"))
    assert f"cannot listen on 127.0.0.1:{port}" in err
    err = serve_mistake(
        capsys, "--model", "demo", "--port", "0", "--output_dir", str(tmp_path), "--mesh", "tp=3"
    )
    assert "cannot serve demo with these flags" in err and "3 devices" in err
    big = ("--model", "demo", "--port", "0", "--output_dir", str(tmp_path / "out"), "--device_memory", "1MiB")
    assert "wanjax plan's estimate" in serve_mistake(capsys, *big)
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # the serve extra not installed
    assert "(uvicorn missing): pip install 'wanjax[serve]'" in serve_mistake(capsys, "--model", "demo")


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")
def test_an_image_to_video_job_is_the_generate_run(demo_env, tmp_path):
    """An image-to-video server takes the first frame as base64 in the JSON body; without ``size`` the
    image's aspect decides, as ``wanjax generate --image`` decides it."""
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (150, 260, 3), dtype=np.uint8)).save(tmp_path / "first.png")
    image = "data:image/png;base64," + base64.b64encode((tmp_path / "first.png").read_bytes()).decode()
    server = Server(tmp_path / "serve", model="demo-i2v", env={"WANJAX_CACHE": str(demo_env)}).start()
    try:
        _, info, _ = server.request("GET", "/v1/server")
        assert info["inputs"] == {
            "image": "required",
            "last_image": "none",
            "video": "none",
            "mask": "none",
            "reference_images": "none",
            **NO_ANIMATE_VIDEOS,
        }
        assert info["limits"]["max_body_bytes"] == 16 * 2**20
        status, error, _ = server.request("POST", "/v1/videos", {"prompt": PROMPT})
        assert_error(
            status, error, 400, "demo-i2v is an image-to-video model: give the first frame with image"
        )
        assert "Python" not in error["error"]["message"] and "FILE" not in error["error"]["message"]
        unreadable = base64.b64encode(b"not an image").decode()
        status, error, _ = server.request("POST", "/v1/videos", {"prompt": PROMPT, "image": unreadable})
        not_an_image = (
            "not an image Pillow can read (PNG, JPEG, WebP, ...); send the first frame as an image file"
        )
        assert_error(status, error, 400, f"image: {not_an_image}")  # the field, not the server's file
        assert error["error"]["message"] == f"image: {not_an_image}" and error["error"]["param"] == "image"
        form, headers = multipart(prompt=PROMPT, input_reference=("notes.txt", b"a text file\n"))
        status, error, _ = server.request("POST", "/v1/videos", raw=form, headers=headers)
        assert_error(status, error, 400, f"input_reference: {not_an_image}")  # as OpenAI's SDK named it
        assert error["error"]["param"] == "input_reference"
        job = server.wait(server.submit(prompt=PROMPT, image=image, num_inference_steps=2, seed=3)["id"])
        assert job["image"] is True and job["last_image"] is False
        _, sheet, _ = server.request("GET", f"/v1/videos/{job['id']}/content?variant=spritesheet")
        from openai import OpenAI  # OpenAI's SDK: the first frame as a multipart upload, input_reference

        client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        upload = ("first.png", (tmp_path / "first.png").read_bytes(), "image/png")
        steps = {"num_inference_steps": 2, "seed": 3}
        uploaded = server.wait(
            client.videos.create(prompt=PROMPT, input_reference=upload, extra_body=steps).id
        )
        assert uploaded["image"] and uploaded["size"] == job["size"]
        again = server.request("GET", f"/v1/videos/{uploaded['id']}/content?variant=spritesheet")[1]
        assert again == sheet
        assert (server.output_dir / "inputs" / f"{job['id']}.image").is_file()
        for done in (job, uploaded):
            assert server.request("DELETE", f"/v1/videos/{done['id']}")[0] == 200
        assert not list((server.output_dir / "inputs").iterdir())  # the inputs went with them
    finally:
        assert server.stop() == TERMINATED, server.stderr
    args = ["--prompt", PROMPT, "--image", str(tmp_path / "first.png"), "--num_inference_steps", "2"]
    args += [
        "--seed",
        "3",
        "--output_video",
        str(tmp_path / "cli.mp4"),
        "--preview",
        str(tmp_path / "cli.png"),
    ]
    assert generate_in_a_process("--model", "demo-i2v", *args) == 0
    (tmp_path / "job.png").write_bytes(sheet)
    cli = np.asarray(Image.open(tmp_path / "cli.png"))
    np.testing.assert_array_equal(np.asarray(Image.open(tmp_path / "job.png")), cli)
    with av.open(str(tmp_path / "cli.mp4")) as container:
        stream = container.streams.video[0]
        assert job["size"] == f"{stream.width}x{stream.height}" != "192x128"  # the image's aspect


@pytest.mark.slow
def test_a_vace_job_takes_a_control_video_a_mask_and_references(demo_env, tmp_path):
    """A VACE server: the control video, its mask and reference images as uploads (base64 in JSON)
    make the video ``generate`` makes from those files; the inputs it takes say so."""
    from wanjax.io.video import write_mp4

    rng = np.random.default_rng(1)
    write_mp4(rng.integers(0, 255, (9, 64, 96, 3), dtype=np.uint8), tmp_path / "control.mp4", fps=16)
    mask = np.zeros((64, 96, 3), np.uint8)
    mask[:, 48:] = 255
    Image.fromarray(mask).save(tmp_path / "mask.png")
    Image.fromarray(rng.integers(0, 255, (40, 30, 3), dtype=np.uint8)).save(tmp_path / "ref.png")

    def data(name: str, kind: str) -> str:
        return f"data:{kind};base64," + base64.b64encode((tmp_path / name).read_bytes()).decode()

    server = Server(tmp_path / "serve", model="demo-vace", env={"WANJAX_CACHE": str(demo_env)}).start()
    try:
        _, info, _ = server.request("GET", "/v1/server")
        assert info["inputs"] == {"image": "none", "last_image": "none", "video": "optional", "mask": "optional",
                                  "reference_images": "optional", **NO_ANIMATE_VIDEOS}  # fmt: skip
        fields = dict(
            prompt=PROMPT, num_inference_steps=2, seed=3, conditioning_scale=0.7, frames=9, size="96x64"
        )
        uploads = dict(video=data("control.mp4", "video/mp4"), mask=data("mask.png", "image/png"),
                       reference_images=[data("ref.png", "image/png")])  # fmt: skip
        many = server.request("POST", "/v1/videos", {**fields, "reference_images": [uploads["mask"]] * 5})
        assert_error(*many[:2], 400, "reference_images must be a list of up to 4 images")
        job = server.wait(server.submit(**fields, **uploads)["id"])
        assert (job["mask"], job["reference_images"], job["conditioning_scale"]) == (True, 1, 0.7)
        assert job["strength"] is None  # the video is the control, not a video to re-make
        _, sheet, _ = server.request("GET", f"/v1/videos/{job['id']}/content?variant=spritesheet")
    finally:
        assert server.stop() == TERMINATED, server.stderr
    args = ["--prompt", PROMPT, "--num_inference_steps", "2", "--seed", "3", "--conditioning_scale", "0.7"]
    args += ["--frames", "9", "--width", "96", "--height", "64"]
    args += ["--video", str(tmp_path / "control.mp4"), "--mask", str(tmp_path / "mask.png")]
    args += ["--reference_image", str(tmp_path / "ref.png"), "--preview", str(tmp_path / "cli.png")]
    assert (
        generate_in_a_process("--model", "demo-vace", *args, "--output_video", str(tmp_path / "cli.mp4")) == 0
    )
    (tmp_path / "job.png").write_bytes(sheet)
    np.testing.assert_array_equal(
        np.asarray(Image.open(tmp_path / "job.png")), np.asarray(Image.open(tmp_path / "cli.png"))
    )
