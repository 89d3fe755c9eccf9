"""What ``wanjax plan --compile`` reports: each compiled program's bytes per chip, code, FLOPs and
compile seconds (:class:`ProgramReport`), and the run's table and JSON (:class:`CompileReport`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from wanjax.chips import GiB


@dataclasses.dataclass
class ProgramReport:
    """One compiled program (the JSON's ``programs`` entries)."""

    name: str
    compiled: bool
    error: str | None
    bytes_per_chip: dict[str, int] | None
    planned_bytes_per_chip: int | None
    attention_backend: str | None
    tpu_custom_calls: int
    compile_seconds: float
    resident_bytes_per_chip: int = 0  # other components' weights on the chip while it runs
    flops_per_chip: int | None = None  # counted in the compiled program, every loop iteration
    analytic_flops: int | None = None  # the whole program's, all chips (:mod:`wanjax.tools.flops`)
    cost_model_seconds: float | None = None  # an estimate: the TPU cost model's, loops scaled
    peak_seconds: float | None = None  # a lower bound: flops_per_chip at the datasheet's peak
    same_as: str | None = None  # the same program as this earlier one: taken from the compilation cache
    int8_products: int = 0  # s8 x s8 dots and convolutions run (W8A8), every loop iteration
    int8_flops_per_chip: int = 0  # their FLOPs


@dataclasses.dataclass
class CompileReport:
    """Every program of a run compiled for a slice (``--json``'s document)."""

    topology: str
    chips: int
    hbm_bytes_per_chip: int
    usable_hbm_bytes_per_chip: int  # what the TPU compiler lets a program use
    mesh: str
    programs: list[ProgramReport]
    attention_density: float | None = None  # radial attention's kept fraction of self-attention blocks

    @property
    def fits(self) -> bool:
        """Every program compiled and, with what else is resident, within a chip's HBM."""
        return all(
            p.compiled
            and p.bytes_per_chip["total"] + p.resident_bytes_per_chip <= self.usable_hbm_bytes_per_chip
            for p in self.programs
        )  # type: ignore[index]

    def as_json(self) -> dict[str, Any]:
        return {
            "topology": self.topology,
            "chips": self.chips,
            "hbm_bytes_per_chip": self.hbm_bytes_per_chip,
            "usable_hbm_bytes_per_chip": self.usable_hbm_bytes_per_chip,
            "mesh": self.mesh,
            "fits": self.fits,
            "attention_density": self.attention_density,
            "programs": [dataclasses.asdict(p) for p in self.programs],
        }

    def table(self) -> str:
        return "\n".join([self.header(), *(self.line(p) for p in self.programs), self.footer()])

    def header(self) -> str:
        hbm, usable = self.hbm_bytes_per_chip / GiB, self.usable_hbm_bytes_per_chip / GiB
        return (
            f"compiled for {self.topology} ({self.chips} chips, {hbm:.2f} GiB HBM each, {usable:.2f} usable), "
            f"mesh {self.mesh}:"
        )

    def line(self, p: ProgramReport) -> str:
        """One program's line of the table."""
        if not p.compiled or p.bytes_per_chip is None:
            return f"  {p.name:<16} FAILED: {p.error}"
        b = p.bytes_per_chip
        on_chip = (b["total"] + p.resident_bytes_per_chip) / GiB
        planned = "" if p.planned_bytes_per_chip is None else f" (plan {p.planned_bytes_per_chip / GiB:.2f})"
        kernels = f", {p.tpu_custom_calls} Pallas calls" if p.tpu_custom_calls else ""
        compiled = (
            f"compiled in {p.compile_seconds:.1f} s"
            if p.same_as is None
            else f"the same program as {p.same_as}: taken from the compilation cache"
        )
        return (
            f"  {p.name:<16} {b['total'] / GiB:6.2f} GiB per chip: arguments {b['arguments'] / GiB:.2f}, "
            f"temporaries {b['temporaries'] / GiB:.2f}, outputs {b['outputs'] / GiB:.2f}, code "
            f"{b['code'] / GiB:.3f}; with the other weights {on_chip:.2f}{planned}; attention "
            f"{p.attention_backend}{kernels}; {_work(p, self.chips)}{compiled}"
        )

    def footer(self) -> str:
        """The seconds a first run compiles for and the code of its programs in all, and whether
        every program compiles and fits."""
        compiled = [p for p in self.programs if p.same_as is None]
        seconds = sum(p.compile_seconds for p in compiled)
        code = sum(p.bytes_per_chip["code"] for p in compiled if p.bytes_per_chip is not None)
        count = f"{len(compiled)} program{'s' if len(compiled) != 1 else ''}"
        taken = len(self.programs) - len(compiled)
        cached = f" ({taken} more taken from the compilation cache)" if taken else ""
        verdict = "every program compiles and fits" if self.fits else "does NOT compile or fit"
        return (
            f"  {count} compiled in {seconds:.1f} s{cached}, {code / GiB:.3f} GiB of code per chip; "
            f"{verdict} (bytes per chip by the TPU compiler)"
        )


def _work(p: ProgramReport, chips: int) -> str:
    """The table's FLOPs and cost-model time of one program (empty where not counted)."""
    if p.flops_per_chip is None:
        return ""
    analytic = (
        "" if p.analytic_flops is None else f" (analytic {p.analytic_flops / chips / 1e12:.4g} per chip)"
    )
    peak = "" if p.peak_seconds is None else f", >= {p.peak_seconds * 1e3:.4g} ms at the datasheet peak"
    seconds = (
        ", no cost-model time"
        if p.cost_model_seconds is None
        else f", cost model {p.cost_model_seconds * 1e3:.4g} ms (estimate)"
    )
    int8 = (
        f", {p.int8_products} s8 x s8 dots ({p.int8_flops_per_chip / p.flops_per_chip:.0%} of the FLOPs)"
        if p.int8_products and p.flops_per_chip
        else ""
    )
    return f"{p.flops_per_chip / 1e12:.4g} TFLOP per chip{int8}{analytic}{peak}{seconds}; "
