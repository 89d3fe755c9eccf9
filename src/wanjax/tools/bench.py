"""``wanjax bench``: warm-up and steady time per stage, seconds per denoising step, memory, FLOP/s.

A released variant of the model registry (``--arch 1.3B|14B|I2V-14B|...|5B``) runs with random weights,
optionally shortened to ``--layers N`` DiT (and UMT5, CLIP) layers, so no checkpoint is needed; the
Wan 2.2 A14B architectures draw two experts and switch at their boundary (taking turns on the device
under ``--offload model``/``blocks``). The stages are the
pipeline's: ``encode`` (UMT5-XXL dimensions, one prompt of ``--max_sequence_length`` tokens; the
vocabulary is cut to 32k rows, a gather whose cost does not depend on it), ``image`` (image-to-video
architectures only: the CLIP ViT-H/14 encoder on one image, float32, for a transformer taking its
tokens, and the VAE encode of the conditioning video; no FLOP rate: only the CLIP encoder's FLOPs are counted, as ``tflop_clip``), ``denoise`` (DiT + UniPC, CFG batched
when ``--guidance_scale > 1``; image to video: the conditioning latents and the image tokens
joined) and ``decode`` (the Wan 2.1 VAE to uint8 frames). Matmul and
convolution FLOPs come from :mod:`wanjax.tools.flops` (per encoder pass, per denoising step, per decode;
the decode counts the reference architecture's convolutions, the model FLOPs, and reports apart
what wanjax's formulation executes); the hardware peak from a table (TPU, NVIDIA: dense bf16) or,
on CPU, from a 2048^3 matmul in each stage's dtype (float32 accumulation) measured here; each
stage's fraction of peak is against its own dtype's peak. The ``pipeline`` line adds the stages
up: one encode, ``--num_inference_steps`` steps and one decode, at their steady medians.

Memory comes in two figures that answer different questions: each stage's *program* memory, what
XLA's ``memory_analysis()`` of the compiled program says it needs (arguments, outputs, temporaries,
generated code), and the device *allocator's* peak (``memory_stats()["peak_bytes_in_use"]``, from
the process's start), which also counts whatever else was allocated at the time: XLA's convolution
autotuning on a GPU took ~30 GiB of scratch beside the 5.8 GiB the VAE decode program needs. CPUs
report no allocator statistics ("n/a"); the process's peak RSS is given instead.

``--activations_dtype auto|int8|...`` says what the DiT blocks' matmuls multiply, as the pipeline
resolves it (:mod:`wanjax.models.w8a8`; the result's ``activations_dtype``).
``--offload none|model|blocks`` and ``--weights_dtype bf16|int8|fp8`` (the library's choices:
:data:`~wanjax.models.offload.OFFLOAD_MODES`, :data:`~wanjax.io.quantizable.WEIGHTS_DTYPES`) place
and store the DiT's weights as ``WanPipeline`` does: ``model`` sends them to pinned host memory and
back before the denoise stage (the move is timed), ``blocks`` draws the stacked layers straight into
pinned host memory and streams them per layer; ``int8``/``fp8`` store the matmul kernels of the DiT
and the text encoder in 8 bits (drawn with NumPy and quantised leaf by leaf: there is no on-device
quantised draw). The program memory separates the arguments in host memory (``host_argument_bytes``)
from the device ones; each stage also reports its weights' bytes in device and in host memory. On a
CPU both memory kinds are the same RAM: the split is what the program asks for, not a saving.

Random weights are drawn on the device (``jax.random``, each leaf straight into its placement) on
accelerators and, on a CPU, for models of 300M weights or more; smaller models on a CPU are drawn
with NumPy, faster there per core and with nothing to compile (``--random_weights`` chooses).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from wanjax.errors import WanjaxError
from wanjax.io.atomic import write_text
from wanjax.io.checkpoint import ShardingFn, abstract_params, random_params, random_params_on_device
from wanjax.io.quant import leaf_builder
from wanjax.io.quantizable import KEPT_GGUF, UNQUANTIZED, weights_dtype
from wanjax.jobs.flags import add_flags, from_namespace, option
from wanjax.jobs.opening import attention_spec
from wanjax.jobs.status import Status
from wanjax.models import clip_vision, dit, umt5
from wanjax.models.config import parse_dtype
from wanjax.models.offload import device_bytes, host_bytes, parse_offload
from wanjax.models.registry import released
from wanjax.models.settings import RunSettings
from wanjax.models.vae import WanVAE
from wanjax.models.vae import checkpoint_spec as vae_spec
from wanjax.models.w8a8 import activations_name, int8_matmuls
from wanjax.pipeline.residency import Residency
from wanjax.sampling.context_cache import cache_bytes
from wanjax.sampling.guidance import ImageConditioning
from wanjax.sampling.sampler import Sampler
from wanjax.sampling.scheduler import SchedulerConfig, make_scheduler
from wanjax.tools.bench_config import (
    BENCH_VOCAB,
    CPU_DEVICE_DRAW_MIN_PARAMS,
    RANDOM_WEIGHTS,
    STAGE_NAMES,
    BenchConfig,
    StageResult,
)
from wanjax.tools.bench_memory import check_memory
from wanjax.tools.bench_report import MEMORY_LEGEND, format_table
from wanjax.tools.flops import (
    Flops,
    attention_density,
    clip_vision_flops,
    context_kv_flops,
    dit_step_flops,
    sparse_step_flops,
    umt5_flops,
    vae_decode_flops,
)
from wanjax.tools.measure import (
    allocator_peak_bytes,
    device_peak,
    host_peak_rss_bytes,
    peak_memory_bytes,
    program_memory,
    timed,
)


def random_weights_path(choice: str, num_params: int = 0) -> str:
    """``numpy`` or ``device`` for ``--random_weights`` ``choice`` and a model of ``num_params``
    weights. ``auto``: on the device, except on a CPU for models under
    :data:`CPU_DEVICE_DRAW_MIN_PARAMS` weights: per core NumPy draws ~1.4x faster than the jitted
    ``jax.random`` programs, which use every core but compile first (~0.2 s per leaf shape), so on
    a CPU they pay off only for large models (BENCHMARKS.md, "Random weights on the device")."""
    if choice not in RANDOM_WEIGHTS:
        raise WanjaxError(f"unknown --random_weights {choice!r}; choose from {', '.join(RANDOM_WEIGHTS)}")
    if choice == "auto":
        on_cpu = jax.devices()[0].platform == "cpu"
        return "numpy" if on_cpu and num_params < CPU_DEVICE_DRAW_MIN_PARAMS else "device"
    return choice


def bench_params(
    cfg: BenchConfig,
    spec: Any,
    dtype: Any,
    sharding: ShardingFn | None = None,
    weights: str = UNQUANTIZED,
) -> tuple[Any, tuple[str, float]]:
    """Random weights for ``spec`` drawn as ``cfg.random_weights`` says into ``sharding`` (None: the
    first device), stored as ``--weights_dtype weights`` says, and (how, seconds). 8-bit weights are
    always drawn with NumPy (``random_params`` with :func:`~wanjax.io.quant.leaf_builder`, as a
    checkpoint is quantised while read): the on-device draw has no quantised path; ``how`` says so."""
    num_params = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(abstract_params(spec, dtype)))
    how = random_weights_path(cfg.random_weights, num_params)
    start = time.perf_counter()
    if weights_dtype(weights) is not None:
        note = "" if how == "numpy" else f"; {weights}: no on-device quantised draw"
        how = f"numpy, {weights}{note}"
        params = random_params(spec, dtype, sharding=sharding, build=leaf_builder(weights))
    elif how == "device":
        params = random_params_on_device(spec, dtype, sharding=sharding)
    else:
        params = random_params(spec, dtype, sharding=sharding)
    params = jax.block_until_ready(params)
    return params, (how, time.perf_counter() - start)


def weights_bytes(params: Any) -> dict[str, int]:
    """The bytes of ``params`` in device and in host memory kinds (whole arrays)."""
    return {"device": device_bytes(params), "host": host_bytes(params)}


def _repeat(fn: Callable[[], Any], repeats: int) -> StageResult:
    warmup = timed(fn)
    return StageResult(warmup, [timed(fn) for _ in range(repeats)])


def bench_encode(cfg: BenchConfig) -> StageResult:
    ucfg = cfg.text_config()
    params, weights = bench_params(
        cfg, umt5.checkpoint_spec(ucfg), parse_dtype(cfg.dtype), weights=cfg.memory.weights_dtype
    )
    length = cfg.max_sequence_length
    ids = jax.random.randint(jax.random.key(1), (2, length), 0, BENCH_VOCAB)  # prompt + negative
    mask = jnp.ones((2, length), jnp.int32)
    start = time.perf_counter()
    forward = jax.jit(lambda p, i, m: umt5.forward(p, ucfg, i, m)).lower(params, ids, mask).compile()
    compile_s = time.perf_counter() - start
    result = _repeat(lambda: forward(params, ids, mask), cfg.repeats)
    result.warmup += compile_s
    result.flops = umt5_flops(ucfg, 2, length)
    result.program_memory, result.weights = program_memory(forward), weights
    result.weights_bytes = weights_bytes(params)
    return result


def takes_image(arch: str) -> bool:
    """Whether the architecture's pipeline encodes an image (image to video, or TI2V)."""
    return released()[arch].image


