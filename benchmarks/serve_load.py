"""Load test of ``wanjax serve``: many concurrent clients against one warm demo-model server.

Starts the server as a real process (``python -m wanjax.cli serve --model demo --host 127.0.0.1
--port 0 --output_dir DIR --max_queue Q``; DIR a temporary directory unless ``--output_dir``), waits
for its ``wanjax serve: listening on http://127.0.0.1:PORT`` line, runs one warm-up job of the load's
shape (not counted: it compiles), then ``--clients`` threads submit ``--jobs`` small demo jobs in all
(``{"prompt": "load test i", "num_inference_steps": S, "seed": i}``, the demo's default size and
frames). Each client submits a job, polls ``GET /v1/videos/{id}`` until it is completed or failed,
then submits its next; a 429 (queue full) is counted and retried after a short backoff. The default
``--max_queue 16`` is below the 50 clients, so the queue overflows and 429s are part of the run.
Every loop is bounded: ``--max_retries`` rejections per job, the ``--deadline`` of the whole load,
``--request_timeout`` per request. The server is stopped at the end (SIGTERM; SIGKILL after 30 s).

Measured: jobs accepted / completed / failed, 429 rejections, wall time and jobs per minute, latency
from the accepted POST to the first poll that sees the job completed (p50 / p95 / max; polls every
``--poll_interval``, so each is late by up to that), queue wait measured by the client (202 to the
first poll that sees ``in_progress``; the API's ``created_at``/``started_at`` are whole seconds), the
server's resident memory (``/proc/PID/status`` VmRSS every ``--sample_interval``: start of the load,
after 25 % of the jobs, peak, end, and the growth from 25 % to the end: a leak shows as growth) and
its thread count, and the compiled programs of the warm-up job and of the first load job (0: the
second job of a shape compiles nothing).

Checked (exit status 1 if any fails): every accepted job completed (its status, re-read at the end,
is ``completed``; ``GET /v1/videos/{id}/content`` returns a non-empty ``video/mp4`` with an ``ftyp``
box, for ``--content_sample`` of them, all with ``--check_all``), every rejection was a 429 with the
contract's JSON error body, no POST had another answer, and ``GET /v1/videos`` lists every job.

    python benchmarks/serve_load.py                                  # 50 clients, 200 jobs, 4 steps
    python benchmarks/serve_load.py --clients 5 --jobs 10            # a smoke run
    python benchmarks/serve_load.py --check_all --json out/serve_load.json
    python benchmarks/serve_load.py --max_batch 4                    # waiting jobs alike run as batches

Client side: the standard library only (``urllib.request``, threads); it talks to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import math
import os
import platform
import random
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
READY_LINE = re.compile(r"wanjax serve: listening on http://127\.0\.0\.1:(\d+)")
READY_LOOSE = re.compile(r"listening on http://\S+?:(\d+)")
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
TERMINAL = ("completed", "failed")
ERROR_TYPES = (
    "invalid_request_error",
    "authentication_error",
    "not_found_error",
    "conflict_error",
    "rate_limit_error",
    "request_too_large",
    "server_error",
)
MiB = 2**20


# ----------------------------------------------------------------------------------------------
# HTTP


@dataclass
class Response:
    status: int | None  # None: no answer (connection refused or reset, timeout)
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    error: str | None = None

    def json(self) -> Any:
        """The body as JSON; None if it is not JSON."""
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    def describe(self) -> str:
        if self.status is None:
            return f"no answer ({self.error})"
        return f"{self.status} {self.body[:200]!r}"


def request(base: str, method: str, path: str, body: Any = None, timeout: float = 30.0) -> Response:
    """One request to the server; HTTP errors are answers, not exceptions."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with OPENER.open(req, timeout=timeout) as r:
            return Response(r.status, r.read(), {k.lower(): v for k, v in r.headers.items()})
    except urllib.error.HTTPError as e:
        try:
            payload = e.read()
        except (OSError, http.client.HTTPException):
            payload = b""
        finally:
            e.close()
        return Response(e.code, payload, {k.lower(): v for k, v in (e.headers or {}).items()})
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        return Response(None, error=f"{type(e).__name__}: {e}")


