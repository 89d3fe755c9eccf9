"""``wanjax plan --compile SLICE``: every program of a run compiled by the real TPU compiler, ahead of
time, on a machine without a TPU.

libtpu (``pip install 'wanjax[tpu]'``) describes a TPU slice's devices without the chips
(:func:`jax.experimental.topologies.get_topology_desc`); under :func:`~wanjax.target.building_for`
those devices, every component is built as the pipeline builds it (same settings, mesh, dtypes,
offload, 8-bit weights, attention backend) but with abstract weights, and each program the run would
compile is lowered from abstract inputs and compiled by the TPU compiler (Mosaic included). Per
program the report gives: compiled or the compiler's error in one line (VMEM, HBM), per-chip bytes by
``memory_analysis()`` beside :mod:`wanjax.planning.plan`'s estimate, the Pallas kernels in the program
(``tpu_custom_call``), its FLOPs per chip counted in the compiled HLO (:mod:`wanjax.tools.hlo_flops`)
beside the analytic count, their time at the datasheet peak and the cost model's (an estimate), and
compile seconds. Nothing runs and no TPU is touched, even where one is attached.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import math
import re
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from wanjax.chips import Slice, datasheet_peak
from wanjax.errors import WanjaxError
from wanjax.io.checkpoint import abstract_params
from wanjax.io.gguf_kernel import abstract_kept
from wanjax.io.quant import abstract_quantized_params
from wanjax.io.quantizable import KEPT_GGUF
from wanjax.kernels.attention import AttentionShape, AttentionSpec, attention, resolve_backend
from wanjax.kernels.radial import RadialAttention
from wanjax.models import clip_vision, dit, umt5, vae
from wanjax.models.animate import abstract_control
from wanjax.models.config import parse_dtype
from wanjax.models.defaults import TEXT_LENGTH
from wanjax.models.offload import HOST_KINDS, memory_kind, offload_sharding, parse_offload, program_memory
from wanjax.models.registry import Variant
from wanjax.models.settings import RunSettings
from wanjax.models.w8a8 import int8_matmuls
from wanjax.parallel.layouts import spatial_sharding
from wanjax.parallel.mesh import MeshSpec, make_mesh
from wanjax.parallel.rules import param_sharding, replicated
from wanjax.pipeline.animate import segment_length
from wanjax.pipeline.demo import demo_text_encoder_config
from wanjax.runtime.jax_cache import persistent_cache_off
from wanjax.runtime.libtpu import compiler_environment, installed
from wanjax.sampling.cache.step_cache import CacheConfig, resolve
from wanjax.sampling.guidance import ImageConditioning
from wanjax.sampling.sampler import Sampler
from wanjax.sampling.scheduler import SchedulerConfig, make_scheduler
from wanjax.target import Target, building_for, current_target
from wanjax.tools.compile_report import CompileReport, ProgramReport
from wanjax.tools.flops import (
    attention_density,
    clip_vision_flops,
    context_kv_flops,
    dit_step_flops,
    sparse_step_flops,
    umt5_flops,
    vae_decode_flops,
)
from wanjax.tools.hlo_flops import FlopCount, UnknownTripCount, count_flops

__all__ = [
    "PROGRAMS",
    "CompileReport",
    "Program",
    "ProgramReport",
    "RunSpec",
    "attention_program",
    "compile_one",
    "compile_run",
    "compiler_error",
    "parse_programs",
    "run_programs",
    "slice_target",
]


def slice_target(tpu: Slice) -> Target:
    """The slice's devices as a compile-only :class:`~wanjax.target.Target` (libtpu, no TPU needed)."""
    if not installed():
        raise WanjaxError("--compile needs libtpu, the TPU compiler: pip install 'wanjax[tpu]'")
    from jax.experimental import topologies

    with compiler_environment(tpu.accelerator_type):
        topology = topologies.get_topology_desc(topology_name=tpu.topology, platform="tpu", **tpu.options)
    return Target.of(topology.devices, compile_only=True)


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """The run whose programs are compiled: a registry variant, the video size, the mesh and the
    memory settings, as ``wanjax generate`` takes them."""

    variant: Variant
    height: int
    width: int
    frames: int
    mesh: MeshSpec
    dtype: str = "bfloat16"
    vae_dtype: str = "float32"
    attention: str | AttentionSpec = "auto"
    offload: str = "none"
    weights_dtype: str = "bf16"
    activations_dtype: str = "auto"  # the DiT blocks' matmuls: int8 (W8A8) or the model dtype
    # ``--weights_dtype gguf``: per component folder, the GGUF type of each leaf its file keeps
    # (:func:`wanjax.pipeline.sources.kept_gguf_types`, by key path)
    gguf: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)
    guidance: bool = True  # the CFG pair in one batch
    max_sequence_length: int = TEXT_LENGTH
    cache: CacheConfig | None = None  # a step cache: the step is the program that policy runs
    sparse: RadialAttention | None = None  # radial attention: its sparse step compiled too (step_sparse)
    segment_frame_length: int | None = None  # an Animate variant's segment (None: its default)

    @property
    def step_frames(self) -> int:
        """The frames one program makes: ``frames``; an Animate variant's, one segment's
        (``segment_frame_length``, else its default, rounded as the pipeline does), whatever the
        video's length."""
        v = self.variant
        if not v.transformer.animate:
            return self.frames
        length = self.segment_frame_length or v.defaults.segment_frame_length
        return segment_length(length, v.vae.temporal_factor)

    @property
    def latents_shape(self) -> tuple[int, int, int, int, int]:
        """The run's latents ``(1, z, T', H/8, W/8)`` (an Animate variant's: one segment's, without the
        reference's frame)."""
        v = self.variant
        frames = (self.step_frames - 1) // v.vae.temporal_factor + 1
        return (
            1,
            v.vae.z_dim,
            frames,
            self.height // v.vae.spatial_factor,
            self.width // v.vae.spatial_factor,
        )


