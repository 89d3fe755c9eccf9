"""The ``wanjax`` command line: ``generate``, the stages ``encode | denoise | decode``, ``serve``, ``info``,
``plan``, ``bench``, ``tune-attention``, ``convert``.

Each subcommand is one :class:`Subcommand`: the typed request its flags build (the request class
declares them) and the function that runs the request. User mistakes (bad flags, bad model directories, contradicting stage
files) print one line naming the problem and exit with 2, before any weight is read; failures while
running (NaN/inf latents, an output that cannot be written, an XLA runtime error) print one line and
exit with 1; Ctrl-C exits with 130; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from wanjax.cli.parser import CliParser, UsageError
from wanjax.cli.signals import STOPPED, exit_at_once
from wanjax.errors import WanjaxError, one_line
from wanjax.jobs.flags import add_flags, from_flags


@dataclasses.dataclass(frozen=True)
class Subcommand:
    """One ``wanjax`` subcommand: its request class, the schema of its flags (:mod:`wanjax.jobs.flags`),
    and ``run``, which runs a request (an int it returns is the exit status)."""

    help: str
    schema: type
    run: Callable[[Any], Any]

    def add_flags(self, parser: argparse.ArgumentParser) -> None:
        """The subcommand's flags, built from its request class."""
        add_flags(parser, self.schema)

    def request(self, args: argparse.Namespace) -> Any:
        """The request of the parsed flags, its values checked (WanjaxError naming the flag)."""
        return from_flags(self.schema)(args)


def subcommands() -> dict[str, Subcommand]:
    """Every subcommand by name, in the order ``wanjax --help`` lists them."""
    from wanjax.cli import commands, describe
    from wanjax.cli.describe import InfoRequest, PlanRequest
    from wanjax.jobs.requests import DecodeRequest, DenoiseRequest, EncodeRequest, GenerateRequest
    from wanjax.server.request import ServeRequest
    from wanjax.server.serve import serve
    from wanjax.tools import bench, convert, tune_attention

    return {
        "generate": Subcommand("prompt to mp4 in one run", GenerateRequest, commands.cmd_generate),
        "encode": Subcommand(
            "stage 1: prompt -> stage1_embeddings.safetensors", EncodeRequest, commands.cmd_encode
        ),
        "denoise": Subcommand(
            "stage 2: embeddings -> stage2_latents.safetensors (an Animate model's denoise also loads the "
            "VAE: each segment is conditioned on the last decoded frames of the one before)",
            DenoiseRequest,
            commands.cmd_denoise,
        ),
        "decode": Subcommand(
            "stage 3: stage2_latents.safetensors -> mp4", DecodeRequest, commands.cmd_decode
        ),
        "serve": Subcommand(
            "an HTTP server generating videos (OpenAI-style API, a web page); needs wanjax[serve]",
            ServeRequest,
            serve,
        ),
        "plan": Subcommand(
            "per-device memory of a run on a mesh (no weights needed)", PlanRequest, describe.cmd_plan
        ),
        "bench": Subcommand(
            "time each stage of a built-in architecture (random weights)",
            bench.BenchRequest,
            bench.run_request,
        ),
        "tune-attention": Subcommand(
            "time TPU attention block sizes, cache the fastest",
            tune_attention.TuneRequest,
            tune_attention.run_request,
        ),
        "info": Subcommand(
            "what a model directory or a component file holds", InfoRequest, describe.cmd_info
        ),
        "convert": Subcommand(
            "component files (original Wan, ComfyUI, fp8-scaled, GGUF) to a diffusers-layout directory",
            convert.ConvertRequest,
            convert.run_request,
        ),
    }


