"""``wanjax info`` and ``wanjax plan``: what a model directory holds, and what a run would need."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from wanjax.errors import CheckpointError, WanjaxError
from wanjax.io.weights_file import FORMATS
from wanjax.jobs.animate_flags import segment_frame_length_flag
from wanjax.jobs.cache_flags import CacheFlags
from wanjax.jobs.flags import library, option
from wanjax.jobs.groups import (
    DEFAULT_DTYPE,
    AttentionFlags,
    ComponentFileFlags,
    MemoryFlags,
    VaeFlags,
    download_flag,
    revision_flag,
    use_fsdp_flag,
)
from wanjax.jobs.requests import Request
from wanjax.models.registry import Defaults, Variant, registry, released

if TYPE_CHECKING:
    from wanjax.io.component import Component
    from wanjax.pipeline.hub import ModelSource


def _variants() -> dict[str, str]:
    return {"variants": ", ".join(released())}


_compile_programs = library("wanjax.tools.compile_target", "PROGRAMS")


def _slices() -> dict[str, str]:
    from wanjax.chips import SLICES

    return {"slices": ", ".join(SLICES)}


@dataclasses.dataclass(frozen=True)
class PlanRequest(Request):
    """``wanjax plan``: per-device memory of a run on a mesh."""

    command: ClassVar[str] = "plan"
    model: str | None = option(
        help="a registry variant ({variants}) or a diffusers model directory (default 14B, or the "
        "--transformer file's variant)",
        values=_variants,
    )
    mesh: str | None = option(help="dp=2,sp=1,tp=4 (default: every mesh of --num_devices, best one named)")
    num_devices: int | None = option(help="devices (default: the mesh's size, else those visible)")
    device_memory: str = option("32GiB", help="memory per device (default {default}, a TPU v6e chip)")
    height: int = option(720, help="pixels (default {default})")
    width: int = option(1280, help="pixels (default {default})")
    frames: int = option(81, help="frames (default {default}; an Animate model's run: one segment's)")
    segment_frame_length: int | None = segment_frame_length_flag()
    dtype: str = option(DEFAULT_DTYPE, help="transformer / text encoder dtype (default {default})")
    vae_dtype: str = option(VaeFlags.vae_dtype, help="VAE dtype (default {default})")
    use_fsdp: bool = use_fsdp_flag()
    compile: str | None = option(
        metavar="SLICE",
        help="compile every program of the run for this TPU slice ({slices}) with the TPU compiler, "
        "from abstract weights on this machine (no TPU needed; needs wanjax[tpu]); its HBM replaces "
        "--device_memory",
        values=_slices,
    )
    json: str | None = option(metavar="FILE", help="with --compile: write its report as JSON")
    programs: str | None = option(
        metavar="P,P",
        help="with --compile: only these ({programs}; default all)",
        values=lambda: {"programs": ", ".join(_compile_programs())},
    )
    memory: MemoryFlags = dataclasses.field(default_factory=MemoryFlags)
    attention: AttentionFlags = dataclasses.field(default_factory=AttentionFlags)
    cache: CacheFlags = dataclasses.field(default_factory=CacheFlags)
    files: ComponentFileFlags = dataclasses.field(default_factory=ComponentFileFlags)


@dataclasses.dataclass(frozen=True)
class InfoRequest(Request):
    """``wanjax info``: what a model directory holds."""

    command: ClassVar[str] = "info"
    model: str = option(
        help="model directory (or one component folder), hub id in the HF cache, or demo", positional=True
    )
    revision: str | None = revision_flag()
    download: bool = download_flag()


def cmd_info(request: InfoRequest) -> None:
    """Print components, their configs, tensor counts, sizes and dtypes."""
    from wanjax.pipeline.hub import resolve_model
    from wanjax.pipeline.sources import not_a_model

    if request.model.endswith(FORMATS):
        _file_info(Path(request.model))
        return
    presets = released()
    if request.model in presets and not Path(request.model).exists():
        _variant_info(presets[request.model])
        return
    source = resolve_model(request.model, revision=request.revision, download=request.download)
    root = source.path
    index_path = root / "model_index.json"
    marker = _component(root.name).marker  # the file that makes ``root`` one component's folder
    if index_path.exists():
        index = _read_json(index_path)
        components = [k for k, v in index.items() if not k.startswith("_") and isinstance(v, list)]
        options = {k: v for k, v in index.items() if not k.startswith("_") and not isinstance(v, list)}
        print(f"{root}: {index.get('_class_name', 'model')}")
        if source.is_demo:
            print(f"  {index['_wanjax_demo']['note']}")
        if options:  # pipeline options: Wan 2.2's boundary_ratio (two experts), expand_timesteps (TI2V)
            print("  " + ", ".join(f"{k}={json.dumps(v)}" for k, v in options.items()))
        components = [k for k in components if any(v is not None for v in index[k])]  # [null, null]: absent
        _print_registry_match(source)
    elif (root / marker).is_file():
        components, root = [root.name], root.parent
    elif root.is_file():
        raise WanjaxError(not_a_model(root))
    elif (parts := not_a_model(root)) is not None:  # component folders alone (`convert` without --model)
        print(parts)
        components = [p.name for p in sorted(root.iterdir()) if (p / _component(p.name).marker).is_file()]
    else:
        raise WanjaxError(
            f"{root}: neither model_index.json nor {marker} found; pass a diffusers model directory"
        )
    for name in components:
        folder = root / name
        print(f"\n[{name}]")
        if not folder.is_dir():
            print("  (missing)")
            continue
        component = _component(name)
        configs = sorted(folder.glob("*config.json"), key=lambda p: (p.name != component.config_file, p.name))
        for config in configs:
            for line in _config_lines(config.name, _read_json(config)):
                print(f"  {line}")
        if component.has_weights:
            print("  weights: " + _weights_summary(component.open_weights(folder)))
        else:
            files = sorted(p for p in folder.iterdir() if p.is_file())
            print("  files: " + ", ".join(f"{p.name} ({p.stat().st_size / 1024:.0f} KiB)" for p in files))


def _defaults_line(d: Defaults) -> str:
    sampler = "" if d.scheduler == "auto" else f" ({d.scheduler})"
    return (
        f"defaults: {d.width}x{d.height}, {d.frames} frames at {d.fps:g} fps, {d.num_inference_steps} steps"
        f"{sampler}, guidance {d.guidance_scale:g}, seed {d.seed}"
    )


def _variant_info(v: Variant) -> None:
    """A registry variant: what it is, its checkpoint, experts, defaults and component shapes."""
    t = v.transformer
    print(f"{v.name}: {v.title} (model registry)")
    if v.repo:
        print(f"  checkpoint: {v.repo}")
    if v.boundary_ratio is not None:
        print(f"  two experts, boundary_ratio={v.boundary_ratio}")
    print(f"  {_defaults_line(v.defaults)}")
    print(
        f"  transformer: {t.num_layers} layers, {t.num_attention_heads}x{t.attention_head_dim} heads, "
        f"ffn {t.ffn_dim}, {t.in_channels} -> {t.out_channels} channels"
    )
    if t.vace_layers is not None:
        layers = ", ".join(map(str, t.vace_layers))
        print(
            f"  VACE: {len(t.vace_layers)} control blocks, after layers {layers}; {t.vace_in_channels} control channels"
        )
    if v.image_encoder is not None:
        print(
            f"  image encoder: CLIP, {v.image_encoder.num_hidden_layers} layers of {v.image_encoder.hidden_size}"
        )
    print(f"  vae: z_dim {v.vae.z_dim}, {v.vae.spatial_factor}x spatial, {v.vae.temporal_factor}x temporal")
    curves = [c for c in (v.mag_ratios, v.mag_ratios_image) if c]
    if curves:
        print(f"  MagCache curves: {', '.join(curves)}")


def _print_registry_match(source: ModelSource) -> None:
    """The registry variant a model directory is recognised as, and the defaults its runs get."""
    from wanjax.pipeline.loading import Components, LoadSettings

    try:
        parts = Components(source, LoadSettings())
        found, defaults = parts.variant, parts.defaults
    except WanjaxError:  # a directory a run would refuse: its parts are still listed
        return
    print(f"  variant: {found.name} ({found.title})" if found else "  variant: none in the registry")
    print(f"  {_defaults_line(defaults)}")


def _file_info(path: Path) -> None:
    """A weights file: the component and variant it holds (layout, prefix, storage), else a LoRA."""
    from wanjax.pipeline.sources import describe_file

    try:
        d = describe_file(path)
    except CheckpointError as component_error:
        if path.suffix != ".safetensors" or "layout, but" in str(component_error):
            raise
        try:
            _lora_info(str(path))
        except CheckpointError:
            raise component_error from None
        return
    print(f"{path}: {d.summary}")
    size = path.stat().st_size / 2**20
    print(f"  weights: {sum(d.kinds.values())} tensors, {d.params / 1e6:.2f} M params, file {size:.1f} MiB")
    print("  stored: " + ", ".join(f"{kind} x{n}" for kind, n in sorted(d.kinds.items())))


def _lora_info(path: str) -> None:
    """A LoRA file: its layout, ranks, alphas and the modules it changes (:func:`wanjax.io.lora.describe`)."""
    from wanjax.io.lora import describe, read_lora

    info = describe(read_lora(path))
    print(f"{info['path']}: LoRA, {info['format']} layout, {info['modules']} modules")
    print(f"  ranks: {', '.join(map(str, info['ranks']))}")
    alphas = (
        "none given (alpha = rank)" if info["alphas"] is None else ", ".join(f"{a:g}" for a in info["alphas"])
    )
    print(f"  alphas: {alphas}")
    print("  targets: " + ", ".join(f"{name} x{count}" for name, count in info["targets"].items()))
    extras = [name for name in ("diff", "diff_b") if info[name]]
    if extras:
        print(f"  full deltas: {', '.join(extras)}")
    if info["ignored_keys"]:
        print(f"  ignored (as diffusers ignores them): {info['ignored_keys']} keys")


def _component(folder: str) -> Component:
    """The registry's description of ``folder``; for another folder, one holding a config.json."""
    from wanjax.io.component import Component
    from wanjax.pipeline.components import COMPONENTS

    return COMPONENTS.get(folder) or Component(folder, files=("config.json",))


