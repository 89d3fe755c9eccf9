"""The command line's requests: a job's (:mod:`wanjax.jobs.requests`) or the server's
(:mod:`wanjax.server.request`) built from the parsed flags, and those of ``wanjax plan`` and ``info``."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from wanjax.jobs.requests import DEFAULT_DTYPE, Request

R = TypeVar("R", bound=Request)


def from_flags(cls: type[R]) -> Callable[[argparse.Namespace], R]:
    """The builder of ``cls`` requests from parsed flags, their values checked (WanjaxError naming
    the flag)."""

    def build(args: argparse.Namespace) -> R:
        request = _from_namespace(cls, args)
        request.check()
        return request

    return build


@dataclasses.dataclass(frozen=True)
class PlanRequest(Request):
    """``wanjax plan``: per-device memory of a run on a mesh."""

    command: ClassVar[str] = "plan"
    model: str = "14B"
    mesh: str | None = None
    num_devices: int | None = None
    device_memory: str = "32GiB"
    height: int = 720
    width: int = 1280
    frames: int = 81
    dtype: str = DEFAULT_DTYPE
    vae_dtype: str = "float32"
    use_fsdp: bool = False
    offload: str = "none"
    weights_dtype: str = "bf16"


@dataclasses.dataclass(frozen=True)
class InfoRequest(Request):
    """``wanjax info``: what a model directory holds."""

    command: ClassVar[str] = "info"
    model: str
    revision: str | None = None
    download: bool = False


def _from_namespace(cls: type[Any], args: argparse.Namespace) -> Any:
    """``cls`` with each field from the flag of its name (groups recursively); a flag left out
    (``None``) keeps the field's default. Lists (``nargs``) become tuples."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[field.name]):
            values[field.name] = _from_namespace(hints[field.name], args)
        elif (value := getattr(args, field.name, None)) is not None:  # a flag the command lacks: default
            values[field.name] = tuple(value) if isinstance(value, list) else value
    return cls(**values)
