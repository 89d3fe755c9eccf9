"""The job store of one server: a SQLite file (the standard library's ``sqlite3``) beside the videos,
its folder locked for that server alone."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from wanjax.server.store import DEFAULT_LEASE, JobStore, Swept, lock_folder

DATABASE = "jobs.sqlite3"


class SqliteJobStore(JobStore):
    """The job table in ``directory / DATABASE`` (created when missing, or brought up to date)."""

    types: ClassVar[dict[str, str]] = {"seq": "INTEGER PRIMARY KEY AUTOINCREMENT", "real": "REAL"}

    def __init__(self, directory: str | Path, lease: float = DEFAULT_LEASE) -> None:
        super().__init__(lease)
        self.path = Path(directory) / DATABASE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._folder = lock_folder(self.path.parent)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        # WAL with synchronous=NORMAL: a committed transaction survives the process being killed.
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        with self._transaction() as execute:
            execute(self.schema())
            present = [row["name"] for row in execute("PRAGMA table_info(jobs)").fetchall()]
            for statement in self.missing_columns(present):
                execute(statement)

    def close(self) -> None:
        with self._lock:
            self._db.close()
        self._folder.close()  # the folder's lock with it

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Any]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db.execute
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _now(self, execute: Any) -> float:
        return time.time()

    def recover(self) -> Swept:
        """At start-up: every job left running or deleted while it ran was this folder's one
        server's, which is gone (the folder's lock says so)."""
        return self.sweep(everything=True)
