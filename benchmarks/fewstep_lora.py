"""The few-step workflow: a step/CFG-distillation LoRA, 4 steps without CFG, against 50 CFG steps.

The 1.3B transformer's dimensions (``--layers`` of its 30), random weights, and a random rank-64 LoRA
over every block's attention and FFN projections in the original Wan layout (the layout LightX2V's
distillation LoRAs use). Timed, side by side in one process:

* reading the LoRA file and merging it into the weights (``WanTransformer.set_loras``);
* ``--rounds`` denoising loops of each: the base model with UniPC, 50 steps, CFG 5 (100 transformer
  evaluations), and the merged model with the distill sampler, 4 steps, guidance 1 (4 evaluations).

Random weights say nothing about quality; this measures the cost of each workflow.

    python benchmarks/fewstep_lora.py                      # 2 layers, 416x240x9, 2 rounds
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import common
import jax
import numpy as np
from safetensors.numpy import save_file

from wanjax.sampling.sampler import Sampler
from wanjax.sampling.scheduler import SchedulerConfig, make_scheduler

PROJECTIONS = {  # original Wan module -> (out, in) as a function of (dim, ffn)
    **{f"self_attn.{p}": lambda d, f: (d, d) for p in "qkvo"},
    **{f"cross_attn.{p}": lambda d, f: (d, d) for p in "qkvo"},
    "ffn.0": lambda d, f: (f, d),
    "ffn.2": lambda d, f: (d, f),
}


def write_lora(path: Path, cfg, rank: int) -> int:
    """A random rank-``rank`` LoRA (lora_down / lora_up / alpha) over every block projection; its bytes."""
    rng = np.random.default_rng(0)
    tensors = {}
    for i in range(cfg.num_layers):
        for module, shape in PROJECTIONS.items():
            out, inp = shape(cfg.inner_dim, cfg.ffn_dim)
            key = f"diffusion_model.blocks.{i}.{module}"
            tensors[f"{key}.lora_down.weight"] = (rng.standard_normal((rank, inp)) * 0.01).astype(np.float32)
            tensors[f"{key}.lora_up.weight"] = (rng.standard_normal((out, rank)) * 0.01).astype(np.float32)
            tensors[f"{key}.alpha"] = np.asarray(rank, np.float32)
    save_file(tensors, str(path))
    return path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rank", type=int, default=64)
    common.add_random_dit_flags(parser)
    args = parser.parse_args()

    model, shape, noise, cond, uncond = common.random_dit_run(args)
    cfg = model.cfg
    with tempfile.TemporaryDirectory() as tmp:
        lora = Path(tmp) / "distill.safetensors"
        size = write_lora(lora, cfg, args.rank)
        merge_s = []
        for _ in range(args.rounds):
            start = time.perf_counter()
            model.set_loras([(lora, 1.0)])
            jax.block_until_ready(model.params)
            merge_s.append(time.perf_counter() - start)
            model.set_loras([])
        base_params = model.params
        model.set_loras([(lora, 1.0)])
        merged_params = model.params
    sampler = Sampler(model)
    runs = {
        "50 steps, UniPC, CFG 5 (base)": (
            base_params,
            make_scheduler(SchedulerConfig(), 50),
            uncond,
            5.0,
            100,
        ),
        "4 steps, distill, no CFG (LoRA merged)": (
            merged_params,
            make_scheduler(SchedulerConfig(), 4, kind="distill", seed=0),
            None,
            1.0,
            4,
        ),
    }

    def run(params, scheduler, negative, guidance) -> float:
        model.params = params
        start = time.perf_counter()
        out = sampler(scheduler, noise, cond, negative, guidance).latents
        jax.block_until_ready(out)
        return time.perf_counter() - start

    for params, scheduler, negative, guidance, _ in runs.values():  # compile both programs first
        run(params, scheduler, negative, guidance)
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, (params, scheduler, negative, guidance, _) in runs.items():
            seconds[name].append(run(params, scheduler, negative, guidance))
    base = statistics.median(next(iter(seconds.values())))
    print(
        f"1.3B dims, {args.layers} layers, {args.width}x{args.height}x{args.frames} (latents {list(shape)}), "
        f"{args.dtype}; {jax.device_count()} x {jax.devices()[0].device_kind}"
    )
    print(
        f"LoRA: rank {args.rank}, {10 * cfg.num_layers} modules, {size / 2**20:.1f} MiB; read + merge "
        f"{statistics.median(merge_s):.2f} s (each round: {' / '.join(f'{s:.2f}' for s in merge_s)})"
    )
    print("| run | DiT evaluations | loop s (median; each round) | vs 50-step CFG |")
    print("|---|---|---|---|")
    for name, (*_, evaluations) in runs.items():
        median = statistics.median(seconds[name])
        each = " / ".join(f"{s:.2f}" for s in seconds[name])
        print(f"| {name} | {evaluations} | {median:.2f} ({each}) | {median / base:.3f} |")


if __name__ == "__main__":
    main()
