"""A DiT step over GGUF blocks kept on the chips (``--weights_dtype gguf``), compiled for a TPU slice
without a TPU: the compiler's bytes per chip against bf16's and against ``plan``.

The kept types are those of a city96 file (every matmul kernel of the transformer in one GGUF type,
the rest float), given by key path as ``plan`` reads them from a file's header, so no 14B file is
needed; the step is lowered from abstract inputs (``wanjax.tools.compile_target``) as
``wanjax plan --compile SLICE --transformer FILE.gguf --weights_dtype gguf --programs step`` does.

    python benchmarks/gguf_compile.py                                  # 14B, 720p, v6e-8, bf16 Q8_0 Q4_K
    python benchmarks/gguf_compile.py --slice v5e-8 --height 480 --width 832 --types bf16 Q4_K
"""

from __future__ import annotations

import argparse
import dataclasses

GiB = 1 << 30


def kept_types(cfg, qtype: str) -> dict[str, str]:
    """Every matmul kernel of the transformer in ``qtype`` (by key path), as a city96 file keeps them."""
    import jax

    from wanjax.io.checkpoint import LeafSource, linear_kernel
    from wanjax.models import dit

    leaves = jax.tree_util.tree_flatten_with_path(
        dit.checkpoint_spec(cfg), is_leaf=lambda x: isinstance(x, LeafSource)
    )[0]
    return {jax.tree_util.keystr(key): qtype for key, source in leaves if source.layout == linear_kernel}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="14B")
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--slice", default="v6e-8")
    parser.add_argument("--mesh", default="dp=2,sp=1,tp=4")
    parser.add_argument("--attention", default="splash_exp2")
    parser.add_argument("--types", nargs="+", default=["bf16", "Q8_0", "Q4_K"])
    args = parser.parse_args()

    from wanjax.chips import SLICES
    from wanjax.models.registry import registry
    from wanjax.parallel.mesh import parse_mesh
    from wanjax.planning import models as planning_models
    from wanjax.planning import plan as planning
    from wanjax.tools.compile_target import RunSpec, compile_run, slice_target

    variant, tpu, mesh = registry()[args.arch], SLICES[args.slice], parse_mesh(args.mesh)
    target = slice_target(tpu)  # plan's memory layout for the slice, as `plan --compile` has it
    layout = dict(lanes=target.lanes, copies_stacks=target.copies_16bit_stacks)
    size = dict(height=args.height, width=args.width, frames=args.frames)
    print(
        f"{args.arch} {args.width}x{args.height}x{args.frames}, {args.slice}, {args.mesh}, {args.attention}"
    )
    print(
        "| weights | step GiB per chip (arguments + temporaries + outputs + code) | with the resident weights | plan | compile |"
    )
    print("| --- | --- | --- | --- | --- |")
    for qtype in args.types:
        kept = {} if qtype == "bf16" else {"transformer": kept_types(variant.transformer, qtype)}
        weights = "gguf" if kept else "bf16"
        model = dataclasses.replace(planning_models.model_configs(args.arch), gguf=kept)
        planned = planning.plan(
            model, mesh, **size, **layout, device_memory=tpu.chip.usable_hbm_bytes, weights_dtype=weights
        )
        run = RunSpec(variant, **size, mesh=mesh, attention=args.attention, weights_dtype=weights, gguf=kept)
        onto = {name: planned.on_device(name) for name in planned.stages}
        (step,) = compile_run(run, tpu, onto, only=["step"]).programs
        if not step.compiled:
            print(f"| {qtype} | {step.error} | | | {step.compile_seconds:.1f} s |")
            continue
        b = {k: v / GiB for k, v in step.bytes_per_chip.items()}
        parts = f"{b['arguments']:.2f} + {b['temporaries']:.2f} + {b['outputs']:.2f} + {b['code']:.3f}"
        whole = (step.bytes_per_chip["total"] + step.resident_bytes_per_chip) / GiB
        plan = step.planned_bytes_per_chip / GiB
        print(
            f"| {qtype} | {b['total']:.2f} ({parts}) | {whole:.2f} | {plan:.2f} ({plan / whole - 1:+.0%}) "
            f"| {step.compile_seconds:.1f} s |"
        )


if __name__ == "__main__":
    main()
