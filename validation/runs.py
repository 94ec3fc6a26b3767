"""Compare flowsim's predicted step time with published training runs ("runs schema v1" CSVs).

The runs schema is described in ``shared/data/curated/README.md``: one line per measured training run, with
the model dimensions, the cluster, the parallel layout and ``measured_step_time_s``. :func:`validate_runs`
reads any CSV in that schema, turns every row it can into a :class:`flowsim.config.SimConfig`
(:func:`row_to_config`), simulates it and reports the signed error per row and summary figures; every row
it cannot simulate is listed with the reason.

The work is split by concept: :mod:`~flowsim.validation.runs_read` reads the CSV,
:mod:`~flowsim.validation.runs_mapping` (with :mod:`~flowsim.validation.runs_v2` for the schema v2 setting
columns) maps a row to a config, and :mod:`~flowsim.validation.runs_compare` holds the comparison and the summary
figures; :mod:`~flowsim.validation.runs_predict` predicts the rows, in this process or on worker processes.
Their public names are importable from here.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from flowsim.errors import ConfigError
from flowsim.units import GiB
from flowsim.validation.runs_compare import (ErrorSummary, MemorySummary, RunComparison, ValidationReport, one_nan,
                                             summarize, summarize_memory)
from flowsim.validation.runs_mapping import (NVL_HOST_GPUS, SYSTEM_NIC_GBPS, config_of_row, measured_peak_memory_gib,
                                             row_to_config)
from flowsim.validation.runs_predict import RowPredictor, predict_rows
from flowsim.validation.runs_read import (NUMERIC_COLUMNS, REQUIRED_COLUMNS, TEXT_COLUMNS, V2_NUMERIC_COLUMNS,
                                          V2_SETTING_COLUMNS, V2_TEXT_COLUMNS, SkippedRun, read_run_records,
                                          read_runs)
from flowsim.validation.runs_v2 import V2_SETTINGS

__all__ = ["NUMERIC_COLUMNS", "TEXT_COLUMNS", "REQUIRED_COLUMNS", "V2_SETTING_COLUMNS", "V2_NUMERIC_COLUMNS",
           "V2_TEXT_COLUMNS", "V2_SETTINGS", "NVL_HOST_GPUS", "SYSTEM_NIC_GBPS", "RunComparison", "SkippedRun",
           "ErrorSummary", "MemorySummary", "ValidationReport", "read_runs", "read_run_records", "row_to_config",
           "config_of_row", "measured_peak_memory_gib", "summarize", "summarize_memory", "validate_runs"]


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
        Worker processes (0 = one per CPU); 1 (default) simulates the rows in this process. Each row's
        mapping, simulation and check run where it is predicted (:mod:`~flowsim.validation.runs_predict`):
        rows with identical cells are predicted once, identical configs simulated once per process.
    time_limit_s : float
        Wall-clock limit of one row's simulation, seconds (0 = none): a row past it is skipped with the
        reason, the others go on.
    progress : bool
        Draw a progress line on stderr (rows simulated).

    Returns
    -------
    ValidationReport
        Per-row comparison, summary (overall and per ``source``), and the skipped rows with reasons:
        malformed lines, no measured step time, GPUs without a spec, a config that build_config rejects,
        layouts the simulator rejects (the ConfigError message), a simulation past ``time_limit_s``, a
        result that breaks an invariant, and any other exception of a simulation (its type and message).

    Raises
    ------
    ConfigError
        When the file cannot be read or lacks a required column, or an id of ``only_ids`` is not in it.
    """
    if simulate is None:
        from flowsim.step.simulate import simulate
    records, skipped = read_run_records(path)
    if only_ids is not None:
        wanted = {int(i) for i in only_ids}
        absent = sorted(wanted - {r["id"] for r in records} - {s.id for s in skipped})
        if absent:
            raise ConfigError("only_ids", "not in the runs file", ", ".join(map(str, absent)))
        records = [r for r in records if r["id"] in wanted]
        skipped = [s for s in skipped if s.id in wanted]
    predictions = predict_rows(records, RowPredictor(simulate, calibration, time_limit_s), jobs, progress)
    rows: list[RunComparison] = []
    for row, p in zip(records, predictions):
        if p.reason is not None:
            skipped.append(SkippedRun(row["id"], p.reason))
            continue
        measured = float(row["measured_step_time_s"])
        predicted_gib, measured_gib = one_nan(p.memory_allocated_bytes / GiB), measured_peak_memory_gib(row)
        rows.append(RunComparison(
            id=row["id"], source=row["source"], model=row["model"], gpu=row["gpu"],
            num_gpus=p.num_gpus, tp=p.tp, pp=p.pp, dp=p.dp, cp=p.cp,
            predicted_step_time_s=p.step_time_s, measured_step_time_s=measured,
            error_pct=(p.step_time_s - measured) / measured * 100.0, fits_memory=p.fits_memory,
            assumptions=p.assumptions, family=p.family, predicted_memory_gib=predicted_gib,
            measured_memory_gib=measured_gib,
            memory_error_pct=one_nan((predicted_gib - measured_gib) / measured_gib * 100.0)))
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
        skipped=tuple(skipped), memory=summarize_memory(rows))
