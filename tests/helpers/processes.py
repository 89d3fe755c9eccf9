"""What the processes the tests start are given."""

from __future__ import annotations

import os

TEST_COMPILE_FLAG = "--xla_backend_optimization_level=0"  # conftest's: the CPU code at LLVM -O0


def xla_flags(devices: int) -> str:
    """This session's XLA_FLAGS (conftest's compile settings) and ``devices`` CPU devices."""
    return f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()


def users_xla_flags() -> str:
    """This session's XLA_FLAGS without conftest's -O0: what a user's run compiles with, for a test
    that compares compile times."""
    return " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if f != TEST_COMPILE_FLAG)
