"""``wanjax bench``: warm-up and steady time per stage, seconds per denoising step, memory, FLOP/s.

A built-in architecture (``--arch 1.3B|14B``) runs with random weights, optionally shortened to
``--layers N`` DiT (and UMT5) layers, so no checkpoint is needed. The stages are the pipeline's:
``encode`` (UMT5-XXL dimensions, one prompt of ``--max_sequence_length`` tokens; the vocabulary is
cut to 32k rows, a gather whose cost does not depend on it), ``denoise`` (DiT + UniPC, CFG batched
when ``--guidance_scale > 1``) and ``decode`` (the Wan 2.1 VAE to uint8 frames). Matmul FLOPs come
from :mod:`wanjax.flops`; the hardware peak from a table (TPU, NVIDIA) or, on CPU, from a
bf16-input / float32-accumulation matmul measured here.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from wanjax.atomic import write_text
from wanjax.checkpoint import random_params
from wanjax.config import PRESETS, parse_dtype
from wanjax.errors import WanjaxError
from wanjax.flops import Flops, achieved, dit_step_flops, umt5_flops
from wanjax.models import dit, umt5
from wanjax.models.vae import WanVAE
from wanjax.models.vae import checkpoint_spec as vae_spec
from wanjax.models.vae_config import VAEConfig
from wanjax.sampling import Sampler
from wanjax.scheduler import SchedulerConfig, make_scheduler

# Dense bf16 peak, TFLOP/s per chip, matched against ``device.device_kind`` (first match wins).
PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("TPU v6", 918.0),  # v6e ("TPU v6 lite")
    ("TPU v5 lite", 197.0),  # v5e
    ("TPU v5e", 197.0),
    ("TPU v5", 459.0),  # v5p
    ("TPU v4", 275.0),
    ("H200", 989.0),
    ("H100", 989.0),
    ("A100", 312.0),
)
BENCH_VOCAB = 32_128


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """What to run; the defaults are the issue's quick CPU run."""

    arch: str = "1.3B"
    layers: int | None = None
    height: int = 240
    width: int = 416
    frames: int = 17
    num_inference_steps: int = 2
    guidance_scale: float = 5.0
    dtype: str = "bfloat16"
    vae_dtype: str = "float32"
    max_sequence_length: int = 512
    repeats: int = 2
    stages: tuple[str, ...] = ("encode", "denoise", "decode")

    def latent_shape(self) -> tuple[int, int, int, int, int]:
        if self.height % 16 or self.width % 16 or (self.frames - 1) % 4:
            raise WanjaxError(
                f"{self.height}x{self.width}x{self.frames}: height and width must be multiples of 16 "
                "and frames 4n+1"
            )
        return (1, 16, (self.frames - 1) // 4 + 1, self.height // 8, self.width // 8)


@dataclasses.dataclass
class StageResult:
    """Timings of one stage: warm-up (compile + first run) and steady runs, in seconds."""

    warmup: float
    steady: list[float]
    flops: Flops | None = None
    per_step: list[float] | None = None  # denoise: the steady steps

    def summary(self) -> dict[str, Any]:
        med = statistics.median(self.steady) if self.steady else float("nan")
        out: dict[str, Any] = {
            "warmup_s": self.warmup,
            "steady_median_s": med,
            "steady_min_s": min(self.steady, default=float("nan")),
            "steady_max_s": max(self.steady, default=float("nan")),
        }
        if self.per_step is not None:
            out["s_per_step_median"] = statistics.median(self.per_step) if self.per_step else float("nan")
            out["s_per_step_spread"] = [min(self.per_step, default=0.0), max(self.per_step, default=0.0)]
        if self.flops is not None:
            seconds = out.get("s_per_step_median", med)
            out["tflop"] = self.flops.total / 1e12
            out["achieved_tflops"] = achieved(self.flops, seconds) / 1e12
        return out


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def measure_cpu_matmul_peak(n: int = 2048, repeats: int = 5) -> float:
    """Best FLOP/s of an ``n``-cube bf16 matmul with float32 accumulation on the default device."""
    a = jnp.ones((n, n), jnp.bfloat16)
    f = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32))
    jax.block_until_ready(f(a, a))
    return 2 * n**3 / min(timed(lambda: f(a, a)) for _ in range(repeats))