def bench_image(cfg: BenchConfig) -> StageResult:
    """CLIP ViT-H/14 (float32, as ``WanPipeline`` loads it) on one image, for a transformer taking its
    tokens, then the VAE encode of the conditioning video (the image, then black frames) at the bench
    size."""
    vcfg = cfg.vae
    vae_params, weights = bench_params(cfg, vae_spec(vcfg, "encoder"), parse_dtype(cfg.vae_dtype))
    vae = WanVAE(vcfg, None, parse_dtype(cfg.vae_dtype), encoder_params=vae_params)
    frames = 1 if cfg.variant.expand_timesteps else cfg.frames  # TI2V encodes the image alone
    video = jnp.zeros((1, 3, frames, cfg.height, cfg.width), jnp.float32).at[:, :, 0].set(1.0)
    clip, params, tflop, pixels = None, None, 0.0, None
    ccfg = cfg.image_encoder_config()  # None: conditioned on the image's latents alone
    if ccfg is not None:
        params, weights = bench_params(cfg, clip_vision.checkpoint_spec(ccfg), jnp.float32)
        clip = clip_vision.CLIPVisionEncoder(ccfg, params)
        tflop = clip_vision_flops(ccfg, 1).total / 1e12
        pixels = jax.random.normal(jax.random.key(5), (1, 3, ccfg.image_size, ccfg.image_size))

    def run() -> Any:
        return jax.block_until_ready((None if clip is None else clip.encode(pixels), vae.encode(video)))

    result = _repeat(run, cfg.repeats)
    result.tflop_known = tflop  # the VAE encode's FLOPs are not counted
    result.program_memory, result.weights = program_memory(vae.compile("encode", video)), weights
    result.weights_bytes = weights_bytes((params, vae_params))
    return result


