"""Tensor-name layouts other than diffusers': how a component's tensors are named in the single files
users download (the original Wan release, ComfyUI's repackaging, city96's GGUFs).

A :class:`KeyLayout` maps each diffusers tensor name to the name the layout gives the same tensor
(shapes are the same: a layout renames, it never reshapes). The component's one description, its
:class:`~wanjax.io.checkpoint.LeafSource` tree, is renamed through it (:func:`rename_spec`), so a
file in that layout is checked and read by the same code as a diffusers directory, and its errors
name the file's own tensors.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, TypeVar

import jax

from wanjax.io.checkpoint import LeafSource

T = TypeVar("T")


def _nothing(name: str) -> bool:
    return False


def _as_stored(refs: dict[str, Any]) -> dict[str, Any]:
    return refs


@dataclasses.dataclass(frozen=True)
class KeyLayout:
    """A naming of a component's tensors: ``file_name(diffusers name) -> this layout's name``;
    ``prefixes``: what files in this layout may put before every name (ComfyUI's
    ``model.diffusion_model.``); ``ignore``: tensors of such files that no params leaf reads;
    ``views``: the file's tensors (prefix removed) as the names ``file_name`` gives, for a layout
    that stores some tensors fused or in another shape (each a view reading its part of the stored
    tensor; the stored tensors otherwise as they are)."""

    name: str
    file_name: Callable[[str], str]
    prefixes: tuple[str, ...] = ("",)
    ignore: Callable[[str], bool] = _nothing
    views: Callable[[dict[str, Any]], dict[str, Any]] = _as_stored


DIFFUSERS = KeyLayout("diffusers", lambda name: name)


def rename_spec(spec: Any, layout: KeyLayout) -> Any:
    """The LeafSource tree with each tensor name as ``layout`` names it."""
    if layout is DIFFUSERS:
        return spec

    def rename(source: LeafSource) -> LeafSource:
        return dataclasses.replace(source, names=tuple(layout.file_name(n) for n in source.names))

    return jax.tree.map(rename, spec, is_leaf=lambda x: isinstance(x, LeafSource))


def strip_prefix(refs: Mapping[str, T], prefixes: Iterable[str]) -> tuple[str, dict[str, T]]:
    """``(prefix, refs without it)`` for the first of ``prefixes`` every name starts with."""
    for prefix in prefixes:
        if all(name.startswith(prefix) for name in refs):
            return prefix, {name[len(prefix) :]: ref for name, ref in refs.items()}
    return "", dict(refs)


def spec_names(spec: Any) -> dict[str, tuple[int, ...]]:
    """Every stored tensor name of a LeafSource tree and its stored shape."""
    sources = jax.tree.leaves(spec, is_leaf=lambda x: isinstance(x, LeafSource))
    return {name: s.shape for s in sources for name in s.names}


def matches(spec: Any, refs: Mapping[str, Any], ignore: Callable[[str], bool]) -> bool:
    """Whether ``refs`` hold exactly the spec's tensors with its shapes (``ignore``d ones aside)."""
    expected = spec_names(spec)
    if any(name not in refs or tuple(refs[name].shape) != shape for name, shape in expected.items()):
        return False
    return all(name in expected or ignore(name) for name in refs)


def overlap(spec: Any, names: Collection[str]) -> float:
    """The fraction of the spec's tensor names present in ``names`` (which layout a file is in)."""
    expected = spec_names(spec)
    return sum(name in names for name in expected) / max(len(expected), 1)


Rule = tuple[str, str | Callable[[re.Match[str]], str]]


def substitutions(rules: Iterable[Rule]) -> Callable[[str], str]:
    """A ``file_name`` function from ``(pattern, replacement)`` rules, tried in order on the whole
    diffusers name; the first pattern that matches (``re.fullmatch``) gives the name."""
    compiled = [(re.compile(pattern), repl) for pattern, repl in rules]

    def file_name(name: str) -> str:
        for pattern, repl in compiled:
            if pattern.fullmatch(name):
                return pattern.sub(repl, name, count=1)
        return name

    return file_name
