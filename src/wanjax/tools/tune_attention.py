"""``wanjax tune-attention``: time TPU attention block sizes on this device, keep the fastest.

For a model's real shapes (self-attention over the video tokens, cross-attention to 512 text tokens)
each candidate ``(bq, bkv, bkv_compute, bkv_compute_in)`` is compiled and timed; the fastest per
shape is stored in the tune cache (``wanjax.kernels.tuning``), which ``attention`` reads whenever a
block size is not given explicitly. Off TPU the kernels run in interpret mode, whose timings say
nothing about a TPU: there it is refused unless ``--allow_interpret`` (for testing).

    wanjax tune-attention --model 14B --height 720 --width 1280 --frames 81 --backend splash_exp2
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import statistics
import time
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp

from wanjax.errors import ConfigError
from wanjax.jobs.flags import add_flags, from_namespace, option
from wanjax.jobs.groups import DEFAULT_DTYPE
from wanjax.kernels import tuning
from wanjax.kernels.attention import AttentionSpec, InterpretModeWarning, attention
from wanjax.kernels.common import fit_blocks
from wanjax.models.config import TransformerConfig, parse_dtype
from wanjax.models.defaults import TEXT_LENGTH
from wanjax.models.registry import released, transformer_preset

TUNED_BACKENDS = ("splash", "splash_exp2")  # the TPU kernels with block sizes


@dataclasses.dataclass(frozen=True)
class Problem:
    """One attention shape of the model: ``(batch, q_len, heads, head_dim)`` queries over ``k_len`` keys."""

    name: str
    batch: int
    q_len: int
    k_len: int
    heads: int
    head_dim: int


def model_problems(
    cfg: TransformerConfig, height: int, width: int, frames: int, batch: int = 1, heads: int | None = None
) -> list[Problem]:
    """Self- and cross-attention shapes of one DiT forward for a ``height x width x frames`` video."""
    if height % 16 or width % 16 or (frames - 1) % 4:
        raise ConfigError(
            f"video {width}x{height}, {frames} frames: width/height must be multiples of 16, frames 4n+1"
        )
    pt, ph, pw = cfg.patch_size
    latent = ((frames - 1) // 4 + 1, height // 8, width // 8)
    tokens = (latent[0] // pt) * (latent[1] // ph) * (latent[2] // pw)
    h, d = heads or cfg.num_attention_heads, cfg.attention_head_dim
    return [
        Problem("self", batch, tokens, tokens, h, d),
        Problem("cross", batch, tokens, TEXT_LENGTH, h, d),
    ]


def candidates(problem: Problem, quick: bool = False) -> list[tuning.Blocks]:
    """Distinct effective block sizes (as ``fit_blocks`` cuts them to the problem) of a candidate grid."""
    bqs = (1024, 2048, 3328) if quick else (512, 1024, 2048, 3072, 3328, 4096)
    bkvs = (1024, 2816) if quick else (512, 1024, 2048, 2816, 4096)
    computes = (256, 512) if quick else (128, 256, 512)
    grid = itertools.product(bqs, bkvs, computes, (128, 256))
    return sorted(
        {fit_blocks(problem.q_len, problem.k_len, *b) for b in grid if b[1] % b[2] == 0 and b[2] % b[3] == 0}
    )


def time_blocks(
    problem: Problem, backend: str, dtype: jnp.dtype, blocks: tuning.Blocks, repeats: int
) -> float:
    """Median seconds of one attention call with these blocks (compiled first, not timed)."""
    keys = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(keys[0], (problem.batch, problem.q_len, problem.heads, problem.head_dim), dtype)
    k, v = (
        jax.random.normal(key, (problem.batch, problem.k_len, problem.heads, problem.head_dim), dtype)
        for key in keys[1:]
    )
    spec = AttentionSpec(backend, *blocks)
    fn = jax.jit(lambda q, k, v: attention(q, k, v, backend=spec)).lower(q, k, v).compile()
    jax.block_until_ready(fn(q, k, v))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(q, k, v))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def tune(
    problem: Problem,
    backend: str,
    dtype: jnp.dtype,
    blocks: Iterable[tuning.Blocks],
    repeats: int = 3,
    path: Path | None = None,
    log=print,
) -> tuple[tuning.Blocks, float]:
    """Time every candidate, store the fastest in the tune cache; return it and its seconds."""
    results = []
    for candidate in blocks:
        seconds = time_blocks(problem, backend, dtype, candidate, repeats)
        log(
            f"  {problem.name} q={problem.q_len} k={problem.k_len}: blocks {candidate} {seconds * 1e3:.2f} ms"
        )
        results.append((seconds, candidate))
    if not results:
        raise ConfigError(f"no block-size candidates for {problem}")
    seconds, best = min(results)
    key = tuning.shape_key(backend, problem.q_len, problem.k_len, problem.head_dim, jnp.dtype(dtype).name)
    stored = tuning.store(key, tuning.device_kind(), best, path)
    where = f"stored in {stored} under {key!r}" if stored else "not stored (see the warning)"
    log(f"{problem.name}: best {best} ({seconds * 1e3:.2f} ms), {where}")
    return best, seconds


def load_config(model: str) -> TransformerConfig:
    """A registry variant (``1.3B``, ``14B``, ...), ``tiny``, or a diffusers-layout model directory."""
    presets = [*released(), "tiny"]
    if model in presets:
        return transformer_preset(model)
    directory = Path(model).expanduser()
    config = directory / "transformer" / "config.json"
    if not config.is_file():
        config = directory / "config.json"
    if not config.is_file():
        raise ConfigError(f"--model {model!r}: not a preset ({', '.join(presets)}) nor a model directory")
    return TransformerConfig.from_file(config)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="wanjax tune-attention",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    return p


def _presets() -> dict[str, str]:
    return {"presets": ", ".join([*released(), "tiny"])}


@dataclasses.dataclass(frozen=True)
class TuneRequest:
    """``wanjax tune-attention``: the model and video whose shapes to tune, and how."""

    model: str = option(
        "1.3B", help="a preset ({presets}) or a model directory (default {default})", values=_presets
    )
    height: int = option(480, help="pixels (default {default})")
    width: int = option(832, help="pixels (default {default})")
    frames: int = option(81, help="4n+1 frames (default {default})")
    batch: int = option(1, help="videos per attention call (default {default}; 2: a CFG pair on one device)")
    heads: int | None = option(help="heads per device (e.g. heads / tp under a mesh; default: all)")
    backend: str = option(
        "splash_exp2", choices=TUNED_BACKENDS, help="TPU kernel to tune (default {default})"
    )
    dtype: str = option(DEFAULT_DTYPE, help="query/key/value dtype (default {default})")
    repeats: int = option(3, help="timed calls per candidate, median kept (default {default})")
    quick: bool = option(False, help="a smaller candidate grid")
    tune_file: Path | None = option(
        help="cache file (default {file})", values=lambda: {"file": tuning.tune_file()}
    )
    allow_interpret: bool = option(False, help="allow interpret mode off TPU (testing)")
    compile: str | None = option(
        metavar="SLICE",
        help="only compile each candidate for this TPU slice's chips with the TPU compiler (libtpu; no "
        "TPU needed, none touched): which fit its scoped VMEM; nothing timed or stored",
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``wanjax tune-attention`` flags (:class:`TuneRequest`'s fields)."""
    add_flags(p, TuneRequest)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit status. Raises ConfigError on bad arguments."""
    return run(parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """:func:`run_request` with flags parsed by a parser :func:`add_arguments` filled."""
    return run_request(from_namespace(TuneRequest, args))


def check_compiling(
    problem: Problem,
    backend: str,
    dtype: jnp.dtype,
    blocks: Iterable[tuning.Blocks],
    slice_name: str,
    log=print,
) -> list[tuning.Blocks]:
    """The candidates that the TPU compiler compiles for one chip of ``slice_name`` (each failure
    logged with the compiler's one-line reason, e.g. the scoped VMEM it needed)."""
    from wanjax.chips import parse_slice
    from wanjax.target import building_for
    from wanjax.tools.compile_target import attention_program, compile_one, slice_target

    target = slice_target(parse_slice(slice_name))
    shape = (problem.batch, problem.q_len, problem.heads, problem.head_dim)
    kept = []
    with building_for(target):
        for candidate in blocks:
            spec = AttentionSpec(backend, *candidate)
            report = compile_one(attention_program(target, spec, shape, problem.k_len, dtype))
            log(f"  {problem.name} blocks {candidate}: {'compiles' if report.compiled else report.error}")
            if report.compiled:
                kept.append(candidate)
    log(f"{problem.name}: {len(kept)} candidates compile for {slice_name} ({target.device_kind})")
    return kept


def run_request(request: TuneRequest) -> int:
    """``wanjax tune-attention``: tune every attention shape of the request's model and video (with
    ``--compile``: only check which candidates compile for a TPU slice)."""
    cfg = load_config(request.model)
    dtype = parse_dtype(request.dtype)
    size = f"{request.width}x{request.height}, {request.frames} frames"
    if request.compile is not None:
        print(f"compiling {request.backend} candidates for {request.compile}, {request.model} {size}")
        problems = model_problems(
            cfg, request.height, request.width, request.frames, request.batch, request.heads
        )
        for problem in problems:
            check_compiling(
                problem, request.backend, dtype, candidates(problem, request.quick), request.compile
            )
        return 0
    if jax.default_backend() != "tpu" and not request.allow_interpret:
        raise ConfigError(
            f"tune-attention times TPU kernels, but the device here is {jax.default_backend()}; "
            "run it on a TPU, --compile SLICE to check which candidates compile for one (or pass "
            "--allow_interpret to exercise it, timings meaningless)"
        )
    print(f"tuning {request.backend} on {tuning.device_kind()} for {request.model} {size}")
    problems = model_problems(
        cfg, request.height, request.width, request.frames, request.batch, request.heads
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InterpretModeWarning)
        for problem in problems:
            blocks = candidates(problem, request.quick)
            tune(problem, request.backend, dtype, blocks, request.repeats, request.tune_file)
    return 0
