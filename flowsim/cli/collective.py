"""``flowsim collective`` and ``flowsim validate-nccl``: one collective over a size sweep, and a check
of the NCCL model against an nccl-tests log."""
from __future__ import annotations

import re
from dataclasses import replace

import click

from flowsim.cli.common import echo_json, format_table, user_errors
from flowsim.cli.nccl_table import nccl_tests_lines
from flowsim.network.comm_layout import group_layout, preset_cluster
from flowsim.network.collective_flows import run_collective
from flowsim.config.cluster import CPUS
from flowsim.config.loader import list_presets
from flowsim.errors import ConfigError
from flowsim.nccl_models import OPS, P2P_OPS, cost_table, predict
from flowsim.nccl_models.launch import HOST_LAUNCH_S, check_gpus_per_process, launch_floor_s, with_launch_floor
from flowsim.nccl_models.versions import DEFAULT_NCCL_VERSION, SUPPORTED_RANGE
from flowsim.units import GB, GiB, KiB, MiB, US
from flowsim.validation.nccl_flows import flow_comparison
from flowsim.validation.nccl_tests import apply_launch_floor, compare_nccl_tests, read_nccl_tests

POS_INT = click.IntRange(min=1)
_SUFFIX = {"": 1, "K": KiB, "M": MiB, "G": GiB}
_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]?)B?\s*$", re.I)
NCCL_TESTS_TYPE = "float"
"""Element type shown in the count/type columns (nccl-tests' default, 4 bytes)."""
_TYPE_BYTES = 4
ENGINES = ("analytic", "flow")

_EXPLAIN = [
    ("algo", "algo", ""),
    ("proto", "proto", ""),
    ("rank", "rank", ".0f"),
    ("latency_us", "latency (us)", ".2f"),
    ("algbw_GBps", "NCCL algbw (GB/s)", ".1f"),
    ("nccl_time_us", "NCCL time (us)", ".2f"),
    ("time_us", "predicted (us)", ".2f"),
    ("unavailable_reason", "unavailable because", ""),
]
_COMPARE = [
    ("section", "section", "d"),
    ("size_bytes", "size (B)", ".0f"),
    ("measured_time_us", "measured (us)", ".2f"),
    ("predicted_time_us", "predicted (us)", ".2f"),
    ("measured_busbw_GBps", "measured busbw (GB/s)", ".2f"),
    ("predicted_busbw_GBps", "predicted busbw (GB/s)", ".2f"),
    ("error_pct", "busbw error %", "+.1f"),
    ("algo", "algo", ""),
    ("proto", "proto", ""),
]


def parse_size(text: str) -> int:
    """``"64M"`` -> 67108864: an integer with an optional binary suffix K, M or G (case-insensitive).

    Parameters
    ----------
    text : str
        The size.

    Returns
    -------
    int
        Bytes, > 0.
    """
    m = _SIZE.match(text)
    if not m:
        raise ConfigError("--sizes", "sizes are integers with an optional K/M/G suffix (binary)", text)
    size = int(m.group(1)) * _SUFFIX[m.group(2).upper()]
    if size <= 0:
        raise ConfigError("--sizes", "sizes must be > 0", text)
    return size


def parse_sizes(text: str) -> list[int]:
    """nccl-tests style sweep: ``"8:8G"`` doubles from 8 B to 8 GiB; a single size is one row.

    Parameters
    ----------
    text : str
        ``MIN:MAX`` or one size (see :func:`parse_size`).

    Returns
    -------
    list of int
        Sizes in bytes.
    """
    parts = text.split(":")
    if len(parts) == 1:
        return [parse_size(parts[0])]
    if len(parts) != 2:
        raise ConfigError("--sizes", "use MIN:MAX (doubling) or one size", text)
    lo, hi = parse_size(parts[0]), parse_size(parts[1])
    if lo > hi:
        raise ConfigError("--sizes", "MIN must not exceed MAX", text)
    sizes = []
    while lo <= hi:
        sizes.append(lo)
        lo *= 2
    return sizes


