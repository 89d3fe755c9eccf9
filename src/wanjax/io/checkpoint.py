"""Loading diffusers-layout checkpoints (safetensors only) into params pytrees.

A component directory (``transformer/``, ``vae/``, ``text_encoder/``) holds one
``<stem>.safetensors`` file or shards plus ``<stem>.safetensors.index.json``. Files are opened with
``safetensors.safe_open`` (which checks each header), and bytes are read only when a leaf is
materialised. Each leaf is built with ``jax.make_array_from_callback``: a device's shard is read as
the matching slice of the stored tensors (for layouts that only transpose, see :class:`Transpose`),
so a caller that passes shardings gets no full host copy per device.

Models describe their checkpoint with a tree of :class:`LeafSource` (which tensor names feed each
leaf, how to lay them out, whether they stay float32); :func:`load_params` checks the whole
checkpoint against that tree before reading any bytes.

8-bit float tensors (safetensors ``F8_E4M3``, ``F8_E5M2``), which NumPy has no dtype for, are read
from the file's bytes at the offsets its header gives, as ``ml_dtypes`` float8 arrays.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import jax
import ml_dtypes
import numpy as np
from safetensors import SafetensorError, safe_open

from wanjax.errors import CheckpointError
from wanjax.target import current_target

_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
_MAX_LISTED = 12

Index = tuple[slice, ...]  # what jax.make_array_from_callback asks for: one slice per dimension

# safetensors dtypes that safe_open(framework="numpy") cannot give (NumPy has no float8): read as bytes
_RAW_DTYPES: dict[str, np.dtype] = {
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
}


@dataclasses.dataclass(frozen=True)
class TensorRef:
    """One tensor of a file opened with ``safe_open``; indexing it reads only the slice asked for.

    ``offset``: for dtypes safe_open cannot give (:data:`_RAW_DTYPES`), the file position of the
    tensor's bytes, which are then read through a read-only memory map (None: read with safe_open).
    """

    name: str
    file: Path
    dtype: np.dtype
    shape: tuple[int, ...]
    handle: Any = dataclasses.field(repr=False, compare=False)  # the file's safe_open, shared by its tensors
    offset: int | None = dataclasses.field(default=None, repr=False, compare=False)

    def __getitem__(self, index: Index) -> np.ndarray:
        """``tensor[index]`` (a slice per dimension), read from the file."""
        if self.offset is not None:
            return self._mapped(index)
        if math.prod(self.shape) == 0:  # safe_open's slices reject empty dimensions
            return self.array()[index]
        return self.handle.get_slice(self.name)[index]

    def array(self) -> np.ndarray:
        """The whole tensor, read from the file."""
        if self.offset is not None:
            return self._mapped(tuple(slice(None) for _ in self.shape))
        return self.handle.get_tensor(self.name)

    def _mapped(self, index: Index) -> np.ndarray:
        """A copy of ``tensor[index]`` read through a memory map of the file (closed on return)."""
        if math.prod(self.shape) == 0:  # nothing to map
            return np.empty(self.shape, self.dtype)[index]
        mapped = np.memmap(self.file, self.dtype, "r", offset=self.offset, shape=self.shape)
        return np.array(mapped[index])  # a copy: the map is released with ``mapped``


@dataclasses.dataclass(frozen=True)
class ArrayRef:
    """An in-memory tensor standing where a :class:`TensorRef` would (random weights)."""

    value: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)

    @property
    def dtype(self) -> np.dtype:
        return self.value.dtype

    def __getitem__(self, index: Index) -> np.ndarray:
        return self.value[index]

    def array(self) -> np.ndarray:
        return self.value


Ref = TensorRef | ArrayRef


def open_safetensors(path: Path) -> dict[str, TensorRef]:
    """The tensors of one safetensors file (its header checked; no tensor read)."""
    try:
        handle = safe_open(path, framework="numpy")
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror or e})") from None
    except SafetensorError as e:
        reason = str(e).removeprefix("Error while deserializing header: ")
        if reason.startswith("incomplete metadata"):  # a valid header, but not the file size it implies
            raise _truncated(path) or _corrupt(path, reason) from None
        raise _corrupt(path, reason) from None
    names = handle.keys()
    slices = {name: handle.get_slice(name) for name in names}
    offsets: dict[str, int] = {}
    if any(s.get_dtype() in _RAW_DTYPES for s in slices.values()):
        n, header = _read_header(path)  # safe_open has checked it: every tensor lies inside the file
        offsets = {name: 8 + n + info["data_offsets"][0] for name, info in header.items()}
    return {name: _tensor_ref(path, handle, name, s, offsets.get(name)) for name, s in slices.items()}


def _tensor_ref(path: Path, handle: Any, name: str, stored: Any, offset: int | None) -> TensorRef:
    shape = tuple(stored.get_shape())
    raw = _RAW_DTYPES.get(stored.get_dtype())
    if raw is not None:  # open_safetensors gives these an offset
        return TensorRef(name, path, raw, shape, handle, offset)
    try:  # NumPy's dtype as safe_open gives it, from a read of at most one element
        dtype = (stored[:0] if math.prod(shape) > 1 else handle.get_tensor(name)).dtype
    except (AttributeError, SafetensorError):
        raise CheckpointError(f"{path}: tensor {name} has unsupported dtype {stored.get_dtype()}") from None
    return TensorRef(name, path, dtype, shape, handle)


def _corrupt(path: Path, reason: str) -> CheckpointError:
    return CheckpointError(f"{path}: corrupt safetensors header ({reason})")


def _truncated(path: Path) -> CheckpointError | None:
    """The error for a file that ends before its (valid) header's last tensor does, as after an
    interrupted download, or None; safe_open rejects such a file without saying why."""
    size = path.stat().st_size
    n, header = _read_header(path)
    ends = {name: 8 + n + info["data_offsets"][1] for name, info in header.items()}
    name = max(ends, key=ends.__getitem__, default=None)
    if name is None or ends[name] <= size:
        return None
    return CheckpointError(
        f"{path}: truncated file: tensor {name} ends at byte {ends[name]} "
        f"but the file has {size} bytes; download it again"
    )


def _read_header(path: Path) -> tuple[int, dict[str, Any]]:
    """``(header length, header)`` of a safetensors file: each tensor's ``dtype``, ``shape`` and
    ``data_offsets`` (from the end of the header), ``__metadata__`` left out."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return n, header


