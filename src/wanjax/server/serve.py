"""``wanjax serve``: open the model once, then answer HTTP requests until stopped.

Start-up does every check a ``generate`` run would (a request of the model's defaults must pass
them, and the largest request the limits allow must fit a device's memory by ``wanjax plan``'s
estimate when the device's size is known), binds the port, loads the weights and puts the jobs a
dead server left back in the queue, before it prints ``wanjax serve: listening on URL`` (and how
many jobs it took back). Ctrl-C or SIGTERM stops it at the running job's next step, that job back in
the queue; it ends with one line on stderr saying so and how many jobs wait, and the exit status of
every ``wanjax`` command stopped by that signal (130, 143). Process 0 of a multi-process run serves
HTTP; the others run the jobs it sends them (:func:`engine.follow`).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
import socket
import sys
from contextlib import ExitStack, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from wanjax.errors import ConfigError, WanjaxError
from wanjax.jobs.opening import begin, defaults_of, mesh_request, open_pipeline
from wanjax.parallel.multihost import is_primary
from wanjax.server.request import UPLOAD_BODY, ServeRequest
from wanjax.server.store import MAX_ATTEMPTS, QUEUED, JobStore

if TYPE_CHECKING:
    from wanjax.server.engine import Engine

log = logging.getLogger("wanjax.serve")


def serve(request: ServeRequest) -> int:
    """Run the server until SIGINT/SIGTERM (the running job back in the queue): 128 + the signal's
    number (0 when it stopped otherwise)."""
    import jax

    from wanjax.server.engine import JobChannel, follow
    from wanjax.server.worker import Worker, clean_up

    check_serving_stack()
    begin(request.parallel)
    flags = request.server
    if not is_primary():
        engine = open_engine(request)
        follow(engine, JobChannel())
        return 0
    check_output_dir(flags.output_dir)
    # the folder's lock first: a second server on it stops here (replicas share theirs)
    store = open_store(flags.store, flags.output_dir, flags.job_lease)
    with ExitStack() as stack:
        stack.callback(store.close)
        sock = stack.enter_context(bind(flags.host, flags.port))
        engine = open_engine(request)
        swept = store.recover()  # what a dead server (or replica) left running
        clean_up(engine, swept)
        if not store.shared:
            engine.remove_partial_files()
        requeued, failed = swept.requeued, swept.failed
        worker = Worker(engine, store, JobChannel() if jax.process_count() > 1 else None, flags.max_batch)
        api_key = flags.api_key or os.environ.get("WANJAX_API_KEY") or None
        url = f"http://{url_host(*sock.getsockname()[:2])}"
        try:
            stopped_by = serve_http(engine, store, worker, api_key, sock, url, len(requeued), len(failed))
        finally:
            worker.stop()
        if stopped_by is None:
            return 0
        waiting = store.counts()[QUEUED]
        print(stopped_line(stopped_by, worker.requeued, waiting, store.shared), file=sys.stderr, flush=True)
        return 128 + stopped_by  # the shell's status of a process the signal ended (cli/signals.py's)


def jobs(count: int) -> str:
    return f"{count} job{'' if count == 1 else 's'}"


def stopped_line(signum: int, requeued: int, waiting: int, shared: bool) -> str:
    """The line a server stopped by ``signum`` ends with: what became of the ``requeued`` jobs it was
    running, and how many (those among them) wait in the queue."""
    by = "Ctrl-C (SIGINT)" if signum == signal.SIGINT else signal.Signals(signum).name
    line = f"wanjax serve: stopped by {by}"
    if requeued:
        running = "the job it was running is" if requeued == 1 else f"the {requeued} jobs it was running are"
        line += f"; {running} back in the queue, to run again from the start"
    later = "another replica or the next start" if shared else "the next start"
    queued = "no job waits" if not waiting else f"{jobs(waiting)} wait" if waiting > 1 else "1 job waits"
    return f"{line}; {queued} for {later}"


def open_store(store: str, output_dir: str, lease: float) -> JobStore:
    """The job store ``--store`` (checked with the request) names, its folder locked, for a server
    writing to ``output_dir``."""
    if store == "sqlite":
        from wanjax.server.sqlite_store import SqliteJobStore

        return SqliteJobStore(output_dir, lease)
    from wanjax.server.postgres_store import PostgresJobStore

    return PostgresJobStore(store, output_dir, lease)


def open_engine(request: ServeRequest) -> Engine:
    """The pipeline of the server's flags, checked (a request of the model's defaults must pass, the
    largest the limits allow must fit a device where its memory is known), its weights loaded."""
    from wanjax.server.api import Limits
    from wanjax.server.engine import Engine

    flags = request.server
    mesh, fsdp = mesh_request(request.parallel)
    base = request.job_base()
    pipe = open_pipeline(base, mesh, fsdp)
    defaults = defaults_of(pipe)
    limits = Limits(
        max_frames=flags.max_frames or defaults.frames,
        max_pixels=flags.max_pixels or defaults.height * defaults.width,
        max_steps=flags.max_steps,
        max_queue=flags.max_queue,
        max_body_bytes=flags.max_body_bytes or UPLOAD_BODY,
    )
    from wanjax.planning.plan import parse_memory
    from wanjax.server.loras import LoraLibrary

    loras = LoraLibrary(None if flags.lora_dir is None else Path(flags.lora_dir))
    lora_cache = parse_memory(flags.lora_cache, "--lora_cache", zero=True)
    engine = Engine(
        pipe, base, mesh, flags.output_dir, limits, device_memory(flags.device_memory), loras, lora_cache
    )
    engine.check_startup()
    pipe.load()  # the weights now: the first job pays no loading
    return engine


def check_output_dir(directory: str) -> None:
    """``--output_dir`` is (or can be made) a directory this process can write."""
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise WanjaxError(f"--output_dir {directory}: cannot create it ({e.strerror})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise WanjaxError(f"--output_dir {directory}: not writable by this user")


def check_serving_stack() -> None:
    """The optional ``serve`` extra is installed (one line naming the install otherwise)."""
    missing = [name for name in ("starlette", "uvicorn", "python_multipart") if not importable(name)]
    if missing:
        raise ConfigError(
            f"wanjax serve needs the serve extra ({', '.join(missing)} missing): pip install 'wanjax[serve]'"
        )


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a module set to None (tests) or without a spec
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: any free one), before any weight is read."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise WanjaxError(f"--host {host}: cannot resolve it ({e.strerror})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise WanjaxError(
            f"cannot listen on {host}:{port}: {e.strerror} (another server there? try --port)"
        ) from None
    sock.listen(128)
    return sock


def url_host(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def device_memory(given: str | None) -> int | None:
    """``--device_memory`` in bytes, else the first device's own figure (None where JAX has none: CPU)."""
    if given is not None:
        from wanjax.planning.plan import parse_memory

        return parse_memory(given)
    from wanjax.planning.device_memory import device_memory_limit

    return device_memory_limit()


