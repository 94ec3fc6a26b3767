"""The results-store interface of :func:`flowsim.explore.runner.run_configs` over the service database.

Tune and sweep jobs pass a :class:`ServiceStore` where the CLI passes a
:class:`flowsim.explore.store.ResultStore`: every design point is written once, keyed by its config hash
(:func:`flowsim.explore.point.config_key`), in one transaction per finished batch. So a job whose worker
was killed resumes from the batches already committed, and no config is simulated twice by any job or
worker sharing the database.
"""
from __future__ import annotations

import json
import time

from sqlalchemy import select
from sqlalchemy.engine import Engine

from flowsim.explore.point import PointResult
from flowsim.service.db import MemoryPruned, Point, insert_ignore, session

_IN_CHUNK = 900  # keys per IN (...) query (SQLite's default limit is 999 host parameters)


class JobAbandoned(Exception):
    """The job's lease was lost (cancelled, or requeued after a missed heartbeat): stop working on it."""


class ServiceStore:
    """Design points in the service database, with a hook called after each committed batch.

    Parameters
    ----------
    engine : Engine
        The service database.
    on_batch : callable, optional
        Called with the number of configs a batch settled (simulated or found too big), after it was
        committed; it may raise :class:`JobAbandoned` to stop the run.
    """

    def __init__(self, engine: Engine, on_batch=None):
        self.engine, self.on_batch = engine, on_batch

    def keys(self) -> frozenset:
        """Keys of every stored point."""
        with session(self.engine) as s:
            return frozenset(s.scalars(select(Point.key)))

    def memory_pruned(self) -> dict:
        """Peak memory bytes of every config recorded as not fitting, by key."""
        with session(self.engine) as s:
            return dict(s.execute(select(MemoryPruned.key, MemoryPruned.memory_bytes_per_gpu)).all())

    def put(self, items: list, study: str = "") -> None:
        """Store (config dict, PointResult) pairs in one transaction; existing keys are left untouched."""
        now = time.time()
        rows = [dict(key=p.key, study=study, config_json=json.dumps(cfg, sort_keys=True, default=str),
                     point_json=json.dumps(p.to_dict()), created_s=now) for cfg, p in items]
        with session(self.engine, write=True) as s:
            s.execute(insert_ignore(self.engine, Point), rows)
        self._settled(len(rows))

    def put_memory_pruned(self, items: dict) -> None:
        """Record configs that do not fit in memory (key -> peak bytes), in one transaction."""
        rows = [dict(key=k, memory_bytes_per_gpu=v) for k, v in items.items()]
        with session(self.engine, write=True) as s:
            s.execute(insert_ignore(self.engine, MemoryPruned), rows)
        self._settled(len(rows))

    def get(self, keys) -> dict:
        """Stored :class:`PointResult` of each of ``keys`` found, by key."""
        keys, out = list(keys), {}
        with session(self.engine) as s:
            for i in range(0, len(keys), _IN_CHUNK):
                for key, text in s.execute(select(Point.key, Point.point_json)
                                           .where(Point.key.in_(keys[i:i + _IN_CHUNK]))):
                    out[key] = PointResult.from_dict(json.loads(text))
        return out

    def _settled(self, n: int) -> None:
        if self.on_batch is not None:
            self.on_batch(n)
