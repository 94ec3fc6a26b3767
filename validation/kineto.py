"""Extract collectives and compute kernels from a Kineto trace, with their measured durations.

Linking (../shared/research/maxmin-and-traces.md part B): a GPU kernel (``cat: kernel``) carries the
``External id`` of the CPU op that launched it; when it does not, its ``correlation`` leads to the
``cuda_runtime`` / ``cuda_driver`` launch event, whose ``External id`` is used. Kernels whose launch is
outside the profiled window cannot be linked and are counted in ``unlinked_kernels``.

Collectives (one row per kernel):

* NCCL/RCCL kernels (name starts with ``nccl`` or ``rccl``): size, dtype and group from the kernel's own args
  (``Collective name``, ``In/Out msg nelems``, ``dtype``, ``Process Group Ranks``), else from the
  ``record_param_comms`` CPU op with the same External id, else from the ``nccl:<coll>`` annotation
  (its largest tensor of ``Input Dims`` x ``Input type``: the gathered output of an AllGather, the input of a
  ReduceScatter; group = the whole job);
* custom all-reduce kernels (:data:`CUSTOM_ALLREDUCE_OPS`: SGLang's one-shot all-reduce, PyTorch symmetric
  memory ``multimem_all_reduce_``), sized from the launching op's first tensor, group = the whole job;
  they are priced as an NCCL all-reduce of that size, i.e. against what NCCL would take.

Sizes follow nccl-tests: AllGather is the output buffer, ReduceScatter the input buffer, the others the
message.

Compute (one row per launching op; time = sum of its kernels):

* ``gemm``: ``aten::mm / addmm / bmm / baddbmm / _scaled_mm`` recorded with shapes (:mod:`flowsim.kernels.ingest`);
* ``attention``: ``aten::_scaled_dot_product_flash_attention`` / ``_flash_attention_forward`` /
  ``_scaled_dot_product_efficient_attention`` with shapes ``[batch, heads, seq, head_dim]``;
* ``memory``: the element-wise and normalisation ops of :data:`MEMORY_OPS` that launch one kernel; bytes =
  every input tensor read once plus one output written (the first input for in-place ops, whose name ends
  with ``_``, else the largest input); ``fill_`` and ``zero_`` only write.

Anything else (convolutions, MoE, paged attention, sampling) is counted with its time but not priced.
"""
from __future__ import annotations

import ast
import math
from collections import defaultdict
from dataclasses import dataclass

import pandas as pd

from flowsim.kernels.ingest import GEMM_OPS, TRACE_DTYPES, TRACE_ELEMENT_BYTES, gemm_row, memory_op_bytes
from flowsim.kernels.trace_events import TraceEvents
from flowsim.units import US

COLLECTIVE_NAMES = {"allreduce": "allreduce", "all_reduce": "allreduce", "_allgather_base": "allgather",
                    "allgather": "allgather", "all_gather": "allgather", "_all_gather_base": "allgather",
                    "all_gather_into_tensor": "allgather", "allgather_into_tensor_coalesced": "allgather",
                    "_reduce_scatter_base": "reducescatter", "reduce_scatter": "reducescatter",
                    "reducescatter": "reducescatter", "reduce_scatter_tensor": "reducescatter",
                    "broadcast": "broadcast", "reduce": "reduce", "all_to_all": "alltoall",
                    "alltoall_base": "alltoall", "alltoall": "alltoall", "send": "sendrecv", "recv": "sendrecv"}
