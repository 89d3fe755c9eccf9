"""Denoising seconds of the demo model, one video against a batch of 4 (bfloat16, guidance on).

Prints one JSON line: the wanjax it imported and, per batch, the best of 3 timed ``pipe.denoise``
runs of ``--steps`` steps after a 2-step warm-up (which compiles). Run it once per checkout to
compare two versions side by side, alternating, on an idle machine:

    PYTHONPATH=/path/to/other/checkout/src python benchmarks/batch_step.py
    python benchmarks/batch_step.py --height 240 --width 416 --frames 17 --steps 10
"""

from __future__ import annotations

import argparse
import json
import time

import jax

import wanjax
from wanjax import WanPipeline


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--height", type=int, default=240)
    parser.add_argument("--width", type=int, default=416)
    parser.add_argument("--frames", type=int, default=17)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    pipe = WanPipeline.from_pretrained("demo")
    out: dict[str, object] = {"wanjax": wanjax.__file__}
    for batch in (1, 4):
        pos, neg = pipe.encode_prompt([f"scene {n}" for n in range(batch)], [""] * batch, 512)
        latents = pipe.prepare_latents(batch, args.height, args.width, args.frames, seed=0)
        pipe.denoise(pos, neg, latents, num_inference_steps=2, progress=False)  # compiles
        times = []
        for _ in range(3):
            start = time.perf_counter()
            jax.block_until_ready(
                pipe.denoise(pos, neg, latents, num_inference_steps=args.steps, progress=False).latents
            )
            times.append(time.perf_counter() - start)
        out[f"batch {batch}"] = round(min(times), 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
