"""The whole tiny pipeline, wanjax vs diffusers, side by side on the same weights and starting noise.

The tiny random Wan 2.1 pipeline of ``tests/test_pipeline_parity.py`` (UMT5 2 layers, DiT 2 layers,
VAE base_dim 8, the test tokenizer, UniPC with flow shift 3) is saved with ``save_pretrained`` into a
temporary directory; diffusers' ``WanPipeline.from_pretrained(dir)`` and wanjax's
``WanPipeline.from_pretrained(dir, dtype)`` then generate from the same prompt, negative prompt,
size, steps, guidance and starting latents (drawn once by torch, passed to both, so the outputs are
comparable frame by frame). The two calls alternate within each repeat; the first call of each
(wanjax: weight loading + compilation + run, with the persistent compilation cache off; diffusers:
its first run, weights already loaded) is reported apart from the steady calls.

    python benchmarks/pipeline_vs_diffusers.py                        # float32 and bfloat16, 5 repeats
    python benchmarks/pipeline_vs_diffusers.py --height 96 --width 128 --frames 17 --steps 10
    python benchmarks/pipeline_vs_diffusers.py --torch_threads 1   # diffusers on one thread

On a shared CPU diffusers' tiny-model calls swing widely (its hundreds of small ops each
synchronise torch's intra-op threads, so one busy core stalls them all); the minimum is the
closest to its uncontended time.

bfloat16 runs the transformer and text encoder in bf16 on both sides (VAE float32), so its frames
are compared but not held to the float32 parity bar (uint8 max |Δ| <= 1).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

# the test suite's helpers, so the model is exactly the parity test's
from helpers.pipelines import NEGATIVE, PROMPT
from helpers.pipelines import build_tiny_pipeline as build_parity_pipeline
from helpers.tokenizer import make_tokenizer_dir

import wanjax


def build_tiny_pipeline(root: Path) -> None:
    """``tests/helpers/pipelines.py``'s tiny random WanPipeline, saved at ``root``."""
    build_parity_pipeline(root, make_tokenizer_dir(root.parent / "tok" / "tokenizer"))


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} s ({min(xs):.3f})"


