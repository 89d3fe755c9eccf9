"""``wanjax convert``: component files of any layout and format (:mod:`wanjax.pipeline.sources`)
written as a diffusers-layout model directory, for users who want to move to one.

Each file's tensors are read through its component's one spec renamed into the file's layout, and
written under diffusers' names in ``--dtype`` (GGUF and fp8-scaled weights dequantised), sharded
like diffusers' ``save_pretrained`` (5 GiB files and an index); its config beside them. With
``--model``, the base's other components are copied too, so the output is a whole model (without,
what it holds and how to use it is printed). The directory appears only when complete.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import jax
import numpy as np
from safetensors.numpy import save_file

from wanjax.errors import ConfigError, WanjaxError
from wanjax.io.checkpoint import LeafSource
from wanjax.io.component import Component
from wanjax.jobs.flags import option
from wanjax.jobs.groups import ComponentFileFlags
from wanjax.jobs.requests import Request
from wanjax.models.config import parse_dtype
from wanjax.pipeline.components import COMPONENTS
from wanjax.pipeline.hub import resolve_model
from wanjax.pipeline.sources import file_config, not_a_model

SHARD_BYTES = 5 * 2**30  # diffusers' default max_shard_size
# the diffusers classes whose configs wanjax writes itself (the encoders' configs are transformers'
# and come from the base model)
CLASS_NAMES = {
    "transformer": "WanTransformer3DModel",
    "transformer_2": "WanTransformer3DModel",
    "vae": "AutoencoderKLWan",
}


@dataclasses.dataclass(frozen=True)
class ConvertRequest(Request):
    """``wanjax convert``: component files to a diffusers-layout directory."""

    command: ClassVar[str] = "convert"
    output: str = option(help="the diffusers-layout directory to write (must not exist)", positional=True)
    model: str | None = option(
        help="base model whose other components (and configs) the output gets (default: none)"
    )
    dtype: str = option(
        "bfloat16", help="dtype of the written tensors (default {default}; float32 keeps every value)"
    )
    files: ComponentFileFlags = dataclasses.field(default_factory=ComponentFileFlags)


def run_request(request: ConvertRequest) -> None:
    """Convert; print what was written."""
    given = {folder: Path(path) for folder, path in request.files.given().items()}
    if not given:
        raise WanjaxError("nothing to convert: give --transformer FILE (or --vae, --text_encoder, ...)")
    output = Path(request.output)
    if output.exists():
        raise WanjaxError(f"{output} exists; give a new directory to write")
    dtype = np.dtype(parse_dtype(request.dtype))
    base = resolve_model(request.model).path if request.model else None
    for folder in given:
        if folder not in CLASS_NAMES and base is None:
            raise ConfigError(f"--{folder}: its config comes from a base model; add --model")
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=output.parent, prefix=f".{output.name}.") as tmp:
        work = Path(tmp) / output.name
        work.mkdir()
        if base is not None:
            copy_base(base, work, exclude=set(given))
        for folder, path in given.items():
            write_component(COMPONENTS[folder], path, base, work / folder, dtype)
            print(f"{folder}: {path} -> {output / folder}")
        work.rename(output)
    print(f"wrote {output}")
    if base is None:  # how the folders alone are used
        print(not_a_model(output))


def copy_base(base: Path, out: Path, exclude: set[str]) -> None:
    """The base model's files, less the folders of the converted components."""
    for item in base.iterdir():
        if item.name in exclude:
            continue
        if item.is_dir():
            shutil.copytree(item, out / item.name)
        else:
            shutil.copy2(item, out / item.name)


def write_component(component: Component, path: Path, base: Path | None, out: Path, dtype: np.dtype) -> None:
    """One component file as a diffusers folder: its config and its tensors under diffusers' names."""
    cfg = file_config(component.folder, path, base)
    stored = component.file_weights(path, cfg)
    refs = stored.open()
    spec = component.checkpoint_spec(cfg, refs)
    names = [
        (ours, theirs)
        for diffusers_source, file_source in zip(_sources(spec), _sources(stored.rename(spec)), strict=True)
        for ours, theirs in zip(diffusers_source.names, file_source.names, strict=True)
    ]
    out.mkdir(parents=True, exist_ok=True)
    config = cfg.to_dict()
    if component.folder in CLASS_NAMES:
        config.setdefault("_class_name", CLASS_NAMES[component.folder])
    else:  # the base's own config file (transformers' fields wanjax does not keep)
        config = json.loads((component.directory(base) / component.config_file).read_text())  # type: ignore[arg-type]
    (out / component.config_file).write_text(json.dumps(config, indent=2) + "\n")
    stem = component.weight_stems[0]
    written: list[tuple[Path, list[str]]] = []  # shards as written, named when their count is known
    total = 0
    for k, shard in enumerate(_shards((ours, refs[theirs].array().astype(dtype)) for ours, theirs in names)):
        written.append((out / f".shard-{k}", list(shard)))
        save_file(shard, written[-1][0])
        total += sum(v.nbytes for v in shard.values())
    if len(written) == 1:
        written[0][0].rename(out / f"{stem}.safetensors")
        return
    weight_map = {}
    for k, (file, tensors) in enumerate(written, 1):
        name = f"{stem}-{k:05d}-of-{len(written):05d}.safetensors"
        file.rename(out / name)
        weight_map.update(dict.fromkeys(tensors, name))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / f"{stem}.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _shards(tensors: Iterator[tuple[str, np.ndarray]]) -> Iterator[dict[str, np.ndarray]]:
    """Tensors grouped into shards of at most :data:`SHARD_BYTES` (a larger tensor alone)."""
    shard: dict[str, np.ndarray] = {}
    size = 0
    for name, value in tensors:
        if shard and size + value.nbytes > SHARD_BYTES:
            yield shard
            shard, size = {}, 0
        shard[name] = np.ascontiguousarray(value)
        size += value.nbytes
    if shard:
        yield shard


def _sources(spec: object) -> list[LeafSource]:
    return jax.tree.leaves(spec, is_leaf=lambda x: isinstance(x, LeafSource))
