"""CPU time of the ``xla`` self-attention at a long sequence: dense vs radial (block-sparse), side by side.

Default: Wan 14B at 480p, 81 frames: 21 latent frames of 30 x 52 = 1,560 tokens (32,760 tokens), one
head group (5 of the 40 heads of 128 dims: one device's share under an 8-way Ulysses split),
float32. Each repeat times the dense call and then each radial call (the calls alternate, so a
change of the machine's load touches every variant alike); the table gives each one's median, the
mask's density and the time relative to dense.

    python benchmarks/sparse_attention.py --frames 21 --tokens_per_frame 1560 --heads 5 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp

from wanjax.kernels.attention import AttentionSpec, attention
from wanjax.kernels.radial import RadialAttention


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=21)
    parser.add_argument("--tokens_per_frame", type=int, default=1560)
    parser.add_argument("--heads", type=int, default=5)
    parser.add_argument("--head_dim", type=int, default=128)
    parser.add_argument("--decay", type=float, nargs="+", default=[1.0, 0.5, 0.2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--block_q", type=int, nargs="+", default=[None], help="xla's query blocks (default: its own)"
    )
    parser.add_argument(
        "--block_kv", type=int, nargs="+", default=[None], help="xla's key blocks (default: its own)"
    )
    args = parser.parse_args()

    length = args.frames * args.tokens_per_frame
    grid = (args.frames, args.tokens_per_frame, 1)
    keys = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(key, (1, length, args.heads, args.head_dim), jnp.float32) for key in keys)
    variants = {"dense": (AttentionSpec("xla"), 1.0)}
    for decay in args.decay:
        mask = RadialAttention(decay_factor=decay).block_mask(grid)
        for block_q in args.block_q:
            for block_kv in args.block_kv:
                name = f"radial {decay}" + (f" q{block_q}" if len(args.block_q) > 1 else "")
                name += f" k{block_kv}" if len(args.block_kv) > 1 else ""
                spec = AttentionSpec("xla", block_q=block_q, block_kv=block_kv, block_mask=mask)
                variants[name] = (spec, mask.density)
    calls = {
        name: jax.jit(lambda q, k, v, spec=spec: attention(q, k, v, backend=spec))
        for name, (spec, _) in variants.items()
    }
    for fn in calls.values():  # compile, and a first run
        jax.block_until_ready(fn(q, k, v))
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(args.repeats):
        for name, fn in calls.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(q, k, v))
            times[name].append(time.perf_counter() - start)

    dense = statistics.median(times["dense"])
    print(
        f"{length} tokens ({args.frames} x {args.tokens_per_frame}), {args.heads} heads x {args.head_dim}, float32, "
        f"{jax.devices()[0].device_kind}, median of {args.repeats}"
    )
    print(f"{'variant':<17} {'density':>8} {'seconds':>9} {'vs dense':>9}   runs")
    for name, runs in times.items():
        median = statistics.median(runs)
        print(
            f"{name:<17} {variants[name][1]:8.3f} {median:9.2f} {median / dense:9.3f}   "
            + ", ".join(f"{t:.2f}" for t in runs)
        )


if __name__ == "__main__":
    main()
