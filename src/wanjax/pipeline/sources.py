"""Where a pipeline reads each component from (:class:`ComponentSources`): the model's directory, or
a component file: one component's weights in a single file (any layout and format, see
:mod:`wanjax.io.key_layouts` and :mod:`wanjax.io.weights_file`) over a base model that supplies
what the file does not (configs, tokenizer, scheduler); or, where the registry recognises the
file's variant, over that variant's own model.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from wanjax.errors import CheckpointError, WanjaxError
from wanjax.io.component import Component
from wanjax.io.weights_file import open_weights
from wanjax.models.registry import Variant, component_configs, registry
from wanjax.pipeline.components import COMPONENTS

FILE_COMPONENTS = ("transformer", "transformer_2", "vae", "text_encoder", "image_encoder")


def component_files(given: Mapping[str, Any]) -> dict[str, Path]:
    """``{folder: file}`` of the components ``given`` as paths (built components, other keys and None
    left out); CheckpointError for a file that does not exist."""
    out = {}
    for folder in FILE_COMPONENTS:
        value = given.get(folder)
        if not isinstance(value, str | Path):
            continue
        path = Path(value)
        if not path.is_file():
            raise CheckpointError(f"{path}: no such file (the --{folder} weights)")
        out[folder] = path
    return out


def recognise(folder: str, path: Path) -> tuple[str, Any]:
    """``(variant names, config)`` of a component file the registry recognises by its tensors' names
    and shapes; CheckpointError otherwise."""
    label, cfg, _ = COMPONENTS[folder].recognise(path, component_configs(folder))
    return label, cfg


def base_config(component: Component, base: Path | None) -> Any | None:
    """The base model's config of this component, or None where it has none."""
    if base is None:
        return None
    try:
        directory = component.directory(base)
    except CheckpointError:
        return None
    return component.read_config(directory)


def file_config(folder: str, path: Path, base: Path | None) -> Any:
    """The config of component ``folder``'s file ``path``: the base model's, checked against the file's
    tensors (a file of another variant fails here, naming both), else the registry's."""
    component = COMPONENTS[folder]
    cfg = base_config(component, base)
    if cfg is None:
        return recognise(folder, path)[1]
    return check_fit(folder, path, cfg, f"{base}'s {folder}/{component.config_file}")


def check_fit(folder: str, path: Path, cfg: Any, what: str) -> Any:
    """``cfg`` when component ``folder``'s file ``path`` holds its tensors; else CheckpointError naming
    the file's variant and ``what`` it was to fit."""
    if not COMPONENTS[folder].file_fit(path, cfg)[1]:
        try:
            label = f"a {recognise(folder, path)[0]} {folder}"
        except CheckpointError:
            label = f"a {folder} of another architecture"
        raise CheckpointError(f"{path}: {label}, which does not fit {what}; pass the --model it belongs to")
    return cfg


def kept_gguf_types(folder: str, path: Path, cfg: Any) -> dict[str, str]:
    """The GGUF type of each leaf (by its key path, :func:`jax.tree_util.keystr`) that
    ``--weights_dtype gguf`` keeps as stored, read from the file's header
    (:func:`wanjax.io.gguf_kernel.stored_type`): empty for a file that is not GGUF."""
    import jax

    from wanjax.io.checkpoint import LeafSource
    from wanjax.io.gguf_kernel import stored_type

    component = COMPONENTS[folder]
    stored = component.file_weights(path, cfg)
    refs = stored.open()
    spec = stored.spec(component, cfg, refs)
    leaves = jax.tree_util.tree_flatten_with_path(spec, is_leaf=lambda x: isinstance(x, LeafSource))[0]
    found = {jax.tree_util.keystr(key): stored_type(source, refs) for key, source in leaves}
    return {key: qtype for key, qtype in found.items() if qtype is not None}


def base_variant(files: Mapping[str, Path]) -> Variant:
    """The registry variant a run given component files and no ``--model`` is of: its transformer file
    recognised (a two-expert variant when a ``transformer_2`` file is given too)."""
    if "transformer" not in files:
        raise WanjaxError("without --model, give --transformer FILE (its variant names the base model)")
    label, _ = recognise("transformer", files["transformer"])
    experts = 2 if "transformer_2" in files else 1
    names = label.split(", ")
    found = [registry()[n] for n in names if registry()[n].experts == experts]
    if not found:
        raise WanjaxError(
            f"{files['transformer']}: a {label} transformer, which has "
            f"{'one expert: drop --transformer_2' if experts == 2 else 'two experts: give --transformer_2 too'}"
        )
    return found[0]


def base_model(variant: Variant) -> str:
    """The model name that supplies a recognised variant's other components: its hub repository, or
    the built-in demo of that name."""
    if variant.demo:
        return variant.name
    if variant.repo is None:
        raise WanjaxError(f"{variant.title} has no hub repository; pass --model")
    return variant.repo