def _cluster_options(func):
    options = [
        click.option("--cluster", required=True, help=f"Cluster preset ({', '.join(list_presets('clusters'))})."),
        click.option("--nodes", type=POS_INT, default=1, show_default=True, help="Hosts in the communicator."),
        click.option("--gpus-per-node", type=POS_INT, help="GPUs (ranks) per host."),
        click.option("--nics-per-node", type=POS_INT, help="Scale-out NICs per host."),
        click.option("--nic-gbps", type=click.FloatRange(min=0, min_open=True), help="Line rate of one NIC, Gb/s."),
        click.option("--gpu", help="GPU key (see `flowsim gpus`) or a GPU spec YAML file."),
        click.option("--cpu", type=click.Choice(CPUS), help="Host CPU family (NCCL's LL cap, network overhead)."),
        click.option("--algo", help="NCCL_ALGO-style override, e.g. ring, ^nvls, allreduce:tree."),
        click.option("--proto", help="NCCL_PROTO-style override, e.g. simple, ^ll128."),
        click.option("--nccl-version", help=f"NCCL release whose cost model applies ({SUPPORTED_RANGE}); default "
                                            f"{DEFAULT_NCCL_VERSION}, or for validate-nccl the release the log "
                                            "states."),
        click.option("--gpus-per-process", help="GPUs one benchmark thread/process drives (nccl-tests -g N); > 1 "
                                                f"sets the launch floor N x {HOST_LAUNCH_S / US:.2f} us per "
                                                "iteration (docs/NCCL.md, Launch setup). Default 1 (one process "
                                                "per GPU), or for validate-nccl what each log section states."),
        click.option("--engine", type=click.Choice(ENGINES), default="analytic", show_default=True,
                     help="analytic: NCCL's cost model with fill and calibration; flow: the algorithm's plan of "
                          "transfers run as flows on the cluster topology (docs/NCCL.md, Flow engine)."),
        click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table."),
    ]
    for opt in reversed(options):
        func = opt(func)
    return func


def _modelled_version(requested: str | None, from_log: str | None = None) -> tuple[str, str]:
    """The NCCL release to model and where it comes from: ``--nccl-version``, else the log's, else the default."""
    if requested:
        return requested, "--nccl-version"
    if from_log:
        return from_log, "stated in the log"
    return DEFAULT_NCCL_VERSION, "default"


def _launch_text(gpus_per_process: int | None, floor_s: float) -> str:
    """``"8 GPUs per process: launch floor 36.6 us"`` for the header lines."""
    if gpus_per_process is None:
        return "launch setup unknown: no launch floor"
    floor = f"launch floor {floor_s / US:.1f} us" if floor_s else "no launch floor"
    return f"{gpus_per_process} GPU{'s' if gpus_per_process > 1 else ''} per process: {floor}"


def _launch_line(setup: dict) -> str:
    """Header line of one compared section's launch setup (:func:`~flowsim.validation.nccl_tests.section_launch`)."""
    origin = "--gpus-per-process" if setup["source"] == "given" else setup["source"]
    if setup["evidence"] and setup["source"] != "given":
        origin += f' "{setup["evidence"]}"'
    return f"# section {setup['section']}: {_launch_text(setup['gpus_per_process'], setup['floor_s'])} ({origin})"


def _env_line(env: dict, algo: str | None, proto: str | None) -> str:
    """Header line of the NCCL environment a section states and the model applies."""
    stated = [f"{k}={v}" for k, v in env.items() if k not in ("section", "ignored")]
    text = " ".join(stated) if stated else "none stated"
    given = [f"{flag} wins over NCCL_{flag[2:].upper()}" for flag, v in (("--algo", algo), ("--proto", proto))
             if v and f"NCCL_{flag[2:].upper()}" in env]
    notes = (f"; {', '.join(given)}" if given else "") + (f"; ignored: {' '.join(env['ignored'])}"
                                                           if env["ignored"] else "")
    return f"# section {env['section']}: NCCL env {text}{notes}"


def _count(op: str, size: int, n_ranks: int) -> int:
    per_rank = op in ("allgather", "reducescatter", "alltoall")
    return size // (_TYPE_BYTES * (n_ranks if per_rank else 1))


@click.command("collective")
@click.option("--op", required=True, type=click.Choice(OPS), help="Collective.")
@click.option("--sizes", default="8:8G", show_default=True,
              help="MIN:MAX bytes doubling (nccl-tests -b/-e -f 2) or one size; suffixes K, M, G are binary.")