@dataclasses.dataclass(frozen=True)
class Program:
    """A program of the run: its name, how to lower it, the run stage it belongs to (``encode``,
    ``denoise``, ``decode``: :mod:`wanjax.planning.plan`'s), the attention backend it uses, its
    weights' bytes per chip in device memory (resident for the whole run under ``--offload none``),
    its analytic FLOPs over all chips (``None``: not counted, e.g. the VAE encoder) and the
    component whose weights those are (default: its own; an expert's text K/V cache and step share
    one transformer's)."""

    name: str
    lower: Callable[[], jax.stages.Lowered]
    stage: str
    attention_backend: str | None
    weights_bytes: int
    flops: int | None = None
    component: str | None = None


def weights_per_chip(params: Any) -> int:
    """Bytes per chip of an abstract params tree's leaves in device memory (their shards)."""
    return sum(
        math.prod(leaf.sharding.shard_shape(tuple(leaf.shape))) * np.dtype(leaf.dtype).itemsize
        for leaf in jax.tree.leaves(params)
        if memory_kind(leaf) not in HOST_KINDS
    )


_CUSTOM_CALL = re.compile(r"custom_call_target=\"tpu_custom_call\"")


def chip_bytes(compiled: jax.stages.Compiled) -> dict[str, int]:
    """Per-chip bytes of a compiled program (:func:`~wanjax.models.offload.program_memory`)."""
    m = program_memory(compiled)
    total = m["total"] + m["generated_code"]
    return {
        "arguments": m["argument"],
        "temporaries": m["temp"],
        "outputs": m["output"],
        "code": m["generated_code"],
        "host_arguments": m["host_argument"],
        "total": total,
    }