# The key that names a config's class: diffusers, transformers models, transformers tokenizers.
CLASS_KEYS = ("_class_name", "architectures", "tokenizer_class")


def _config_lines(file_name: str, cfg: dict[str, Any]) -> list[str]:
    """``class: NAME`` (when the config names one) and ``FILE: key=value, ...`` (metadata left out)."""
    key = next((k for k in CLASS_KEYS if k in cfg), None)
    values = ", ".join(f"{k}={_short(v)}" for k, v in cfg.items() if k != key and not k.startswith("_"))
    if key is None:
        return [f"{file_name}: {values}"]
    name = cfg[key]
    return [
        "class: " + (", ".join(map(str, name)) if isinstance(name, list) else str(name)),
        f"{file_name}: {values}",
    ]


def _short(value: Any, limit: int = 200) -> str:
    """``value`` as text, a long list or dict as its length (tokenizer configs list hundreds of tokens)."""
    text = str(value)
    if len(text) <= limit:
        return text
    if isinstance(value, list | dict):
        return f"<{len(value)} {'items' if isinstance(value, list) else 'entries'}>"
    return text[:limit] + "..."


def _read_json(path) -> dict:
    """A JSON object from ``path``; WanjaxError naming the file otherwise."""
    from wanjax.errors import parse_json_object

    try:
        text = path.read_bytes()
    except OSError as e:
        raise WanjaxError(f"{path}: cannot read ({e.strerror or e})") from None
    return parse_json_object(text, str(path))


