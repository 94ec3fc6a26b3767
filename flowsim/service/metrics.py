"""``GET /metrics``: the service's state in Prometheus' text format, read from the database at each scrape.

Every figure comes from the database, not from process memory, so any API replica reports the whole
service (workers are other processes) and nothing is lost on a restart:

- ``flowsim_queue_depth{kind}``: queued jobs by kind (what an autoscaler follows, see deploy/);
- ``flowsim_jobs{state}``: jobs by state;
- ``flowsim_job_latency_seconds``: histogram of submit-to-finish time of finished jobs;
- ``flowsim_simulations_total``: results and design points computed (``rate()`` of it is simulations/s);
- ``flowsim_simulations_per_second``: the same over the last :data:`RATE_WINDOW_S`;
- ``flowsim_workers``: workers that heartbeat within a lease.
"""
from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, CounterMetricFamily
from sqlalchemy import case, func, select
from sqlalchemy.engine import Engine

from flowsim.service import queue
from flowsim.service.db import Job, Point, Result, session
from flowsim.service.kinds import KINDS

LATENCY_BUCKETS_S = (0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 1800, 3600, 7200, 14400)
"""Histogram bounds, seconds: from one estimate to the issue's target of 95 % of jobs within 2 hours (7200 s)."""
RATE_WINDOW_S = 60.0  # window of flowsim_simulations_per_second
STATES = ("queued", "running", "done", "failed", "cancelled")


class _Collector:
    def __init__(self, engine: Engine):
        self.engine = engine

    def collect(self):
        now = time.time()
        latency = Job.finished_s - Job.created_s
        with session(self.engine) as s:
            depth = dict(s.execute(select(Job.kind, func.count()).where(Job.state == "queued")
                                   .group_by(Job.kind)).all())
            states = dict(s.execute(select(Job.state, func.count()).group_by(Job.state)).all())
            finished = Job.state.in_(queue.FINISHED)
            row = s.execute(select(func.count(), func.coalesce(func.sum(latency), 0.0),
                                   *[func.sum(case((latency <= b, 1), else_=0)) for b in LATENCY_BUCKETS_S])
                            .where(finished, Job.finished_s.is_not(None))).one()
            sims = (s.scalar(select(func.count()).select_from(Result))
                    + s.scalar(select(func.count()).select_from(Point)))
            recent = (s.scalar(select(func.count()).select_from(Result).where(Result.created_s > now - RATE_WINDOW_S))
                      + s.scalar(select(func.count()).select_from(Point).where(Point.created_s > now - RATE_WINDOW_S)))
        g = GaugeMetricFamily("flowsim_queue_depth", "Queued jobs by kind.", labels=["kind"])
        for k in KINDS:
            g.add_metric([k], depth.get(k, 0))
        yield g
        g = GaugeMetricFamily("flowsim_jobs", "Jobs by state.", labels=["state"])
        for st in STATES:
            g.add_metric([st], states.get(st, 0))
        yield g
        count, total = row[0], float(row[1])
        buckets = [(str(float(b)), int(c or 0)) for b, c in zip(LATENCY_BUCKETS_S, row[2:])] + [("+Inf", count)]
        yield HistogramMetricFamily("flowsim_job_latency_seconds", "Submit-to-finish time of finished jobs.",
                                    buckets=buckets, sum_value=total)
        yield CounterMetricFamily("flowsim_simulations", "Results and design points computed.", value=sims)
        yield GaugeMetricFamily("flowsim_simulations_per_second",
                                f"Simulations stored over the last {RATE_WINDOW_S:g} s, per second.",
                                value=recent / RATE_WINDOW_S)
        yield GaugeMetricFamily("flowsim_workers", "Workers alive (heartbeat within a lease).",
                                value=queue.live_workers(self.engine))


def metrics_text(engine: Engine) -> bytes:
    """The Prometheus text exposition of the service's metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(engine))
    return generate_latest(registry)
