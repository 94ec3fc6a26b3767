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
    """

    rows: pd.DataFrame
    skipped: dict

    def to_dict(self) -> dict:
        """Rows as records, the skipped counts, and the median |error|."""
        return {"rows": self.rows.to_dict(orient="records"), "skipped": self.skipped,
                "median_abs_error": float(np.median(np.abs(self.rows.error))) if len(self.rows) else None}


def read_aicb_log(path: str | Path) -> tuple[pd.DataFrame, dict]:
    """Calls of an AICB log with a known op, group size and size >= :data:`MIN_BYTES`.

    Parameters
    ----------
    path : str or Path
        The CSV.

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
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        raise ConfigError("aicb log", f"cannot read {path}: {e.strerror}") from None
    missing = [c for c in REQUIRED if rows and c not in rows[0]]
    if not rows or missing:
        raise ConfigError("aicb log", f"{path.name} lacks the columns {', '.join(missing or REQUIRED)}")
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
        reason = ("not a collective" if op is None else "group size never stated" if r["comm_group"] not in sizes
                  else f"below {MIN_BYTES // MiB} MiB" if size < MIN_BYTES else None)
        if reason:
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        calls.append((op, r["comm_group"].split(".")[-1], sizes[r["comm_group"]], size, time_ms * MS))
    return pd.DataFrame(calls, columns=["op", "group", "n_ranks", "size_bytes", "time_s"]), skipped


def compare_aicb_log(path: str | Path, cluster: ClusterConfig, *, tp: int) -> AicbComparison:
    """Median measured time per (op, group, size) against flowsim's prediction.

    Parameters
    ----------
    path : str or Path
        The AICB CSV.
    cluster : ClusterConfig
        The machine the log ran on (``num_gpus`` = the job).
    tp : int
        Tensor-parallel size (the stride of DP groups); the log does not state it apart from the group size.

    Returns
    -------
    AicbComparison
    """
    calls, skipped = read_aicb_log(path)
    gpu = get_gpu(cluster.gpu)
    stride = {"tp_group": 1, "dp_group": tp, "ep_group": tp}
    pricer = CollectivePricer(cluster, gpu)
    out = []
    for (op, group, n, size), g in calls.groupby(["op", "group", "n_ranks", "size_bytes"]):
        est = pricer.estimate(op, float(size), (int(n), stride.get(group, 1), 0))
        time_s, algo, proto = (0.0, "none", "none") if est is None else (est.time_s, est.algo, est.proto)
        measured = float(g.time_s.median())
        out.append((op, group, n, size, len(g), measured, time_s, time_s / measured - 1, algo, proto))
    rows = pd.DataFrame(out, columns=["op", "group", "n_ranks", "size_bytes", "calls", "measured_s", "predicted_s",
                                      "error", "algo", "proto"])
    return AicbComparison(rows=rows, skipped=skipped)
