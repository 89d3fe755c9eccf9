"""Ahead-of-time programs: lowered and compiled once per signature of their arguments, then kept.

A program's arguments are named by their :func:`signature` (tree structure, and each leaf's shape,
dtype and sharding), which is all a compiled program depends on besides its static settings; a
:class:`ProgramCache` keeps one executable per key built from it. Compiling may run in a short-lived
child process (:mod:`wanjax.runtime.child_compile`) when :func:`child_can_compile` allows it, falling
back to this process with a warning. After each compile the heap the compiler freed is handed back
to the OS (:func:`release_free_heap`).
"""

from __future__ import annotations

import contextlib
import ctypes
import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.numpy as jnp

from wanjax.runtime import child_compile
from wanjax.target import current_target

__all__ = [
    "ProgramCache",
    "Signature",
    "abstract_tree",
    "child_can_compile",
    "compile_program",
    "release_free_heap",
    "signature",
    "unplaced",
]

# (tree structure, ((shape, dtype, sharding or None) per leaf))
Signature = tuple[Any, tuple[tuple[tuple[int, ...], Any, Any], ...]]


def signature(tree: Any) -> Signature:
    """What a program compiled for ``tree`` depends on: its structure and each leaf's shape, dtype
    and sharding (``None`` for leaves without one)."""
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((a.shape, jnp.dtype(a.dtype), getattr(a, "sharding", None)) for a in leaves)


def unplaced(sig: Signature) -> Signature:
    """A :func:`signature` without shardings (leaves on the default device)."""
    treedef, leaves = sig
    return treedef, tuple((shape, dtype, None) for shape, dtype, _ in leaves)


def abstract_tree(sig: Signature) -> Any:
    """The tree of :class:`jax.ShapeDtypeStruct` a :func:`signature` describes."""
    treedef, leaves = sig
    return jax.tree.unflatten(treedef, [jax.ShapeDtypeStruct(s, d, sharding=sh) for s, d, sh in leaves])


def child_can_compile(*signatures: Signature) -> bool:
    """Whether a program for arguments of these signatures can be compiled in a child process: a
    one-process CPU run with every leaf unplaced or in the first device's default memory (the
    default placement, which the child has too; a leaf in host memory would lose its memory kind)."""
    if not child_compile.available():
        return False
    first = current_target().devices[0]
    shardings = (sh for _, leaves in signatures for _, _, sh in leaves)
    return all(
        sh is None or (sh.device_set == {first} and sh.memory_kind in (None, "device")) for sh in shardings
    )


def release_free_heap() -> None:
    """``malloc_trim(0)`` where glibc provides it: XLA's compiler frees ~200 MiB on the real VAE that
    glibc would otherwise keep mapped (and counted in the process's memory) for the whole run."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def compile_program(
    lower: Callable[[], jax.stages.Lowered], child: tuple[str, tuple[Any, ...]] | None = None
) -> jax.stages.Compiled:
    """``lower()`` compiled, then the freed heap handed back to the OS. With ``child`` (a
    ``"module:function"`` builder and its picklable arguments, see
    :func:`~wanjax.runtime.child_compile.compile_in_child`) the same program is first built in a
    child process; if that fails, it is compiled here (with a warning)."""
    compiled = None
    if child is not None:
        builder, args = child
        try:
            compiled = child_compile.compile_in_child(builder, *args)
        except child_compile.ChildCompileError as err:
            warnings.warn(f"{err}; compiling in this process instead", RuntimeWarning, stacklevel=2)
    if compiled is None:
        compiled = lower().compile()
    release_free_heap()
    return compiled


class ProgramCache:
    """Compiled programs kept per key (keys hold the :func:`signature` of the arguments and every
    static setting), the least recently used dropped beyond ``maxsize`` (``None``: all kept)."""

    def __init__(self, maxsize: int | None = None):
        self.maxsize = maxsize
        self._programs: OrderedDict[Hashable, jax.stages.Compiled] = OrderedDict()

    def get(
        self,
        key: Hashable,
        lower: Callable[[], jax.stages.Lowered],
        child: tuple[str, tuple[Any, ...]] | None = None,
    ) -> jax.stages.Compiled:
        """The program kept for ``key``, else ``compile_program(lower, child)``, kept."""
        if key in self._programs:
            self._programs.move_to_end(key)
            return self._programs[key]
        compiled = compile_program(lower, child)
        self._programs[key] = compiled
        if self.maxsize is not None and len(self._programs) > self.maxsize:
            self._programs.popitem(last=False)
        return compiled

    def programs(self) -> tuple[jax.stages.Compiled, ...]:
        """The programs kept, least recently used first (read-only; e.g. for ``memory_analysis()``
        in a report)."""
        return tuple(self._programs.values())

    def clear(self) -> None:
        """Drop every program kept (their executables go once nothing else holds them)."""
        self._programs.clear()

    def __len__(self) -> int:
        return len(self._programs)
