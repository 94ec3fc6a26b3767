"""``flowsim simai run``: a SimAI / AICB workload file, priced by SimAI-Analytical's model and by flowsim.

SimAI's flags keep SimAI's spelling (``-g``, ``-nv``, ``-nic``, ``-n_p_s``, ``-g_p_s``, ``-g_type``, ``-nic_t``,
``-dp_o``, ``-tp_o``, ``-ep_o``, ``-pp_o``) so that a SimAI command line can be pasted after ``flowsim simai run``.
"""
from __future__ import annotations

import click

from flowsim.cli.common import echo_json, format_table, user_errors, warn
from flowsim.config.cluster import ClusterConfig
from flowsim.config.loader import list_presets, load_preset
from flowsim.errors import ConfigError
from flowsim.units import US
from flowsim.validation.aicb_log import compare_aicb_log
from flowsim.validation.simai_analytical import (NIC_DEFAULT_GBPS, NVLINK_DEFAULT_GBPS, SimaiSystem,
                                                 simulate_analytical)
from flowsim.validation.simai_flowsim import breakdown_rows, collective_rows, explain, simulate_flowsim
from flowsim.validation.simai_workload import read_workload

DEFAULT_G_TYPE = "H100"
"""GPU type whose NVLink default applies when neither ``-nv`` nor ``-g_type`` is given (flowsim's choice;
SimAI leaves it uninitialised, simai-notes 3.6)."""
DEFAULT_NIC_T = "cx7"
"""NIC type whose bandwidth applies when neither ``-nic`` nor ``-nic_t`` is given (flowsim's choice)."""
TOP_COLLECTIVES = 10
"""Collectives listed in the comparison table (largest total difference first)."""

_SIMAI_TABLE = [("part", "part", ""), ("simai_us", "SimAI-Analytical (us)", ".0f"),
                ("share_pct", "share %", ".1f")]
_BREAKDOWN = [("part", "part", ""), ("simai_us", "SimAI-Analytical (us)", ".0f"),
              ("flowsim_us", "flowsim (us)", ".0f"), ("difference_us", "flowsim - SimAI (us)", "+.0f")]
_COLLECTIVES = [("phase", "phase", ""), ("op", "op", ""), ("group", "group", ""), ("n_ranks", "ranks", "d"),
                ("size_bytes", "size (B)", "d"), ("count", "count", "d"), ("simai_us", "SimAI (us)", ".1f"),
                ("flowsim_us", "flowsim (us)", ".1f"), ("algo", "algo", ""), ("proto", "proto", ""),
                ("total_difference_us", "count x diff (us)", "+.0f")]


@click.group("simai")
def simai():
    """Read SimAI / AICB workload files and AICB measurement logs."""


def _system(workload, g, nv, nic, n_p_s, g_p_s, g_type, nic_t, dp_o, tp_o, ep_o, pp_o) -> SimaiSystem:
    nv = nv if nv is not None else NVLINK_DEFAULT_GBPS[g_type or DEFAULT_G_TYPE]
    nic = nic if nic is not None else NIC_DEFAULT_GBPS[nic_t or DEFAULT_NIC_T]
    return SimaiSystem(num_gpus=g or workload.all_gpus, nvlink_GBps=nv, nic_GBps=nic, nics_per_server=n_p_s,
                       gpus_per_server=g_p_s, dp_overlap=dp_o, tp_overlap=tp_o, ep_overlap=ep_o, pp_overlap=pp_o)


def _cluster(name: str, num_gpus: int) -> ClusterConfig:
    fields = load_preset("clusters", name)
    fields["num_gpus"] = num_gpus
    cfg = ClusterConfig(**fields)
    cfg.validate()
    return cfg


@simai.command("run")
@click.argument("workload_path", metavar="WORKLOAD.txt", type=click.Path(exists=True, dir_okay=False))
@click.option("--simai-analytical", "analytical_only", is_flag=True,
              help="Only SimAI-Analytical's own cost model (reproduces SimAI 1.7's EndToEnd total).")
@click.option("--cluster", help=f"Cluster preset for flowsim's prediction ({', '.join(list_presets('clusters'))}).")
@click.option("--schedule", type=click.Choice(["1f1b", "interleaved", "gpipe"]), default="1f1b", show_default=True,
              help="flowsim's pipeline schedule (interleaved uses the header's vpp chunks, as SimAI's bubble does).")
@click.option("-g", "g", type=click.IntRange(min=1), help="GPUs (default: the header's all_gpus).")
@click.option("-nv", "nv", type=click.FloatRange(min=0, min_open=True), help="NVLink busbw, SimAI GB/s.")
@click.option("-nic", "nic", type=click.FloatRange(min=0, min_open=True), help="Per-NIC busbw, SimAI GB/s.")
@click.option("-n_p_s", "n_p_s", type=click.IntRange(min=1), default=8, show_default=True, help="NICs per server.")
@click.option("-g_p_s", "g_p_s", type=click.IntRange(min=1), default=8, show_default=True, help="GPUs per server.")
@click.option("-g_type", "g_type", type=click.Choice(sorted(NVLINK_DEFAULT_GBPS)), help="GPU type for the -nv default.")
@click.option("-nic_t", "nic_t", type=click.Choice(sorted(NIC_DEFAULT_GBPS)), help="NIC type for the -nic default.")
@click.option("-dp_o", "dp_o", type=click.FloatRange(0, 1), default=0.0, show_default=True, help="DP overlap ratio.")
@click.option("-tp_o", "tp_o", type=click.FloatRange(0, 1), default=0.0, show_default=True, help="TP overlap ratio.")
@click.option("-ep_o", "ep_o", type=click.FloatRange(0, 1), default=0.0, show_default=True, help="EP overlap ratio.")
@click.option("-pp_o", "pp_o", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True,
              help="PP overlap ratio.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the tables.")
