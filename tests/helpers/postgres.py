"""A private PostgreSQL server for the replica tests: Debian's ``postgresql`` binaries, a fresh
cluster in a temporary folder, listening on 127.0.0.1 only (run as the ``postgres`` user when the
tests run as root, which PostgreSQL refuses)."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest


def binaries() -> Path | None:
    """The folder of ``initdb`` and ``pg_ctl`` (Debian puts them under /usr/lib/postgresql/N/bin)."""
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(versions[-1]).parent if versions else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PostgresServer:
    """``initdb`` + ``pg_ctl start`` in a new folder of the system's temporary directory (the
    ``postgres`` user cannot enter pytest's); :attr:`url` the server's first database."""

    def __init__(self) -> None:
        bin_dir = binaries()
        if bin_dir is None:
            message = "the replica tests need PostgreSQL's server: apt-get install postgresql"
            if os.environ.get("CI"):
                pytest.fail(message)
            pytest.skip(message)
        self.root = root = Path(tempfile.mkdtemp(prefix="wanjax-postgres-"))
        self.bin, self.data, self.port = bin_dir, root / "data", free_port()
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            shutil.chown(root, "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "wanjax", "--no-sync")
        options = f"-p {self.port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(root / "log"), "-w", "start")
        self.url = f"postgresql://wanjax@127.0.0.1:{self.port}/postgres"

    def _run(self, program: str, *args: str) -> None:
        done = subprocess.run(
            [*self.as_user, str(self.bin / program), *args], capture_output=True, text=True, cwd="/"
        )
        if done.returncode != 0:
            raise RuntimeError(f"{program} failed ({done.returncode}): {done.stdout}{done.stderr}")

    def database(self, name: str) -> str:
        """A new empty database's URL."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url.rsplit("/", 1)[0] + f"/{name}"

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)
