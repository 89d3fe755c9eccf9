"""VACE's extra cost per denoising step, side by side with the plain text-to-video model it extends.

Runs ``wanjax bench``'s denoise stage (random weights, the same shape, steps and repeats) for a plain
variant and its VACE variant in one process, alternating, and prints per variant the analytic TFLOP
per step (the control blocks counted, :mod:`wanjax.tools.flops`) and the measured seconds per step
(median over the repeats of each run's per-step median), with the VACE / plain ratios. ``--layers``
keeps the control blocks of those layers (VACE-1.3B: every other layer; VACE-14B: every fifth).

    .venv/bin/python benchmarks/vace_cost.py --arch 1.3B --layers 6 --height 128 --width 128 --frames 9
"""

from __future__ import annotations

import argparse
import statistics

from wanjax.models.registry import registry
from wanjax.tools import bench
from wanjax.tools.flops import dit_step_flops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="1.3B", choices=("1.3B", "14B"))
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--height", type=int, default=128)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--frames", type=int, default=9)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3, help="alternating runs of each variant")
    args = parser.parse_args()
    variants = (args.arch, f"VACE-{args.arch}")
    seconds: dict[str, list[float]] = {v: [] for v in variants}
    tflop: dict[str, float] = {}
    for _ in range(args.rounds):
        for arch in variants:
            cfg = bench.BenchConfig(
                arch=arch,
                layers=args.layers,
                height=args.height,
                width=args.width,
                frames=args.frames,
                num_inference_steps=args.steps,
                stages=("denoise",),
                repeats=2,
                max_sequence_length=64,
            )
            denoise = bench.run_bench(cfg)["stages"]["denoise"]
            seconds[arch].append(denoise["s_per_step_median"])
            tflop[arch] = denoise["tflop"]
    print(f"{'variant':12} {'TFLOP/step':>11} {'s/step (median)':>16}  runs")
    for arch in variants:
        runs = ", ".join(f"{s:.3f}" for s in seconds[arch])
        print(f"{arch:12} {tflop[arch]:11.4f} {statistics.median(seconds[arch]):16.3f}  {runs}")
    plain, vace = variants
    flops_ratio = tflop[vace] / tflop[plain]
    time_ratio = statistics.median(seconds[vace]) / statistics.median(seconds[plain])
    print(f"VACE / plain: FLOPs {flops_ratio:.3f}x (analytic), time {time_ratio:.3f}x (measured)")
    full = [registry()[name].transformer for name in variants]  # every layer, at 480p, 81 frames
    at_480p = [dit_step_flops(cfg, (1, 16, 21, 60, 104)).total for cfg in full]
    print(f"every layer at 832x480, 81 frames: FLOPs {at_480p[1] / at_480p[0]:.3f}x (analytic)")


if __name__ == "__main__":
    main()