def open_component(directory: str | Path, stems: Iterable[str]) -> dict[str, TensorRef]:
    """All tensors of a component directory, single-file or sharded.

    ``stems`` are the weight file names to look for, in order (e.g. ``diffusion_pytorch_model`` for
    diffusers models, ``model`` for transformers models).
    """
    directory = Path(directory)
    stems = tuple(stems)
    for stem in stems:
        index = directory / f"{stem}.safetensors.index.json"
        if index.exists():
            return _open_sharded(index)
        single = directory / f"{stem}.safetensors"
        if single.exists():
            return open_safetensors(single)
    pickles = sorted(p.name for p in directory.glob("*") if p.suffix in _PICKLE_SUFFIXES)
    if pickles:
        raise CheckpointError(
            f"{directory}: only pickle weights ({', '.join(pickles)}); wanjax loads safetensors only "
            "(convert with diffusers: save_pretrained(..., safe_serialization=True))"
        )
    expected = " or ".join(f"{s}.safetensors[.index.json]" for s in stems)
    raise CheckpointError(f"{directory}: no weights found (expected {expected})")


def _open_sharded(index_path: Path) -> dict[str, TensorRef]:
    try:
        weight_map: dict[str, str] = json.loads(index_path.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError):
        raise CheckpointError(f"{index_path}: not a valid shard index (no weight_map)") from None
    except OSError as e:
        raise CheckpointError(f"{index_path}: cannot read ({e.strerror or e})") from None
    if not isinstance(weight_map, dict) or not all(
        isinstance(f, str) and f and "/" not in f for f in weight_map.values()
    ):
        raise CheckpointError(f"{index_path}: not a valid shard index (weight_map must map names to files)")
    files = sorted(set(weight_map.values()))
    missing = [f for f in files if not (index_path.parent / f).is_file()]
    if missing:
        raise CheckpointError(f"{index_path}: shard file(s) missing: {_listing(missing)}")
    refs: dict[str, TensorRef] = {}
    for f in files:
        refs.update(open_safetensors(index_path.parent / f))
    unindexed = [name for name in weight_map if name not in refs]
    if unindexed:
        raise CheckpointError(
            f"{index_path}: tensors named in the index but absent from the shards: {_listing(unindexed)}"
        )
    return refs