def compile_one(
    program: Program, planned: int | None = None, earlier: dict[str, ProgramReport] | None = None
) -> ProgramReport:
    """Compile one program (under :func:`~wanjax.target.building_for` its target); a compiler error
    becomes the report's one-line ``error``. ``earlier``: the reports of the run's programs compiled
    before, by their text; a program the same as one of them is not compiled again but reported as
    a run takes it, from the compilation cache (a two-expert model's second step)."""
    start = time.perf_counter()
    try:
        # JAX's persistent cache writes an executable built for a topology's devices but cannot
        # read it back ("PjRtCompiler must be constructed with a Client"): off, every program compiled
        with persistent_cache_off():
            lowered = program.lower()
            key = f"{program_kind(program.name)}:{hashlib.sha256(lowered.as_text().encode()).hexdigest()}"
            if earlier is not None and key in earlier:
                same = earlier[key]
                return dataclasses.replace(same, name=program.name, compile_seconds=0.0, same_as=same.name)
            compiled = lowered.compile()
    except Exception as err:  # the compiler's refusal (VMEM, HBM, an unsupported op) is the answer
        seconds = time.perf_counter() - start
        error = compiler_error(str(err))
        return ProgramReport(program.name, False, error, None, planned, program.attention_backend, 0, seconds)
    seconds = time.perf_counter() - start
    text = compiled.as_text()
    calls = len(_CUSTOM_CALL.findall(text))
    sizes = chip_bytes(compiled)
    report = ProgramReport(
        program.name,
        True,
        None,
        sizes,
        planned,
        program.attention_backend,
        calls,
        seconds,
        analytic_flops=program.flops,
    )
    with contextlib.suppress(UnknownTripCount):
        count = count_flops(text)
        report.flops_per_chip = count.flops
        report.int8_products, report.int8_flops_per_chip = count.int8_products, count.int8_flops
        if not count.unestimated_kernels:  # else the cost model missed those kernels' work
            report.cost_model_seconds = cost_model_seconds(compiled, count)
        peak = datasheet_peak(current_target().device_kind)
        report.peak_seconds = None if peak is None else count.flops / peak
    if earlier is not None:
        earlier[key] = report
    return report


def cost_model_seconds(compiled: jax.stages.Compiled, count: FlopCount) -> float | None:
    """The TPU cost model's time for the program (an estimate, never a measurement), its loops
    scaled: the model counts each loop body once, so its time is scaled by the FLOPs of every
    iteration over those of one. ``None`` where the model gives no time (a negative one, as it does
    for the 14B step at 720p)."""
    cost = compiled.cost_analysis()
    seconds = ((cost[0] if isinstance(cost, list) else cost) or {}).get("optimal_seconds")
    if not seconds or seconds < 0:
        return None
    return seconds * count.flops / count.once if count.once else seconds


def attention_program(
    target: Target,
    spec: str | AttentionSpec,
    q_shape: tuple[int, int, int, int],
    k_len: int | None = None,
    dtype: Any = jnp.bfloat16,
) -> Program:
    """One attention call on the target's first device: ``(B, Lq, H, D)`` queries over ``k_len``
    keys (default: self-attention), abstract inputs."""
    device = jax.sharding.SingleDeviceSharding(target.devices[0])
    batch, q_len, heads, head_dim = q_shape
    q = jax.ShapeDtypeStruct(q_shape, dtype, sharding=device)
    k = jax.ShapeDtypeStruct((batch, k_len or q_len, heads, head_dim), dtype, sharding=device)

    def lower() -> jax.stages.Lowered:
        return jax.jit(lambda q, k, v: attention(q, k, v, backend=spec)).lower(q, k, k)

    name = spec.backend if isinstance(spec, AttentionSpec) else spec
    return Program("attention", lower, "denoise", name, 0)


def compiler_error(message: str) -> str:
    """The compiler's error in one line: its code (``RESOURCE_EXHAUSTED: E1001:
    CompileTimeScopedVmemOom``), the attention call it failed in and its sentences giving the sizes
    (``Scoped allocation with size 16.07M and limit 16.00M exceeded ...``), not the HLO it quotes."""
    lines = message.strip().splitlines() or [""]
    head = lines[0].split(". ")[0].rstrip(":.")
    text = " ".join(message.split())
    sizes = [s for s in re.split(r"(?<=\.)\s+", text) if re.search(r"exceed|\bused\b", s, re.IGNORECASE)]
    sizes = list(dict.fromkeys(s.split("\\n")[0].rstrip(";") for s in sizes))  # some come twice
    sizes = [s for s in sizes if s.rstrip(".") != head]
    where = _ATTENTION_LABEL.search(message)
    parts = [head, *([f"in {where.group(1)}"] if where else []), *sizes]
    return "; ".join(parts)[:500]


