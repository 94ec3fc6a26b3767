"""Ingest GEMM and memory-bound kernel timings from PyTorch-profiler (Kineto) traces.

A GEMM's shape lives on the launching CPU op, its time on the GPU kernels. A kernel event (``cat: kernel``)
carries ``args["External id"]``, the id of the ``cpu_op`` that launched it (PyTorch >= 2.x traces; see
shared/research/maxmin-and-traces.md). For every ``aten::mm``, ``aten::addmm``, ``aten::bmm``,
``aten::baddbmm`` or ``aten::_scaled_mm`` op recorded with shapes (``record_shapes=True``: ``Input Dims`` and
``Input type``), the row's time is the sum of the durations of the kernels with that External id (the GEMM plus,
for example, a split-K reduction). Ops without shapes (older traces) are skipped.

Memory-bound kernels (:func:`ingest_memory_kernels`): ops of :data:`MEMORY_BYTE_RULES` that launched exactly
one kernel, with the HBM bytes of the op (inputs read once, output written once) counted from ``Input Dims``
and ``Input type`` by the op's rule (module data below). :func:`memory_latency_fit` derives the fixed time of
a memory-bound launch from them (docs/KERNELS.md, "Memory-bound").
"""
from __future__ import annotations

import math
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from flowsim.errors import ConfigError
from flowsim.gpu_specs import get_gpu
from flowsim.kernels.db import DB_COLUMNS
from flowsim.kernels.gemm import gemm_bytes
from flowsim.kernels.memory import memory_latency_candidates, memory_reference, stream_efficiency
from flowsim.kernels.model import KERNEL_MIN_TIME_S, op_breakdown
from flowsim.kernels.reference import choose_reference
from flowsim.kernels.trace_events import read_events
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
TRACE_ELEMENT_BYTES = {"c10::BFloat16": 2, "c10::Half": 2, "float": 4, "double": 8, "long int": 8, "int": 4,
                       "bool": 1, "unsigned char": 1, "signed char": 1, "c10::Float8_e4m3fn": 1, "short int": 2}
"""Element size in bytes of Kineto ``Input type`` strings (c10/core/ScalarType.h)."""
MEMORY_BYTE_RULES = {
    **{op: ("elementwise", 2) for op in ("aten::add", "aten::sub", "aten::mul", "aten::div",
                                         "aten::threshold_backward")},
    **{op: ("elementwise", 1) for op in ("aten::neg", "aten::relu", "aten::silu", "aten::gelu")},
    **{op: ("in_place", 2) for op in ("aten::add_", "aten::sub_", "aten::mul_", "aten::div_", "aten::masked_fill_")},
    **{op: ("in_place", 1) for op in ("aten::clamp_min_", "aten::relu_")},
    "aten::fill_": ("write", 1), "aten::zero_": ("write", 1), "aten::copy_": ("copy", 2),
    **{op: ("each_once", 3) for op in ("sgl_kernel::rmsnorm", "_C::rms_norm", "_C::static_scaled_fp8_quant")},
    **{op: ("each_once", 2) for op in ("sgl_kernel::silu_and_mul", "_C::silu_and_mul")},
    **{op: ("fused_add_norm", 3) for op in ("sgl_kernel::fused_add_rmsnorm", "_C::fused_add_rms_norm")},
}
"""Memory-bound ops whose HBM bytes follow from their argument shapes: op -> (rule, n), n = the leading arguments
that are inputs.

``elementwise``: the first n arguments are read, the output (their broadcast shape, in their common dtype, or
the ``out=`` tensor that follows them) is written; ``in_place``: the first n arguments are read, the first is
written; ``write``: the first is written (fill); ``copy``: ``copy_(self, src)`` reads src and writes self;
``each_once``: custom kernels whose output is passed in, every tensor argument read or written once (``rmsnorm(out,
input, weight)``, ``silu_and_mul(out, input)``, ``static_scaled_fp8_quant(out, input, scale)``);
``fused_add_norm``: ``(input, residual, weight)``, input and residual read and written, weight read.
Left out as ambiguous: ``aten::cat`` (no per-tensor dtype), reductions (the output shape depends on
arguments), gathers, scatters and cache writes (bytes depend on the indices), multi-kernel ops (batch norm)."""


