"""Auto-tuning: the fastest parallel layouts of one job that fit in memory, and why the others lose.

:func:`tune` enumerates the layout space (:mod:`flowsim.explore.space`), prunes it by the config rules and by
memory, evaluates the rest with :func:`flowsim.simulate` (:mod:`flowsim.explore.runner`: local processes or
Dask, results kept in the store) and ranks the configs that fit by step time.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Mapping

import pandas as pd

from flowsim.config import build_config
from flowsim.errors import ConfigError
from flowsim.explore.point import PointResult
from flowsim.explore.runner import run_configs
from flowsim.explore.space import MEMORY, LayoutSpace, enumerate_layouts

_COMPONENT_NAMES = {"compute_s": "compute", "bubble_s": "pipeline bubble", "optimizer_s": "optimizer"}
_RECOMPUTE_ORDER = {"none": 0, "selective": 1, "full": 2}
TIE_RTOL = 1e-9  # step times within this relative difference are a tie
LAYOUT_KEYS = ("tp", "pp", "vpp", "cp", "dp", "sp", "mbs", "recompute", "zero", "schedule", "ep",
               "tensor_model_parallel_size", "pipeline_model_parallel_size",
               "virtual_pipeline_model_parallel_size", "context_parallel_size", "data_parallel_size",
               "sequence_parallel", "micro_batch_size", "recompute_granularity", "use_distributed_optimizer",
               "distributed_optimizer", "zero_stage", "pipeline_schedule")
"""Keys a job description may not fix when its layout is tuned (the space sets them)."""


def loss_reason(point: PointResult, winner: PointResult) -> tuple:
    """Why ``point`` is slower than ``winner``: the breakdown component that grew most.

    Returns ``(component, delta_s)``: ``compute``, ``recompute`` (when ``point`` recomputes more than
    the winner, the extra compute is the recomputed forward pass), ``TP comm``, ``DP comm`` (any
    ``*_comm_s`` component), ``pipeline bubble``, ``optimizer``; or ``tie`` when the step times are equal.
    """
    if point.step_time_s <= winner.step_time_s * (1 + TIE_RTOL):
        return "tie", 0.0
    deltas = {c: point.breakdown.get(c, 0.0) - winner.breakdown.get(c, 0.0)
              for c in set(point.breakdown) | set(winner.breakdown)}
    comp = max(sorted(deltas), key=deltas.get)
    name = _COMPONENT_NAMES.get(comp) or comp[:-len("_comm_s")].upper() + " comm"
    if comp == "compute_s" and _RECOMPUTE_ORDER[point.layout.recompute] > _RECOMPUTE_ORDER[winner.layout.recompute]:
        name = "recompute"
    return name, deltas[comp]


def rank_key(p: PointResult) -> tuple:
    """Sort key: step time, then memory, then the simpler layout (less recompute, lower ZeRO stage)."""
    return (p.step_time_s, p.memory_bytes_per_gpu, _RECOMPUTE_ORDER[p.layout.recompute], p.layout.zero, p.key)


def pareto_front(points, x: str = "step_time_s", y: str = "memory_bytes_per_gpu") -> list:
    """The ``points`` not dominated in (``x``, ``y``), attributes both minimised, sorted by ``x``."""
    front, best_y = [], float("inf")
    for p in sorted(points, key=lambda q: (getattr(q, x), getattr(q, y))):
        if getattr(p, y) < best_y:
            front.append(p)
            best_y = getattr(p, y)
    return front


@dataclass(frozen=True)
class TuneResult:
    """Outcome of :func:`tune`.

    Attributes
    ----------
    job : dict
        The job description tuned (model, cluster, GPUs, batch, ...).
    space : LayoutSpace
        The dimensions searched.
    candidates : int
        Size of the Cartesian product of the space.
    pruned : dict[str, int]
        Candidates not simulated, by reason: the config field whose rule they break, ``redundant``
        (ZeRO with nothing to shard) or ``memory`` (does not fit).
    valid : int
        Candidates that pass every config rule (before the memory check).
    evaluated, reused : int
        Configs simulated in this run, and configs whose result came from the store.
    ranked : tuple[PointResult, ...]
        Every config that fits, fastest first (ties: see :func:`rank_key`).
    elapsed_s : float
        Wall time of the whole tuning run, seconds.
    search : str
        ``exhaustive`` (:func:`tune`) or ``tpe`` (:func:`flowsim.explore.search.tpe_search`: ``candidates`` then
        counts the trials drawn and ``valid`` the distinct configs that passed the rules).
    """

    job: dict
    space: LayoutSpace
    candidates: int
    pruned: dict
    valid: int
    evaluated: int
    reused: int
    ranked: tuple
    elapsed_s: float
    search: str = "exhaustive"

    @property
    def best(self) -> PointResult | None:
        """The fastest config that fits, or None when none does."""
        return self.ranked[0] if self.ranked else None

    def top(self, k: int) -> list:
        """The ``k`` fastest configs, each as a dict: :meth:`PointResult.to_dict` plus ``rank``,
        ``slower_pct`` (vs the best) and, after the first, ``loses_on`` / ``loses_by_s``."""
        rows = []
        for i, p in enumerate(self.ranked[:k]):
            row = {"rank": i + 1, **p.to_dict(), "slower_pct": 100 * (p.step_time_s / self.best.step_time_s - 1)}
            if i:
                row["loses_on"], row["loses_by_s"] = loss_reason(p, self.best)
            rows.append(row)
        return rows

    def pareto(self) -> list:
        """The step-time vs memory Pareto front of the configs that fit."""
        return pareto_front(self.ranked)

    def to_dict(self, top: int = 10) -> dict:
        """JSON view: the job, space, counts, the top ``top`` configs and the Pareto front."""
        return {"job": self.job, "search": self.search, "space": self.space.to_dict(), "candidates": self.candidates,
                "valid": self.valid, "pruned": self.pruned, "evaluated": self.evaluated, "reused": self.reused,
                "fitting": len(self.ranked), "elapsed_s": self.elapsed_s, "top": self.top(top),
                "pareto": [p.to_dict() for p in self.pareto()]}

    def to_frame(self) -> pd.DataFrame:
        """Every ranked config, one row each (columns of :meth:`PointResult.to_dict`)."""
        return pd.DataFrame([p.to_dict() for p in self.ranked])


def check_job(job: Mapping) -> dict:
    """``job`` as a dict, refusing layout keys (the tuner chooses those)."""
    job = dict(job)
    fixed = [k for k in job if k.replace("-", "_") in LAYOUT_KEYS]
    if fixed:
        raise ConfigError(fixed[0], "is chosen by the tuner; restrict the search space instead "
                          "(e.g. LayoutSpace.default(..., tp=(8,)) or `flowsim tune --tp 8`)", job[fixed[0]])
    return job


def job_config(job: Mapping):
    """The job's config on the simplest layout (one GPU per replica, no splitting), to read its model
    and cluster; checks the job (its batch is checked per layout, not here)."""
    return build_config(check_job(job), tp=1, pp=1, vpp=1, cp=1, dp=0, sp=False, mbs=1, gbs=0)


def tune(job: Mapping, space: LayoutSpace | None = None, *, store=None, jobs: int = 0,
         scheduler: str | None = None, progress: bool = False, study: str = "tune") -> TuneResult:
    """Rank every valid layout of ``job`` that fits in memory by simulated step time.

    Parameters
    ----------
    job : mapping
        A :func:`flowsim.build_config` mapping without layout keys: ``model``, ``cluster``, ``gpus``,
        ``gbs``, ``seq``, cluster overrides, precision, ...
    space : LayoutSpace, optional
        Dimensions to search; default :meth:`LayoutSpace.default` for the job.
    store : ResultStore, optional
        Results store: configs already there are not simulated again; new results are added.
    jobs, scheduler, progress
        Execution (see :func:`flowsim.explore.runner.run_configs`).
    study : str
        Label of the stored rows.

    Raises
    ------
    ConfigError
        A bad job (unknown preset, broken rule independent of the layout), a layout key in ``job``,
        a bad space, or no candidate passing the config rules.
    """
    job = check_job(job)
    space = space or LayoutSpace.default(job_config(job))
    enum = enumerate_layouts(job, space)
    if not enum.configs:
        raise ConfigError("space", "no layout in the search space passes the config rules (candidates pruned "
                          "per rule given)", enum.pruned)
    run = run_configs(list(enum.configs), store=store, study=study, jobs=jobs, scheduler=scheduler,
                      progress=progress, label="tune")
    pruned = Counter(enum.pruned)
    if run.memory_pruned:
        pruned[MEMORY] += run.memory_pruned
    ranked = sorted((o.point for o in run.outcomes if o.point is not None and o.point.fits_memory), key=rank_key)
    return TuneResult(job=job, space=space, candidates=enum.candidates, pruned=dict(pruned),
                      valid=len(enum.configs), evaluated=run.evaluated, reused=run.reused, ranked=tuple(ranked),
                      elapsed_s=run.elapsed_s)
