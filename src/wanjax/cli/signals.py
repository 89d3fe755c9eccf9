"""What Ctrl-C and SIGTERM do to a ``wanjax`` command: the exit status and the one line of each, and
the handler that ends the process at once while nothing has been written (a leaf: only ``os``,
``signal`` and ``sys``)."""

from __future__ import annotations

import os
import signal
import sys

STOPPED = {
    signal.SIGINT: (130, "wanjax: interrupted (no partial output files were left)"),
    signal.SIGTERM: (143, "wanjax: terminated by SIGTERM (no partial output files were left)"),
}


def exit_at_once(signum: int, frame: object) -> None:
    """Ctrl-C or SIGTERM before the command runs (modules being imported, flags checked): nothing is
    written yet, and an exception raised inside a C extension's import would abort the process."""
    code, line = STOPPED[signum]
    print(line, file=sys.stderr, flush=True)
    os._exit(code)
