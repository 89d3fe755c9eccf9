"""Wan 2.1 VAE decode, wanjax vs diffusers: steady time and peak memory, on the same random weights.

The real architecture (default ``AutoencoderKLWan`` config, PyTorch's random init) decodes
``[1,16,5,30,52]`` latents (17 frames at 240x416). Each measurement runs in its own subprocess, so
peak memory (``ru_maxrss``: the whole process, runtime and weights included) is not polluted by the
other side: diffusers decode (float32, timed ``--ref-repeats`` times), wanjax decode (compile timed
apart, then ``--repeats`` steady runs), wanjax decode again in a second process whose program comes
from the compiled programs the first kept (what every ``wanjax generate`` after the first does: at
these frame sizes the VAE compiles in a child process and keeps the executable beside the persistent
compilation cache, see ``wanjax.runtime.child_compile``), and wanjax ``decode_uint8`` alone at
``--latent-frames`` (default 5 and 21) for the memory-vs-length check. Outputs are compared at the
end. ``--in-process`` compiles in the measured process instead (what the numbers were before).

    python benchmarks/vae_vs_diffusers.py                       # everything (~15 min on 2 cores)
    python benchmarks/vae_vs_diffusers.py --skip-reference --latent-frames 5   # wanjax only
    python benchmarks/vae_vs_diffusers.py --skip-reference --conv conv3d --upsample repeat
    python benchmarks/vae_vs_diffusers.py --micro               # convolution formulations alone

Targets (issue 3): wanjax peak <= 0.5x diffusers, peak at 21 latent frames <= 1.2x at 5, time <= 1.0x.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


# ----------------------------------------------------------------------------------------------
# Subprocess bodies


def child_diffusers(args: argparse.Namespace) -> dict:
    import torch
    from diffusers import AutoencoderKLWan

    torch.set_num_threads(os.cpu_count() or 1)
    model = AutoencoderKLWan.from_pretrained(args.model, subfolder="vae", torch_dtype=torch.float32).eval()
    z = torch.from_numpy(np.load(args.latents))
    runs = []
    for _ in range(args.ref_repeats):
        with torch.no_grad():
            video, wall, cpu = timed(lambda: model.decode(z).sample)
        runs.append((wall, cpu))
    np.save(args.out, video.numpy())
    return {"runs": runs, "peak_rss_mib": peak_rss_mib(), "threads": torch.get_num_threads()}


def child_wanjax(args: argparse.Namespace) -> dict:
    import jax
    import jax.numpy as jnp

    from wanjax.models.vae import load_vae
    from wanjax.runtime.jax_cache import enable_compilation_cache
    from wanjax.runtime.libtpu import skip_absent_tpu

    skip_absent_tpu()  # as `wanjax` runs on a CPU: libtpu, if installed, not loaded (96 MiB of its code)
    enable_compilation_cache(args.compile_cache or "off")
    vae, load_s, _ = timed(
        lambda: load_vae(
            args.model,
            dtype=args.dtype,
            decode_chunk=args.chunk,
            frames_per_step=args.frames_per_step,
            conv=args.conv,
            upsample=args.upsample,
            compile_in_child=False if args.in_process else None,
        )
    )
    z = jnp.asarray(np.load(args.latents))
    method = args.method
    # The program the public method runs (compiled once, then reused by every call below).
    compiled, compile_s, _ = timed(lambda: vae.compile(method, z))
    mem = compiled.memory_analysis()
    fn = getattr(vae, method)
    runs, out = [], None
    for _ in range(args.repeats + 1):  # the first call includes dispatch warm-up
        out = None  # the last video is released before the next decode, as a caller would
        out, wall, cpu = timed(lambda: jax.block_until_ready(fn(z)))
        runs.append((wall, cpu))
    if args.out:
        np.save(args.out, np.asarray(out.astype(jnp.float32) if out.dtype != jnp.uint8 else out))
    return {
        "load_s": load_s,
        "compile_s": compile_s,
        "temp_mib": mem.temp_size_in_bytes / 2**20,
        "args_mib": mem.argument_size_in_bytes / 2**20,
        "out_mib": mem.output_size_in_bytes / 2**20,
        "runs": runs,
        "peak_rss_mib": peak_rss_mib(),
        "device": str(jax.devices()[0].device_kind),
        "shape": list(out.shape),
    }


def child_micro(args: argparse.Namespace) -> dict:
    """The 3x3x3 causal convolution formulations tried, on the decoder's heaviest shapes (float32).

    Each takes the input with its two cached frames in front and returns the conv output.
    """
    import jax
    import jax.numpy as jnp
    from jax import lax

    hi = lax.Precision.HIGHEST

    def conv2d(x, k):
        return lax.conv_general_dilated(
            x, k, (1, 1), ((1, 1), (1, 1)), dimension_numbers=("NHWC", "HWIO", "NHWC"), precision=hi
        )

    def conv3d(x, k):  # XLA 3-D convolution (Eigen on CPU)
        return lax.conv_general_dilated(
            x,
            k,
            (1, 1, 1),
            ((0, 0), (1, 1), (1, 1)),
            dimension_numbers=("NDHWC", "DHWIO", "NDHWC"),
            precision=hi,
        )

    def taps(x, k):  # three 2-D convs (one per temporal tap, frames folded into the batch), summed
        t = x.shape[1] - 2
        return sum(conv2d(x[:, i : i + t].reshape(-1, *x.shape[2:]), k[i]) for i in range(3))

    def fold(x, k):  # the three taps concatenated on channels: one 2-D conv with 3C inputs
        t, c = x.shape[1] - 2, x.shape[-1]
        xs = jnp.concatenate([x[:, i : i + t] for i in range(3)], -1).reshape(-1, *x.shape[2:4], 3 * c)
        return conv2d(xs, jnp.moveaxis(k, 0, 2).reshape(3, 3, 3 * c, -1))

    def im2col(x, k):  # full im2col (27C columns) and one matmul
        t, h, w, c = x.shape[1] - 2, *x.shape[2:]
        xp = jnp.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1), (0, 0)))
        cols = [xp[:, a : a + t, b : b + h, d : d + w] for a in range(3) for b in range(3) for d in range(3)]
        return jnp.concatenate(cols, -1).reshape(-1, 27 * c) @ k.reshape(27 * c, -1)

    def outputs(x, k):  # output side: one conv with 3*O outputs per input frame, shifted sums
        t, o = x.shape[1] - 2, k.shape[-1]
        q = conv2d(x.reshape(-1, *x.shape[2:]), jnp.moveaxis(k, 0, 3).reshape(3, 3, x.shape[-1], 3 * o))
        q = q.reshape(x.shape[0], t + 2, *x.shape[2:4], 3, o)
        return sum(q[:, i : i + t, :, :, i] for i in range(3))

    formulations = {"conv3d": conv3d, "taps": taps, "fold": fold, "im2col": im2col, "outputs": outputs}
    shapes = [(4, 240, 416, 96, 96), (1, 240, 416, 96, 96), (4, 120, 208, 192, 192), (2, 60, 104, 384, 384)]
    rows = []
    for t, h, w, c, o in shapes:
        x = jax.random.normal(jax.random.key(0), (1, t + 2, h, w, c))
        k = jax.random.normal(jax.random.key(1), (3, 3, 3, c, o)) * 0.05
        flops = 2 * t * h * w * c * o * 27
        ref = None
        for name in args.formulations:
            f = jax.jit(formulations[name])
            y = jax.block_until_ready(f(x, k))
            best = min(timed(lambda f=f, x=x, k=k: jax.block_until_ready(f(x, k)))[1] for _ in range(3))
            y = np.asarray(y).reshape(-1)
            ref = y if ref is None else ref
            err = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
            rows.append([name, [t, h, w, c, o], best * 1e3, flops / best / 1e9, err])
            print(f"  {name:8s} T={t} {h}x{w} {c}->{o}: {best * 1e3:8.1f} ms {flops / best / 1e9:6.1f} GFLOP/s"
                  f"  rel diff vs first {err:.1e}", file=sys.stderr, flush=True)  # fmt: skip
    return {"rows": rows}


# ----------------------------------------------------------------------------------------------
# Driver


def run_child(mode: str, args: argparse.Namespace, **overrides) -> dict:
    cmd = [sys.executable, __file__, "--child", mode]
    opts = {**vars(args), **overrides}
    for key in ("model", "latents", "out", "dtype", "chunk", "frames_per_step", "conv", "upsample",
                "repeats", "ref_repeats", "method", "compile_cache"):  # fmt: skip
        if opts.get(key) is not None:
            cmd += [f"--{key.replace('_', '-')}", str(opts[key])]
    if opts.get("in_process"):
        cmd.append("--in-process")
    if mode == "micro":
        cmd += ["--formulations", *opts["formulations"]]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"{mode} subprocess failed")
    if mode == "micro":
        sys.stderr.write(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def describe(runs: list[list[float]]) -> str:
    walls = [w for w, _ in runs]
    cpu = sum(c for _, c in runs) / sum(walls)
    return f"min {min(walls):.1f}s (runs {', '.join(f'{w:.1f}' for w in walls)}; {cpu:.2f} CPU-s per s)"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--latent", type=int, nargs=5, default=[1, 16, 5, 30, 52], metavar="N")
    parser.add_argument("--latent-frames", type=int, nargs="*", default=[5, 21],
                        help="latent frame counts for the wanjax peak-memory runs (decode_uint8)")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=2, help="wanjax steady runs after the first")
    parser.add_argument("--ref-repeats", type=int, default=1, help="diffusers runs (no compile to warm)")
    parser.add_argument("--skip-reference", action="store_true", help="wanjax only")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--chunk", default="1", help="decode_chunk: latent frames per step, or 'all'")
    parser.add_argument("--frames-per-step", type=int, default=1)
    parser.add_argument("--conv", default="auto", choices=["auto", "taps", "conv3d"])
    parser.add_argument("--upsample", default="subpixel", choices=["subpixel", "repeat"])
    parser.add_argument("--method", default="decode", choices=["decode", "decode_uint8"])
    parser.add_argument("--compile-cache", metavar="DIR",
                        help="wanjax's persistent compilation cache (default: a fresh temporary one, so "
                        "the first wanjax process compiles and the second loads its program)")  # fmt: skip
    parser.add_argument("--in-process", action="store_true",
                        help="compile wanjax's program in the measured process, not in a child")  # fmt: skip
    parser.add_argument("--micro", action="store_true", help="only the convolution microbenchmarks")
    parser.add_argument("--formulations", nargs="+", default=["conv3d", "taps", "fold", "im2col", "outputs"])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--latents", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.chunk != "all":
        args.chunk = int(args.chunk)

    if args.child:
        result = {"diffusers": child_diffusers, "wanjax": child_wanjax, "micro": child_micro}[args.child](
            args
        )
        print(json.dumps(result))
        return

    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    if args.micro:
        print("3x3x3 causal conv formulations (float32, XLA:CPU):")
        run_child("micro", args)
        return

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        import torch
        from diffusers import AutoencoderKLWan

        torch.manual_seed(0)
        AutoencoderKLWan().save_pretrained(tmp / "vae")  # the real architecture, random weights
        latents = np.random.default_rng(0).standard_normal(args.latent).astype(np.float32)
        np.save(tmp / "z.npy", latents)
        cache = args.compile_cache or str(tmp / "jax_cache")
        common = {"model": str(tmp), "latents": str(tmp / "z.npy"), "compile_cache": cache}
        b, c, t, h, w = args.latent
        print(f"decode {args.latent} -> [{b},3,{1 + 4 * (t - 1)},{8 * h},{8 * w}], float32 weights")

        ref = None
        if not args.skip_reference:
            ref = run_child("diffusers", args, **common, out=str(tmp / "ref.npy"))
            print(f"diffusers   decode: {describe(ref['runs'])}, peak RSS {ref['peak_rss_mib']:.0f} MiB")
        ours = run_child("wanjax", args, **common, out=str(tmp / "ours.npy"))
        print(
            f"wanjax      {args.method}: {describe(ours['runs'][1:] or ours['runs'])}, first {ours['runs'][0][0]:.1f}s,"
            f" compile {ours['compile_s']:.1f}s, load {ours['load_s']:.1f}s,"
            f" peak RSS {ours['peak_rss_mib']:.0f} MiB (program: temp {ours['temp_mib']:.0f} MiB, weights "
            f"{ours['args_mib']:.0f} MiB)  [dtype {args.dtype}, chunk {args.chunk}, frames/step "
            f"{args.frames_per_step}, conv {args.conv}, upsample {args.upsample}]"
        )
        # a second process: the program comes from what the first kept, as in every `wanjax generate`
        # after the first (the cache is on by default there)
        warm = run_child("wanjax", args, **common, out=None, repeats=0)
        print(
            f"wanjax      {args.method}, program kept by the first run: {warm['runs'][0][0]:.1f}s,"
            f" compile {warm['compile_s']:.1f}s, peak RSS {warm['peak_rss_mib']:.0f} MiB"
        )
        if ref is not None:
            ref_video, video = np.load(tmp / "ref.npy"), np.load(tmp / "ours.npy")
            if args.method == "decode":
                rel = np.linalg.norm(video - ref_video) / np.linalg.norm(ref_video)
                to_u8 = lambda v: np.round(np.clip(v * 0.5 + 0.5, 0, 1) * 255).astype(np.int16)  # noqa: E731
                print(
                    f"            rel diff {rel:.1e}, uint8 max |diff| {np.abs(to_u8(video) - to_u8(ref_video)).max()}"
                )
            t_ratio = min(w for w, _ in ours["runs"][1:] or ours["runs"]) / min(w for w, _ in ref["runs"])
            m_first, m_warm = (r["peak_rss_mib"] / ref["peak_rss_mib"] for r in (ours, warm))
            print(
                f"ratio wanjax/diffusers: time {t_ratio:.2f} (target <= 1.0), peak memory {m_first:.2f} on"
                f" the first run, {m_warm:.2f} on the next (<= 0.5)"
            )

        peaks = {}
        for frames in args.latent_frames:
            np.save(
                tmp / f"z{frames}.npy",
                np.random.default_rng(1).standard_normal((b, c, frames, h, w), np.float32),
            )
            res = run_child("wanjax", args, **{**common, "latents": str(tmp / f"z{frames}.npy")},
                            out=None, repeats=0, method="decode_uint8")  # fmt: skip
            peaks[frames] = res["peak_rss_mib"]
            print(
                f"wanjax decode_uint8 {frames:2d} latent frames -> {res['shape']}: {res['runs'][0][0]:.1f}s,"
                f" peak RSS {res['peak_rss_mib']:.0f} MiB (program temp {res['temp_mib']:.0f} MiB,"
                f" output {res['out_mib']:.1f} MiB)"
            )
        if len(peaks) >= 2:
            lo, hi = min(peaks), max(peaks)
            print(f"peak memory {hi} vs {lo} latent frames: {peaks[hi] / peaks[lo]:.2f}x (target <= 1.2)")


if __name__ == "__main__":
    main()
