"""``wanjax bench``: warm-up and steady time per stage, seconds per denoising step, memory, FLOP/s.

A built-in architecture (``--arch 1.3B|14B|I2V-14B|A14B|I2V-A14B``) runs with random weights,
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
import resource
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
from wanjax.io.quantizable import UNQUANTIZED, WEIGHTS_DTYPES, weights_dtype
from wanjax.models import clip_vision, dit, umt5
from wanjax.models.clip_vision import CLIP_VIT_H_14
from wanjax.models.config import EXPAND_TIMESTEPS, PRESETS, TWO_EXPERTS, parse_dtype
from wanjax.models.offload import OFFLOAD_MODES, device_bytes, host_bytes, parse_offload, take_turns
from wanjax.models.offload import program_memory as split_program_memory
from wanjax.models.settings import RunSettings
from wanjax.models.vae import WanVAE
from wanjax.models.vae import checkpoint_spec as vae_spec
from wanjax.models.vae.config import VAEConfig
from wanjax.pipeline.sampler import ImageConditioning, Sampler
from wanjax.pipeline.scheduler import SchedulerConfig, make_scheduler
from wanjax.pipeline.step_cache import POLICIES, CacheConfig, presets
from wanjax.tools.flops import (
    Flops,
    achieved,
    clip_vision_flops,
    dit_step_flops,
    umt5_flops,
    vae_decode_flops,
)
from wanjax.tools.plan import preset_vae

# Dense bf16 peak, TFLOP/s per chip, matched against ``device.device_kind`` (first match wins).
PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("TPU v6", 918.0),  # v6e ("TPU v6 lite")
    ("TPU v5 lite", 197.0),  # v5e
    ("TPU v5e", 197.0),
    ("TPU v5", 459.0),  # v5p
    ("TPU v4", 275.0),
    ("H200", 989.0),
    ("H100", 989.0),
    ("A100", 312.0),
)
BENCH_VOCAB = 32_128
ARCHES = tuple(name for name in PRESETS if name != "tiny")
RANDOM_WEIGHTS = ("auto", "numpy", "device")
CPU_DEVICE_DRAW_MIN_PARAMS = 300_000_000  # --random_weights auto on a CPU: jax.random from this size


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """What to run; the defaults are the issue's quick CPU run."""

    arch: str = "1.3B"
    layers: int | None = None
    height: int = 240
    width: int = 416
    frames: int = 17
    num_inference_steps: int = 2
    guidance_scale: float = 5.0
    dtype: str = "bfloat16"
    vae_dtype: str = "float32"
    max_sequence_length: int = 512
    repeats: int = 2
    stages: tuple[str, ...] = ("encode", "image", "denoise", "decode")  # image: I2V archs only
    random_weights: str = "auto"  # numpy (host draws), device (jax.random), auto: see random_weights_path
    offload: str = "none"  # OFFLOAD_MODES: where the DiT's weights wait (see WanPipeline)
    weights_dtype: str = UNQUANTIZED  # WEIGHTS_DTYPES: int8/fp8 store the matmul kernels in 8 bits
    cache: str = "off"  # step_cache.POLICIES, and its settings (None: the policy's defaults)
    cache_threshold: float | None = None
    cache_max_skip: int | None = None
    cache_retention: float | None = None
    mag_ratios: str | None = None

    def cache_config(self) -> CacheConfig:
        """The step cache the denoise stage runs with."""
        return CacheConfig(
            self.cache,
            threshold=self.cache_threshold,
            max_skip_steps=self.cache_max_skip,
            retention_ratio=self.cache_retention,
            mag_ratios=self.mag_ratios,
        )

    @property
    def vae(self) -> VAEConfig:
        """The architecture's VAE (the Wan 2.2 VAE's shapes for TI2V-5B)."""
        return preset_vae(self.arch)

    def latent_shape(self) -> tuple[int, int, int, int, int]:
        f = self.vae.spatial_factor
        if self.height % (2 * f) or self.width % (2 * f) or (self.frames - 1) % 4:
            raise WanjaxError(
                f"{self.height}x{self.width}x{self.frames}: height and width must be multiples of "
                f"{2 * f} and frames 4n+1"
            )
        return (1, self.vae.z_dim, (self.frames - 1) // 4 + 1, self.height // f, self.width // f)


@dataclasses.dataclass
class StageResult:
    """Timings of one stage: warm-up (compile + first run) and steady runs, in seconds."""

    warmup: float
    steady: list[float]
    flops: Flops | None = None
    per_step: list[float] | None = None  # denoise: the steady steps
    executed_flops: Flops | None = None  # decode: what wanjax's formulation computes, if not ``flops``
    program_memory: dict[str, int] | None = None  # memory_analysis() of the stage's compiled program
    allocator_peak_bytes: int | None = None  # the device allocator's peak so far, after the stage
    weights: tuple[str, float] | None = None  # how the random weights were drawn, and the seconds it took
    weights_bytes: dict[str, int] | None = None  # the weights' bytes in device and in host memory
    to_device_s: float | None = None  # offload model/blocks: the weights' move back to the device
    cache: dict[str, Any] | None = None  # denoise with a step cache: what it skipped (CacheReport JSON)
    effective_step_s: float | None = None  # denoise: a whole loop's seconds / its steps (median loop)
    tflop_known: float | None = None  # image: the CLIP encoder's TFLOP (the VAE encode's not counted)
    expert_steps: list[int] | None = None  # denoise, two experts: which one ran each step

    def summary(self) -> dict[str, Any]:
        med = statistics.median(self.steady) if self.steady else float("nan")
        out: dict[str, Any] = {
            "warmup_s": self.warmup,
            "steady_median_s": med,
            "steady_min_s": min(self.steady, default=float("nan")),
            "steady_max_s": max(self.steady, default=float("nan")),
            "program_memory": self.program_memory,
            "allocator_peak_bytes": self.allocator_peak_bytes,
        }
        if self.weights is not None:
            out["random_weights"], out["random_weights_s"] = self.weights
        if self.weights_bytes is not None:
            out["weights_bytes"] = self.weights_bytes
        if self.to_device_s is not None:
            out["weights_to_device_s"] = self.to_device_s
        if self.effective_step_s is not None:
            out["s_per_step_effective"] = self.effective_step_s
        if self.cache is not None:
            out["cache"] = self.cache
        if self.tflop_known is not None:
            out["tflop_clip"] = self.tflop_known
        if self.expert_steps is not None:
            out["expert_steps"] = self.expert_steps
        if self.per_step is not None:
            out["s_per_step_median"] = statistics.median(self.per_step) if self.per_step else float("nan")
            out["s_per_step_spread"] = [min(self.per_step, default=0.0), max(self.per_step, default=0.0)]
        if self.flops is not None:
            seconds = out.get("s_per_step_median", med)
            out["tflop"] = self.flops.total / 1e12
            out["tflop_attention"] = self.flops.attention / 1e12
            if self.cache is None:  # a cached step computes less than a step's FLOPs
                out["achieved_tflops"] = achieved(self.flops, seconds) / 1e12
        if self.executed_flops is not None:
            out["tflop_executed"] = self.executed_flops.total / 1e12
            out["achieved_tflops_executed"] = achieved(self.executed_flops, med) / 1e12
        return out


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def measure_cpu_matmul_peak(n: int = 2048, repeats: int = 5, dtype: Any = jnp.bfloat16) -> float:
    """Best FLOP/s of an ``n``-cube ``dtype`` matmul with float32 accumulation on the default device."""
    a = jnp.ones((n, n), dtype)
    f = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32))
    jax.block_until_ready(f(a, a))
    return 2 * n**3 / min(timed(lambda: f(a, a)) for _ in range(repeats))