_ATTENTION_LABEL = re.compile(r"op_name=\"[^\"]*?(attention_\w+)")


def run_programs(run: RunSpec, target: Target) -> Iterator[Program]:
    """The programs a run compiles on ``target``, in the order the run compiles them (call under
    ``building_for(target)``)."""
    v = run.variant
    mesh = make_mesh(run.mesh, target.devices[: run.mesh.num_devices])
    fsdp = run.mesh.fsdp
    offload = parse_offload(run.offload)
    dtype, vae_dtype = parse_dtype(run.dtype), parse_dtype(run.vae_dtype)
    params_sharding = param_sharding(mesh, fsdp)
    latents_shape = run.latents_shape
    geometry_t, h, w = latents_shape[2:]

    def in_strips(shape: tuple[int, ...]) -> jax.ShapeDtypeStruct:
        """A VAE input, split in spatial strips over the mesh as the pipeline places it."""
        return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=spatial_sharding(mesh, shape))

    # text encoder: the prompt and the negative prompt, 512 tokens
    te_sharding = offload_sharding(params_sharding, offload, per_step=False)
    text_cfg = v.text_encoder or demo_text_encoder_config()  # None: a demo's, sized to its vocabulary
    te_params = abstract_weights(run, "text_encoder", umt5.checkpoint_spec(text_cfg), dtype, te_sharding)
    encoder = umt5.UMT5Encoder(text_cfg, te_params, None, offload=offload)
    rows = 2 if run.guidance else 1
    yield Program(
        "text_encoder",
        lambda: encoder.lower(rows, run.max_sequence_length),
        "encode",
        "xla",
        weights_per_chip(te_params),
        umt5_flops(text_cfg, rows, run.max_sequence_length).total,
    )

    tcfg = v.transformer
    image, image_len = None, 0
    images = 2 if tcfg.first_last_frame else 1  # the conditioning images (first, last)
    if v.image_encoder is not None and tcfg.image_tokens:
        ccfg = v.image_encoder
        # float32 and unquantised, as WanPipeline loads it (diffusers' examples do)
        c_params = abstract_params(clip_vision.checkpoint_spec(ccfg), jnp.float32, params_sharding)
        clip = clip_vision.CLIPVisionEncoder(ccfg, c_params, None)
        yield Program(
            "image_encoder",
            lambda: clip.lower(images),
            "encode",
            "xla",
            weights_per_chip(c_params),
            clip_vision_flops(ccfg, images).total,
        )
    vae_sharding = lambda source: replicated(mesh)  # noqa: E731  (as WanPipeline loads the VAE)
    like = {
        part: abstract_params(vae.checkpoint_spec(v.vae, part), vae_dtype, vae_sharding)
        for part in ("decoder", "encoder")
    }
    autoencoder = vae.WanVAE(
        v.vae, None, vae_dtype, params_like=like["decoder"], encoder_params=None, encoder_like=like["encoder"]
    )
    if v.image:
        frames = 1 if v.expand_timesteps else run.step_frames
        video = in_strips((1, 3, frames, run.height, run.width))
        yield Program(
            "vae_encode",
            lambda: autoencoder.lower("encode", video),
            "encode",
            "xla",
            weights_per_chip(like["encoder"]),
        )
        if v.expand_timesteps:
            first = jax.ShapeDtypeStruct((1, v.vae.z_dim, 1, h, w), jnp.float32)
            image = ImageConditioning(first, None, first_frame=True)
        else:
            states = None
            if tcfg.image_tokens:
                image_len = images * v.image_encoder.num_positions
                states = jax.ShapeDtypeStruct(
                    (images, v.image_encoder.num_positions, tcfg.image_dim), jnp.float32
                )
            # an Animate step: a segment of ``frames`` with the reference's latent frame first, its
            # pose latents and face frames (wanjax.pipeline.animate)
            step_t = geometry_t + 1 if tcfg.animate else geometry_t
            condition = jax.ShapeDtypeStruct((1, tcfg.condition_channels, step_t, h, w), jnp.float32)
            image = ImageConditioning(
                condition,
                states,
                motion=abstract_control(tcfg, run.step_frames, (geometry_t, h, w)) if tcfg.animate else None,
            )

    int8 = int8_matmuls(run.activations_dtype, run.weights_dtype, target)
    settings = RunSettings(dtype, attention=run.attention, mesh=mesh, offload=offload, int8_matmuls=int8)
    t_sharding = dit.transformer_sharding(mesh, fsdp, settings.offload)
    experts = 2 if v.boundary_ratio is not None else 1
    folders = ("transformer", "transformer_2")[:experts]  # each expert's weights (its own file)
    t_params = [abstract_weights(run, f, dit.checkpoint_spec(tcfg), dtype, t_sharding) for f in folders]
    models = [dit.WanTransformer(tcfg, params, settings) for params in t_params]
    sampler = Sampler(models[0], models[1] if experts == 2 else None)
    scheduler = make_scheduler(SchedulerConfig(), 2)
    step_shape = (*latents_shape[:2], latents_shape[2] + (1 if tcfg.animate else 0), *latents_shape[3:])
    noise = jax.ShapeDtypeStruct(step_shape, jnp.float32)
    text = jax.ShapeDtypeStruct((1, run.max_sequence_length, tcfg.text_dim), dtype)
    backend = _dit_backend(run.attention, tcfg, dtype)
    suffixes = ("",) if experts == 1 else ("_high_noise", "_low_noise")
    uncond = text if run.guidance else None
    text_len, rows = run.max_sequence_length, latents_shape[0] * (2 if run.guidance else 1)
    cached = sampler.context_cache
    # the step's work over its own latents (an Animate step's: the reference's latent frame too)
    step_flops = dit_step_flops(tcfg, step_shape, text_len, run.guidance, image_len, context_cached=cached)
    kv_flops = context_kv_flops(tcfg, rows, text_len, image_len).total
    for k, suffix in enumerate(suffixes):
        weights = weights_per_chip(t_params[k])
        inputs = (scheduler, noise, text, uncond, t_params[k])
        options = dict(image=image, expert=k, cache=run.cache)

        def lower_kv(inputs: tuple = inputs, options: dict = options) -> jax.stages.Lowered:
            return sampler.lower_context_cache(*inputs, **options)

        def lower(inputs: tuple = inputs, options: dict = options) -> jax.stages.Lowered:
            return sampler.lower(*inputs, **options)

        component = f"transformer{suffix}"
        if cached:
            yield Program(f"text_kv{suffix}", lower_kv, "denoise", "xla", weights, kv_flops, component)
        yield Program(f"step{suffix}", lower, "denoise", backend, weights, step_flops.total, component)
        if run.sparse is not None:
            flops = sparse_step_flops(tcfg, step_shape, step_flops, run.sparse, run.guidance).total
            lower = functools.partial(sampler.lower, *inputs, **options, sparse=run.sparse)
            yield Program(f"step_sparse{suffix}", lower, "denoise", backend, weights, flops, component)

    latents = in_strips(latents_shape)
    yield Program(
        "vae_decode",
        lambda: autoencoder.lower("decode_uint8", latents),
        "decode",
        "xla",
        weights_per_chip(like["decoder"]),
        vae_decode_flops(v.vae, latents_shape, autoencoder.numerics, autoencoder.frames_per_step).total,
    )


