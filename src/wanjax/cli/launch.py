"""The ``wanjax`` console script's first module: Ctrl-C and SIGTERM end the command with one line from
here on, while the command line's modules and JAX are still being imported (only :mod:`wanjax.cli.signals`
is loaded before the handlers are in place)."""

from __future__ import annotations

import signal

from wanjax.cli.signals import STOPPED, exit_at_once


def run() -> int:
    """``wanjax``: stop at once on a signal while the command line loads, then run it (a signal the
    caller ignores, as a background job's Ctrl-C, stays ignored)."""
    for signum in STOPPED:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, exit_at_once)
    from wanjax.cli.main import main

    return main()