def cmd_plan(request: PlanRequest) -> int:
    """Print the per-device memory plan in the requested ``--offload`` / ``--weights_dtype`` mode, then
    every mode's peak on the mesh that matters; exit 1 when the requested mode does not fit on the
    requested mesh (or on any mesh), with the cheapest mode that does named."""
    from wanjax.chips import GiB
    from wanjax.parallel.mesh import auto_mesh, parse_mesh
    from wanjax.planning import meshes as mesh_plans
    from wanjax.planning import models
    from wanjax.planning.plan import parse_memory, plan

    request = dataclasses.replace(request, model=models.model_name(request.model, request.files.given()))
    model = models.model_configs(request.model, request.files.given())
    memory = parse_memory(request.device_memory)
    requested = parse_mesh(request.mesh, request.use_fsdp) if request.mesh else None
    count = request.num_devices or (requested.num_devices if requested else None)
    tpu = target = None
    _check_cache_flags(request)
    if request.compile is not None:
        tpu, target = _compile_slice(request)
        memory, count = tpu.chip.usable_hbm_bytes, count or tpu.chips
    if count is None:
        import jax

        count = jax.device_count()
    if requested and requested.num_devices != count:
        raise WanjaxError(
            f"--mesh {request.mesh} uses {requested.num_devices} devices, --num_devices {count}"
        )
    size = dict(height=request.height, width=request.width, frames=request.frames)
    kwargs = dict(**size, device_memory=memory, dtype=request.dtype, vae_dtype=request.vae_dtype)
    segment = _segment(request, model)
    if segment is not None:
        kwargs["segment_frame_length"] = segment
    if target is not None:
        kwargs["lanes"] = target.lanes  # the slice's memory layout, not this host's
        kwargs["copies_stacks"] = target.copies_16bit_stacks
    offload, weights = request.memory.offload, request.memory.weights_dtype
    mode = dict(offload=offload, weights_dtype=weights)
    length = f"{request.frames} frames" if segment is None else f"segments of {segment} frames"
    print(
        f"{request.model}: {request.width}x{request.height}, {length}, "
        f"{count} device{'s' if count != 1 else ''}, "
        f"--offload {offload} --weights_dtype {weights}{_matmuls(request, target)}"
    )
    meshes = [requested] if requested else mesh_plans.candidate_meshes(count, request.use_fsdp)
    if requested:
        result = plan(model, requested, **kwargs, **mode)
        print(result.table())
        fits, focus = result.fits, requested
    else:
        plans = [plan(model, m, **kwargs, **mode) for m in meshes]
        for p in plans:
            print(p.table())
        heads = model.transformer.num_attention_heads
        suggestion = mesh_plans.suggest_mesh(plans, heads)
        fits = suggestion is not None
        if suggestion is None:
            print(
                "no mesh fits; use more devices, --use_fsdp, --offload, --weights_dtype, or a smaller video"
            )
            focus = auto_mesh(count, heads, fsdp=request.use_fsdp)
        else:
            best = suggestion.plan
            print(f"suggested: --mesh {best.mesh.flag} (peak {best.peak / GiB:.2f} GiB)")
            print(f"  why: {suggestion.reason}")
            focus = best.mesh
    modes = mesh_plans.plan_modes(model, focus, weights, **kwargs)
    print(mesh_plans.mode_table(modes, (offload, weights)))
    if tpu is not None:
        focused = plan(model, focus, **kwargs, **mode)
        planned = {name: focused.on_device(name) for name in focused.stages}
        return _compile(request, tpu, target, focus, planned, model.gguf)
    if fits:
        return 0
    cheapest = mesh_plans.cheapest_fitting(model, meshes, weights, **kwargs)
    if cheapest is None:
        print(f"hint: no --offload / --weights_dtype mode fits {memory / GiB:.0f} GiB per device")
    else:
        on = "" if requested else f" --mesh {cheapest.mesh.flag}"
        print(f"hint: the cheapest mode that fits: {cheapest.mode}{on} (peak {cheapest.peak / GiB:.2f} GiB)")
    return 1


