"""What wanjax knows of the chips it builds for, in one place: each accelerator's datasheet peak,
whether it multiplies int8 faster than bf16, a TPU generation's HBM and the part of it the TPU
compiler lets a program use, the TPU kernels' default blocks where the seed's do not compile, the
TPU slices one rents, and a TPU's lanes. ``plan``, ``bench``, the compile target, the kernels and
the W8A8 default read them here."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from wanjax.errors import WanjaxError

__all__ = [
    "CHIPS",
    "DEFAULT_BLOCKS",
    "SLICES",
    "TPU_LANES",
    "Blocks",
    "Chip",
    "GiB",
    "Slice",
    "attention_blocks",
    "chip_of",
    "datasheet_peak",
    "parse_slice",
]

GiB = 1 << 30
TPU_LANES = 128  # a TPU vector register's lanes: its memory pads an array's last dimension to them

Blocks = tuple[int, int, int, int]  # a TPU attention kernel's (bq, bkv, bkv_compute, bkv_compute_in)

# The seed's tuned values on TPU v6e (Wan 2.1 14B, 720p: ~10% faster with exp2).
DEFAULT_BLOCKS: Blocks = (3328, 2816, 256, 256)

# Where the seed's blocks do not compile: the TPU compiler's scoped VMEM (16 MiB on v4, v5e and v5p;
# 32 MiB on v6e) at the real shapes of every registry model (head dim 128, bf16; the lengths only cut
# blocks down). Evidence, compiled for each slice without a TPU by benchmarks/tpu_blocks.py:
# BENCHMARKS.md, "TPU kernel blocks per generation". `splash` with the seed's blocks needs 30.2 MiB on
# v5e (19.0 on v5p): the 16 MiB generations take the largest candidate that compiles on all three;
# `splash_exp2` keeps the seed's everywhere. Chosen by the compiler, not timed: `wanjax
# tune-attention` on the chip stores faster ones.
_SMALL_VMEM_SPLASH: Blocks = (1024, 2048, 512, 256)


@dataclasses.dataclass(frozen=True)
class Chip:
    """An accelerator: its name (a TPU generation, ``v6e``, or a GPU's), the ``device_kind`` JAX gives
    its devices (matched as a prefix, as are its ``aliases``: ``NVIDIA H100`` is ``NVIDIA H100 80GB
    HBM3``), its dense bf16 datasheet peak (TFLOP/s per device; ``None``: not known), its dense int8
    datasheet peak (TOP/s per device, ``int8_tops``; ``None``: not known), and for a TPU the
    HBM per device, the part of it the TPU compiler lets a program use (its "available HBM" when a
    program does not fit) and the attention kernels' default blocks where the seed's do not compile."""

    name: str
    device_kind: str
    peak_tflops: float | None = None
    hbm_bytes: int | None = None
    usable_hbm_bytes: int | None = None
    blocks: Mapping[str, Blocks] = dataclasses.field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    int8_tops: float | None = None

    @property
    def multiplies_int8(self) -> bool:
        """Whether its matrix units multiply int8 faster than bf16 (the datasheets' peaks)."""
        return None not in (self.int8_tops, self.peak_tflops) and self.int8_tops > self.peak_tflops  # type: ignore[operator]

    def is_kind(self, device_kind: str) -> bool:
        """Whether devices of this kind are this chip."""
        return any(device_kind.startswith(k) for k in (self.device_kind, *self.aliases))


# Matched in this order (the first whose kind begins the device's wins: v5e before v5p). int8 peaks:
# Google's TPU datasheets (v6e 1,836, v5e 394, v5p 918 TOPS; v4 and v7x list none above bf16) and
# NVIDIA's (A100 624 dense).
CHIPS: Mapping[str, Chip] = {
    c.name: c
    for c in (
        Chip("v6e", "TPU v6 lite", 918.0, 32 * GiB, int(31.25 * GiB), aliases=("TPU v6e",), int8_tops=1836.0),
        Chip(
            "v5e",
            "TPU v5 lite",
            197.0,
            16 * GiB,
            int(15.75 * GiB),
            {"splash": _SMALL_VMEM_SPLASH},
            ("TPU v5e",),
            394.0,
        ),
        Chip(
            "v5p",
            "TPU v5",
            459.0,
            96 * GiB,
            int(95.74 * GiB),
            {"splash": _SMALL_VMEM_SPLASH},
            int8_tops=918.0,
        ),
        Chip("v4", "TPU v4", 275.0, 32 * GiB, int(30.75 * GiB), {"splash": _SMALL_VMEM_SPLASH}),
        Chip(
            "v7x", "TPU7x", None, 96 * GiB, int(94.75 * GiB)
        ),  # per TensorCore: a chip's two are two devices
        Chip("H200", "NVIDIA H200", 989.0),
        Chip("H100", "NVIDIA H100", 989.0),
        Chip("A100", "NVIDIA A100", 312.0, int8_tops=624.0),
    )
}


def chip_of(device_kind: str) -> Chip | None:
    """The chip whose devices are of this kind (``None``: none known, e.g. a CPU)."""
    return next((c for c in CHIPS.values() if c.is_kind(device_kind)), None)


def datasheet_peak(device_kind: str) -> float | None:
    """The datasheet's dense bf16 FLOP/s of one device of this kind (``None``: not known)."""
    chip = chip_of(device_kind)
    return None if chip is None or chip.peak_tflops is None else chip.peak_tflops * 1e12


def attention_blocks(device_kind: str, backend: str) -> Blocks:
    """The blocks the TPU attention kernel ``backend`` gets on devices of this kind by default."""
    chip = chip_of(device_kind)
    return DEFAULT_BLOCKS if chip is None else chip.blocks.get(backend, DEFAULT_BLOCKS)


@dataclasses.dataclass(frozen=True)
class Slice:
    """A TPU slice one rents: its name (``v6e-8``), libtpu's topology name (``v6e:2x4``) and options,
    its chips and their generation."""

    name: str
    topology: str
    chips: int
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def chip(self) -> Chip:
        return CHIPS[self.name.split("-")[0]]

    @property
    def accelerator_type(self) -> str:
        """The name TPU VMs give the slice (``TPU_ACCELERATOR_TYPE``): ``v5litepod-8`` for ``v5e-8``,
        ``tpu7x-8`` for ``v7x-8``."""
        return self.name.replace("v5e-", "v5litepod-").replace("v7x-", "tpu7x-")


def _slices() -> dict[str, Slice]:
    one = {"chips_per_host_bounds": (1, 1, 1)}
    single = {"chips_per_host_bounds": (2, 4, 1)}  # v5e-8 / v6e-8: one host with 8 chips
    four = {"chips_per_host_bounds": (2, 2, 1)}
    megacore = {"chip_config_name": "megacore"}
    table = [
        Slice("v4-8", "v4:2x2x1", 4, megacore),
        Slice("v4-16", "v4:2x2x2", 8, megacore),
        Slice("v5e-1", "v5e:1x1", 1, one),
        Slice("v5e-4", "v5e:2x2", 4, four),
        Slice("v5e-8", "v5e:2x4", 8, single),
        Slice("v5e-16", "v5e:4x4", 16, four),
        Slice("v5p-8", "v5p:2x2x1", 4),
        Slice("v5p-16", "v5p:2x2x2", 8),
        Slice("v6e-1", "v6e:1x1", 1, one),
        Slice("v6e-4", "v6e:2x2", 4, four),
        Slice("v6e-8", "v6e:2x4", 8, single),
        Slice("v6e-16", "v6e:4x4", 16, four),
        Slice("v7x-8", "tpu7x:2x2x1", 8),  # 4 chips, 8 TensorCores (devices)
    ]
    return {s.name: s for s in table}


SLICES: Mapping[str, Slice] = _slices()


def parse_slice(name: str) -> Slice:
    """The slice named ``name``; WanjaxError listing the known ones."""
    if name not in SLICES:
        raise WanjaxError(f"unknown TPU slice {name!r} for --compile; use one of {', '.join(SLICES)}")
    return SLICES[name]