def error_body_problem(resp: Response) -> str | None:
    """What is wrong with an error answer's body against the contract's
    ``{"error": {"message", "type", "param", "code"}}``; None if nothing."""
    obj = resp.json()
    if obj is None:
        return f"body is not JSON: {resp.body[:120]!r}"
    err = obj.get("error") if isinstance(obj, dict) else None
    if not isinstance(err, dict):
        return f'no "error" object: {resp.body[:120]!r}'
    message = err.get("message")
    if not isinstance(message, str) or not message or "\n" in message:
        return f"error.message is not a one-line string: {message!r}"
    if err.get("type") not in ERROR_TYPES:
        return f"error.type {err.get('type')!r} is not one of the contract's"
    missing = [k for k in ("param", "code") if k not in err]
    if missing:
        return f"error has no {', '.join(missing)}"
    return None


# ----------------------------------------------------------------------------------------------
# The server process


def proc_status(pid: int) -> dict[str, int] | None:
    """VmRSS, VmHWM (bytes) and Threads from ``/proc/PID/status``; None once the process is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024  # kB
        elif key == "Threads":
            out[key] = int(value)
    return out


class Server:
    """``wanjax serve`` as a child process in a session of its own; its output (stdout and stderr
    together) is drained by a thread, kept as a tail, and echoed to stderr with ``echo``."""

    def __init__(self, cmd: list[str], echo: bool):
        self.cmd = cmd
        self.echo = echo
        self.tail: deque[str] = deque(maxlen=40)
        self.ready = threading.Event()
        self.port: int | None = None
        self.ready_line: str | None = None
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._drain, name="server-output", daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.tail.append(line)
            if self.echo:
                print(f"[server] {line}", file=sys.stderr, flush=True)
            if not self.ready.is_set():
                match = READY_LINE.fullmatch(line.strip()) or READY_LOOSE.search(line)
                if match:
                    self.port, self.ready_line = int(match.group(1)), line
                    self.ready.set()

    def wait_ready(self, timeout: float) -> float:
        """Seconds until the listening line; raises if it does not come in ``timeout`` seconds."""
        deadline = time.perf_counter() + timeout
        while not self.ready.wait(0.5):
            if self.proc.poll() is not None:
                self._reader.join(5)
                raise RuntimeError(f"the server exited ({self.proc.returncode}) before listening")
            if time.perf_counter() > deadline:
                raise RuntimeError(f"no listening line on stdout in {timeout:.0f} s (is it flushed?)")
        return time.perf_counter() - self.started

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace: float = 30.0) -> dict[str, Any]:
        """SIGTERM, then SIGKILL to its process group after ``grace`` seconds."""
        if self.proc.poll() is not None:
            return {"how": "had exited", "exit_code": self.proc.returncode, "seconds": 0.0}
        start = time.perf_counter()
        how = "SIGTERM"
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            how = f"SIGKILL (SIGTERM not obeyed in {grace:.0f} s)"
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._reader.join(5)
        return {"how": how, "exit_code": self.proc.returncode, "seconds": time.perf_counter() - start}


# ----------------------------------------------------------------------------------------------
# The load


@dataclass
class Job:
    index: int
    prompt: str
    outcome: str = "not_started"  # completed | failed | gave_up | post_error | lost | timeout | not_started
    id: str | None = None
    rejections: int = 0
    submitted: float | None = None  # when the POST that was accepted was sent (s from the load's start)
    accepted: float | None = None  # when its 202 came
    started_seen: float | None = None  # the first answer that showed it in_progress (or later)
    finished_seen: float | None = None  # the first answer that showed it completed or failed
    queue_wait_estimated: bool = False  # never seen in_progress: wait from run_seconds
    polls: int = 0
    poll_errors: int = 0
    error: str | None = None
    final: dict[str, Any] | None = None  # the last video object seen

    @property
    def latency(self) -> float | None:
        if self.outcome != "completed" or self.submitted is None or self.finished_seen is None:
            return None
        return self.finished_seen - self.submitted

    @property
    def queue_wait(self) -> float | None:
        if self.accepted is None:
            return None
        if self.started_seen is not None:
            return self.started_seen - self.accepted
        run = (self.final or {}).get("run_seconds")
        if self.outcome == "completed" and self.finished_seen is not None and isinstance(run, (int, float)):
            return max(0.0, self.finished_seen - self.accepted - run)
        return None


class Load:
    """The shared state of the clients."""

    def __init__(self, args: argparse.Namespace, base: str, server: Server):
        self.args = args
        self.base = base
        self.server = server
        self.jobs = [Job(i, f"load test {i}") for i in range(args.jobs)]
        self.lock = threading.Lock()
        self.next_index = 0
        self.finished = 0  # jobs whose client is done with them, any outcome
        self.stop = threading.Event()
        self.t0 = time.perf_counter()
        self.deadline = self.t0 + args.deadline
        self.rejection_types: Counter[str] = Counter()
        self.bad_rejections: list[str] = []
        self.post_errors: list[str] = []
        self.server_exit: int | None = None

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def expired(self) -> bool:
        return self.stop.is_set() or time.perf_counter() > self.deadline

    def take(self) -> Job | None:
        with self.lock:
            if self.next_index >= len(self.jobs) or self.expired():
                return None
            job = self.jobs[self.next_index]
            self.next_index += 1
            return job

    def client(self, number: int) -> None:
        rng = random.Random(number)
        while (job := self.take()) is not None:
            try:
                self.run_job(job, rng)
            except Exception as e:  # a bug here must not hang the run: record it and go on
                job.error = f"client error: {type(e).__name__}: {e}"
                if job.id is None:
                    job.outcome = "post_error"
                    self.post_errors.append(f"job {job.index}: {job.error}")
                else:
                    job.outcome = "lost"  # verify() reports it: accepted, not completed
            with self.lock:
                self.finished += 1

    def run_job(self, job: Job, rng: random.Random) -> None:
        a = self.args
        body = {"prompt": job.prompt, "num_inference_steps": a.steps, "seed": job.index}
        while True:  # submit; bounded by --max_retries rejections and the deadline
            if self.expired():
                job.outcome = "timeout"
                return
            sent = self.now()
            resp = request(self.base, "POST", "/v1/videos", body, a.request_timeout)
            if resp.status == 202:
                obj = resp.json()
                if not isinstance(obj, dict) or not isinstance(obj.get("id"), str):
                    job.outcome, job.error = "post_error", f"202 without a video object: {resp.body[:200]!r}"
                    self.post_errors.append(f"job {job.index}: {job.error}")
                    return
                job.id, job.submitted, job.accepted = obj["id"], sent, self.now()
                self.observe(job, obj)
                break
            if resp.status == 429:
                job.rejections += 1
                obj = resp.json()
                err = obj.get("error") if isinstance(obj, dict) else None
                self.rejection_types[
                    str(err.get("type")) if isinstance(err, dict) else "(no JSON error)"
                ] += 1
                problem = error_body_problem(resp)
                ctype = resp.headers.get("content-type", "")
                if problem is None and not ctype.startswith("application/json"):
                    problem = f"Content-Type {ctype!r}"
                if problem:
                    self.bad_rejections.append(f"job {job.index}: {problem}")
                if job.rejections >= a.max_retries:
                    job.outcome = "gave_up"
                    return
                delay = min(a.backoff * 2 ** min(job.rejections - 1, 3), 2.0) * rng.uniform(0.5, 1.5)
                self.stop.wait(delay)
                continue
            job.outcome, job.error = "post_error", f"POST answered {resp.describe()}"
            self.post_errors.append(f"job {job.index}: {job.error}")
            return
        max_polls = int(a.deadline / a.poll_interval) + 10
        while job.final is None or job.final.get("status") not in TERMINAL:  # poll
            if self.expired() or job.polls >= max_polls:
                job.outcome = "timeout"
                why = "the server exited" if self.server_exit is not None else "the load's deadline came"
                job.error = f"last status {(job.final or {}).get('status')!r} when {why}"
                return
            self.stop.wait(a.poll_interval)
            job.polls += 1
            resp = request(self.base, "GET", f"/v1/videos/{job.id}", timeout=a.request_timeout)
            obj = resp.json() if resp.status == 200 else None
            if isinstance(obj, dict):
                self.observe(job, obj)
            else:
                job.poll_errors += 1
                job.error = f"poll answered {resp.describe()}"
                if resp.status == 404:
                    job.outcome = "lost"
                    return
        job.outcome = job.final["status"]
        if job.outcome == "failed":
            job.error = f"failed: {job.final.get('error')}"
        else:
            job.error = None

    def observe(self, job: Job, obj: dict[str, Any]) -> None:
        t = self.now()
        job.final = obj
        status = obj.get("status")
        if status == "in_progress" and job.started_seen is None:
            job.started_seen = t
        if status in TERMINAL and job.finished_seen is None:
            job.finished_seen = t
            job.queue_wait_estimated = job.started_seen is None


class Sampler:
    """The server's VmRSS and thread count every ``interval`` seconds, with the load's progress."""

    def __init__(self, load: Load, interval: float):
        self.load, self.interval = load, interval
        self.samples: list[dict[str, Any]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def sample(self) -> dict[str, Any] | None:
        status = proc_status(self.load.server.proc.pid)
        if status is None or "VmRSS" not in status:
            return None
        record = {
            "t": round(self.load.now(), 3),
            "rss": status["VmRSS"],
            "hwm": status.get("VmHWM"),
            "threads": status.get("Threads"),
            "finished": self.load.finished,
        }
        self.samples.append(record)
        return record

    def _run(self) -> None:
        while not self.done.wait(self.interval):
            if not self.load.server.alive():
                self.load.server_exit = self.load.server.proc.returncode
                self.load.stop.set()  # every client gives up at once
                return
            self.sample()


# ----------------------------------------------------------------------------------------------
# Helpers


def batch_sizes(out_dir: str, ids: list[str]) -> dict[int, int]:
    """Jobs by the size of the batch they ran in, from their run records (``server.batch``)."""
    sizes: Counter[int] = Counter()
    for job_id in ids:
        path = Path(out_dir) / "videos" / f"{job_id}.json"
        record = json.loads(path.read_text()) if path.exists() else {}
        sizes[len(record.get("server", {}).get("batch", [job_id]))] += 1
    return dict(sorted(sizes.items()))


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks; None for no values."""
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def fmt_s(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f} s"