def _segment(request: PlanRequest, model: Any) -> int | None:
    """An Animate model's segment as its run makes it (``--segment_frame_length``, else the model's,
    rounded to ``4n+1``); None for another model, which takes no segment length."""
    from wanjax.pipeline.animate import segment_length

    if not model.transformer.animate:
        if request.segment_frame_length is not None:
            raise WanjaxError(f"--segment_frame_length is for an Animate model; {request.model} is not one")
        return None
    return segment_length(
        request.segment_frame_length or model.segment_frame_length, model.vae.temporal_factor
    )


def _matmuls(request: PlanRequest, target: Any) -> str:
    """What the DiT blocks' matmuls multiply on the target planned for (``--compile``'s, else this
    host): `` --activations_dtype auto (int8)``."""
    from wanjax.models.w8a8 import activations_name, int8_matmuls

    memory = request.memory
    int8 = int8_matmuls(memory.activations_dtype, memory.weights_dtype, target)
    return f" --activations_dtype {memory.activations_dtype} ({activations_name(int8, request.dtype)})"


def _check_cache_flags(request: PlanRequest) -> None:
    """A step cache is compiled (``--compile``), never estimated, and never calibrated by ``plan``."""
    if request.cache.cache_calibrate is not None:
        raise WanjaxError("plan runs nothing, so it cannot calibrate: drop --cache_calibrate")
    if request.cache.cache != "off" and request.compile is None:
        raise WanjaxError(
            f"--cache {request.cache.cache} needs --compile SLICE: plan's estimate does not count a step "
            "cache's state; the compiled step does"
        )