def serve_http(
    engine, store, worker, api_key, sock: socket.socket, url: str, requeued: int, failed: int
) -> int | None:
    """Run uvicorn on ``sock`` with the app; announce the URL (and the ``requeued`` and ``failed``
    jobs a stopped server left running) once it accepts requests. The signal that stopped it (None:
    none)."""
    import uvicorn

    from wanjax.server.app import create_app
    from wanjax.server.http_protocol import JsonErrorH11Protocol

    app = create_app(engine, store, worker, api_key)

    @asynccontextmanager
    async def lifespan(_app):
        worker.start()
        restored = ""
        if requeued:
            again = "it runs" if requeued == 1 else "they run"
            restored += f" (took back {jobs(requeued)} a server left running: {again} again from the start)"
        if failed:
            each = "it" if failed == 1 else "each"
            restored += (
                f" ({jobs(failed)} failed, not retried: servers stopped running {each} {MAX_ATTEMPTS} times)"
            )
        print(f"wanjax serve: listening on {url}{restored}", flush=True)
        yield

    app.router.lifespan_context = lifespan
    logging.basicConfig(level=logging.INFO, format="wanjax serve: %(message)s", stream=sys.stderr)
    config = uvicorn.Config(
        app, http=JsonErrorH11Protocol, log_level="warning", access_log=False, timeout_graceful_shutdown=5
    )
    # uvicorn stops on SIGINT/SIGTERM, then raises the signals it caught again under the handlers it
    # found, last caught first: these, which note them, so that the caller's clean-up runs (the
    # running job back to the queue) and it says why it stopped.
    received: list[int] = []
    for stop in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop, lambda number, frame: received.append(number))
    uvicorn.Server(config).run(sockets=[sock])
    return received[-1] if received else None  # the first caught