@click.option("--explain", is_flag=True, help="Also print NCCL's whole cost table (every algo/proto) per size.")
@click.option("--collnet", is_flag=True, help="IB SHARP through NCCL's CollNet plugin (NCCL_COLLNET_ENABLE=1): "
                                             "CollNetDirect/CollNetChain and multi-node NVLS become available.")
@_cluster_options
@user_errors
def collective(op, sizes, explain, collnet, cluster, nodes, gpus_per_node, nics_per_node, nic_gbps, gpu, cpu, algo,
               proto, nccl_version, gpus_per_process, engine, as_json):
    """Predict one collective over a size sweep, printed as an nccl-tests log (NCCL's algo/proto in a trailing
    comment per row) that `flowsim validate-nccl` reads back.

    Sizes follow nccl-tests: for allgather, reducescatter and alltoall SIZE is the total buffer
    (per-rank count x ranks x 4 B); busbw uses nccl-tests' factors (allreduce 2(n-1)/n; allgather,
    reducescatter, alltoall (n-1)/n; others 1). With --gpus-per-process N > 1 the times are those of a
    benchmark driving N GPUs from one thread: at least N host launch times (the cost table of --explain is
    NCCL's, without that floor). Example:

    \b
        flowsim collective --op allreduce --cluster dgx-h100 --nodes 2 --sizes 1M:1G
    """
    cfg, spec = preset_cluster(cluster, nodes, gpus_per_node, nics_per_node, nic_gbps, gpu, cpu)
    layout = group_layout(cfg, spec, cfg.num_gpus, 1, nccl_version=_modelled_version(nccl_version)[0])
    layout = replace(layout, collnet=collnet)
    if explain and op in P2P_OPS:
        raise ConfigError("--explain", f"{op} is point-to-point: NCCL has no cost table for it", op)
    per_process = check_gpus_per_process(gpus_per_process or 1, layout.ranks_per_node)
    launch = {"gpus_per_process": per_process, "floor_s": launch_floor_s(per_process),
              "source": "--gpus-per-process" if gpus_per_process else "default: one process per GPU"}
    rows, tables = [], []
    for size in parse_sizes(sizes):
        if engine == "flow":
            est = run_collective(cfg, spec, op, size, list(range(cfg.num_gpus)), algo=algo, proto=proto,
                                 collnet=collnet, nccl_version=layout.nccl_version)
        else:
            est = predict(op, size, layout, algo=algo, proto=proto)
        est = with_launch_floor(est, per_process)
        rows.append({**est.to_dict(), "count": _count(op, size, layout.n_ranks), "type": NCCL_TESTS_TYPE})
        if explain:
            tables.append((size, cost_table(op, size, layout)))
    if as_json:
        out = {"layout": layout.to_dict(), "nccl_version": layout.nccl_version, "engine": engine, "launch": launch,
               "rows": rows}
        if explain:
            out["cost_tables"] = [{"size_bytes": s, "rows": t.to_dict(orient="records")} for s, t in tables]
        echo_json(out)
        return
    sizes = sorted(set(layout.node_sizes), reverse=True)  # uneven: "34 x 72 + 1 x 48"
    nodes = " + ".join(f"{layout.node_sizes.count(m)} x {m}" for m in sizes) if layout.uneven else \
        f"{layout.n_nodes} node(s) x {layout.ranks_per_node}"
    title = (f"flowsim collective: {op} on {layout.n_ranks} ranks, {nodes}, {layout.nics_per_node} NIC(s)/node; "
             f"NCCL {layout.nccl_version}; {engine} "
             f"engine; {_launch_text(per_process, launch['floor_s'])}; GB/s = 1e9 B/s")
    env = {k: v for k, v in (("NCCL_ALGO", algo), ("NCCL_PROTO", proto), ("NCCL_COLLNET_ENABLE", collnet and 1))
           if v}
    for line in nccl_tests_lines(op, rows, title=title, gpus_per_process=per_process,
                                 nccl_version=layout.nccl_version, env=env):
        click.echo(line)
    for size, table in tables:
        click.echo(f"#\n# cost table for {size} B (rank 1 = NCCL's choice)")
        text = format_table([{**r, "latency_us": r["latency_s"] / US, "algbw_GBps": r["algbw_Bps"] / GB,
                              "nccl_time_us": r["nccl_time_s"] / US, "time_us": r["time_s"] / US}
                             for r in table.to_dict(orient="records")], _EXPLAIN)
        click.echo("\n".join(f"# {line}" for line in text.splitlines()))


