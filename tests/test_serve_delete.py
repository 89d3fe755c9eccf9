"""Deleting a job while it runs, at each point a request can arrive: the job is gone for every reader
at once, never ends up completed, and leaves no file behind (a controllable worker, no server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from wanjax.server.engine import RunResult, Worker, delete_job
from wanjax.server.store import COMPLETED, JobStore

STEPS = 3
PARAMS = {"prompt": "p", "negative_prompt": "", "num_inference_steps": STEPS}


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

    def job_message(self, job_id, params):
        return {"id": job_id}


class Channel:
    """A multi-process server's channel (its jobs cannot stop between steps)."""

    def send(self, message) -> None:
        pass


@pytest.fixture
def parts(tmp_path):
    store = JobStore(tmp_path / "store")
    engine = FakeEngine(tmp_path)
    yield store, engine
    store.close()


def _gone(store: JobStore, job_id: str) -> bool:
    return store.get(job_id) is None and job_id not in [j.id for j in store.page(100)[0]]


@pytest.mark.parametrize("point", ["start", "step1", f"step{STEPS}", "written"])
@pytest.mark.parametrize("processes", [1, 2], ids=["one process", "multi-process"])
def test_a_job_deleted_while_it_runs_never_completes_and_leaves_no_file(parts, point, processes):
    """``start``: just after the worker took it, before its first step; ``written``: its files
    written, just before it would be recorded completed. One process stops at the next step; a
    multi-process server's job runs to its end first. Either way: gone at once, then no record and
    no file."""
    store, engine = parts
    job = store.add("j", PARAMS, max_queued=5)
    seen = {}

    def delete() -> None:
        assert delete_job(store, engine, job.id)
        seen["gone at once"] = _gone(store, job.id)
        assert not delete_job(store, engine, job.id)  # a second DELETE: 404

    engine.hooks[point] = delete
    Worker(engine, store, Channel() if processes == 2 else None)._run(store.next_queued())
    assert seen == {"gone at once": True}
    assert _gone(store, job.id) and store.delete(job.id) is False  # no record left at all
    assert not any(path.exists() for path in engine.files(job.id))


def test_a_job_deleted_after_it_completed_loses_its_files(parts):
    store, engine = parts
    job = store.add("j", PARAMS, max_queued=5)
    Worker(engine, store)._run(store.next_queued())
    assert store.get(job.id).status == COMPLETED and all(p.exists() for p in engine.files(job.id))
    assert delete_job(store, engine, job.id)
    assert _gone(store, job.id) and not any(p.exists() for p in engine.files(job.id))


def test_a_queued_job_deleted_never_runs(parts):
    store, engine = parts
    first, second = (store.add(name, PARAMS, max_queued=5) for name in ("first", "second"))
    engine.hooks["step1"] = lambda: delete_job(store, engine, second.id)  # while the first runs
    Worker(engine, store)._run(store.next_queued())
    assert store.next_queued() is None and engine.ran == [first.id]


def test_a_job_deleted_while_the_server_stops_is_not_requeued(parts):
    store, engine = parts
    job = store.add("j", PARAMS, max_queued=5)
    worker = Worker(engine, store)

    def stop_and_delete() -> None:
        worker._stopping.set()
        delete_job(store, engine, job.id)

    engine.hooks["step1"] = stop_and_delete
    worker._run(store.next_queued())
    assert store.delete(job.id) is False and store.next_queued() is None


def test_a_server_that_died_with_a_deleted_job_running_purges_it_at_start(parts):
    store, _ = parts
    job = store.add("j", PARAMS, max_queued=5)
    assert store.start(job.id) and store.remove(job.id) == "cancelled"
    assert store.recover() == ([], []) and store.get(job.id) is None  # not run again
    assert store.purge_cancelled() == [job.id] and store.delete(job.id) is False
