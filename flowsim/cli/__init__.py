"""The ``flowsim`` command: a click group of verbs, each a thin layer over the public API.

Exit codes: 0 success; 2 bad input (one line ``Error: <field>: <rule>``); 1 unexpected failure.
"""
from __future__ import annotations

import click

from flowsim._version import __version__


COMMANDS = {  # name -> ("module:attribute", one-line help shown by `flowsim --help`); add one line per verb
    "estimate": ("flowsim.cli.estimate:estimate", "Predict step time, throughput, MFU and memory of a training step."),
    "tune": ("flowsim.cli.tune_cmd:tune", "Find the fastest parallel layouts of a job that fit in GPU memory."),
    "sweep": ("flowsim.cli.sweep_cmd:sweep", "Run a study: hardware / network variants x workloads, each point tuned."),
    "results": ("flowsim.cli.results_cmd:results", "List stored design points (every point tune and sweep evaluated)."),
    "validate": ("flowsim.cli.validate:validate", "Compare predicted and measured step times of a runs CSV."),
    "calibrate": ("flowsim.cli.calibrate_cmd:calibrate", "Fit GEMM-efficiency parameters to measured runs (a profile)."),
    "collective": ("flowsim.cli.collective:collective", "Predict one collective over sizes, as an nccl-tests log."),
    "validate-nccl": ("flowsim.cli.collective:validate_nccl", "Compare an nccl-tests / rccl-tests log with the model."),
    "validate-comm-log": ("flowsim.cli.comm_log_cmd:validate_comm_log",
                          "Compare every collective of a measured log (AICB's physical-run CSV) with the model."),
    "validate-trace": ("flowsim.cli.trace_cmd:validate_trace_cmd",
                       "Compare flowsim's predictions with the kernels of a PyTorch-profiler trace."),
    "gpus": ("flowsim.cli.gpus:gpus", "List the built-in GPUs, or show one GPU (a key or a YAML spec file path)."),
    "kernels": ("flowsim.cli.kernels_cmd:kernels", "Kernel compute model: time of one op on one GPU."),
    "topo": ("flowsim.cli.topo:topo", "Describe a cluster: GPUs, NICs, switches per tier, links, bandwidth."),
    "simai": ("flowsim.cli.simai_cmd:simai", "Read SimAI / AICB workload files and AICB measurement logs."),
    "report": ("flowsim.cli.report_cmd:report", "Write DIR/ACCURACY.md and its plots from every shipped data set."),
    "capture": ("flowsim.cli.capture_cmd:capture", "Capture one training step of a PyTorch script on this CPU."),
    "serve": ("flowsim.cli.serve_cmd:serve", "Start the HTTP service: API, web page, job queue and workers."),
    "worker": ("flowsim.cli.serve_cmd:worker", "Process jobs from the service's queue."),
}
"""The verbs. Each module is imported only when its command runs (or shows its own help), so ``flowsim --help``
and a mistyped command answer without loading numba, pandas or the engine."""


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use from :data:`COMMANDS`."""

    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        import importlib

        module, attr = COMMANDS[name][0].split(":")
        return getattr(importlib.import_module(module), attr)

    def format_commands(self, ctx, formatter):
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="flowsim")
def main():
    """flowsim: predict the step time, MFU and memory of distributed LLM training."""
    import warnings

    from flowsim.network.allocator import keep_freed_memory

    keep_freed_memory()  # a flowsim process: the flow engine's large arrays re-use freed memory
    _warned.clear()  # once per command run
    warnings.formatwarning = _format_warning_once


_warned: set = set()


def _format_warning_once(message, category, filename, lineno, line=None) -> str:
    """A warning as one ``warning: <text>`` line, once per distinct text per command run (a runs file whose rows
    share a release fallback repeated it per row, each with a source line the user cannot act on); a repeat
    formats to nothing. Replaces the formatter, not ``showwarning``, so warnings recorded by a caller (pytest,
    ``catch_warnings(record=True)``) stay recorded."""
    text = str(message)
    if text in _warned:
        return ""
    _warned.add(text)
    return f"warning: {text}\n"
