"""Stand-ins for the server's engine and multi-process channel: a worker's bookkeeping tested
without a model (the job-deletion and replica tests)."""

from __future__ import annotations

from pathlib import Path

from wanjax.server.engine import RunResult


class FakeEngine:
    """Runs a job as the real engine reports it (encode, each step, decode, files written) and calls
    ``hooks[point]()`` at ``start``, ``step1``..``stepN``, ``written``."""

    def __init__(self, root: Path):
        self.root, self.hooks, self.ran = root, {}, []

    def files(self, job_id: str) -> list[Path]:
        return [self.root / f"{job_id}.mp4", self.root / f"{job_id}.png"]

    def _hook(self, point: str) -> None:
        self.hooks.get(point, lambda: None)()

    def run(self, job_id, params, on_progress) -> RunResult:
        self.ran.append(job_id)
        self._hook("start")
        on_progress("encode", 0)
        for step in range(1, params["num_inference_steps"] + 1):
            self._hook(f"step{step}")
            on_progress("denoise", step)
        on_progress("decode", 0)
        for path in self.files(job_id):
            path.write_bytes(b"video")
        self._hook("written")
        return RunResult(compiled_programs=1, compile_cache_hits=0, compile_seconds=0.1, run_seconds=0.2)

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