# ----------------------------------------------------------------------------------------------
# Mapping checkpoint tensors to params leaves


def identity(a: np.ndarray) -> np.ndarray:
    return a


@dataclasses.dataclass(frozen=True)
class Transpose:
    """A layout that only permutes axes, ``a.transpose(axes)``: a slice of the leaf is read as the
    matching slice of the stored tensor (any other layout reads whole tensors)."""

    axes: tuple[int, ...]

    def __call__(self, a: np.ndarray) -> np.ndarray:
        return a.transpose(self.axes)

    def stored_index(self, index: Index) -> Index:
        """The slice of the stored tensor that ``index`` (in our layout) selects."""
        return tuple(index[self.axes.index(axis)] for axis in range(len(self.axes)))


# PyTorch ``Linear.weight`` (out, in) -> our kernel (in, out): y = x @ kernel
linear_kernel = Transpose((1, 0))


Axes = tuple[str | None, ...]
REPLICATED = "replicated"  # ``axes=REPLICATED``: every dimension whole on every device


@dataclasses.dataclass(frozen=True)
class LeafSource:
    """How one params leaf is built from checkpoint tensors, and how it is laid out on a mesh.

    ``names`` holds one tensor name, or one per layer when ``stacked`` (the leaf then gets a leading
    layer axis). ``layout`` turns a tensor of ``shape`` (checkpoint layout) into our layout using
    NumPy views only. ``keep_fp32`` leaves stay float32 when the model is loaded in a low precision,
    as diffusers' ``_keep_in_fp32_modules`` does. ``axes`` (required) names each dimension of the
    leaf in our layout with a logical axis (``embed``, ``heads``, ``mlp``, ``vocab``, ``layers``) or
    None, or is :data:`REPLICATED`; ``alt_axes`` are further candidates, used when one splits the leaf
    over more devices (:mod:`wanjax.parallel.rules` maps logical axes to mesh axes).
    """

    names: tuple[str, ...]
    shape: tuple[int, ...]
    layout: Callable[[np.ndarray], np.ndarray] = identity
    stacked: bool = False
    keep_fp32: bool = False
    axes: Axes | str = dataclasses.field(kw_only=True)
    alt_axes: tuple[Axes, ...] = dataclasses.field(default=(), kw_only=True)

    def __post_init__(self) -> None:
        ndim = len(self.target_shape())
        if self.axes == REPLICATED:
            object.__setattr__(self, "axes", (None,) * ndim)
        for axes in (self.axes, *self.alt_axes):
            if not isinstance(axes, tuple) or len(axes) != ndim:
                raise ValueError(f"{self.names[0]}: axes {axes!r} do not name the leaf's {ndim} dimensions")

    @property
    def candidate_axes(self) -> tuple[Axes, ...]:
        """``axes`` then ``alt_axes``."""
        return (self.axes, *self.alt_axes)  # type: ignore[return-value]

    def target_shape(self) -> tuple[int, ...]:
        per_tensor = self.layout(np.empty(self.shape, np.uint8)).shape
        return (len(self.names), *per_tensor) if self.stacked else per_tensor

    def read(self, refs: Mapping[str, Ref], index: Index, dtype: np.dtype) -> np.ndarray:
        """The slice ``index`` of the leaf, read from the files and cast to ``dtype``."""
        if not self.stacked:
            view = self._layout_slice(refs[self.names[0]], index)
            if self.layout is identity and view.dtype == dtype:  # read as it is wanted: no second copy
                return view
            out = np.empty(view.shape, dtype)
            copy_into(out, view)
            return out
        layers = range(len(self.names))[index[0]]
        out = np.empty((len(layers), *self.target_shape()[1:]), dtype)[(slice(None), *index[1:])]
        for j, layer in enumerate(layers):
            copy_into(out[j], self._layout_slice(refs[self.names[layer]], index[1:]))
        return out

    def _layout_slice(self, ref: Ref, index: Index) -> np.ndarray:
        """``layout(tensor)[index]``, reading only that slice when the layout allows."""
        if self.layout is identity:
            return ref[index]
        if isinstance(self.layout, Transpose):
            return self.layout(ref[self.layout.stored_index(index)])
        return self.layout(ref.array())[index]


