"""Stand-ins for the server's engine and multi-process channel: a worker's bookkeeping tested
without a model (the job-deletion, replica and batch tests)."""

from __future__ import annotations

from pathlib import Path

from wanjax.server.engine import RunResult
from wanjax.server.errors import ApiError


class FakeEngine:
    """Runs jobs as the real engine reports them (encode, each step, decode, each wanted job's files
    written) and calls ``hooks[point]()`` at ``start``, ``step1``..``stepN``, ``written``; a job whose
    params say ``"bad": "request"`` is refused when checked, ``"bad": "run"`` fails the run."""

    def __init__(self, root: Path):
        self.root, self.hooks, self.ran = root, {}, []

    def files(self, job_id: str) -> list[Path]:
        return [self.root / f"{job_id}.mp4", self.root / f"{job_id}.png"]

    def _hook(self, point: str) -> None:
        self.hooks.get(point, lambda: None)()

    def work(self, job_id, params):
        if params.get("bad") == "request":
            raise ApiError(400, f"job {job_id} cannot run here")
        return params

    def run(self, job_id, params, on_progress) -> RunResult:
        return self.run_batch({job_id: self.work(job_id, params)}, on_progress)[job_id]

    def run_batch(self, works, on_progress, wanted=lambda job_id: True) -> dict[str, RunResult]:
        self.ran.append(list(works) if len(works) > 1 else next(iter(works)))
        self._hook("start")
        on_progress("encode", 0)
        if any(params.get("bad") == "run" for params in works.values()):
            raise RuntimeError("the run failed")
        for step in range(1, next(iter(works.values()))["num_inference_steps"] + 1):
            self._hook(f"step{step}")
            on_progress("denoise", step)
        on_progress("decode", 0)
        kept = [job_id for job_id in works if wanted(job_id)]
        for path in (path for job_id in kept for path in self.files(job_id)):
            path.write_bytes(b"video")
        self._hook("written")
        result = RunResult(compiled_programs=1, compile_cache_hits=0, compile_seconds=0.1, run_seconds=0.2)
        return dict.fromkeys(kept, result)

    def batch_that_fits(self, params, most: int) -> int:
        return most

    def remove_files(self, job_id: str) -> None:
        for path in self.files(job_id):
            path.unlink(missing_ok=True)

    def remove_partial_files(self, job_id: str | None = None) -> None:
        for path in self.root.glob(".*.tmp" if job_id is None else f".{job_id}.*.tmp"):
            path.unlink()

    def job_message(self, job_id, params):
        return {"id": job_id}


class Channel:
    """A multi-process server's channel (its jobs cannot stop between steps)."""

    def send(self, message) -> None:
        pass
