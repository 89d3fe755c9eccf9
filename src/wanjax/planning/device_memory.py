"""The memory one device can hold here, and what each stage of a run needs of it by ``plan``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax

from wanjax.parallel.mesh import MeshSpec
from wanjax.planning.models import Model
from wanjax.planning.plan import plan

__all__ = ["available_memory", "device_memory_limit", "host_available", "plan_needs"]


def device_memory_limit() -> int | None:
    """The first local device's allocator limit (``memory_stats()["bytes_limit"]``; None where the
    device keeps no statistics: CPU)."""
    return (jax.local_devices()[0].memory_stats() or {}).get("bytes_limit")


def host_available() -> int | None:
    """The memory this machine can still give (``MemAvailable``; None where it does not say)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def available_memory() -> tuple[int | None, str]:
    """What one device can hold and what it is called: a CPU's free RAM (its device memory and host
    memory are the same RAM), an accelerator's allocator limit. None where neither is known."""
    device = jax.devices()[0]
    if device.platform == "cpu":
        return host_available(), "this machine"
    return device_memory_limit(), f"one {device.device_kind}"


def plan_needs(model: Model, mesh: MeshSpec, **arguments: Any) -> dict[str, int]:
    """Bytes each stage of a run (``plan``'s ``arguments``) needs on one device: its weights (on a CPU,
    whose device and host memory are one RAM, all of them, those waiting in host memory included) and
    its activations."""
    run = plan(model, mesh, device_memory=1, **arguments)
    on_cpu = jax.devices()[0].platform == "cpu"
    return {name: (s.stored if on_cpu else s.weights) + s.activations for name, s in run.stages.items()}
