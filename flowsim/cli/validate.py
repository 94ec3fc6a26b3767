"""``flowsim validate``: predicted against measured step times of the runs in a runs-schema-v1 CSV."""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from flowsim.cli.common import echo_json, format_table, notice_first_compile, user_errors
from flowsim.errors import ConfigError

if TYPE_CHECKING:
    from flowsim.validation.runs import ValidationReport

_MODEL_WIDTH = 28  # characters of the model name shown in the table
# Default wall-clock limit of one row: every config within flowsim.config.bounds simulates in a few seconds
# (docs/RELIABILITY.md); 60 s leaves a wide margin on a loaded machine while no row can stall a long file.
ROW_TIME_LIMIT_S = 60.0

_ROW_COLUMNS = [
    ("id", "id", ""),
    ("model", "model", ""),
    ("gpu", "gpu", ""),
    ("num_gpus", "GPUs", "d"),
    ("layout", "tp/pp/dp/cp", ""),
    ("predicted_step_time_s", "predicted s", ".4g"),
    ("measured_step_time_s", "measured s", ".4g"),
    ("error_pct", "error %", "+.1f"),
    ("memory", "memory GiB pred/meas", ""),
    ("assumed", "assumed (empty cells)", ""),
]

_SOURCE_COLUMNS = [
    ("source", "source", ""),
    ("n", "n", "d"),
    ("median_abs_error_pct", "median |error| %", ".1f"),
    ("mape_pct", "MAPE %", ".1f"),
    ("p90_abs_error_pct", "p90 |error| %", ".1f"),
]


