"""The ``flowsim`` command: a click group of verbs, each a thin layer over the public API.

Exit codes: 0 success; 2 bad input (one line ``Error: <field>: <rule>``); 1 unexpected failure.
"""
from __future__ import annotations

import click

from flowsim._version import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="flowsim")
def main():
    """flowsim: predict the step time, MFU and memory of distributed LLM training."""


# Each verb lives in its own module and registers itself here.
from flowsim.cli.estimate import estimate  # noqa: E402

main.add_command(estimate)

from flowsim.cli.gpus import gpus  # noqa: E402

main.add_command(gpus)

from flowsim.cli.validate import validate  # noqa: E402

main.add_command(validate)

from flowsim.cli.collective import collective, validate_nccl  # noqa: E402

main.add_command(collective)
main.add_command(validate_nccl)

from flowsim.cli.comm_log_cmd import validate_comm_log  # noqa: E402

main.add_command(validate_comm_log)

from flowsim.cli.kernels_cmd import kernels  # noqa: E402

main.add_command(kernels)

from flowsim.cli.topo import topo  # noqa: E402

main.add_command(topo)

from flowsim.cli.simai_cmd import simai  # noqa: E402

main.add_command(simai)

from flowsim.cli.tune_cmd import tune  # noqa: E402

main.add_command(tune)

from flowsim.cli.sweep_cmd import sweep  # noqa: E402

main.add_command(sweep)

from flowsim.cli.results_cmd import results  # noqa: E402

main.add_command(results)

from flowsim.cli.trace_cmd import validate_trace_cmd  # noqa: E402

main.add_command(validate_trace_cmd)

from flowsim.cli.report_cmd import report  # noqa: E402

main.add_command(report)
from flowsim.cli.capture_cmd import capture  # noqa: E402
main.add_command(capture)

from flowsim.cli.serve_cmd import serve, worker  # noqa: E402

main.add_command(serve)
main.add_command(worker)
