"""The ``wanjax`` command line: ``generate``, the stages ``encode | denoise | decode``, ``info``, ``plan``,
``bench``, ``tune-attention``.

Flags use the reference scripts' names (``--num_inference_steps``) and accept hyphenated spellings
(``--num-inference-steps``). User mistakes (bad flags, bad model directories, contradicting stage
files) print one line naming the problem and exit with 2, before any weight is read; failures while
running (NaN/inf latents, an output that cannot be written, an XLA runtime error) print one line and
exit with 1; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence

from wanjax.errors import WanjaxError

COMPONENT_WEIGHTS = {
    "transformer": ("diffusion_pytorch_model",),
    "vae": ("diffusion_pytorch_model",),
    "text_encoder": ("model",),
}
STAGE_DIR = "stage_outputs"


def _flag(parser: argparse.ArgumentParser, name: str, **kwargs) -> None:
    """``--name`` plus its hyphenated spelling."""
    spellings = [f"--{name}"] + ([f"--{name.replace('_', '-')}"] if "_" in name else [])
    parser.add_argument(*spellings, dest=name, **kwargs)


def _common(
    parser: argparse.ArgumentParser, *, model_help: str, dtype: bool = True, vae: bool = False
) -> None:
    _flag(parser, "model", help=model_help)
    if dtype:
        _flag(parser, "dtype", help="transformer / text encoder dtype: bfloat16 (default), float32")
    if vae:
        group = parser.add_argument_group("VAE")
        _flag(group, "vae_dtype", default="float32", help="VAE dtype (default float32, as the reference)")
        _flag(group, "vae_weights_dtype", help="VAE weights dtype (default: --vae_dtype)")
        _flag(
            group,
            "vae_decode_chunk",
            default="1",
            help="latent frames per VAE decode step, or all (default 1; the frames are the same)",
        )
        _flag(
            group,
            "vae_tiling",
            nargs="?",
            const="256:192",
            metavar="SIZE[:STRIDE]",
            help="decode in blended tiles of SIZE pixels every STRIDE (alone: 256:192, as diffusers), "
            "for frames too large to decode whole; seams differ slightly from a whole-frame decode",
        )
    _flag(
        parser,
        "jax_cache_dir",
        help="persistent compilation cache (default $WANJAX_JAX_CACHE_DIR or ~/.cache/wanjax/jax; 'off')",
    )
    _flag(parser, "metrics_json", help="also write the timing report as JSON to this file")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    _parallel(parser)


def _parallel(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("devices and processes")
    for name, kwargs in (
        ("mesh", dict(help="dp=2,sp=1,tp=4 (order = device order), or auto (default with > 1 device)")),
        ("use_dp", dict(action="store_true", help="alias: dp=2 (the CFG pair), the rest on tp")),
        ("sp_num", dict(type=int, help="alias: sequence-parallel shards (sp=N)")),
        ("use_fsdp", dict(action="store_true", help="also shard weights' model dims over dp/sp")),
        ("coordinator_address", dict(help="multi-process: HOST:PORT of process 0, or auto")),
        ("num_processes", dict(type=int, help="multi-process: number of processes")),
        ("process_id", dict(type=int, help="multi-process: this process's index")),
    ):
        _flag(group, name, **kwargs)


def _attention(parser: argparse.ArgumentParser) -> None:
    from wanjax.kernels.attention import BACKENDS

    group = parser.add_argument_group("attention")
    _flag(group, "attention", choices=BACKENDS, default="auto", help="backend (default auto: by platform)")
    _flag(group, "use_custom_attention", action="store_true", help="alias: --attention splash_exp2")
    for name, what in (
        ("bqsize", "query block"),
        ("bkvsize", "key/value block"),
        ("bkvcomputesize", "kv compute block"),
        ("bkvcomputeinsize", "inner kv compute block (splash_exp2)"),
    ):
        _flag(group, name, type=int, help=f"TPU kernel {what}, a multiple of 128 (default: tuned/preset)")
    _flag(group, "use_k_smooth", action="store_true", help="subtract the mean key first (exact)")
    _flag(group, "window_size", type=int, help="self-attention to keys within this many tokens only")


def _prompt(parser: argparse.ArgumentParser) -> None:
    from wanjax.cli.commands import DEFAULT_PROMPT

    _flag(
        parser,
        "prompt",
        nargs="+",
        default=[DEFAULT_PROMPT],
        help="what the video shows; several prompts run as one batch (one mp4 each: NAME_0.mp4, ...)",
    )
    _flag(parser, "prompt_file", help="a text file with one prompt per line (a batch; instead of --prompt)")
    _flag(parser, "negative_prompt", help='what to steer away from (default "")')
    _flag(parser, "max_sequence_length", type=int, default=512, help="text tokens (default 512, as trained)")


def _video(parser: argparse.ArgumentParser) -> None:
    _flag(parser, "height", type=int, help="pixels, multiple of 16 (default 480; demo 128)")
    _flag(parser, "width", type=int, help="pixels, multiple of 16 (default 832; demo 192)")
    _flag(parser, "frames", type=int, help="4n+1 frames (default 81; demo 17)")
    _flag(parser, "fps", type=float, help="mp4 frame rate (default 16)")


def _sampling(parser: argparse.ArgumentParser) -> None:
    _flag(parser, "num_inference_steps", type=int, help="denoising steps (default 50; demo 10)")
    _flag(parser, "guidance_scale", type=float, help="classifier-free guidance (default 5.0; <= 1: off)")
    _flag(parser, "seed", type=int, help="noise seed (default 42; batch item i uses seed + i)")
    _flag(parser, "flow_shift", type=float, help="UniPC flow shift (default: the checkpoint's, 3.0)")
    _flag(parser, "init_latents", help="start from this noise (safetensors, key 'latents') instead of --seed")


def _outputs(parser: argparse.ArgumentParser, default_video: str) -> None:
    _flag(parser, "output_video", help=f"mp4 to write (default {default_video})")
    _flag(parser, "frames_out", help="also save the uint8 [B,T,H,W,3] frames as .npy")
    _flag(parser, "preview", help="also write a PNG contact sheet of the frames")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="wanjax", description="Wan 2.1 text-to-video inference in JAX.")
    sub = parser.add_subparsers(dest="command", required=True)
    model_help = "diffusers model directory, hub id in the local HF cache, or demo (default Wan2.1-T2V-1.3B)"
    later_help = "model (default: the one the stage directory was made with)"

    gen = sub.add_parser("generate", help="prompt to mp4 in one run")
    _common(gen, model_help=model_help, vae=True)
    _prompt(gen)
    _video(gen)
    _sampling(gen)
    _attention(gen)
    _outputs(gen, "YYYYMMDD_HHMMSS.mp4")

    enc = sub.add_parser("encode", help="stage 1: prompt -> stage1_embeddings.safetensors")
    _common(enc, model_help=model_help)
    _prompt(enc)
    _video(enc)
    _flag(enc, "output_dir", default=STAGE_DIR, help=f"stage directory (default {STAGE_DIR})")

    den = sub.add_parser("denoise", help="stage 2: embeddings -> stage2_latents.safetensors")
    _common(den, model_help=later_help)
    _video(den)
    _sampling(den)
    _attention(den)
    _flag(den, "input_dir", default=STAGE_DIR, help=f"stage directory (default {STAGE_DIR})")

    dec = sub.add_parser("decode", help="stage 3: stage2_latents.safetensors -> mp4")
    _common(dec, model_help=later_help, dtype=False, vae=True)
    _video(dec)
    _outputs(dec, "INPUT_DIR/output_video.mp4")
    _flag(dec, "input_dir", default=STAGE_DIR, help=f"stage directory (default {STAGE_DIR})")

    pl = sub.add_parser("plan", help="per-device memory of a run on a mesh (no weights needed)")
    _flag(pl, "model", default="14B", help="1.3B, 14B (presets) or a diffusers model directory (default 14B)")
    _flag(pl, "mesh", help="dp=2,sp=1,tp=4 (default: every mesh of --num_devices, best one named)")
    _flag(pl, "num_devices", type=int, help="devices (default: the mesh's size, else those visible)")
    _flag(pl, "device_memory", default="32GiB", help="memory per device (default 32GiB, a TPU v6e chip)")
    _flag(pl, "height", type=int, default=720, help="pixels (default 720)")
    _flag(pl, "width", type=int, default=1280, help="pixels (default 1280)")
    _flag(pl, "frames", type=int, default=81, help="frames (default 81)")
    _flag(pl, "dtype", default="bfloat16", help="transformer / text encoder dtype (default bfloat16)")
    _flag(pl, "vae_dtype", default="float32", help="VAE dtype (default float32)")
    _flag(pl, "use_fsdp", action="store_true", help="FSDP weights")
    pl.add_argument("--debug", action="store_true", help="show tracebacks for errors")

    from wanjax.tools import bench, tune_attention

    bench_parser = sub.add_parser("bench", help="time each stage of a built-in architecture (random weights)")
    bench.add_arguments(bench_parser)
    bench_parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    tune = sub.add_parser("tune-attention", help="time TPU attention block sizes, cache the fastest")
    tune_attention.add_arguments(tune)
    tune.add_argument("--debug", action="store_true", help="show tracebacks for errors")

    info = sub.add_parser("info", help="what a diffusers-layout model directory holds")
    info.add_argument(
        "model", help="model directory (or one component folder), hub id in the HF cache, or demo"
    )
    info.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    return parser


def cmd_info(args: argparse.Namespace) -> None:
    """Print components, their configs, tensor counts, sizes and dtypes."""
    from wanjax.io.checkpoint import open_component
    from wanjax.pipeline.hub import resolve_model

    source = resolve_model(args.model)
    root = source.path
    index_path = root / "model_index.json"
    if index_path.exists():
        index = _read_json(index_path)
        components = [k for k, v in index.items() if not k.startswith("_") and isinstance(v, list)]
        print(f"{root}: {index.get('_class_name', 'model')}")
        if source.is_demo:
            print(f"  {index['_wanjax_demo']['note']}")
    elif (root / "config.json").exists():
        components, root = [root.name], root.parent
    else:
        raise WanjaxError(
            f"{root}: neither model_index.json nor config.json found; pass a diffusers model directory"
        )
    for name in components:
        folder = root / name
        print(f"\n[{name}]")
        if not folder.is_dir():
            print("  (missing)")
            continue
        config = folder / "config.json"
        if config.exists():
            cfg = _read_json(config)
            print("  class: " + str(cfg.get("_class_name", cfg.get("architectures", "?"))))
            print("  config: " + ", ".join(f"{k}={v}" for k, v in cfg.items() if not k.startswith("_")))
        for json_file in sorted(folder.glob("*config.json")):
            if json_file.name != "config.json":
                print(f"  {json_file.name}: {json_file.read_text().strip()[:400]}")
        if name in COMPONENT_WEIGHTS:
            print("  weights: " + _weights_summary(open_component(folder, COMPONENT_WEIGHTS[name])))
        else:
            files = sorted(p for p in folder.iterdir() if p.is_file())
            print("  files: " + ", ".join(f"{p.name} ({p.stat().st_size / 1024:.0f} KiB)" for p in files))


def _read_json(path) -> dict:
    """A JSON object from ``path``; WanjaxError naming the file otherwise."""
    from wanjax.errors import parse_json_object

    try:
        text = path.read_bytes()
    except OSError as e:
        raise WanjaxError(f"{path}: cannot read ({e.strerror or e})") from None
    return parse_json_object(text, str(path))


def cmd_plan(args: argparse.Namespace) -> int:
    """Print the per-device memory plan; exit 1 when the requested mesh (or every mesh) does not fit."""
    from wanjax.parallel.mesh import parse_mesh
    from wanjax.tools import plan as planning

    model = planning.model_configs(args.model)
    memory = planning.parse_memory(args.device_memory)
    requested = parse_mesh(args.mesh, args.use_fsdp) if args.mesh else None
    count = args.num_devices or (requested.num_devices if requested else None)
    if count is None:
        import jax

        count = jax.device_count()
    if requested and requested.num_devices != count:
        raise WanjaxError(f"--mesh {args.mesh} uses {requested.num_devices} devices, --num_devices {count}")
    size = dict(height=args.height, width=args.width, frames=args.frames)
    kwargs = dict(**size, device_memory=memory, dtype=args.dtype, vae_dtype=args.vae_dtype)
    print(f"{args.model}: {args.width}x{args.height}, {args.frames} frames, {count} devices")
    if requested:
        result = planning.plan(model, requested, **kwargs)
        print(result.table())
        return 0 if result.fits else 1
    plans = [planning.plan(model, m, **kwargs) for m in planning.candidate_meshes(count, args.use_fsdp)]
    for p in plans:
        print(p.table())
    best = planning.best_mesh(plans, model.transformer.num_attention_heads)
    if best is None:
        print("no mesh fits; use more devices, --use_fsdp, or a smaller video")
        return 1
    print(f"suggested: --mesh {best.mesh.flag} (peak {best.peak / planning.GiB:.2f} GiB)")
    return 0


def _weights_summary(refs: dict) -> str:
    counts: dict[str, int] = {}
    total_bytes = 0
    for ref in refs.values():
        counts[str(ref.dtype)] = counts.get(str(ref.dtype), 0) + int(ref.array().size)
        total_bytes += ref.array().nbytes
    params = sum(counts.values()) or 1
    dtypes = ", ".join(f"{k} {v / params:.0%}" for k, v in sorted(counts.items()))
    return f"{len(refs)} tensors, {params / 1e6:.2f} M params, {total_bytes / 2**20:.1f} MiB ({dtypes})"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.debug:
        return _main(args)
    original = warnings.formatwarning
    warnings.formatwarning = _one_line_warning  # "wanjax: warning: ..." instead of file:line + source
    try:
        return _main(args)
    finally:
        warnings.formatwarning = original


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    return f"wanjax: warning: {_one_line(message if isinstance(message, Warning) else Warning(message))}\n"


def _main(args: argparse.Namespace) -> int:
    try:
        if args.command == "info":
            cmd_info(args)
        elif args.command == "plan":
            return cmd_plan(args)
        elif args.command == "bench":
            from wanjax.tools import bench

            bench.run(args)
        elif args.command == "tune-attention":
            from wanjax.tools import tune_attention

            return tune_attention.run(args)
        else:
            from wanjax.cli.commands import COMMANDS
            from wanjax.parallel.multihost import initialize

            initialize(args.coordinator_address, args.num_processes, args.process_id)

            COMMANDS[args.command](args)
    except WanjaxError as e:
        if args.debug:
            raise
        print(f"wanjax: error: {_one_line(e)}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        if args.debug:
            raise
        print("wanjax: interrupted (no partial output files were left)", file=sys.stderr)
        return 130
    except (OSError, MemoryError) as e:  # a runtime failure: disk full, out of host memory, ...
        if args.debug:
            raise
        print(
            f"wanjax: error: {_one_line(e) or type(e).__name__} (--debug shows the traceback)",
            file=sys.stderr,
        )
        return 1
    except Exception as e:
        import jax

        if args.debug or not isinstance(e, jax.errors.JaxRuntimeError):
            raise
        first = _one_line(e)[:300]
        print(f"wanjax: error: XLA runtime failure: {first} (--debug shows the traceback)", file=sys.stderr)
        return 1
    return 0


def _one_line(e: BaseException) -> str:
    """The message on one line (multi-line messages are joined)."""
    return " ".join(line.strip() for line in str(e).splitlines() if line.strip())


if __name__ == "__main__":
    sys.exit(main())
