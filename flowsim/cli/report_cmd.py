"""``flowsim report``: run every shipped data set and write ACCURACY.md with its PNG plots."""
from __future__ import annotations

import click

from flowsim.cli.common import notice_first_compile, user_errors

QUICK_RUN_IDS = (1, 2, 3)
"""Runs-CSV rows of ``--quick``."""
QUICK_TRACE = "tracelens_b200_8rank_vllm_tp8_rank0.json.gz"
"""The smallest shared trace, used by ``--quick``."""


@click.command("report")
@click.argument("out_dir", metavar="[DIR]", default="docs", type=click.Path(file_okay=False))
@click.option("--data-dir", default="../shared/data", show_default=True, type=click.Path(file_okay=False),
              help="The shared data folder (runs CSV, nccl-tests logs, traces, SimAI workload).")
@click.option("--quick", is_flag=True,
              help="A small subset (3 runs, 1 nccl-tests log, 1 trace, no SimAI) to check the pipeline.")
@click.option("--no-progress", is_flag=True, help="No progress bar on stderr.")
@user_errors
def report(out_dir, data_dir, quick, no_progress):
    """Write DIR/ACCURACY.md and DIR/img/*.png from every shipped data set (default DIR: docs).

    The figures are those `flowsim validate`, `flowsim validate-nccl`, `flowsim validate-trace` and
    `flowsim simai run` print for the same inputs. Needs matplotlib (the `plot` extra).
    """
    from flowsim.validation.report import NCCL_DATASETS, TRACES, run_report, write_report

    notice_first_compile()
    if quick:
        result = run_report(data_dir, run_ids=QUICK_RUN_IDS, nccl=NCCL_DATASETS[:1], traces=(QUICK_TRACE,),
                            simai=False, progress=not no_progress)
    else:
        result = run_report(data_dir, nccl=NCCL_DATASETS, traces=TRACES, progress=not no_progress)
    for path in write_report(result, out_dir, data_dir):
        click.echo(str(path))
