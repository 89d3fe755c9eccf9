"""``python -m wanjax.cli``: the ``wanjax`` command."""

import sys

from wanjax.cli.main import main

sys.exit(main())