def fmt_mib(x: float | None) -> str:
    return "n/a" if x is None else f"{x / MiB:.1f} MiB"


def machine() -> dict[str, Any]:
    model = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    nproc = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "nproc": nproc,
        "cpu_model": model,
        "memory_bytes": mem,
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def wait_job(base: str, video_id: str, timeout: float, request_timeout: float, interval: float) -> dict:
    """Poll a job until completed or failed; its last video object (raises after ``timeout`` s)."""
    deadline = time.perf_counter() + timeout
    last: Any = None
    for _ in range(int(timeout / interval) + 10):
        if time.perf_counter() > deadline:
            break
        resp = request(base, "GET", f"/v1/videos/{video_id}", timeout=request_timeout)
        obj = resp.json() if resp.status == 200 else None
        if isinstance(obj, dict):
            last = obj
            if obj.get("status") in TERMINAL:
                return obj
        elif resp.status == 404:
            raise RuntimeError(f"job {video_id} vanished (404)")
        time.sleep(interval)
    raise RuntimeError(f"job {video_id} not done in {timeout:.0f} s (last: {last!r:.300})")


def warm_up(args: argparse.Namespace, base: str) -> dict[str, Any]:
    """One job of the load's shape, waited for (it compiles the programs the load reuses)."""
    body = {"prompt": "load test warm-up", "num_inference_steps": args.steps, "seed": args.jobs}
    start = time.perf_counter()
    for _ in range(args.max_retries):
        resp = request(base, "POST", "/v1/videos", body, args.request_timeout)
        if resp.status != 429:
            break
        time.sleep(1.0)
    obj = resp.json()
    if resp.status != 202 or not isinstance(obj, dict) or "id" not in obj:
        raise RuntimeError(f"warm-up POST answered {resp.describe()}")
    final = wait_job(base, obj["id"], args.warmup_timeout, args.request_timeout, args.poll_interval)
    if final.get("status") != "completed":
        raise RuntimeError(f"warm-up job failed: {final.get('error')!r}")
    return {
        "id": final["id"],
        "seconds": time.perf_counter() - start,
        **{
            k: final.get(k) for k in ("compiled_programs", "compile_seconds", "run_seconds", "size", "frames")
        },
    }


