"""Where a DiT layer's time goes on this machine: matmuls (XLA vs torch) and attention formulations.

    python benchmarks/dit_breakdown.py               # matmul table + attention variants, bf16
    XLA_FLAGS=--xla_cpu_use_onednn=true python benchmarks/dit_breakdown.py --only matmul

Shapes are those of the 1.3B model at latent [1,16,5,30,52] (L = 1,950 tokens, 512 text tokens).
Each number is the best of --repeats runs after a warm-up; XLA and torch alternate per shape.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch

from wanjax.kernels.attention import attention

MATMULS = [(1950, 1536, 8960), (1950, 8960, 1536), (1950, 1536, 1536), (512, 4096, 1536)]


def best_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def matmul_table(repeats: int) -> None:
    print("matmul M x K x N: GFLOP/s  XLA bf16->f32acc | XLA bf16 | XLA f32 | torch bf16 | torch f32")
    for m, k, n in MATMULS:
        gflop = 2 * m * k * n / 1e9
        x = np.random.randn(m, k).astype(np.float32)
        w = (np.random.randn(k, n) * 0.02).astype(np.float32)
        rates = []
        for dtype, acc in ((jnp.bfloat16, jnp.float32), (jnp.bfloat16, None), (jnp.float32, None)):
            xa, wa = jnp.asarray(x, dtype), jnp.asarray(w, dtype)
            f = jax.jit(lambda a, b, acc=acc: jnp.matmul(a, b, preferred_element_type=acc))
            rates.append(
                gflop / best_seconds(lambda f=f, xa=xa, wa=wa: f(xa, wa).block_until_ready(), repeats)
            )
        for dtype in (torch.bfloat16, torch.float32):
            xt, wt = torch.from_numpy(x).to(dtype), torch.from_numpy(w.T.copy()).to(dtype)
            rates.append(
                gflop / best_seconds(lambda xt=xt, wt=wt: torch.nn.functional.linear(xt, wt), repeats)
            )
        print(f"{m}x{k}x{n}: " + " | ".join(f"{r:6.0f}" for r in rates))


def attention_table(repeats: int) -> None:
    heads, dim = 12, 128
    key = jax.random.key(0)
    print("attention (bf16, 12 heads x 128): seconds, best of", repeats)
    for q_len, k_len in ((1950, 1950), (1950, 512)):
        q = jax.random.normal(key, (1, q_len, heads, dim)).astype(jnp.bfloat16)
        kv = jax.random.normal(key, (1, k_len, heads, dim)).astype(jnp.bfloat16)
        variants = {
            "per-head loop": jax.jit(lambda q, k: attention(q, k, k, per_head=True)),
            "batched heads": jax.jit(lambda q, k: attention(q, k, k, per_head=False)),
            "jax.nn.dot_product_attention": jax.jit(lambda q, k: jax.nn.dot_product_attention(q, k, k)),
        }
        qt, kt = (
            torch.from_numpy(np.array(a.astype(jnp.float32))).bfloat16().transpose(1, 2) for a in (q, kv)
        )
        for name, f in variants.items():
            t = best_seconds(lambda f=f, q=q, kv=kv: f(q, kv).block_until_ready(), repeats)
            print(f"  Lq={q_len} Lk={k_len} {name:30s} {t:.3f}s")
        t = best_seconds(
            lambda qt=qt, kt=kt: torch.nn.functional.scaled_dot_product_attention(qt, kt, kt), repeats
        )
        print(f"  Lq={q_len} Lk={k_len} {'torch SDPA':30s} {t:.3f}s")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--only", choices=["matmul", "attention"])
    args = parser.parse_args()
    if args.only != "attention":
        matmul_table(args.repeats)
    if args.only != "matmul":
        attention_table(args.repeats)


if __name__ == "__main__":
    main()