def device_peak(dtype: str = "bfloat16") -> tuple[float, str]:
    """Peak FLOP/s of one default device for ``dtype`` work and where the figure comes from.

    Accelerators: the datasheet's dense bf16 peak (whatever ``dtype``). CPU: a matmul in ``dtype``
    measured here, since CPUs differ by far more than a table could say (an AMX Xeon runs bf16 ~3x
    faster than float32, an AVX2-only EPYC ~2x slower)."""
    device = jax.devices()[0]
    kind = device.device_kind
    for name, tflops in PEAK_TFLOPS:
        if name in kind:
            return tflops * 1e12, f"{kind}: datasheet dense bf16"
    if device.platform == "cpu":
        name = jnp.dtype(parse_dtype(dtype)).name
        peak = measure_cpu_matmul_peak(dtype=parse_dtype(dtype))
        return peak, f"cpu: measured {name} matmul (2048^3, f32 accumulation)"
    return float("nan"), f"{kind}: unknown peak"


def allocator_peak_bytes() -> int | None:
    """The default device allocator's peak (``memory_stats()["peak_bytes_in_use"]``) since the process
    started: every buffer alive at once, the compiler's and autotuner's scratch included. None where
    the device keeps no statistics (CPU)."""
    stats = jax.devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    return None if peak is None else int(peak)


