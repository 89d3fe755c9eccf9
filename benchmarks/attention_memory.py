"""Peak extra memory and time of the CPU ``xla`` attention at Wan 480p self-attention size.

32,760 tokens (81 frames at 480x832: 21 x 30 x 52) x 12 heads x 128 (the 1.3B model), one batch.
Memory is measured two ways: XLA's own buffer plan for the compiled call (temporaries beyond the
inputs and output) and the process's resident set sampled every 5 ms during the call, minus the
resident set just before it (inputs already materialised).

    python benchmarks/attention_memory.py --tokens 32760 --heads 12 --head_dim 128 --dtype float32
"""

from __future__ import annotations

import argparse
import threading
import time

import jax
import jax.numpy as jnp

from wanjax.kernels.attention import attention

GIB = 1 << 30


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


class PeakSampler(threading.Thread):
    """Samples the resident set every ``interval`` seconds until stopped; ``peak`` is the largest."""

    def __init__(self, interval: float = 0.005):
        super().__init__(daemon=True)
        self.interval, self.peak, self.stopped = interval, resident_bytes(), threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            self.peak = max(self.peak, resident_bytes())
            time.sleep(self.interval)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=32760)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head_dim", type=int, default=128)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--backend", default="xla")
    args = parser.parse_args()

    dtype = jnp.dtype(args.dtype)
    shape = (1, args.tokens, args.heads, args.head_dim)
    keys = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(key, shape, jnp.float32).astype(dtype) for key in keys)
    jax.block_until_ready((q, k, v))
    fn = jax.jit(lambda q, k, v: attention(q, k, v, backend=args.backend))

    start = time.perf_counter()
    compiled = fn.lower(q, k, v).compile()
    compile_s = time.perf_counter() - start
    plan = compiled.memory_analysis()

    before = resident_bytes()
    sampler = PeakSampler()
    sampler.start()
    start = time.perf_counter()
    out = jax.block_until_ready(compiled(q, k, v))
    run_s = time.perf_counter() - start
    sampler.stopped.set()
    sampler.join()

    input_bytes = 3 * q.size * q.dtype.itemsize
    print(f"shape {shape} {dtype.name}, backend {args.backend} on {jax.default_backend()}")
    print(f"inputs {input_bytes / GIB:.3f} GiB, output {out.size * out.dtype.itemsize / GIB:.3f} GiB")
    print(f"XLA temporaries {plan.temp_size_in_bytes / GIB:.3f} GiB")
    print(
        f"resident set: before {before / GIB:.3f} GiB, peak during call +{(sampler.peak - before) / GIB:.3f} GiB"
    )
    print(f"compile {compile_s:.1f} s, run {run_s:.1f} s")


if __name__ == "__main__":
    main()