_TILE = 128


def copy_into(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src``; a same-dtype copy from a transposed view goes in 128x128 tiles of the last
    two axes, which keeps both sides in cache (3-4x faster than NumPy's strided copy of a large
    ``weight.T``; a copy that also converts the dtype is fastest as one NumPy call)."""
    if src.dtype != dst.dtype or src.ndim < 2 or src.flags.c_contiguous or dst.size < _TILE * _TILE:
        dst[...] = src
        return
    rows, cols = dst.shape[-2:]
    for i in range(0, rows, _TILE):
        for j in range(0, cols, _TILE):
            dst[..., i : i + _TILE, j : j + _TILE] = src[..., i : i + _TILE, j : j + _TILE]


def stacked(name_template: str, num_layers: int, shape: tuple[int, ...], **kwargs: Any) -> LeafSource:
    """A leaf stacked over layers from names like ``blocks.{i}.attn1.to_q.weight``."""
    names = tuple(name_template.format(i=i) for i in range(num_layers))
    return LeafSource(names, shape, stacked=True, **kwargs)


def stacked_linear(
    name: str, num_layers: int, n_in: int, n_out: int, axes: tuple[str | None, str | None], bias: bool = True
) -> dict[str, LeafSource]:
    """A linear layer stacked over layers from names like ``blocks.{i}.attn1.to_q``: its ``.weight``
    as an ``(n_in, n_out)`` kernel with logical ``axes`` and, with ``bias``, its ``.bias`` (split like
    the output)."""
    kernel = stacked(
        f"{name}.weight", num_layers, (n_out, n_in), layout=linear_kernel, axes=("layers", *axes)
    )
    if not bias:
        return {"kernel": kernel}
    return {"kernel": kernel, "bias": stacked(f"{name}.bias", num_layers, (n_out,), axes=("layers", axes[1]))}


def leaf_dtype(source: LeafSource, dtype: np.dtype) -> np.dtype:
    low_precision = np.dtype(dtype).itemsize < 4
    return np.dtype(np.float32) if source.keep_fp32 and low_precision else np.dtype(dtype)


def check_checkpoint(
    refs: Mapping[str, Ref], spec: Any, where: str, ignore: Callable[[str], bool] = lambda name: False
) -> None:
    """Raise one CheckpointError listing missing, unexpected and wrongly-shaped tensors."""
    sources = _sources(spec)
    expected = {name: s.shape for s in sources for name in s.names}
    missing = [n for n in expected if n not in refs]
    unexpected = [n for n in refs if n not in expected and not ignore(n)]
    wrong = [
        f"{n} {refs[n].shape} (expected {expected[n]})"
        for n in expected
        if n in refs and refs[n].shape != expected[n]
    ]
    problems = []
    if missing:
        problems.append(f"missing tensors: {_listing(missing)}")
    if unexpected:
        problems.append(f"unexpected tensors: {_listing(unexpected)}")
    if wrong:
        problems.append(f"shape mismatch: {_listing(wrong)}")
    if problems:
        raise CheckpointError(f"{where}: checkpoint does not match its config.json: " + "; ".join(problems))


ShardingFn = Callable[[LeafSource], jax.sharding.Sharding]


def load_params(
    refs: Mapping[str, Ref],
    spec: Any,
    dtype: Any,
    where: str,
    sharding: ShardingFn | None = None,
    ignore: Callable[[str], bool] = lambda name: False,
    build: LeafBuilder | None = None,
) -> Any:
    """Materialise a params pytree from a spec tree of LeafSource.

    ``sharding(source)`` gives each leaf's target sharding (default: the first device); every
    addressable shard is read as its slice of the stored tensors. ``build`` makes each leaf
    (default :func:`build_leaf`; :func:`wanjax.io.quant.leaf_builder` stores matmul kernels in 8 bits).
    """
    check_checkpoint(refs, spec, where, ignore)
    dtype, sharding, build = np.dtype(dtype), sharding or first_device, build or build_leaf
    return jax.tree.map(lambda s: build(s, refs, dtype, sharding), spec, is_leaf=_is_source)


def build_leaf(source: LeafSource, refs: Mapping[str, Ref], dtype: np.dtype, sharding: ShardingFn) -> Any:
    """One params leaf in :func:`leaf_dtype`, each addressable shard read as its slice of ``refs``."""
    ldtype = leaf_dtype(source, dtype)
    return jax.make_array_from_callback(
        source.target_shape(), sharding(source), lambda idx: source.read(refs, idx, ldtype)
    )


# (source, refs, model dtype, sharding) -> the params leaf (an array, or a pytree of arrays)
LeafBuilder = Callable[[LeafSource, Mapping[str, Ref], np.dtype, ShardingFn], Any]


def path_name(path: tuple) -> str:
    """A params leaf's tree path as ``layers/attn/q/kernel``."""
    return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def first_device(source: LeafSource) -> jax.sharding.Sharding:
    """The default :data:`ShardingFn`: every leaf whole on the build target's first device."""
    return jax.sharding.SingleDeviceSharding(current_target().devices[0])


def _listing(items: list[str]) -> str:
    shown = ", ".join(items[:_MAX_LISTED])
    more = len(items) - _MAX_LISTED
    return shown + (f" (+{more} more)" if more > 0 else "")


def _is_source(x: Any) -> bool:
    return isinstance(x, LeafSource)


def abstract_params(spec: Any, dtype: Any, sharding: ShardingFn | None = None) -> Any:
    """The params tree as ``jax.ShapeDtypeStruct`` leaves: for lowering, planning and tests, no
    weights. With ``sharding``, each leaf carries the sharding :func:`load_params` would give it."""
    dtype = np.dtype(dtype)

    def leaf(s: LeafSource) -> jax.ShapeDtypeStruct:
        placed = sharding(s) if sharding else None
        return jax.ShapeDtypeStruct(s.target_shape(), leaf_dtype(s, dtype), sharding=placed)

    return jax.tree.map(leaf, spec, is_leaf=_is_source)


# ----------------------------------------------------------------------------------------------
# Random weights (demo model, benchmarks, tests; never a substitute for a checkpoint)


def random_scale(name: str, shape: tuple[int, ...]) -> tuple[float, float]:
    """``(scale, offset)`` of the random values a checkpoint tensor gets, ``standard_normal * scale +
    offset``, by its role (read from its name and checkpoint ``shape``), so activations stay O(1):
    norm scales near 1, small biases, linear/conv weights of variance 1/fan_in. The one rule of
    :func:`random_tensor` (NumPy) and :func:`random_params_on_device` (``jax.random``)."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "gamma" or (leaf == "weight" and "norm" in name and len(shape) == 1):
        return 0.1, 1.0  # RMS / layer norm scales
    if leaf == "bias":
        return 0.02, 0.0
    if "scale_shift_table" in name:
        return 1 / np.sqrt(shape[-1]), 0.0
    if "relative_attention_bias" in name:
        return 0.5, 0.0
    if name.endswith(("shared.weight", "embed_tokens.weight")):
        return 1.0, 0.0
    return 1 / np.sqrt(max(math.prod(shape[1:]), 1)), 0.0  # weights (out, in, ...): 1 / fan_in


def random_tensor(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """float32 random values of a sensible scale for the tensor's role, by its checkpoint name (see
    :func:`random_scale`)."""
    values = rng.standard_normal(shape, dtype=np.float32)
    scale, offset = random_scale(name, shape)
    if scale != 1.0:
        values *= scale
    if offset:
        values += offset
    return values


def random_checkpoint(spec: Any, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 tensors for every checkpoint name of a spec tree, in the checkpoint's layout."""
    rng = np.random.default_rng(seed)
    return {name: random_tensor(name, s.shape, rng) for s in _sources(spec) for name in s.names}


