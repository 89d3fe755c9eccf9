"""The VAE's programs: its entry points (:mod:`~wanjax.models.vae.functional`) jitted with their
compiler options, lowered for weights and input of given signatures (:func:`lower_program`, also the
builder a child process runs, see :mod:`wanjax.runtime.child_compile`), and compiled once per
signature into one :class:`~wanjax.runtime.programs.ProgramCache` shared by every
:class:`~wanjax.models.vae.model.WanVAE` with the same settings."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax

from wanjax.kernels.common import Platform
from wanjax.models.layers import Params
from wanjax.models.vae.functional import (
    decode,
    decode_cache,
    decode_uint8,
    decode_uint8_first,
    decode_uint8_next,
    decode_uint8_part,
    encode,
)
from wanjax.runtime.compile_effort import once_per_video
from wanjax.runtime.programs import ProgramCache, Signature, abstract_tree, signature

__all__ = [
    "INPUT",
    "PARTS",
    "compiled",
    "compiled_part",
    "compiler_options",
    "jitted",
    "lower",
    "lower_program",
]

# The name of each entry point's input argument
INPUT = {"decode": "vae_latents", "decode_uint8": "normalized_latents", "encode": "video"}
# The decode in parts (their statics: cfg, nm and, but for the scan's parts, frames): the first
# latent frame, then each part after it; or, where the scan decodes the first frame too, its zero
# cache, then every part with one program
PARTS = {
    "decode_uint8_first": decode_uint8_first,
    "decode_uint8_next": decode_uint8_next,
    "decode_cache": decode_cache,
    "decode_uint8_part": decode_uint8_part,
}
PART_STATICS = {"decode_cache": ("cfg", "nm"), "decode_uint8_part": ("cfg", "nm")}

Statics = tuple[tuple[str, Any], ...]  # an entry point's static arguments, sorted by name
InputSignature = tuple[tuple[int, ...], Any, Any]  # the input's (shape, dtype, sharding or None)

_PROGRAMS = ProgramCache(maxsize=64)


def clear_programs() -> None:
    """Drop the VAE programs shared by every :class:`WanVAE` of this process (as ``jax.clear_caches``
    drops JAX's own)."""
    _PROGRAMS.clear()


def compiler_options(platform: Platform | None = None) -> dict[str, Any] | None:
    """Per-program XLA options on ``platform`` (default: this process's).

    * CPU: the memory-minimising scheduler (XLA's default orders independent full-frame
      convolutions for concurrency and keeps several frames' worth of outputs alive at once; this one
      lowers the chunk's peak by hundreds of MiB at 480p), and region analysis in copy insertion.
    * CUDA: channel-last convolutions (``xla_gpu_force_conv_nhwc``). XLA's GPU layout assignment
      (``HeuristicLayoutAssignment``) gives a convolution NHWC only when its input is 16-bit and it
      is 2-D; every 3-D convolution (the causal convs) and every float32 one gets NCHW / NCDHW. The
      VAE's activations are channel-last, so each such convolution then had its operands transposed
      for it, and cuDNN, whose tensor-core kernels are NHWC, transposed them back
      (``nchwToNhwcKernel``/``nhwcToNchwKernel``: a quarter of a bf16 decode on an H100). With the
      option every convolution takes the arrays in the layout they already have.
    * TPU: compiled for compile time, as every program a video runs once
      (:mod:`wanjax.runtime.compile_effort`): the decode's compile 237 s -> ~20 s at 14B 720p.
    """
    platform = platform or Platform.detect()
    if platform.name == "tpu":
        return once_per_video(platform.name)
    if platform.name == "cpu":
        return {
            "xla_cpu_scheduler_type": "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED",
            "xla_cpu_copy_insertion_use_region_analysis": True,  # fewer loop-carry copies of the cache
        }
    if platform.cuda is not None:
        return {"xla_gpu_force_conv_nhwc": True}
    return None


def jitted(name: str) -> Callable[..., jax.Array]:
    """The jitted entry point with the compiler options of the target it is built for; compiled
    programs are shared by every WanVAE with the same settings."""
    options = compiler_options()
    return _jitted(name, tuple(sorted((options or {}).items())))


@functools.cache
def _jitted(name: str, options: tuple[tuple[str, Any], ...]) -> Callable[..., jax.Array]:
    if name in PARTS:
        return jax.jit(
            PARTS[name],
            static_argnames=PART_STATICS.get(name, ("cfg", "nm", "frames")),
            compiler_options=dict(options) or None,
        )
    fn = {"decode": decode, "decode_uint8": decode_uint8, "encode": encode}[name]
    static = ("cfg", "nm", "chunk", "frames") + (("tiling",) if name != "encode" else ())
    return jax.jit(fn, static_argnames=static, compiler_options=dict(options) or None)


def lower(name: str, statics: Statics, params: Params, x: Any) -> jax.stages.Lowered:
    """The entry point ``name`` lowered for ``params`` and input ``x`` (arrays or their abstract
    stand-ins) with these static arguments."""
    return jitted(name).lower(params, **{INPUT[name]: x}, **dict(statics))


def lower_program(
    name: str, statics: Statics, params_sig: Signature, x_sig: InputSignature
) -> tuple[jax.stages.Lowered, dict[str, Any]]:
    """The program ``name`` for weights and input of these signatures (see
    :func:`~wanjax.runtime.programs.signature`), lowered, and the compiler options it compiles with."""
    x = jax.ShapeDtypeStruct(x_sig[0], x_sig[1], sharding=x_sig[2])
    return lower(name, statics, abstract_tree(params_sig), x), compiler_options() or {}


def compiled(
    name: str, statics: Statics, params_sig: Signature, x_sig: InputSignature, in_child: bool
) -> jax.stages.Compiled:
    """Compile one program ahead of its first run (shared by every WanVAE with the same settings),
    in a child process if ``in_child`` (falling back to this one), then hand the freed heap back to
    the OS before the program allocates its own."""
    args = (name, statics, params_sig, x_sig)
    child = (f"{__name__}:lower_program", args) if in_child else None
    return _PROGRAMS.get((*args, in_child), lambda: lower_program(*args)[0], child)


def compiled_part(name: str, statics: Statics, *args: Any) -> jax.stages.Compiled:
    """A program of the decode in parts (:data:`PARTS`) for these arguments (arrays), compiled in
    this process once per signature (shared as :func:`compiled`'s)."""
    key = (name, statics, signature(args))
    return _PROGRAMS.get(key, lambda: jitted(name).lower(*args, **dict(statics)))
