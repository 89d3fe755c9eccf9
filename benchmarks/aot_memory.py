"""Fits where it must: ahead-of-time compiles on 8 simulated devices vs ``wanjax plan``.

Compiles, from abstract inputs only (``jax.ShapeDtypeStruct`` with their ``NamedSharding``; no weights
are created), the three stages' largest programs of a 14B 1280x720x81 run on 8 devices under the
chosen mesh:

* the text encoder's prompt program (UMT5-XXL, 2 x 512 tokens), weights sharded as the pipeline
  loads them; with ``--offload model|blocks`` its stacked layers are host-memory arguments, streamed;

* one denoising step: the real :class:`wanjax.sampling.sampler.Sampler` step program (DiT forward on the CFG
  pair, guidance, UniPC update), bf16 weights sharded by the axes of :func:`wanjax.models.dit.checkpoint_spec`,
  latents ``[1,16,21,90,160]`` and the scheduler state replicated as the sampler places them;
* the VAE decode (``decode_uint8``, float32) of those latents split spatially as
  :meth:`wanjax.WanPipeline.decode` splits them (:func:`wanjax.parallel.layouts.spatial_sharding`), weights
  replicated.

``compiled.memory_analysis()`` of an SPMD program describes one device's program: arguments (the
weight shards and inputs), outputs, temporaries and generated code. Per-device peak =
arguments + outputs + temporaries - aliased. This is set next to :func:`wanjax.planning.plan.plan` for the same
mesh (its per-device weights and activation estimate for the stage), and against ``--device_memory``
(default: a 32 GiB TPU v6e chip) with every component's weights resident (``--offload none``: the
pipeline keeps all three loaded) or only the running stage's (``--offload model|blocks``).

Caveat: the programs are compiled by XLA:CPU (its fusion, scheduling and the CPU attention path:
the ``xla`` backend, blockwise, one head at a time), not by the TPU compiler, which plans its own
buffers; these are the closest numbers obtainable without a TPU. Two CPU-only differences are shown
side by side: the DiT step as XLA:CPU runs it (``scan_layers`` bitcasts the stacked bf16 weights to
uint16 in the program, which materialises a copy of them) and with the weights reaching the layer
loop uncopied, as on TPU (see :func:`dit_step`); the VAE with 3-D convolutions over ring caches (the
accelerator default) and with ``taps`` (the CPU default).

    python benchmarks/aot_memory.py                          # 14B, 720p, 81 frames, dp=2,sp=1,tp=4
    python benchmarks/aot_memory.py --layers 4 --json out/aot.json
    python benchmarks/aot_memory.py --model 1.3B --mesh dp=1,sp=1,tp=1 --height 480 --width 832 \
        --offload model --device_memory 8                    # the 1.3B on one 8 GiB device
"""

from __future__ import annotations

import os

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
os.environ["JAX_PLATFORMS"] = "cpu"

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import resource  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from wanjax.chips import GiB  # noqa: E402
from wanjax.io.checkpoint import abstract_params  # noqa: E402
from wanjax.models import dit, umt5, vae  # noqa: E402
from wanjax.models.config import parse_dtype  # noqa: E402
from wanjax.models.dit import WanTransformer  # noqa: E402
from wanjax.models.offload import DEVICE, OFFLOAD_MODES, memory_kind, offload_sharding, program_memory  # noqa: E402
from wanjax.models.settings import RunSettings  # noqa: E402
from wanjax.models.vae.ops import ACCELERATOR_CONV  # noqa: E402
from wanjax.parallel.layouts import spatial_sharding  # noqa: E402
from wanjax.parallel.mesh import make_mesh, parse_mesh  # noqa: E402
from wanjax.parallel.rules import param_sharding, replicated  # noqa: E402
from wanjax.planning.models import model_configs  # noqa: E402
from wanjax.planning.plan import HEADROOM, plan  # noqa: E402
from wanjax.sampling.sampler import Sampler, StepSpec  # noqa: E402
from wanjax.sampling.scheduler import SchedulerConfig, make_scheduler  # noqa: E402


