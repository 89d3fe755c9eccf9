"""Batched jobs: waiting jobs that differ only in prompt and seed run as one batch (up to
``--max_batch``), each video the one the job gets alone; each job's progress, deletion and errors stay
its own (a controllable engine on SQLite and PostgreSQL stores, then a real server)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from helpers.serve_process import TERMINATED, Server
from helpers.small_video import SMALL_JOB
from PIL import Image

from wanjax.server.store import COMPLETED, FAILED, QUEUED
from wanjax.server.worker import Worker, delete_job

PARAMS = {"prompt": "p", "negative_prompt": "", "num_inference_steps": 3}


def _add(store, job_id: str, batch_key: str | None = "k", **params) -> None:
    store.add(job_id, {**PARAMS, **params}, max_queued=50, batch_key=batch_key)


def _drain(worker: Worker) -> None:
    """Run jobs as the worker's thread does, until none waits or the worker stops."""
    while not worker._stopping.is_set() and worker.run_next():
        pass


def test_jobs_alike_run_together_oldest_first_up_to_max_batch(store_and_fake_engine):
    store, engine = store_and_fake_engine
    for job_id, key in (("k0", "k"), ("other", "o"), ("k1", "k"), ("k2", "k"), ("alone", None)):
        _add(store, job_id, key)
    for job_id in ("k3", "k4"):
        _add(store, job_id)
    _drain(Worker(engine, store, max_batch=3))
    assert engine.ran == [["k0", "k1", "k2"], "other", "alone", ["k3", "k4"]]
    assert store.counts()[COMPLETED] == 7 and all(job.attempts == 1 for job in store.page(10)[0])


def test_a_job_deleted_in_a_batch_stops_alone(store_and_fake_engine):
    store, engine = store_and_fake_engine
    for job_id in ("a", "b", "c"):
        _add(store, job_id)
    engine.hooks["step1"] = lambda: delete_job(store, engine, "b")
    _drain(Worker(engine, store, max_batch=4))
    assert engine.ran == [["a", "b", "c"]]
    assert [store.get(job_id).status for job_id in ("a", "c")] == [COMPLETED, COMPLETED]
    assert store.get("b") is None and store.delete("b") is False
    assert not any(path.exists() for path in engine.files("b"))
    assert all(path.exists() for job_id in ("a", "c") for path in engine.files(job_id))


def test_errors_stay_each_jobs_own(store_and_fake_engine):
    """A job the server refuses fails alone before the batch runs; a batch whose run fails runs its
    jobs one by one, so only the job at fault fails."""
    store, engine = store_and_fake_engine
    _add(store, "a")
    _add(store, "refused", bad="request")
    _add(store, "c")
    _drain(Worker(engine, store, max_batch=4))
    assert engine.ran == [["a", "c"]]
    refused = store.get("refused")
    assert (refused.status, refused.error_code) == (FAILED, "invalid_request")
    _add(store, "breaks", bad="run")
    _add(store, "fine")
    _drain(Worker(engine, store, max_batch=4))
    assert engine.ran[1:] == [["breaks", "fine"], "breaks", "fine"]
    broken = store.get("breaks")
    assert (broken.status, broken.error_code) == (FAILED, "server_error")
    assert store.get("fine").status == COMPLETED and store.get("a").status == COMPLETED


def test_a_stop_puts_the_whole_batch_back_in_the_queue(store_and_fake_engine):
    store, engine = store_and_fake_engine
    for job_id in ("a", "b"):
        _add(store, job_id)
    worker = Worker(engine, store, max_batch=4)
    engine.hooks["step1"] = worker._stopping.set
    _drain(worker)
    assert [store.get(job_id).status for job_id in ("a", "b")] == [QUEUED, QUEUED]
    assert [store.get(job_id).attempts for job_id in ("a", "b")] == [0, 0]


