"""The server's job records: one SQLite table (the standard library's ``sqlite3``) beside the videos.

The table is the queue: jobs run in the order they were accepted (``seq``), and a record reaches
``completed`` only after its video is on disk, so a server that dies loses neither a finished video
nor a record. Opening the store after such a death puts every job that was ``queued`` or
``in_progress`` back in the queue (to run again from the start); one that was already running when
the server died :data:`MAX_ATTEMPTS` times is marked ``failed`` instead, so a job that kills the
process cannot keep a restarted server from serving. Every call is one transaction under one lock,
so the web handlers' threads and the worker share the store safely.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from wanjax.errors import WanjaxError

DATABASE = "jobs.sqlite3"
LOCK = "serve.lock"  # held by the one server using the folder (the system drops it when that process ends)
QUEUED, IN_PROGRESS, COMPLETED, FAILED = "queued", "in_progress", "completed", "failed"
STATUSES = (QUEUED, IN_PROGRESS, COMPLETED, FAILED)
# A running job deleted: gone for every reader at once; the worker removes it and its files at its
# next step, or when it finishes (or the next server start does, should this one die first).
CANCELLED = "cancelled"
MAX_ATTEMPTS = 2  # a job running at MAX_ATTEMPTS deaths of the server fails (code "interrupted")

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    created_at REAL NOT NULL,
    params TEXT NOT NULL,
    status TEXT NOT NULL,
    stage TEXT,
    step INTEGER NOT NULL DEFAULT 0,
    progress INTEGER NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    started_at REAL,
    completed_at REAL,
    error_code TEXT,
    error_message TEXT,
    compiled_programs INTEGER,
    compile_cache_hits INTEGER,
    compile_seconds REAL,
    run_seconds REAL
)
"""


@dataclasses.dataclass(frozen=True)
class Job:
    """One job's record: its request (``params``, the API's fields after defaults) and its state."""

    seq: int
    id: str
    created_at: float
    params: dict[str, Any]
    status: str
    stage: str | None = None
    step: int = 0
    progress: int = 0
    attempts: int = 0
    started_at: float | None = None
    completed_at: float | None = None
    error_code: str | None = None
    error_message: str | None = None
    compiled_programs: int | None = None
    compile_cache_hits: int | None = None
    compile_seconds: float | None = None
    run_seconds: float | None = None

    @property
    def finished(self) -> bool:
        return self.status in (COMPLETED, FAILED)


class QueueFull(Exception):
    """The queue holds its limit of waiting jobs."""


