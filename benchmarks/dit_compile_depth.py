"""Compile time of the DiT forward vs depth (blocks run under lax.scan, so it should not grow).

Lowers and compiles the 1.3B-dimension forward for a [1,16,5,30,52] latent and 512 text tokens from
abstract shapes (no weights), alternating the depths over several repeats.

    python benchmarks/dit_compile_depth.py --layers 2 30 --repeats 3 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp

from wanjax.io.checkpoint import abstract_params
from wanjax.models.dit import DitInputs, checkpoint_spec, forward
from wanjax.models.registry import transformer_preset
from wanjax.models.settings import RunSettings


def compile_seconds(num_layers: int, dtype: jnp.dtype) -> float:
    cfg = transformer_preset("1.3B", num_layers=num_layers)
    params = abstract_params(checkpoint_spec(cfg), dtype)
    latents = jax.ShapeDtypeStruct((1, 16, 5, 30, 52), jnp.float32)
    timestep = jax.ShapeDtypeStruct((1,), jnp.int32)
    text = jax.ShapeDtypeStruct((1, 512, 4096), dtype)
    # A fresh function object each time, so nothing is served from the in-memory cache.
    fn = jax.jit(lambda p, i: forward(p, cfg, i, settings=RunSettings(dtype)))
    start = time.perf_counter()
    fn.lower(params, DitInputs(latents, timestep, text)).compile()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 30])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    jax.config.update("jax_enable_compilation_cache", False)
    dtype = jnp.dtype(args.dtype)
    times: dict[int, list[float]] = {n: [] for n in args.layers}
    for _ in range(args.repeats):
        for n in args.layers:
            times[n].append(compile_seconds(n, dtype))
    base = statistics.median(times[args.layers[0]])
    for n in args.layers:
        med = statistics.median(times[n])
        print(
            f"{n:3d} layers: compile median {med:.2f}s (min {min(times[n]):.2f}s) "
            f"ratio vs {args.layers[0]} layers {med / base:.2f}"
        )


if __name__ == "__main__":
    main()