def verify(args: argparse.Namespace, base: str, load: Load, warm_id: str) -> dict[str, Any]:
    """The end checks: statuses re-read, content of a sample (all with --check_all), the list."""
    accepted = [j for j in load.jobs if j.id is not None]
    problems: list[str] = []

    not_completed = []
    for job in accepted:
        resp = request(base, "GET", f"/v1/videos/{job.id}", timeout=args.request_timeout)
        obj = resp.json() if resp.status == 200 else None
        status = obj.get("status") if isinstance(obj, dict) else None
        if status != "completed":
            not_completed.append(job.id)
            problems.append(f"job {job.index} ({job.id}): status {status!r} ({job.outcome}; {job.error})")
        elif obj.get("id") != job.id:
            problems.append(f"job {job.index}: GET /v1/videos/{job.id} answered id {obj.get('id')!r}")

    completed = [j for j in accepted if j.id not in not_completed]
    rng = random.Random(0)
    sample = completed if args.check_all else rng.sample(completed, min(args.content_sample, len(completed)))
    sizes = []
    for job in sample:
        resp = request(base, "GET", f"/v1/videos/{job.id}/content", timeout=max(args.request_timeout, 60))
        ctype = resp.headers.get("content-type", "")
        if resp.status != 200:
            problems.append(f"job {job.index}: content answered {resp.describe()}")
        elif not ctype.startswith("video/mp4"):
            problems.append(f"job {job.index}: content has Content-Type {ctype!r}")
        elif not resp.body or resp.body[4:8] != b"ftyp":
            problems.append(
                f"job {job.index}: content is not an mp4 ({len(resp.body)} bytes: {resp.body[:16]!r})"
            )
        else:
            sizes.append(len(resp.body))

    # GET /v1/videos, newest first, page by page until every job is found (bounded)
    wanted = {j.id for j in accepted} | {warm_id}
    seen: dict[str, str] = {}
    duplicates = 0
    pages, after = 0, None
    max_pages = math.ceil(len(wanted) / 20) + 20
    list_error = None
    while pages < max_pages and not wanted <= seen.keys():
        query = "/v1/videos?limit=20&order=desc" + (f"&after={after}" if after else "")
        resp = request(base, "GET", query, timeout=args.request_timeout)
        obj = resp.json() if resp.status == 200 else None
        pages += 1
        if not isinstance(obj, dict) or not isinstance(obj.get("data"), list):
            list_error = f"GET {query} answered {resp.describe()}"
            break
        for video in obj["data"]:
            if not isinstance(video, dict):
                continue
            if video.get("id") in seen:
                duplicates += 1
            seen[video.get("id")] = video.get("status")
        if not obj["data"] or not obj.get("has_more"):
            break
        after = obj.get("last_id") or obj["data"][-1].get("id")
    missing = sorted(wanted - seen.keys())
    if list_error:
        problems.append(list_error)
    if missing:
        problems.append(
            f"GET /v1/videos does not list {len(missing)} of the {len(wanted)} jobs: {missing[:5]}"
        )
    if duplicates:
        problems.append(f"GET /v1/videos listed {duplicates} jobs twice across pages")
    listed_not_completed = [i for i in wanted if i in seen and seen[i] != "completed"]
    if listed_not_completed:
        problems.append(f"GET /v1/videos shows {len(listed_not_completed)} of the jobs not completed")

    server = request(base, "GET", "/v1/server", timeout=args.request_timeout).json()
    queue = server.get("queue") if isinstance(server, dict) else None
    return {
        "accepted": len(accepted),
        "completed_at_end": len(completed),
        "content_checked": len(sample),
        "content_ok": len(sizes),
        "mp4_bytes_median": statistics.median(sizes) if sizes else None,
        "list_pages": pages,
        "listed_of_wanted": len(wanted) - len(missing),
        "wanted": len(wanted),
        "queue_at_end": queue,
        "problems": problems,
    }