@dataclasses.dataclass
class ComponentSources:
    """Where each component of a model is read from: ``path``, the model directory, or ``files``, a
    file given for it (``{folder: file}``); the configs read so far, each read once."""

    path: Path
    files: dict[str, Path]
    configs: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.path.is_file():  # a component's weights file given as the model
            raise CheckpointError(not_a_model(self.path))

    def config(self, component: Component) -> Any:
        """A component's config: the model's ``<folder>/config.json``; for a component given as a
        file, the same checked against the file, or the registry's where the model has none."""
        folder = component.folder
        if folder not in self.configs:
            file = self.files.get(folder)
            self.configs[folder] = (
                component.read_config(component.directory(self.path))
                if file is None
                else file_config(folder, file, self.path)
            )
        return self.configs[folder]

    def check(self, names: Sequence[str]) -> dict[str, Any]:
        """Each named component checked where it is read from, from configs and weights' headers only
        (no weight read); their configs by name. A directory of component folders lacking one of
        them is named as such (:func:`not_a_model`)."""
        if any(n not in self.files and not (self.path / n).is_dir() for n in names):
            problem = not_a_model(self.path)
            if problem is not None:
                raise CheckpointError(problem)
        return {
            name: self.config(COMPONENTS[name]) if name in self.files else COMPONENTS[name].check(self.path)
            for name in names
        }

    def weights(self, component: Component) -> tuple[Path, Any]:
        """``(path, config)`` a loader reads a component from: its file with its config, or the model
        (config None: the loader reads the model's)."""
        file = self.files.get(component.folder)
        return (self.path, None) if file is None else (file, self.config(component))


@dataclasses.dataclass(frozen=True)
class FileDescription:
    """What a component file holds: its component, the variants it is of, its layout and name prefix,
    its parameters, and its tensors by stored dtype or quantisation (``float8_e4m3fn scaled``, GGUF's
    ``Q4_K``...)."""

    folder: str
    variants: str
    layout: str
    prefix: str
    params: int
    kinds: dict[str, int]

    @property
    def summary(self) -> str:
        """``Wan transformer (T2V-1.3B), diffusers layout`` (and the names' prefix, if any)."""
        prefix = f", names prefixed {self.prefix!r}" if self.prefix else ""
        return f"Wan {self.folder} ({self.variants}), {self.layout} layout{prefix}"


def stored_kind(ref: Any) -> str:
    """How one tensor is stored: its GGUF quantisation, ``<8-bit dtype> scaled``, or its dtype."""
    if hasattr(ref, "quant_type"):
        return ref.quant_type
    values = getattr(ref, "values", None)
    return f"{values.dtype} scaled" if values is not None else str(ref.dtype)


def describe_file(path: Path) -> FileDescription:
    """The component a weights file holds, recognised through the registry (every component that takes
    files, in turn); CheckpointError naming the first layout recognised, or none."""
    refs = open_weights(path)  # an unreadable, truncated or foreign-format file fails as itself
    first_error: CheckpointError | None = None
    for folder in ("transformer", "vae", "text_encoder", "image_encoder"):
        try:
            label, _, stored = COMPONENTS[folder].recognise(path, component_configs(folder), refs)
        except CheckpointError as e:
            if first_error is None or ("layout, but" in str(e) and "layout, but" not in str(first_error)):
                first_error = e
            continue
        kinds = Counter(stored_kind(ref) for ref in refs.values())
        params = sum(math.prod(ref.shape) for ref in refs.values())
        return FileDescription(folder, label, stored.layout.name, stored.prefix, params, dict(kinds))
    if first_error is not None and "layout, but" in str(first_error):
        raise first_error
    raise CheckpointError(
        f"{path}: not a Wan component file (transformer, VAE, text or image encoder) or LoRA"
    )


def not_a_model(path: Path) -> str | None:
    """What ``path``, given as a model, holds instead and how to use it, as a one-line error: a
    component's weights file (its :func:`describe_file`), or a directory of component folders
    without ``model_index.json`` (what ``wanjax convert`` writes without ``--model``); None for
    anything else."""
    from wanjax.pipeline.model_index import INDEX_FILE

    if path.is_file():
        try:
            d = describe_file(path)
        except CheckpointError:
            return f"{path} is a file, not a model: pass a diffusers model directory, a hub id or demo"
        return (
            f"{path} is a weights file, not a model: a {d.summary}; give it as --{d.folder} {path} "
            "(with --model for the rest)"
        )
    if not path.is_dir() or (path / INDEX_FILE).is_file():
        return None
    held, usable = [], []
    for folder in FILE_COMPONENTS:
        component = COMPONENTS[folder]
        if not (path / folder / component.marker).is_file():
            continue
        files = [path / folder / f"{stem}.safetensors" for stem in component.weight_stems]
        file = next((f for f in files if f.is_file()), None)
        if file is None:  # sharded: no one file to give
            held.append(f"{folder}/ (sharded)")
            continue
        try:
            held.append(f"{folder}/ with a {describe_file(file).summary}")
        except CheckpointError:
            held.append(f"{folder}/")
        usable.append(f"--{folder} {file}")
    if not held:
        return None
    use = ""
    if usable:
        them = "it" if len(usable) == 1 else "them"
        use = f"give {them} as {' '.join(usable)} (with --model for the rest), or "
    return (
        f"{path} holds component folders, not a whole model (no {INDEX_FILE}): {' and '.join(held)}, as "
        f"`wanjax convert` writes without --model; {use}convert again with --model BASE for a whole model"
    )