def random_params(
    spec: Any,
    dtype: Any,
    seed: int = 0,
    sharding: ShardingFn | None = None,
    build: LeafBuilder | None = None,
) -> Any:
    """A params tree of :func:`random_checkpoint`'s tensors, built leaf by leaf as :func:`load_params`
    builds one from a checkpoint (NumPy draws: ~15x faster than ``jax.random`` on a CPU; only one
    leaf's float32 tensors are held at a time). ``build``: as :func:`load_params`'s; the same seed
    draws the same tensors whatever it is."""
    rng = np.random.default_rng(seed)
    dtype, sharding, make = np.dtype(dtype), sharding or first_device, build or build_leaf

    def build_one(source: LeafSource) -> Any:
        refs = {name: ArrayRef(random_tensor(name, source.shape, rng)) for name in source.names}
        return jax.block_until_ready(make(source, refs, dtype, sharding))

    return jax.tree.map(build_one, spec, is_leaf=_is_source)


def random_params_on_device(spec: Any, dtype: Any, seed: int = 0, sharding: ShardingFn | None = None) -> Any:
    """A params tree like :func:`random_params`'s (the same shapes, dtypes, shardings and
    :func:`random_scale` rule; other values), each leaf drawn with ``jax.random`` by a jitted program
    straight into its sharding: nothing is drawn on the host or transferred, and each device draws
    only its shard. The fast path on an accelerator, and for large models on a CPU (see
    ``wanjax bench --random_weights``)."""
    dtype, sharding = np.dtype(dtype), sharding or first_device
    sources, treedef = jax.tree.flatten(spec, is_leaf=_is_source)
    leaves = []
    for index, source in enumerate(sources):
        # Stacked leaves: every layer's name has the same role, so the first one speaks for all.
        scale, offset = random_scale(source.names[0], source.shape)
        draw = _random_leaf_program(
            source.target_shape(), leaf_dtype(source, dtype), sharding(source), source.stacked
        )
        leaves.append(draw(seed, index, np.float32(scale), np.float32(offset)))
        jax.block_until_ready(leaves[-1])  # one leaf's float32 draw in memory at a time
    return jax.block_until_ready(jax.tree.unflatten(treedef, leaves))


