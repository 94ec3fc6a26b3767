"""``flowsim calibrate``: fit the global efficiency parameters (GEMM fraction, host-cost multiplier) to the measured
runs of a runs CSV."""
from __future__ import annotations

import click

from flowsim.cli.common import echo_json, format_table, user_errors

_PARAM_COLUMNS = [
    ("arch", "GPU gen. / CPU", ""),
    ("family", "software family", ""),
    ("name", "parameter", ""),
    ("value", "value", ".3f"),
    ("uncertainty", "+-", ".3f"),
    ("range", "range", ""),
    ("rows", "rows", "d"),
    ("cv_error_pct", "LOSO |error| %", ".1f"),
]


def read_calibration_runs(runs_csv: str):
    """The runs of a runs CSV that flowsim simulates, as :class:`flowsim.calibrate.Run` (validation's reader and
    row mapping), and the ids it skipped with their reasons."""
    from flowsim.calibrate import Run
    from flowsim.validation.runs import config_of_row, read_runs

    runs, skipped = read_runs(runs_csv)
    out, skips = [], [(s.id, s.reason) for s in skipped]
    for _, row in runs.iterrows():
        cfg, _, reason = config_of_row(row)
        if reason is not None:
            skips.append((int(row["id"]), reason))
            continue
        out.append(Run(int(row["id"]), row["source"], cfg, float(row["measured_step_time_s"])))
    return out, skips


def tabulated(runs_csv: str, grid_points: int):
    """Runs of ``runs_csv``, their tabulated responses and parameter keys (simulations with the engine)."""
    import warnings

    from flowsim import simulate
    from flowsim.calibrate import tabulate
    from flowsim.errors import FlowsimWarning

    runs, skipped = read_calibration_runs(runs_csv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FlowsimWarning)  # releases priced from the nearest measured stack
        table, keys = tabulate(runs, simulate, grid_points)
    return runs, skipped, table, keys


def host_stage(runs, result, grid_points: int):
    """The host-multiplier stage (:func:`flowsim.calibrate.host.fit_host`) with the GEMM stage's kept values."""
    import warnings

    from flowsim import simulate
    from flowsim.calibrate import profile_of
    from flowsim.calibrate.host import fit_host
    from flowsim.errors import FlowsimWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FlowsimWarning)
        return fit_host(runs, simulate, profile_of(result, "", ""), grid_points)


@click.command("calibrate")
@click.argument("runs_csv", type=click.Path())
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False), required=True,
              help="Profile file to write (YAML); `-` prints it.")
@click.option("--grid", "grid_points", type=click.IntRange(min=3, max=25), default=7, show_default=True,
              help="Simulations per run over the parameter range (responses interpolated in between).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: parameters, refused, dropped, errors.")
@user_errors
def calibrate(runs_csv, output, grid_points, as_json):
    """Fit the sustained GEMM fraction per GPU generation x software family (and the host-cost multiplier per host
    CPU family x software family) to the runs in RUNS_CSV.

    Every run whose software release is known (``framework_version``) informs the GEMM fraction of its GPU
    generation and the release's software family; it informs the host multiplier of its CPU and family only when
    its step moves by more than 0.5 % with the host costs at the top of the range (then, with the GEMM fractions
    fixed, a second fit). A parameter informed by fewer than 3 runs is refused; each
    is fitted inside its physical range by robust least squares on log step time; a parameter that does not
    lower the leave-one-source-out error is dropped. Prints the parameters with their uncertainty and the
    median |error| uncalibrated, in-sample and leave-one-source-out, and writes the profile that
    ``--calibration`` (estimate, validate, tune, sweep) and the config key ``calibration`` read.

    Exit codes: 0 when a profile was written; 2 for an unreadable file, too few runs to fit or a bad option.
    """
    import sys

    import yaml

    from flowsim.calibrate import calibrate_runs, profile_of
    from flowsim.kernels.calibration import write_profile

    runs, skipped, table, keys = tabulated(runs_csv, grid_points)
    result = calibrate_runs(runs, table, keys)
    host = host_stage(runs, result, grid_points)
    if (table.times_s == table.times_s[:, :1]).all():
        click.echo("warning: no run's simulated step time depends on gemm_fraction; the engine in use does not "
                   "apply calibration profiles to the op pricing (docs/CALIBRATION.md, Status)", err=True)
    sources = sorted({r.source for r in runs})
    fitted_on = f"{runs_csv}: {len(runs)} runs of {len(sources)} sources ({len(skipped)} rows skipped)"
    command = f"flowsim calibrate {runs_csv} -o {output}" + (f" --grid {grid_points}" if grid_points != 7 else "")
    profile = profile_of(result, fitted_on, command, host)
    if output == "-":
        click.echo(yaml.safe_dump(profile.to_dict(), sort_keys=False, width=118), nl=False)
    else:
        write_profile(profile, output)
    errors = dict(profile.errors)
    summary = dict(errors, runs=len(runs), skipped=len(skipped))
    refused = list(result.refused) + list(host.refused)
    dropped = list(result.dropped) + (list(host.result.dropped) if host.result else [])
    if as_json:
        echo_json({"parameters": [p.to_dict() for p in profile.parameters],
                   "fallbacks": [f.to_dict() for f in profile.fallbacks],
                   "refused": [{"key": k, "rows": n} for k, n in refused],
                   "dropped": dropped, "errors": summary})
        return
    out = sys.stderr if output == "-" else sys.stdout
    rows = [dict(p.to_dict(), range=f"[{p.range[0]:g}, {p.range[1]:g}]") for p in profile.parameters]
    click.echo(format_table(rows, _PARAM_COLUMNS) if rows else "no parameter lowers the cross-validated error",
               file=out)
    for k, n in refused:
        click.echo(f"refused {k}: informed by {n} run(s), fewer than 3", file=out)
    for k in dropped:
        click.echo(f"dropped {k}: does not lower the leave-one-source-out error", file=out)
    fb = result.fallback
    if fb is not None:
        verdict = "kept" if fb.kept else "not kept: it does not lower that error"
        click.echo(f"fallback gemm_fraction {fb.value:.3f} (the mean of the fitted values) for pairs no parameter "
                   f"covers: leave-one-cluster-out median |error| {fb.loco_pct:.1f} % against "
                   f"{fb.loco_uncalibrated_pct:.1f} % uncalibrated, {verdict}", file=out)
    click.echo(f"{len(runs)} runs ({len(skipped)} rows skipped); median |error| uncalibrated "
               f"{errors['uncalibrated_median_pct']:.1f} %, in-sample {errors['in_sample_median_pct']:.1f} %, "
               f"leave-one-source-out {errors['loso_median_pct']:.1f} %", file=out)
    if output != "-":
        click.echo(f"wrote {output}", file=out)