def lock_folder(folder: Path) -> Any:
    """The folder's :data:`LOCK` file, locked for this process alone (``flock``) and naming it; a
    WanjaxError naming the process that holds it otherwise: two servers on one folder would run the
    same jobs."""
    handle = open(folder / LOCK, "a+")  # noqa: SIM115 (held open: the lock lives with the handle)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip()
        handle.close()
        by = f" (process {holder})" if holder else ""
        raise WanjaxError(
            f"--output_dir {folder} is in use by another wanjax serve{by}; give each server its own folder"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


class JobStore:
    """The job table in ``directory / DATABASE`` (created when missing)."""

    def __init__(self, directory: str | Path) -> None:
        self.path = Path(directory) / DATABASE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._folder = lock_folder(self.path.parent)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        # WAL with synchronous=NORMAL: a committed transaction survives the process being killed.
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()
        self._folder.close()  # the folder's lock with it

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def recover(self) -> tuple[list[str], list[str]]:
        """After a restart: jobs left ``queued`` or ``in_progress`` go back to the queue, those already
        interrupted :data:`MAX_ATTEMPTS` times fail. Returns ``(requeued ids, failed ids)``."""
        with self._transaction() as db:
            rows = db.execute(
                "SELECT id, attempts FROM jobs WHERE status IN (?, ?) ORDER BY seq", (QUEUED, IN_PROGRESS)
            ).fetchall()
            failed = [r["id"] for r in rows if r["attempts"] >= MAX_ATTEMPTS]
            requeued = [r["id"] for r in rows if r["attempts"] < MAX_ATTEMPTS]
            for job_id in failed:
                message = f"the server stopped while running this job {MAX_ATTEMPTS} times; not retried"
                db.execute(
                    "UPDATE jobs SET status=?, stage=NULL, completed_at=?, error_code=?, error_message=? "
                    "WHERE id=?",
                    (FAILED, time.time(), "interrupted", message, job_id),
                )
            db.execute(
                "UPDATE jobs SET status=?, stage=NULL, step=0, progress=0, started_at=NULL WHERE status=?",
                (QUEUED, IN_PROGRESS),
            )
        return requeued, failed

    def add(self, job_id: str, params: dict[str, Any], max_queued: int) -> Job:
        """A new queued job; :class:`QueueFull` when ``max_queued`` jobs already wait."""
        with self._transaction() as db:
            (waiting,) = db.execute("SELECT COUNT(*) FROM jobs WHERE status=?", (QUEUED,)).fetchone()
            if waiting >= max_queued:
                raise QueueFull(waiting)
            db.execute(
                "INSERT INTO jobs (id, created_at, params, status) VALUES (?, ?, ?, ?)",
                (job_id, time.time(), json.dumps(params), QUEUED),
            )
        job = self.get(job_id)
        assert job is not None
        return job

    def get(self, job_id: str) -> Job | None:
        """The job (None: none, or deleted while it runs)."""
        with self._lock:
            row = self._db.execute(
                "SELECT * FROM jobs WHERE id=? AND status!=?", (job_id, CANCELLED)
            ).fetchone()
        return None if row is None else _job(row)

    def next_queued(self) -> Job | None:
        """The oldest waiting job (FIFO)."""
        with self._lock:
            row = self._db.execute(
                "SELECT * FROM jobs WHERE status=? ORDER BY seq LIMIT 1", (QUEUED,)
            ).fetchone()
        return None if row is None else _job(row)

    def page(self, limit: int, after: str | None = None, newest_first: bool = True) -> tuple[list[Job], bool]:
        """Up to ``limit`` jobs after the job ``after`` (LookupError if unknown) in the order asked,
        and whether more follow."""
        with self._lock:
            bound, args = "", ()
            if after is not None:
                row = self._db.execute(
                    "SELECT seq FROM jobs WHERE id=? AND status!=?", (after, CANCELLED)
                ).fetchone()
                if row is None:
                    raise LookupError(after)
                bound, args = ("AND seq < ?" if newest_first else "AND seq > ?"), (row["seq"],)
            order = "DESC" if newest_first else "ASC"
            rows = self._db.execute(
                f"SELECT * FROM jobs WHERE status!=? {bound} ORDER BY seq {order} LIMIT ?",
                (CANCELLED, *args, limit + 1),
            ).fetchall()
        return [_job(r) for r in rows[:limit]], len(rows) > limit

    def counts(self) -> dict[str, int]:
        """Jobs per status."""
        with self._lock:
            rows = self._db.execute("SELECT status, COUNT(*) AS n FROM jobs GROUP BY status").fetchall()
        found = {r["status"]: r["n"] for r in rows}
        return {status: found.get(status, 0) for status in STATUSES}

    def start(self, job_id: str) -> bool:
        """Mark a queued job as running (one more attempt); False if it is no longer queued."""
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE jobs SET status=?, started_at=?, attempts=attempts+1, progress=0 "
                "WHERE id=? AND status=?",
                (IN_PROGRESS, time.time(), job_id, QUEUED),
            )
        return cursor.rowcount == 1

    def progress(self, job_id: str, stage: str, step: int, progress: int) -> bool:
        """The running job's progress; False when it is no longer running (deleted meanwhile)."""
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE jobs SET stage=?, step=?, progress=? WHERE id=? AND status=?",
                (stage, step, progress, job_id, IN_PROGRESS),
            )
        return cursor.rowcount == 1

    def requeue(self, job_id: str) -> bool:
        """A running job back to the queue (the server is stopping; it runs again after a restart);
        False when it is no longer running."""
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE jobs SET status=?, stage=NULL, step=0, progress=0, started_at=NULL, "
                "attempts=MAX(attempts-1, 0) WHERE id=? AND status=?",
                (QUEUED, job_id, IN_PROGRESS),
            )
        return cursor.rowcount == 1

    def complete(
        self,
        job_id: str,
        compiled_programs: int,
        compile_cache_hits: int,
        compile_seconds: float,
        run_seconds: float,
    ) -> bool:
        """The running job's files are written: it is done. False (nothing changed) when it was
        deleted meanwhile: its files are the caller's to remove."""
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE jobs SET status=?, stage=NULL, progress=100, completed_at=?, compiled_programs=?, "
                "compile_cache_hits=?, compile_seconds=?, run_seconds=? WHERE id=? AND status=?",
                (
                    COMPLETED,
                    time.time(),
                    compiled_programs,
                    compile_cache_hits,
                    compile_seconds,
                    run_seconds,
                    job_id,
                    IN_PROGRESS,
                ),
            )
        return cursor.rowcount == 1

    def fail(self, job_id: str, code: str, message: str) -> bool:
        """The running job failed; False (nothing changed) when it was deleted meanwhile."""
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE jobs SET status=?, stage=NULL, completed_at=?, error_code=?, error_message=? "
                "WHERE id=? AND status=?",
                (FAILED, time.time(), code, message, job_id, IN_PROGRESS),
            )
        return cursor.rowcount == 1

    def remove(self, job_id: str) -> str | None:
        """``DELETE``, in one transaction: a job not running loses its record (``"deleted"``: its files
        are the caller's to remove); a running one is marked :data:`CANCELLED` (``"cancelled"``: gone
        for readers; its worker removes it); None when there is no such job."""
        with self._transaction() as db:
            cursor = db.execute(
                "DELETE FROM jobs WHERE id=? AND status NOT IN (?, ?)", (job_id, IN_PROGRESS, CANCELLED)
            )
            if cursor.rowcount == 1:
                return "deleted"
            cursor = db.execute(
                "UPDATE jobs SET status=? WHERE id=? AND status=?", (CANCELLED, job_id, IN_PROGRESS)
            )
        return "cancelled" if cursor.rowcount == 1 else None

    def delete(self, job_id: str) -> bool:
        """Remove a job's record, whatever its state; False if there was none."""
        with self._transaction() as db:
            cursor = db.execute("DELETE FROM jobs WHERE id=?", (job_id,))
        return cursor.rowcount == 1

    def purge_cancelled(self) -> list[str]:
        """The records of jobs deleted while they ran, removed (a server that died before its worker
        could); their ids, whose files are the caller's to remove."""
        with self._transaction() as db:
            ids = [r["id"] for r in db.execute("SELECT id FROM jobs WHERE status=?", (CANCELLED,))]
            db.execute("DELETE FROM jobs WHERE status=?", (CANCELLED,))
        return ids


def _job(row: sqlite3.Row) -> Job:
    values = dict(row)
    values["params"] = json.loads(values["params"])
    return Job(**values)
