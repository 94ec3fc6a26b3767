"""Workers: processes that lease jobs from the queue, run them and store their results.

:class:`WorkerLoop` is ``flowsim worker --db URL``: claim a job, run it (:func:`flowsim.service.kinds.run`)
while a heartbeat thread renews the lease and reports progress, store the result once, repeat. SIGTERM or
SIGINT stops it after the job in hand. A worker killed outright (``kill -9``, out of memory, a lost node)
simply stops heartbeating: its job is requeued when the lease runs out, and a tune or sweep resumes from the
design points it had committed.

:class:`WorkerPool` is the embedded mode of ``flowsim serve``: it keeps between MIN and MAX worker
processes, one per queued or running job.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from sqlalchemy import func, select
from sqlalchemy.engine import Engine

from flowsim.errors import ConfigError
from flowsim.service import queue
from flowsim.service.db import Job, Measurement, session
from flowsim.service.kinds import Context, run
from flowsim.service.store import JobAbandoned, ServiceStore

POLL_S = 0.5  # how long an idle worker waits before looking at the queue again
POOL_CHECK_S = 1.0  # how often the embedded pool compares its size with the queue
STOP_GRACE_S = 10.0  # how long the pool waits for a stopped worker before killing it
log = logging.getLogger(__name__)


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


class WorkerLoop:
    """One worker process's loop.

    Parameters
    ----------
    engine : Engine
        The service database (migrated).
    lease_s : float
        Lease of each claimed job, seconds; heartbeats come every ``lease_s / 3``.
    scheduler : str, optional
        ``dask://HOST:PORT``: tune and sweep jobs fan their configs out to this Dask cluster.
    """

    def __init__(self, engine: Engine, lease_s: float = queue.LEASE_S, scheduler: str | None = None):
        self.engine, self.lease_s, self.scheduler = engine, lease_s, scheduler
        self.id = f"{socket.gethostname()}-{os.getpid()}-{queue.new_id()[:8]}"
        self.stopping = threading.Event()

    def stop(self, *_) -> None:
        """Finish the job in hand, then return from :meth:`run`."""
        self.stopping.set()

    def run(self, max_jobs: int | None = None, exit_when_idle: bool = False) -> int:
        """Process jobs until stopped (or ``max_jobs`` done, or the queue is empty with ``exit_when_idle``).

        Returns the number of jobs this worker finished.
        """
        queue.register_worker(self.engine, self.id, socket.gethostname(), os.getpid())
        done, last_touch = 0, 0.0
        try:
            while not self.stopping.is_set() and (max_jobs is None or done < max_jobs):
                if time.time() - last_touch > self.lease_s / queue.HEARTBEATS_PER_LEASE:
                    queue.touch_worker(self.engine, self.id)
                    last_touch = time.time()
                job = queue.claim(self.engine, self.id, lease_s=self.lease_s)
                if job is None:
                    if exit_when_idle:
                        break
                    self.stopping.wait(POLL_S)
                    continue
                self.process(job)
                done += 1
        finally:
            queue.remove_worker(self.engine, self.id)
        return done

    def process(self, job: queue.Claimed) -> None:
        """Run one claimed job under a heartbeat, store its outcome and log one line ``job ID KIND OUTCOME``."""
        start = time.perf_counter()
        outcome = self._process(job)
        log.info("job %s %s %s %.3f s", job.id, job.kind, outcome, time.perf_counter() - start)

    def _process(self, job: queue.Claimed) -> str:
        if queue.stored_result(self.engine, job.key) is not None:  # computed meanwhile by an identical job
            queue.complete(self.engine, job, self.id, None, reused=True)
            return "reused"
        state = {"progress": 0.0, "lost": False}
        beat_stop = threading.Event()

        def beat():
            while not beat_stop.wait(self.lease_s / queue.HEARTBEATS_PER_LEASE):
                if not queue.heartbeat(self.engine, job.id, self.id, state["progress"], self.lease_s):
                    state["lost"] = True
                    return
                queue.touch_worker(self.engine, self.id)

        def on_progress(fraction: float) -> None:
            state["progress"] = fraction
            if state["lost"]:
                raise JobAbandoned(job.id)

        store = ServiceStore(self.engine)
        ctx = Context(store, on_progress, self._measurement, self.scheduler)
        thread = threading.Thread(target=beat, name=f"heartbeat-{job.id}", daemon=True)
        thread.start()
        try:
            result = run(job.kind, job.params, ctx)
        except JobAbandoned:
            return "abandoned"
        except ConfigError as e:
            queue.fail(self.engine, job, self.id, str(e))
            return "failed"
        except Exception as e:  # a bug or an environment failure: recorded on the job, the worker goes on
            queue.fail(self.engine, job, self.id, f"{type(e).__name__}: {_one_line(e)}")
            return "failed"
        finally:
            beat_stop.set()
            thread.join()
        return "done" if queue.complete(self.engine, job, self.id, result) else "lost-lease"

    def _measurement(self, mid: str) -> tuple[str, bytes]:
        with session(self.engine) as s:
            row = s.execute(select(Measurement.kind, Measurement.content).where(Measurement.id == mid)).first()
        if row is None:
            raise ConfigError("measurement", "was deleted", mid)
        return row.kind, row.content


def worker_command(url: str, lease_s: float, scheduler: str | None = None) -> list:
    """The command line of one ``flowsim worker`` process on database ``url``."""
    cmd = [sys.executable, "-c", "import sys; from flowsim.cli import main; sys.exit(main())", "worker",
           "--db", url, "--lease-s", repr(lease_s)]
    return cmd + (["--scheduler", scheduler] if scheduler else [])


class WorkerPool:
    """Embedded workers: between ``minimum`` and ``maximum`` ``flowsim worker`` processes on ``url``,
    one per queued or running job (a worker runs one job at a time), checked every :data:`POOL_CHECK_S`.
    """

    def __init__(self, engine: Engine, url: str, minimum: int, maximum: int, lease_s: float = queue.LEASE_S):
        if not 0 <= minimum <= maximum:
            raise ConfigError("--workers", "must be MIN:MAX with 0 <= MIN <= MAX", f"{minimum}:{maximum}")
        self.engine, self.url, self.minimum, self.maximum, self.lease_s = engine, url, minimum, maximum, lease_s
        self.procs: list[subprocess.Popen] = []
        self.retired: list[subprocess.Popen] = []  # told to stop, not yet reaped
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="worker-pool", daemon=True)

    def start(self) -> None:
        """Start the minimum workers and the scaling thread."""
        self._scale(self.minimum)
        self._thread.start()

    def target(self) -> int:
        """Workers wanted now: active jobs, clamped to [minimum, maximum]."""
        with session(self.engine) as s:
            active = s.scalar(select(func.count()).select_from(Job).where(Job.state.in_(queue.ACTIVE)))
        return max(self.minimum, min(self.maximum, active))

    def _scale(self, n: int) -> None:
        self.procs = [p for p in self.procs if p.poll() is None]
        self.retired = [p for p in self.retired if p.poll() is None]
        while len(self.procs) < n:
            self.procs.append(subprocess.Popen(worker_command(self.url, self.lease_s), stdin=subprocess.DEVNULL))
        for p in self.procs[n:]:
            p.send_signal(signal.SIGTERM)  # finishes its job in hand, then exits
            self.retired.append(p)
        self.procs = self.procs[:n]

    def _loop(self) -> None:
        while not self._stop.wait(POOL_CHECK_S):
            try:
                self._scale(self.target())
            except Exception as e:  # the database may be briefly unreachable: try again next round
                print(f"worker pool: {_one_line(e)}", file=sys.stderr)

    def stop(self) -> None:
        """Stop scaling and the workers (each finishes its job in hand; killed after STOP_GRACE_S)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        procs = self.procs + self.retired
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.time() + STOP_GRACE_S
        for p in procs:
            try:
                p.wait(max(0.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