def compare(root: Path, dtype: str, args: argparse.Namespace, noise: torch.Tensor) -> dict:
    from diffusers import WanPipeline as DiffusersPipeline

    tdtype = getattr(torch, dtype)
    torch_dtype = {"default": torch.float32, "transformer": tdtype, "text_encoder": tdtype}
    reference = DiffusersPipeline.from_pretrained(root, torch_dtype=torch_dtype)
    ours = wanjax.WanPipeline.from_pretrained(root, dtype, vae_dtype="float32", jax_cache_dir="off")
    common = dict(
        height=args.height,
        width=args.width,
        num_frames=args.frames,
        num_inference_steps=args.steps,
        guidance_scale=args.guidance_scale,
    )

    ref_stages: dict[str, float] = {}

    def clocked(name: str, fn):
        def wrapper(*a, **kw):
            start = time.perf_counter()
            out = fn(*a, **kw)
            ref_stages[name] = ref_stages.get(name, 0.0) + time.perf_counter() - start
            return out

        return wrapper

    # diffusers' stages: encode_prompt and vae.decode timed in place, denoise = the rest of the call
    reference.encode_prompt = clocked("encode", reference.encode_prompt)
    reference.vae.decode = clocked("decode", reference.vae.decode)

    def run_reference() -> np.ndarray:
        ref_stages.clear()
        start = time.perf_counter()
        with torch.no_grad():
            video = reference(PROMPT, NEGATIVE, latents=noise, output_type="np", **common).frames
        ref_stages["denoise+rest"] = time.perf_counter() - start - sum(ref_stages.values())
        return (np.asarray(video) * 255).round().astype(np.uint8)  # as its PIL output does

    def run_ours() -> np.ndarray:
        return ours(PROMPT, NEGATIVE, latents=noise.numpy(), seed=args.seed, progress=False, **common).frames

    ref_first, ref_frames = timed(run_reference)
    our_first, our_frames = timed(run_ours)
    first_timings = {k: (v.load, v.compile, v.run) for k, v in ours.timings.items()}
    ref_t, our_t, stage_runs, ref_stage_runs = [], [], [], []
    for _ in range(args.repeats):
        t, ref_frames = timed(run_reference)
        ref_t.append(t)
        ref_stage_runs.append(dict(ref_stages))
        t, our_frames = timed(run_ours)
        our_t.append(t)
        stage_runs.append({k: v.run + v.compile for k, v in ours.timings.items()})
    diff = np.abs(our_frames.astype(np.int16) - ref_frames.astype(np.int16))
    ratio = statistics.median(our_t) / statistics.median(ref_t)
    ratio_min = min(our_t) / min(ref_t)
    print(f"\n{dtype}: frames {tuple(our_frames.shape)}, {args.steps} steps, CFG {args.guidance_scale}")
    print(f"  diffusers first call {ref_first:.3f} s, steady median (min) {fmt(ref_t)}")
    print(f"  wanjax    first call {our_first:.3f} s, steady median (min) {fmt(our_t)}")
    print(
        "  wanjax first call by stage (load / compile / run s): "
        + ", ".join(f"{k} {lo:.2f}/{c:.2f}/{r:.2f}" for k, (lo, c, r) in first_timings.items())
    )
    print(
        "  diffusers steady by stage (median s): "
        + ", ".join(f"{k} {statistics.median(s[k] for s in ref_stage_runs):.3f}" for k in ref_stage_runs[0])
    )
    print(
        "  wanjax steady by stage (median s): "
        + ", ".join(f"{k} {statistics.median(s[k] for s in stage_runs):.3f}" for k in stage_runs[0])
    )
    print(f"  ratio wanjax/diffusers: steady medians {ratio:.3f}, minima {ratio_min:.3f}")
    print(
        f"  uint8 frames max |Δ| {int(diff.max())}, mean |Δ| {diff.mean():.4f}, "
        f"values differing {100 * (diff > 0).mean():.2f}%, reference std {ref_frames.std():.1f}"
    )
    return {
        "dtype": dtype,
        "diffusers_first": ref_first,
        "wanjax_first": our_first,
        "diffusers": ref_t,
        "wanjax": our_t,
        "ratio": ratio,
        "ratio_min": ratio_min,
        "max_abs_diff": int(diff.max()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--height", type=int, default=48)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--frames", type=int, default=9)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--guidance_scale", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--torch_threads", type=int, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)

    print(
        f"machine: {jax.devices()[0].device_kind}, torch threads {torch.get_num_threads()}, "
        f"jax {jax.__version__}, torch {torch.__version__}"
    )
    print(
        f"tiny Wan pipeline (tests/test_pipeline_parity.py), {args.height}x{args.width}x{args.frames}, "
        f"{args.steps} steps, guidance {args.guidance_scale}, {args.repeats} repeats"
    )
    noise = torch.randn(
        (1, 16, (args.frames - 1) // 4 + 1, args.height // 8, args.width // 8),
        generator=torch.Generator().manual_seed(args.seed),
    )
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "wan_pipeline"
        build_tiny_pipeline(root)
        for dtype in args.dtypes:
            results.append(compare(root, dtype, args, noise))
    print("\n| dtype | diffusers first | diffusers median (min) | wanjax first | wanjax median (min) "
          "| ratio (of minima) | uint8 max abs diff |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['dtype']} | {r['diffusers_first']:.3f} s | {fmt(r['diffusers'])} | {r['wanjax_first']:.3f} s "
            f"| {fmt(r['wanjax'])} | **{r['ratio']:.3f}** ({r['ratio_min']:.3f}) | {r['max_abs_diff']} |"
        )


if __name__ == "__main__":
    main()
