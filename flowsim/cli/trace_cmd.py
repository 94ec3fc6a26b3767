"""``flowsim validate-trace``: flowsim's kernel and collective models against a PyTorch profiler trace."""
from __future__ import annotations

import click

from flowsim.cli.common import echo_json, format_table, user_errors, warn
from flowsim.config.loader import list_presets
from flowsim.units import US
from flowsim.validation.trace_validation import OVERLAP_LIMIT, WAIT_FACTOR, validate_trace

_SUMMARY = [("group", "ops", ""), ("count", "counted", "d"), ("median_error_pct", "median error %", "+.1f"),
            ("p90_abs_error_pct", "p90 |error| %", ".1f"), ("excluded_waiting", "waiting", "d"),
            ("excluded_overlapped", "overlapped", "d"), ("measured_us", "measured (us)", ".1f"),
            ("predicted_us", "predicted (us)", ".1f")]
_OUTLIERS = [("kind", "kind", ""), ("op", "op", ""), ("shape", "shape", ""), ("measured_us", "measured (us)", ".2f"),
             ("predicted_us", "predicted (us)", ".2f"), ("error_pct", "error %", "+.1f"), ("detail", "detail", "")]


def summary_rows(result) -> list[dict]:
    """The summary of a :class:`~flowsim.validation.trace_validation.TraceValidation` in display units (%, us)."""
    return [{**r, "median_error_pct": 100 * r["median_error"], "p90_abs_error_pct": 100 * r["p90_abs_error"],
             "measured_us": r["measured_s"] / US, "predicted_us": r["predicted_s"] / US} for r in result.summary()]


@click.command("validate-trace")
@click.argument("trace", metavar="TRACE.json[.gz]", type=click.Path(exists=True, dir_okay=False))
@click.option("--cluster", help=f"Cluster preset for the collectives ({', '.join(list_presets('clusters'))}); "
                                "its GPU is replaced by the trace's. Default: 8-GPU nodes.")
@click.option("--gpu", help="flowsim GPU key (default: from the trace's deviceProperties).")
@click.option("--outliers", type=click.IntRange(min=0), default=5, show_default=True,
              help="Largest outliers to list.")
@click.option("--host", "host", is_flag=True,
              help="Print the CPU (host) time per launched kernel and per layer pass instead (docs/MODEL.md).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the tables.")
@user_errors
def validate_trace_cmd(trace, cluster, gpu, outliers, host, as_json):
    """Compare flowsim's predictions with the GEMM, attention, memory-bound and collective kernels of a trace.

    Errors are predicted / measured - 1. Collective instances slower than the fastest instance of the
    same communicator moving at least as many bytes (by more than the wait factor) are counted as waiting
    for peers; those running mostly beside compute kernels as overlapped; both are left out of the error
    figures (docs/VALIDATION.md). With --host: the trace's CPU-side figures (launch calls, CPU per kernel in
    operators, gaps between launches, CPU per layer pass), to check the host costs flowsim uses.
    """
    if host:
        _host_report(trace, as_json)
        return
    result = validate_trace(trace, gpu=gpu, cluster=cluster)
    if as_json:
        echo_json(result.to_dict())
        return
    if result.truncated:
        warn(f"{result.trace}: the file is cut off; results cover the {result.events} events before the cut")
    if result.skipped_events:
        warn(f"{result.trace}: skipped {result.skipped_events} malformed events")
    click.echo(f"{result.trace}: GPU {result.gpu}, collectives priced on {result.cluster}; "
               f"{result.events} events, kernel time {result.total_kernel_s / US:.0f} us, "
               f"not priced {result.unpriced_kernel_s / US:.0f} us "
               f"({100 * result.unpriced_kernel_s / max(result.total_kernel_s, 1e-30):.0f} %)")
    click.echo(format_table(summary_rows(result), _SUMMARY))
    click.echo(f"(waiting: > {WAIT_FACTOR:g} x the fastest instance moving >= as many bytes on the same group; "
               f"overlapped: > {100 * OVERLAP_LIMIT:.0f} % beside compute kernels)")
    if result.unsized_collectives or result.unlinked_kernels:
        click.echo(f"{result.unsized_collectives} collective kernels without a size, {result.unlinked_kernels} "
                   "kernels without a launching op (no launch event in the trace)")
    if outliers:
        rows = [{**r, "measured_us": r["measured_s"] / US, "predicted_us": r["predicted_s"] / US,
                 "error_pct": 100 * r["error"]} for r in result.outliers(outliers).to_dict(orient="records")]
        click.echo("\nLargest outliers (|log(predicted/measured)|):")
        click.echo(format_table(rows, _OUTLIERS))


_HOST_LAYERS = [("module", "layer module", ""), ("passes", "passes", "d"), ("cpu_us", "CPU us/pass", ".1f"),
                ("kernels", "kernels/pass", ".1f"), ("cpu_us_per_kernel", "CPU us/kernel", ".1f")]


def _host_report(trace, as_json) -> None:
    """``--host``: :func:`flowsim.validation.host_trace.host_costs_from_trace` as a table or JSON."""
    from flowsim.validation.host_trace import host_costs_from_trace

    h = host_costs_from_trace(trace)
    if as_json:
        echo_json(h.to_dict())
        return
    click.echo(f"{h.trace}: {h.launches} kernel launches on {h.threads} CPU threads (profiled: CPU spans run "
               "2-5x an unprofiled host)")
    click.echo(f"launch call (median)           {h.launch_call_us:8.2f} us")
    click.echo(f"CPU per kernel in operators    {h.cpu_us_per_kernel:8.2f} us  (median span "
               f"{h.cpu_us_per_kernel_median:.2f} us; {h.op_spans} top-level spans that do not wait)")
    click.echo(f"gap between launches (median)  {h.launch_gap_us:8.2f} us")
    for t in h.threads_detail:
        click.echo(f"  thread {t.thread}: {t.launches} launches, CPU per kernel {t.cpu_us_per_kernel_median:.2f} us"
                   + ("  (autograd: backward)" if t.autograd else ""))
    if h.layers:
        click.echo(format_table(h.to_dict()["layers"], _HOST_LAYERS))
    else:
        click.echo("no layer module spans (record with torch.profiler.profile(with_modules=True))")
