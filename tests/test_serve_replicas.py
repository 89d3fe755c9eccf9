"""Replicas: ``wanjax serve`` processes sharing one PostgreSQL job queue and one output folder. Each
job runs on exactly one replica; a replica that dies or goes silent loses its job to another, and
records nothing about it afterwards (a private PostgreSQL server, :mod:`helpers.postgres`)."""

from __future__ import annotations

import collections
import re
import threading
import time

import psycopg
import pytest
from helpers.serve_fakes import FakeEngine
from helpers.serve_process import TERMINATED, Server, serve_mistake
from helpers.small_video import SMALL_JOB

from wanjax.errors import WanjaxError
from wanjax.server.postgres_store import PostgresJobStore
from wanjax.server.sqlite_store import SqliteJobStore
from wanjax.server.store import COMPLETED, IN_PROGRESS, Swept
from wanjax.server.worker import Worker, clean_up

PARAMS = {"prompt": "p", "negative_prompt": "", "num_inference_steps": 3}


@pytest.fixture
def replicas(postgres_url, tmp_path):
    """Two replicas' stores on one database and one folder (short leases)."""
    stores = [PostgresJobStore(postgres_url, tmp_path / "shared", lease=0.4) for _ in range(2)]
    yield stores
    for store in stores:
        store.close()


def test_two_replicas_claiming_at_once_take_each_job_once(replicas):
    first, second = replicas
    for n in range(20):
        (first if n % 2 else second).add(f"job{n}", PARAMS, max_queued=100)
    taken: dict[str, list[str]] = {store.owner: [] for store in replicas}

    def drain(store: PostgresJobStore) -> None:
        while (job := store.claim()) is not None:
            taken[store.owner].append(job.id)
            assert store.complete(job.id, 0, 0, 0.0, 0.0)

    threads = [threading.Thread(target=drain, args=(store,)) for store in replicas]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    everything = [job_id for ids in taken.values() for job_id in ids]
    assert sorted(everything) == sorted(f"job{n}" for n in range(20))  # each once, none left
    assert first.counts()[COMPLETED] == 20
    assert all(job.attempts == 1 for job in first.page(100)[0])


def test_a_silent_replicas_job_goes_to_another_and_the_first_records_nothing(replicas):
    silent, other = replicas
    job = silent.add("j", PARAMS, max_queued=5)
    assert silent.claim().id == job.id
    assert other.sweep() == Swept() and other.claim() is None  # the lease holds
    time.sleep(silent.lease + 0.1)
    assert other.sweep() == Swept(requeued=[job.id])
    taken = other.claim()
    assert (taken.id, taken.attempts, taken.owner) == (job.id, 2, other.owner)
    assert not silent.renew(job.id) and not silent.progress(job.id, "denoise", 1, 50)
    assert not silent.complete(job.id, 1, 0, 0.1, 0.2) and not silent.discard(job.id)
    assert not silent.fail(job.id, "server_error", "x") and not silent.requeue(job.id)
    assert other.get(job.id).status == IN_PROGRESS and other.complete(job.id, 1, 0, 0.1, 0.2)


def test_a_worker_whose_lease_was_taken_stops_at_its_next_step_and_leaves_the_files(replicas, tmp_path):
    """Its heartbeat finds the job another replica's; its next step stops it, and neither the other
    replica's record nor the job's files are touched."""
    silent, other = replicas
    engine = FakeEngine(tmp_path)
    job = silent.add("j", PARAMS, max_queued=5)

    def taken_over() -> None:
        with silent._transaction() as execute:  # as if this replica had been frozen for a while
            execute("UPDATE jobs SET lease_until=lease_until-?", (10 * silent.lease,))
        assert other.sweep() == Swept(requeued=[job.id]) and other.claim().id == job.id
        for path in engine.files(job.id):
            path.write_bytes(b"the other replica's")
        time.sleep(silent.lease)  # a heartbeat or two

    engine.hooks["step1"] = taken_over
    Worker(engine, silent)._run(silent.claim())
    assert engine.ran == [job.id]
    record = other.get(job.id)
    assert (record.status, record.owner, record.step) == (IN_PROGRESS, other.owner, 0)
    assert all(path.read_bytes() == b"the other replica's" for path in engine.files(job.id))