"""PyTorch c10d collective names (``Collective name`` arg, ``nccl:<name>`` annotations) -> flowsim op."""
COMM_DTYPE_BYTES = {"BFloat16": 2, "Half": 2, "Float": 4, "Double": 8, "Long": 8, "Int": 4, "Short": 2,
                    "Char": 1, "Byte": 1, "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1}
"""Element size of the c10 scalar types named in comm records (c10/core/ScalarType.h)."""
CUSTOM_ALLREDUCE_OPS = {"sgl_kernel::all_reduce": 1, "symm_mem::multimem_all_reduce_": 0}
"""Launching ops of non-NCCL all-reduce kernels -> index of the input tensor that holds the data."""
ATTENTION_OPS = ("aten::_scaled_dot_product_flash_attention", "aten::_flash_attention_forward",
                 "aten::_scaled_dot_product_efficient_attention")
MEMORY_OPS = ("aten::copy_", "aten::add", "aten::add_", "aten::mul", "aten::mul_", "aten::sub", "aten::div",
              "aten::neg", "aten::clamp_min_", "aten::threshold_backward", "aten::fill_", "aten::zero_",
              "aten::masked_fill_", "aten::relu", "aten::relu_", "aten::silu", "aten::gelu", "aten::cat",
              "sgl_kernel::rmsnorm", "sgl_kernel::fused_add_rmsnorm", "sgl_kernel::silu_and_mul",
              "_C::rms_norm", "_C::fused_add_rms_norm", "_C::silu_and_mul", "aten::native_layer_norm")
"""Memory-bound ops priced by bytes (module docstring for the byte rule)."""
WRITE_ONLY_OPS = ("aten::fill_", "aten::zero_")


@dataclass(frozen=True)
class TraceContents:
    """What a trace holds, as tables.

    Attributes
    ----------
    gpu_names : tuple of str
        ``deviceProperties[].name``.
    world_size : int
        Ranks of the job (``distributedInfo``; 1 when absent).
    collectives : pandas.DataFrame
        One row per collective kernel: ``op, size_bytes, dtype, n_ranks, group, library, kernel, start_us,
        measured_s, stream, compute_overlap``. ``compute_overlap`` is the share of the kernel's duration
        during which a non-collective kernel of the same GPU ran on another stream.
    compute : pandas.DataFrame
        One row per priced op: ``kind, op, shape, dtype, m, n, k, batch, heads, seq_q, seq_k, head_dim,
        causal, bytes, measured_s, kernel``.
    unsized_collectives : int
        Collective kernels whose size could not be found.
    unlinked_kernels : int
        Kernels with no launching op in the trace.
    unpriced_kernel_s : float
        Total duration of kernels that are neither collectives nor priced compute, seconds.
    total_kernel_s : float
        Total duration of all kernels, seconds.
    """

    gpu_names: tuple
    world_size: int
    collectives: pd.DataFrame
    compute: pd.DataFrame
    unsized_collectives: int
    unlinked_kernels: int
    unpriced_kernel_s: float
    total_kernel_s: float


def _ranks(text) -> list:
    try:
        ranks = ast.literal_eval(text) if isinstance(text, str) else list(text or [])
    except (ValueError, SyntaxError):
        return []
    return ranks if isinstance(ranks, list) else []


def _comm_from_args(a: dict, world: int):
    """(op, size_bytes, dtype, n_ranks, group) from kernel or record_param_comms args, or None."""
    op = COLLECTIVE_NAMES.get(str(a.get("Collective name", "")))
    elem = COMM_DTYPE_BYTES.get(a.get("dtype"))
    if op is None or elem is None or "In msg nelems" not in a:
        return None
    nelems = a["Out msg nelems"] if op == "allgather" else a["In msg nelems"]
    ranks = _ranks(a.get("Process Group Ranks"))
    n = int(a.get("Group size") or len(ranks) or world)
    return op, int(nelems) * elem, a["dtype"], n, str(a.get("Process Group Name", ""))


def _tensor_bytes(dims, dtype) -> int:
    elem = TRACE_ELEMENT_BYTES.get(dtype)
    if elem is None or not isinstance(dims, list) or any(not isinstance(d, int) for d in dims):
        return 0
    return math.prod(dims) * elem if dims else 0


def _comm_from_annotation(e: dict, world: int):
    a = e.get("args") or {}
    op = COLLECTIVE_NAMES.get(e["name"].split(":", 1)[1])
    dims, types = a.get("Input Dims") or [], a.get("Input type") or []
    size = max((_tensor_bytes(d, t) for d, t in zip(dims, types)), default=0)
    if op is None or size == 0:
        return None
    dtype = next((t for t in types if t in TRACE_ELEMENT_BYTES), "")
    return op, size, dtype, world, "default"


def _custom_allreduce(op: dict, world: int):
    a = op.get("args") or {}
    idx = CUSTOM_ALLREDUCE_OPS[op["name"]]
    dims, types = a.get("Input Dims") or [], a.get("Input type") or []
    if len(dims) <= idx or len(types) <= idx:
        return None
    size = _tensor_bytes(dims[idx], types[idx])
    return ("allreduce", size, TRACE_DTYPES.get(types[idx], types[idx]), world, "world") if size else None


def _memory_row(op: dict, kernel: dict):
    a = op.get("args") or {}
    sizes = [_tensor_bytes(d, t) for d, t in zip(a.get("Input Dims") or [], a.get("Input type") or [])]
    if not any(sizes):
        return None
    name = op["name"]
    # the exact rule of the kernel model's calibration where the op has one, else: every input read once and
    # an output of the largest input's size (the first input's, in place) written
    nbytes = memory_op_bytes(op)
    if nbytes is None:
        nbytes = sizes[0] if name in WRITE_ONLY_OPS else sum(sizes) + (sizes[0] if name.endswith("_") else max(sizes))
    dtype = next((TRACE_DTYPES[t] for t in a.get("Input type") or [] if t in TRACE_DTYPES), "bf16")
    shape = "x".join(str(d) for d in (a["Input Dims"][0] or [1]))
    return {"kind": "memory", "op": name, "shape": f"{shape} ({nbytes} B)", "dtype": dtype, "bytes": nbytes,
            "measured_s": kernel["dur"] * US, "kernel": kernel["name"][:60]}


def _attention_row(op: dict, kernels: list):
    a = op.get("args") or {}
    dims, types = a.get("Input Dims") or [], a.get("Input type") or []
    if len(dims) < 3 or any(len(d) != 4 for d in dims[:3]) or not types or types[0] not in TRACE_DTYPES:
        return None
    (b, h, sq, d), (_, hk, sk, _) = dims[0], dims[1]
    concrete = a.get("Concrete Inputs") or []  # (query, key, value, dropout_p, is_causal, ...)
    causal = len(concrete) > 4 and concrete[4] == "True"
    return {"kind": "attention", "op": op["name"], "shape": f"b{b} h{h}/{hk} s{sq}x{sk} d{d}",
            "dtype": TRACE_DTYPES[types[0]], "batch": b, "heads": h, "kv_heads": hk, "seq_q": sq, "seq_k": sk,
            "head_dim": d, "causal": causal, "measured_s": sum(k["dur"] for k in kernels) * US,
            "kernel": kernels[0]["name"][:60]}


def _overlap(rows: list, busy: dict) -> None:
    """Fill ``compute_overlap`` of each collective from the other streams' compute intervals."""
    for r in rows:
        start, end = r["start_us"], r["start_us"] + r["measured_s"] / US
        covered = 0.0
        for stream, intervals in busy.items():
            if stream == r["stream"]:
                continue
            for s, e in intervals:
                if e > start and s < end:
                    covered += min(e, end) - max(s, start)
        r["compute_overlap"] = min(1.0, covered / (end - start)) if end > start else 0.0


def extract(trace: TraceEvents) -> TraceContents:
    """Collectives and priced compute ops of a trace, with measured durations (module docstring).

    Parameters
    ----------
    trace : TraceEvents
        From :func:`flowsim.kernels.trace_events.read_events`.

    Returns
    -------
    TraceContents
    """
    dist = trace.meta.get("distributedInfo") or {}
    world = int(dist.get("world_size") or 1)
    ops, annotations, launch_ext, kernels = {}, {}, {}, []
    for e in trace.events:
        cat, a = e.get("cat"), e.get("args") or {}
        if cat == "kernel":
            kernels.append(e)
        elif cat == "cpu_op" and "External id" in a:
            ops.setdefault(a["External id"], []).append(e)
        elif cat == "user_annotation" and e.get("name", "").startswith("nccl:") and "External id" in a:
            annotations[a["External id"]] = e
        elif cat in ("cuda_runtime", "cuda_driver") and "correlation" in a and "External id" in a:
            launch_ext[a["correlation"]] = a["External id"]
    by_ext, comm_rows, unsized, unlinked = defaultdict(list), [], 0, 0
    busy = defaultdict(list)
    total = 0.0
    for k in kernels:
        a = k["args"] if isinstance(k.get("args"), dict) else {}
        total += k["dur"]
        ext = a.get("External id", launch_ext.get(a.get("correlation")))
        launching = ops.get(ext, [])
        lname = k["name"].lower()
        custom = next((o for o in launching if o["name"] in CUSTOM_ALLREDUCE_OPS), None)
        if lname.startswith(("nccl", "rccl")) or custom is not None:
            rpc = next((o for o in launching if o["name"] == "record_param_comms"), None)
            info = (_comm_from_args(a, world) or (rpc and _comm_from_args(rpc.get("args") or {}, world))
                    or (ext in annotations and _comm_from_annotation(annotations[ext], world))
                    or (custom is not None and _custom_allreduce(custom, world)))
            if not info:
                unsized += 1
                continue
            op, size, dtype, n, group = info
            library = custom["name"] if custom is not None else "nccl"
            comm_rows.append({"op": op, "size_bytes": size, "dtype": dtype, "n_ranks": n, "group": group,
                              "library": library, "kernel": k["name"][:60], "start_us": k["ts"],
                              "measured_s": k["dur"] * US, "stream": k.get("tid")})
            continue
        busy[k.get("tid")].append((k["ts"], k["ts"] + k["dur"]))
        if not launching:
            unlinked += 1
        by_ext[ext].append(k)
    _overlap(comm_rows, busy)
    compute_rows, priced_us = [], 0.0
    for ext, ks in by_ext.items():
        for op in ops.get(ext, []):
            row = None
            if op["name"] in GEMM_OPS:
                g = gemm_row(op, ks)
                if g:
                    m, n, kk, batch, dtype, time_s, names = g
                    row = {"kind": "gemm", "op": op["name"], "shape": f"{batch}x({m}x{n}x{kk})", "dtype": dtype,
                           "m": m, "n": n, "k": kk, "batch": batch, "measured_s": time_s, "kernel": names[:60]}
            elif op["name"] in ATTENTION_OPS:
                row = _attention_row(op, ks)
            elif op["name"] in MEMORY_OPS and len(ks) == 1:
                row = _memory_row(op, ks[0])
            if row:
                compute_rows.append(row)
                priced_us += sum(k["dur"] for k in ks)
                break
    comm_total_us = sum(r["measured_s"] for r in comm_rows) / US
    return TraceContents(
        gpu_names=tuple(d.get("name", "") for d in trace.meta.get("deviceProperties") or []),
        world_size=world, collectives=pd.DataFrame(comm_rows), compute=pd.DataFrame(compute_rows),
        unsized_collectives=unsized, unlinked_kernels=unlinked,
        unpriced_kernel_s=(total - priced_us - comm_total_us) * US, total_kernel_s=total * US)
