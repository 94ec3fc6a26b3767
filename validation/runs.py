"""Compare flowsim's predicted step time with published training runs ("runs schema v1" CSVs).

The runs schema is described in ``shared/data/curated/README.md``: one line per measured training run, with
the model dimensions, the cluster, the parallel layout and ``measured_step_time_s``. :func:`validate_runs`
reads any CSV in that schema, turns every row it can into a :class:`flowsim.config.SimConfig`
(:func:`row_to_config`), simulates it and reports the signed error per row and summary figures; every row
it cannot simulate is listed with the reason.

The work is split by concept: :mod:`~flowsim.validation.runs_read` reads the CSV,
:mod:`~flowsim.validation.runs_mapping` (with :mod:`~flowsim.validation.runs_v2` for the schema v2 setting
columns) maps a row to a config, and :mod:`~flowsim.validation.runs_compare` holds the comparison and the summary
figures. Their public names are importable from here.
"""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Callable

from flowsim.errors import ConfigError
from flowsim.validation.runs_compare import ErrorSummary, RunComparison, ValidationReport, summarize
from flowsim.validation.runs_mapping import NVL_HOST_GPUS, SYSTEM_NIC_GBPS, config_of_row, row_to_config
from flowsim.validation.runs_read import (NUMERIC_COLUMNS, REQUIRED_COLUMNS, TEXT_COLUMNS, V2_NUMERIC_COLUMNS,
                                          V2_SETTING_COLUMNS, V2_TEXT_COLUMNS, SkippedRun, read_runs)
from flowsim.validation.runs_v2 import V2_SETTINGS

__all__ = ["NUMERIC_COLUMNS", "TEXT_COLUMNS", "REQUIRED_COLUMNS", "V2_SETTING_COLUMNS", "V2_NUMERIC_COLUMNS",
           "V2_TEXT_COLUMNS", "V2_SETTINGS", "NVL_HOST_GPUS", "SYSTEM_NIC_GBPS", "RunComparison", "SkippedRun",
           "ErrorSummary", "ValidationReport", "read_runs", "row_to_config", "config_of_row", "summarize",
           "validate_runs"]


def _row_key(cfg) -> str:
    from flowsim.explore.point import config_key

    return config_key(cfg)


def _simulate_rows(configs: list, simulate: Callable, jobs: int, time_limit_s: float, progress: bool) -> dict:
    """Result (anything with ``step_time_s`` and ``fits_memory``) or skip reason of each distinct config, by
    :func:`flowsim.explore.point.config_key`: in this process with ``simulate`` when ``jobs`` is 1, else on
    :func:`flowsim.simulate_many`'s worker pool."""
    from flowsim.explore.runner import Progress, simulate_many
    from flowsim.explore.time_limit import TimeLimitExceeded, time_limit
    from flowsim.step.invariants import InvariantError, check_result
    from flowsim.step.result import Result

    distinct = {}
    for cfg in configs:
        distinct.setdefault(_row_key(cfg), cfg)
    if jobs != 1:
        frame = simulate_many(list(distinct.values()), jobs=jobs, progress=progress, time_limit_s=time_limit_s)
        out = {}
        for key, (_, r) in zip(distinct, frame.iterrows()):
            err = r["error"]
            known = err.startswith(("ConfigError: ", "TimeLimitExceeded: ", "InvariantError: "))
            out[key] = (err.split(": ", 1)[1] if known else err) if err else \
                SimpleNamespace(step_time_s=float(r["step_time_s"]), fits_memory=bool(r["fits_memory"]))
        return out
    out = {}
    bar = Progress(len(distinct), "validate", progress, unit="run")
    try:
        for key, cfg in distinct.items():
            try:
                with time_limit(time_limit_s):
                    out[key] = simulate(cfg)
                if isinstance(out[key], Result):
                    check_result(out[key])
            except (ConfigError, TimeLimitExceeded, InvariantError) as e:
                out[key] = str(e)
            bar.advance(1)
    finally:
        bar.close()
    return out


