"""``flowsim sweep STUDY.yaml``: hardware / network what-if study with auto-tuning and cost."""
from __future__ import annotations

import click

from flowsim.cli.common import echo_json, format_table, notice_first_compile, user_errors
from flowsim.cli.tune_cmd import execution_options


def report(res) -> str:
    """The text table of a :class:`flowsim.explore.sweep.SweepResult`."""
    from flowsim.explore.pricing import SECONDS_PER_DAY

    st = res.study
    rows = []
    for r in res.rows:
        d = r.to_dict()
        d.update(mfu_pct=100 * d["mfu"], comm_pct=100 * d["exposed_comm_share"], ktok=d["tokens_per_s"] / 1e3,
                 days=d["time_to_train_s"] / SECONDS_PER_DAY, kgpuh=d["gpu_hours"] / 1e3, capex_m=d["capex_usd"] / 1e6,
                 cost_m=d["cost_usd"] / 1e6, mem_gb=d["memory_bytes_per_gpu"] / 1e9)
        rows.append(d)
    cols = [("hardware", "hardware", ""), ("workload", "workload", "")]
    cols += [(k, k, "") for k in st.grid_keys]
    cols += [("gpu", "gpu", ""), ("num_gpus", "GPUs", "d"), ("layout", "best layout", ""),
             ("step_time_s", "step s", ".3f"), ("ktok", "ktok/s", ".1f"), ("mfu_pct", "MFU %", ".1f"),
             ("comm_pct", "exposed comm %", ".1f"), ("mem_gb", "mem GB", ".1f"), ("days", "days", ".1f"),
             ("kgpuh", "kGPU-h", ".0f"), ("capex_m", "capex M$", ".1f"), ("cost_m", "train M$", ".2f"),
             ("usd_per_million_tokens", "$/Mtok", ".3f"), ("status", "status", "")]
    cols = [c for c in cols if c[0] != "workload" or any(r["workload"] for r in rows)]
    head = (f"study {st.name}: {len(st.points)} points, token budget {st.token_budget:.3g}; "
            f"simulated {res.evaluated}, from the store {res.reused}, {res.elapsed_s:.1f} s")
    return head + "\n\n" + format_table(rows, cols) + \
        "\n\nexposed comm: TP/CP/EP/PP/DP communication not hidden by compute, share of the step (critical stage)." \
        "\ncost: example prices unless the study's cost: section gives yours (see flowsim.explore.pricing)."


@click.command()
@click.argument("study_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="One JSON object with every point.")
@click.option("--csv", "as_csv", is_flag=True, help="One CSV row per point.")
@click.option("--plot", type=click.Path(dir_okay=False), help="Write cost-vs-time and heatmap plots (PNG).")
@execution_options
@user_errors
def sweep(study_file, as_json, as_csv, plot, db, jobs, scheduler, no_progress):
    """Run a study: hardware / network variants x workloads, each point simulated or auto-tuned, with
    time-to-train and cost. See examples/study_h100_nics.yaml for the format:

        flowsim sweep examples/study_h100_nics.yaml --plot study.png
    """
    from flowsim.explore.store import ResultStore
    from flowsim.explore.study import load_study
    from flowsim.explore.sweep import run_study
    from flowsim.io_text import check_output_file

    if plot:
        check_output_file(plot, "--plot")  # before the sweep, not after it
    study = load_study(study_file)
    notice_first_compile()
    with ResultStore(db) as store:
        res = run_study(study, store=store, jobs=jobs, scheduler=scheduler, progress=not no_progress)
    if plot:
        from flowsim.explore.plots import sweep_plot
        sweep_plot(res, plot)
    if as_json:
        echo_json(res.to_dict())
    elif as_csv:
        click.echo(res.to_frame().to_csv(index=False), nl=False)
    else:
        click.echo(report(res))