@click.command("validate-nccl")
@click.argument("log", type=click.Path())
@click.option("--op", type=click.Choice(OPS), help="Collective, where the log does not name it.")
@click.option("--section", "sections", type=click.IntRange(min=0), multiple=True,
              help="Compare only this section of the log (0-based; repeatable).")
@_cluster_options
@user_errors
def validate_nccl(log, op, sections, cluster, nodes, gpus_per_node, nics_per_node, nic_gbps, gpu, cpu, algo, proto,
                  nccl_version, gpus_per_process, engine, as_json):
    """Compare an nccl-tests / rccl-tests LOG with the model: per size, measured and predicted time and busbw.

    The summary gives the median and max |busbw error| for sizes >= 1 MiB and below; busbw error =
    predicted / measured busbw - 1 (positive: the model is too fast). Lines that cannot be read are
    listed with their numbers. The NCCL release modelled is --nccl-version, else the one the log states
    (e.g. "NCCL 2.19.3", "nccl-library=21903"), else 2.30.7. The launch setup (GPUs one benchmark
    thread drove, which sets a time floor) is --gpus-per-process, else what each section states ("-g 8",
    "nThread 1 nGpus 8", "1 proc/GPU"), else unknown: no floor. Example:

    \b
        flowsim validate-nccl all_reduce.log --cluster dgx-h100 --algo ring
    """
    cfg, spec = preset_cluster(cluster, nodes, gpus_per_node, nics_per_node, nic_gbps, gpu, cpu)
    parsed = read_nccl_tests(log, op=op, n_ranks=cfg.num_gpus)
    version, source = _modelled_version(nccl_version, parsed.nccl_version)
    layout = group_layout(cfg, spec, cfg.num_gpus, 1, nccl_version=version)
    cmp = compare_nccl_tests(parsed, layout, algo=algo, proto=proto, sections=sections or None,
                             gpus_per_process=gpus_per_process)
    if engine == "flow":
        cmp = apply_launch_floor(flow_comparison(cmp, cfg, spec, algo=algo, proto=proto, nccl_version=version,
                                                 env=parsed.env), cmp.launch)
    if as_json:
        echo_json({"layout": layout.to_dict(), "nccl_version": layout.nccl_version, "nccl_version_source": source,
                   "log_nccl_version": parsed.nccl_version, "engine": engine, **cmp.to_dict()})
        return
    rows = [{**r, "measured_time_us": r["measured_time_s"] / US, "predicted_time_us": r["predicted_time_s"] / US,
             "measured_busbw_GBps": r["measured_busbw_Bps"] / GB, "predicted_busbw_GBps": r["predicted_busbw_Bps"] / GB,
             "error_pct": 100 * r["busbw_error"]} for r in cmp.rows.to_dict(orient="records")]
    click.echo(f"# NCCL {layout.nccl_version} modelled ({source}; log states "
               f"{parsed.nccl_version or 'no NCCL version'}); {engine} engine")
    for setup in cmp.launch:
        click.echo(_launch_line(setup))
    for env in cmp.env:
        click.echo(_env_line(env, algo, proto))
    click.echo(format_table(rows, _COMPARE))
    s = cmp.summary
    click.echo(f"\nsizes >= 1 MiB: {s.n_large} rows, median |busbw error| {100 * s.median_abs_error_large:.1f} %, "
               f"max {100 * s.max_abs_error_large:.1f} %")
    click.echo(f"sizes <  1 MiB: {s.n_small} rows, median |busbw error| {100 * s.median_abs_error_small:.1f} %, "
               f"max {100 * s.max_abs_error_small:.1f} %")
    for line, reason in cmp.skipped:
        click.echo(f"skipped line {line}: {reason}", err=True)
