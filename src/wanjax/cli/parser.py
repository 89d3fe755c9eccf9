"""The ``wanjax`` parser: argparse, whose mistakes are one line.

The subcommands' flags are their requests' fields (:mod:`wanjax.jobs.flags` builds them): the reference
scripts' names (``--num_inference_steps``), hyphenated spellings accepted (``--num-inference-steps``).
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from typing import Any, NoReturn

from wanjax.errors import one_line

_INVALID_CHOICE = re.compile(r"invalid choice: (?P<value>.*) \(choose from (?P<choices>.*)\)")

# Other tools' names for wanjax's flags (diffusers' scripts, Wan's generate.py, common shorthands):
# suggested when the command has the flag. Spelling is compared with '-' as '_'.
ALIASES = {
    "--steps": "--num_inference_steps",
    "--num_steps": "--num_inference_steps",
    "--sample_steps": "--num_inference_steps",
    "--cfg": "--guidance_scale",
    "--cfg_scale": "--guidance_scale",
    "--sample_guide_scale": "--guidance_scale",
    "--negative": "--negative_prompt",
    "--neg_prompt": "--negative_prompt",
    "--num_frames": "--frames",
    "--frame_num": "--frames",
    "--output": "--output_video",
    "--out": "--output_video",
    "--save_file": "--output_video",
    "--shift": "--flow_shift",
    "--sample_shift": "--flow_shift",
    "--base_seed": "--seed",
    "--ckpt_dir": "--model",
}


class UsageError(Exception):
    """A command-line mistake argparse found; the message is the whole line to print."""


class CliParser(argparse.ArgumentParser):
    """argparse, with a mistake raised as a one-line :class:`UsageError`
    (``wanjax generate: error: ...``) instead of the usage printed and an exit. Subcommand parsers
    are of this class too, and flags no subcommand knows are reported by the subcommand given."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("allow_abbrev", False)  # --num_inference_step is a typo, not a flag
        super().__init__(*args, **kwargs)
        self._subcommands: Any = None

    def add_subparsers(self, **kwargs: Any) -> Any:
        kwargs.setdefault("parser_class", type(self))
        self._subcommands = super().add_subparsers(**kwargs)
        return self._subcommands

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:
        argv = list(sys.argv[1:] if args is None else map(str, args))
        namespace, unknown = self.parse_known_args(argv, namespace)
        if unknown:
            parser = self._parser_of(namespace)
            parser.error(f"unrecognized arguments: {' '.join(unknown)}{_hint(parser, argv, unknown)}")
        return namespace

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: error: {one_line(_plain_choices(message))}")

    def _parser_of(self, namespace: argparse.Namespace) -> argparse.ArgumentParser:
        """The parser of the subcommand ``namespace`` holds (this one if none)."""
        if self._subcommands is None:
            return self
        return self._subcommands.choices.get(getattr(namespace, self._subcommands.dest, None), self)


def _hint(parser: argparse.ArgumentParser, argv: list[str], unknown: list[str]) -> str:
    """What the user likely meant: the flag another tool's name stands for (``--steps``:
    ``--num_inference_steps``, :data:`ALIASES`) or a typo is closest to (``--promt``: ``--prompt``),
    or the quotes that make words after a flag's value part of it (``--prompt A cat walks``)."""
    first = unknown[0]
    if first.startswith("--"):
        name = first.split("=", 1)[0]
        flags = [o for action in parser._actions for o in action.option_strings if o.startswith("--")]
        alias = ALIASES.get("--" + name[2:].replace("-", "_"))
        close = [alias] if alias in flags else difflib.get_close_matches(name, flags, n=1, cutoff=0.75)
        return f" (did you mean {close[0]}?)" if close else ""
    if first.startswith("-"):
        return ""
    at = next((i for i in range(len(argv)) if argv[i : i + len(unknown)] == unknown), -1)
    if at >= 2 and argv[at - 2].startswith("--") and not argv[at - 1].startswith("-"):
        words = [
            argv[at - 1],
            *unknown[: next((i for i, w in enumerate(unknown) if w.startswith("-")), None)],
        ]
        return f'; quote a value with spaces: {argv[at - 2]} "{" ".join(words)}"'
    return ""


def _plain_choices(message: str) -> str:
    """argparse's ``invalid choice: 'x' (choose from 'a', 'b')`` as ``invalid choice 'x' (choose
    from a, b)``."""

    def plain(match: re.Match[str]) -> str:
        choices = ", ".join(choice.strip("'") for choice in match["choices"].split(", "))
        return f"invalid choice {match['value']} (choose from {choices})"

    return _INVALID_CHOICE.sub(plain, message)
