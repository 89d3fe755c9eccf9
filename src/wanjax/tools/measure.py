"""Timing, peak FLOP/s and memory of compiled programs: what ``wanjax bench`` and the benchmarks measure."""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from wanjax.chips import datasheet_peak
from wanjax.models.config import parse_dtype
from wanjax.models.offload import program_memory as split_program_memory


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def measure_cpu_matmul_peak(n: int = 2048, repeats: int = 5, dtype: Any = jnp.bfloat16) -> float:
    """Best FLOP/s of an ``n``-cube ``dtype`` matmul with float32 accumulation on the default device."""
    a = jnp.ones((n, n), dtype)
    f = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32))
    jax.block_until_ready(f(a, a))
    return 2 * n**3 / min(timed(lambda: f(a, a)) for _ in range(repeats))


def device_peak(dtype: str = "bfloat16") -> tuple[float, str]:
    """Peak FLOP/s of one default device for ``dtype`` work and where the figure comes from.

    Accelerators: the datasheet's dense bf16 peak (whatever ``dtype``). CPU: a matmul in ``dtype``
    measured here, since CPUs differ by far more than a table could say (an AMX Xeon runs bf16 ~3x
    faster than float32, an AVX2-only EPYC ~2x slower)."""
    device = jax.devices()[0]
    kind = device.device_kind
    peak = datasheet_peak(kind)
    if peak is not None:
        return peak, f"{kind}: datasheet dense bf16"
    if device.platform == "cpu":
        name = jnp.dtype(parse_dtype(dtype)).name
        peak = measure_cpu_matmul_peak(dtype=parse_dtype(dtype))
        return peak, f"cpu: measured {name} matmul (2048^3, f32 accumulation)"
    return float("nan"), f"{kind}: unknown peak"


def allocator_peak_bytes() -> int | None:
    """The default device allocator's peak (``memory_stats()["peak_bytes_in_use"]``) since the process
    started: every buffer alive at once, the compiler's and autotuner's scratch included. None where
    the device keeps no statistics (CPU)."""
    stats = jax.devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    return None if peak is None else int(peak)


def host_peak_rss_bytes() -> int:
    """The process's peak resident memory (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_memory_bytes() -> tuple[int, str]:
    """Peak memory: the device's allocator where it reports one, else the process's RSS."""
    peak = allocator_peak_bytes()
    if peak is not None:
        return peak, "device peak"
    return host_peak_rss_bytes(), "host peak RSS"


MEMORY_FIELDS = {  # program_memory key -> wanjax.models.offload.program_memory's
    "argument_bytes": "argument",
    "output_bytes": "output",
    "temp_bytes": "temp",
    "generated_code_bytes": "generated_code",
    "alias_bytes": "alias",
}
HOST_ARGUMENT = "host_argument_bytes"  # program_memory key: arguments in a host memory kind


def program_memory(compiled: jax.stages.Compiled) -> dict[str, int] | None:
    """What XLA's ``memory_analysis()`` says a compiled program needs, in bytes
    (:func:`wanjax.models.offload.program_memory`): its arguments in device memory
    (``argument_bytes``) and in a host memory kind (``host_argument_bytes``: offload ``blocks``'
    streamed layers), outputs, temporaries and generated code, the outputs that alias (donated)
    arguments, and the device ``total_bytes`` = arguments + outputs - aliased + temporaries + code.
    None where the backend gives no analysis."""
    try:
        split = split_program_memory(compiled)
    except (NotImplementedError, RuntimeError):
        return None
    out = {key: split[field] for key, field in MEMORY_FIELDS.items()}
    out[HOST_ARGUMENT] = split["host_argument"]
    out["total_bytes"] = split["total"] + out["generated_code_bytes"]
    return out