def device_peak() -> tuple[float, str]:
    """Peak FLOP/s of one default device and where the figure comes from."""
    device = jax.devices()[0]
    kind = device.device_kind
    for name, tflops in PEAK_TFLOPS:
        if name in kind:
            return tflops * 1e12, f"{kind}: datasheet dense bf16"
    if device.platform == "cpu":
        return measure_cpu_matmul_peak(), "cpu: measured bf16 matmul (2048^3, f32 accumulation)"
    return float("nan"), f"{kind}: unknown peak"


def peak_memory_bytes() -> tuple[int, str]:
    """Peak memory: the device's allocator where it reports one, else the process's RSS."""
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        return int(stats["peak_bytes_in_use"]), "device peak"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "host peak RSS"


def _repeat(fn: Callable[[], Any], repeats: int) -> StageResult:
    warmup = timed(fn)
    return StageResult(warmup, [timed(fn) for _ in range(repeats)])


def bench_encode(cfg: BenchConfig) -> StageResult:
    layers = min(cfg.layers or umt5.UMT5_XXL.num_layers, umt5.UMT5_XXL.num_layers)
    ucfg = dataclasses.replace(umt5.UMT5_XXL, num_layers=layers, vocab_size=BENCH_VOCAB)
    params = random_params(umt5.checkpoint_spec(ucfg), parse_dtype(cfg.dtype))
    length = cfg.max_sequence_length
    ids = jax.random.randint(jax.random.key(1), (2, length), 0, BENCH_VOCAB)  # prompt + negative
    mask = jnp.ones((2, length), jnp.int32)
    forward = jax.jit(lambda p, i, m: umt5.forward(p, ucfg, i, m))
    result = _repeat(lambda: forward(params, ids, mask), cfg.repeats)
    result.flops = umt5_flops(ucfg, 2, length)
    return result


def bench_denoise(cfg: BenchConfig) -> StageResult:
    base = PRESETS[cfg.arch]
    tcfg = dataclasses.replace(base, num_layers=cfg.layers or base.num_layers)
    dtype = parse_dtype(cfg.dtype)
    model = dit.WanTransformer(tcfg, random_params(dit.checkpoint_spec(tcfg), dtype), dtype)
    shape = cfg.latent_shape()
    noise = jax.random.normal(jax.random.key(2), shape, jnp.float32)
    text = jax.random.normal(jax.random.key(3), (1, cfg.max_sequence_length, tcfg.text_dim), dtype)
    scheduler = make_scheduler(SchedulerConfig(), cfg.num_inference_steps)
    sampler = Sampler(model)
    guided = cfg.guidance_scale > 1
    start = time.perf_counter()
    _, times = sampler(scheduler, noise, text, text if guided else None, cfg.guidance_scale)
    warmup = time.perf_counter() - start
    steady, per_step = [], list(times.steady)
    for _ in range(cfg.repeats):
        start = time.perf_counter()
        _, times = sampler(scheduler, noise, text, text if guided else None, cfg.guidance_scale)
        steady.append(time.perf_counter() - start)
        per_step += [times.first, *times.steady]
    flops = dit_step_flops(tcfg, shape, cfg.max_sequence_length, guidance=guided)
    return StageResult(warmup, steady, flops, per_step)


def bench_decode(cfg: BenchConfig) -> StageResult:
    vcfg = VAEConfig()
    dtype = parse_dtype(cfg.vae_dtype)
    vae = WanVAE(vcfg, random_params(vae_spec(vcfg, "decoder"), dtype), dtype)
    latents = jax.random.normal(jax.random.key(4), cfg.latent_shape(), jnp.float32)
    return _repeat(lambda: vae.decode_uint8(latents), cfg.repeats)


STAGES: dict[str, Callable[[BenchConfig], StageResult]] = {
    "encode": bench_encode,
    "denoise": bench_denoise,
    "decode": bench_decode,
}


def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    """Run the stages of ``cfg``; a JSON-ready dict of the measurements."""
    if cfg.arch not in PRESETS or cfg.arch == "tiny":
        raise WanjaxError(f"unknown --arch {cfg.arch!r}; choose 1.3B or 14B")
    if cfg.num_inference_steps < 1 or cfg.repeats < 1:
        raise WanjaxError("--num_inference_steps and --repeats must be at least 1")
    unknown = sorted(set(cfg.stages) - set(STAGES))
    if unknown:
        raise WanjaxError(f"unknown stage(s) {', '.join(unknown)}; choose from {', '.join(STAGES)}")
    cfg.latent_shape()
    for dtype in (cfg.dtype, cfg.vae_dtype):
        parse_dtype(dtype)
    peak, peak_source = device_peak()
    stages = {name: STAGES[name](cfg).summary() for name in cfg.stages}
    for summary in stages.values():
        if "achieved_tflops" in summary:
            summary["fraction_of_peak"] = summary["achieved_tflops"] * 1e12 / peak
    memory, memory_source = peak_memory_bytes()
    return {
        "config": dataclasses.asdict(cfg),
        "device": jax.devices()[0].device_kind,
        "devices": jax.device_count(),
        "peak_tflops": peak / 1e12,
        "peak_source": peak_source,
        "peak_memory_gib": memory / 2**30,
        "memory_source": memory_source,
        "stages": stages,
    }


