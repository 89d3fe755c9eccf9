"""One description per component of a diffusers-layout model directory.

A :class:`Component` says once where a component lives (its folder), how its config is read (class
and file), which files hold its weights (safetensors stems), how its checkpoint tensors become a
params tree with each leaf's logical axes (a :class:`~wanjax.io.checkpoint.LeafSource` tree), and
which stored tensors it does not use. Loaders, pre-flight checks, ``wanjax info``, ``wanjax plan``,
the demo model and random initialisation all read the same description.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from wanjax.errors import CheckpointError, ConfigError, WanjaxError
from wanjax.io.checkpoint import TensorRef, check_checkpoint, load_params, open_component
from wanjax.io.finite import check_finite
from wanjax.io.key_layouts import DIFFUSERS, KeyLayout, matches, overlap, rename_spec, strip_prefix
from wanjax.io.quant import leaf_builder
from wanjax.io.quantizable import UNQUANTIZED
from wanjax.io.weights_file import open_weights

SpecFn = Callable[[Any, Collection[str]], Any]  # (config, stored tensor names) -> LeafSource tree
RECOGNISED = 0.5  # a file whose names cover this fraction of a layout's is in that layout


def read_config_file(cls: Any, path: Path) -> Any:
    """``cls.from_file(path)``, every malformed-file failure a ConfigError naming the file."""
    try:
        return cls.from_file(path)
    except WanjaxError:
        raise
    except (OSError, UnicodeDecodeError, RecursionError) as e:
        raise ConfigError(f"{path}: cannot read ({getattr(e, 'strerror', None) or e})") from None
    except (TypeError, ValueError, AttributeError, KeyError) as e:
        raise ConfigError(f"{path}: malformed config ({type(e).__name__}: {e})") from None


def _uses_everything(name: str) -> bool:
    return False


@dataclasses.dataclass(frozen=True)
class Component:
    """A model component: folder, config, weight files, params spec and ignored tensors.

    ``config``: a class with ``from_file(path)`` (None: the component has no config file, e.g. the
    tokenizer); ``files``: files the folder must hold besides the config and weights; ``spec``:
    ``(config, names) -> LeafSource tree`` (None: no weights); ``ignore``: stored tensor names that
    are not an error though no leaf reads them; ``layouts``: the other namings single files of this
    component use (:class:`~wanjax.io.key_layouts.KeyLayout`; diffusers' is always known).
    """

    folder: str
    config: Any = None
    config_file: str = "config.json"
    weight_stems: tuple[str, ...] = ()
    spec: SpecFn | None = None
    ignore: Callable[[str], bool] = _uses_everything
    files: tuple[str, ...] = ()
    layouts: tuple[KeyLayout, ...] = ()

    @property
    def has_weights(self) -> bool:
        return self.spec is not None

    @property
    def marker(self) -> str:
        """The file that shows a folder holds this component: its config, else its first required file."""
        return self.config_file if self.config is not None else (self.files or ("",))[0]

    def directory(self, path: str | Path) -> Path:
        """``path`` may be a model root (holding ``<folder>/``) or the component folder itself."""
        path = Path(path)
        if not path.exists():
            raise CheckpointError(f"{path}: model path does not exist")
        marker = self.marker
        if (path / self.folder / marker).exists():
            return path / self.folder
        if (path / marker).exists() and marker:
            return path
        raise CheckpointError(
            f"{path}: no {self.folder}/{marker}; pass a diffusers model directory or its {self.folder}/ folder"
        )

    def read_config(self, directory: Path) -> Any:
        """The component's config (see :func:`read_config_file`)."""
        return read_config_file(self.config, directory / self.config_file)

    def open_weights(self, directory: Path) -> dict[str, TensorRef]:
        """The component's tensors (single file or shards; headers read, no tensor)."""
        return open_component(directory, self.weight_stems)

    def checkpoint_spec(self, cfg: Any, refs: Collection[str]) -> Any:
        """The LeafSource tree for this config and these stored tensor names."""
        try:
            return self.spec(cfg, refs)  # type: ignore[misc]
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            raise ConfigError(
                f"{self.folder}/{self.config_file}: values of the wrong type or range ({e})"
            ) from None

    def check(self, root: str | Path) -> Any:
        """Check the component from its files' headers only (no weight is read): present, its config
        parses, weights are safetensors, shards complete, tensor names and shapes match the config.
        Returns the config (None for a component without one)."""
        root = Path(root)
        marker = self.marker
        if not (root / self.folder / marker).exists() and not (root / marker).exists():
            what = "/ component folder" if not (root / self.folder).is_dir() else f"/{marker}"
            raise CheckpointError(f"{root}: model lacks its {self.folder}{what}; is the download complete?")
        directory = self.directory(root)
        cfg = self.read_config(directory) if self.config is not None else None
        if self.has_weights:
            refs = self.open_weights(directory)
            check_checkpoint(refs, self.checkpoint_spec(cfg, refs), str(directory), self.ignore)
        return cfg

    def load(
        self,
        path: str | Path,
        dtype: Any,
        sharding: Any = None,
        weights_dtype: str = UNQUANTIZED,
        config: Any = None,
    ) -> tuple[Any, Any]:
        """``(config, params)``: every weight read straight into its shards (``sharding(source)``);
        ``weights_dtype`` ``int8``/``fp8`` stores the matmul kernels in 8 bits
        (:func:`wanjax.io.quant.leaf_builder`), ``bf16`` keeps every weight in ``dtype``. ``path``: a
        model root, the component's folder, or one weights file (then ``config`` says what it holds)."""
        build = leaf_builder(weights_dtype)  # an unknown name fails before any file is read
        cfg, stored = self.stored(path, config)
        refs = stored.open()
        spec = stored.spec(self, cfg, refs)
        params = load_params(
            refs, spec, dtype, stored.where, sharding=sharding, ignore=stored.ignore, build=build
        )
        check_finite(params, stored.where)
        return cfg, params

    # ------------------------------------------------------------------------------------------
    # Where the weights are: a diffusers folder, or one file in any layout (wanjax.io.key_layouts)

    def location(self, path: str | Path) -> Path:
        """A weights file as it is; else the component's folder of a model root (or that folder)."""
        path = Path(path)
        return path if path.is_file() else self.directory(path)

    def config_at(self, path: str | Path, config: Any = None) -> Any:
        """``config`` when given, else the config of a model root or component folder; ConfigError for
        a single weights file, which names none."""
        if config is not None:
            return config
        where = self.location(path)
        if where.is_file():
            raise ConfigError(f"{where}: a single {self.folder} file needs a config (pass --model with one)")
        return self.read_config(where)

    def stored(self, path: str | Path, config: Any = None) -> tuple[Any, Stored]:
        """``(config, stored weights)`` of a model root or component folder (its config read unless
        ``config`` is given), or of one weights file (``config`` required: the base's or the
        registry's, see :func:`wanjax.pipeline.sources.file_config`)."""
        where, cfg = self.location(path), self.config_at(path, config)
        if where.is_file():
            return cfg, self.file_weights(where, cfg)
        stems = self.weight_stems
        return cfg, Stored(str(where), lambda: open_component(where, stems), DIFFUSERS, self.ignore)

    def file_weights(self, path: Path, cfg: Any, refs: dict[str, Any] | None = None) -> Stored:
        """One weights file's tensors as this config names them: the layout (and prefix) whose
        renamed spec covers most of the file's names; CheckpointError when none covers half.
        ``refs``: the file's tensors, when opened already."""
        return self.file_fit(path, cfg, refs)[0]

    def file_fit(self, path: Path, cfg: Any, refs: dict[str, Any] | None = None) -> tuple[Stored, bool]:
        """:meth:`file_weights`, and whether the file holds exactly this config's tensors (names and
        shapes, ignored ones aside); the file is opened once."""
        refs = open_weights(path) if refs is None else refs
        best: tuple[float, KeyLayout, str, dict[str, Any]] | None = None
        for layout in (DIFFUSERS, *self.layouts):
            for prefix in layout.prefixes:
                found, stripped = strip_prefix(refs, (prefix,))
                if found != prefix:
                    continue
                named = layout.views(stripped)
                score = overlap(rename_spec(self.checkpoint_spec(cfg, named), layout), named)
                if best is None or score > best[0]:
                    best = (score, layout, prefix, named)
        if best is None or best[0] < RECOGNISED:
            raise CheckpointError(f"{path}: not a Wan {self.folder} file ({self._layout_names()})")
        _, layout, prefix, named = best
        ignore = self.ignore if layout is DIFFUSERS else layout.ignore
        stored = Stored(
            str(path),
            lambda: layout.views(strip_prefix(open_weights(path), (prefix,))[1]),
            layout,
            ignore,
            prefix,
        )
        return stored, matches(stored.spec(self, cfg, named), named, ignore)

    def recognise(
        self, path: Path, candidates: Collection[tuple[str, Any]], refs: dict[str, Any] | None = None
    ) -> tuple[str, Any, Stored]:
        """``(label, config, stored weights)`` of the first candidate ``(label, config)`` whose tensors,
        names and shapes, the file holds in some layout; CheckpointError naming the layout when the
        names are recognised but no candidate's shapes are. ``refs``: the file's tensors, when opened
        already (the file is opened once)."""
        refs = open_weights(path) if refs is None else refs
        closest: Stored | None = None
        for label, cfg in candidates:
            try:
                stored, fits = self.file_fit(path, cfg, refs)
            except CheckpointError:
                continue
            if fits:
                return label, cfg, stored
            closest = closest or stored
        if closest is None:
            raise CheckpointError(f"{path}: not a Wan {self.folder} file ({self._layout_names()})")
        raise CheckpointError(
            f"{path}: a {self.folder} in the {closest.layout.name} layout, but of no variant wanjax knows "
            f"({', '.join(dict.fromkeys(label for label, _ in candidates))}); pass --model with a diffusers "
            f"directory whose {self.folder}/{self.config_file} describes it"
        )

    def _layout_names(self) -> str:
        names = ", ".join(layout.name for layout in (DIFFUSERS, *self.layouts))
        return f"its tensor names are in none of the layouts wanjax reads: {names}"


@dataclasses.dataclass(frozen=True)
class Stored:
    """A component's stored weights: where (shown in errors), how to open them (tensors by name, any
    file prefix removed), the layout they are named in, which stored tensors no leaf reads, and the
    prefix the file's names carry."""

    where: str
    open: Callable[[], dict[str, Any]]
    layout: KeyLayout
    ignore: Callable[[str], bool]
    prefix: str = ""

    def rename(self, spec: Any) -> Any:
        """A LeafSource tree in diffusers names, named as these weights are."""
        return rename_spec(spec, self.layout)

    def spec(self, component: Component, cfg: Any, refs: Collection[str]) -> Any:
        """The component's spec for ``cfg``, named as these weights are."""
        return self.rename(component.checkpoint_spec(cfg, refs))