def test_a_dead_replicas_deleted_job_is_swept_with_its_files(replicas, tmp_path):
    dead, other = replicas
    engine = FakeEngine(tmp_path)
    job = dead.add("j", PARAMS, max_queued=5)
    assert dead.claim().id == job.id and other.remove(job.id) == "cancelled"
    for path in engine.files(job.id):
        path.write_bytes(b"half")
    time.sleep(dead.lease + 0.1)
    swept = other.sweep()
    clean_up(engine, swept)  # what a replica's worker does with each sweep
    assert swept == Swept(purged=[job.id]) and other.delete(job.id) is False
    assert not any(path.exists() for path in engine.files(job.id))


def test_replicas_must_share_one_folder_and_no_sqlite_server_may_use_it(postgres_url, tmp_path):
    first = PostgresJobStore(postgres_url, tmp_path / "shared")
    try:
        with pytest.raises(WanjaxError, match=r"not the folder the other replicas .* write their videos to"):
            PostgresJobStore(postgres_url, tmp_path / "elsewhere")
        with pytest.raises(WanjaxError, match=r"in use by another wanjax serve \(replicas"):
            SqliteJobStore(tmp_path / "shared")
        PostgresJobStore(postgres_url, tmp_path / "shared").close()  # a second replica: welcome
    finally:
        first.close()
    alone = SqliteJobStore(tmp_path / "alone")
    try:
        with pytest.raises(WanjaxError, match=r"in use by another wanjax serve \(process \d+\)"):
            PostgresJobStore(postgres_url, tmp_path / "alone")
    finally:
        alone.close()


def test_store_mistakes_are_one_line_without_the_password(capsys, tmp_path):
    out = str(tmp_path / "out")
    err = serve_mistake(capsys, "--model", "demo", "--output_dir", out, "--store", "mysql://u:pw@h/db")
    assert "--store 'mysql://u:***@h/db': give sqlite" in err and "pw" not in err
    assert "--job_lease must be a positive" in serve_mistake(capsys, "--job_lease", "0")
    unreachable = "postgresql://wanjax:hunter2@127.0.0.1:1/jobs"
    err = serve_mistake(capsys, "--model", "demo", "--output_dir", out, "--store", unreachable)
    assert "--store postgresql://wanjax:***@127.0.0.1:1/jobs: cannot connect (" in err, err
    assert "hunter2" not in err


def _running_on(url: str, server: Server) -> str | None:
    """The job ``server`` is running past its first step, from the database."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT id FROM jobs WHERE status='in_progress' AND step >= 1 AND owner LIKE %s",
            (f"%/{server.process.pid}/%",),
        ).fetchone()
    return None if row is None else row[0]


@pytest.mark.slow
def test_two_replicas_run_twenty_jobs_once_each_and_survive_a_kill(demo_env, postgres_url, tmp_path):
    """20 jobs submitted to either of two real servers; one is killed (SIGKILL) in the middle of a job,
    which the other finishes after the lease: every job completed, each run to completion once. Small
    videos of many steps: a job is mostly its steps, so the kill lands in one."""
    flags = ("--store", postgres_url, "--job_lease", "3")
    env = {"WANJAX_CACHE": str(demo_env)}
    doomed, survivor = (Server(tmp_path, *flags, env=env).launch() for _ in range(2))
    for server in (doomed, survivor):
        server.start_listening()
    try:
        job = {"num_inference_steps": 24, **SMALL_JOB}
        jobs = [(doomed, survivor)[n % 2].submit(prompt=f"job {n}", seed=n, **job)["id"] for n in range(20)]
        deadline = time.monotonic() + 300
        while (killed_job := _running_on(postgres_url, doomed)) is None:
            assert time.monotonic() < deadline, "the first replica never ran a job"
            time.sleep(0.05)
        doomed.kill()
        finished = [survivor.wait(job_id, timeout=300) for job_id in jobs]
    finally:
        doomed.kill()
        assert survivor.stop() == TERMINATED, survivor.stderr
    assert all(video["status"] == "completed" for video in finished)
    assert all((tmp_path / "videos" / f"{job_id}.mp4").stat().st_size > 0 for job_id in jobs)
    completions = collections.Counter(
        re.findall(r"job (\S+) completed in", doomed.read_stderr() + survivor.stderr)
    )
    assert completions == collections.Counter(jobs), completions  # each job once, by one replica
    assert killed_job not in re.findall(r"job (\S+) completed in", doomed.read_stderr())
    with psycopg.connect(postgres_url) as conn:
        attempts = dict(conn.execute("SELECT id, attempts FROM jobs").fetchall())
    assert attempts[killed_job] == 2 and sum(attempts.values()) == 21, attempts
    assert not list((tmp_path / "videos").glob(".*.tmp"))  # the killed replica's partial files swept