def bench_int8(cfg: BenchConfig) -> bool:
    """Whether the DiT blocks' matmuls run W8A8 (``--activations_dtype``, as the pipeline resolves it)."""
    return int8_matmuls(cfg.memory.activations_dtype, cfg.memory.weights_dtype)


def bench_denoise(cfg: BenchConfig) -> StageResult:
    tcfg = cfg.transformer_config()
    dtype = parse_dtype(cfg.dtype)
    offload = parse_offload(cfg.memory.offload)
    sharding = dit.transformer_sharding(offload=offload)  # blocks: the stacked layers in pinned host
    params, weights = bench_params(cfg, dit.checkpoint_spec(tcfg), dtype, sharding, cfg.memory.weights_dtype)
    settings = RunSettings(
        dtype, attention=attention_spec(cfg.attention), offload=offload, int8_matmuls=bench_int8(cfg)
    )
    sparse = cfg.attention.sparse()
    model = dit.WanTransformer(tcfg, params, settings)
    boundary = cfg.variant.boundary_ratio
    residency = Residency(offload)  # as WanPipeline moves the weights
    second = None
    if boundary is not None:  # Wan 2.2 A14B: a second expert of the same architecture
        params_2, _ = bench_params(cfg, dit.checkpoint_spec(tcfg), dtype, sharding, cfg.memory.weights_dtype)
        second = dit.WanTransformer(tcfg, params_2, settings)
        residency.park(second)  # it waits on the host until its first step
    experts = (model,) if second is None else (model, second)
    to_device_s = None
    if offload != "none":  # as WanPipeline enters the stage: from pinned host memory back to the device
        model.to_host(block=True)
        start = time.perf_counter()
        model.to_device(block=True)
        to_device_s = time.perf_counter() - start
    shape = cfg.latent_shape()
    if tcfg.animate:  # a segment of --frames, its reference's latent frame first
        shape = (*shape[:2], shape[2] + 1, *shape[3:])
    noise = jax.random.normal(jax.random.key(2), shape, jnp.float32)
    text = jax.random.normal(jax.random.key(3), (1, cfg.max_sequence_length, tcfg.text_dim), dtype)
    scheduler = make_scheduler(SchedulerConfig(), cfg.num_inference_steps)
    sampler = Sampler(model, second)

    def swap(expert: int) -> None:  # under offload, one expert on the device at a time
        residency.switch_expert(experts, expert, block=True)

    guided = cfg.guidance_scale > 1
    cache = cfg.cache_config()
    image, image_len = None, 0
    if cfg.variant.expand_timesteps:  # TI2V with an image: its latents as frame 0, at timestep 0
        first = jax.random.normal(jax.random.key(6), (1, *shape[1:2], 1, *shape[3:]), jnp.float32)
        image = ImageConditioning(first, None, first_frame=True)
    elif tcfg.image_to_video:  # the mask and image latents (and CLIP ViT-H/14's states of the images)
        condition = (1, tcfg.condition_channels, *shape[2:])
        states = None
        if tcfg.image_tokens:
            images = 2 if tcfg.first_last_frame else 1
            tokens = cfg.variant.image_encoder.num_positions
            image_len = images * tokens
            states_shape = (images, tokens, tcfg.image_dim)
            states = jax.random.normal(jax.random.key(7), states_shape)
        motion = None
        if tcfg.animate:  # the segment's pose latents and face frames
            size = tcfg.motion_encoder_size
            pose = jax.random.normal(jax.random.key(8), (1, tcfg.pose_channels, shape[2] - 1, *shape[3:]))
            face = jax.random.uniform(jax.random.key(9), (1, 3, cfg.frames, size, size), minval=-1.0)
            motion = dit.AnimateControl(pose, face)
        image = ImageConditioning(
            jax.random.normal(jax.random.key(6), condition, jnp.float32), states, motion=motion
        )
    elif tcfg.vace:  # the control latents (a control video's encodings and its folded mask)
        control = jax.random.normal(jax.random.key(6), (1, tcfg.vace_in_channels, *shape[2:]), jnp.float32)
        image = dit.VaceControl(control)

    def run() -> Any:
        uncond = text if guided else None
        return sampler(
            scheduler,
            noise,
            text,
            uncond,
            cfg.guidance_scale,
            cache=cache,
            image=image,
            boundary_ratio=boundary,
            on_expert=swap,
            sparse=sparse,
        )

    start = time.perf_counter()
    result = run()
    warmup = time.perf_counter() - start
    steady, per_step, denoising = [], list(result.step_times.steady), []
    for _ in range(cfg.repeats):
        start = time.perf_counter()
        result = run()
        times = result.step_times
        steady.append(time.perf_counter() - start)
        per_step += [times.first, *times.steady]
        denoising.append(times.first + sum(times.steady))
    text_len, rows = cfg.max_sequence_length, shape[0] * (2 if guided else 1)
    flops = dit_step_flops(tcfg, shape, text_len, guided, image_len, context_cached=sampler.context_cache)
    text_kv = None
    if sampler.context_cache:
        saved = context_kv_flops(tcfg, rows, text_len, image_len).total / 1e12
        text_kv = {
            "tflop_saved_per_step": saved,
            "bytes": cache_bytes(tcfg, rows, text_len, image_len, dtype.itemsize),
        }
    # The step program the sampler ran (the one it used last); Sampler has no public accessor.
    programs = sampler.programs()
    memory = program_memory(programs[-1]) if programs else None
    report = result.cache_report
    cache = None if report is None else report.as_json()
    if report is not None:  # what the loop ran: whole steps where a branch computed, the rest skipped
        steps = len(next(iter(report.computed.values())))
        computed = report.evaluations // len(report.computed)
        skip = dit_step_flops(
            tcfg, shape, text_len, guided, image_len, sampler.context_cache, skipped_by=report.cache.policy
        )
        cache["tflop_per_loop"] = (computed * flops.total + (steps - computed) * skip.total) / 1e12
    return StageResult(
        warmup,
        steady,
        flops,
        per_step,
        program_memory=memory,
        weights=weights,
        weights_bytes=weights_bytes((model.params, None if second is None else second.params)),
        to_device_s=to_device_s,
        cache=cache,
        effective_step_s=statistics.median(denoising) / cfg.num_inference_steps,
        expert_steps=None if second is None else list(result.expert_steps),
        text_kv=text_kv,
        sparse=None if sparse is None else _sparse_summary(tcfg, shape, flops, sparse, guided, result),
    )


