"""``flowsim tune``: rank every valid parallel layout of a job by simulated step time."""
from __future__ import annotations

import click

from flowsim.cli.common import echo_json, format_table, notice_first_compile, user_errors
from flowsim.cli.estimate import _parse_set
from flowsim.config import list_presets

POS_INT = click.IntRange(min=1)

_LAYOUT_COLS = [("rank", "rank", "d"), ("tp", "tp", "d"), ("pp", "pp", "d"), ("vpp", "vpp", "d"), ("cp", "cp", "d"),
                ("ep", "ep", "d"), ("dp", "dp", "d"), ("sp_txt", "sp", ""), ("mbs", "mbs", "d"),
                ("recompute", "recompute", ""),
                ("zero", "zero", "d"), ("schedule", "schedule", ""), ("step_time_s", "step s", ".3f"),
                ("mfu_pct", "MFU %", ".1f"), ("mem_gb", "mem GB", ".1f"), ("slower_pct", "slower %", ".1f"),
                ("loses", "loses on", "")]


def execution_options(f):
    """--db, --jobs, --scheduler, --no-progress (shared by tune and sweep)."""
    f = click.option("--no-progress", is_flag=True, help="No progress line on stderr.")(f)
    f = click.option("--scheduler", metavar="dask://HOST:PORT",
                     help="Run on a dask.distributed scheduler instead of local processes.")(f)
    f = click.option("--jobs", type=click.IntRange(min=0), default=0, show_default=True,
                     help="Local worker processes (0 = one per CPU).")(f)
    f = click.option("--db", type=click.Path(dir_okay=False),
                     help="Results database (default ~/.cache/flowsim/results.sqlite or $FLOWSIM_DB).")(f)
    return f


PARETO_SHOWN = 12  # Pareto points in the text report (evenly spaced; --json lists all)


def _loses(r: dict) -> str:
    if "loses_on" not in r:
        return ""
    return "tie" if r["loses_on"] == "tie" else f"{r['loses_on']} +{r['loses_by_s']:.3f} s"


def _spaced(items: list, k: int) -> list:
    """At most ``k`` items, evenly spaced, keeping the first and the last."""
    if len(items) <= k:
        return items
    return [items[round(i * (len(items) - 1) / (k - 1))] for i in range(k)]


def _rows(points: list) -> list:
    for r in points:
        r.update(sp_txt="on" if r["sp"] else "off", mfu_pct=100 * r["mfu"], mem_gb=r["memory_bytes_per_gpu"] / 1e9,
                 loses=_loses(r))
    return points


def report(res, top: int) -> str:
    """The text report of a :class:`flowsim.explore.tune.TuneResult`."""
    j = res.job
    rule = ", ".join(f"{k} {v}" for k, v in sorted(res.pruned.items(), key=lambda kv: -kv[1]) if k != "memory")
    lines = [
        (f"TPE search ({res.candidates} trials): " if res.search == "tpe" else "") + f"{j.get('model')} on {j.get('gpus') or j.get('num_gpus')} GPUs ({j.get('cluster') or j.get('gpu')}), "
        f"global batch {j.get('gbs') or j.get('global_batch_size')}",
        f"{'trials' if res.search == 'tpe' else 'space'}: {res.candidates} candidates; pruned by config rule: "
        f"{rule or 'none'}",
        f"valid: {res.valid}; pruned by memory: {res.pruned.get('memory', 0)}; fit: {len(res.ranked)} "
        f"(simulated now {res.evaluated}, from the store {res.reused}) in {res.elapsed_s:.1f} s",
        "",
    ]
    if not res.ranked:
        lines.append("no valid layout fits in GPU memory")
        return "\n".join(lines)
    cols = [c for c in _LAYOUT_COLS if c[0] != "ep" or any(p.layout.ep > 1 for p in res.ranked)]
    lines.append(format_table(_rows(res.top(top)), cols))
    rank = {p.key: i + 1 for i, p in enumerate(res.ranked)}
    pareto = res.pareto()
    front = [dict(p.to_dict(), rank=rank[p.key]) for p in _spaced(pareto, PARETO_SHOWN)]
    shown = "" if len(front) == len(pareto) else \
        f" ({len(front)} of {len(pareto)} points, evenly spaced; --json lists all)"
    lines += ["", f"Pareto front, step time vs memory per GPU{shown}:",
              format_table(_rows(front), [c for c in cols if c[0] not in ("slower_pct", "loses")])]
    return "\n".join(lines)


@click.command()
@click.option("--model", required=True, help=f"Model preset ({', '.join(list_presets('models'))}).")
@click.option("--cluster", help=f"Cluster preset ({', '.join(list_presets('clusters'))}).")
@click.option("--gpu", help="GPU key (see `flowsim gpus`).")
@click.option("--gpus", "num_gpus", type=POS_INT, required=True, help="GPUs in the job.")
@click.option("--gbs", type=POS_INT, required=True, help="Global batch size (sequences per step).")
@click.option("--seq", type=POS_INT, help="Sequence length (tokens).")
@click.option("--precision", type=click.Choice(["bf16", "fp16", "fp8", "nvfp4", "mxfp4"]), help="GEMM precision.")
@click.option("--calibration", metavar="PROFILE",
              help="Calibration profile of the kernel pricing: `default` (the shipped one, the default), a file from "
                   "`flowsim calibrate`, or `none`.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Any other non-layout config key.")
