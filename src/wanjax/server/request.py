"""What ``wanjax serve`` is asked to run: the server's own flags and the job flags every job shares."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import ClassVar

from wanjax.errors import WanjaxError
from wanjax.jobs.cache_flags import CacheFlags
from wanjax.jobs.flags import option
from wanjax.jobs.requests import GenerateRequest, RunRequest
from wanjax.server.store import DEFAULT_LEASE, check_store_flag

# the default request body limit: every model takes an upload (an image, a video to re-make or a control)
UPLOAD_BODY = 16 * 2**20


def _body_limits() -> dict[str, int]:
    return {"upload_mib": UPLOAD_BODY // 2**20}


@dataclasses.dataclass(frozen=True)
class ServerFlags:
    """Where ``wanjax serve`` listens and keeps its jobs, its key, and the largest request it takes
    (``None``: the model's default frames / pixels a frame)."""

    title: ClassVar[str] = "server"
    host: str = option("127.0.0.1", help="address to listen on (default {default}: this machine only)")
    port: int = option(8000, help="TCP port (default {default}; 0: any free port)")
    output_dir: str = option(
        "serve_outputs",
        help="videos, and the job records with --store sqlite (default {default}); replicas share one folder",
    )
    store: str = option(
        "sqlite",
        help="the job queue and records: sqlite (a file in --output_dir, one server) or a "
        "postgresql://USER@HOST/DATABASE URL that any number of replicas share (default {default})",
    )
    job_lease: float = option(
        DEFAULT_LEASE,
        help="with a postgresql:// store: seconds a replica may go silent before its running job "
        "goes back to the queue (default {default})",
    )
    api_key: str | None = option(
        help="require 'Authorization: Bearer KEY' on every API request (default $WANJAX_API_KEY; none)",
    )
    max_queue: int = option(64, help="jobs waiting at most; more get 429 (default {default})")
    max_frames: int | None = option(help="frames a video at most (default: the model's default)")
    max_pixels: int | None = option(help="width x height at most (default: the model's default size)")
    max_steps: int = option(100, help="denoising steps at most (default {default})")
    max_batch: int = option(
        1,
        help="jobs run as one batch at most: waiting jobs that differ only in prompt and seed (no "
        "upload, a sampler that draws no noise) run together, as many as fit a device by `wanjax "
        "plan`'s estimate (default {default}: one at a time)",
    )
    max_body_bytes: int | None = option(
        help="request body size at most (default {upload_mib} MiB: images and videos are uploaded in it)",
        values=_body_limits,
    )
    lora_dir: str | None = option(
        help="a folder of LoRA files (NAME.safetensors) that jobs may name in their lora and lora_2 "
        "fields, on top of --lora / --lora_2 (default: none)",
    )
    lora_cache: str = option(
        "0",
        help="device memory kept for the merged weights of recently used LoRA sets, e.g. 8GiB: a set "
        "used again is put back without merging (default {default}: merge at each change of set)",
    )
    device_memory: str | None = option(
        help="a device's memory, e.g. 80GiB: the largest request must fit it by `wanjax plan`'s estimate "
        "(default: the device's own figure where JAX reports one)",
    )


@dataclasses.dataclass(frozen=True)
class ServeRequest(RunRequest):
    """``wanjax serve``: one process (per host) holding the model, generating the videos HTTP clients
    ask for; every flag but the server's applies to each job as to ``wanjax generate``."""

    command: ClassVar[str] = "serve"
    flag_omit: ClassVar[frozenset[str]] = frozenset({"metrics_json"})  # a server writes no run's metrics
    server: ServerFlags = dataclasses.field(default_factory=ServerFlags)

    def check(self) -> None:
        """Every job flag as :func:`~wanjax.jobs.requests.check_flags` checks it, and the server's own."""
        super().check()
        check_server(self.server, self.cache)

    def job_base(self) -> GenerateRequest:
        """The ``generate`` request every job starts from: this one's flags (its text, images, video
        and sampling are the job's)."""
        shared = {field.name for field in dataclasses.fields(GenerateRequest)}
        return GenerateRequest(
            **{
                field.name: getattr(self, field.name)
                for field in dataclasses.fields(self)
                if field.name in shared
            }
        )


def check_server(server: ServerFlags, cache: CacheFlags) -> None:
    """``wanjax serve``'s own flags."""
    if not 0 <= server.port <= 65535:
        raise WanjaxError(f"--port must be between 0 (any free port) and 65535, got {server.port}")
    for name in ("max_queue", "max_frames", "max_pixels", "max_steps", "max_batch", "max_body_bytes"):
        value = getattr(server, name)
        if value is not None and value < 1:
            raise WanjaxError(f"--{name} must be at least 1, got {value}")
    check_store_flag(server.store)
    if server.lora_dir is not None and not Path(server.lora_dir).is_dir():
        raise WanjaxError(f"--lora_dir {server.lora_dir}: no such folder; give the folder of the LoRA files")
    from wanjax.planning.plan import parse_memory

    parse_memory(server.lora_cache, "--lora_cache", zero=True)
    if not server.job_lease > 0:
        raise WanjaxError(f"--job_lease must be a positive number of seconds, got {server.job_lease}")
    if server.api_key is not None and not server.api_key.strip():
        raise WanjaxError("--api_key is empty; give a secret, or leave the flag out for no key")
    if cache.cache_calibrate:
        raise WanjaxError("--cache_calibrate is for one `wanjax generate` run, not for a server")
