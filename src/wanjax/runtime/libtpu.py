"""libtpu, loaded only where it is used.

With the ``libtpu`` package installed, JAX tries its TPU backend in every process, and on a machine
without a TPU libtpu prints six lines of start-up warnings (no ``TPU_ACCELERATOR_TYPE``, no
``TPU_WORKER_HOSTNAMES``, a source-location trace) before finding none. :func:`skip_absent_tpu` keeps
the command line as quiet as without the package; :func:`compiler_environment` quiets the same
warnings when libtpu is loaded only to compile for a topology (:mod:`wanjax.tools.compile_target`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator

import jax

__all__ = ["compiler_environment", "installed", "skip_absent_tpu", "tpu_attached"]


def installed() -> bool:
    """Whether the ``libtpu`` package (the TPU compiler and runtime) is importable."""
    return importlib.util.find_spec("libtpu") is not None or bool(os.environ.get("TPU_LIBRARY_PATH"))


def tpu_attached() -> bool:
    """Whether a TPU chip is attached to this machine (JAX's own PCI check)."""
    from jax._src.hardware_utils import num_available_tpu_chips_and_device_id

    return num_available_tpu_chips_and_device_id()[0] > 0


def skip_absent_tpu() -> bool:
    """Run this process on the CPU without loading libtpu when libtpu is installed but no TPU chip
    (and no NVIDIA GPU) is attached and no platform was asked for (``JAX_PLATFORMS``); JAX would
    load it only to print its start-up warnings and fall back to the CPU. Call before JAX starts
    its backends; True when it applied."""
    from jax._src.hardware_utils import has_visible_nvidia_gpu

    if jax.config.jax_platforms or _backends_started() or not installed():
        return False
    if tpu_attached() or has_visible_nvidia_gpu():  # JAX picks that device; leave its choice alone
        return False
    jax.config.update("jax_platforms", "cpu")
    return True


def _backends_started() -> bool:
    try:
        from jax._src.xla_bridge import backends_are_initialized
    except ImportError:
        return False
    return backends_are_initialized()


@contextlib.contextmanager
def compiler_environment(accelerator_type: str) -> Iterator[None]:
    """libtpu started as a compiler for ``accelerator_type`` (e.g. ``v6e-8``) on a machine without
    TPUs: the variables it would otherwise warn about are set for the block (unless already set) and
    restored after."""
    wanted = {
        "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",  # compiling only: other processes may hold libtpu too
        "TPU_ACCELERATOR_TYPE": accelerator_type,
        "TPU_WORKER_HOSTNAMES": "localhost",
        "TPU_WORKER_ID": "0",
    }
    if tpu_attached():
        wanted = {}
    saved = {k: os.environ.get(k) for k in wanted}
    os.environ.update({k: v for k, v in wanted.items() if saved[k] is None})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
