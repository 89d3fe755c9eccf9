"""``python -m wanjax.cli``: the ``wanjax`` command."""

import sys

from wanjax.cli.launch import run

sys.exit(run())
