"""Where a wanjax VAE decode's memory goes: the process's RSS after each phase.

The real Wan 2.1 VAE architecture (default ``AutoencoderKLWan`` config, random weights, saved
once to a temporary directory) decodes ``--latent`` latents in one process, reporting RSS, its
anonymous part (the rest is mapped files: shared libraries) and the high-water mark after: JAX
imported, ``load_vae`` (checks only), the program compiled (in a child process unless
``--in-process``), the weights read, and the decode. The compiled program's own numbers (temp,
weights, output) come from XLA's memory analysis.

    python benchmarks/vae_memory_phases.py                  # 240x416, 5 latent frames
    python benchmarks/vae_memory_phases.py --in-process     # the compiler's leftovers included
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def memory() -> str:
    status = Path("/proc/self/status").read_text()
    rollup = Path("/proc/self/smaps_rollup").read_text()

    def mib(pattern: str, text: str) -> float:
        return int(re.search(pattern + r":\s+(\d+)", text).group(1)) / 1024

    return (
        f"RSS {mib('VmRSS', status):6.0f}  anon {mib('Anonymous', rollup):6.0f}"
        f"  peak {mib('VmHWM', status):6.0f} MiB"
    )


def child(args: argparse.Namespace) -> None:
    start = time.perf_counter()

    def phase(name: str) -> None:
        print(f"{time.perf_counter() - start:6.1f}s  {name:22s} {memory()}", flush=True)

    phase("start")
    import jax
    import jax.numpy as jnp

    from wanjax.runtime.libtpu import skip_absent_tpu

    skip_absent_tpu()  # as `wanjax` runs on a CPU: libtpu, if installed, not loaded (96 MiB of its code)
    jnp.zeros(1).block_until_ready()
    phase("jax imported")
    from wanjax.models.vae import load_vae
    from wanjax.runtime.jax_cache import enable_compilation_cache

    enable_compilation_cache("off")
    vae = load_vae(args.model, compile_in_child=False if args.in_process else None)
    z = jnp.asarray(np.random.default_rng(0).standard_normal(args.latent, np.float32))
    phase("load_vae (checks)")
    stats = vae.compile("decode", z).memory_analysis()
    phase("compiled")
    jax.block_until_ready(vae.params)
    phase("weights read")
    jax.block_until_ready(vae.decode(z))
    phase("decoded")
    print(
        f"program: temp {stats.temp_size_in_bytes / 2**20:.0f} MiB, weights "
        f"{stats.argument_size_in_bytes / 2**20:.0f} MiB, output {stats.output_size_in_bytes / 2**20:.1f} MiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--latent", type=int, nargs=5, default=[1, 16, 5, 30, 52], metavar="N")
    parser.add_argument("--in-process", action="store_true", help="compile in the measured process")
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.model:
        child(args)
        return
    import torch
    from diffusers import AutoencoderKLWan

    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        AutoencoderKLWan().save_pretrained(Path(tmp) / "vae")
        # a fresh process, so nothing torch or diffusers allocated is counted
        cmd = [sys.executable, __file__, "--model", tmp, "--latent", *map(str, args.latent)]
        subprocess.run(cmd + (["--in-process"] if args.in_process else []), check=True)


if __name__ == "__main__":
    main()