def format_table(result: dict[str, Any]) -> str:
    """The measurements as a text table."""
    cfg = result["config"]
    head = (
        f"wanjax bench: {cfg['arch']} ({cfg['layers'] or 'all'} layers), {cfg['height']}x{cfg['width']}x"
        f"{cfg['frames']}, {cfg['num_inference_steps']} steps, {cfg['dtype']}, guidance "
        f"{cfg['guidance_scale']}; {result['devices']} x {result['device']}, peak "
        f"{result['peak_tflops']:.2f} TFLOP/s ({result['peak_source']})"
    )
    lines = [
        head,
        f"{'stage':8} {'warm-up s':>10} {'steady s':>18} {'s/step':>18} {'TFLOP':>9} "
        f"{'TFLOP/s':>8} {'of peak':>8}",
    ]
    for name, s in result["stages"].items():
        steady = f"{s['steady_median_s']:.3f} ({s['steady_min_s']:.3f}-{s['steady_max_s']:.3f})"
        step = "-"
        if "s_per_step_median" in s:
            lo, hi = s["s_per_step_spread"]
            step = f"{s['s_per_step_median']:.3f} ({lo:.3f}-{hi:.3f})"
        tflop = f"{s['tflop']:.3f}" if "tflop" in s else "-"
        rate = f"{s['achieved_tflops']:.3f}" if "achieved_tflops" in s else "-"
        frac = f"{100 * s['fraction_of_peak']:.0f}%" if "fraction_of_peak" in s else "-"
        lines.append(
            f"{name:8} {s['warmup_s']:>10.2f} {steady:>18} {step:>18} {tflop:>9} {rate:>8} {frac:>8}"
        )
    lines.append(f"peak memory {result['peak_memory_gib']:.2f} GiB ({result['memory_source']})")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``wanjax bench`` flags (seed names, hyphenated spellings accepted)."""
    d = BenchConfig()
    parser.add_argument("--arch", default=d.arch, choices=["1.3B", "14B"])
    parser.add_argument("--layers", type=int, default=None, help="DiT/UMT5 layers (default: all)")
    parser.add_argument("--height", type=int, default=d.height)
    parser.add_argument("--width", type=int, default=d.width)
    parser.add_argument("--frames", type=int, default=d.frames)
    parser.add_argument(
        "--num_inference_steps", "--num-inference-steps", type=int, default=d.num_inference_steps
    )
    parser.add_argument("--guidance_scale", "--guidance-scale", type=float, default=d.guidance_scale)
    parser.add_argument("--dtype", default=d.dtype)
    parser.add_argument("--vae_dtype", "--vae-dtype", default=d.vae_dtype)
    parser.add_argument(
        "--max_sequence_length", "--max-sequence-length", type=int, default=d.max_sequence_length
    )
    parser.add_argument("--repeats", type=int, default=d.repeats)
    parser.add_argument("--stages", nargs="+", default=list(d.stages), choices=list(STAGES))
    parser.add_argument("--json", help="also write the numbers to this JSON file")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """``wanjax bench``: run, print the table, write ``--json``."""
    cfg = BenchConfig(
        arch=args.arch,
        layers=args.layers,
        height=args.height,
        width=args.width,
        frames=args.frames,
        num_inference_steps=args.num_inference_steps,
        guidance_scale=args.guidance_scale,
        dtype=args.dtype,
        vae_dtype=args.vae_dtype,
        max_sequence_length=args.max_sequence_length,
        repeats=args.repeats,
        stages=tuple(args.stages),
    )
    result = run_bench(cfg)
    print(format_table(result))
    if args.json:
        write_text(args.json, json.dumps(result, indent=2) + "\n")
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="wanjax bench", description=__doc__.splitlines()[0])
    add_arguments(parser)
    run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
