"""Durability of the queue, on SQLite and PostgreSQL: killed workers, a killed server, two competing workers."""
from __future__ import annotations

import re
import signal
import time

from harness import Server, make_token, start_worker, stop_worker, wait_for
from sqlalchemy import func, select

from flowsim.service import kinds, queue
from flowsim.service.db import Job, Point, Result, User, open_db, session

# A tune of 1,264 layouts (llama3-8b on 64 H100: vpp <= 2, cp <= 2, mbs <= 2, recompute none/full, ZeRO 0/1), run in
# 20 batches of 64 committed one by one (flowsim.explore.runner, one process): several seconds of work, so a worker
# killed once its first batch is in the database leaves the job part done.
TUNE = {"kind": "tune", "config": {"model": "llama3-8b", "cluster": "dgx-h100", "gpus": 64, "gbs": 256},
        "space": {"max_vpp": 2, "max_cp": 2, "max_mbs": 2, "recompute": ["none", "full"], "zero": [0, 1]}}
JOB_LINE = re.compile(r"^job ([0-9a-f]{32}) (\w+) (\w[\w-]*) ", re.M)
N_COMPETING = 200  # jobs two workers share in test_two_workers_never_run_the_same_job


def _part_done(engine, job_id) -> bool:
    """The job is running and has committed a batch of design points."""
    with session(engine) as s:
        return (s.get(Job, job_id).state == "running"
                and s.scalar(select(func.count()).select_from(Point)) > 0)


def _job(engine, job_id) -> Job:
    with session(engine) as s:
        return s.get(Job, job_id)


def test_killed_worker_job_is_requeued_and_every_point_stored_once(db_url):
    server = Server(db_url).start()
    try:
        with server.client(make_token(db_url, "alice")) as alice:
            job_id = alice.post("/v1/jobs", json=TUNE).json()["id"]
            engine = open_db(db_url)
            first = start_worker(db_url)
            wait_for(lambda: _part_done(engine, job_id), 120, "the tune to be part done", every_s=0.02)
            stop_worker(first, signal.SIGKILL)  # kill -9 in the middle of the job
            with session(engine) as s:
                points_before = s.scalar(select(func.count()).select_from(Point))
            job = _job(engine, job_id)
            assert job.state == "running" and points_before > 0
            wait_for(lambda: _job(engine, job_id).lease_expires_s < time.time(), 30, "the lease to run out")
            second = start_worker(db_url, "--exit-when-idle")  # requeues and claims it
            assert second.wait(180) == 0
            log = second.stderr.read().decode()
            job = alice.get(f"/v1/jobs/{job_id}").json()
            assert job["state"] == "done" and job["attempts"] == 2, (job, log)
            body = alice.get(f"/v1/jobs/{job_id}/result").json()
            result = body["result"]
            with session(engine) as s:
                points = s.scalar(select(func.count()).select_from(Point))
                results = s.scalar(select(func.count()).select_from(Result).where(Result.key == body["key"]))
                keys = s.scalars(select(Point.key)).all()
            # resumed: the first worker's committed points were reused, the rest simulated once
            counts = (points_before, points, result["evaluated"], result["reused"], log)
            assert result["reused"] == points_before > 0, counts
            assert points == result["evaluated"] + result["reused"] == len(set(keys)), counts
            assert results == 1
            assert result["fitting"] == len(result["ranked"]) > 0
            engine.dispose()
    finally:
        server.stop()


