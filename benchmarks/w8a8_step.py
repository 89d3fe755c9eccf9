"""The DiT step in bf16, int8 weight-only and int8 W8A8 side by side, in one process on this machine.

``wanjax bench``'s denoise set-up (random weights of a registry architecture, ``--layers`` blocks,
the latents of ``--height``/``--width``/``--frames``, CFG batched, one prompt of 512 tokens), one
jitted forward per mode, timed in turns (mode A, B, C, A, B, C, ...) so that the machine's load
falls on all three alike; the median of ``--repeats`` per mode and its ratio to bf16.

    python benchmarks/w8a8_step.py --arch 1.3B --layers 2 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp

from wanjax.models import dit
from wanjax.models.settings import RunSettings
from wanjax.tools.bench import bench_params
from wanjax.tools.bench_config import BenchConfig

MODES = {"bf16": ("bf16", False), "int8 weight-only": ("int8", False), "int8 W8A8": ("int8", True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="1.3B")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--height", type=int, default=240)
    parser.add_argument("--width", type=int, default=416)
    parser.add_argument("--frames", type=int, default=17)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    cfg = BenchConfig(
        arch=args.arch, layers=args.layers, height=args.height, width=args.width, frames=args.frames
    )
    tcfg = cfg.transformer_config()
    dtype = jnp.bfloat16
    shape = cfg.latent_shape()
    latents = jax.random.normal(jax.random.key(2), (2, *shape[1:]), jnp.float32)
    text = jax.random.normal(jax.random.key(3), (2, cfg.max_sequence_length, tcfg.text_dim), dtype)
    inputs = dit.DitInputs(latents, jnp.array([999.0, 999.0]), text)
    steps = {}
    for name, (weights, int8) in MODES.items():
        params, _ = bench_params(cfg, dit.checkpoint_spec(tcfg), dtype, None, weights)
        model = dit.WanTransformer(tcfg, params, RunSettings(dtype, int8_matmuls=int8))
        forward = jax.jit(model.apply)
        jax.block_until_ready(forward(params, inputs))  # compile, warm up
        steps[name] = (forward, params)
    times: dict[str, list[float]] = {name: [] for name in MODES}
    for _ in range(args.repeats):
        for name, (forward, params) in steps.items():
            start = time.perf_counter()
            jax.block_until_ready(forward(params, inputs))
            times[name].append(time.perf_counter() - start)
    base = statistics.median(times["bf16"])
    print(
        f"{jax.devices()[0].device_kind}: {args.arch} dims, {args.layers} layers, {args.width}x{args.height}x"
        f"{args.frames}, CFG pair batched; median of {args.repeats}, in turns"
    )
    for name, seconds in times.items():
        median = statistics.median(seconds)
        print(
            f"  {name:<18} {median:7.3f} s per forward ({median / base:.2f}x bf16; range {min(seconds):.3f}-{max(seconds):.3f})"
        )


if __name__ == "__main__":
    main()