def trace_gpu_key(meta: dict) -> str:
    """flowsim key of the trace's GPU from the ``deviceProperties`` of its top-level fields
    (:attr:`flowsim.kernels.trace_events.TraceEvents.meta`); ConfigError('gpu') when it cannot be told."""
    names = {d.get("name") for d in meta.get("deviceProperties", [])}
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
    trace = read_events(path)
    key = gpu or trace_gpu_key(trace.meta)
    spec = get_gpu(key)
    ops, kernels = {}, defaultdict(list)
    for e in trace.events:
        args = e.get("args") or {}
        if "External id" not in args:
            continue
        if e.get("cat") == "cpu_op" and e.get("name") in GEMM_OPS:
            ops[args["External id"]] = e
        elif e.get("cat") == "kernel":
            kernels[args["External id"]].append(e)
    rows = [r for x, op in ops.items() if kernels.get(x) for r in [gemm_row(op, kernels[x])] if r]
    date = datetime.fromtimestamp(trace.meta.get("baseTimeNanoseconds", 0) / 1e9, tz=timezone.utc).date().isoformat()
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
    df["stack"] = ""  # a Kineto trace does not name the software release (kernel-DB schema: empty)
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
    names = "+".join(sorted({_kernel_name(k) for k in kernels}))
    return a[-2], b[-1], a[-1], batch, TRACE_DTYPES[types[0]], time_s, names


def _kernel_name(kernel: dict) -> str:
    """A kernel event's name up to its template or argument list."""
    return kernel["name"].split("<")[0].split("(")[0]


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


def memory_op_bytes(op: dict) -> int | None:
    """HBM bytes read plus written by one memory-bound op (rule of :data:`MEMORY_BYTE_RULES`), or None.

    Parameters
    ----------
    op : dict
        A Kineto ``cpu_op`` event recorded with shapes (``args["Input Dims"]``, ``args["Input type"]``).

    Returns
    -------
    int or None
        Bytes; None for an op without a rule or without shapes, when an argument the rule needs is not a tensor
        of a known element type, or (``elementwise``) for mixed input dtypes or an ``out=`` tensor of another
        shape.
    """
    rule, n = MEMORY_BYTE_RULES.get(op.get("name"), (None, 0))
    args = op.get("args") or {}
    dims, types = args.get("Input Dims") or [], args.get("Input type") or []
    tensor = [t in TRACE_ELEMENT_BYTES and isinstance(d, list) and all(isinstance(x, int) for x in d)
              for d, t in zip(dims, types)]
    if rule is None or len(tensor) < n or not tensor[0]:
        return None
    if rule == "elementwise":
        return _elementwise_bytes([(d, t) for d, t, ok in zip(dims[:n], types, tensor) if ok],
                                  [(d, t) for d, t, ok in zip(dims[n:], types[n:], tensor[n:]) if ok])
    if rule != "in_place" and not all(tensor[:n]):
        return None
    size = [math.prod(d) * TRACE_ELEMENT_BYTES[t] if ok else 0 for d, t, ok in zip(dims[:n], types, tensor)]
    # write: self; copy: self + src; each_once: every tensor once; in_place and fused_add_norm also write back
    # what they read (self; input and residual)
    rewritten = size[0] if rule == "in_place" else size[0] + size[1] if rule == "fused_add_norm" else 0
    return sum(size) + rewritten


def _elementwise_bytes(inputs: list, out: list) -> int | None:
    """Bytes of an out-of-place elementwise op from its input and ``out=`` tensors ``(dims, type)``: inputs read,
    broadcast output written; None when ambiguous."""
    shaped = [(d, t) for d, t in inputs if d]  # 0-dim tensors (wrapped scalars) do not set the output dtype
    if not shaped or len({t for _, t in shaped}) > 1 or len(out) > 1:
        return None
    try:
        shape = list(np.broadcast_shapes(*(tuple(d) for d, _ in shaped)))
    except ValueError:
        return None
    if out and out[0][0] != shape:
        return None
    out_dtype = out[0][1] if out else shaped[0][1]
    read = sum(math.prod(d) * TRACE_ELEMENT_BYTES[t] for d, t in inputs)
    return read + math.prod(shape) * TRACE_ELEMENT_BYTES[out_dtype]