@pytest.mark.parametrize("cache", ["off", "magcache"])
def test_the_batch_key_joins_only_jobs_that_differ_in_prompt_and_seed(demo_env, tmp_path, cache):
    """Jobs alike share a key; other steps or sizes do not; a job with an upload, or any job of a server
    with a step cache (its skips are decided for the whole batch), runs alone."""
    from wanjax import WanPipeline
    from wanjax.jobs.cache_flags import CacheFlags
    from wanjax.jobs.groups import CommonFlags
    from wanjax.server.api import Limits
    from wanjax.server.engine import Engine
    from wanjax.server.request import ServeRequest

    request = ServeRequest(common=CommonFlags(model="demo"), cache=CacheFlags(cache=cache))
    limits = Limits(max_frames=17, max_pixels=192 * 128, max_steps=50, max_queue=4, max_body_bytes=2**20)
    engine = Engine(WanPipeline.from_pretrained("demo"), request.job_base(), None, tmp_path, limits)
    job = {"prompt": "a", "seed": 1, "num_inference_steps": 3, "width": 192, "height": 128, "image": False}
    keys = [
        engine.batch_key(params)
        for params in (
            job,
            {**job, "prompt": "b", "seed": 2},
            {**job, "num_inference_steps": 4},
            {**job, "width": 128, "height": 192},
            {**job, "image": True},
        )
    ]
    if cache != "off":
        assert keys == [None] * 5
        return
    assert keys[0] is not None and keys[0] == keys[1] and len({*keys[:4]}) == 3 and keys[4] is None


def _sheet(server: Server, job_id: str, path) -> np.ndarray:
    status, sheet, _ = server.request("GET", f"/v1/videos/{job_id}/content?variant=spritesheet")
    assert status == 200
    path.write_bytes(sheet)
    return np.asarray(Image.open(path)).astype(int)  # every raw frame (bfloat16, the server's default)


@pytest.mark.slow
@pytest.mark.bit_for_bit
def test_four_jobs_waiting_together_run_as_one_batch_each_its_solo_video(demo_env, tmp_path):
    server = Server(tmp_path / "out", "--max_batch", "4", env={"WANJAX_CACHE": str(demo_env)}).start()
    # small videos (SMALL_JOB): what is compared is the batch against each job alone
    fields = [
        dict(prompt=f"scene {n}", seed=10 + 7 * n, num_inference_steps=3, **SMALL_JOB) for n in range(4)
    ]
    try:
        blocker = server.submit(prompt="a long one", num_inference_steps=15)
        while server.request("GET", f"/v1/videos/{blocker['id']}")[1]["status"] != "in_progress":
            time.sleep(0.02)
        together = [server.submit(**f)["id"] for f in fields]
        other = server.submit(prompt="scene 0", seed=10, num_inference_steps=4, **SMALL_JOB)  # not alike
        other = other["id"]
        for job_id in [*together, other]:
            server.wait(job_id)
        batched = {job_id: _sheet(server, job_id, tmp_path / f"{job_id}.png") for job_id in together}
        alone = []
        for f in fields:  # each again, with nothing waiting beside it
            job_id = server.submit(**f)["id"]
            server.wait(job_id)
            alone.append(_sheet(server, job_id, tmp_path / f"alone_{job_id}.png"))
    finally:
        assert server.stop() == TERMINATED, server.stderr
    records = [
        json.loads((tmp_path / "out" / "videos" / f"{job_id}.json").read_text()) for job_id in together
    ]
    assert all(record["server"]["batch"] == together for record in records), records[0]
    other_record = json.loads((tmp_path / "out" / "videos" / f"{other}.json").read_text())
    assert "batch" not in other_record["server"]
    assert server.stderr.count("; a batch of 4)") == 4
    for n, job_id in enumerate(together):
        np.testing.assert_array_equal(
            batched[job_id], alone[n], err_msg=str(n)
        )  # the solo video, bit for bit
    assert np.abs(batched[together[0]] - batched[together[1]]).max() > 1  # their own prompts and seeds
