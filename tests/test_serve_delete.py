"""Deleting a job while it runs, at each point a request can arrive: the job is gone for every reader
at once, never ends up completed, and leaves no file behind (a controllable worker, no server)."""

from __future__ import annotations

import pytest
from helpers.serve_fakes import Channel

from wanjax.server.store import COMPLETED, QUEUED, JobStore, QueueFull, Swept
from wanjax.server.worker import Worker, delete_job

STEPS = 3
PARAMS = {"prompt": "p", "negative_prompt": "", "num_inference_steps": STEPS}


def _nothing_queued(store: JobStore) -> bool:
    return store.counts()[QUEUED] == 0


def _gone(store: JobStore, job_id: str) -> bool:
    return store.get(job_id) is None and job_id not in [j.id for j in store.page(100)[0]]


@pytest.mark.parametrize("point", ["start", "step1", f"step{STEPS}", "written"])
@pytest.mark.parametrize("processes", [1, 2], ids=["one process", "multi-process"])
def test_a_job_deleted_while_it_runs_never_completes_and_leaves_no_file(
    store_and_fake_engine, point, processes
):
    """``start``: just after the worker took it, before its first step; ``written``: its files
    written, just before it would be recorded completed. One process stops at the next step; a
    multi-process server's job runs to its end first. Either way: gone at once, then no record and
    no file."""
    store, engine = store_and_fake_engine
    job = store.add("j", PARAMS, max_queued=5)
    seen = {}

    def delete() -> None:
        assert delete_job(store, engine, job.id)
        seen["gone at once"] = _gone(store, job.id)
        assert not delete_job(store, engine, job.id)  # a second DELETE: 404

    engine.hooks[point] = delete
    Worker(engine, store, Channel() if processes == 2 else None)._run(store.claim())
    assert seen == {"gone at once": True}
    assert _gone(store, job.id) and store.delete(job.id) is False  # no record left at all
    assert not any(path.exists() for path in engine.files(job.id))


def test_a_job_deleted_after_it_completed_loses_its_files(store_and_fake_engine):
    store, engine = store_and_fake_engine
    job = store.add("j", PARAMS, max_queued=5)
    Worker(engine, store)._run(store.claim())
    assert store.get(job.id).status == COMPLETED and all(p.exists() for p in engine.files(job.id))
    assert delete_job(store, engine, job.id)
    assert _gone(store, job.id) and not any(p.exists() for p in engine.files(job.id))


def test_a_queued_job_deleted_never_runs(store_and_fake_engine):
    store, engine = store_and_fake_engine
    first, second = (store.add(name, PARAMS, max_queued=5) for name in ("first", "second"))
    engine.hooks["step1"] = lambda: delete_job(store, engine, second.id)  # while the first runs
    Worker(engine, store)._run(store.claim())
    assert _nothing_queued(store) and engine.ran == [first.id]


def test_a_job_deleted_while_the_server_stops_is_not_requeued(store_and_fake_engine):
    store, engine = store_and_fake_engine
    job = store.add("j", PARAMS, max_queued=5)
    worker = Worker(engine, store)

    def stop_and_delete() -> None:
        worker._stopping.set()
        delete_job(store, engine, job.id)

    engine.hooks["step1"] = stop_and_delete
    worker._run(store.claim())
    assert store.delete(job.id) is False and _nothing_queued(store)


def test_a_server_that_died_with_a_deleted_job_running_purges_it(store_and_fake_engine):
    """At the SQLite server's next start; by any replica once the dead one's lease ran out."""
    store, _ = store_and_fake_engine
    job = store.add("j", PARAMS, max_queued=5)
    assert store.claim().id == job.id and store.remove(job.id) == "cancelled"
    if store.shared:
        assert store.sweep() == Swept()  # its replica may still be alive: its lease holds
        _expire_leases(store)
    assert store.recover() == Swept(purged=[job.id])
    assert store.get(job.id) is None and store.delete(job.id) is False and _nothing_queued(store)


def _expire_leases(store: JobStore) -> None:
    """As if every running job's replica had stopped renewing its lease long ago."""
    with store._transaction() as execute:
        execute("UPDATE jobs SET lease_until=lease_until-?", (10 * store.lease,))


def test_the_store_retries_an_interrupted_job_once(store_and_fake_engine):
    store, _ = store_and_fake_engine
    params = {"prompt": "p", "num_inference_steps": 2}
    first, second = (store.add(name, params, max_queued=5).id for name in ("first", "second"))
    with pytest.raises(QueueFull):
        store.add("third", params, max_queued=2)
    assert store.claim().id == first
    _expire_leases(store)
    assert store.recover() == Swept(requeued=[first])  # its server died while it ran: queued again
    assert store.get(first).status == "queued" and store.claim().id == first  # still the oldest
    _expire_leases(store)
    assert store.recover() == Swept(failed=[first])  # died again while running it: failed
    failed = store.get(first)
    assert (failed.status, failed.error_code, failed.owner) == ("failed", "interrupted", None)
    assert store.claim().id == second and store.claim() is None
