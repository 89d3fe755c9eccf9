"""Which TPU kernel block sizes compile, per TPU generation: the evidence for the per-generation
defaults in ``wanjax.kernels.tuning``.

For each slice and kernel (``splash``, ``splash_exp2``) every candidate ``(bq, bkv, bkv_compute,
bkv_compute_in)`` is compiled by the real TPU compiler (libtpu; no TPU needed) for one chip's share
of a registry model's self-attention (default: Wan 2.1 14B at 1280x720x81 on dp=2,tp=4: 75,600
tokens, 10 of 40 heads, head dim 128, bf16). A candidate that does not fit the chip's scoped VMEM
fails (``CompileTimeScopedVmemOom``, or on v4 "Ran out of memory in memory space vmem") with the
bytes it needed against the limit.

    python benchmarks/tpu_blocks.py --slices v5e-8 v6e-8 v5p-8 v4-8 --json blocks.json
"""

from __future__ import annotations

import argparse
import json
import re

from wanjax.chips import SLICES
from wanjax.kernels.attention import AttentionSpec
from wanjax.target import building_for
from wanjax.tools.compile_target import attention_program, compile_one, slice_target

CANDIDATES = (
    (3328, 2816, 256, 256),  # the seed's, tuned on v6e
    (2048, 2048, 512, 256),
    (2048, 2048, 256, 256),
    (2048, 1024, 512, 256),
    (1536, 1536, 512, 256),
    (1024, 2048, 512, 256),
    (1024, 1024, 512, 256),
    (1024, 1024, 256, 128),
    (512, 1024, 512, 256),
)
NEEDED = re.compile(r"(?:size|Used) ([\d.]+[KMG]?) (?:and limit|of) ([\d.]+[KMG]?)")


def compile_candidate(
    slice_name: str, backend: str, blocks: tuple[int, ...], length: int, heads: int
) -> dict:
    target = slice_target(SLICES[slice_name])
    with building_for(target):
        program = attention_program(target, AttentionSpec(backend, *blocks), (1, length, heads, 128))
        report = compile_one(program)
    needed = NEEDED.search(report.error or "")
    return {
        "slice": slice_name,
        "backend": backend,
        "blocks": list(blocks),
        "compiled": report.compiled,
        "vmem_needed": needed.group(1) if needed else None,
        "vmem_limit": needed.group(2) if needed else None,
        "compile_seconds": round(report.compile_seconds, 1),
        "tpu_custom_calls": report.tpu_custom_calls,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--slices", nargs="+", default=["v5e-8", "v6e-8", "v5p-8", "v4-8"])
    parser.add_argument("--backends", nargs="+", default=["splash", "splash_exp2"])
    parser.add_argument("--length", type=int, default=75600, help="tokens (default: 14B 720p)")
    parser.add_argument("--heads", type=int, default=10, help="heads per chip (default: 40 over tp=4)")
    parser.add_argument(
        "--blocks", nargs="+", help="candidates to try, e.g. 3328,2816,256,256 (default: all)"
    )
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    rows = []
    for slice_name in args.slices:
        for backend in args.backends:
            for blocks in (
                [tuple(int(x) for x in b.split(",")) for b in args.blocks] if args.blocks else CANDIDATES
            ):
                row = compile_candidate(slice_name, backend, blocks, args.length, args.heads)
                rows.append(row)
                status = (
                    "compiles"
                    if row["compiled"]
                    else f"VMEM: needs {row['vmem_needed']} of {row['vmem_limit']}"
                )
                print(f"{slice_name:7} {backend:12} {tuple(blocks)!s:26} {status}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
