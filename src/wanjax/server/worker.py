"""The server's worker: the thread that takes queued jobs from the store, oldest first, runs them on
the engine (several alike as one batch, up to ``--max_batch``), and records how each ended.

Whether a job was deleted meanwhile (:meth:`JobStore.remove`) the store says, at each step and at the
end, atomically with the step's or the end's record: a deleted job never completes, and its files go
with it; in a batch the others run on. With replicas a heartbeat renews the running jobs' leases; a
job whose lease was lost is the replica's that took it over, and this one records nothing about it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import traceback
from collections.abc import Callable

from wanjax.errors import WanjaxError, one_line
from wanjax.server.api import steps_run
from wanjax.server.engine import Engine, JobChannel, RunResult
from wanjax.server.errors import ApiError
from wanjax.server.store import Job, JobStore, Swept

log = logging.getLogger("wanjax.serve")
GROUP_RUN = 8  # jobs of the LoRA set in use run before an older job of another set, at most


class Cancelled(Exception):
    """Every job of the run was deleted while it ran."""


class Stopping(Exception):
    """The server is stopping; the running jobs go back to the queue."""


class LeaseLost(Exception):
    """This replica's leases on the run's jobs ran out and other replicas took them over."""


class Worker:
    """The thread that runs queued jobs, oldest first (with ``max_batch`` > 1, the waiting jobs alike
    with them as one batch)."""

    def __init__(
        self, engine: Engine, store: JobStore, channel: JobChannel | None = None, max_batch: int = 1
    ) -> None:
        self.engine, self.store, self.channel = engine, store, channel
        self.max_batch = 1 if channel is not None else max_batch  # a pod's processes run one job each
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._lora_set, self._streak = "", 0  # the LoRA set of the jobs run last, how many in a row
        self.requeued = 0  # running jobs put back in the queue as the server stopped
        self._thread = threading.Thread(target=self._loop, name="wanjax-worker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def notify(self) -> None:
        """A job was queued."""
        self._wake.set()

    def stop(self, timeout: float | None = None) -> None:
        """Stop after the current step (its jobs go back to the queue); wait for the thread."""
        self._stopping.set()
        self._wake.set()
        self._thread.join(timeout)
        if self.channel is not None:
            self.channel.send(None)

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                if not self.run_next():
                    self._wake.wait(1.0)
                    self._wake.clear()
            except Exception:  # the store itself failed (a full disk, a lost database, ...): log, go on
                log.error("the worker could not run a job:\n%s", traceback.format_exc())
                self._stopping.wait(1.0)

    def run_next(self) -> bool:
        """Claim the next job (a waiting one of the LoRA set in use first, :data:`GROUP_RUN` at most in
        a row) and the jobs alike with it, and run them; False when no job waits."""
        if self.store.shared:  # jobs of replicas that died, back in the queue
            clean_up(self.engine, self.store.sweep())
        job = self.store.claim(self._lora_set if self._streak < GROUP_RUN else None)
        if job is None:
            return False
        self._streak = self._streak + 1 if job.lora_set == self._lora_set else 1
        self._lora_set = job.lora_set
        self._run_batch([job, *self._alike(job)])
        return True

    def _alike(self, job: Job) -> list[Job]:
        """Waiting jobs that run in one batch with ``job``, claimed: as many as ``--max_batch`` and the
        device's memory (by ``wanjax plan``'s estimate) allow."""
        if self.max_batch < 2 or job.batch_key is None:
            return []
        room = self.engine.batch_that_fits(job.params, self.max_batch)
        return self.store.claim_alike(job, room - 1) if room > 1 else []

    def _run(self, job: Job) -> None:
        """Run one job this replica claimed (:meth:`JobStore.claim`)."""
        self._run_batch([job])

    def _run_batch(self, jobs: list[Job]) -> None:
        """Run the jobs this replica claimed, as one batch when there are several; a job the store
        took no record of (deleted while it ran, or lost) loses its files if it was this replica's."""
        ids = [job.id for job in jobs]
        with Heartbeat(self.store, ids) if self.store.shared else contextlib.nullcontext() as heart:
            recorded = self._record(jobs, heart)
        for job_id, done in recorded.items():
            if not done:
                self._discard(job_id)

    def _record(self, jobs: list[Job], heart: Heartbeat | None) -> dict[str, bool]:
        """Run the jobs and record how each ended; False for a job the store took no record of."""
        steps = steps_run(jobs[0].params)
        interruptible = self.channel is None  # every process must finish a job it started together
        running = {job.id for job in jobs}  # the jobs still run for (not deleted, not lost)

        def on_progress(stage: str, done: int) -> None:
            if heart is not None:
                running.difference_update(heart.lost())
                if not running:
                    raise LeaseLost
            if interruptible and self._stopping.is_set():
                raise Stopping
            percent = {"encode": 1, "denoise": 2 + 93 * done // max(steps, 1), "decode": 95}[stage]
            for job_id in sorted(running):
                if not self.store.progress(job_id, stage, done, percent) and interruptible:
                    running.discard(job_id)
            if not running:
                raise Cancelled

        recorded: dict[str, bool] = {}
        if len(jobs) == 1:
            job = jobs[0]
            if self.channel is not None:
                self.channel.send(self.engine.job_message(job.id, job.params))
            run: Callable[[], dict[str, RunResult]] = lambda: {  # noqa: E731
                job.id: self.engine.run(job.id, job.params, on_progress)
            }
        else:
            works = {}
            for job in jobs:  # a job the server can no longer run fails alone
                try:
                    works[job.id] = self.engine.work(job.id, job.params)
                except ApiError as e:
                    recorded[job.id] = self.store.fail(job.id, "invalid_request", e.message)
                    running.discard(job.id)
            jobs = [job for job in jobs if job.id in works]
            if not jobs:
                return recorded
            run = lambda: self.engine.run_batch(works, on_progress, running.__contains__)  # noqa: E731
        try:
            results = run()
        except (Cancelled, LeaseLost):
            results = {}
        except Stopping:
            back = {job.id: self.store.requeue(job.id) for job in jobs}
            self.requeued += sum(back.values())
            return recorded | back
        except Exception as e:
            if len(jobs) > 1:  # each job's error its own: run them one by one
                log.warning("a batch of %d jobs failed (%s); running them one by one", len(jobs), one_line(e))
                for job in jobs:
                    recorded |= self._record([job], heart)
                return recorded
            return recorded | {jobs[0].id: self._fail(jobs[0].id, e)}
        for job in jobs:
            result = results.get(job.id)
            recorded[job.id] = result is not None and self.store.complete(
                job.id, **dataclasses.asdict(result)
            )
            if recorded[job.id]:
                log.info(
                    "job %s completed in %.2f s (%d programs compiled%s)",
                    job.id,
                    result.run_seconds,
                    result.compiled_programs,
                    f"; a batch of {len(jobs)}" if len(jobs) > 1 else "",
                )
        return recorded

    def _fail(self, job_id: str, error: Exception) -> bool:
        """Record the job's failure (its code from the kind of error)."""
        if isinstance(error, ApiError):  # the model or server changed since it was queued
            return self.store.fail(job_id, "invalid_request", error.message)
        if isinstance(error, WanjaxError):
            return self.store.fail(job_id, "generation_failed", one_line(error))
        log.error("job %s failed:\n%s", job_id, "".join(traceback.format_exception(error)))
        return self.store.fail(job_id, "server_error", f"{type(error).__name__}: {one_line(error)}"[:500])

    def _discard(self, job_id: str) -> None:
        """A job deleted while it ran here loses its record and files (one another replica took
        over keeps both)."""
        if self.store.discard(job_id):
            self.engine.remove_files(job_id)


class Heartbeat:
    """While jobs run: their leases renewed every quarter lease; :meth:`lost` the ids no longer this
    replica's."""

    def __init__(self, store: JobStore, job_ids: list[str]) -> None:
        self.store, self.job_ids = store, job_ids
        self._lost: set[str] = set()
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="wanjax-lease", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def lost(self) -> set[str]:
        """The jobs whose lease was lost."""
        with self._lock:
            return set(self._lost)

    def _beat(self) -> None:
        while not self._done.wait(self.store.lease / 4):
            for job_id in sorted(set(self.job_ids) - self.lost()):
                try:
                    if not self.store.renew(job_id):
                        with self._lock:
                            self._lost.add(job_id)
                except Exception:  # the database is unreachable for now: the lease may yet hold
                    log.warning("could not renew the lease of job %s:\n%s", job_id, traceback.format_exc())


def clean_up(engine: Engine, swept: Swept) -> None:
    """The files of the jobs a store's sweep found without their server: those deleted while they ran
    lose them all, those back in the queue or failed the files their server left half-written."""
    for job_id in swept.purged:
        engine.remove_files(job_id)
    for job_id in (*swept.requeued, *swept.failed):
        engine.remove_partial_files(job_id)


def delete_job(store: JobStore, engine: Engine, job_id: str) -> bool:
    """``DELETE /v1/videos/{id}``: the job is gone for every reader at once; a job not running loses
    its files now, a running one at its worker's next step or end. False when there is no such job."""
    outcome = store.remove(job_id)
    if outcome == "deleted":
        engine.remove_files(job_id)
    return outcome is not None