def ingest_memory_kernels(path, gpu: str | None = None) -> pd.DataFrame:
    """Memory-bound kernels of one Kineto trace with the bytes their launching op moved.

    Parameters
    ----------
    path : str or pathlib.Path
        Trace file (``.json`` or ``.json.gz``).
    gpu : str, optional
        flowsim GPU key; default: read from the trace's ``deviceProperties``.

    Returns
    -------
    pandas.DataFrame
        One row per op of :data:`MEMORY_BYTE_RULES` that launched exactly one kernel (linked by ``External id``)
        and whose bytes are known: ``op``, ``kernel`` (name up to the template), ``bytes`` (bytes), ``time_s``
        (kernel duration, seconds). ``attrs["gpu"]`` holds the GPU key.
    """
    trace = read_events(path)
    ops, kernels = {}, defaultdict(list)
    for e in trace.events:
        args = e.get("args") or {}
        if e.get("cat") == "cpu_op" and e.get("name") in MEMORY_BYTE_RULES and "External id" in args:
            ops[args["External id"]] = e
        elif e.get("cat") == "kernel" and "External id" in args:
            kernels[args["External id"]].append(e)
    rows = []
    for x, op in ops.items():
        nbytes = memory_op_bytes(op)
        if len(kernels.get(x, [])) == 1 and nbytes is not None:
            rows.append((op["name"], _kernel_name(kernels[x][0]), nbytes, kernels[x][0]["dur"] * US))
    df = pd.DataFrame(rows, columns=["op", "kernel", "bytes", "time_s"])
    df.attrs["gpu"] = gpu or trace_gpu_key(trace.meta)
    return df


def stream_seconds(rows: pd.DataFrame, key: str) -> np.ndarray:
    """``bytes / (hbm_Bps * eff_m)`` of each row on GPU ``key``: the model's bandwidth term, seconds."""
    gpu = get_gpu(key)
    return rows.bytes.to_numpy(dtype=float) / (gpu.hbm_Bps * stream_efficiency(memory_reference(gpu).measured))


def memory_latency_fit(rows: pd.DataFrame) -> dict:
    """Fixed time of a memory-bound launch from measured kernels (output of :func:`ingest_memory_kernels`).

    Parameters
    ----------
    rows : pandas.DataFrame
        Columns ``bytes`` (bytes) and ``time_s`` (seconds); ``attrs["gpu"]`` the GPU key.

    Returns
    -------
    dict
        ``latency_s``: median over the kernels of ``time_s - bytes / (hbm_Bps * eff_m)`` (seconds), the value
        of ``data/memory_latency.csv``; ``kernels``: their number; the plain least-squares line
        ``time_s = fit_intercept_s + bytes / fit_Bps`` (seconds, bytes/s) with ``fit_fraction`` = fit_Bps /
        hbm_Bps, to compare with ``stream_fraction`` = eff_m.
    """
    key = rows.attrs["gpu"]
    gpu = get_gpu(key)
    slope, intercept = np.polyfit(rows.bytes.to_numpy(dtype=float), rows.time_s.to_numpy(), 1)
    return {"gpu": key, "kernels": len(rows),
            "latency_s": float(np.median(rows.time_s.to_numpy() - stream_seconds(rows, key))),
            "fit_intercept_s": float(intercept), "fit_Bps": float(1.0 / slope),
            "fit_fraction": float(1.0 / slope / gpu.hbm_Bps),
            "stream_fraction": stream_efficiency(memory_reference(gpu).measured)}


def memory_latency_loo(rows_by_gpu: dict) -> pd.DataFrame:
    """Leave-one-out: each trace's memory-bound kernels priced with the latency of the other traces' GPUs.

    Parameters
    ----------
    rows_by_gpu : dict
        GPU key -> output of :func:`ingest_memory_kernels` for that GPU's trace.

    Returns
    -------
    pandas.DataFrame
        One row per GPU: ``kernels``, ``from`` (the other GPU whose fitted latency is used, chosen by the reference
        rule among the others), ``latency_s`` (seconds), and the median and 90th percentile of
        ``|predicted / measured - 1|`` without a latency (``before_*``: ``max(bytes / bw, KERNEL_MIN_TIME_S)``)
        and with it (``after_*``: ``max(latency + bytes / bw, KERNEL_MIN_TIME_S)``); ``*_total``: summed
        predicted over summed measured time.
    """
    fitted = {k: memory_latency_fit(r)["latency_s"] for k, r in rows_by_gpu.items()}
    out = []
    for key, rows in rows_by_gpu.items():
        gpu = get_gpu(key)
        others = [c for c in memory_latency_candidates() if c.name != key and c.name in fitted]
        ref = choose_reference(gpu, gpu.hbm_Bps, others, "memory_latency", "-").measured
        work = stream_seconds(rows, key)
        row = {"gpu": key, "kernels": len(rows), "from": ref, "latency_s": fitted[ref]}
        for name, lat in (("before", 0.0), ("after", fitted[ref])):
            pred = np.maximum(lat + work, KERNEL_MIN_TIME_S)
            err = np.abs(pred / rows.time_s.to_numpy() - 1.0)
            row.update({f"{name}_median": float(np.median(err)), f"{name}_p90": float(np.percentile(err, 90)),
                        f"{name}_total": float(pred.sum() / rows.time_s.sum())})
        out.append(row)
    return pd.DataFrame(out)
