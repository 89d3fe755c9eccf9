"""Each flag declared once: every subcommand's parser is built from its request class
(:mod:`wanjax.jobs.flags`), so a default, a choice or a help text cannot disagree with the request."""

from __future__ import annotations

import argparse
import dataclasses
from typing import ClassVar

import pytest

from wanjax.cli.main import build_parser, subcommands
from wanjax.jobs.flags import add_flags, argparse_default, from_namespace, option, options, shown
from wanjax.jobs.groups import MemoryFlags, VaeFlags

REQUIRED = {"info": ["demo"], "convert": ["out"]}  # a subcommand's required arguments


def test_every_subcommand_parser_is_built_from_its_schema():
    """Each subcommand's arguments are its request's flags, with the schema's defaults; a help whose
    flag has a default names it, from the schema (``{default}``), never retyped."""
    commands = subcommands()
    parser = build_parser(commands)
    for name, command in commands.items():
        actions = {
            action.dest: action
            for action in parser._subcommands.choices[name]._actions
            if action.dest not in ("help", "debug")
        }
        omitted = getattr(command.schema, "flag_omit", ())
        schema = {opt.name: opt for opt, _ in options(command.schema) if opt.name not in omitted}
        assert set(actions) == set(schema), name
        for dest, action in actions.items():
            opt, where = schema[dest], f"wanjax {name} {dest}"
            assert action.help == opt.help(getattr(command.schema, "flag_help", {}).get(dest)), where
            if opt.flag.positional:
                assert action.required, where
                continue
            assert action.default == argparse_default(opt.default), where
            if opt.shows_default:
                assert "{default}" in opt.flag.help and shown(opt.default) in action.help, where
        args = parser.parse_args([name, *REQUIRED.get(name, [])])
        assert from_namespace(command.schema, args) == command.schema(*REQUIRED.get(name, [])), name


def test_the_librarys_defaults_and_choices():
    from wanjax.io.quantizable import UNQUANTIZED
    from wanjax.models.vae import Tiling

    assert MemoryFlags.weights_dtype == UNQUANTIZED
    parser = build_parser(subcommands())
    args = parser.parse_args(["decode", "--vae_tiling"])
    assert args.vae_tiling == f"{Tiling.size}:{Tiling.stride}" and VaeFlags.vae_tiling is None


@dataclasses.dataclass(frozen=True)
class _Group:
    title: ClassVar[str] = "the group"
    size: int = option(3, help="a size (default {default})")
    names: tuple[str, ...] = option((), repeat=True, help="repeatable")


@dataclasses.dataclass(frozen=True)
class _Request:
    path: str = option(help="where", positional=True)
    kinds: tuple[str, ...] = option(("a", "b"), choices=lambda: ("a", "b", "c"), help="of {choices}")
    dry_run: bool = option(False, help="a switch")
    tiles: str | None = option(None, const="256:192", help="alone: {const}")
    group: _Group = dataclasses.field(default_factory=_Group)


def test_the_builder_turns_a_dataclass_into_flags_and_back():
    parser = argparse.ArgumentParser()
    add_flags(parser, _Request)
    assert from_namespace(_Request, parser.parse_args(["p"])) == _Request("p")
    args = parser.parse_args(["p", "--kinds", "c", "--dry-run", "--tiles", "--names", "x", "--names", "y"])
    request = from_namespace(_Request, args)
    assert request == _Request("p", ("c",), True, "256:192", _Group(3, ("x", "y")))
    assert from_namespace(_Request, parser.parse_args(["p", "--size", "7"])).group.size == 7
    help_text = parser.format_help()
    assert "of a, b, c" in help_text and "alone: 256:192" in help_text and "(default 3)" in help_text
    assert "the group:" in help_text
    with pytest.raises(SystemExit):
        parser.parse_args(["p", "--kinds", "d"])


def test_a_field_without_a_flag_declaration_is_refused():
    @dataclasses.dataclass(frozen=True)
    class Undeclared:
        size: int = 3

    with pytest.raises(TypeError, match=r"Undeclared\.size"):
        add_flags(argparse.ArgumentParser(), Undeclared)


def test_help_sections_follow_the_declared_order():
    """The titled groups of every command's --help stand in ``Request.help_sections``' order, however
    its request composes them (generate inherits the transformer's groups before its inputs)."""
    from wanjax.jobs.requests import Request

    order = [group.title for group in Request.help_sections]
    parser = build_parser(subcommands())
    for name in ("generate", "encode", "denoise", "decode", "serve", "plan"):
        titles = [group.title for group in parser._subcommands.choices[name]._action_groups]
        declared = [title for title in titles if title in order]
        assert declared == sorted(declared, key=order.index), name
    generate = parser._subcommands.choices["generate"]
    lora = next(action for action in generate._actions if action.dest == "lora")
    assert lora in next(g for g in generate._action_groups if g.title == "LoRA")._group_actions