@functools.lru_cache(maxsize=256)
def _random_leaf_program(
    shape: tuple[int, ...], dtype: np.dtype, sharding: jax.sharding.Sharding, stacked: bool = False
) -> Callable[..., jax.Array]:
    """``normal * scale + offset`` of one leaf's shape and dtype, drawn in float32 (then cast) into
    ``sharding``; one program per (shape, dtype, sharding), shared by every leaf alike. A stacked
    leaf is drawn one layer at a time (``lax.map``), so its float32 draw never exists whole: drawn at
    once, UMT5-XXL's stacked kernels (2^30 values each) took ~10 GB apiece beside the weights."""

    def layer(key: jax.Array, layer_shape: tuple[int, ...], scale: jax.Array, offset: jax.Array) -> jax.Array:
        return (jax.random.normal(key, layer_shape, np.float32) * scale + offset).astype(dtype)

    def draw(seed: jax.Array, index: jax.Array, scale: jax.Array, offset: jax.Array) -> jax.Array:
        key = jax.random.fold_in(jax.random.key(seed), index)
        if not stacked:
            return layer(key, shape, scale, offset)
        keys = jax.random.split(key, shape[0])
        return jax.lax.map(lambda k: layer(k, shape[1:], scale, offset), keys)

    return jax.jit(draw, out_shardings=sharding)


def _sources(spec: Any) -> list[LeafSource]:
    return jax.tree.leaves(spec, is_leaf=_is_source)