def abstract_weights(run: RunSpec, folder: str, spec: Any, dtype: Any, sharding: Any) -> Any:
    """A component's abstract weights as the run loads them: ``--weights_dtype gguf`` keeps the GGUF
    blocks of its file's kept leaves, 8-bit quantises, else ``dtype``."""
    if run.weights_dtype == KEPT_GGUF:
        return abstract_kept(spec, dtype, run.gguf.get(folder, {}), sharding)
    return abstract_quantized_params(spec, dtype, run.weights_dtype, sharding)


def _dit_backend(attention: str | AttentionSpec, cfg: Any, dtype: Any) -> str:
    """The backend the DiT's self-attention resolves to on the build target."""
    name = attention.backend if isinstance(attention, AttentionSpec) else attention
    return resolve_backend(name, AttentionShape(cfg.attention_head_dim, np.dtype(dtype).name))


# "text_kv" (the text K/V cache's) and "step": each expert's
PROGRAMS = ("text_encoder", "image_encoder", "vae_encode", "text_kv", "step", "vae_decode")


def program_kind(name: str) -> str:
    """The :data:`PROGRAMS` entry a program is (an expert's ``step_high_noise`` is a ``step``)."""
    return next((kind for kind in ("text_kv", "step") if name.startswith(kind)), name)