def shard_bytes(tree: Any) -> int:
    """Bytes one device holds of an abstract tree (largest shard of each leaf)."""
    total = 0
    for a in jax.tree.leaves(tree):
        total += math.prod(a.sharding.shard_shape(a.shape)) * np.dtype(a.dtype).itemsize
    return total


def memory(compiled: jax.stages.Compiled) -> dict[str, int]:
    """The program's device memory (:func:`wanjax.models.offload.program_memory`; arguments in host
    memory apart) under this report's names."""
    m = program_memory(compiled)
    names = {"generated_code": "code", "total": "peak"}
    return {names.get(k, k): v for k, v in m.items()}


def device_shard_bytes(tree: Any) -> int:
    """:func:`shard_bytes` of the leaves in device memory."""
    return shard_bytes([a for a in jax.tree.leaves(tree) if memory_kind(a) == DEVICE])


def text_encoder(mesh, dtype: str, offload: str, text_len: int) -> dict[str, Any]:
    """Compile the text encoder's prompt program (positive and negative prompt, ``text_len`` tokens)
    for abstract weights sharded as the pipeline loads them: under ``--offload model|blocks`` the
    stacked layers in pinned host memory, streamed."""
    cfg = model_configs("14B").text_encoder
    dt = parse_dtype(dtype)
    sharding = offload_sharding(param_sharding(mesh), offload, per_step=False)
    params = abstract_params(umt5.checkpoint_spec(cfg), dt, sharding)
    encoder = umt5.UMT5Encoder(cfg, params, None, offload=offload)
    ids = jax.ShapeDtypeStruct((2, text_len), jnp.int32, sharding=replicated(mesh))
    start = time.perf_counter()
    compiled = encoder._embed.lower(params, ids, ids, out_length=text_len).compile()
    seconds = time.perf_counter() - start
    out = memory(compiled)
    out["compile_s"] = seconds
    out["weights"] = device_shard_bytes(params)
    out["inputs"] = shard_bytes((ids, ids))
    return out


def prepacked_scan(body, carry: jax.Array, layers: Any, start: int = 0, stop: int | None = None) -> jax.Array:
    """``scan_layers`` for stacked weights handed to the program as uint16 bit patterns: the body
    bitcasts them back to bfloat16, so they cross the loop without any copy (see ``dit_step``); all
    layers (the step runs them all)."""
    assert (start, stop) in ((0, None), (0, jax.tree.leaves(layers)[0].shape[0]))

    def step(c: jax.Array, p: Any) -> tuple[jax.Array, None]:
        p = jax.tree.map(
            lambda a: jax.lax.bitcast_convert_type(a, jnp.bfloat16) if a.dtype == jnp.uint16 else a, p
        )
        return body(c, p), None

    return jax.lax.scan(step, carry, layers)[0]


def dit_step(
    model_name: str, mesh, latent_shape, layers: int | None, dtype: str, text_len: int, variant: str
) -> dict[str, Any]:
    """Compile the sampler's CFG step for abstract sharded weights; its memory analysis.

    ``variant="cpu"``: the program as XLA:CPU runs it. There ``scan_layers`` bitcasts the stacked bf16
    weights to uint16 before its loop (XLA:CPU would otherwise upcast them to a float32 copy), and
    that bitcast materialises a uint16 copy of every stacked weight in the temporaries.
    ``variant="tpu"``: the stacked bf16 leaves enter the program already as uint16 (same bytes), so
    they reach the loop uncopied, as the bf16 weights do on TPU where ``scan_layers`` passes them
    through unchanged; everything else is the same program.
    """
    cfg = model_configs(model_name).transformer
    if layers is not None:
        cfg = dataclasses.replace(cfg, num_layers=layers)
    dt = parse_dtype(dtype)
    params = abstract_params(dit.checkpoint_spec(cfg), dt, param_sharding(mesh))
    saved = dit.scan_layers
    if variant == "tpu":
        half = jnp.dtype(jnp.bfloat16)
        params["blocks"] = jax.tree.map(
            lambda a: (
                jax.ShapeDtypeStruct(a.shape, jnp.uint16, sharding=a.sharding) if a.dtype == half else a
            ),
            params["blocks"],
        )
        dit.scan_layers = prepacked_scan
    model = WanTransformer(cfg, params, RunSettings(dt, mesh=mesh))
    scheduler = make_scheduler(SchedulerConfig(), 50)
    rep = replicated(mesh)

    def sds(shape, dtype) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, dtype, sharding=rep)

    state = jax.tree.map(
        lambda a: sds(a.shape, a.dtype),
        jax.eval_shape(scheduler.init_state, jax.ShapeDtypeStruct(latent_shape, jnp.float32)),
    )
    text = sds((latent_shape[0], text_len, cfg.text_dim), dt)
    args = (params, state, sds((), jnp.int32), text, text, sds((), jnp.float32), None, None)  # no K/V cache
    start = time.perf_counter()
    try:
        compiled = Sampler(model)._program(StepSpec(scheduler), args)
    finally:
        dit.scan_layers = saved
    seconds = time.perf_counter() - start
    out = memory(compiled)
    out["compile_s"] = seconds
    out["weights"] = shard_bytes(params)
    out["inputs"] = shard_bytes(args[1:])
    out["layers"] = cfg.num_layers
    return out


