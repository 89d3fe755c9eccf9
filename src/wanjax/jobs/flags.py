"""Flags declared once: a request dataclass is the schema of its command's flags.

Each field is the flag of its name (``--num_inference_steps``, also spelled ``--num-inference-steps``),
declared with :func:`option`: its default, help and choices; its type comes from the annotation
(``bool``: a switch, ``tuple[...]``: several values). A field whose type is a dataclass is a flag
group: its fields are flags too, listed under the group's ``title`` when it has one. :func:`add_flags`
turns a request class into argparse arguments, :func:`from_namespace` the parsed flags into the
request. Help texts are templates: ``{default}`` (and ``{const}``, ``{choices}``, and the names the
flag's ``values`` return) are filled in when the parser is built, so a default is written once, and
choices and texts the library decides are read from it then.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import types
import typing
from collections.abc import Callable, Container, Iterator, Mapping, Sequence
from typing import Any, TypeVar

METADATA_KEY = "flag"

Choices = Sequence[str] | Callable[[], Sequence[str]]


@dataclasses.dataclass(frozen=True)
class Flag:
    """How a field is given on the command line (its name and default are the field's)."""

    help: str
    choices: Choices | None = None
    values: Callable[[], Mapping[str, Any]] | None = None  # names the help template uses
    metavar: str | None = None
    const: str | Callable[[], str] | None = None  # the value of the flag given alone (``nargs="?"``)
    repeat: bool = False  # a tuple given one value per flag (``--lora A --lora B``), not several after one
    positional: bool = False

    def const_value(self) -> str | None:
        return self.const() if callable(self.const) else self.const

    def choice_list(self) -> list[str] | None:
        if self.choices is None:
            return None
        return list(self.choices() if callable(self.choices) else self.choices)


@dataclasses.dataclass(frozen=True)
class Option:
    """One flag of a request class: its field name, default and :class:`Flag`."""

    name: str
    default: Any
    flag: Flag
    kind: Any  # the field's type

    @property
    def shows_default(self) -> bool:
        """Whether the help names the default: a value, not "not given" (None, off, empty)."""
        return self.default not in (None, False, (), dataclasses.MISSING)

    def help(self, override: str | None = None) -> str:
        """The help text, its template filled in."""
        choices = self.flag.choice_list()
        template = override or self.flag.help
        names = {
            "default": shown(self.default),
            "const": self.flag.const_value(),
            "choices": ", ".join(map(str, choices or ())),
            **(registry_defaults() if "{ref." in template or "{demo." in template else {}),
            **(self.flag.values() if self.flag.values else {}),
        }
        return template.format_map(names)


def option(
    default: Any = None,
    *,
    help: str,
    choices: Choices | None = None,
    values: Callable[[], Mapping[str, Any]] | None = None,
    metavar: str | None = None,
    const: str | Callable[[], str] | None = None,
    repeat: bool = False,
    positional: bool = False,
) -> Any:
    """A dataclass field that is a flag (``default`` left out: not given, None; a positional one is
    required)."""
    flag = Flag(help, choices, values, metavar, const, repeat, positional)
    default = dataclasses.MISSING if positional else default
    return dataclasses.field(default=default, metadata={METADATA_KEY: flag})


def registry_defaults() -> dict[str, Any]:
    """The model registry's defaults of a run (``ref``) and of the demo model (``demo``): the names a
    help text whose default depends on the model writes (``{ref.height}``)."""
    from wanjax.models.registry import DEMO_DEFAULTS, Defaults

    return {"ref": Defaults(), "demo": DEMO_DEFAULTS}


def library(module: str, name: str) -> Callable[[], Any]:
    """``module.name``, read when a parser is built (choices the library decides: the flags' modules
    import no model code). The layering test counts ``module`` as imported."""
    return lambda: getattr(importlib.import_module(module), name)


def shown(default: Any) -> str:
    """A default as a help text writes it (a tuple as its values, space-separated)."""
    if isinstance(default, tuple | list):
        return " ".join(map(str, default))
    return str(default)


def options(cls: type) -> Iterator[tuple[Option, str | None]]:
    """Each flag of ``cls``, its groups' flags included, with the title of the group it is listed
    under (None: the command's own)."""
    yield from _options(cls, None)


def _options(cls: type, title: str | None) -> Iterator[tuple[Option, str | None]]:
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        kind = hints[field.name]
        if dataclasses.is_dataclass(kind):
            yield from _options(kind, getattr(kind, "title", None) or title)
            continue
        if METADATA_KEY not in field.metadata:
            raise TypeError(f"{cls.__name__}.{field.name} is not declared with wanjax.jobs.flags.option")
        yield Option(field.name, field.default, field.metadata[METADATA_KEY], kind), title


def add_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    """The flags of request class ``cls`` added to ``parser``: each group's under its title, the
    titled sections in the order of ``cls.help_sections`` (group classes; others after them, as they
    come). A class may reword a flag's help for its command (``flag_help``, by flag name) and leave a
    group's flag out (``flag_omit``: the field keeps its default)."""
    overrides: Mapping[str, str] = getattr(cls, "flag_help", {})
    omitted: Container[str] = getattr(cls, "flag_omit", ())
    sections: dict[str, list[Option]] = {}
    for opt, title in options(cls):
        if opt.name in omitted:
            continue
        if title is None:
            _add(parser, opt, overrides.get(opt.name))
        else:
            sections.setdefault(title, []).append(opt)
    order = [group.title for group in getattr(cls, "help_sections", ())]
    for title in sorted(sections, key=lambda t: order.index(t) if t in order else len(order)):
        section = parser.add_argument_group(title)
        for opt in sections[title]:
            _add(section, opt, overrides.get(opt.name))


def argparse_default(default: Any) -> Any:
    """A field's default as argparse holds it (a tuple as a list: argparse appends to it)."""
    return list(default) if isinstance(default, tuple) else default


def _add(parser: Any, opt: Option, help_override: str | None) -> None:
    flag, kind = opt.flag, _value_type(opt.kind)
    kwargs: dict[str, Any] = {"help": opt.help(help_override)}
    if flag.positional:
        parser.add_argument(opt.name, **kwargs)
        return
    if kind is bool:
        kwargs["action"] = "store_true"
    else:
        kwargs.update(default=argparse_default(opt.default), choices=flag.choice_list())
        if flag.metavar:
            kwargs["metavar"] = flag.metavar
        if _is_tuple(opt.kind):
            kwargs["action" if flag.repeat else "nargs"] = "append" if flag.repeat else "+"
        elif flag.const is not None:
            kwargs.update(nargs="?", const=flag.const_value())
        if kind is not str:
            kwargs["type"] = kind
    spellings = [f"--{opt.name}"] + ([f"--{opt.name.replace('_', '-')}"] if "_" in opt.name else [])
    parser.add_argument(*spellings, dest=opt.name, **kwargs)


def _is_tuple(kind: Any) -> bool:
    return typing.get_origin(kind) is tuple


def _value_type(kind: Any) -> Any:
    """``int`` of ``int | None`` and of ``tuple[int, ...]``; the type itself otherwise."""
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        (kind,) = (arg for arg in typing.get_args(kind) if arg is not type(None))
    if _is_tuple(kind):
        kind = typing.get_args(kind)[0]
    return kind


T = TypeVar("T")


def from_namespace(cls: type[T], args: argparse.Namespace) -> T:
    """``cls`` with each field from the parsed flag of its name (groups recursively); a field whose
    flag the namespace lacks keeps its default. Lists (several values) become tuples."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        if dataclasses.is_dataclass(hints[field.name]):
            values[field.name] = from_namespace(hints[field.name], args)
        elif hasattr(args, field.name):
            value = getattr(args, field.name)
            values[field.name] = tuple(value) if isinstance(value, list) else value
    return cls(**values)


def from_flags(cls: type[T]) -> Callable[[argparse.Namespace], T]:
    """The builder of ``cls`` requests from parsed flags, checked when the request has a ``check``
    (WanjaxError naming the flag)."""

    def build(args: argparse.Namespace) -> T:
        request = from_namespace(cls, args)
        if hasattr(request, "check"):
            request.check()
        return request

    return build


def default_of(cls: type, name: str) -> Any:
    """The default of flag ``name`` of request (or group) class ``cls``."""
    return next(opt.default for opt, _ in options(cls) if opt.name == name)