def _sparse_summary(
    tcfg: Any, shape: Any, flops: Flops, sparse: Any, guided: bool, result: Any
) -> dict[str, Any]:
    """Radial attention's kept fraction of self-attention blocks, the steps it ran and a sparse
    step's TFLOP (:func:`~wanjax.tools.flops.sparse_step_flops`)."""
    return {
        "attention_density": attention_density(tcfg, shape, sparse),
        "sparse_steps": list(result.sparse_steps),
        "dense_block": sparse.dense_block,
        "tflop_sparse_step": sparse_step_flops(tcfg, shape, flops, sparse, guided).total / 1e12,
        "tflop_attention_sparse_step": sparse_step_flops(tcfg, shape, flops, sparse, guided).attention / 1e12,
    }


def bench_decode(cfg: BenchConfig) -> StageResult:
    vcfg = cfg.vae
    dtype = parse_dtype(cfg.vae_dtype)
    params, weights = bench_params(cfg, vae_spec(vcfg, "decoder"), dtype)
    vae = WanVAE(vcfg, params, dtype)
    shape = cfg.latent_shape()
    latents = jax.random.normal(jax.random.key(4), shape, jnp.float32)
    result = _repeat(lambda: vae.decode_uint8(latents), cfg.repeats)
    result.flops = vae_decode_flops(vcfg, shape)
    result.executed_flops = vae_decode_flops(vcfg, shape, vae.numerics, vae.frames_per_step)
    # the program decode_uint8 ran (kept by the VAE's program cache: nothing compiles here)
    result.program_memory, result.weights = program_memory(vae.compile("decode_uint8", latents)), weights
    return result


