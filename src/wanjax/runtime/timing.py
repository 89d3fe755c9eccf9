"""Run timings: load, compile and run seconds per stage, denoising step times, and the final report.

Compile time is measured from JAX's own monitoring events (tracing, lowering to MLIR, XLA compile
or persistent-cache retrieval), and those :mod:`wanjax.runtime.child_compile` records for programs built in
a child process, rather than guessed from a slow first call: overlapping spans (a jit traced inside
another) count once. A stage's ``run`` is its wall time minus that compile time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import statistics
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import jax

from wanjax.io.atomic import write_text
from wanjax.runtime import child_compile

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
COMPILE_EVENTS = frozenset(
    {
        "/jax/core/compile/jaxpr_trace_duration",
        "/jax/core/compile/jaxpr_to_mlir_module_duration",
        BACKEND_COMPILE_EVENT,
        child_compile.COMPILE_EVENT,  # a program built in a child process
    }
)
PROGRAM_EVENTS = frozenset({BACKEND_COMPILE_EVENT, child_compile.COMPILE_EVENT})
CACHE_HIT_EVENTS = frozenset({"/jax/compilation_cache/cache_hits", child_compile.STORE_HIT_EVENT})
STAGES = ("encode", "denoise", "decode")


class CompileMeter:
    """Context manager recording the compile work JAX does inside the block.

    ``seconds``: wall time covered by tracing/lowering/compiling spans (their union);
    ``programs``: XLA executables requested from the backend (compiled or read from the persistent
    cache) or built in a child process; ``cache_hits``: those read from the persistent compilation
    cache or the child's executable store.
    """

    def __init__(self) -> None:
        self.spans: list[tuple[float, float]] = []
        self.programs = 0
        self.cache_hits = 0

    def __enter__(self) -> CompileMeter:
        jax.monitoring.register_event_time_span_listener(self._on_span)
        jax.monitoring.register_event_listener(self._on_event)
        return self

    def __exit__(self, *exc: object) -> None:
        jax.monitoring.unregister_event_time_span_listener(self._on_span)
        jax.monitoring.unregister_event_listener(self._on_event)

    def _on_span(self, event: str, start_time: float, end_time: float, **kwargs: Any) -> None:
        if event in COMPILE_EVENTS:
            self.spans.append((start_time, end_time))
        if event in PROGRAM_EVENTS:
            self.programs += 1

    def _on_event(self, event: str, **kwargs: Any) -> None:
        if event in CACHE_HIT_EVENTS:
            self.cache_hits += 1

    @property
    def seconds(self) -> float:
        total, reach = 0.0, float("-inf")
        for start, end in sorted(self.spans):
            if end > reach:
                total += end - max(start, reach)
                reach = end
        return total


@dataclasses.dataclass
class StageTiming:
    """Seconds spent loading weights, compiling and running one stage, and the programs it built."""

    load: float = 0.0
    compile: float = 0.0
    run: float = 0.0
    programs: int = 0
    cache_hits: int = 0

    def __add__(self, other: StageTiming) -> StageTiming:
        """Both runs' seconds and programs together (e.g. a long video's clips)."""
        return StageTiming(
            *(getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self))
        )

    @contextlib.contextmanager
    def loading(self) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.load += time.perf_counter() - start

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Time the block; compile work inside it goes to ``compile``, the rest to ``run``."""
        start = time.perf_counter()
        with CompileMeter() as meter:
            yield
        wall = time.perf_counter() - start
        compile_s = min(meter.seconds, wall)
        self.compile += compile_s
        self.run += wall - compile_s
        self.programs += meter.programs
        self.cache_hits += meter.cache_hits


@dataclasses.dataclass
class StepTimes:
    """Denoising: seconds to compile the step program, of the first step and of every later step."""

    compile: float = 0.0
    first: float = 0.0
    steady: list[float] = dataclasses.field(default_factory=list)

    @property
    def steps(self) -> int:
        return len(self.steady) + 1 if self.first or self.steady else 0

    @property
    def per_step(self) -> float:
        """Seconds per step: the median of the steady steps (the first one if there is no other)."""
        return statistics.median(self.steady) if self.steady else self.first

    @classmethod
    def joined(cls, runs: Sequence[StepTimes]) -> StepTimes:
        """The steps of several runs one after another (a long video's clips): the compiles summed, the
        first run's first step first, every later step steady."""
        if not runs:
            return cls()
        later = [s for run in runs[1:] for s in (run.first, *run.steady) if run.steps]
        return cls(sum(r.compile for r in runs), runs[0].first, [*runs[0].steady, *later])


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def cache_line(cache: dict[str, Any]) -> str:
    """The report's line about the step cache (its JSON record: policy, per-branch skips, evaluations)."""
    branches = cache["branches"]
    skipped = ", ".join(
        f"{name} {b['skipped_steps']}/{b['skipped_steps'] + b['evaluated_steps']}"
        for name, b in branches.items()
    )
    steps = max(b["skipped_steps"] + b["evaluated_steps"] for b in branches.values())
    saved = "" if cache.get("seconds_saved") is None else f", about {cache['seconds_saved']:.2f} s saved"
    return (
        f"cache: {cache['policy']}, steps skipped {skipped}; {cache['dit_evaluations']} DiT evaluations "
        f"(uncached {steps * len(branches)}){saved}"
    )