@user_errors
def run(workload_path, analytical_only, cluster, schedule, g, nv, nic, n_p_s, g_p_s, g_type, nic_t, dp_o, tp_o, ep_o,
        pp_o, as_json):
    """Predict the iteration time of a SimAI workload file.

    With --simai-analytical, print SimAI-Analytical's result and breakdown (times in us). Otherwise also
    predict it with flowsim on --cluster (compute times from the file, collectives by flowsim's NCCL
    model, a real pipeline schedule) and print both side by side with the collectives that differ most.
    """
    workload = read_workload(workload_path)
    if workload.skipped_lines:
        warn(f"{workload_path}: {workload.skipped_lines} of {workload.declared_lines} declared layer lines are "
             "missing (file cut off); results cover the lines read")
    system = _system(workload, g, nv, nic, n_p_s, g_p_s, g_type, nic_t, dp_o, tp_o, ep_o, pp_o)
    simai_result = simulate_analytical(workload, system)
    if analytical_only:
        _print_analytical(workload, system.num_gpus, simai_result, as_json)
        return
    if not cluster:
        raise ConfigError("--cluster", "flowsim's prediction needs a cluster preset (or pass --simai-analytical)")
    flowsim_result = simulate_flowsim(workload, _cluster(cluster, system.num_gpus), schedule=schedule)
    rows, comms = breakdown_rows(simai_result, flowsim_result), collective_rows(simai_result, flowsim_result)
    notes = explain(workload, simai_result, flowsim_result)
    if as_json:
        echo_json({"workload": workload.to_dict(), "simai_analytical": simai_result.to_dict(),
                   "flowsim": flowsim_result.to_dict(), "breakdown": rows, "collectives": comms, "explanation": notes})
        return
    click.echo(f"{workload_path}: {_describe(workload, system.num_gpus)}; flowsim on {cluster}, "
               f"{schedule} schedule, {flowsim_result.num_microbatches} micro-batches")
    click.echo(format_table(rows, _BREAKDOWN))
    click.echo(f"\nCollectives (one instance; largest total difference first, {TOP_COLLECTIVES} of {len(comms)}):")
    click.echo(format_table(comms[:TOP_COLLECTIVES], _COLLECTIVES))
    click.echo("\nWhy they differ:")
    for line in notes:
        click.echo(f"- {line}")


def _describe(workload, num_gpus: int) -> str:
    return (f"{num_gpus} GPUs, TP {workload.tp}, EP {workload.ep}, PP {workload.pp}, vpp {workload.vpp}, "
            f"GA {workload.ga}, {len(workload.layers)} layer lines")


def _print_analytical(workload, num_gpus: int, result, as_json: bool) -> None:
    if as_json:
        echo_json({"workload": workload.to_dict(), "simai_analytical": result.to_dict()})
        return
    parts = [("compute", result.compute_s), ("exposed TP comm", result.exposed_tp_s),
             ("exposed EP comm", result.exposed_ep_s), ("exposed DP comm", result.exposed_dp_s),
             ("exposed DP_EP comm", result.exposed_dp_ep_s), ("exposed PP comm", result.exposed_pp_s),
             ("bubble", result.bubble_s), ("total", result.total_s)]
    rows = [{"part": name, "simai_us": t / US, "share_pct": 100 * t / result.total_s} for name, t in parts]
    click.echo(f"SimAI-Analytical: {_describe(workload, num_gpus)}")
    click.echo(format_table(rows, _SIMAI_TABLE))


_AICB = [("op", "op", ""), ("group", "group", ""), ("n_ranks", "ranks", "d"), ("size_bytes", "size (B)", "d"),
         ("calls", "calls", "d"), ("measured_us", "measured median (us)", ".1f"),
         ("predicted_us", "predicted (us)", ".1f"), ("error_pct", "error %", "+.1f"), ("algo", "algo", ""),
         ("proto", "proto", "")]


def aicb_rows(comparison) -> list[dict]:
    """Rows of an :class:`~flowsim.validation.aicb_log.AicbComparison` in display units (us, %)."""
    return [{**r, "measured_us": r["measured_s"] / US, "predicted_us": r["predicted_s"] / US,
             "error_pct": 100 * r["error"]} for r in comparison.rows.to_dict(orient="records")]


@simai.command("aicb-log")
@click.argument("log", metavar="LOG.csv", type=click.Path(exists=True, dir_okay=False))
@click.option("--cluster", required=True, help=f"Cluster preset ({', '.join(list_presets('clusters'))}).")
@click.option("--gpus", type=click.IntRange(min=1), default=8, show_default=True, help="GPUs of the job.")
@click.option("--tp", type=click.IntRange(min=1), required=True, help="Tensor-parallel size (stride of DP groups).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
@user_errors
def aicb_log(log, cluster, gpus, tp, as_json):
    """Compare the collectives AICB measured (its physical-run CSV) with flowsim's NCCL model.

    Median time per (collective, group, size) >= 1 MiB; error = predicted / measured - 1.
    """
    result = compare_aicb_log(log, _cluster(cluster, gpus), tp=tp)
    if as_json:
        echo_json(result.to_dict())
        return
    click.echo(format_table(aicb_rows(result), _AICB))
    click.echo("skipped rows: " + ", ".join(f"{n} {reason}" for reason, n in result.skipped.items()))
