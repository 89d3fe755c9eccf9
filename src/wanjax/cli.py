"""The ``wanjax`` command line.

User mistakes (bad flags, bad model directories) print one line naming the problem and exit with 2
(1 for other runtime failures); ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from wanjax.atomic import atomic_path
from wanjax.errors import WanjaxError

COMPONENT_WEIGHTS = {
    "transformer": ("diffusion_pytorch_model",),
    "vae": ("diffusion_pytorch_model",),
    "text_encoder": ("model",),
}


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="wanjax", description="Wan 2.1 text-to-video inference in JAX.")
    sub = parser.add_subparsers(dest="command", required=True)

    info = sub.add_parser("info", help="what a diffusers-layout model directory holds")
    info.add_argument("model", help="model root directory (with model_index.json) or one component folder")
    _add_common(info)

    demo = sub.add_parser("demo", help="denoise with the small built-in random model (no downloads)")
    demo.add_argument("--output_dir", "--output-dir", default="out/demo")
    demo.add_argument("--num_inference_steps", "--num-inference-steps", type=int, default=8)
    demo.add_argument("--frames", type=int, default=9)
    demo.add_argument("--height", type=int, default=64)
    demo.add_argument("--width", type=int, default=96)
    demo.add_argument("--guidance_scale", "--guidance-scale", type=float, default=5.0)
    demo.add_argument("--dtype", default="float32")
    demo.add_argument("--seed", type=int, default=42)
    _add_common(demo)
    return parser


def cmd_info(args: argparse.Namespace) -> None:
    """Print components, their configs, tensor counts, sizes and dtypes."""
    from wanjax.checkpoint import open_component

    root = Path(args.model)
    if not root.exists():
        raise WanjaxError(f"{root}: model path does not exist")
    index_path = root / "model_index.json"
    if index_path.exists():
        index = json.loads(index_path.read_text())
        components = [k for k, v in index.items() if not k.startswith("_") and isinstance(v, list)]
        print(f"{root}: {index.get('_class_name', 'model')}")
    elif (root / "config.json").exists():
        components, root = [root.name], root.parent
    else:
        raise WanjaxError(
            f"{root}: neither model_index.json nor config.json found; pass a diffusers model directory"
        )
    for name in components:
        folder = root / name
        print(f"\n[{name}]")
        config = folder / "config.json"
        if config.exists():
            cfg = json.loads(config.read_text())
            print("  class: " + str(cfg.get("_class_name", cfg.get("architectures", "?"))))
            print("  config: " + ", ".join(f"{k}={v}" for k, v in cfg.items() if not k.startswith("_")))
        for json_file in sorted(folder.glob("*config.json")):
            if json_file.name != "config.json":
                print(f"  {json_file.name}: {json_file.read_text().strip()[:400]}")
        if name not in COMPONENT_WEIGHTS:
            continue
        refs = open_component(folder, COMPONENT_WEIGHTS[name])
        counts: dict[str, int] = {}
        total_bytes = 0
        for ref in refs.values():
            counts[str(ref.dtype)] = counts.get(str(ref.dtype), 0) + int(ref.array().size)
            total_bytes += ref.array().nbytes
        params = sum(counts.values())
        dtypes = ", ".join(f"{k} {v / params:.0%}" for k, v in sorted(counts.items()))
        print(
            f"  weights: {len(refs)} tensors, {params / 1e6:.2f} M params, {total_bytes / 2**20:.1f} MiB ({dtypes})"
        )


def cmd_demo(args: argparse.Namespace) -> None:
    """Write the built-in model, load it like a real checkpoint, denoise random latents, save them."""
    import jax
    import jax.numpy as jnp
    from safetensors.numpy import save_file

    from wanjax.config import parse_dtype
    from wanjax.demo_model import DEMO_TRANSFORMER, write_demo_model
    from wanjax.models.dit import load_transformer
    from wanjax.sampling import denoise
    from wanjax.scheduler import make_scheduler

    if (args.frames - 1) % 4:
        raise WanjaxError(
            f"--frames {args.frames} must be 4n+1 (e.g. {(args.frames - 1) // 4 * 4 + 1} or "
            f"{(args.frames - 1) // 4 * 4 + 5})"
        )
    if args.height % 16 or args.width % 16:
        raise WanjaxError(f"--height/--width must be multiples of 16, got {args.height}x{args.width}")
    if args.num_inference_steps < 1:
        raise WanjaxError("--num_inference_steps must be at least 1")
    dtype = parse_dtype(args.dtype)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = write_demo_model(out / "model", seed=0)
    start = time.perf_counter()
    model = load_transformer(model_dir, dtype=dtype)
    scheduler = make_scheduler(model_dir, args.num_inference_steps)
    load_s = time.perf_counter() - start

    key_latents, key_text = jax.random.split(jax.random.key(args.seed))
    shape = (1, 16, (args.frames - 1) // 4 + 1, args.height // 8, args.width // 8)
    latents = jax.random.normal(key_latents, shape, jnp.float32)
    text = jax.random.normal(key_text, (2, 512, DEMO_TRANSFORMER.text_dim), jnp.float32).astype(model.dtype)
    text = text.at[:, 16:].set(0)  # as the pipeline zeroes embeddings past the prompt length

    def report(i: int, seconds: float) -> None:
        print(f"  step {i + 1}/{args.num_inference_steps}: {seconds:.3f}s", file=sys.stderr)

    final, times = denoise(model, scheduler, latents, text[:1], text[1:], args.guidance_scale, report)
    path = out / "latents.safetensors"
    with atomic_path(path) as tmp:
        save_file({"latents": jax.device_get(final)}, str(tmp))
    steady = statistics.median(times.steady) if times.steady else float("nan")
    print(
        f"model: {model_dir} ({DEMO_TRANSFORMER.num_layers} layers, dim {DEMO_TRANSFORMER.inner_dim}, "
        f"random weights)"
    )
    print(f"latents {shape} -> {path}")
    print(
        f"load {load_s:.2f}s | first step (compile + run) {times.first:.2f}s | "
        f"steady {steady:.4f}s/step over {len(times.steady)} steps | "
        f"timesteps {scheduler.timesteps.tolist()}"
    )


COMMANDS = {"info": cmd_info, "demo": cmd_demo}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        COMMANDS[args.command](args)
    except WanjaxError as e:
        if args.debug:
            raise
        print(f"wanjax: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