def test_killed_server_loses_no_accepted_job(db_url):
    server = Server(db_url).start()
    token = make_token(db_url, "alice")
    accepted = []
    with server.client(token) as alice:
        for i in range(15):
            r = alice.post("/v1/jobs", json={"kind": "collective", "config": {"op": "allgather", "cluster": "dgx-h100",
                                                                              "sizes": str(1024 * (i + 1))}})
            assert r.status_code == 202
            accepted.append(r.json()["id"])
    server.kill9()
    server = Server(db_url).start()
    try:
        with server.client(token) as alice:
            assert all(alice.get(f"/v1/jobs/{i}").json()["state"] == "queued" for i in accepted)
            worker = start_worker(db_url, "--exit-when-idle")
            assert worker.wait(180) == 0
            states = {alice.get(f"/v1/jobs/{i}").json()["state"] for i in accepted}
            assert states == {"done"}
            assert alice.get("/v1/jobs", params={"limit": 200}).json()["total"] == len(accepted)
    finally:
        server.stop()


def test_two_workers_never_run_the_same_job(db_url):
    engine = open_db(db_url)
    make_token(db_url, "alice")
    with session(engine) as s:
        owner = s.scalar(select(User.id).where(User.name == "alice"))
    ids = set()
    for i in range(N_COMPETING):
        kind, params, key = kinds.prepare({"kind": "collective", "config": {
            "op": "allreduce", "cluster": "dgx-h100", "nodes": 1 + i % 2, "sizes": str(8 * (i + 1))}},
            lambda _: None)
        ids.add(queue.submit(engine, owner, kind, params, key).id)
    workers = [start_worker(db_url, "--exit-when-idle") for _ in range(2)]
    logs = []
    for w in workers:
        assert w.wait(300) == 0
        logs.append(w.stderr.read().decode())
    ran = [m.group(1) for log in logs for m in JOB_LINE.finditer(log)]
    assert len(ran) == len(set(ran)) == N_COMPETING and set(ran) == ids
    assert all(len(JOB_LINE.findall(log)) > 0 for log in logs)  # both took part
    with session(engine) as s:
        assert set(s.execute(select(Job.state, Job.attempts)).all()) == {("done", 1)}
        assert s.scalar(select(func.count()).select_from(Result)) == N_COMPETING
    engine.dispose()


def _metric(client, name: str) -> float:
    line = next(x for x in client.get("/metrics").text.splitlines() if x.startswith(name + " "))
    return float(line.split()[1])


def test_embedded_pool_scales_with_the_queue(sqlite_url):
    server = Server(sqlite_url, "0:2").start()  # no worker while the queue is empty
    try:
        with server.client(make_token(sqlite_url, "alice")) as alice:
            assert _metric(alice, "flowsim_workers") == 0
            ids = [alice.post("/v1/jobs", json={"kind": "collective", "config": {
                "op": "allreduce", "cluster": "dgx-h100", "sizes": str(4096 * (i + 1))}}).json()["id"]
                for i in range(4)]
            wait_for(lambda: all(alice.get(f"/v1/jobs/{i}").json()["state"] == "done" for i in ids), 180,
                     "the pool's workers to run the jobs")
            wait_for(lambda: _metric(alice, "flowsim_workers") == 0, 60, "the pool to scale back to 0")
            assert _metric(alice, 'flowsim_jobs{state="done"}') == 4
    finally:
        server.stop()


def test_cancelling_a_running_tune_stops_its_worker(sqlite_url):
    server = Server(sqlite_url).start()
    try:
        with server.client(make_token(sqlite_url, "alice")) as alice:
            job_id = alice.post("/v1/jobs", json=TUNE).json()["id"]
            worker = start_worker(sqlite_url, "--exit-when-idle")
            engine = open_db(sqlite_url)
            wait_for(lambda: _part_done(engine, job_id), 120, "the tune to be part done", every_s=0.02)
            engine.dispose()
            assert alice.delete(f"/v1/jobs/{job_id}").json()["state"] == "cancelled"
            assert worker.wait(60) == 0
            (line,) = JOB_LINE.findall(worker.stderr.read().decode())
            assert line == (job_id, "tune", "abandoned")
            job = alice.get(f"/v1/jobs/{job_id}").json()
            assert job["state"] == "cancelled" and job["progress"] < 1
            assert alice.get(f"/v1/jobs/{job_id}/result").status_code == 409
    finally:
        server.stop()