def parse_programs(text: str) -> tuple[str, ...]:
    """``--programs`` (``step,vae_decode``): names of :data:`PROGRAMS`; WanjaxError naming the others."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in PROGRAMS]
    if unknown or not names:
        raise WanjaxError(f"--programs {text!r}: choose from {', '.join(PROGRAMS)}")
    return names


def compile_run(
    run: RunSpec,
    tpu: Slice,
    planned: Mapping[str, int] | None = None,
    only: Collection[str] | None = None,
    on_line: Callable[[str], None] | None = None,
) -> CompileReport:
    """Every program of ``run`` compiled for ``tpu`` (no TPU needed; none is touched).
    ``planned``: :mod:`wanjax.planning.plan`'s bytes per chip of each stage (``encode``, ``denoise``,
    ``decode``), shown beside each program of the stage. ``only``: compile just these of
    :data:`PROGRAMS` (the others' weights still count as resident). ``on_line``: given the table's
    header, then each program's line as soon as it is compiled (the footer is the caller's)."""
    if run.mesh.num_devices != tpu.chips:
        raise WanjaxError(
            f"mesh {run.mesh.flag} uses {run.mesh.num_devices} devices; {tpu.name} has {tpu.chips} chips"
        )
    only = None if only is None else parse_programs(",".join(only))
    if run.cache is not None:  # its settings checked before any compile (e.g. a curve for MagCache)
        v = run.variant
        two = v.boundary_ratio is not None
        resolve(run.cache, v.transformer, 2, run.guidance, [0, 1] if two else None, v.expand_timesteps)
    target = slice_target(tpu)
    chip = tpu.chip
    report = CompileReport(tpu.name, tpu.chips, chip.hbm_bytes, chip.usable_hbm_bytes, run.mesh.flag, [])
    if run.sparse is not None:
        report.attention_density = attention_density(run.variant.transformer, run.latents_shape, run.sparse)
    if on_line is not None:
        on_line(report.header())
    with building_for(target):
        programs = list(run_programs(run, target))
        resident = _resident_bytes(programs, run.offload)
        earlier: dict[str, ProgramReport] = {}
        for program in programs:
            if only is not None and program_kind(program.name) not in only:
                continue
            compiled = compile_one(program, None if planned is None else planned.get(program.stage), earlier)
            compiled.resident_bytes_per_chip = resident(program)
            report.programs.append(compiled)
            if on_line is not None:
                on_line(report.line(compiled))
    return report


def _resident_bytes(programs: list[Program], offload: str) -> Callable[[Program], int]:
    """The bytes per chip of the other components' weights while a program runs: under ``--offload
    none`` every component's weights stay on the chips; else only the running stage's."""
    if parse_offload(offload) != "none":
        return lambda program: 0
    weights = {p.component or p.name: p.weights_bytes for p in programs}  # each component once
    return lambda program: sum(weights.values()) - weights[program.component or program.name]
