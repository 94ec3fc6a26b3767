"""Run a study (:mod:`flowsim.explore.study`): every point simulated or auto-tuned, then costed.

All configs of all points go to one :func:`flowsim.explore.runner.run_configs` call, so the local pool or the
Dask cluster stays busy across points and every result lands in the results store; a tuned point
takes its fastest layout that fits in memory.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from flowsim.config import build_config
from flowsim.explore.pricing import ClusterCost, TrainingCost, cluster_cost, training_cost
from flowsim.errors import ConfigError
from flowsim.explore.point import PointResult
from flowsim.explore.runner import run_configs
from flowsim.explore.space import enumerate_layouts
from flowsim.explore.study import Study, StudyPoint
from flowsim.explore.tune import job_config, rank_key

@dataclass(frozen=True)
class SweepRow:
    """The outcome of one study point.

    Attributes
    ----------
    point : StudyPoint
        The point (names, grid values, job).
    cluster : dict
        The resolved cluster fields (gpu, num_gpus, gpus_per_node, nics_per_node, nic_gbps, ...).
    model : str
        Model name.
    candidates : int
        Configs simulated or taken from the store for this point (1 without tuning).
    best : PointResult or None
        The fastest config that fits; None when none does (see ``status``).
    status : str
        ``ok``, ``no valid layout`` or ``does not fit in memory``.
    cost : ClusterCost
        The cluster's bill, power and hourly cost.
    training : TrainingCost or None
        Time and cost to train on the study's token budget (None without ``best``).
    """

    point: StudyPoint
    cluster: dict
    model: str
    candidates: int
    best: PointResult | None
    status: str
    cost: ClusterCost
    training: TrainingCost | None

    def to_dict(self) -> dict:
        """Flat view: names, grid, cluster, layout and figures (units in the names; NaN when no result)."""
        nan = float("nan")
        b, tr, c = self.best, self.training, self.cluster
        d = {"hardware": self.point.hardware, "workload": self.point.workload, **self.point.grid,
             "model": self.model, "gpu": c["gpu"], "num_gpus": c["num_gpus"], "gpus_per_node": c["gpus_per_node"],
             "nics_per_node": c["nics_per_node"], "nic_gbps": c["nic_gbps"],
             "oversubscription": c["oversubscription"], "network": c["network"], "status": self.status,
             "candidates": self.candidates, "layout": b.layout.label() if b else "",
             "step_time_s": b.step_time_s if b else nan, "tokens_per_s": b.tokens_per_s if b else nan,
             "mfu": b.mfu if b else nan, "exposed_comm_share": b.exposed_comm_share if b else nan,
             "memory_bytes_per_gpu": b.memory_bytes_per_gpu if b else nan,
             "capex_usd": self.cost.capex_total_usd, "it_power_w": self.cost.it_power_w,
             "usd_per_hour": self.cost.usd_per_hour,
             "time_to_train_s": tr.time_to_train_s if tr else nan, "gpu_hours": tr.gpu_hours if tr else nan,
             "cost_usd": tr.cost_usd if tr else nan,
             "usd_per_million_tokens": tr.usd_per_million_tokens if tr else nan}
        d.update({f"capex_{k}_usd": v for k, v in self.cost.capex_usd.items()})
        return d


@dataclass(frozen=True)
class SweepResult:
    """Outcome of :func:`run_study`.

    Attributes
    ----------
    study : Study
        The study run.
    rows : tuple[SweepRow, ...]
        One per point, in study order.
    evaluated, reused : int
        Configs simulated now and taken from the results store.
    elapsed_s : float
        Wall time, seconds.
    """

    study: Study
    rows: tuple
    evaluated: int
    reused: int
    elapsed_s: float

    def to_frame(self) -> pd.DataFrame:
        """One row per point (columns of :meth:`SweepRow.to_dict`)."""
        return pd.DataFrame([r.to_dict() for r in self.rows])

    def to_dict(self) -> dict:
        """JSON view: study name, token budget, cost inputs, counts and one flat mapping per point."""
        return {"study": self.study.name, "token_budget": self.study.token_budget,
                "cost_inputs": self.study.cost.to_dict(), "evaluated": self.evaluated, "reused": self.reused,
                "elapsed_s": self.elapsed_s,
                "points": [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.to_dict().items()}
                           for r in self.rows]}


def _point_error(point: StudyPoint, e: ConfigError) -> ConfigError:
    return ConfigError(e.field, f"{e.rule} (in study point {point.label!r})", e.got)


def _point_configs(study: Study, point: StudyPoint) -> tuple:
    """(simplest-layout config, configs to evaluate) of one point."""
    try:
        if study.tune is None:
            cfg = build_config(point.job)
            return cfg, [cfg]
        base = job_config(point.job)
        return base, list(enumerate_layouts(point.job, study.space_for(base)).configs)
    except ConfigError as e:
        raise _point_error(point, e) from None


def run_study(study: Study, *, store=None, jobs: int = 0, scheduler: str | None = None,
              progress: bool = False) -> SweepResult:
    """Simulate (or tune) every point of ``study``, then cost it.

    ``store`` (a :class:`flowsim.explore.store.ResultStore`, optional) is read and filled; ``jobs``, ``scheduler``
    and ``progress`` choose the execution (see :func:`flowsim.explore.runner.run_configs`).

    Raises
    ------
    ConfigError
        A point whose job is invalid (the message names the point), or execution errors
        (see :func:`flowsim.explore.runner.run_configs`).
    """
    per_point = [_point_configs(study, p) for p in study.points]
    flat = [c for _, cfgs in per_point for c in cfgs]
    run = run_configs(flat, store=store, study=study.name, jobs=jobs, scheduler=scheduler, progress=progress,
                      label=f"sweep {study.name}")
    rows, start = [], 0
    for point, (base, cfgs) in zip(study.points, per_point):
        outcomes = run.outcomes[start:start + len(cfgs)]
        start += len(cfgs)
        fits = [o.point for o in outcomes if o.point is not None and o.point.fits_memory]
        best = min(fits, key=rank_key) if fits else None
        status = "ok" if best else ("no valid layout" if not cfgs else "does not fit in memory")
        try:
            cost = cluster_cost(base.cluster, study.cost)
        except ConfigError as e:
            raise _point_error(point, e) from None
        train = training_cost(best.tokens_per_s, base.cluster.num_gpus, cost, study.token_budget) if best else None
        rows.append(SweepRow(point=point, cluster=_cluster_dict(base), model=base.model.name,
                             candidates=len(cfgs), best=best, status=status, cost=cost, training=train))
    return SweepResult(study=study, rows=tuple(rows), evaluated=run.evaluated, reused=run.reused,
                       elapsed_s=run.elapsed_s)


def _cluster_dict(cfg) -> dict:
    c = cfg.cluster
    return {"gpu": c.gpu, "num_gpus": c.num_gpus, "gpus_per_node": c.gpus_per_node, "nics_per_node": c.nics_per_node,
            "nic_gbps": c.nic_gbps, "oversubscription": c.oversubscription, "network": c.network, "name": c.name}