def vae_decode(mesh, latent_shape, conv: str, dtype: str) -> dict[str, Any]:
    """Compile ``decode_uint8`` for abstract replicated weights, latents split as the pipeline does."""
    cfg = model_configs("14B").vae
    dt = parse_dtype(dtype)
    rep = replicated(mesh)
    params = abstract_params(vae.checkpoint_spec(cfg, "decoder"), dt, lambda source: rep)
    model = vae.WanVAE(cfg, params, dt, conv=conv)
    x = jax.ShapeDtypeStruct(latent_shape, jnp.float32, sharding=spatial_sharding(mesh, latent_shape))
    start = time.perf_counter()
    compiled = model.lower("decode_uint8", x).compile()
    seconds = time.perf_counter() - start
    out = memory(compiled)
    out["compile_s"] = seconds
    out["weights"] = shard_bytes(params)
    out["inputs"] = shard_bytes(x)
    out["spec"] = str(x.sharding.spec)
    return out


def gib(n: float) -> str:
    return f"{n / GiB:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="14B")
    parser.add_argument("--mesh", default="dp=2,sp=1,tp=4")
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--layers", type=int, help="DiT layers to compile (default: the model's)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--vae_dtype", default="float32")
    parser.add_argument(
        "--vae_conv",
        nargs="+",
        default=[ACCELERATOR_CONV, "taps"],
        help=f"VAE conv formulations (TPU: {ACCELERATOR_CONV})",
    )
    parser.add_argument(
        "--dit_variant", nargs="+", default=["tpu", "cpu"], choices=["tpu", "cpu"], help="see dit_step"
    )
    parser.add_argument("--device_memory", type=float, default=32.0, help="GiB per device")
    parser.add_argument(
        "--offload",
        default="none",
        choices=OFFLOAD_MODES,
        help="the plan's mode and the text encoder's placement",
    )
    parser.add_argument("--skip", nargs="*", default=[], choices=["text", "dit", "vae"])
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    spec = parse_mesh(args.mesh)
    mesh = make_mesh(spec, jax.devices()[: spec.num_devices])
    model = model_configs(args.model)
    latent_t = (args.frames - 1) // 4 + 1
    latent_shape = (1, model.vae.z_dim, latent_t, args.height // 8, args.width // 8)
    memory_bytes = int(args.device_memory * GiB)
    p = plan(
        model,
        spec,
        height=args.height,
        width=args.width,
        frames=args.frames,
        device_memory=memory_bytes,
        dtype=args.dtype,
        vae_dtype=args.vae_dtype,
        offload=args.offload,
    )
    print(
        f"{args.model} {args.width}x{args.height}x{args.frames} (latents {list(latent_shape)}), CFG, mesh "
        f"{spec} on {jax.device_count()} simulated {jax.devices()[0].platform} devices; per device"
    )
    print(p.table())
    results: dict[str, Any] = {"mesh": spec.flag, "latents": list(latent_shape), "plan": {}}
    for name, s in p.stages.items():
        results["plan"][name] = {"weights": s.weights, "activations": s.activations}

    rows: list[tuple[str, dict[str, Any], str]] = []
    if "text" not in args.skip:
        r = text_encoder(mesh, args.dtype, args.offload, 512)
        results["text_encoder"] = r
        placement = "resident" if args.offload == "none" else "layers streamed from host memory"
        rows.append((f"text encoder, 2 x 512 tokens ({placement})", r, "encode"))
    if "dit" not in args.skip:
        for variant in args.dit_variant:
            r = dit_step(args.model, mesh, latent_shape, args.layers, args.dtype, 512, variant)
            results[f"dit_{variant}"] = r
            label = {"cpu": "as XLA:CPU runs it", "tpu": "weights uncopied, as on TPU"}[variant]
            rows.append((f"denoise step, {r['layers']} layers ({label})", r, "denoise"))
    if "vae" not in args.skip:
        for conv in args.vae_conv:
            r = vae_decode(mesh, latent_shape, conv, args.vae_dtype)
            results[f"vae_{conv}"] = r
            rows.append((f"VAE decode ({conv})", r, "decode"))
        print(
            f"VAE latents sharded {r['spec']} (each device decodes a {args.width // spec.num_devices}-pixel strip)"
        )

    print(
        "\n| program | compile | arguments | of which weights | outputs | temporaries | code "
        "| AOT peak | plan weights + activations | AOT / plan |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, r, stage in rows:
        s = p.stages[stage]
        planned = s.weights + s.activations
        print(
            f"| {label} | {r['compile_s']:.1f} s | {gib(r['argument'])} | {gib(r['weights'])} "
            f"| {gib(r['output'])} | {gib(r['temp'])} | {r['code'] / 2**20:.1f} MiB | **{gib(r['peak'])}** "
            f"| {gib(s.weights)} + {gib(s.activations)} = {gib(planned)} | **{r['peak'] / planned:.2f}** |"
        )
        r["plan_stage"] = planned
    print("(GiB per device)")
    for label, r, _ in rows:
        per_device = r["weights"] + r["inputs"]
        same = "=" if abs(r["argument"] - per_device) <= 1 << 20 else "!="
        print(
            f"  {label}: arguments {r['argument']} B {same} one device's shards of weights + inputs {per_device} B"
        )

    # what else is on the device while a stage runs: the other components' weights (none under offload)
    others = {name: s.weights if args.offload == "none" else 0 for name, s in p.stages.items()}
    where = (
        "resident"
        if args.offload == "none"
        else f"on the device only for their stage (--offload {args.offload})"
    )
    print(f"\nfit on a {args.device_memory:.0f} GiB chip (every component's weights {where}):")
    for label, r, stage in rows:
        resident = sum(w for name, w in others.items() if name != stage)
        total = r["peak"] + resident
        verdict = "fits" if total <= memory_bytes else "does NOT fit"
        print(
            f"  {label}: AOT peak {gib(r['peak'])} + other weights {gib(resident)} = {gib(total)} GiB "
            f"({total / memory_bytes:.0%} of {args.device_memory:.0f} GiB; plan's usable limit "
            f"{HEADROOM:.0%}): {verdict}"
        )
        r["with_other_weights"] = total
    # The programs a TPU run compiles (bf16 weights uncopied, its VAE formulation) and a CPU run's.
    for platform, picks in (
        ("TPU-like", ("streamed", "uncopied", f"({ACCELERATOR_CONV})")),
        ("XLA:CPU", ("text", "XLA:CPU", "taps")),
    ):
        chosen = [row for row in rows if any(k in row[0] for k in picks)]
        if chosen:
            worst = max(chosen, key=lambda row: row[1]["with_other_weights"])
            total = worst[1]["with_other_weights"]
            print(
                f"overall per-device peak, {platform} programs: AOT {gib(total)} GiB ({worst[0]}) vs plan "
                f"{gib(p.peak)} GiB: AOT / plan {total / p.peak:.2f}"
            )
            results[f"overall_{platform}"] = {"aot": total, "plan": p.peak}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"\ncompiler process peak RSS: {rss:.2f} GiB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