def _stage(name: str, cfg: BenchConfig) -> dict[str, Any]:
    """One stage run and summarised, with the allocator's peak so far read right after it."""
    result = STAGES[name](cfg)
    if result.allocator_peak_bytes is None:
        result.allocator_peak_bytes = allocator_peak_bytes()
    return result.summary()


# What each stage does, as its status line says it (on a terminal)
STAGE_WORK = {
    "encode": "the text encoder: random weights drawn, compiled, timed",
    "image": "the image encoder and the VAE encoder: random weights drawn, compiled, timed",
    "denoise": "the transformer: random weights drawn, compiled, timed",
    "decode": "the VAE decoder: random weights drawn, compiled, timed",
}

STAGES: dict[str, Callable[[BenchConfig], StageResult]] = dict(
    zip(STAGE_NAMES, (bench_encode, bench_image, bench_denoise, bench_decode), strict=True)
)


def run_bench(cfg: BenchConfig, on_stage: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the stages of ``cfg``; a JSON-ready dict of the measurements. ``on_stage(name)`` is called
    as each stage starts."""
    if cfg.arch not in released():
        raise WanjaxError(f"unknown --arch {cfg.arch!r}; choose one of {', '.join(released())}")
    if cfg.num_inference_steps < 1 or cfg.repeats < 1:
        raise WanjaxError("--num_inference_steps and --repeats must be at least 1")
    with_image = takes_image(cfg.arch)
    wanted = [name for name in cfg.stages if name != "image" or with_image]  # image: I2V archs only
    unknown = sorted(set(wanted) - set(STAGES))
    if unknown:
        raise WanjaxError(f"unknown stage(s) {', '.join(unknown)}; choose from {', '.join(STAGES)}")
    cfg.latent_shape()
    for dtype in (cfg.dtype, cfg.vae_dtype):
        parse_dtype(dtype)
    random_weights_path(cfg.random_weights)
    cfg.memory.check()
    if cfg.memory.weights_dtype == KEPT_GGUF:
        raise WanjaxError(
            "--weights_dtype gguf keeps a GGUF file's blocks; bench draws random weights: use int8 or fp8"
        )
    cfg.cache_config()
    check_memory(cfg, wanted)  # every flag checked first: plan reads them
    dtype, vae_dtype = (jnp.dtype(parse_dtype(d)).name for d in (cfg.dtype, cfg.vae_dtype))
    image_dtypes = ("float32",) if "image" in wanted else ()
    peaks = {d: device_peak(d) for d in dict.fromkeys((dtype, vae_dtype, *image_dtypes))}
    stages = {}
    for name in wanted:
        if on_stage is not None:
            on_stage(name)
        stages[name] = _stage(name, cfg)
    pipeline = pipeline_summary(cfg, stages)
    stage_dtypes = {"encode": dtype, "image": "float32", "denoise": dtype, "decode": vae_dtype}
    for name, summary in stages.items():
        if "achieved_tflops" in summary:  # against the peak of the stage's dtype
            summary["peak_dtype"] = stage_dtypes[name]
            summary["fraction_of_peak"] = summary["achieved_tflops"] * 1e12 / peaks[summary["peak_dtype"]][0]
    if (
        "achieved_tflops" in pipeline
    ):  # against what the device could do in each stage's time at its dtype peak
        possible = sum(share * peaks[stage_dtypes[n]][0] for n, share in pipeline["seconds_share"].items())
        pipeline["peak_dtype"] = dtype if dtype == vae_dtype else f"{dtype}+{vae_dtype}"
        pipeline["fraction_of_peak"] = pipeline["achieved_tflops"] * 1e12 / possible
    memory, memory_source = peak_memory_bytes()
    return {
        "config": dataclasses.asdict(cfg),
        # what the DiT blocks' attention and FFN matmuls multiplied (int8: W8A8)
        "activations_dtype": activations_name(bench_int8(cfg), dtype),
        "device": jax.devices()[0].device_kind,
        "devices": jax.device_count(),
        "peak_tflops": peaks[dtype][0] / 1e12,
        "peak_source": peaks[dtype][1],
        "peaks": {d: {"tflops": p / 1e12, "source": src} for d, (p, src) in peaks.items()},
        "peak_memory_gib": memory / 2**30,
        "memory_source": memory_source,
        "memory": {
            "allocator_peak_bytes": allocator_peak_bytes(),
            "host_peak_rss_bytes": host_peak_rss_bytes(),
            "legend": MEMORY_LEGEND,
        },
        "stages": stages,
        "pipeline": pipeline,
    }


def pipeline_summary(cfg: BenchConfig, stages: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One generation from the stages run: an encode (and the image stage, for an image-to-video
    architecture), ``num_inference_steps`` steps and a decode at their steady medians (steps at the
    per-step median; under a step cache the loop's effective time and the FLOPs it ran); empty unless
    all of the architecture's stages ran."""
    needed = [name for name in STAGES if name != "image" or takes_image(cfg.arch)]
    if not all(name in stages for name in needed):
        return {}
    steps = cfg.num_inference_steps
    denoise = stages["denoise"]
    cached = "cache" in denoise  # then a whole loop's time per step: its steps differ
    per_step = denoise["s_per_step_effective"] if cached else denoise["s_per_step_median"]
    seconds_of = {name: stages[name]["steady_median_s"] for name in needed}
    seconds_of["denoise"] = steps * per_step
    tflop_of = {name: stages[name].get("tflop", stages[name].get("tflop_clip", 0.0)) for name in needed}
    # a step cache's loop: its computed steps whole, its skipped ones what they still run
    tflop_of["denoise"] = denoise["cache"]["tflop_per_loop"] if cached else steps * denoise["tflop"]
    seconds, tflop = sum(seconds_of.values()), sum(tflop_of.values())
    rate = {"achieved_tflops": tflop / seconds if seconds > 0 else float("nan")}
    return {
        "steady_s": seconds,
        "tflop": tflop,
        **rate,
        "seconds_share": {name: t / seconds for name, t in seconds_of.items()},
    }


@dataclasses.dataclass(frozen=True)
class BenchRequest:
    """``wanjax bench``: what to run, and the JSON file to write the numbers to."""

    config: BenchConfig = dataclasses.field(default_factory=BenchConfig)
    json: str | None = option(help="also write the numbers to this JSON file")

    def check(self) -> None:
        """WanjaxError naming a flag whose value cannot be meant."""
        layers = self.config.layers
        if layers is not None and layers < 1:
            raise WanjaxError(f"--layers must be at least 1 (leave it out for all layers), got {layers}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``wanjax bench`` flags (:class:`BenchRequest`'s fields)."""
    add_flags(parser, BenchRequest)


def run_request(request: BenchRequest) -> dict[str, Any]:
    """``wanjax bench``: run (a status line per stage on a terminal), print the table, write the JSON file."""
    cfg = request.config
    layers = "all layers" if cfg.layers is None else f"{cfg.layers} layer{'s' if cfg.layers > 1 else ''}"
    steps = cfg.num_inference_steps
    with Status.for_terminal("bench", steps, quiet=False, work=STAGE_WORK, counts=False) as status:
        status.header(
            f"--arch {cfg.arch} ({layers}), {cfg.frames} frames {cfg.width}x{cfg.height}, {cfg.repeats} timed runs"
        )
        result = run_bench(cfg, on_stage=lambda name: status(name, 0))
    print(format_table(result))
    if request.json:
        write_text(request.json, json.dumps(result, indent=2) + "\n")
    return result


def run(args: argparse.Namespace) -> dict[str, Any]:
    """:func:`run_request` with flags parsed by a parser :func:`add_arguments` filled."""
    return run_request(from_namespace(BenchRequest, args))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="wanjax bench", description=__doc__.splitlines()[0])
    add_arguments(parser)
    run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