# ----------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=50, help="concurrent client threads (default 50)")
    parser.add_argument("--jobs", type=int, default=200, help="jobs in all (default 200)")
    parser.add_argument("--steps", type=int, default=4, help="num_inference_steps of each job (default 4)")
    parser.add_argument("--max_queue", type=int, default=16, help="the server's --max_queue (default 16)")
    parser.add_argument("--max_batch", type=int, default=1, help="the server's --max_batch (default 1)")
    parser.add_argument("--max_retries", type=int, default=200, help="429s before a job gives up")
    parser.add_argument("--deadline", type=float, default=900.0, help="seconds for the whole load")
    parser.add_argument("--backoff", type=float, default=0.25, help="first wait after a 429 (s; doubles)")
    parser.add_argument("--poll_interval", type=float, default=0.2, help="seconds between status polls")
    parser.add_argument("--request_timeout", type=float, default=30.0, help="seconds per request")
    parser.add_argument("--sample_interval", type=float, default=0.5, help="seconds between RSS samples")
    parser.add_argument("--ready_timeout", type=float, default=180.0, help="seconds for the listening line")
    parser.add_argument("--warmup_timeout", type=float, default=600.0, help="seconds for the warm-up job")
    parser.add_argument("--content_sample", type=int, default=20, help="jobs whose mp4 is fetched")
    parser.add_argument("--check_all", action="store_true", help="fetch every job's mp4")
    parser.add_argument("--output_dir", help="the server's --output_dir (default: a temporary directory)")
    parser.add_argument("--verbose", action="store_true", help="echo the server's output to stderr")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    if args.clients < 1 or args.jobs < 1 or args.max_retries < 1:
        parser.error("--clients, --jobs and --max_retries must be at least 1")

    command = shlex.join([sys.executable, *sys.argv])
    temp_dir = None if args.output_dir else tempfile.mkdtemp(prefix="wanjax-serve-load-")
    out_dir = args.output_dir or temp_dir
    server_cmd = [
        sys.executable,
        "-m",
        "wanjax.cli",
        "serve",
        "--model",
        "demo",
        "--host",
        HOST,
        "--port",
        "0",
        "--output_dir",
        out_dir,
        "--max_queue",
        str(args.max_queue),
        "--max_batch",
        str(args.max_batch),
    ]
    results: dict[str, Any] = {
        "command": command,
        "server_command": shlex.join(server_cmd),
        "machine": machine(),
        "args": vars(args),
    }
    m = results["machine"]
    print(
        f"wanjax serve load test: {args.clients} clients, {args.jobs} jobs, {args.steps} steps, "
        f"--max_queue {args.max_queue}, --max_batch {args.max_batch}"
    )
    print(f"machine: {m['nproc']} CPUs ({m['cpu_model']}), {(m['memory_bytes'] or 0) / 2**30:.1f} GiB memory")
    print(f"command: {command}")
    print(f"server: {results['server_command']}", flush=True)

    failures: list[str] = []
    notes: list[str] = []  # contract differences that do not fail the run
    server = None
    try:
        server = Server(server_cmd, args.verbose)
        ready_s = server.wait_ready(args.ready_timeout)
        base = f"http://{HOST}:{server.port}"
        results["ready_seconds"] = ready_s
        if not READY_LINE.fullmatch(server.ready_line.strip()):
            notes.append(f"listening line differs from the contract's: {server.ready_line!r}")
        print(f"server listening on {base} after {ready_s:.1f} s (pid {server.proc.pid})")

        info = request(base, "GET", "/v1/server", timeout=args.request_timeout).json() or {}
        results["server_info"] = info
        limits, defaults = info.get("limits") or {}, info.get("defaults") or {}
        if limits.get("max_queue") != args.max_queue:
            notes.append(f"/v1/server limits.max_queue is {limits.get('max_queue')!r}, not {args.max_queue}")
        if info.get("model") != "demo":
            notes.append(f"/v1/server model is {info.get('model')!r}")
        print(
            f"server defaults: size {defaults.get('size')}, frames {defaults.get('frames')}, limits {limits}"
        )

        warm = warm_up(args, base)
        results["warmup"] = warm
        print(
            f"warm-up job: {warm['seconds']:.1f} s, compiled_programs {warm['compiled_programs']}, "
            f"compile {fmt_s(warm['compile_seconds'])}, run {fmt_s(warm['run_seconds'])} "
            f"({warm['size']}, {warm['frames']} frames)",
            flush=True,
        )

        load = Load(args, base, server)
        sampler = Sampler(load, args.sample_interval)
        start_sample = sampler.sample()
        sampler.thread.start()
        clients = [
            threading.Thread(target=load.client, args=(n,), name=f"client-{n}", daemon=True)
            for n in range(min(args.clients, args.jobs))
        ]
        for c in clients:
            c.start()
        join_deadline = load.deadline + args.request_timeout + 30
        for c in clients:
            c.join(max(0.0, join_deadline - time.perf_counter()))
        wall = load.now()
        stuck = sum(c.is_alive() for c in clients)
        load.stop.set()
        sampler.done.set()
        sampler.thread.join(5)
        end_sample = sampler.sample()
        if stuck:
            failures.append(f"{stuck} client threads still running after the deadline")

        jobs = load.jobs
        outcomes = Counter(j.outcome for j in jobs)
        accepted = [j for j in jobs if j.id is not None]
        completed = [j for j in jobs if j.outcome == "completed"]
        latencies = [j.latency for j in completed if j.latency is not None]
        waits = [w for j in accepted if (w := j.queue_wait) is not None]
        estimated = sum(j.queue_wait_estimated and j.queue_wait is not None for j in accepted)
        runs = [r for j in completed if isinstance(r := (j.final or {}).get("run_seconds"), (int, float))]
        first = min(accepted, key=lambda j: j.accepted) if accepted else None
        compiled = [(j.final or {}).get("compiled_programs") for j in completed]
        rejections = sum(j.rejections for j in jobs)

        samples = sampler.samples
        quarter = math.ceil(0.25 * args.jobs)
        at_quarter = next((s for s in samples if s["finished"] >= quarter), None)
        peak = max(samples, key=lambda s: s["rss"]) if samples else None
        growth = end_sample["rss"] - at_quarter["rss"] if at_quarter and end_sample else None
        results["load"] = {
            "jobs": args.jobs,
            "accepted": len(accepted),
            "completed": len(completed),
            "failed": outcomes["failed"],
            "outcomes": dict(outcomes),
            "rejections_429": rejections,
            "rejection_types": dict(load.rejection_types),
            "malformed_rejections": len(load.bad_rejections),
            "post_errors": len(load.post_errors),
            "poll_errors": sum(j.poll_errors for j in jobs),
            "polls": sum(j.polls for j in jobs),
            "wall_seconds": wall,
            "jobs_per_minute": len(completed) / wall * 60 if wall > 0 else None,
            "latency_p50": percentile(latencies, 50),
            "latency_p95": percentile(latencies, 95),
            "latency_max": max(latencies) if latencies else None,
            "queue_wait_p50": percentile(waits, 50),
            "queue_wait_p95": percentile(waits, 95),
            "queue_wait_estimated": estimated,
            "run_seconds_median": statistics.median(runs) if runs else None,
            "first_job_compiled_programs": (first.final or {}).get("compiled_programs") if first else None,
            "jobs_that_compiled": sum(1 for c in compiled if c),
            "batch_sizes": batch_sizes(out_dir, [j.id for j in completed]),
            "rss_start": start_sample and start_sample["rss"],
            "rss_quarter": at_quarter and at_quarter["rss"],
            "rss_peak": peak and peak["rss"],
            "rss_end": end_sample and end_sample["rss"],
            "rss_growth_quarter_to_end": growth,
            "vm_hwm_end": end_sample and end_sample["hwm"],
            "threads_start": start_sample and start_sample["threads"],
            "threads_end": end_sample and end_sample["threads"],
            "threads_peak": max((s["threads"] for s in samples if s["threads"]), default=None),
        }
        r = results["load"]
        print(
            f"\nload: {wall:.1f} s wall, {len(completed)} jobs completed: "
            f"{r['jobs_per_minute'] or 0:.1f} jobs/min (median run_seconds {fmt_s(r['run_seconds_median'])})"
        )
        print(
            f"jobs: {args.jobs} submitted, {len(accepted)} accepted, {len(completed)} completed, "
            f"{outcomes['failed']} failed; outcomes {dict(outcomes)}"
        )
        print(
            f"429 rejections: {rejections} (types {dict(load.rejection_types)}; "
            f"{len(load.bad_rejections)} not the contract's JSON error)"
        )
        print(
            f"requests: {r['polls']} polls ({r['poll_errors']} unanswered or not 200), "
            f"{len(load.post_errors)} POSTs answered other than 202/429"
        )
        print(
            f"latency submit -> completed: p50 {fmt_s(r['latency_p50'])}, p95 {fmt_s(r['latency_p95'])}, "
            f"max {fmt_s(r['latency_max'])}"
        )
        print(
            f"queue wait (202 -> first seen in_progress): p50 {fmt_s(r['queue_wait_p50'])}, "
            f"p95 {fmt_s(r['queue_wait_p95'])} ({estimated} of {len(waits)} never seen in_progress: "
            "estimated as completed - 202 - run_seconds)"
        )
        print(f"jobs by the size of the batch they ran in: {r['batch_sizes']}")
        print(
            f"compiled programs: warm-up job {warm['compiled_programs']}, first load job "
            f"{r['first_job_compiled_programs']}, load jobs that compiled anything {r['jobs_that_compiled']}"
        )
        growth_pct = f" ({growth / at_quarter['rss']:+.1%})" if growth is not None else ""
        print(
            f"server RSS: start of load {fmt_mib(r['rss_start'])}, after 25% ({quarter} jobs) "
            f"{fmt_mib(r['rss_quarter'])}, peak {fmt_mib(r['rss_peak'])}, end {fmt_mib(r['rss_end'])}; "
            f"growth 25% -> end {'n/a' if growth is None else f'{growth / MiB:+.1f} MiB'}{growth_pct}; "
            f"VmHWM {fmt_mib(r['vm_hwm_end'])} ({len(samples)} samples)"
        )
        print(f"server threads: start {r['threads_start']}, end {r['threads_end']}, peak {r['threads_peak']}")
        if rejections == 0:
            notes.append(f"no 429 seen: {args.clients} clients never overflowed --max_queue {args.max_queue}")
        if r["jobs_that_compiled"]:
            notes.append(
                f"{r['jobs_that_compiled']} load jobs compiled programs (the warm-up had the same shape)"
            )

        if not server.alive():  # nothing to check against: say so once
            load.server_exit = server.proc.returncode
            lost = [j for j in accepted if j.outcome != "completed"]
            failures.append(
                f"the server exited ({load.server_exit}) during the load; {len(lost)} of {len(accepted)} "
                "accepted jobs not completed; end checks skipped"
            )
            checks = {"problems": [], "skipped": "the server exited"}
        else:
            checks = verify(args, base, load, warm["id"])
            results["checks"] = checks
            print(
                f"\nchecks: {checks['completed_at_end']} of {checks['accepted']} accepted jobs completed; "
                f"mp4 content ok for {checks['content_ok']} of {checks['content_checked']} fetched "
                f"(median {checks['mp4_bytes_median']} bytes); /v1/videos lists {checks['listed_of_wanted']} "
                f"of {checks['wanted']} jobs ({checks['list_pages']} pages); queue at end {checks['queue_at_end']}"
            )
            failures += checks["problems"]
        failures += [f"malformed 429: {p}" for p in load.bad_rejections[:10]]
        failures += load.post_errors[:10]
        if len(load.bad_rejections) > 10:
            failures.append(f"... {len(load.bad_rejections)} malformed 429s in all")
        if len(load.post_errors) > 10:
            failures.append(f"... {len(load.post_errors)} POSTs answered other than 202/429 in all")
        if outcomes["gave_up"] or outcomes["not_started"] or outcomes["timeout"]:
            notes.append(
                f"jobs never accepted: {outcomes['gave_up']} gave up after --max_retries 429s, "
                f"{outcomes['not_started'] + outcomes['timeout']} cut by the deadline (or the server's exit)"
            )
        queue = checks.get("queue_at_end")
        if isinstance(queue, dict) and (queue.get("queued") or queue.get("in_progress")):
            notes.append(f"/v1/server queue not empty at the end: {queue}")
        results["jobs"] = [
            {
                **{k: v for k, v in asdict(j).items() if k != "final"},
                "latency": j.latency,
                "queue_wait": j.queue_wait,
                **{
                    k: (j.final or {}).get(k) for k in ("compiled_programs", "compile_seconds", "run_seconds")
                },
            }
            for j in jobs
        ]
        results["samples"] = samples
    except Exception as e:
        failures.append(f"{type(e).__name__}: {e}")
        if server is not None:
            print(
                "\nserver output (last lines):\n  " + ("\n  ".join(server.tail) or "(none)"), file=sys.stderr
            )
    finally:
        if server is not None:
            stopped = server.stop()
            results["server_stop"] = stopped
            print(
                f"\nserver stopped: {stopped['how']}, exit code {stopped['exit_code']}, "
                f"{stopped['seconds']:.1f} s"
            )
        if temp_dir:
            shutil.rmtree(temp_dir, ignore_errors=True)

    results["notes"], results["failures"] = notes, failures
    for note in notes:
        print(f"note: {note}")
    for failure in failures:
        print(f"FAIL: {failure}")
    print("result: " + ("FAIL" if failures else "ok"))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2, default=str)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