def host_peak_rss_bytes() -> int:
    """The process's peak resident memory (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_memory_bytes() -> tuple[int, str]:
    """Peak memory: the device's allocator where it reports one, else the process's RSS."""
    peak = allocator_peak_bytes()
    if peak is not None:
        return peak, "device peak"
    return host_peak_rss_bytes(), "host peak RSS"


MEMORY_FIELDS = {  # program_memory key -> wanjax.models.offload.program_memory's
    "argument_bytes": "argument",
    "output_bytes": "output",
    "temp_bytes": "temp",
    "generated_code_bytes": "generated_code",
    "alias_bytes": "alias",
}
HOST_ARGUMENT = "host_argument_bytes"  # program_memory key: arguments in a host memory kind


def program_memory(compiled: jax.stages.Compiled) -> dict[str, int] | None:
    """What XLA's ``memory_analysis()`` says a compiled program needs, in bytes
    (:func:`wanjax.models.offload.program_memory`): its arguments in device memory
    (``argument_bytes``) and in a host memory kind (``host_argument_bytes``: offload ``blocks``'
    streamed layers), outputs, temporaries and generated code, the outputs that alias (donated)
    arguments, and the device ``total_bytes`` = arguments + outputs - aliased + temporaries + code.
    None where the backend gives no analysis."""
    try:
        split = split_program_memory(compiled)
    except (NotImplementedError, RuntimeError):
        return None
    out = {key: split[field] for key, field in MEMORY_FIELDS.items()}
    out[HOST_ARGUMENT] = split["host_argument"]
    out["total_bytes"] = split["total"] + out["generated_code_bytes"]
    return out


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
    layers = min(cfg.layers or umt5.UMT5_XXL.num_layers, umt5.UMT5_XXL.num_layers)
    ucfg = dataclasses.replace(umt5.UMT5_XXL, num_layers=layers, vocab_size=BENCH_VOCAB)
    params, weights = bench_params(
        cfg, umt5.checkpoint_spec(ucfg), parse_dtype(cfg.dtype), weights=cfg.weights_dtype
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
    return PRESETS[arch].image_to_video or arch in EXPAND_TIMESTEPS


def bench_image(cfg: BenchConfig) -> StageResult:
    """CLIP ViT-H/14 (float32, as ``WanPipeline`` loads it) on one image, for a transformer taking its
    tokens, then the VAE encode of the conditioning video (the image, then black frames) at the bench
    size."""
    vcfg = cfg.vae
    vae_params, weights = bench_params(cfg, vae_spec(vcfg, "encoder"), parse_dtype(cfg.vae_dtype))
    vae = WanVAE(vcfg, None, parse_dtype(cfg.vae_dtype), encoder_params=vae_params)
    frames = 1 if cfg.arch in EXPAND_TIMESTEPS else cfg.frames  # TI2V encodes the image alone
    video = jnp.zeros((1, 3, frames, cfg.height, cfg.width), jnp.float32).at[:, :, 0].set(1.0)
    clip, params, tflop = None, None, 0.0
    if PRESETS[cfg.arch].image_tokens:
        layers = min(cfg.layers or CLIP_VIT_H_14.num_hidden_layers, CLIP_VIT_H_14.num_hidden_layers)
        ccfg = dataclasses.replace(CLIP_VIT_H_14, num_hidden_layers=layers)
        params, weights = bench_params(cfg, clip_vision.checkpoint_spec(ccfg), jnp.float32)
        clip = clip_vision.CLIPVisionEncoder(ccfg, params)
        tflop = clip_vision_flops(ccfg, 1).total / 1e12
    pixels = jax.random.normal(jax.random.key(5), (1, 3, CLIP_VIT_H_14.image_size, CLIP_VIT_H_14.image_size))

    def run() -> Any:
        return jax.block_until_ready((None if clip is None else clip.encode(pixels), vae.encode(video)))

    result = _repeat(run, cfg.repeats)
    result.tflop_known = tflop  # the VAE encode's FLOPs are not counted
    result.program_memory, result.weights = program_memory(vae.compile("encode", video)), weights
    result.weights_bytes = weights_bytes((params, vae_params))
    return result


def bench_denoise(cfg: BenchConfig) -> StageResult:
    base = PRESETS[cfg.arch]
    tcfg = dataclasses.replace(base, num_layers=cfg.layers or base.num_layers)
    dtype = parse_dtype(cfg.dtype)
    offload = parse_offload(cfg.offload)
    sharding = dit.transformer_sharding(offload=offload)  # blocks: the stacked layers in pinned host
    params, weights = bench_params(cfg, dit.checkpoint_spec(tcfg), dtype, sharding, cfg.weights_dtype)
    model = dit.WanTransformer(tcfg, params, RunSettings(dtype, offload=offload))
    boundary = TWO_EXPERTS.get(cfg.arch)
    second = None
    if boundary is not None:  # Wan 2.2 A14B: a second expert of the same architecture
        params_2, _ = bench_params(cfg, dit.checkpoint_spec(tcfg), dtype, sharding, cfg.weights_dtype)
        second = dit.WanTransformer(tcfg, params_2, RunSettings(dtype, offload=offload))
    to_device_s = None
    if offload != "none":  # as WanPipeline enters the stage: from pinned host memory back to the device
        model.to_host(block=True)
        start = time.perf_counter()
        model.to_device(block=True)
        to_device_s = time.perf_counter() - start
    shape = cfg.latent_shape()
    noise = jax.random.normal(jax.random.key(2), shape, jnp.float32)
    text = jax.random.normal(jax.random.key(3), (1, cfg.max_sequence_length, tcfg.text_dim), dtype)
    scheduler = make_scheduler(SchedulerConfig(), cfg.num_inference_steps)
    sampler = Sampler(model, second)

    def swap(expert: int) -> None:  # as WanPipeline: under offload, one expert on the device at a time
        if second is not None and offload != "none":
            take_turns((model, second), expert, block=True)

    guided = cfg.guidance_scale > 1
    cache = cfg.cache_config()
    image, image_len = None, 0
    if cfg.arch in EXPAND_TIMESTEPS:  # TI2V with an image: its latents as frame 0, at timestep 0
        first = jax.random.normal(jax.random.key(6), (1, *shape[1:2], 1, *shape[3:]), jnp.float32)
        image = ImageConditioning(first, None, first_frame=True)
    elif tcfg.image_to_video:  # the mask and image latents (and CLIP ViT-H/14's states of the images)
        condition = (1, tcfg.condition_channels, *shape[2:])
        states = None
        if tcfg.image_tokens:
            images = 2 if tcfg.first_last_frame else 1
            image_len = images * CLIP_VIT_H_14.num_positions
            states_shape = (images, CLIP_VIT_H_14.num_positions, tcfg.image_dim)
            states = jax.random.normal(jax.random.key(7), states_shape)
        image = ImageConditioning(jax.random.normal(jax.random.key(6), condition, jnp.float32), states)

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
        )

    start = time.perf_counter()
    _, times = run()
    warmup = time.perf_counter() - start
    steady, per_step, denoising = [], list(times.steady), []
    for _ in range(cfg.repeats):
        start = time.perf_counter()
        _, times = run()
        steady.append(time.perf_counter() - start)
        per_step += [times.first, *times.steady]
        denoising.append(times.first + sum(times.steady))
    flops = dit_step_flops(tcfg, shape, cfg.max_sequence_length, guidance=guided, image_len=image_len)
    # The step program the sampler ran (the one it used last); Sampler has no public accessor.
    programs = sampler.programs()
    memory = program_memory(programs[-1]) if programs else None
    report = sampler.cache_report
    return StageResult(
        warmup,
        steady,
        flops,
        per_step,
        program_memory=memory,
        weights=weights,
        weights_bytes=weights_bytes((model.params, None if second is None else second.params)),
        to_device_s=to_device_s,
        cache=None if report is None else report.as_json(),
        effective_step_s=statistics.median(denoising) / cfg.num_inference_steps,
        expert_steps=None if second is None else sampler.expert_steps,
    )


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


STAGES: dict[str, Callable[[BenchConfig], StageResult]] = {
    "encode": bench_encode,
    "image": bench_image,
    "denoise": bench_denoise,
    "decode": bench_decode,
}


def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    """Run the stages of ``cfg``; a JSON-ready dict of the measurements."""
    if cfg.arch not in ARCHES:
        raise WanjaxError(f"unknown --arch {cfg.arch!r}; choose one of {', '.join(ARCHES)}")
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
    if cfg.offload not in OFFLOAD_MODES:
        raise WanjaxError(f"unknown --offload {cfg.offload!r}; choose from {', '.join(OFFLOAD_MODES)}")
    if cfg.weights_dtype not in WEIGHTS_DTYPES:
        raise WanjaxError(
            f"unknown --weights_dtype {cfg.weights_dtype!r}; choose from {', '.join(WEIGHTS_DTYPES)}"
        )
    dtype, vae_dtype = (jnp.dtype(parse_dtype(d)).name for d in (cfg.dtype, cfg.vae_dtype))
    image_dtypes = ("float32",) if "image" in wanted else ()
    peaks = {d: device_peak(d) for d in dict.fromkeys((dtype, vae_dtype, *image_dtypes))}
    stages = {name: _stage(name, cfg) for name in wanted}
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


def pipeline_summary(cfg: BenchConfig, stages: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One generation from the stages run: an encode (and the image stage, for an image-to-video
    architecture), ``num_inference_steps`` steps and a decode at their steady medians (steps at the
    per-step median); empty unless all of the architecture's stages ran."""
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
    tflop_of["denoise"] = steps * denoise["tflop"]
    seconds, tflop = sum(seconds_of.values()), sum(tflop_of.values())
    rate = {} if cached else {"achieved_tflops": tflop / seconds if seconds > 0 else float("nan")}
    return {
        "steady_s": seconds,
        "tflop": tflop,
        **rate,
        "seconds_share": {name: t / seconds for name, t in seconds_of.items()},
    }


