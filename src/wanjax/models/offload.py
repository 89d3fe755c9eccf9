"""Where weights live: the ``offload`` setting, moves between memory kinds, streamed layers.

``offload`` (:data:`OFFLOAD_MODES`):

* ``"none"``: every component's weights stay in device memory once loaded.
* ``"model"``: stage-wise residency. A component's weights are in device memory only while its
  stage runs; between stages they wait in pinned host memory (``jax.device_put`` to the same
  sharding with memory kind ``pinned_host``), so the next prompt moves them back instead of reading
  the checkpoint again. Only placement changes: the frames are bit-identical to ``"none"``.
  A model run once per stage (the text encoder) streams its layers (below) instead of moving them
  in whole: its weights cross from host memory for every stage anyway, so streaming costs no extra
  transfer and the device holds two of its layers instead of all (UMT5-XXL: 0.7 of 10.6 GiB).
* ``"blocks"``: as ``"model"``, and the transformer's stacked layer weights never enter device
  memory as a whole either: they live in pinned host memory and :func:`stream_layers` brings one
  layer at a time to the device inside the scan, the next layer's transfer issued before the
  current layer runs (double-buffered), so the device holds two layers' weights besides the
  non-stacked ones. The transformer runs at every step, so this costs one transfer of its layers
  per step (:func:`streams_layers` says which model streams under which mode).

JAX's memory kinds do this on every backend: a sharding's ``memory_kind`` places an array, and
``jax.device_put(x, jax.memory.Space.Device)`` inside ``jit`` moves a (host) slice to the device
(an ``annotate_device_placement`` that XLA turns into a host-to-device copy on GPU and TPU; on
the CPU both kinds are the same RAM and the move lowers to nothing, so the mechanism and its
numerics are tested there, not its memory saving at run time).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from wanjax.errors import ConfigError
from wanjax.io.checkpoint import LeafSource, ShardingFn, first_device, linear_kernel
from wanjax.target import current_target

Offload = Literal["none", "model", "blocks"]
OFFLOAD_MODES: tuple[str, ...] = ("none", "model", "blocks")
STREAMED_LAYERS = 2  # "blocks": layers whose weights are on the device at a time (double-buffered)

DEVICE = "device"
HOST = "pinned_host"
HOST_KINDS = frozenset({"pinned_host", "unpinned_host"})

Tree = Any


def parse_offload(value: Any, what: str = "offload") -> Offload:
    """``value`` as an :data:`Offload` mode (None: ``"none"``); ConfigError naming ``what`` (e.g. the
    flag) and the choices."""
    name = "none" if value is None else str(value).lower()
    if name not in OFFLOAD_MODES:
        raise ConfigError(f"unknown {what} {value!r}; use one of {', '.join(OFFLOAD_MODES)}")
    return name  # type: ignore[return-value]


def streams_layers(offload: Offload, *, per_step: bool = True) -> bool:
    """Whether a model's stacked layer weights stay in host memory and are streamed in while it runs:
    under ``"blocks"`` every model's; under ``"model"`` those of a model run once per stage
    (``per_step=False``: the text encoder), never those of one run at every step (the transformer)."""
    return offload == "blocks" or (offload == "model" and not per_step)


def streamed(source: LeafSource, offload: Offload, *, per_step: bool = True) -> bool:
    """Whether the leaf ``source`` describes stays in host memory while its model runs: the stacked
    (per-layer) matmul kernels of a model that :func:`streams_layers` (nearly all of its bytes).
    Every other leaf runs from device memory, the stacked norms, biases and tables included: they
    are small, and the TPU compiler cannot slice such leaves out of host memory (a 16-bit ``(L, d)``
    one: "Sublane slicing size must be multiple of element packing factor"; UMT5's ``(L, 32, H)``
    relative bias: "Async slice only supports slicing in 1 dimension"; found by compiling for v5e,
    :mod:`wanjax.tools.compile_target`)."""
    return source.stacked and source.layout == linear_kernel and streams_layers(offload, per_step=per_step)


def streamed_path(path: tuple[Any, ...]) -> bool:
    """Whether the leaf at ``path`` of a stacked-layers tree is a matmul kernel (:func:`streamed`
    leaves: their params are named ``kernel``, an 8-bit one's values and scales too)."""
    return any(getattr(key, "key", None) == "kernel" for key in path)


def offload_sharding(sharding: ShardingFn | None, offload: Offload, *, per_step: bool = True) -> ShardingFn:
    """``sharding`` (default: the first device) with the streamed leaves (:func:`streamed`) placed in
    pinned host memory: the same devices and partitioning, memory kind ``pinned_host``. With it,
    :func:`~wanjax.io.checkpoint.load_params` reads those leaves straight into host memory."""
    base = sharding or first_device
    if not streams_layers(offload, per_step=per_step):
        return base

    def place(source: LeafSource) -> jax.sharding.Sharding:
        s = base(source)
        return s.with_memory_kind(HOST) if streamed(source, offload, per_step=per_step) else s

    return place


def memory_kind(a: Any) -> str:
    """The memory kind an array (or ShapeDtypeStruct) lives in (``device`` when it does not say)."""
    sharding = getattr(a, "sharding", None)
    kind = getattr(sharding, "memory_kind", None)
    return kind or DEVICE


def move(tree: Tree, kind: str, *, block: bool = False) -> Tree:
    """``tree``'s arrays in memory ``kind`` (same devices and partitioning; leaves already there are
    left as they are). Asynchronous (``jax.device_put``) unless ``block``: then it returns once every
    copy is done, so the source buffers no longer referenced are free."""

    def one(a: Any) -> Any:
        if not isinstance(a, jax.Array) or memory_kind(a) == kind:
            return a
        return jax.device_put(a, a.sharding.with_memory_kind(kind))

    out = jax.tree.map(one, tree)
    return jax.block_until_ready(out) if block else out


def run_placement(
    params: dict[str, Tree], stacked: str, stream: bool, *, block: bool = False
) -> dict[str, Tree]:
    """``params`` where a forward runs them: all in device memory, except the stacked layers
    (``params[stacked]``) when the model ``stream``s them (they stay in host memory). Asynchronous
    unless ``block``: the next program waits for its arguments."""
    params = dict(params)
    layers = params.pop(stacked)
    params = move(params, DEVICE)
    params[stacked] = jax.tree_util.tree_map_with_path(
        lambda path, a: move(a, HOST if stream and streamed_path(path) else DEVICE), layers
    )
    return jax.block_until_ready(params) if block else params


def take_turns(models: Sequence[Any], active: int, *, block: bool = False) -> None:
    """Models that share the device one at a time (a Wan 2.2 A14B's experts): every other one to
    pinned host memory, waiting until its device copy is free, then ``models[active]`` back to the
    device (asynchronous unless ``block``: the next program waits for its weights). Each model has
    ``to_host`` and ``to_device``."""
    for i, model in enumerate(models):
        if i != active:
            model.to_host(block=True)
    models[active].to_device(block=block)


def host_bytes(tree: Tree) -> int:
    """Bytes of ``tree``'s arrays in host memory kinds (whole arrays, all shards)."""
    return sum(a.nbytes for a in jax.tree.leaves(tree) if memory_kind(a) in HOST_KINDS)


def device_bytes(tree: Tree) -> int:
    """Bytes of ``tree``'s arrays in device memory (whole arrays, all shards)."""
    return sum(a.nbytes for a in jax.tree.leaves(tree) if memory_kind(a) not in HOST_KINDS)


# ----------------------------------------------------------------------------------------------
# Streaming stacked layers


def _to_device(tree: Tree) -> Tree:
    return jax.tree.map(lambda a: jax.device_put(a, jax.memory.Space.Device), tree)


def _narrow_float(a: Any) -> bool:
    return jnp.issubdtype(a.dtype, jnp.floating) and jnp.dtype(a.dtype).itemsize < 4


def _layer(layers: Tree, i: jax.Array, n: int) -> Tree:
    """Layer ``i`` of the stacked ``layers`` (where they are: host memory for streamed weights).

    One ``dynamic-slice`` per leaf: the pattern XLA's host offloading turns into a host-to-device
    copy of the slice, and the resident scan's own slicing, so the layer's ops are laid out (and
    partitioned on a mesh) as the scan's. Except on the CPU for 16- and 8-bit float leaves: there
    XLA would convert such an operand of a dynamic-slice in a loop to float32 and hoist that out of
    the loop (a float32 copy of every stacked weight), and a bitcast of the stack to unsigned ints
    is materialised as a copy too; a ``lax.switch`` over static per-layer slices copies only the one
    layer (the same values).
    """
    leaves, structure = jax.tree.flatten(layers)
    on_cpu = current_target().platform == "cpu"
    switched = [on_cpu and _narrow_float(a) for a in leaves]
    stacks = [a for a, sw in zip(leaves, switched, strict=True) if sw]
    picked = iter(jax.lax.switch(i, [lambda k=k: [a[k] for a in stacks] for k in range(n)]) if stacks else ())
    out = [
        next(picked) if sw else jax.lax.dynamic_index_in_dim(a, i, keepdims=False)
        for a, sw in zip(leaves, switched, strict=True)
    ]
    return jax.tree.unflatten(structure, out)


def stream_layers(
    body: Callable[[jax.Array, Tree], jax.Array],
    carry: jax.Array,
    layers: Tree,
    start: int = 0,
    stop: int | None = None,
    *,
    prefetch: bool = True,
) -> jax.Array:
    """``carry = body(carry, layer_params)`` for each layer of the stacked ``layers`` (a pytree whose
    leaves share a leading layer axis, any leaf types and dtypes), the layers' weights kept in host
    memory: each layer's slice is moved to the device inside the loop (``jax.device_put`` to
    ``Space.Device``). With ``prefetch`` the loop carries the next layer's weights, fetched before
    the current layer runs, so the transfer can overlap the compute (two layers on the device);
    without it one layer is fetched at the top of each iteration. The result equals the resident
    ``lax.scan`` (the same ops on the same values). ``start``/``stop``: only layers ``start ..
    stop-1``.
    """
    leaves = jax.tree.leaves(layers)
    if not leaves:
        raise ValueError("stream_layers needs at least one stacked leaf")
    n = leaves[0].shape[0]
    stop = n if stop is None else stop

    def fetch(i: jax.Array) -> Tree:
        return _to_device(_layer(layers, i, n))

    steps = jnp.arange(start, stop, dtype=jnp.int32)
    if not prefetch:
        return jax.lax.scan(lambda c, i: (body(c, fetch(i)), None), carry, steps)[0]

    def step(state: tuple[jax.Array, Tree], i: jax.Array) -> tuple[tuple[jax.Array, Tree], None]:
        c, current = state
        # the next layer's weights (the first again after the last: one spare transfer per call)
        upcoming = fetch(jnp.where(i + 1 < stop, i + 1, start))
        return (body(c, current), upcoming), None

    return jax.lax.scan(step, (carry, fetch(jnp.int32(start))), steps)[0][0]


# ----------------------------------------------------------------------------------------------
# What a compiled program holds in device memory


def program_memory(compiled: jax.stages.Compiled) -> dict[str, int]:
    """Bytes of a compiled program's memory, split by memory kind: ``argument``, ``output``,
    ``temp``, ``alias``, ``generated_code`` (device memory), ``host_argument`` and ``total`` (device:
    argument + output + temp - alias). From ``compiled.memory_analysis()``; where the backend counts host-memory
    arguments among the device ones (the CPU reports no ``host_argument_size_in_bytes``), the
    arguments whose input sharding is in a host memory kind are moved to ``host_argument``."""
    stats = compiled.memory_analysis()
    if stats is None:
        raise NotImplementedError("this backend gives no memory analysis")
    argument = int(stats.argument_size_in_bytes)
    host = int(getattr(stats, "host_argument_size_in_bytes", 0) or 0)
    if host == 0:

        def host_shard(info: jax.stages.ArgInfo, sharding: Any) -> int:
            """One shard's bytes of a host-memory argument (per device, as memory_analysis counts);
            an argument the program does not read has no sharding (None)."""
            if getattr(sharding, "memory_kind", None) not in HOST_KINDS:
                return 0
            return math.prod(sharding.shard_shape(tuple(info.shape))) * np.dtype(info.dtype).itemsize

        is_info = lambda x: isinstance(x, jax.stages.ArgInfo)  # noqa: E731
        host = sum(
            jax.tree.leaves(
                jax.tree.map(host_shard, compiled.args_info, compiled.input_shardings, is_leaf=is_info)
            )
        )
        argument -= host
    out = {
        "argument": argument,
        "output": int(stats.output_size_in_bytes),
        "temp": int(stats.temp_size_in_bytes),
        "alias": int(stats.alias_size_in_bytes),
        "generated_code": int(getattr(stats, "generated_code_size_in_bytes", 0) or 0),
        "host_argument": host,
    }
    out["total"] = out["argument"] + out["output"] + out["temp"] - out["alias"]
    return out
