"""How much of its compile a program spends on its own run time, by how often a video runs it.

XLA's ``exec_time_optimization_effort`` (a JAX compiler option from -1 to 1, default 0) trades the
compiler's time against the program's. On a TPU, the default spends minutes on the programs a
video runs once: the VAE's decode of a 14B 720p video took 237 s of a 258 s compile on a 2-core
host, its code 216 MiB and growing with the frame, while running it takes about a second beside
the denoising loop's minutes (BENCHMARKS.md, "A TPU's first video"). At -1 the TPU compiler
compiles it in ~20 s to ~30 MiB of code that no longer grows with the frame. So every program a
video (or a prompt) runs once is compiled for compile time on a TPU: the text encoder, the image
encoder, the text K/V cache and the VAE; the denoising step, run twice per step for every step,
keeps the compiler's full effort. Other platforms keep their defaults: XLA:CPU ignores the option
and on GPUs its run-time cost is not measured.
"""

from __future__ import annotations

from typing import Any

from wanjax.target import current_target

__all__ = ["ONCE_PER_VIDEO_EFFORT", "once_per_video"]

ONCE_PER_VIDEO_EFFORT = -1.0


def once_per_video(platform: str | None = None) -> dict[str, Any]:
    """The compiler options of a program a video runs once, built for ``platform`` (default: the
    current target's): the least run-time effort on a TPU, nothing elsewhere."""
    platform = platform or current_target().platform
    return {"exec_time_optimization_effort": ONCE_PER_VIDEO_EFFORT} if platform == "tpu" else {}
