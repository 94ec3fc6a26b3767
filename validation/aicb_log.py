"""Collectives measured by AICB (SimAI's benchmark) against flowsim's NCCL model.

AICB's physical-run log (``aicb/visualize/inputs/A100_example.csv``; shared copy
``../shared/data/simai/aicb_A100_example.csv``, simai-notes section 8) has one row per collective call:
``comm_type`` (``CommType.all_gather``, ...), ``comm_group`` (``CommGroup.tp_group``, ``dp_group``,
``ep_group``), ``comm_group_size`` (``None`` on some rows), ``msg_size`` (bytes; the total buffer, as
nccl-tests counts it: its ``algbw`` column is ``msg_size / time``) and ``_elapsed_time`` (ms).

Rows are grouped by (collective, group, size) and the median time is compared, so warm-up calls (the first
call of a group takes seconds) do not count. A group's size is the one its rows state; rows of a group whose
size is never stated (``ep_group`` in the example) are skipped, as are bookkeeping rows (``epoch_end``),
zero-byte calls and calls below :data:`MIN_BYTES`. Ranks are placed as Megatron does (TP contiguous, DP
strided by TP) on the cluster the log ran on.

AICB's timer has a floor: its calls below 1 MiB take 74-85 us whatever their size (A100 example: 4 B AllReduce
80-85 us, 32 B AllGather 74 us, 64 KiB AllGather 78 us), where NCCL's own latency is 10-20 us; the time around
the collective (torch.distributed's call, AICB's event timing) is charged to every call. With ``harness=True``
:func:`compare_aicb_log` measures that overhead on the log's own calls below :data:`MIN_BYTES` (the median of
measured - predicted; those calls are not compared) and adds it to every prediction (:func:`harness_overhead_s`).
:func:`comm_log_summary` gives the median |error| per collective type and per (type, group).
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from flowsim.config.cluster import ClusterConfig
from flowsim.errors import ConfigError
from flowsim.gpu_specs import get_gpu
from flowsim.step import CollectivePricer
from flowsim.units import MS, MiB

AICB_OPS = {"CommType.all_reduce": "allreduce", "CommType.all_gather": "allgather",
            "CommType.reduce_scatter": "reducescatter", "CommType.all_to_all": "alltoall",
            "CommType.broadcast": "broadcast"}
"""AICB comm types (aicb ``utils/utils.py`` ``CommType``) -> flowsim op; others are bookkeeping."""
MIN_BYTES = MiB
"""Calls below this size are skipped: launch and host overheads, not the collective, set their time."""
REQUIRED = ("comm_type", "comm_group", "comm_group_size", "msg_size", "_elapsed_time")


@dataclass(frozen=True)
class AicbComparison:
    """flowsim against an AICB log.

    Attributes
    ----------
    rows : pandas.DataFrame
        Per (op, group, size): ``op, group, n_ranks, size_bytes, calls, measured_s`` (median),
        ``predicted_s``, ``error`` (predicted / measured - 1), ``algo``, ``proto``.
    skipped : dict
        Reason -> number of rows skipped.
    harness_overhead_s : float
        Per-call overhead of AICB's timer added to every prediction, seconds (0 unless asked for; module
        docstring).
    harness_calls : int
        Calls below :data:`MIN_BYTES` the overhead was measured on.
    """

    rows: pd.DataFrame
    skipped: dict
    harness_overhead_s: float = 0.0
    harness_calls: int = 0

    def to_dict(self) -> dict:
        """Rows as records, the skipped counts, the median |error|, the harness overhead and the summaries."""
        return {"rows": self.rows.to_dict(orient="records"), "skipped": self.skipped,
                "median_abs_error": float(np.median(np.abs(self.rows.error))) if len(self.rows) else None,
                "harness_overhead_s": self.harness_overhead_s, "harness_calls": self.harness_calls,
                "by_type": comm_log_summary(self, ["op"]).to_dict(orient="records"),
                "by_type_and_group": comm_log_summary(self, ["op", "group"]).to_dict(orient="records")}


def read_aicb_log(path: str | Path, min_bytes: int = MIN_BYTES) -> tuple[pd.DataFrame, dict]:
    """Calls of an AICB log with a known op, group size and size >= ``min_bytes``.

    Parameters
    ----------
    path : str or Path
        The CSV.
    min_bytes : int, optional
        Smallest call kept, bytes (default :data:`MIN_BYTES`).

    Returns
    -------
    calls : pandas.DataFrame
        ``op, group, n_ranks, size_bytes, time_s``.
    skipped : dict
        Reason -> count.

    Raises
    ------
    ConfigError
        Unreadable file, a missing column, or a non-numeric size or time (naming the line).
    """
    path = Path(path)
    from flowsim.io_text import open_text

    rows = list(csv.DictReader(open_text(path, "aicb log")))
    missing = [c for c in REQUIRED if rows and c not in rows[0]]
    if not rows or missing:
        raise ConfigError("aicb log", f"{path.name} lacks the columns {', '.join(missing or REQUIRED)}")
    for line, r in enumerate(rows, start=2):
        if any(v is None for k, v in r.items() if k is not None):  # a short row: DictReader fills None
            raise ConfigError(f"{path.name} line {line}", "has fewer fields than the header",
                              ",".join(v for v in r.values() if isinstance(v, str)))
    sizes = {}
    for r in rows:
        if r["comm_group_size"].isdigit():
            sizes.setdefault(r["comm_group"], int(r["comm_group_size"]))
    calls, skipped = [], {}
    for line, r in enumerate(rows, start=2):
        op = AICB_OPS.get(r["comm_type"])
        try:
            size, time_ms = int(r["msg_size"]), float(r["_elapsed_time"])
        except ValueError:
            raise ConfigError(f"{path.name} line {line}", "msg_size and _elapsed_time must be numbers",
                              f"{r['msg_size']!r}, {r['_elapsed_time']!r}") from None
        below = f"below {min_bytes // MiB} MiB" if min_bytes % MiB == 0 else f"below {min_bytes} B"
        reason = ("not a collective" if op is None else "group size never stated" if r["comm_group"] not in sizes
                  else below if size < min_bytes else None)
        if reason:
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        calls.append((op, r["comm_group"].split(".")[-1], sizes[r["comm_group"]], size, time_ms * MS))
    return pd.DataFrame(calls, columns=["op", "group", "n_ranks", "size_bytes", "time_s"]), skipped


def _medians(calls: pd.DataFrame, cluster: ClusterConfig, tp: int, overhead_s: float) -> pd.DataFrame:
    """Median measured time per (op, group, size) and flowsim's prediction (+ ``overhead_s``)."""
    gpu = get_gpu(cluster.gpu)
    stride = {"tp_group": 1, "dp_group": tp, "ep_group": tp}
    pricer = CollectivePricer(cluster, gpu)
    out = []
    for (op, group, n, size), g in calls.groupby(["op", "group", "n_ranks", "size_bytes"]):
        est = pricer.estimate(op, float(size), (int(n), stride.get(group, 1), 0))
        time_s, algo, proto = (0.0, "none", "none") if est is None else (est.time_s, est.algo, est.proto)
        time_s += overhead_s
        measured = float(g.time_s.median())
        out.append((op, group, n, size, len(g), measured, time_s, time_s / measured - 1, algo, proto))
    return pd.DataFrame(out, columns=["op", "group", "n_ranks", "size_bytes", "calls", "measured_s", "predicted_s",
                                      "error", "algo", "proto"])


