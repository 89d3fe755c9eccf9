"""The target a program is built for: platform, device kind and devices.

Every choice that depends on the hardware (Pallas interpret mode, the ``auto`` attention backend, the
per-head attention path, matmul precision, the VAE's conv formulation, the scanned layers' packing,
child-process compiles, the tune cache's device key, native fp8, int8 matmuls, the memory ``plan`` counts) reads
:func:`current_target`, never ``jax.default_backend()``. At run time that is this process's devices;
:func:`building_for` sets another one for a block, e.g. a TPU topology's devices to compile for a
slice from a CPU host (:mod:`wanjax.tools.compile_target`). The setting is a context variable: scoped, per thread, no
module state.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import jax

from wanjax.chips import TPU_LANES, chip_of

__all__ = ["TPU_LANES", "Target", "building_for", "current_target"]


@dataclasses.dataclass(frozen=True)
class Target:
    """What programs are built for. ``platform``: JAX's name (``cpu``, ``gpu``, ``tpu``);
    ``device_kind``: e.g. ``TPU v6 lite``, ``NVIDIA H100 80GB HBM3``; ``cuda``: the compute capability
    on NVIDIA GPUs (``(9, 0)``: H100), else ``None``; ``devices``: the devices programs are laid out
    on; ``compile_only``: the devices are a topology's, nothing can run on them."""

    platform: str
    device_kind: str
    devices: tuple[Any, ...] = ()
    cuda: tuple[int, int] | None = None
    compile_only: bool = False

    @classmethod
    def of(cls, devices: Sequence[Any], *, compile_only: bool = False) -> Target:
        """The target made of ``devices`` (real ones, or a topology's with ``compile_only``)."""
        first = devices[0]
        platform = "gpu" if first.platform in ("gpu", "cuda", "rocm") else first.platform
        return cls(
            platform, str(getattr(first, "device_kind", "")), tuple(devices), _cuda(first), compile_only
        )

    @classmethod
    def host(cls) -> Target:
        """This process's default devices."""
        return cls.of(jax.devices())

    @property
    def lanes(self) -> int:
        """The multiple the target's memory pads an array's last dimension to (a TPU's lanes; 1 elsewhere):
        a 96-channel feature map takes as much HBM as a 128-channel one on a TPU."""
        return TPU_LANES if self.platform == "tpu" else 1

    @property
    def copies_16bit_stacks(self) -> bool:
        """Whether the TPU compiler copies a scanned model's stacked 16-bit matmul kernels into another
        tiling before the layer loop: on v7x ((8, 128) parameter tiles made (16, 128), a second copy
        of them in the step's temporaries; 8-bit and GGUF kernels are not copied; BENCHMARKS.md)."""
        return self.platform == "tpu" and "7x" in self.device_kind

    @property
    def multiplies_int8(self) -> bool:
        """Whether the matrix units multiply int8 at a higher rate than bf16: TPUs whose datasheet
        says so (v5e, v6e, v5p: :attr:`wanjax.chips.Chip.multiplies_int8`) and NVIDIA GPUs of compute
        capability 8.x (Ampere, Ada: int8 tensor cores, no fp8). ``--activations_dtype auto`` reads it."""
        if self.platform == "gpu":
            return self.cuda is not None and self.cuda[0] == 8
        chip = chip_of(self.device_kind) if self.platform == "tpu" else None
        return chip is not None and chip.multiplies_int8

    @property
    def interprets_pallas(self) -> bool:
        """Whether the TPU's Pallas kernels run in interpret mode (anywhere but a TPU)."""
        return self.platform != "tpu"


def _cuda(device: Any) -> tuple[int, int] | None:
    """An NVIDIA device's compute capability (``(0, 0)`` when unreadable), else ``None``."""
    if device.platform not in ("gpu", "cuda"):
        return None
    client = getattr(device, "client", None)
    version = str(getattr(client, "platform_version", "")).lower()
    if "cuda" not in version:  # JAX's own test for a CUDA GPU
        return None
    try:
        major, minor = (int(x) for x in str(device.compute_capability).split(".")[:2])
    except (AttributeError, ValueError):
        return 0, 0  # unknown: no capability-gated kernel is chosen
    return major, minor


_BUILDING_FOR: contextvars.ContextVar[Target | None] = contextvars.ContextVar("wanjax_target", default=None)


def current_target() -> Target:
    """The target set by the innermost :func:`building_for`, else this process's devices."""
    target = _BUILDING_FOR.get()
    return Target.host() if target is None else target


@contextlib.contextmanager
def building_for(target: Target) -> Iterator[Target]:
    """Build every program in the block for ``target``."""
    token = _BUILDING_FOR.set(target)
    try:
        yield target
    finally:
        _BUILDING_FOR.reset(token)
