"""W8A8 int8 beside weight-only int8 and fp8 at the real layer shapes of the 1.3B and 14B DiT blocks.

Per layer type (q/k/v/out projections, FFN in, FFN out): the relative error of the float32 result
``||y - y_bf16|| / ||y_bf16||`` against the bf16 matmul of the same random weights (Gaussian,
per-channel scales spread as checkpoints' are) on ``--tokens`` tokens of LayerNorm-like activations,
and on this machine's CPU the time of one bf16, W8A8 and weight-only int8 matmul (median of
``--repeats``, jitted, one after another in one process).

    python benchmarks/w8a8_layers.py --tokens 2048 --repeats 5
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from wanjax.io.quant import QuantizedKernel, quantize
from wanjax.io.quantizable import QUANTIZED_DTYPES
from wanjax.models.layers import matmul
from wanjax.models.registry import released

LAYERS = {"qkvo": lambda d, f: (d, d), "ffn_in": lambda d, f: (d, f), "ffn_out": lambda d, f: (f, d)}


def kernel(shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    scale = np.exp(rng.uniform(-0.5, 0.5, shape[1])).astype(np.float32) / np.sqrt(shape[0])
    return rng.standard_normal(shape, dtype=np.float32) * scale


def timed(fn, *args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--models", nargs="+", default=["1.3B", "14B"])
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    mm = jax.jit(matmul)
    print(f"{jax.devices()[0].device_kind}, {args.tokens} tokens; relative error vs bf16; CPU ms")
    print(
        "| model | layer | shape | W8A8 int8 | int8 weight-only | fp8 weight-only | bf16 ms | W8A8 ms | int8 w-o ms |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.models:
        cfg = released()[name].transformer
        d, f = cfg.num_attention_heads * cfg.attention_head_dim, cfg.ffn_dim
        for layer, shape_of in LAYERS.items():
            shape = shape_of(d, f)
            w = kernel(shape, rng)
            x = jnp.asarray(rng.standard_normal((args.tokens, shape[0]), dtype=np.float32), jnp.bfloat16)
            ref = mm(x, jnp.asarray(w, jnp.bfloat16))
            kernels = {}
            for q in ("int8", "fp8"):
                values, scale = quantize(w, QUANTIZED_DTYPES[q])
                kernels[q] = QuantizedKernel(jnp.asarray(values), jnp.asarray(scale), np.dtype(jnp.bfloat16))
            kernels["w8a8"] = dataclasses.replace(kernels["int8"], w8a8=True)
            err = {
                k: float(jnp.linalg.norm(mm(x, v) - ref) / jnp.linalg.norm(ref)) for k, v in kernels.items()
            }
            ms = {
                k: 1e3 * timed(mm, x, v, repeats=args.repeats)
                for k, v in {
                    "bf16": jnp.asarray(w, jnp.bfloat16),
                    "w8a8": kernels["w8a8"],
                    "int8": kernels["int8"],
                }.items()
            }
            print(
                f"| {name} | {layer} | {shape[0]}x{shape[1]} | {err['w8a8']:.2e} | {err['int8']:.2e} | "
                f"{err['fp8']:.2e} | {ms['bf16']:.1f} | {ms['w8a8']:.1f} | {ms['int8']:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
