"""Budgeted layout search with optuna's TPE sampler, for spaces too large to enumerate.

Each trial draws one value per :class:`~flowsim.explore.space.LayoutSpace` dimension (the schedule only where
there is a choice, sequence parallelism only with tp > 1), builds the config with
:func:`flowsim.build_config` and evaluates it with :func:`flowsim.explore.point.evaluate`, the same unit of work
as exhaustive tuning. Trials that break a config rule, shard nothing with ZeRO, or do not fit in memory
are pruned (counted per reason, as in :func:`flowsim.explore.tune.tune`) and do not use the budget; a layout
drawn again is answered from what was already evaluated. The budget is the number of distinct configs
evaluated (simulated now or found in the results store). Trials run one at a time in this process.

optuna is an optional dependency (``pip install 'flowsim[search]'``), imported on first use.
"""
from __future__ import annotations

import time
from collections import Counter
from typing import Mapping

from flowsim.config import build_config
from flowsim.errors import ConfigError
from flowsim.explore.point import evaluate
from flowsim.explore.runner import Progress
from flowsim.explore.space import MEMORY, REDUNDANT, LayoutSpace, layout_overrides, schedules_for
from flowsim.explore.tune import TuneResult, check_job, job_config, rank_key

MAX_TRIALS_PER_CONFIG = 50  # give up when this many trials per budgeted config found nothing new


def _optuna():
    try:
        import optuna
    except ImportError:
        raise ConfigError("search", "tpe needs the optional optuna package (pip install 'flowsim[search]')",
                          "tpe") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def _draw(trial, space: LayoutSpace) -> dict:
    """One layout (``dp`` derived) drawn by ``trial`` from ``space``."""
    d = {name: trial.suggest_categorical(name, list(getattr(space, name)))
         for name in ("tp", "pp", "vpp", "cp", "ep", "mbs", "recompute", "zero")}
    d["sp"] = trial.suggest_categorical("sp", list(space.sp)) if d["tp"] > 1 else False
    scheds = schedules_for(space, d["pp"], d["vpp"])
    d["schedule"] = trial.suggest_categorical("schedule", list(scheds)) if len(scheds) > 1 else scheds[0]
    return d


def tpe_search(job: Mapping, space: LayoutSpace | None = None, *, budget: int, store=None, seed: int = 0,
               progress: bool = False, study: str = "tune") -> TuneResult:
    """Search the layouts of ``job`` with TPE until ``budget`` distinct configs have been evaluated.

    Parameters
    ----------
    job : mapping
        As for :func:`flowsim.explore.tune.tune` (no layout keys).
    space : LayoutSpace, optional
        Dimensions to search; default :meth:`LayoutSpace.default` for the job.
    budget : int
        Distinct configs to evaluate, >= 1.
    store : ResultStore, optional
        Results store: configs already there are not simulated again; new results are added.
    seed : int
        Seed of the TPE sampler (same seed, same trials).
    progress : bool
        Draw a progress line on stderr.
    study : str
        Label of the stored rows.

    Returns
    -------
    TuneResult
        With ``search`` = ``"tpe"``; ``candidates`` counts the trials drawn, ``valid`` the distinct
        configs that passed the rules, ``ranked`` the evaluated configs that fit.
    """
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
        raise ConfigError("budget", "must be a positive integer", budget)
    optuna = _optuna()
    start = time.perf_counter()
    job = check_job(job)
    space = space or LayoutSpace.default(job_config(job))
    opt = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=seed))
    stored = store.keys() if store is not None else frozenset()
    known_pruned = store.memory_pruned() if store is not None else {}
    pruned: Counter = Counter()
    seen: dict = {}  # config key -> PointResult (None: pruned for memory)
    counts = Counter()
    bar = Progress(budget, "tpe", progress)
    trials = 0
    while counts["evaluated"] + counts["stored"] < budget and trials < MAX_TRIALS_PER_CONFIG * budget:
        trials += 1
        trial = opt.ask()
        layout = _draw(trial, space)
        try:
            cfg = build_config(job, **layout_overrides(dp=0, **layout))
        except ConfigError as e:
            pruned[e.field] += 1
            opt.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        if layout["zero"] and cfg.training.dp * cfg.training.cp == 1:
            pruned[REDUNDANT] += 1
            opt.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        [out] = evaluate([(0, cfg)], stored, known_pruned=known_pruned)
        if out.key not in seen:
            if out.status == "stored":
                seen[out.key] = store.get([out.key])[out.key]
            else:
                seen[out.key] = out.point
                if out.status == "memory":
                    pruned[MEMORY] += 1
                    if store is not None and out.key not in known_pruned:
                        store.put_memory_pruned({out.key: out.memory_bytes})
                elif store is not None:
                    store.put([(cfg, out.point)], study)
            if out.status != "memory":
                counts[out.status] += 1
                bar.advance(1)
        point = seen[out.key]
        if point is None or not point.fits_memory:
            opt.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            opt.tell(trial, point.step_time_s)
    bar.close()
    ranked = sorted((p for p in seen.values() if p is not None and p.fits_memory), key=rank_key)
    return TuneResult(job=job, space=space, candidates=trials, pruned=dict(pruned), valid=len(seen),
                      evaluated=counts["evaluated"], reused=counts["stored"], ranked=tuple(ranked),
                      elapsed_s=time.perf_counter() - start, search="tpe")
