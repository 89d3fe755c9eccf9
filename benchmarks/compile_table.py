"""Registry models x sizes x TPU slices, compiled by the TPU compiler without a TPU: a Markdown table
of ``wanjax plan --compile`` reports (on the mesh ``plan`` suggests for the chip's HBM).

    python benchmarks/compile_table.py --models 1.3B 14B --sizes 480p 720p --slices v5e-8 v6e-8 \
        --programs step --out table.md

Each cell is one ``wanjax plan --compile SLICE --json`` run in its own process; the row gives, per
program compiled, the compiler's bytes per chip with the other components' resident weights, the
same by ``plan``'s estimate, and the compile seconds (on this machine's CPU).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

SIZES = {"480p": (480, 832), "720p": (720, 1280)}
GiB = 1 << 30


def run(model: str, size: str, tpu: str, programs: str | None, attention: str) -> dict:
    height, width = SIZES[size]
    if model == "5B" and size == "720p":
        height = 704  # TI2V-5B's 720p (its VAE's 32-pixel steps)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "wanjax.cli.main", "plan", "--model", model, "--height", str(height)]
        cmd += ["--width", str(width), "--frames", "81" if model != "5B" else "121", "--compile", tpu]
        cmd += ["--attention", attention, "--json", str(out)]
        if programs:
            cmd += ["--programs", programs]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if not out.exists():
            return {"error": (done.stderr or done.stdout).strip().splitlines()[-1]}
        return json.loads(out.read_text())


def row(model: str, size: str, tpu: str, report: dict) -> str:
    if "error" in report:
        return f"| {model} | {size} | {tpu} | | {report['error']} | | | |"
    cells = []
    for p in report["programs"]:
        if not p["compiled"]:
            cells.append(f"{p['name']}: **fails**: {p['error'][:120]}")
            continue
        on_chip = (p["bytes_per_chip"]["total"] + p["resident_bytes_per_chip"]) / GiB
        planned = p["planned_bytes_per_chip"] / GiB if p["planned_bytes_per_chip"] else float("nan")
        cells.append(
            f"{p['name']}: {on_chip:.2f} (plan {planned:.2f}; {p['bytes_per_chip']['total'] / GiB:.2f} own), "
            f"{p['compile_seconds']:.0f} s"
        )
    fits = "yes" if report["fits"] else "**no**"
    hbm = report["hbm_bytes_per_chip"] / GiB
    return f"| {model} | {size} | {tpu} ({hbm:.0f} GiB) | {report['mesh']} | {'; '.join(cells)} | {fits} |"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", nargs="+", default=["1.3B", "14B", "I2V-14B", "A14B", "5B"])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES))
    parser.add_argument("--slices", nargs="+", default=["v5e-8", "v6e-8", "v5p-8"])
    parser.add_argument("--programs", help="e.g. step (default: every program)")
    parser.add_argument("--attention", default="auto")
    parser.add_argument("--out", help="append the table here")
    args = parser.parse_args()
    lines = [
        "| model | size | slice (HBM per chip) | mesh | per program: GiB per chip with the resident weights "
        "(plan's estimate; the program's own), compile time | fits |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    print("\n".join(lines), flush=True)
    for model in args.models:
        for size in args.sizes:
            for tpu in args.slices:
                line = row(model, size, tpu, run(model, size, tpu, args.programs, args.attention))
                lines.append(line)
                print(line, flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
