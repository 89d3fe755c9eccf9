"""The 14B's sampler step compiled for TPU slices with fewer layers: how the compiler's per-chip
bytes grow with the stacked layer weights (the real TPU compiler through libtpu; no TPU needed).

    python benchmarks/tpu_step_layers.py --slices v7x-8 v6e-8 --layers 10 20
"""

from __future__ import annotations

import argparse
import dataclasses

from wanjax.chips import SLICES
from wanjax.models.registry import registry
from wanjax.parallel.mesh import parse_mesh
from wanjax.tools.compile_target import RunSpec, compile_run

GiB = 1 << 30


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--slices", nargs="+", default=["v7x-8", "v6e-8"], choices=sorted(SLICES))
    parser.add_argument("--layers", nargs="+", type=int, default=[10, 20])
    parser.add_argument("--mesh", default="dp=2,sp=1,tp=4")
    parser.add_argument("--attention", default="splash_exp2")
    args = parser.parse_args()
    base = registry()["14B"]
    print("| slice | layers | arguments | temporaries | outputs | total (GiB per chip) |")
    print("|---|---|---|---|---|---|")
    for name in args.slices:
        for layers in args.layers:
            variant = dataclasses.replace(
                base, transformer=dataclasses.replace(base.transformer, num_layers=layers)
            )
            run = RunSpec(variant, 720, 1280, 81, parse_mesh(args.mesh), attention=args.attention)
            (step,) = compile_run(run, SLICES[name], only=["step"]).programs
            b = {k: v / GiB for k, v in step.bytes_per_chip.items()}
            print(
                f"| {name} | {layers} | {b['arguments']:.2f} | {b['temporaries']:.2f} | {b['outputs']:.2f} | "
                f"{b['total']:.2f} |"
            )


if __name__ == "__main__":
    main()
