"""What ``wanjax serve`` is asked to run: the server's own flags and the job flags every job shares."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from wanjax.errors import WanjaxError
from wanjax.jobs.requests import (
    AttentionFlags,
    CacheFlags,
    CommonFlags,
    GenerateRequest,
    LoraFlags,
    MemoryFlags,
    ParallelFlags,
    Request,
    VaeFlags,
)

TEXT_BODY, IMAGE_BODY = 64 * 1024, 16 * 2**20  # the default request body limits


@dataclasses.dataclass(frozen=True)
class ServerFlags:
    """Where ``wanjax serve`` listens and keeps its jobs, its key, and the largest request it takes
    (``None``: the model's default frames / pixels a frame)."""

    host: str = "127.0.0.1"
    port: int = 8000
    output_dir: str = "serve_outputs"
    api_key: str | None = None
    max_queue: int = 64
    max_frames: int | None = None
    max_pixels: int | None = None
    max_steps: int = 100
    max_body_bytes: int | None = None
    device_memory: str | None = None


@dataclasses.dataclass(frozen=True)
class ServeRequest(Request):
    """``wanjax serve``: one process (per host) holding the model, generating the videos HTTP clients
    ask for; every flag but the server's applies to each job as to ``wanjax generate``."""

    command: ClassVar[str] = "serve"
    common: CommonFlags = dataclasses.field(default_factory=CommonFlags)
    dtype: str | None = None
    precision: str | None = None
    attention: AttentionFlags = dataclasses.field(default_factory=AttentionFlags)
    vae: VaeFlags = dataclasses.field(default_factory=VaeFlags)
    adapters: LoraFlags = dataclasses.field(default_factory=LoraFlags)
    cache: CacheFlags = dataclasses.field(default_factory=CacheFlags)
    memory: MemoryFlags = dataclasses.field(default_factory=MemoryFlags)
    parallel: ParallelFlags = dataclasses.field(default_factory=ParallelFlags)
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
    for name in ("max_queue", "max_frames", "max_pixels", "max_steps", "max_body_bytes"):
        value = getattr(server, name)
        if value is not None and value < 1:
            raise WanjaxError(f"--{name} must be at least 1, got {value}")
    if server.api_key is not None and not server.api_key.strip():
        raise WanjaxError("--api_key is empty; give a secret, or leave the flag out for no key")
    if cache.cache_calibrate:
        raise WanjaxError("--cache_calibrate is for one `wanjax generate` run, not for a server")
