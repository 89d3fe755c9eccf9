"""The Wan 2.1 VAE decode's program memory per formulation, from abstract inputs (no weights, no run).

For each activation dtype x convolution formulation (``conv3d``: the accelerator default, one 3-D
convolution over the cached and new frames; ``taps``: the CPU default, a 2-D convolution per
temporal tap, C->C convs caching owed partial sums) x ``frames_per_step``, the ``decode_uint8``
program for latents ``[1, 16, T', H/8, W/8]`` is lowered and compiled here, and its
``memory_analysis()`` (arguments, outputs, temporaries) reported with the lowered program's
convolution and concatenate counts and the compile time.

The programs are compiled by XLA:CPU, whose buffer assignment is not a GPU's or a TPU's; at 480x832
its float32 ``conv3d`` temporaries (5.79 GiB) match the 5.8 GiB measured on an H100
(``../shared/GPU_NOTES.md``), so the table is the memory side of choosing an accelerator's
formulation; its speed side needs the accelerator (``gpu_vs_diffusers.py --parts vae``).

    python benchmarks/vae_formulations.py                               # 480x832x81
    python benchmarks/vae_formulations.py --height 720 --width 1280 --json out/vae_forms.jsonl
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import time

import jax
import jax.numpy as jnp

from wanjax.io.checkpoint import abstract_params
from wanjax.models.vae import VAEConfig, WanVAE, checkpoint_spec

GiB = 1 << 30


def measure(cfg: VAEConfig, latent: tuple[int, ...], dtype: str, conv: str, frames: int) -> dict:
    """Lower and compile one decode program; its memory, size and compile time."""
    like = abstract_params(checkpoint_spec(cfg, "decoder"), jnp.dtype(dtype))
    vae = WanVAE(
        cfg, like, dtype, params_like=like, conv=conv, frames_per_step=frames, compile_in_child=False
    )
    start = time.perf_counter()
    lowered = vae.lower("decode_uint8", jax.ShapeDtypeStruct(latent, jnp.float32))
    text = lowered.as_text()
    compiled = lowered.compile()
    seconds = time.perf_counter() - start
    ops = collections.Counter(re.findall(r"stablehlo\.(\w+)", text))
    memory = compiled.memory_analysis()
    return {
        "dtype": dtype,
        "conv": conv,
        "frames_per_step": frames,
        "latent": list(latent),
        "temp_bytes": memory.temp_size_in_bytes,
        "argument_bytes": memory.argument_size_in_bytes,
        "output_bytes": memory.output_size_in_bytes,
        "convolutions": ops["convolution"],
        "concatenates": ops["concatenate"],
        "lower_compile_s": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=832)
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--convs", nargs="+", default=["conv3d", "taps"])
    parser.add_argument("--frames-per-step", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--json", help="append the records here (JSON lines)")
    args = parser.parse_args()
    cfg = VAEConfig()
    f, t = cfg.spatial_factor, cfg.temporal_factor
    latent = (1, cfg.z_dim, (args.frames - 1) // t + 1, args.height // f, args.width // f)
    print(
        f"VAE decode_uint8 of latents {list(latent)} ({args.frames} frames, {args.height}x{args.width}); "
        f"XLA:CPU memory_analysis, jax {jax.__version__}"
    )
    print(
        f"{'dtype':9} {'conv':7} {'frames/step':>11} {'temp GiB':>9} {'args GiB':>9} {'out GiB':>8} "
        f"{'convs':>6} {'concats':>8} {'lower+compile s':>16}"
    )
    for dtype in args.dtypes:
        for conv in args.convs:
            for frames in args.frames_per_step:
                r = measure(cfg, latent, dtype, conv, frames)
                print(
                    f"{dtype:9} {conv:7} {frames:>11} {r['temp_bytes'] / GiB:>9.2f} "
                    f"{r['argument_bytes'] / GiB:>9.2f} {r['output_bytes'] / GiB:>8.2f} {r['convolutions']:>6} "
                    f"{r['concatenates']:>8} {r['lower_compile_s']:>16.1f}",
                    flush=True,
                )
                if args.json:
                    with open(args.json, "a") as out:
                        out.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
