"""Helpers for side-by-side benchmarks that run every measurement in a process of its own.

A parent runs one child per measurement (:func:`run_child`), so an out-of-memory error or a crash
costs that measurement only and each process's memory peak is its own. A child reports by printing
JSON records (:func:`emit`); the parent receives them as they come (whatever a child reported
before it died is kept) and passes every other line of its output through to its own stderr.
Timings are a warm-up call then ``repeats`` timed calls (:func:`time_calls`), with a device sync.
Random torch weights follow wanjax's rule (:func:`randomize_like_wanjax`, the rule of
``wanjax.io.checkpoint.random_scale``), so both sides load the same values from one
``save_pretrained`` directory.

Import it from a script in this folder (``import common``: the script's folder is on ``sys.path``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

RECORD_PREFIX = "@@record "


def emit(record: dict[str, Any]) -> None:
    """Print one record for the parent (a JSON object on a line of its own)."""
    print(RECORD_PREFIX + json.dumps(record, default=_jsonable), flush=True)


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def run_child(
    cmd: Sequence[str],
    on_record: Callable[[dict[str, Any]], None],
    *,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
    echo: Callable[[str], None] | None = None,
) -> tuple[int | None, list[str]]:
    """Run ``cmd``, handing each record it :func:`emit`s to ``on_record`` as it arrives and every
    other line of its output (stdout and stderr) to ``echo``. Returns its exit status (None: killed
    after ``timeout`` seconds, with everything it started) and its last 20 lines of output."""
    proc = subprocess.Popen(
        list(cmd),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,  # its own process group: a timeout ends its children too
    )
    timed_out = threading.Event()

    def kill() -> None:
        timed_out.set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    timer = threading.Timer(timeout, kill) if timeout else None
    if timer:
        timer.start()
    tail: deque[str] = deque(maxlen=20)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            if line.startswith(RECORD_PREFIX):
                on_record(json.loads(line[len(RECORD_PREFIX) :]))
            else:
                tail.append(line)
                if echo:
                    echo(line)
        status = proc.wait()
    finally:
        if timer:
            timer.cancel()
    return (None if timed_out.is_set() else status), list(tail)


def time_calls(fn: Callable[[], Any], repeats: int, sync: Callable[[Any], Any]) -> tuple[dict[str, Any], Any]:
    """A warm-up call (compile, autotuning, first run) and ``repeats`` timed calls, each ended by
    ``sync(output)``: the timings (seconds; median and min of the timed calls) and the last output."""
    start = time.perf_counter()
    out = sync(fn())
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        out = None  # the previous output is released first, as a caller would
        start = time.perf_counter()
        out = sync(fn())
        times.append(time.perf_counter() - start)
    stats = {"first_s": first, "times_s": times, "median_s": statistics.median(times), "min_s": min(times)}
    return stats, out


def relative_error(ours: np.ndarray, reference: np.ndarray) -> float:
    """``‖ours - reference‖ / ‖reference‖``, computed in float64."""
    ours, reference = np.asarray(ours, np.float64), np.asarray(reference, np.float64)
    if ours.shape != reference.shape:
        raise ValueError(f"shapes differ: {ours.shape} vs {reference.shape}")
    norm = float(np.linalg.norm(reference))
    diff = float(np.linalg.norm(ours - reference))
    return diff / norm if norm else (0.0 if diff == 0 else math.inf)


def randomize_like_wanjax(module: Any, seed: int = 0) -> Any:
    """Give every parameter of a torch ``module`` random values by wanjax's rule for its checkpoint
    name (``wanjax.io.checkpoint.random_tensor``: norm scales near 1, small biases, weights of
    variance 1/fan_in), so activations stay O(1) through many layers. Returns ``module``."""
    import torch

    from wanjax.io.checkpoint import random_tensor

    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(torch.from_numpy(random_tensor(name, tuple(p.shape), rng)))
    return module


def bf16_round(a: np.ndarray) -> np.ndarray:
    """``a`` rounded to bfloat16 and back to float32: an input both sides see exactly."""
    import ml_dtypes

    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def peak_rss_bytes() -> int:
    """This process's peak resident memory (Linux reports KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def size(n: float | None) -> str:
    """Bytes as GiB (MiB below 1 GiB); ``n/a`` for None."""
    if n is None:
        return "n/a"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def add_random_dit_flags(parser: Any) -> None:
    """The flags of a denoising benchmark on random 1.3B-dims weights (see :func:`random_dit_run`)."""
    parser.add_argument("--layers", type=int, default=2, help="of the 1.3B's 30 (default 2)")
    parser.add_argument("--height", type=int, default=240)
    parser.add_argument("--width", type=int, default=416)
    parser.add_argument("--frames", type=int, default=9)
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds after a compile pass")
    parser.add_argument("--dtype", default="bfloat16")


def random_dit_run(args: Any) -> tuple[Any, tuple[int, ...], Any, Any, Any]:
    """``(model, latent shape, noise, text, negative text)``: a WanTransformer with the 1.3B's
    dimensions and ``args.layers`` layers of random weights, and random inputs (512 text tokens)."""

    import jax
    import jax.numpy as jnp

    from wanjax.io.checkpoint import random_params
    from wanjax.models import dit
    from wanjax.models.config import parse_dtype
    from wanjax.models.registry import transformer_preset
    from wanjax.models.settings import RunSettings

    cfg = transformer_preset("1.3B", num_layers=args.layers)
    dtype = parse_dtype(args.dtype)
    model = dit.WanTransformer(
        cfg, random_params(dit.checkpoint_spec(cfg), dtype, seed=0), RunSettings(dtype)
    )
    shape = (1, 16, (args.frames - 1) // 4 + 1, args.height // 8, args.width // 8)
    noise = jax.random.normal(jax.random.key(1), shape, jnp.float32)
    cond = jax.random.normal(jax.random.key(2), (1, 512, cfg.text_dim), dtype)
    uncond = jax.random.normal(jax.random.key(3), (1, 512, cfg.text_dim), dtype)
    return model, shape, noise, cond, uncond