def build_parser(commands: Mapping[str, Subcommand]) -> CliParser:
    """The ``wanjax`` parser with a subparser per command (each with ``--debug``)."""
    from wanjax.version import __version__

    parser = CliParser(prog="wanjax", description="Wan video models (text, image to video) in JAX.")
    parser.add_argument("--version", action="version", version=f"wanjax {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, command in commands.items():
        command_parser = sub.add_parser(name, help=command.help)
        command.add_flags(command_parser)
        command_parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    return parser


def command_list(commands: Mapping[str, Subcommand]) -> str:
    """What ``wanjax`` alone prints: each subcommand with its one line."""
    width = max(map(len, commands))
    lines = [f"  {name:<{width}}  {command.help}" for name, command in commands.items()]
    return "\n".join(["usage: wanjax COMMAND [flags]  (wanjax COMMAND --help for its flags)", *lines])


class Terminated(BaseException):
    """SIGTERM arrived (a service manager or ``kill``) while a command ran: stop as Ctrl-C does."""


def _terminate(signum: int, frame: Any) -> None:
    raise Terminated


def _on_signals(handlers: Mapping[int, Any]) -> dict[int, Any]:
    """Install ``handlers`` (main thread only; an ignored SIGINT, a background job's, stays ignored);
    the handlers they replaced."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    replaced = {}
    for signum, handler in handlers.items():
        current = signal.getsignal(signum)
        if current is not signal.SIG_IGN and current is not None and handler is not None:
            replaced[signum] = signal.signal(signum, handler)
    return replaced


def main(argv: Sequence[str] | None = None) -> int:
    """``wanjax``: the exit status. Ctrl-C (130) and SIGTERM (143) end any command at any moment
    with one line (``serve`` handles SIGTERM itself once it runs: it finishes the running job)."""
    program = argv is None  # the process is wanjax's (not a caller's in-process call)
    argv = sys.argv[1:] if argv is None else list(argv)
    previous = _on_signals(dict.fromkeys(STOPPED, exit_at_once))
    try:
        return _main(argv)
    except BrokenPipeError:  # the reader went away (`wanjax info demo | head`): not an error
        _silence_stdout()
        return 0
    except (KeyboardInterrupt, Terminated) as e:
        if "--debug" in argv:
            raise
        code, line = STOPPED[signal.SIGINT if isinstance(e, KeyboardInterrupt) else signal.SIGTERM]
        print(line, file=sys.stderr, flush=True)
        if program:  # leave now: Python's shutdown would wait on, or crash in, XLA's running threads
            sys.stdout.flush()
            os._exit(code)
        return code
    finally:
        _on_signals(previous)  # an in-process caller gets its own handlers back


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so Python's flush of it at exit does not fail once more."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _main(argv: list[str]) -> int:
    from wanjax.runtime.libtpu import skip_absent_tpu

    skip_absent_tpu()  # libtpu installed, no TPU here: as quiet as without it
    original = warnings.formatwarning
    warnings.formatwarning = _one_line_warning  # "wanjax: warning: ..." instead of file:line + source
    try:
        commands = subcommands()
        if not argv:
            print(command_list(commands), file=sys.stderr)
            return 2
        try:
            args = build_parser(commands).parse_args(argv)
        except UsageError as e:
            print(e, file=sys.stderr)
            return 2
        if args.debug:
            warnings.formatwarning = original
        return _run(commands[args.command], args, debug=args.debug)
    finally:
        warnings.formatwarning = original


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    return f"wanjax: warning: {one_line(message if isinstance(message, Warning) else Warning(message))}\n"


def _run(command: Subcommand, args: argparse.Namespace, debug: bool) -> int:
    """Build the request, run it; errors become one line and an exit status unless ``debug``."""
    serving = args.command == "serve"
    _on_signals(
        {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL if serving else _terminate}
    )
    try:
        status = command.run(command.request(args))
    except WanjaxError as e:
        if debug:
            raise
        print(f"wanjax: error: {one_line(e)}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:
        raise  # stdout's reader went away: see main
    except (OSError, MemoryError) as e:  # a runtime failure: disk full, out of host memory, ...
        if debug:
            raise
        print(
            f"wanjax: error: {one_line(e) or type(e).__name__} (--debug shows the traceback)",
            file=sys.stderr,
        )
        return 1
    except Exception as e:
        import jax

        if debug or not isinstance(e, jax.errors.JaxRuntimeError):
            raise
        first = one_line(e)[:300]
        print(f"wanjax: error: XLA runtime failure: {first} (--debug shows the traceback)", file=sys.stderr)
        return 1
    return status if isinstance(status, int) else 0


if __name__ == "__main__":
    sys.exit(main())
