"""The durable job queue: jobs live in the database; workers lease them, heartbeat and write results once.

Life of a job: ``queued`` -> ``running`` (leased to one worker until ``lease_expires_s``) -> ``done``,
``failed`` or ``cancelled``. A worker renews its lease (:data:`LEASE_S` by default)
:data:`HEARTBEATS_PER_LEASE` times per lease period; a lease not renewed in time (the worker was killed, or lost
the database) is expired by the next claim, which puts the job back in the queue (after :data:`MAX_ATTEMPTS`
lost leases it fails instead, so a job that kills its worker cannot loop forever).

Claiming is one short write transaction: on PostgreSQL ``SELECT ... FOR UPDATE SKIP LOCKED`` (workers never
wait on each other's row), on SQLite ``BEGIN IMMEDIATE`` (one writer at a time), and in both cases the
``UPDATE`` is conditional on the row still being queued, so two workers never run the same job. A queued job
whose key is being computed by a running job waits for it, then finds the result: identical configs are
never simulated twice (on PostgreSQL a transaction-scoped advisory lock on the key makes two concurrent claims of
one key see each other).

Results are keyed by the job's key (:mod:`flowsim.service.kinds`) and inserted once (``ON CONFLICT DO
NOTHING``); a job is marked done only by the worker holding its lease, in the same transaction.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

from sqlalchemy import and_, func, select, update
from sqlalchemy.engine import Engine

from flowsim.service.db import Job, Result, User, Worker, insert_ignore, is_postgres, session
from flowsim.service.limits import LEASE_S

HEARTBEATS_PER_LEASE = 3  # a worker renews its lease every lease / 3 seconds
MAX_ATTEMPTS = 3  # lost leases after which a job fails instead of being requeued
CLAIM_CANDIDATES = 8  # PostgreSQL: queued jobs one claim looks at (the first whose key is free is taken)
ACTIVE = ("queued", "running")
FINISHED = ("done", "failed", "cancelled")


@dataclass(frozen=True)
class Claimed:
    """A job leased to a worker: its id, kind, parameters and key."""

    id: str
    kind: str
    params: dict
    key: str


def new_id() -> str:
    """A fresh, unguessable job or upload id (UUID4, 32 hex digits)."""
    return uuid.uuid4().hex


def submit(engine: Engine, owner_id: int, kind: str, params: dict, key: str,
           max_active: int | None = None) -> Job | None:
    """Queue a job (or record it as done at once when its key already has a result).

    Returns the new job, or None when ``owner_id`` already has ``max_active`` queued or running jobs (checked
    in the same write transaction, so concurrent submissions cannot overshoot).
    """
    now = time.time()
    with session(engine, write=True) as s:
        if max_active is not None:
            q = select(func.count()).select_from(Job).where(Job.owner_id == owner_id, Job.state.in_(ACTIVE))
            if is_postgres(engine):  # serialise one user's submissions: lock the user's row
                s.execute(select(User.id).where(User.id == owner_id).with_for_update())
            if s.scalar(q) >= max_active:
                return None
        done = s.get(Result, key) is not None
        job = Job(id=new_id(), owner_id=owner_id, kind=kind, state="done" if done else "queued",
                  params_json=json.dumps(params, sort_keys=True), key=key, progress=1.0 if done else 0.0,
                  created_s=now, started_s=now if done else None, finished_s=now if done else None,
                  attempts=0, reused=done)
        s.add(job)
    return job


def expire_leases(engine: Engine, now: float | None = None) -> int:
    """Requeue running jobs whose lease ran out (fail those out of attempts). Returns the jobs touched."""
    now = time.time() if now is None else now
    with session(engine, write=True) as s:
        lost = and_(Job.state == "running", Job.lease_expires_s < now)
        failed = s.execute(update(Job).where(lost, Job.attempts >= MAX_ATTEMPTS).values(
            state="failed", finished_s=now, lease_owner=None,
            message=f"lost its worker {MAX_ATTEMPTS} times (killed, or out of memory?)")).rowcount
        requeued = s.execute(update(Job).where(lost).values(state="queued", lease_owner=None,
                                                            lease_expires_s=None)).rowcount
    return failed + requeued


def claim(engine: Engine, worker_id: str, kinds=None, lease_s: float = LEASE_S) -> Claimed | None:
    """Lease the oldest queued job to ``worker_id`` for ``lease_s`` seconds (None when there is none)."""
    expire_leases(engine)
    now = time.time()
    pg = is_postgres(engine)
    busy_keys = select(Job.key).where(Job.state == "running")
    with session(engine, write=True) as s:
        q = select(Job.id, Job.kind, Job.params_json, Job.key).where(Job.state == "queued", Job.key.not_in(busy_keys))
        if kinds:
            q = q.where(Job.kind.in_(kinds))
        q = q.order_by(Job.created_s, Job.id).limit(CLAIM_CANDIDATES if pg else 1)
        if pg:
            q = q.with_for_update(skip_locked=True)
        for row in s.execute(q).all():
            if pg and not _own_key(s, row.key):
                continue
            got = s.execute(update(Job).where(Job.id == row.id, Job.state == "queued").values(
                state="running", lease_owner=worker_id, lease_expires_s=now + lease_s, attempts=Job.attempts + 1,
                started_s=func.coalesce(Job.started_s, now))).rowcount
            if got == 1:
                return Claimed(row.id, row.kind, json.loads(row.params_json), row.key)
    return None


def _own_key(s, key: str) -> bool:
    """PostgreSQL: take ``key`` for this transaction, unless another claim holds it or a job of it is running.

    The advisory lock closes the window in which two workers pick two queued jobs of one key at once (neither
    sees the other's uncommitted ``running``); the second look, a new statement after the lock, sees a claim
    committed in the meantime.
    """
    if not s.scalar(select(func.pg_try_advisory_xact_lock(func.hashtext(key)))):
        return False
    return s.scalar(select(func.count()).select_from(Job).where(Job.key == key, Job.state == "running")) == 0


def heartbeat(engine: Engine, job_id: str, worker_id: str, progress: float | None = None,
              lease_s: float = LEASE_S) -> bool:
    """Renew the lease for ``lease_s`` (and record progress); False when the lease is no longer this worker's."""
    values = {"lease_expires_s": time.time() + lease_s}
    if progress is not None:
        values["progress"] = float(progress)
    with session(engine, write=True) as s:
        return s.execute(update(Job).where(Job.id == job_id, Job.lease_owner == worker_id,
                                           Job.state == "running").values(**values)).rowcount == 1


def stored_result(engine: Engine, key: str) -> str | None:
    """The stored result (JSON text) of ``key``, or None."""
    with session(engine) as s:
        return s.scalar(select(Result.result_json).where(Result.key == key))


def complete(engine: Engine, job: Claimed, worker_id: str, result: dict | None, reused: bool = False) -> bool:
    """Store ``result`` under the job's key (kept if one is there already) and mark the job done.

    Returns False when the lease was lost meanwhile (the job is then someone else's or cancelled).
    """
    now = time.time()
    with session(engine, write=True) as s:
        if result is not None:
            s.execute(insert_ignore(engine, Result), [dict(key=job.key, kind=job.kind, job_id=job.id,
                                                           result_json=json.dumps(result), created_s=now)])
        return s.execute(update(Job).where(Job.id == job.id, Job.lease_owner == worker_id, Job.state == "running")
                         .values(state="done", progress=1.0, finished_s=now, lease_owner=None,
                                 lease_expires_s=None, reused=reused)).rowcount == 1


def fail(engine: Engine, job: Claimed, worker_id: str, message: str) -> bool:
    """Mark the job failed with a one-line ``message`` (when this worker still holds it)."""
    with session(engine, write=True) as s:
        return s.execute(update(Job).where(Job.id == job.id, Job.lease_owner == worker_id, Job.state == "running")
                         .values(state="failed", message=message, finished_s=time.time(), lease_owner=None,
                                 lease_expires_s=None)).rowcount == 1


def cancel(engine: Engine, job_id: str) -> bool:
    """Cancel a queued or running job (a running one stops at its next heartbeat). False if it had finished."""
    with session(engine, write=True) as s:
        return s.execute(update(Job).where(Job.id == job_id, Job.state.in_(ACTIVE)).values(
            state="cancelled", finished_s=time.time(), lease_owner=None, lease_expires_s=None)).rowcount == 1


def depth(engine: Engine) -> dict:
    """Queued jobs by kind."""
    with session(engine) as s:
        return dict(s.execute(select(Job.kind, func.count()).where(Job.state == "queued").group_by(Job.kind)).all())


def register_worker(engine: Engine, worker_id: str, host: str, pid: int) -> None:
    """Record a live worker (see :func:`touch_worker`)."""
    now = time.time()
    with session(engine, write=True) as s:
        s.execute(insert_ignore(engine, Worker), [dict(id=worker_id, host=host, pid=pid, started_s=now,
                                                       last_seen_s=now)])


def touch_worker(engine: Engine, worker_id: str) -> None:
    """The worker is alive now."""
    with session(engine, write=True) as s:
        s.execute(update(Worker).where(Worker.id == worker_id).values(last_seen_s=time.time()))


def remove_worker(engine: Engine, worker_id: str) -> None:
    """The worker stopped cleanly."""
    from sqlalchemy import delete

    with session(engine, write=True) as s:
        s.execute(delete(Worker).where(Worker.id == worker_id))


def live_workers(engine: Engine) -> int:
    """Workers seen within one default lease period."""
    with session(engine) as s:
        return s.scalar(select(func.count()).select_from(Worker).where(Worker.last_seen_s > time.time() - LEASE_S))


def visible(query, caller) -> object:
    """``query`` on jobs restricted to ``caller``'s own unless they are an admin."""
    return query if caller.is_admin else query.where(Job.owner_id == caller.id)

