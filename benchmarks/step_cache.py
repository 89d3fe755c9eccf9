"""Step caching side by side: off / MagCache / First-Block Cache / TeaCache / TaylorSeer / SeaCache on
the same random DiT, same noise; the uncached run without the text K/V cache (``off_no_text_kv``;
every other policy runs with it, the default); beside them the few-step samplers of distilled models
(LightX2V's ``distill`` 4 steps, FastWan's ``dmd`` 3, TurboWan's ``rcm`` 4; no CFG, as those models run).

The 1.3B transformer's dimensions (``--layers`` of its 30), random weights (the checkpoint reader's
random draw), ``--steps`` UniPC steps with CFG, each policy at its default settings (MagCache: the
published Wan 2.1 1.3B curve and its threshold 0.12, 4 skips, retention 0.2; First-Block Cache:
diffusers' threshold 0.05; TeaCache: the authors' 1.3B coefficients and threshold 0.05; TaylorSeer:
diffusers' defaults in lite mode, the output predicted; SeaCache: diffusers' defaults). The policies run in turn, ``--rounds`` times, so drift in the machine's
speed hits all of them alike. Reported per policy: DiT evaluations per video, the median loop's
seconds and its ratio to uncached, and the final latents' relative difference to the uncached run.

Random weights make the magnitude curve meaningless for quality (MagCache's schedule depends on
the curve only, so its skips and its wall-time ratio are those of a real run; First-Block Cache's
and TeaCache's decisions depend on the weights, the time embedder's for TeaCache, and say little here).

    python benchmarks/step_cache.py                       # 2 layers, 240x416x9, 50 steps, 2 rounds
    python benchmarks/step_cache.py --policies off dmd rcm # a subset
    python benchmarks/step_cache.py --layers 30 --height 480 --width 832 --frames 81   # GPU
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import common
import jax
import numpy as np

from wanjax.sampling.cache.step_cache import CacheConfig
from wanjax.sampling.sampler import Sampler
from wanjax.sampling.scheduler import SchedulerConfig, make_scheduler


@dataclasses.dataclass(frozen=True)
class Policy:
    """A step cache on the ``--steps`` UniPC run with CFG, or a distilled model's sampler."""

    cache: CacheConfig | None = None
    scheduler: str = "unipc"
    steps: int | None = None  # None: --steps
    guidance: float = 5.0
    text_kv: bool = True  # the text K/V cache (sampling/context_cache.py)


POLICIES = {
    "off": Policy(),
    "off_no_text_kv": Policy(text_kv=False),
    "magcache": Policy(CacheConfig("magcache", mag_ratios="wan2.1-t2v-1.3b")),
    "firstblock": Policy(CacheConfig("firstblock")),
    "teacache": Policy(CacheConfig("teacache", coefficients="wan2.1-t2v-1.3b")),
    "taylorseer": Policy(CacheConfig("taylorseer", options={"use_lite_mode": True})),
    "seacache": Policy(CacheConfig("seacache")),
    "distill": Policy(scheduler="distill", steps=4, guidance=1.0),
    "dmd": Policy(scheduler="dmd", steps=3, guidance=1.0),
    "rcm": Policy(scheduler="rcm", steps=4, guidance=1.0),
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=50)
    common.add_random_dit_flags(parser)
    parser.add_argument("--policies", nargs="+", choices=list(POLICIES), default=list(POLICIES))
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    policies = {name: POLICIES[name] for name in dict.fromkeys(["off", *args.policies])}

    model, shape, noise, cond, uncond = common.random_dit_run(args)
    samplers = {cached: Sampler(model, context_cache=cached) for cached in (True, False)}

    def run(policy: Policy) -> tuple[np.ndarray, float]:
        steps = policy.steps or args.steps
        scheduler = make_scheduler(SchedulerConfig(), steps, kind=policy.scheduler)
        negative = uncond if policy.guidance > 1 else None
        start = time.perf_counter()
        sampler = samplers[policy.text_kv]
        result = sampler(scheduler, noise, cond, negative, policy.guidance, cache=policy.cache)
        return result, time.perf_counter() - start

    for policy in policies.values():  # compile every program first
        run(policy)
    seconds: dict[str, list[float]] = {name: [] for name in policies}
    results: dict[str, dict] = {}
    for _ in range(args.rounds):
        for name, policy in policies.items():
            result, elapsed = run(policy)
            latents = np.asarray(result.latents)
            seconds[name].append(elapsed)
            report = result.cache_report
            branches = 2 if policy.guidance > 1 else 1
            results[name] = {
                "latents": latents,
                "steps": policy.steps or args.steps,
                "evaluations": branches * (policy.steps or args.steps)
                if report is None
                else report.evaluations,
                "cache": None if report is None else report.as_json(),
            }
    reference = results["off"]["latents"]
    base = statistics.median(seconds["off"])
    print(
        f"1.3B dims, {args.layers} layers, {args.width}x{args.height}x{args.frames} (latents {list(shape)}), "
        f"{args.steps} steps, CFG (the samplers: their steps, no CFG), {args.dtype}; "
        f"{jax.device_count()} x {jax.devices()[0].device_kind}"
    )
    print(
        "| policy | settings | DiT evaluations | loop s (median; each round) | s/step | vs off | latents rel. diff |"
    )
    print("|---|---|---|---|---|---|---|")
    summary = {}
    for name, r in results.items():
        median = statistics.median(seconds[name])
        diff = float(np.linalg.norm(r["latents"] - reference) / np.linalg.norm(reference))
        c = r["cache"] or {}
        settings = ", ".join(
            f"{k} {c[k]}" for k in ("threshold", "max_skip_steps", "retention_ratio") if k in c
        )
        if POLICIES[name].steps:
            settings = f"{r['steps']} steps, no CFG"
        each = " / ".join(f"{s:.2f}" for s in seconds[name])
        print(
            f"| {name} | {settings or '-'} | {r['evaluations']} | {median:.2f} ({each}) | "
            f"{median / r['steps']:.3f} | {median / base:.2f} | {diff:.3g} |"
        )
        summary[name] = {
            "seconds": seconds[name],
            "evaluations": r["evaluations"],
            "latents_rel_diff": diff,
            "cache": c,
        }
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": summary}, f, indent=2)


if __name__ == "__main__":
    main()