@dataclasses.dataclass
class RunReport:
    """What one command did and how long each part took; printed as a table, saved as JSON."""

    command: str
    model: str
    smoke_model: bool = False
    stages: dict[str, StageTiming] = dataclasses.field(default_factory=dict)
    steps: StepTimes | None = None
    video: dict[str, int | float] = dataclasses.field(default_factory=dict)
    outputs: dict[str, str | list[str]] = dataclasses.field(default_factory=dict)  # files by kind
    total: float = 0.0
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "command": self.command,
            "model": self.model,
            "smoke_model": self.smoke_model,
            "stages": {
                name: {
                    "load_s": t.load,
                    "compile_s": t.compile,
                    "run_s": t.run,
                    "programs": t.programs,
                    "cache_hits": t.cache_hits,
                }
                for name, t in self.stages.items()
            },
            "compile_s": sum(t.compile for t in self.stages.values()),
            "total_s": self.total,
            "video": self.video,
            "outputs": self.outputs,
            **self.extra,
        }
        if self.steps is not None:
            out["denoise"] = {
                "steps": self.steps.steps,
                "s_per_step": self.steps.per_step,
                "step_compile_s": self.steps.compile,
                "first_step_s": self.steps.first,
                "step_s": [self.steps.first, *self.steps.steady],
            }
            split = self.computed_and_skipped()
            if split is not None:
                (computed, s_computed), (skipped, s_skipped) = split
                out["denoise"].update(
                    computed_steps=computed,
                    s_per_computed_step=s_computed,
                    skipped_steps=skipped,
                    s_per_skipped_step=s_skipped,
                )
        return out

    def computed_and_skipped(self) -> tuple[tuple[int, float | None], tuple[int, float | None]] | None:
        """With a step cache: ``(count, median seconds)`` of the steps the DiT ran (for any branch)
        and of those it skipped (the first step, which pays for warming up, counted but not timed)."""
        if self.steps is None or "cache" not in self.extra:
            return None
        skipped_by = [set(b["skipped"]) for b in self.extra["cache"]["branches"].values()]
        skipped = set.intersection(*skipped_by) if skipped_by else set()
        times = [self.steps.first, *self.steps.steady]

        def median_of(steps: list[int]) -> float | None:
            timed = [times[i] for i in steps if 0 < i < len(times)]
            return statistics.median(timed) if timed else None

        computed = [i for i in range(len(times)) if i not in skipped]
        return (len(computed), median_of(computed)), (len(skipped), median_of(sorted(skipped)))

    def table(self) -> str:
        """The human-readable report printed at the end of a run."""
        label = f"{self.model} (smoke model: tiny random weights)" if self.smoke_model else self.model
        lines = [f"wanjax {self.command}: model {label}"]
        header = f"{'stage':<9}{'load s':>9}{'compile s':>11}{'run s':>9}   programs (from cache)"
        lines.append(header)
        for name, t in self.stages.items():
            lines.append(
                f"{name:<9}{t.load:>9.2f}{t.compile:>11.2f}{t.run:>9.2f}   {t.programs} ({t.cache_hits})"
            )
        if len(self.stages) > 1:
            load, comp, run = (
                sum(getattr(t, f) for t in self.stages.values()) for f in ("load", "compile", "run")
            )
            lines.append(f"{'all':<9}{load:>9.2f}{comp:>11.2f}{run:>9.2f}")
        if "mesh" in self.extra:
            lines.append(f"mesh: {self.extra['mesh']}")
        if self.steps is not None and self.steps.steps:
            split = self.computed_and_skipped()
            per_step = f"{self.steps.per_step:.3f} s/step"
            if split is not None:
                (computed, s_computed), (skipped, s_skipped) = split
                per_step = f"{computed} computed at {_seconds(s_computed)} s/step, {skipped} skipped at {_seconds(s_skipped)}"
            lines.append(
                f"denoise: {self.steps.steps} steps, {per_step} "
                f"(step program compile {self.steps.compile:.2f} s, first step {self.steps.first:.3f} s)"
            )
        if "cache" in self.extra:
            lines.append(cache_line(self.extra["cache"]))
        v = self.video
        if {"batch", "frames", "height", "width"} <= v.keys():
            fps = f" @ {v['fps']:g} fps" if "fps" in v else ""
            lines.append(f"video: {v['batch']} x {v['frames']} frames, {v['width']}x{v['height']}{fps}")
        elif v:
            lines.append("shape: " + ", ".join(f"{k} {value}" for k, value in v.items()))
        for kind, paths in self.outputs.items():
            lines.append(f"{kind}: {', '.join(paths) if isinstance(paths, list) else paths}")
        lines.append(f"total {self.total:.2f} s")
        return "\n".join(lines)

    def write_json(self, path: str | Path) -> Path:
        return write_text(path, json.dumps(self.to_dict(), indent=2) + "\n")