def _compile_slice(request: PlanRequest) -> tuple[Any, Any]:
    """The slice of ``--compile`` and its compile-only target, checked with the flags that go with
    it (before any work)."""
    from wanjax.chips import parse_slice
    from wanjax.tools.compile_target import parse_programs, slice_target

    tpu = parse_slice(request.compile or "")
    if request.model not in registry():
        raise WanjaxError(
            f"--compile takes a registry variant ({', '.join(registry())}), not {request.model!r}"
        )
    if request.programs is not None:
        parse_programs(request.programs)
    if request.num_devices not in (None, tpu.chips):
        raise WanjaxError(f"--num_devices {request.num_devices}: {tpu.name} has {tpu.chips} chips")
    return tpu, slice_target(tpu)


def _compile(
    request: PlanRequest, tpu: Any, target: Any, mesh: Any, planned: dict[str, int], gguf: Any
) -> int:
    """``plan --compile``: every program of the run on ``mesh`` compiled for ``tpu`` (``gguf``: the
    kept GGUF types of the component files, :attr:`wanjax.planning.models.Model.gguf`); exit 1
    unless each compiles and fits."""
    from wanjax.io.atomic import write_text
    from wanjax.jobs.opening import attention_spec
    from wanjax.target import building_for
    from wanjax.tools.compile_target import RunSpec, compile_run

    with building_for(target):
        attention = attention_spec(request.attention)  # checked for the TPU, not this machine
    run = RunSpec(
        registry()[request.model],
        request.height,
        request.width,
        request.frames,
        mesh,
        dtype=request.dtype,
        vae_dtype=request.vae_dtype,
        attention=attention,
        offload=request.memory.offload,
        weights_dtype=request.memory.weights_dtype,
        activations_dtype=request.memory.activations_dtype,
        gguf=gguf,
        cache=request.cache.config(),
        sparse=request.attention.sparse(),
        segment_frame_length=request.segment_frame_length,
    )
    only = None if request.programs is None else request.programs.split(",")  # checked by compile_run
    report = compile_run(run, tpu, planned, only, on_line=lambda line: print(line, flush=True))
    print(report.footer())
    if report.attention_density is not None:
        print(
            f"radial attention: {report.attention_density:.1%} of the self-attention blocks kept in a sparse step"
        )
    if request.json:
        write_text(Path(request.json), json.dumps(report.as_json(), indent=2) + "\n")
    return 0 if report.fits else 1


def _weights_summary(refs: dict) -> str:
    """Tensor count, parameters, bytes and the dtype mix, from the files' headers (no tensor read)."""

    import numpy as np

    counts: dict[str, int] = {}
    total_bytes = 0
    for ref in refs.values():
        size = math.prod(ref.shape)
        counts[str(ref.dtype)] = counts.get(str(ref.dtype), 0) + size
        total_bytes += size * np.dtype(ref.dtype).itemsize
    params = sum(counts.values()) or 1
    dtypes = ", ".join(f"{k} {v / params:.0%}" for k, v in sorted(counts.items()))
    return f"{len(refs)} tensors, {params / 1e6:.2f} M params, {total_bytes / 2**20:.1f} MiB ({dtypes})"
