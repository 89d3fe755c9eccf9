"""What the processes the tests start are given."""

from __future__ import annotations

import os

# conftest's compile settings for the CPU code: LLVM at -O0, and fusions emitted by XLA's elemental
# emitter instead of its MLIR fusion emitters (the same operations; half the compile time measured)
ELEMENTAL_EMITTER = "--xla_cpu_use_fusion_emitters=false"
TEST_COMPILE_FLAGS = ("--xla_backend_optimization_level=0", ELEMENTAL_EMITTER)
USERS_EMITTER = ELEMENTAL_EMITTER.removeprefix("--").split("=")[0]  # the option a bit-for-bit test sets back


def with_test_compile_flags(flags: str) -> str:
    """``flags`` with each of conftest's compile settings it does not set already."""
    added = [f for f in TEST_COMPILE_FLAGS if f.split("=")[0] not in flags]
    return " ".join([*flags.split(), *added])


def xla_flags(devices: int) -> str:
    """This session's XLA_FLAGS (conftest's compile settings) and ``devices`` CPU devices."""
    return f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()


def _xla_flags_without(*removed: str) -> str:
    return " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if f not in removed)


def users_emitter_flags() -> str:
    """This session's XLA_FLAGS with XLA's fusion emitters, as a user's run has them: for a process
    whose test compares two programs' bits (the elemental emitter rounds one last bit differently as
    the shapes change)."""
    return _xla_flags_without(ELEMENTAL_EMITTER)


def users_xla_flags() -> str:
    """This session's XLA_FLAGS without conftest's compile settings: what a user's run compiles with,
    for a test that compares compile times."""
    return _xla_flags_without(*TEST_COMPILE_FLAGS)
