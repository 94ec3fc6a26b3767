"""Ingest GEMM timings from PyTorch-profiler (Kineto) traces into kernel-DB rows.

A GEMM's shape lives on the launching CPU op, its time on the GPU kernels. A kernel event (``cat: kernel``)
carries ``args["External id"]``, the id of the ``cpu_op`` that launched it (PyTorch >= 2.x traces; see
shared/research/maxmin-and-traces.md). For every ``aten::mm``, ``aten::addmm``, ``aten::bmm``,
``aten::baddbmm`` or ``aten::_scaled_mm`` op recorded with shapes (``record_shapes=True``: ``Input Dims`` and
``Input type``), the row's time is the sum of the durations of the kernels with that External id (the GEMM plus,
for example, a split-K reduction). Ops without shapes (older traces) are skipped. Only GEMMs are ingested:
attention and memory-bound kernels have no byte or FLOP count in the trace.
"""
from __future__ import annotations

import gzip
import json
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from flowsim.errors import ConfigError
from flowsim.gpu_specs import get_gpu
from flowsim.kernels.db import DB_COLUMNS
from flowsim.kernels.gemm import gemm_bytes
from flowsim.kernels.model import op_breakdown
from flowsim.units import US

# deviceProperties[].name as CUDA/HIP reports it -> flowsim key (names read from the shared traces, and the
# A100-PG509-200 is the 40 GB SXM4 board, totalGlobalMem 42.3e9 bytes in hta_a100_2rank_ddp_nccl.json.gz).
TRACE_DEVICE_KEYS = {
    "NVIDIA H200": "h200",
    "NVIDIA B200": "b200",
    "AMD Instinct MI300X": "mi300x",
    "NVIDIA A100-PG509-200": "a100-sxm4-40gb",
}
# Kineto "Input type" strings -> flowsim dtype.
TRACE_DTYPES = {"c10::BFloat16": "bf16", "c10::Half": "fp16", "float": "fp32", "c10::Float8_e4m3fn": "fp8"}
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm")


def read_trace(path) -> dict:
    """Load a Kineto JSON trace (``.json`` or ``.json.gz``); ConfigError('trace', ...) if unreadable."""
    path = Path(path)
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            trace = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError("trace", f"cannot read a Kineto JSON trace ({type(e).__name__})", str(path)) from None
    if not isinstance(trace, dict) or "traceEvents" not in trace:
        raise ConfigError("trace", "not a Kineto trace (no traceEvents)", str(path))
    return trace


def trace_gpu_key(trace: dict) -> str:
    """flowsim key of the trace's GPU from ``deviceProperties``; ConfigError('gpu') when it cannot be told."""
    names = {d.get("name") for d in trace.get("deviceProperties", [])}
    keys = {TRACE_DEVICE_KEYS.get(n) for n in names}
    if len(keys) != 1 or None in keys:
        raise ConfigError("gpu", "cannot tell the GPU from the trace; pass its key", ", ".join(sorted(map(str, names))))
    return keys.pop()


def ingest_trace(path, gpu: str | None = None) -> pd.DataFrame:
    """GEMM rows (kernel-DB schema, :mod:`flowsim.kernels.db`) measured in one Kineto trace.

    Parameters
    ----------
    path : str or pathlib.Path
        Trace file (``.json`` or ``.json.gz``).
    gpu : str, optional
        flowsim GPU key; default: read from the trace's ``deviceProperties``.

    Returns
    -------
    pandas.DataFrame
        One row per GEMM op with shapes, columns ``DB_COLUMNS``. ``bottleneck`` is the flowsim roofline's
        classification of that shape on that GPU (``compute``, ``memory`` or ``latency``). ``attrs["gpu"]``
        holds the GPU key (also when no row was found).

    Raises
    ------
    ConfigError
        Unreadable trace (``trace``) or unknown GPU (``gpu``).
    """
    path = Path(path)
    trace = read_trace(path)
    key = gpu or trace_gpu_key(trace)
    spec = get_gpu(key)
    ops, kernels = {}, defaultdict(list)
    for e in trace["traceEvents"]:
        args = e.get("args") or {}
        if "External id" not in args:
            continue
        if e.get("cat") == "cpu_op" and e.get("name") in GEMM_OPS:
            ops[args["External id"]] = e
        elif e.get("cat") == "kernel":
            kernels[args["External id"]].append(e)
    rows = [r for x, op in ops.items() if kernels.get(x) for r in [gemm_row(op, kernels[x])] if r]
    date = datetime.fromtimestamp(trace.get("baseTimeNanoseconds", 0) / 1e9, tz=timezone.utc).date().isoformat()
    df = pd.DataFrame(rows, columns=["m", "n", "k", "batch", "dtype", "time_s", "impl"])
    df["op"], df["gpu"], df["heads"], df["seq_q"], df["seq_k"], df["head_dim"], df["causal"] = (
        "gemm", key, 0, 0, 0, 0, False)
    df["flops"] = 2.0 * df.m * df.n * df.k * df.batch
    df["bytes"] = [gemm_bytes(r.m, r.n, r.k, r.batch, r.dtype) for r in df.itertuples()]
    df["achieved_flop_per_s"] = df.flops / df.time_s
    df["achieved_Bps"] = df.bytes / df.time_s
    df["bottleneck"] = op_breakdown(df.assign(kind="gemm")[["kind", "dtype", "m", "n", "k", "batch"]], spec)[
        "bound"].to_numpy() if len(df) else []
    df["source"] = [f"Kineto trace {path.name}, kernel {impl}" for impl in df.impl]
    df["date"] = date
    df = df[list(DB_COLUMNS)]
    df.attrs["gpu"] = key
    return df


def gemm_row(op: dict, kernels: list):
    """(m, n, k, batch, dtype, time_s, kernel names) of one GEMM op, or None when its shapes are missing."""
    dims, types = op["args"].get("Input Dims"), op["args"].get("Input type")
    if not dims or not types or types[0] not in TRACE_DTYPES:
        return None
    name = op["name"]
    a, b = (dims[1], dims[2]) if name in ("aten::addmm", "aten::baddbmm") else (dims[0], dims[1])
    if len(a) != len(b) or len(a) not in (2, 3) or a[-1] != b[-2]:
        return None
    batch = a[0] if len(a) == 3 else 1
    time_s = sum(k["dur"] for k in kernels) * US
    names = "+".join(sorted({k["name"].split("<")[0].split("(")[0] for k in kernels}))
    return a[-2], b[-1], a[-1], batch, TRACE_DTYPES[types[0]], time_s, names


def trace_accuracy(rows: pd.DataFrame) -> pd.DataFrame:
    """Model time vs trace time per ingested GEMM row: adds ``predicted_s`` and ``error`` (predicted/measured - 1).

    Parameters
    ----------
    rows : pandas.DataFrame
        Output of :func:`ingest_trace` (one GPU or several).
    """
    out = rows.copy()
    pred = np.zeros(len(rows))
    for key, idx in rows.groupby("gpu").groups.items():
        sub = rows.loc[idx].assign(kind="gemm")[["kind", "dtype", "m", "n", "k", "batch"]]
        pred[rows.index.get_indexer(idx)] = op_breakdown(sub, get_gpu(key))["time_s"].to_numpy()
    out["predicted_s"] = pred
    out["error"] = out.predicted_s / out.time_s - 1.0
    return out