def format_table(result: dict[str, Any]) -> str:
    """The measurements as a text table."""
    cfg = result["config"]
    head = (
        f"wanjax bench: {cfg['arch']} ({cfg['layers'] or 'all'} layers), {cfg['height']}x{cfg['width']}x"
        f"{cfg['frames']}, {cfg['num_inference_steps']} steps, {cfg['dtype']}, guidance "
        f"{cfg['guidance_scale']}, offload {cfg.get('offload', 'none')}, weights "
        f"{cfg.get('weights_dtype', UNQUANTIZED)}; {result['devices']} x {result['device']}, peak "
        + "; ".join(f"{p['tflops']:.3g} TFLOP/s ({p['source']})" for p in result["peaks"].values())
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``wanjax bench`` flags (seed names, hyphenated spellings accepted)."""
    d = BenchConfig()
    parser.add_argument(
        "--arch", default=d.arch, choices=ARCHES, help=f"built-in architecture (default {d.arch})"
    )
    parser.add_argument("--layers", type=int, default=None, help="DiT/UMT5/CLIP layers (default: all)")
    parser.add_argument(
        "--height", type=int, default=d.height, help=f"pixels, multiple of 16 (default {d.height})"
    )
    parser.add_argument(
        "--width", type=int, default=d.width, help=f"pixels, multiple of 16 (default {d.width})"
    )
    parser.add_argument("--frames", type=int, default=d.frames, help=f"4n+1 frames (default {d.frames})")
    parser.add_argument(
        "--num_inference_steps",
        "--num-inference-steps",
        type=int,
        default=d.num_inference_steps,
        help=f"denoising steps per timed run, and in the pipeline line (default {d.num_inference_steps})",
    )
    parser.add_argument(
        "--guidance_scale",
        "--guidance-scale",
        type=float,
        default=d.guidance_scale,
        help=f"classifier-free guidance; > 1 batches the CFG pair (default {d.guidance_scale})",
    )
    parser.add_argument("--dtype", default=d.dtype, help=f"DiT / UMT5 dtype (default {d.dtype})")
    parser.add_argument(
        "--vae_dtype", "--vae-dtype", default=d.vae_dtype, help=f"VAE dtype (default {d.vae_dtype})"
    )
    parser.add_argument(
        "--max_sequence_length",
        "--max-sequence-length",
        type=int,
        default=d.max_sequence_length,
        help=f"text tokens of the encoded prompt (default {d.max_sequence_length})",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=d.repeats,
        help=f"timed runs per stage after the warm-up (default {d.repeats})",
    )
    parser.add_argument(
        "--stages",
        nargs="+",
        default=list(d.stages),
        choices=list(STAGES),
        help=f"stages to time (default: {' '.join(d.stages)}; image: image-to-video archs only)",
    )
    parser.add_argument(
        "--random_weights",
        "--random-weights",
        default=d.random_weights,
        choices=list(RANDOM_WEIGHTS),
        help="draw the random weights with numpy (host, then copied) or on the device (jax.random, "
        "straight into place); auto: on the device, except models under 300M weights on a CPU "
        "(default auto)",
    )
    # The memory flags of `wanjax generate` / `plan` (tools may not import the cli: the same choices,
    # read from the library here).
    parser.add_argument(
        "--offload",
        default=d.offload,
        choices=OFFLOAD_MODES,
        help="where the DiT's weights wait (default none: on the device); model: to pinned host memory "
        "and back before the denoise stage (the move is timed); blocks: the stacked layers in pinned "
        "host memory, streamed per layer",
    )
    parser.add_argument(
        "--weights_dtype",
        "--weights-dtype",
        default=d.weights_dtype,
        choices=WEIGHTS_DTYPES,
        help=f"matmul kernels of the DiT and text encoder (default {UNQUANTIZED}: in --dtype); int8, fp8: "
        "8 bits with a float32 scale per output channel (drawn with NumPy: no on-device quantised draw)",
    )
    parser.add_argument(
        "--cache",
        default=d.cache,
        choices=POLICIES,
        help="step cache of the denoise stage (default off; see wanjax generate --help)",
    )
    parser.add_argument("--cache_threshold", "--cache-threshold", type=float, help="the policy's threshold")
    parser.add_argument("--cache_max_skip", "--cache-max-skip", type=int, help="magcache: skips in a row")
    parser.add_argument(
        "--cache_retention", "--cache-retention", type=float, help="magcache: retention ratio"
    )
    parser.add_argument(
        "--mag_ratios",
        "--mag-ratios",
        help=f"magcache's curve: a preset ({', '.join(presets())}) or a JSON file (default: the "
        "architecture's preset, when --layers keeps its depth)",
    )
    parser.add_argument("--json", help="also write the numbers to this JSON file")


@dataclasses.dataclass(frozen=True)
class BenchRequest:
    """``wanjax bench``: what to run, and the JSON file to write the numbers to."""

    config: BenchConfig
    json: str | None = None

    @classmethod
    def from_flags(cls, args: argparse.Namespace) -> BenchRequest:
        values = {f.name: getattr(args, f.name) for f in dataclasses.fields(BenchConfig)}
        return cls(BenchConfig(**{**values, "stages": tuple(args.stages)}), args.json)


def run_request(request: BenchRequest) -> dict[str, Any]:
    """``wanjax bench``: run, print the table, write the JSON file."""
    result = run_bench(request.config)
    print(format_table(result))
    if request.json:
        write_text(request.json, json.dumps(result, indent=2) + "\n")
    return result


def run(args: argparse.Namespace) -> dict[str, Any]:
    """:func:`run_request` with flags parsed by a parser :func:`add_arguments` filled."""
    return run_request(BenchRequest.from_flags(args))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="wanjax bench", description=__doc__.splitlines()[0])
    add_arguments(parser)
    run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
