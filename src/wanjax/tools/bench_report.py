"""``wanjax bench``'s report: its table and memory lines from the result dict of ``run_bench``."""

from __future__ import annotations

from typing import Any

from wanjax.io.quantizable import UNQUANTIZED
from wanjax.tools.measure import HOST_ARGUMENT

MEMORY_LEGEND = {
    "program_memory": "per stage: XLA's memory_analysis() of the compiled program, in bytes (arguments, "
    "outputs, temporaries, generated code; total = arguments + outputs - aliased + temporaries + code): "
    "what the program itself needs in device memory; host_argument_bytes: its arguments in a host "
    "memory kind (offload blocks: the streamed layers), not in the total",
    "weights_bytes": "per stage: the weights' bytes in device memory and in host memory kinds",
    "allocator_peak_bytes": "the device allocator's peak_bytes_in_use since the process started (per "
    "stage: right after it), everything allocated at once, XLA's autotuning scratch included; null "
    "where the device keeps no statistics (CPU)",
    "host_peak_rss_bytes": "the process's peak resident memory (on a CPU: weights, activations, runtime)",
}


def format_table(result: dict[str, Any]) -> str:
    """The measurements as a text table."""
    cfg = result["config"]
    memory = cfg.get("memory", {})
    head = (
        f"wanjax bench: {cfg['arch']} ({cfg['layers'] or 'all'} layers), {cfg['width']}x{cfg['height']}, "
        f"{cfg['frames']} frames, {cfg['num_inference_steps']} steps, {cfg['dtype']}, guidance "
        f"{cfg['guidance_scale']}, offload {memory.get('offload', 'none')}, weights "
        f"{memory.get('weights_dtype', UNQUANTIZED)}, matmuls {result.get('activations_dtype', cfg['dtype'])}; "
        f"{result['devices']} x {result['device']}, peak "
        + "; ".join(
            dict.fromkeys(f"{p['tflops']:.3g} TFLOP/s ({p['source']})" for p in result["peaks"].values())
        )
    )
    lines = [
        head,
        f"{'stage':8} {'warm-up s':>10} {'steady s':>18} {'s/step':>18} {'TFLOP':>9} "
        f"{'TFLOP/s':>8} {'of peak':>13}",
    ]

    def of_peak(s: dict[str, Any]) -> str:
        return f"{100 * s['fraction_of_peak']:.0f}% {s['peak_dtype']}" if "fraction_of_peak" in s else "-"

    for name, s in result["stages"].items():
        steady = f"{s['steady_median_s']:.3f} ({s['steady_min_s']:.3f}-{s['steady_max_s']:.3f})"
        step = "-"
        if "s_per_step_median" in s:
            lo, hi = s["s_per_step_spread"]
            step = f"{s['s_per_step_median']:.3f} ({lo:.3f}-{hi:.3f})"
        tflop = f"{s['tflop']:.3f}" if "tflop" in s else "-"
        rate = f"{s['achieved_tflops']:.3f}" if "achieved_tflops" in s else "-"
        lines.append(
            f"{name:8} {s['warmup_s']:>10.2f} {steady:>18} {step:>18} {tflop:>9} {rate:>8} {of_peak(s):>13}"
        )
    p = result.get("pipeline") or {}
    if p:
        share = ", ".join(f"{k} {100 * v:.0f}%" for k, v in p["seconds_share"].items())
        lines.append(
            f"{'pipeline':8} {'':>10} {p['steady_s']:>18.3f} {'':>18} {p['tflop']:>9.3f} "
            f"{p.get('achieved_tflops', float('nan')):>8.3f} {of_peak(p):>13}  (time: {share})"
        )
    denoise = result["stages"].get("denoise", {})
    if "cache" in denoise:
        c = denoise["cache"]
        steps = cfg["num_inference_steps"]
        evaluated = ", ".join(f"{name} {b['evaluated_steps']}/{steps}" for name, b in c["branches"].items())
        lines.append(
            f"cache {c['policy']} (threshold {c['threshold']:g}): steps evaluated {evaluated}; "
            f"{c['dit_evaluations']} DiT evaluations per video (uncached {steps * len(c['branches'])}); "
            f"effective {denoise['s_per_step_effective']:.3f} s/step"
        )
    decode = result["stages"].get("decode", {})
    if "tflop_executed" in decode:
        lines.append(
            f"decode FLOPs are the reference architecture's; wanjax's formulation executes "
            f"{decode['tflop_executed']:.3f} TFLOP ({decode['achieved_tflops_executed']:.3f} TFLOP/s)"
        )
    lines += memory_lines(result)
    return "\n".join(lines)


def _gib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**30:.3f}"


def memory_lines(result: dict[str, Any]) -> list[str]:
    """The memory table: per stage the program's own memory (XLA's ``memory_analysis``) beside the
    allocator's peak, then the process-wide figures and where the random weights came from."""
    lines = [
        "memory: 'program' = what the compiled program needs (XLA memory_analysis: arguments + outputs "
        "+ temporaries + code, in device memory; 'host args' = arguments in host memory, not in it); "
        "'allocator peak' = the device allocator's peak_bytes_in_use so far "
        "(everything allocated at once, autotuning scratch included; n/a: the device keeps no statistics)",
        f"{'stage':8} {'program GiB':>12} {'args GiB':>9} {'host args GiB':>14} {'out GiB':>9} "
        f"{'temp GiB':>9} {'code MiB':>9} {'allocator peak GiB':>19} {'weights dev/host GiB':>21}",
    ]
    for name, s in result["stages"].items():
        m = s.get("program_memory")
        cols = (
            [_gib(m["total_bytes"]), _gib(m["argument_bytes"]), _gib(m.get(HOST_ARGUMENT, 0)),
             _gib(m["output_bytes"]), _gib(m["temp_bytes"]), f"{m['generated_code_bytes'] / 2**20:.1f}"]
            if m else ["n/a"] * 6
        )  # fmt: skip
        w = s.get("weights_bytes")
        placed = f"{_gib(w['device'])}/{_gib(w['host'])}" if w else "-"
        lines.append(
            f"{name:8} {cols[0]:>12} {cols[1]:>9} {cols[2]:>14} {cols[3]:>9} {cols[4]:>9} {cols[5]:>9} "
            f"{_gib(s.get('allocator_peak_bytes')):>19} {placed:>21}"
        )
    memory = result.get("memory") or {}
    lines.append(
        f"allocator peak {_gib(memory.get('allocator_peak_bytes'))} GiB, host peak RSS "
        f"{_gib(memory.get('host_peak_rss_bytes'))} GiB; peak memory {result['peak_memory_gib']:.2f} GiB "
        f"({result['memory_source']})"
    )
    drawn = [
        f"{n} {s['random_weights_s']:.1f} s ({s['random_weights']})"
        for n, s in result["stages"].items()
        if "random_weights" in s
    ]
    if drawn:
        lines.append(
            f"random weights drawn (numpy: on the host; device: jax.random in place): {', '.join(drawn)}"
        )
    return lines
