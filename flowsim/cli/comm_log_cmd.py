"""``flowsim validate-comm-log``: a measured collective log (AICB's CSV) against flowsim's NCCL model."""
from __future__ import annotations

import click

from flowsim.cli.common import echo_json, format_table, user_errors
from flowsim.cli.simai_cmd import aicb_rows
from flowsim.config.cluster import ClusterConfig
from flowsim.config.loader import list_presets, load_preset
from flowsim.units import US
from flowsim.validation.aicb_log import MIN_BYTES, comm_log_summary, compare_aicb_log

_ROWS = [("op", "op", ""), ("group", "group", ""), ("n_ranks", "ranks", "d"), ("size_bytes", "size (B)", "d"),
         ("calls", "calls", "d"), ("measured_us", "measured median (us)", ".1f"),
         ("predicted_us", "predicted (us)", ".1f"), ("error_pct", "time error %", "+.1f"), ("algo", "algo", ""),
         ("proto", "proto", "")]
_SUMMARY = [("sizes", "sizes", "d"), ("calls", "calls", "d"), ("median_pct", "median |error| %", ".1f"),
            ("max_pct", "max |error| %", ".1f"), ("signed_pct", "median error %", "+.1f")]


def _summary_rows(table) -> list[dict]:
    return [{**r, "median_pct": 100 * r["median_abs_error"], "max_pct": 100 * r["max_abs_error"],
             "signed_pct": 100 * r["median_error"]} for r in table.to_dict(orient="records")]


@click.command("validate-comm-log")
@click.argument("log", metavar="LOG.csv", type=click.Path(exists=True, dir_okay=False))
@click.option("--cluster", required=True, help=f"Cluster preset ({', '.join(list_presets('clusters'))}).")
@click.option("--gpus", type=click.IntRange(min=1), default=8, show_default=True, help="GPUs of the job.")
@click.option("--tp", type=click.IntRange(min=1), required=True, help="Tensor-parallel size (stride of DP groups).")
@click.option("--no-harness", is_flag=True,
              help="Do not add the logging harness's per-call overhead (measured on the log's calls < 1 MiB).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the tables.")
@user_errors
def validate_comm_log(log, cluster, gpus, tp, no_harness, as_json):
    """Compare every collective of a measured log (AICB's physical-run CSV) with flowsim's prediction for its
    group's layout, and summarise per collective type and per (type, group).

    Calls are grouped by (collective, group, size) and the median time compared (sizes >= 1 MiB); time error =
    predicted / measured - 1. The harness's own per-call overhead (AICB's timer: 70-85 us whatever the size)
    is measured on the log's calls below 1 MiB and added to every prediction, unless --no-harness. Example:

    \b
        flowsim validate-comm-log aicb_A100_example.csv --cluster dgx-a100 --tp 2
    """
    fields = load_preset("clusters", cluster)
    cfg = ClusterConfig(**{**fields, "num_gpus": gpus})
    cfg.validate()
    result = compare_aicb_log(log, cfg, tp=tp, harness=not no_harness)
    if as_json:
        echo_json(result.to_dict())
        return
    harness = (f"harness overhead {result.harness_overhead_s / US:.1f} us per call (median of measured - predicted "
               f"over {result.harness_calls} calls < {MIN_BYTES // 2**20} MiB), added to every prediction"
               if not no_harness else "no harness overhead (--no-harness)")
    click.echo(f"# {log}: {int(result.rows.calls.sum())} calls >= 1 MiB compared on {cluster} x {gpus} GPUs, "
               f"TP {tp}; {harness}")
    click.echo(format_table(aicb_rows(result), _ROWS))
    click.echo("\n# per collective type")
    click.echo(format_table(_summary_rows(comm_log_summary(result, ["op"])), [("op", "op", ""), *_SUMMARY]))
    click.echo("\n# per collective type and group")
    click.echo(format_table(_summary_rows(comm_log_summary(result, ["op", "group"])),
                            [("op", "op", ""), ("group", "group", ""), *_SUMMARY]))
    click.echo("\nskipped rows: " + ", ".join(f"{n} {reason}" for reason, n in result.skipped.items()))