@click.option("--tp", multiple=True, type=POS_INT, help="Only these TP sizes (repeatable).")
@click.option("--pp", multiple=True, type=POS_INT, help="Only these PP sizes (repeatable).")
@click.option("--cp", multiple=True, type=POS_INT, help="Only these CP sizes (repeatable).")
@click.option("--ep", multiple=True, type=POS_INT, help="Only these expert-parallel sizes (MoE; repeatable).")
@click.option("--mbs", multiple=True, type=POS_INT, help="Only these micro-batch sizes (repeatable).")
@click.option("--recompute", multiple=True, type=click.Choice(["none", "selective", "full"]),
              help="Only these recompute modes (repeatable).")
@click.option("--zero", multiple=True, type=click.IntRange(0, 3), help="Only these ZeRO stages (1 = distributed "
              "optimizer; repeatable).")
@click.option("--max-tp", type=click.IntRange(min=0), default=0, help="Largest TP (default: NVLink domain).")
@click.option("--max-pp", type=click.IntRange(min=0), default=0, help="Largest PP (default: layers).")
@click.option("--max-vpp", type=click.IntRange(min=1), default=8, show_default=True, help="Largest VPP.")
@click.option("--max-cp", type=click.IntRange(min=1), default=8, show_default=True, help="Largest CP.")
@click.option("--max-ep", type=click.IntRange(min=0), default=0, help="Largest EP (default: the expert count).")
@click.option("--max-mbs", type=click.IntRange(min=1), default=8, show_default=True, help="Largest micro-batch.")
@click.option("--search", type=click.Choice(["exhaustive", "tpe"]), default="exhaustive", show_default=True,
              help="Evaluate every valid layout, or a TPE search (optuna) of --budget configs.")
@click.option("--budget", type=POS_INT, default=200, show_default=True, help="Configs a TPE search evaluates.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the TPE search.")
@click.option("--top", type=click.IntRange(min=0), default=10, show_default=True, help="Configs to list (0 = all).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: counts, top configs, Pareto front.")
@click.option("--csv", "as_csv", is_flag=True, help="The top configs as CSV.")
@click.option("--plot", type=click.Path(dir_okay=False), help="Write a Pareto plot (PNG; needs matplotlib).")
@execution_options
@user_errors
def tune(model, cluster, gpu, num_gpus, gbs, seq, precision, calibration, sets, tp, pp, cp, ep, mbs, recompute, zero, max_tp,
         max_pp, max_vpp, max_cp, max_ep, max_mbs, search, budget, seed, top, as_json, as_csv, plot, db, jobs,
         scheduler, no_progress):
    """Find the fastest parallel layouts of a job that fit in GPU memory.

    Enumerates tp, pp, vpp, cp, ep (MoE models), dp, sequence parallelism, micro-batch, recompute, ZeRO
    stage and pipeline schedule; prunes by the config rules and by memory; simulates the rest (results are kept in the
    results database, so a rerun recomputes nothing). For spaces too large to enumerate, --search tpe
    evaluates --budget configs chosen by optuna's TPE sampler, one at a time. Example:

        flowsim tune --model gpt3-175b --cluster dgx-h100 --gpus 1024 --gbs 1536 --top 10
    """
    from flowsim.explore.space import LayoutSpace
    from flowsim.explore.store import ResultStore
    from flowsim.explore.tune import job_config, tune as run_tune
    from flowsim.io_text import check_output_file

    if plot:
        check_output_file(plot, "--plot")  # before the search, not after it
    notice_first_compile()
    job = {k: v for k, v in dict(model=model, cluster=cluster, gpu=gpu, gpus=num_gpus, gbs=gbs, seq=seq,
                                 precision=precision, calibration=calibration).items() if v is not None}
    job.update(_parse_set(sets))
    fixed = {k: v for k, v in dict(tp=tp, pp=pp, cp=cp, ep=ep, mbs=mbs, recompute=recompute, zero=zero).items() if v}
    base = job_config(job)
    space = LayoutSpace.default(base, max_tp=max_tp, max_pp=max_pp, max_vpp=max_vpp, max_cp=max_cp,
                                max_ep=max_ep, max_mbs=max_mbs, **fixed)
    with ResultStore(db) as store:
        if search == "tpe":
            from flowsim.explore.search import tpe_search
            res = tpe_search(job, space, budget=budget, store=store, seed=seed, progress=not no_progress)
        else:
            res = run_tune(job, space, store=store, jobs=jobs, scheduler=scheduler, progress=not no_progress)
    if plot:
        from flowsim.explore.plots import tune_plot
        tune_plot(res, plot)
    k = top or len(res.ranked)
    if as_json:
        echo_json(res.to_dict(k))
    elif as_csv:
        import pandas as pd
        click.echo(pd.DataFrame(res.top(k)).to_csv(index=False), nl=False)
    else:
        click.echo(report(res, k))
