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

from pathlib import Path

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.engine import Engine

from flowsim.explore.point import PointResult
from flowsim.errors import ConfigError
from flowsim.service.db import MemoryPruned, Point, insert_ignore, make_engine, session

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


def points_frame(url: str, study: str | None = None) -> "pd.DataFrame":
    """The design points of a service database (``sqlite:///...`` or ``postgresql://...``) as the same frame
    :func:`flowsim.explore.store.results_frame` gives for a local store (``flowsim results --db URL``)."""
    import pandas as pd

    from flowsim.explore.store import point_row

    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).expanduser().is_file():
        raise ConfigError("--db", "no such service database", url)
    engine = make_engine(url)
    query = select(Point.study, Point.created_s, Point.config_json, Point.point_json).order_by(Point.created_s)
    if study is not None:
        query = query.where(Point.study == study)
    rows = []
    try:
        with session(engine) as s:
            for st, created, cfg_text, pt_text in s.execute(query):
                cfg = json.loads(cfg_text)
                rows.append(point_row(cfg, json.loads(pt_text), study=st, model=cfg["model"]["name"],
                                      gpu=cfg["cluster"]["gpu"], num_gpus=cfg["cluster"]["num_gpus"],
                                      flowsim_version="", created_s=created))
    except SQLAlchemyError as e:
        raise ConfigError("--db", f"not a readable flowsim service database ({type(e).__name__})", url) from None
    finally:
        engine.dispose()
    return pd.DataFrame(rows)
