"""Opening the pipeline a request names: the processes joined, the mesh, the attention backend
checked against this platform, the model's defaults. No weight is read here."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from wanjax.jobs.groups import (
    DEFAULT_DTYPE,
    DEFAULT_MODEL,
    AttentionFlags,
    ComponentFileFlags,
    LoraFlags,
    MemoryFlags,
    ParallelFlags,
    VaeFlags,
)
from wanjax.kernels.attention import AttentionSpec, resolve_backend
from wanjax.kernels.common import check_block
from wanjax.models.registry import Defaults
from wanjax.parallel.mesh import MeshSpec, mesh_spec_from_flags, parse_mesh
from wanjax.parallel.multihost import initialize
from wanjax.pipeline.demo import demo_variants
from wanjax.pipeline.hub import ModelSource
from wanjax.pipeline.pipeline import WanPipeline


def begin(parallel: ParallelFlags) -> float:
    """Join the other processes of a multi-process run (before anything touches a device); the
    start time of the run."""
    initialize(parallel.coordinator_address, parallel.num_processes, parallel.process_id)
    return time.perf_counter()


def model_label(source: ModelSource) -> str:
    """How a model is recorded in stage configs: ``demo``, a hub id, or an absolute path."""
    if source.is_demo and source.name in demo_variants():
        return source.name
    return source.name if not Path(source.name).exists() else str(Path(source.name).resolve())


FILES_KEY = "component_files"  # where a stage config records the component files its stage read


def stage_files(files: ComponentFileFlags, earlier: Mapping[str, Any]) -> ComponentFileFlags:
    """A stage's component files: those given to it, else those an earlier stage recorded."""
    recorded = earlier.get(FILES_KEY) or {}
    return ComponentFileFlags(**{**recorded, **files.given()})


def files_record(files: ComponentFileFlags) -> dict[str, dict[str, str]]:
    """What a stage config records of its component files (absolute paths), if any."""
    given = {name: str(Path(path).resolve()) for name, path in files.given().items()}
    return {FILES_KEY: given} if given else {}


def open_pipeline(
    request: Any,
    mesh: MeshSpec | str | None,
    fsdp: bool,
    *,
    model: str | None = None,
    dtype: str | None = None,
    revision: str | None = None,
    files: ComponentFileFlags | None = None,
) -> WanPipeline:
    """The pipeline a request runs on, with the settings of the flag groups it has (a stage may take
    its ``model``, ``dtype``, ``revision`` and component ``files`` from the stage before): the model (a
    hub model at the revision; none with a ``--transformer`` file: its variant's), the components
    given as files read from them; its LoRAs are read and checked against the transformer's config
    here, before any weight."""
    from wanjax.models.vae import Tiling

    common = request.common
    memory: MemoryFlags = getattr(request, "memory", MemoryFlags())
    vae: VaeFlags = getattr(request, "vae", VaeFlags())
    attention: AttentionFlags = getattr(request, "attention", AttentionFlags())
    adapters: LoraFlags = getattr(request, "adapters", LoraFlags())
    given = (files or request.files).given()
    model = model or common.model
    return WanPipeline.from_pretrained(
        model or (None if "transformer" in given else DEFAULT_MODEL),
        dtype or getattr(request, "dtype", None) or DEFAULT_DTYPE,
        vae_dtype=vae.vae_dtype,
        vae_weights_dtype=vae.vae_weights_dtype,
        precision=getattr(request, "precision", None),
        vae_precision=vae.vae_precision,
        vae_decode_chunk=vae.vae_decode_chunk,
        vae_tiling=Tiling.parse(vae.vae_tiling) if vae.vae_tiling else None,
        attention_backend=attention_spec(attention),
        jax_cache_dir=common.jax_cache_dir if common.jax_cache_dir is not None else True,
        mesh=mesh,
        fsdp=fsdp,
        revision=revision or common.revision,
        download=common.download,
        offload=memory.offload,
        weights_dtype=memory.weights_dtype,
        activations_dtype=memory.activations_dtype,
        loras=adapters.loras(),
        loras_2=adapters.loras_2(),
        **given,
    )


def attention_spec(flags: AttentionFlags) -> AttentionSpec:
    """The attention backend and options, checked against this platform now (an unavailable
    backend fails before any weight is read)."""
    spec = AttentionSpec(
        flags.backend,
        block_q=flags.bqsize,
        block_kv=flags.bkvsize,
        block_kv_compute=flags.bkvcomputesize,
        block_kv_compute_in=flags.bkvcomputeinsize,
        k_smooth=flags.use_k_smooth,
        window_size=flags.window_size,
    )
    resolve_backend(spec.backend)
    for name, value in flags.blocks().items():
        check_block(name, value)
    return spec


def device_count() -> int:
    """The devices a request's mesh may span: every device this process sees."""
    import jax

    return jax.device_count()


def mesh_request(parallel: ParallelFlags) -> tuple[MeshSpec | str | None, bool]:
    """``(mesh, fsdp)`` from ``--mesh`` or the reference's aliases; ``auto`` when more than one device
    is visible and nothing is said, one device otherwise."""
    mesh, fsdp = parallel.mesh, parallel.use_fsdp
    if parallel.use_dp or parallel.sp_num:
        spec = mesh_spec_from_flags(mesh, device_count(), use_dp=parallel.use_dp, sp_num=parallel.sp_num)
        return spec, fsdp
    if mesh is None:
        return ("auto" if device_count() > 1 or fsdp else None), fsdp
    return (mesh if mesh == "auto" else parse_mesh(mesh)), fsdp  # a bad string fails now, before any work


def defaults_of(pipe: WanPipeline) -> Defaults:
    """The video and sampling defaults of the pipeline's model (the registry's, as the Python API's)."""
    return pipe.defaults
