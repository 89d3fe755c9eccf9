"""The job store of replicas: one PostgreSQL database (psycopg) that any number of ``wanjax serve``
processes on any number of machines share, with one shared ``--output_dir`` for the videos.

A replica claims a job with ``SELECT ... FOR UPDATE SKIP LOCKED`` (two replicas never take the same
one) and holds it by a lease on the database's clock, which its worker renews while it runs; the
replicas sweep jobs whose lease ran out back into the queue (:meth:`JobStore.sweep`). The folder and
the database are tied by a mark: a replica whose ``--output_dir`` is not the folder the others write
to (another machine's local folder, a share not mounted) is refused at start-up.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from wanjax.errors import ConfigError, WanjaxError, one_line
from wanjax.io.atomic import write_text
from wanjax.server.store import DEFAULT_LEASE, JobStore, lock_folder, redacted

MARK = ".wanjax-store"  # in --output_dir: the token the database's settings hold
SETTINGS = "CREATE TABLE IF NOT EXISTS wanjax_settings (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
SCHEMA_LOCK, QUEUE_LOCK = 0x77616E6A61780001, 0x77616E6A61780002  # advisory lock keys ("wanjax")


class PostgresJobStore(JobStore):
    """The job table in the database at ``url``, for replicas writing to ``output_dir``."""

    shared: ClassVar[bool] = True
    claim_lock: ClassVar[str] = " FOR UPDATE SKIP LOCKED"
    types: ClassVar[dict[str, str]] = {
        "seq": "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
        "real": "DOUBLE PRECISION",
    }

    def __init__(self, url: str, output_dir: str | Path, lease: float = DEFAULT_LEASE) -> None:
        super().__init__(lease)
        self.url = url
        self._lock = threading.Lock()
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        self._folder = lock_folder(Path(output_dir), shared=True)  # no SQLite server on it meanwhile
        try:
            self._conn = self._connect()
            self._set_up(Path(output_dir))
        except BaseException:
            self._folder.close()
            raise

    def _connect(self) -> Any:
        try:
            import psycopg
            from psycopg.rows import dict_row
        except ImportError:
            raise ConfigError(
                "--store postgresql:// needs psycopg (the serve extra): pip install 'wanjax[serve]'"
            ) from None
        try:
            return psycopg.connect(self.url, autocommit=True, row_factory=dict_row, connect_timeout=10)
        except psycopg.Error as e:
            raise WanjaxError(f"--store {redacted(self.url)}: cannot connect ({one_line(e)})") from None

    def _set_up(self, folder: Path) -> None:
        """The tables (made by the first replica, brought up to date), and the folder checked
        against the one the database's other replicas write to."""
        with self._transaction() as execute:
            execute("SELECT pg_advisory_xact_lock(?)", (SCHEMA_LOCK,))
            execute(self.schema())
            execute(SETTINGS)
            present = [
                row["column_name"]
                for row in execute(
                    "SELECT column_name FROM information_schema.columns "
                    "WHERE table_name='jobs' AND table_schema=current_schema()"
                ).fetchall()
            ]
            for statement in self.missing_columns(present):
                execute(statement)
            row = execute("SELECT value FROM wanjax_settings WHERE key='output_dir'").fetchone()
            mark = folder / MARK
            on_disk = mark.read_text().strip() if mark.exists() else None
            if row is None:
                token = on_disk or secrets.token_hex(8)
                if on_disk is None:
                    write_text(mark, f"{token}\n")
                execute("INSERT INTO wanjax_settings (key, value) VALUES ('output_dir', ?)", (token,))
            elif on_disk != row["value"]:
                raise WanjaxError(
                    f"--output_dir {folder} is not the folder the other replicas of {redacted(self.url)} "
                    "write their videos to: give every replica that same shared folder"
                )

    def close(self) -> None:
        with self._lock:
            self._conn.close()
        self._folder.close()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Any]:
        with self._lock:
            if self._conn.closed or self._conn.broken:  # the server restarted: connect again
                self._conn = self._connect()
            with self._conn.transaction():
                yield lambda sql, args=(): self._conn.execute(sql.replace("?", "%s"), args)

    def _now(self, execute: Any) -> float:
        return execute("SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8 AS now").fetchone()["now"]

    def _lock_queue(self, execute: Any) -> None:
        execute("SELECT pg_advisory_xact_lock(?)", (QUEUE_LOCK,))
