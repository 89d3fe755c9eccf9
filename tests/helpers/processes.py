"""What the processes the tests start are given."""

from __future__ import annotations

import os


def xla_flags(devices: int) -> str:
    """This session's XLA_FLAGS (conftest's compile settings) and ``devices`` CPU devices."""
    return f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()
