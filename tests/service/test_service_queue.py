"""The queue's rules in-process, on SQLite and PostgreSQL: leases, requeue, attempts, results written once."""
from __future__ import annotations

import time

import pytest
from harness import make_token
from sqlalchemy import func, select

from flowsim.service import queue
from flowsim.service.db import Job, Result, User, open_db, session

SHORT_LEASE_S = 0.05  # a lease that has run out by the next statement


@pytest.fixture
def engine(db_url):
    make_token(db_url, "alice")
    e = open_db(db_url)
    yield e
    e.dispose()


def _owner(engine) -> int:
    with session(engine) as s:
        return s.scalar(select(User.id).where(User.name == "alice"))


def test_a_lost_lease_requeues_then_fails_after_max_attempts(engine):
    job = queue.submit(engine, _owner(engine), "estimate", {"config": {}}, "k" * 64)
    holders = []
    for attempt in range(1, queue.MAX_ATTEMPTS + 1):
        claimed = queue.claim(engine, f"w{attempt}", lease_s=SHORT_LEASE_S)
        assert claimed is not None and claimed.id == job.id
        holders.append(claimed)
        with session(engine) as s:
            assert s.get(Job, job.id).attempts == attempt
        time.sleep(2 * SHORT_LEASE_S)
    assert queue.claim(engine, "late") is None  # out of attempts: failed, not requeued
    with session(engine) as s:
        failed = s.get(Job, job.id)
    assert failed.state == "failed" and failed.message.startswith(f"lost its worker {queue.MAX_ATTEMPTS} times")
    for i, held in enumerate(holders):  # no former holder can renew or finish it
        assert not queue.heartbeat(engine, job.id, f"w{i + 1}")
        assert not queue.complete(engine, held, f"w{i + 1}", {"x": i})


def test_only_the_lease_holder_finishes_and_the_result_is_written_once(engine):
    job = queue.submit(engine, _owner(engine), "estimate", {"config": {}}, "a" * 64)
    first = queue.claim(engine, "w1", lease_s=SHORT_LEASE_S)
    time.sleep(2 * SHORT_LEASE_S)
    second = queue.claim(engine, "w2")  # w1's lease ran out: requeued and taken by w2
    assert second.id == first.id == job.id
    assert not queue.heartbeat(engine, job.id, "w1")
    assert queue.heartbeat(engine, job.id, "w2", progress=0.5)
    assert not queue.complete(engine, first, "w1", {"answer": 1})  # late: its result is kept, the job is not its
    assert queue.complete(engine, second, "w2", {"answer": 2})
    with session(engine) as s:
        assert s.scalar(select(func.count()).select_from(Result)) == 1
        assert s.get(Job, job.id).state == "done"
    assert queue.stored_result(engine, job.key) == '{"answer": 1}'  # written once: the first write stands
    again = queue.submit(engine, _owner(engine), "estimate", {"config": {}}, job.key)
    assert again.state == "done" and again.reused  # a known key is done at submission


def test_a_job_waits_while_an_identical_one_runs(engine):
    owner = _owner(engine)
    a = queue.submit(engine, owner, "estimate", {"config": {}}, "b" * 64)
    b = queue.submit(engine, owner, "estimate", {"config": {}}, "b" * 64)
    c = queue.submit(engine, owner, "estimate", {"config": {}}, "c" * 64)
    first = queue.claim(engine, "w1")
    assert first.id == a.id
    assert queue.claim(engine, "w2").id == c.id  # b has a's key: it waits for a's result
    assert queue.claim(engine, "w3") is None
    queue.complete(engine, first, "w1", {"answer": 3})
    assert queue.claim(engine, "w3").id == b.id


def test_cancel_and_per_user_limit(engine):
    owner = _owner(engine)
    jobs = [queue.submit(engine, owner, "estimate", {}, f"{i:064d}", max_active=2) for i in range(3)]
    assert jobs[2] is None and all(jobs[:2])
    assert queue.cancel(engine, jobs[0].id) and not queue.cancel(engine, jobs[0].id)
    assert queue.submit(engine, owner, "estimate", {}, "9" * 64, max_active=2) is not None
    assert queue.depth(engine) == {"estimate": 2}