def _parse_ids(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError("--only-ids", "must be comma-separated integer row ids", text) from None
    if not ids:
        raise ConfigError("--only-ids", "must name at least one row id", text)
    return ids


def _parse_ks(text: str) -> list[int]:
    try:
        ks = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        ks = []
    if not ks or min(ks) < 0:
        raise ConfigError("--calibrate-on", "must be comma-separated run counts >= 0", text)
    return sorted(set(ks))


def _transfer(runs_csv: str, ks: list[int], as_json: bool) -> None:
    """Per-source error of the runs not fitted when k runs per cluster are (flowsim.calibrate.transfer)."""
    import numpy as np

    from flowsim.calibrate import Observations, calibrate_on
    from flowsim.cli.calibrate_cmd import tabulated
    from flowsim.kernels.calibration import PARAMETERS

    runs, _, table, keys = tabulated(runs_csv, 7)
    obs = Observations(np.array([r.measured_s for r in runs]), np.array([r.source for r in runs]), np.array(keys))
    ranges = {k: PARAMETERS["gemm_fraction"].range for k in set(keys) - {""}}
    results = {k: {e.source: e for e in calibrate_on(obs, table, ranges, k)} for k in ks}
    if as_json:
        echo_json({"calibrate_on": [e.__dict__ for k in ks for e in results[k].values()]})
        return
    sources = sorted(set().union(*results.values()))
    rows = [{"source": src, **{f"k{k}": (f"{results[k][src].median_abs_error_pct:.1f} ({results[k][src].predicted})"
                                          if src in results[k] else "-") for k in ks}} for src in sources]
    click.echo(format_table(rows, [("source", "source", "")] + [(f"k{k}", f"k={k}: |error| % (n)", "") for k in ks]))
    click.echo("median |error| of each source's runs that were not fitted, when k runs of each of its clusters "
               "were (k = 0: uncalibrated; fewer than 3 fitted runs refit nothing)")


def _short(name: str) -> str:
    return name if len(name) <= _MODEL_WIDTH else name[:_MODEL_WIDTH - 3] + "..."


def _memory_cell(r) -> str:
    """``predicted/measured`` peak memory in GiB where the row states a measured peak; ``!`` marks a row
    predicted not to fit."""
    flag = "" if r.fits_memory else "!"
    if r.measured_memory_gib == r.measured_memory_gib:  # not NaN
        return f"{r.predicted_memory_gib:.1f}/{r.measured_memory_gib:.1f}{flag}"
    return flag


def _render(report: ValidationReport) -> str:
    rows = [{"id": r.id, "model": _short(r.model), "gpu": r.gpu, "num_gpus": r.num_gpus, "layout": r.layout,
             "predicted_step_time_s": r.predicted_step_time_s, "measured_step_time_s": r.measured_step_time_s,
             "error_pct": r.error_pct, "memory": _memory_cell(r),
             "assumed": ",".join(a.split(":")[0] for a in r.assumptions)}
            for r in report.rows]
    s = report.summary
    out = [format_table(rows, _ROW_COLUMNS), "",
           f"simulated {s.n} rows, skipped {len(report.skipped)}",
           f"median |error| {s.median_abs_error_pct:.1f} %   MAPE {s.mape_pct:.1f} %   "
           f"p90 |error| {s.p90_abs_error_pct:.1f} %   Spearman {s.spearman:.3f}",
           "error = (predicted - measured) / measured; positive = flowsim predicts a slower step"]
    mem = report.memory
    if mem is not None:
        if mem.n:
            out.append(f"peak memory of the {mem.n} rows whose notes state it: median |error| "
                       f"{mem.median_abs_error_pct:.1f} %, median {mem.median_error_pct:+.1f} %, max |error| "
                       f"{mem.max_abs_error_pct:.1f} % (flowsim's allocated bytes against the measured peak, "
                       "torchtitan's max_memory_reserved)")
        out.append(f"predicted not to fit in GPU memory: {mem.not_fitting} of {s.n} rows (every row ran)")
    if report.by_family:
        per_family = [{"source": fam, "n": x.n, "median_abs_error_pct": x.median_abs_error_pct,
                       "mape_pct": x.mape_pct, "p90_abs_error_pct": x.p90_abs_error_pct}
                      for fam, x in report.by_family.items()]
        out += ["", "per layout family (dense = TP/PP/CP/DP with all-reduce or distributed optimizer; "
                "dense-fsdp = ZeRO-2/3 / FSDP; moe):", format_table(per_family, _SOURCE_COLUMNS)]
    if report.by_source:
        per_source = [{"source": src, "n": x.n, "median_abs_error_pct": x.median_abs_error_pct,
                       "mape_pct": x.mape_pct, "p90_abs_error_pct": x.p90_abs_error_pct}
                      for src, x in report.by_source.items()]
        out += ["", "per source:", format_table(per_source, _SOURCE_COLUMNS)]
    if report.skipped:
        out += ["", f"skipped ({len(report.skipped)}):"]
        out += [f"  id {'-' if k.id is None else k.id}: {k.reason}" for k in report.skipped]
    return "\n".join(out)


@click.command("validate")
@click.argument("runs_csv", type=click.Path())
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object: rows, summary (n, median_abs_error_pct, mape_pct, p90_abs_error_pct, "
                   "spearman) and skipped.")
@click.option("--only-ids", metavar="ID,ID,...", help="Compare only these row ids, e.g. --only-ids 1,2,3.")
@click.option("--report", "report_dir", type=click.Path(file_okay=False),
              help="Also write REPORT/ACCURACY.md and its plots from every data set of the shared data folder "
                   "that holds RUNS_CSV (its grandparent: data/curated/runs.csv -> data); same as "
                   "`flowsim report REPORT --data-dir DATA`.")
@click.option("--calibration", metavar="PROFILE",
              help="Calibration profile: `default` (the shipped one, the default), a file from `flowsim calibrate`, "
                   "or `none` (what the rows give without it).")
@click.option("--calibrate-on", "calibrate_on", metavar="K[,K...]",
              help="Transfer check instead of the row table: for each k, fit k runs of every cluster (source x "
                   "GPU generation x software family) and report the error of its other runs per source, "
                   "e.g. --calibrate-on 0,1,3,5 (k = 0: uncalibrated).")
@click.option("--jobs", type=click.IntRange(min=0), default=1, show_default=True,
              help="Worker processes for the rows (0 = one per CPU); each maps, simulates and checks its rows. "
                   "Rows with identical cells are simulated once.")
@click.option("--time-limit", "time_limit_s", type=click.FloatRange(min=0), default=ROW_TIME_LIMIT_S,
              show_default=True, help="Seconds one row may simulate before it is skipped with the reason (0 = none).")
@click.option("--progress/--no-progress", default=None,
              help="Progress line on stderr (default: when stderr is a terminal).")
@user_errors
def validate(runs_csv, as_json, only_ids, report_dir, calibration, calibrate_on, jobs, time_limit_s, progress):
    """Compare predicted and measured step times for the runs in RUNS_CSV ("runs schema v1").

    Prints per row the predicted and measured seconds per optimizer step and the signed error, then the
    median, mean (MAPE) and 90th percentile of |error| and the Spearman rank correlation, overall and per
    source; the predicted against the measured peak memory of the rows whose notes state one ("peak mem X GiB";
    "!" marks a row flowsim predicts does not fit) and how many rows are predicted not to fit; then every row
    that was not simulated with the reason (no measured step time, MoE, a GPU
    without a spec, an empty or invalid field, a layout flowsim rejects). Empty cells filled with a
    default are listed per row under "assumed" (all of them, spelled out, in --json).

    Exit codes: 0 when the file was read (even if rows were skipped); 2 for an unreadable file, a missing
    column or a bad option.
    """
    from flowsim.validation.runs import validate_runs

    if calibrate_on is not None:
        _transfer(runs_csv, _parse_ks(calibrate_on), as_json)
        return
    notice_first_compile()
    report = validate_runs(runs_csv, only_ids=_parse_ids(only_ids), calibration=calibration or "", jobs=jobs,
                           time_limit_s=time_limit_s, progress=sys.stderr.isatty() if progress is None else progress)
    if as_json:
        echo_json(report.to_dict())
    else:
        click.echo(_render(report))
    if report_dir:
        from pathlib import Path

        from flowsim.validation.report import run_report, write_report

        data_dir = Path(runs_csv).resolve().parent.parent
        for path in write_report(run_report(data_dir), report_dir, data_dir):
            click.echo(str(path), err=as_json)