def validate_runs(path: str | Path, simulate: Callable | None = None, *,
                  only_ids=None, calibration: str = "", jobs: int = 1, time_limit_s: float = 0.0,
                  progress: bool = False) -> ValidationReport:
    """Simulate every row of a runs-schema-v1 CSV that flowsim supports and compare with the measurement.

    Parameters
    ----------
    path : str or Path
        The runs CSV.
    simulate : callable, optional
        ``simulate(SimConfig) -> Result``-like (anything with ``step_time_s`` and ``fits_memory``);
        default :func:`flowsim.simulate`. Tests pass a stand-in to check the arithmetic.
    only_ids : iterable of int, optional
        Compare only these row ids (others are neither simulated nor listed as skipped).
    calibration : str
        Calibration profile applied to every row (``--calibration``; a path or ``default``); empty = none.
    jobs : int
        Worker processes (:func:`flowsim.simulate_many`; 0 = one per CPU); 1 (default) simulates the rows in
        this process with ``simulate``. Identical configs are simulated once either way.
    time_limit_s : float
        Wall-clock limit of one row's simulation, seconds (0 = none): a row past it is skipped with the
        reason, the others go on.
    progress : bool
        Draw a progress line on stderr (rows simulated).

    Returns
    -------
    ValidationReport
        Per-row comparison, summary (overall and per ``source``), and the skipped rows with reasons:
        malformed lines, no measured step time, MoE models, GPUs without a spec, a config that
        build_config rejects, and layouts the simulator rejects (the ConfigError message).

    Raises
    ------
    ConfigError
        When the file cannot be read or lacks a required column, or an id of ``only_ids`` is not in it.
    """
    if simulate is None:
        from flowsim.step.simulate import simulate
    runs, skipped = read_runs(path)
    if only_ids is not None:
        wanted = [int(i) for i in only_ids]
        absent = sorted(set(wanted) - set(runs["id"]) - {s.id for s in skipped})
        if absent:
            raise ConfigError("only_ids", "not in the runs file", ", ".join(map(str, absent)))
        runs = runs[runs["id"].isin(wanted)]
        skipped = [s for s in skipped if s.id in wanted]
    rows: list[RunComparison] = []
    built = [(row, *config_of_row(row, calibration)) for _, row in runs.iterrows()]
    results = _simulate_rows([cfg for _, cfg, _, reason in built if reason is None], simulate, jobs, time_limit_s,
                             progress)
    for row, cfg, assumptions, reason in built:
        if reason is None:
            result = results[_row_key(cfg)]
            if isinstance(result, str):
                reason = result
        if reason is not None:
            skipped.append(SkippedRun(int(row["id"]), reason))
            continue
        t = cfg.training
        measured = float(row["measured_step_time_s"])
        predicted = float(result.step_time_s)
        rows.append(RunComparison(
            id=int(row["id"]), source=row["source"], model=row["model"], gpu=row["gpu"],
            num_gpus=cfg.cluster.num_gpus, tp=t.tp, pp=t.pp, dp=t.dp, cp=t.cp,
            predicted_step_time_s=predicted, measured_step_time_s=measured,
            error_pct=(predicted - measured) / measured * 100.0, fits_memory=bool(result.fits_memory),
            assumptions=assumptions,
            family="moe" if cfg.model.is_moe else ("dense-fsdp" if t.zero_stage >= 2 else "dense")))
    by_source: dict[str, list[RunComparison]] = {}
    by_family: dict[str, list[RunComparison]] = {}
    for r in rows:
        by_source.setdefault(r.source, []).append(r)
        by_family.setdefault(r.family, []).append(r)
    return ValidationReport(
        by_family={f: summarize([r.predicted_step_time_s for r in rs], [r.measured_step_time_s for r in rs])
                   for f, rs in sorted(by_family.items())},
        rows=tuple(rows),
        summary=summarize([r.predicted_step_time_s for r in rows], [r.measured_step_time_s for r in rows]),
        by_source={src: summarize([r.predicted_step_time_s for r in rs], [r.measured_step_time_s for r in rs])
                   for src, rs in by_source.items()},
        skipped=tuple(skipped))