def harness_overhead_s(path: str | Path, cluster: ClusterConfig, *, tp: int) -> tuple[float, int]:
    """AICB's per-call overhead: the median of measured - predicted over the log's calls below
    :data:`MIN_BYTES` (every call, not each size's median), seconds, and the number of those calls (module
    docstring); ``(0.0, 0)`` when the log has none."""
    small, _ = read_aicb_log(path, min_bytes=1)
    small = small[small.size_bytes < MIN_BYTES]
    if small.empty:
        return 0.0, 0
    keys = ["op", "group", "n_ranks", "size_bytes"]
    predicted = small.merge(_medians(small, cluster, tp, 0.0)[[*keys, "predicted_s"]], on=keys)
    return float(np.median(predicted.time_s - predicted.predicted_s)), len(small)


def compare_aicb_log(path: str | Path, cluster: ClusterConfig, *, tp: int, harness: bool = False) -> AicbComparison:
    """Median measured time per (op, group, size) against flowsim's prediction.

    Parameters
    ----------
    path : str or Path
        The AICB CSV.
    cluster : ClusterConfig
        The machine the log ran on (``num_gpus`` = the job).
    tp : int
        Tensor-parallel size (the stride of DP groups); the log does not state it apart from the group size.
    harness : bool, optional
        Add AICB's per-call overhead, measured on the log's own calls below :data:`MIN_BYTES`
        (:func:`harness_overhead_s`), to every prediction.

    Returns
    -------
    AicbComparison
    """
    calls, skipped = read_aicb_log(path)
    overhead, n_small = harness_overhead_s(path, cluster, tp=tp) if harness else (0.0, 0)
    return AicbComparison(_medians(calls, cluster, tp, overhead), skipped, overhead, n_small)


def comm_log_summary(comparison: AicbComparison, by: list) -> pd.DataFrame:
    """Median and max |error| of the compared sizes per ``by`` (``["op"]`` or ``["op", "group"]``).

    Returns
    -------
    pandas.DataFrame
        The ``by`` columns, ``sizes`` (sizes compared), ``calls``, ``median_abs_error``, ``max_abs_error`` and
        ``median_error`` (signed), fractions.
    """
    rows = comparison.rows.assign(abs_error=comparison.rows.error.abs())
    columns = [*by, "sizes", "calls", "median_abs_error", "max_abs_error", "median_error"]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    return (rows.groupby(by).agg(sizes=("size_bytes", "size"), calls=("calls", "sum"),
                                 median_abs_error=("abs_error", "median"), max_abs_error=("abs_error", "max"),
                                 median_error=("error", "median")).reset_index()[columns])
