"""The server's job records and queue: one table, in SQLite (one server,
:mod:`~wanjax.server.sqlite_store`) or PostgreSQL (replicas, :mod:`~wanjax.server.postgres_store`).

The table is the queue: jobs run in the order they were accepted (``seq``). A replica takes the
oldest queued job in one transaction (:meth:`JobStore.claim`: the job becomes ``in_progress``, owned
by it, with a lease it renews while it runs), and a record reaches ``completed`` only after its video
is on disk, so a server that dies loses neither a finished video nor a record. A job whose owner
stopped renewing its lease (or, for SQLite, every running job when the one server starts again) goes
back to the queue to run again from the start; one that was already running when a server died
:data:`MAX_ATTEMPTS` times is marked ``failed`` instead, so a job that kills the process cannot keep
the servers from serving. Every change of a running job names its owner, so a replica that lost its
job records nothing about it. Every call is one transaction under one lock, so the web handlers'
threads and the worker share the store safely.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import secrets
import socket
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

from wanjax.errors import WanjaxError

LOCK = "serve.lock"  # held by the servers using the folder (the system drops it when a process ends)
QUEUED, IN_PROGRESS, COMPLETED, FAILED = "queued", "in_progress", "completed", "failed"
STATUSES = (QUEUED, IN_PROGRESS, COMPLETED, FAILED)
# A running job deleted: gone for every reader at once; its owner removes it and its files at its
# next step, or when it finishes (or the sweep after its lease ran out does, should it die first).
CANCELLED = "cancelled"
MAX_ATTEMPTS = 2  # a job running at MAX_ATTEMPTS deaths of its server fails (code "interrupted")
DEFAULT_LEASE = 30.0  # seconds a replica may go without renewing its job's lease
STORES = ("sqlite", "postgresql://")  # the --store values: the default, or a database URL

# The job table: (column, type); "seq" and "real" are each dialect's own (SqlDialect.types).
COLUMNS = (
    ("seq", "seq"),
    ("id", "TEXT NOT NULL UNIQUE"),
    ("created_at", "real NOT NULL"),
    ("params", "TEXT NOT NULL"),
    ("status", "TEXT NOT NULL"),
    ("stage", "TEXT"),
    ("step", "INTEGER NOT NULL DEFAULT 0"),
    ("progress", "INTEGER NOT NULL DEFAULT 0"),
    ("attempts", "INTEGER NOT NULL DEFAULT 0"),
    ("started_at", "real"),
    ("completed_at", "real"),
    ("error_code", "TEXT"),
    ("error_message", "TEXT"),
    ("compiled_programs", "INTEGER"),
    ("compile_cache_hits", "INTEGER"),
    ("compile_seconds", "real"),
    ("run_seconds", "real"),
    ("owner", "TEXT"),  # the replica running the job (in_progress or cancelled)
    ("lease_until", "real"),  # when it must have renewed its lease by
    ("lora_set", "TEXT NOT NULL DEFAULT ''"),  # the job's own LoRAs (jobs of one set run back to back)
    ("batch_key", "TEXT"),  # jobs of one key may run as one batch (None: alone)
)


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
    owner: str | None = None
    lease_until: float | None = None
    lora_set: str = ""
    batch_key: str | None = None

    @property
    def finished(self) -> bool:
        return self.status in (COMPLETED, FAILED)


@dataclasses.dataclass(frozen=True)
class Swept:
    """What a sweep of running jobs whose owner is gone did: ids put back in the queue, failed
    (interrupted :data:`MAX_ATTEMPTS` times), and removed (deleted while they ran; their files are
    the caller's to remove)."""

    requeued: list[str] = dataclasses.field(default_factory=list)
    failed: list[str] = dataclasses.field(default_factory=list)
    purged: list[str] = dataclasses.field(default_factory=list)


class QueueFull(Exception):
    """The queue holds its limit of waiting jobs."""


def lock_folder(folder: Path, shared: bool = False) -> Any:
    """The folder's :data:`LOCK` file, locked for this process alone (``flock``, naming it), or
    ``shared`` with the other replicas of one database; a WanjaxError when a server of the other
    kind holds it: two stores on one folder would run the same jobs."""
    handle = open(folder / LOCK, "a+")  # noqa: SIM115 (held open: the lock lives with the handle)
    try:
        fcntl.flock(handle, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip()
        handle.close()
        by = f" (process {holder})" if holder else " (replicas of a --store postgresql:// database)"
        raise WanjaxError(
            f"--output_dir {folder} is in use by another wanjax serve{by}; give each server its own folder"
        ) from None
    if not shared:
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
    return handle


def replica_name() -> str:
    """This process's name as a job's owner: host, process id and a random tag (unique per store)."""
    return f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(3)}"


def redacted(url: str) -> str:
    """A database URL without its password (for messages)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def check_store_flag(store: str) -> None:
    """``--store`` is ``sqlite`` or a PostgreSQL URL."""
    if store != "sqlite" and not store.startswith(("postgresql://", "postgres://")):
        raise WanjaxError(
            f"--store {redacted(store)!r}: give sqlite (one server) or a postgresql://USER@HOST/DATABASE URL"
        )


class JobStore:
    """The job table and its queue, in SQL both databases run (``?`` placeholders); subclasses give
    the connection, the transaction, the clock and the queue's locks."""

    shared: ClassVar[bool] = False  # other processes (replicas) run this store's jobs
    claim_lock: ClassVar[str] = ""  # appended to the claim's SELECT
    types: ClassVar[dict[str, str]] = {}  # the dialect's names for COLUMNS' "seq" and "real"

    def __init__(self, lease: float) -> None:
        self.owner = replica_name()
        self.lease = lease

    @classmethod
    def schema(cls) -> str:
        """``CREATE TABLE`` of :data:`COLUMNS` in this dialect."""
        columns = ",\n    ".join(f"{name} {cls.column_type(kind)}" for name, kind in COLUMNS)
        return f"CREATE TABLE IF NOT EXISTS jobs (\n    {columns}\n)"

    @classmethod
    def column_type(cls, kind: str) -> str:
        head, _, rest = kind.partition(" ")
        return " ".join(filter(None, (cls.types.get(head, head), rest)))

    def missing_columns(self, present: Sequence[str]) -> list[str]:
        """``ALTER TABLE`` statements adding the columns a table made by an earlier version lacks."""
        return [
            f"ALTER TABLE jobs ADD COLUMN {name} {self.column_type(kind)}"
            for name, kind in COLUMNS
            if name not in present
        ]

    def close(self) -> None:
        raise NotImplementedError

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Any]:
        """A transaction: yields ``execute(sql, args) -> cursor`` (rows as mappings)."""
        raise NotImplementedError
        yield

    def _now(self, execute: Any) -> float:
        """The store's clock (the database's, for replicas on several machines)."""
        raise NotImplementedError

    def _lock_queue(self, execute: Any) -> None:
        """Serialise adds with the queue-length check (SQLite's transactions already are)."""

    def sweep(self, everything: bool = False) -> Swept:
        """Running jobs whose owner is gone: their lease ran out (``everything``: all of them, the one
        SQLite server having just started) — back to the queue, failed after :data:`MAX_ATTEMPTS`,
        or, deleted while they ran, removed."""
        with self._transaction() as execute:
            now = self._now(execute)
            gone = "" if everything else " AND (lease_until IS NULL OR lease_until < ?)"
            args = () if everything else (now,)
            rows = execute(
                f"SELECT id, status, attempts FROM jobs WHERE status IN (?, ?){gone} ORDER BY seq{self.claim_lock}",
                (IN_PROGRESS, CANCELLED, *args),
            ).fetchall()
            swept = Swept()
            for row in rows:
                if row["status"] == CANCELLED:
                    swept.purged.append(row["id"])
                    execute("DELETE FROM jobs WHERE id=?", (row["id"],))
                elif row["attempts"] >= MAX_ATTEMPTS:
                    swept.failed.append(row["id"])
                    message = f"a server stopped while running this job {MAX_ATTEMPTS} times; not retried"
                    execute(
                        "UPDATE jobs SET status=?, stage=NULL, completed_at=?, error_code=?, error_message=?, "
                        "owner=NULL, lease_until=NULL WHERE id=?",
                        (FAILED, now, "interrupted", message, row["id"]),
                    )
                else:
                    swept.requeued.append(row["id"])
                    execute(
                        "UPDATE jobs SET status=?, stage=NULL, step=0, progress=0, started_at=NULL, "
                        "owner=NULL, lease_until=NULL WHERE id=?",
                        (QUEUED, row["id"]),
                    )
        return swept

    def recover(self) -> Swept:
        """At start-up: the jobs a dead server left running (:meth:`sweep`)."""
        return self.sweep()

    def add(
        self,
        job_id: str,
        params: dict[str, Any],
        max_queued: int,
        lora_set: str = "",
        batch_key: str | None = None,
    ) -> Job:
        """A new queued job (``lora_set``: its LoRAs, as text; ``batch_key``: which jobs it may run
        with); :class:`QueueFull` when ``max_queued`` jobs already wait."""
        with self._transaction() as execute:
            self._lock_queue(execute)
            waiting = execute("SELECT COUNT(*) AS n FROM jobs WHERE status=?", (QUEUED,)).fetchone()["n"]
            if waiting >= max_queued:
                raise QueueFull(waiting)
            execute(
                "INSERT INTO jobs (id, created_at, params, status, lora_set, batch_key) VALUES (?, ?, ?, ?, ?, ?)",
                (job_id, self._now(execute), json.dumps(params), QUEUED, lora_set, batch_key),
            )
        job = self.get(job_id)
        assert job is not None
        return job

    def get(self, job_id: str) -> Job | None:
        """The job (None: none, or deleted while it runs)."""
        with self._transaction() as execute:
            row = execute("SELECT * FROM jobs WHERE id=? AND status!=?", (job_id, CANCELLED)).fetchone()
        return None if row is None else _job(row)

    def claim(self, lora_set: str | None = None) -> Job | None:
        """The oldest waiting job (of the LoRA set ``lora_set`` if one waits: the weights need no
        change), now running here (one more attempt, a fresh lease); None when none waits. Another
        replica's claim at the same moment takes the next one."""
        preferred = [("lora_set=?", lora_set)] if lora_set is not None else []
        for condition in (*preferred, None):
            jobs = self._take(condition, 1)
            if jobs:
                return jobs[0]
        return None

    def claim_alike(self, job: Job, most: int) -> list[Job]:
        """Up to ``most`` of the oldest waiting jobs of ``job``'s batch key, now running here (a batch
        with it)."""
        if job.batch_key is None or most < 1:
            return []
        return self._take(("batch_key=?", job.batch_key), most)

    def _take(self, condition: tuple[str, Any] | None, most: int) -> list[Job]:
        """The oldest ``most`` waiting jobs (meeting ``condition``: SQL and its argument), claimed."""
        where, args = ("", ()) if condition is None else (f" AND {condition[0]}", (condition[1],))
        with self._transaction() as execute:
            rows = execute(
                f"SELECT id FROM jobs WHERE status=?{where} ORDER BY seq LIMIT ?{self.claim_lock}",
                (QUEUED, *args, most),
            ).fetchall()
            now = self._now(execute)
            taken = []
            for row in rows:
                execute(
                    "UPDATE jobs SET status=?, started_at=?, attempts=attempts+1, progress=0, owner=?, "
                    "lease_until=? WHERE id=?",
                    (IN_PROGRESS, now, self.owner, now + self.lease, row["id"]),
                )
                taken.append(_job(execute("SELECT * FROM jobs WHERE id=?", (row["id"],)).fetchone()))
        return taken

    def renew(self, job_id: str) -> bool:
        """This replica still runs the job: its lease from now on; False when the job is no longer its
        own (its lease ran out and another replica took it, or it was deleted and swept)."""
        with self._transaction() as execute:
            cursor = execute(
                "UPDATE jobs SET lease_until=? WHERE id=? AND owner=? AND status IN (?, ?)",
                (self._now(execute) + self.lease, job_id, self.owner, IN_PROGRESS, CANCELLED),
            )
        return cursor.rowcount == 1

    def page(self, limit: int, after: str | None = None, newest_first: bool = True) -> tuple[list[Job], bool]:
        """Up to ``limit`` jobs after the job ``after`` (LookupError if unknown) in the order asked,
        and whether more follow."""
        with self._transaction() as execute:
            bound, args = "", ()
            if after is not None:
                row = execute("SELECT seq FROM jobs WHERE id=? AND status!=?", (after, CANCELLED)).fetchone()
                if row is None:
                    raise LookupError(after)
                bound, args = ("AND seq < ?" if newest_first else "AND seq > ?"), (row["seq"],)
            order = "DESC" if newest_first else "ASC"
            rows = execute(
                f"SELECT * FROM jobs WHERE status!=? {bound} ORDER BY seq {order} LIMIT ?",
                (CANCELLED, *args, limit + 1),
            ).fetchall()
        return [_job(r) for r in rows[:limit]], len(rows) > limit

    def counts(self) -> dict[str, int]:
        """Jobs per status."""
        with self._transaction() as execute:
            rows = execute("SELECT status, COUNT(*) AS n FROM jobs GROUP BY status").fetchall()
        found = {r["status"]: r["n"] for r in rows}
        return {status: found.get(status, 0) for status in STATUSES}

    def _update_own(self, job_id: str, assignments: str, args: tuple[Any, ...]) -> bool:
        """``UPDATE`` a job this replica runs; False when it is not (any more)."""
        with self._transaction() as execute:
            values = tuple(self._now(execute) if a is _NOW else a for a in args)
            cursor = execute(
                f"UPDATE jobs SET {assignments} WHERE id=? AND status=? AND owner=?",
                (*values, job_id, IN_PROGRESS, self.owner),
            )
        return cursor.rowcount == 1

    def progress(self, job_id: str, stage: str, step: int, progress: int) -> bool:
        """The running job's progress; False when it is no longer running here (deleted meanwhile)."""
        return self._update_own(job_id, "stage=?, step=?, progress=?", (stage, step, progress))

    def requeue(self, job_id: str) -> bool:
        """A running job back to the queue (the server is stopping; it runs again after a restart or
        on another replica); False when it is no longer running here."""
        return self._update_own(
            job_id,
            "status=?, stage=NULL, step=0, progress=0, started_at=NULL, owner=NULL, lease_until=NULL, "
            "attempts=CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END",
            (QUEUED,),
        )

    def complete(
        self,
        job_id: str,
        compiled_programs: int,
        compile_cache_hits: int,
        compile_seconds: float,
        run_seconds: float,
    ) -> bool:
        """The running job's files are written: it is done. False (nothing changed) when it is no
        longer running here (deleted meanwhile: see :meth:`discard`)."""
        return self._update_own(
            job_id,
            "status=?, stage=NULL, progress=100, completed_at=?, compiled_programs=?, compile_cache_hits=?, "
            "compile_seconds=?, run_seconds=?, owner=NULL, lease_until=NULL",
            (COMPLETED, _NOW, compiled_programs, compile_cache_hits, compile_seconds, run_seconds),
        )

    def fail(self, job_id: str, code: str, message: str) -> bool:
        """The running job failed; False (nothing changed) when it is no longer running here."""
        return self._update_own(
            job_id,
            "status=?, stage=NULL, completed_at=?, error_code=?, error_message=?, owner=NULL, lease_until=NULL",
            (FAILED, _NOW, code, message),
        )

    def discard(self, job_id: str) -> bool:
        """The record of a job deleted while this replica ran it, removed; True when it was (its
        files are then the caller's to remove), False when the job is not such a job of this
        replica's (another replica took it over: its files are that one's)."""
        with self._transaction() as execute:
            cursor = execute(
                "DELETE FROM jobs WHERE id=? AND status=? AND owner=?", (job_id, CANCELLED, self.owner)
            )
        return cursor.rowcount == 1

    def remove(self, job_id: str) -> str | None:
        """``DELETE``, in one transaction: a job not running loses its record (``"deleted"``: its files
        are the caller's to remove); a running one is marked :data:`CANCELLED` (``"cancelled"``: gone
        for readers; its owner removes it); None when there is no such job."""
        with self._transaction() as execute:
            cursor = execute(
                "DELETE FROM jobs WHERE id=? AND status NOT IN (?, ?)", (job_id, IN_PROGRESS, CANCELLED)
            )
            if cursor.rowcount == 1:
                return "deleted"
            cursor = execute(
                "UPDATE jobs SET status=? WHERE id=? AND status=?", (CANCELLED, job_id, IN_PROGRESS)
            )
        return "cancelled" if cursor.rowcount == 1 else None

    def delete(self, job_id: str) -> bool:
        """Remove a job's record, whatever its state; False if there was none."""
        with self._transaction() as execute:
            cursor = execute("DELETE FROM jobs WHERE id=?", (job_id,))
        return cursor.rowcount == 1


_NOW = object()  # in :meth:`JobStore._update_own`'s arguments: the store's clock


def _job(row: Any) -> Job:
    values = dict(row)
    values["params"] = json.loads(values["params"])
    return Job(**values)
