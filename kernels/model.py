"""Time of one kernel launch on one GPU: a roofline whose efficiencies come from kernel measurements.

``time = max(latency + max(flops / (peak * eff_c), bytes / (hbm_Bps * eff_m)), KERNEL_MIN_TIME_S)`` per op, where

- GEMM ``eff_c`` = measured ceiling (of the job's software release) x tile and wave quantisation x power
  derate (under sustained load: the clock the GPU holds at its power limit, for ceilings measured in short
  bursts) x calibrated GEMM multiplier, and ``latency`` = the measured fixed time of a GEMM launch
  (flowsim.kernels.gemm, flowsim.kernels.stack, flowsim.kernels.power, flowsim.kernels.sustained),
- attention ``eff_c`` = the attention table of the job's implementation (FlashAttention-2/3 or cuDNN: the
  kernel its software release runs) interpolated on log(seq_k) and head dim (flowsim.kernels.attention)
  x power derate,
- ``eff_m`` = measured stream efficiency (flowsim.kernels.memory), for every kind; ``memory`` rows have only this
  term (their ``flops`` are reported, not priced) and the fixed time of a memory-bound launch as ``latency``
  (flowsim.kernels.memory, measured in profiler traces); attention has no ``latency``.

A GPU without its own measurement takes the efficiency of its reference GPU (flowsim.kernels.reference); since
``peak`` and ``hbm_Bps`` are the target's own, compute-bound times scale by the FLOP/s ratio and memory-bound
times by the bandwidth ratio. :func:`kernel_references` reports the choices.

The software stack (:class:`~flowsim.kernels.stack.KernelStack`: release, power limit, calibrated GEMM
multiplier) comes from the job's config; ``stack=None`` is the default stack (newest measurements, the GPU's own
power limit, no calibration).
"""
from __future__ import annotations

import warnings

import numpy as np

from flowsim.errors import ConfigError, FlowsimWarning
from flowsim.gpu_specs import GPUSpec
from flowsim.kernels import attention as attn
from flowsim.kernels.gemm import (
    gemm_bytes,
    gemm_candidates,
    gemm_ceiling,
    gemm_latency_s,
    gemm_reference,
    latency_reference,
    peak_dtype,
    tiles_for,
)
from flowsim.kernels.memory import memory_latency_reference, memory_latency_s, memory_reference, stream_efficiency
from flowsim.kernels.ops import SHAPE_COLUMNS, validate_ops
from flowsim.kernels.power import clock_fraction
from flowsim.kernels.reference import Reference, warn_if_scaled
from flowsim.kernels.stack import DEFAULT_STACK, KernelStack
from flowsim.kernels.sustained import sustained_ceiling, sustained_reference
from flowsim.units import DTYPE_BYTES

# Shortest kernel in the H200 profiler trace shared/data/traces/flowsim_h200_4rank_sglang_tp4.json.gz
# (at::native::vectorized_elementwise_kernel FillFunc, 0.896 us GPU time; the A100 and B200 traces there have
# 1.344 us and 1.984 us minima). A launch takes at least this long on the GPU.
KERNEL_MIN_TIME_S = 0.896e-6

def op_times(ops, gpu: GPUSpec, attention_impl: str | None = None,
             stack: KernelStack | None = None, *, trusted: bool = False) -> np.ndarray:
    """Seconds for one launch of each op in an op table, vectorised.

    Parameters
    ----------
    ops : pandas.DataFrame or dict
        Op table, schema in :mod:`flowsim.kernels.ops` (``OP_COLUMNS``); with ``trusted``, any mapping of those
        columns to arrays (flowsim's own op tables, :attr:`flowsim.model.workload.Workload.op_table`).
    gpu : GPUSpec
        The GPU (``flowsim.gpu_specs.get_gpu``).
    attention_impl : {"fa2", "fa3", "cudnn"}, optional
        Attention implementation whose measurements price attention rows (:mod:`flowsim.kernels.attention`);
        ``fa3`` needs a Hopper GPU, ``cudnn`` an NVIDIA one (their forward tables; their backward uses FA2's,
        which is all that was measured). Default: the stack's (``KernelStack.attention_impl``: the kernel the
        job's software release runs on its GPU generation), ``fa2`` for the default stack.
    stack : KernelStack, optional
        Software release, power limit and calibrated GEMM multiplier of the job; default
        :data:`~flowsim.kernels.stack.DEFAULT_STACK`.
    trusted : bool, optional
        The table was built by flowsim from a workload (:func:`flowsim.step.blocks.op_columns`: every column
        present, of the schema's dtype, values valid), so the op-table checks are skipped (``simulate`` of the
        README example about 1.2x faster, docs/PERFORMANCE.md; tests/test_fast_path.py compares both ways).
        Never for a user's table.

    Returns
    -------
    float64[len(ops)]
        Seconds, >= ``KERNEL_MIN_TIME_S``.

    Raises
    ------
    ConfigError
        Bad op table (naming the column), a dtype the GPU has no peak for (``dtype``), or ``attention_impl``.

    Warns
    -----
    FlowsimWarning
        When ``gpu`` comes from a user spec file and is priced from another GPU's measurements, or when the
        stack's release has no GEMM measurement of its own and the nearest older (newer) one is used.
    """
    return _price(ops, gpu, attention_impl, stack, trusted)["time_s"]


def op_breakdown(ops, gpu: GPUSpec, attention_impl: str | None = None, stack: KernelStack | None = None):
    """Like :func:`op_times`, with the roofline terms: one row per op, index of ``ops``.

    Parameters
    ----------
    ops : pandas.DataFrame
        Op table, schema in :mod:`flowsim.kernels.ops`.
    gpu : GPUSpec
        The GPU.
    attention_impl : {"fa2", "fa3", "cudnn"}, optional
        As in :func:`op_times`.
    stack : KernelStack, optional
        As in :func:`op_times`.

    Returns
    -------
    pandas.DataFrame
        ``time_s = max(latency_s + max(compute_s, memory_s), KERNEL_MIN_TIME_S)``; ``compute_s`` (FLOP over the
        efficient peak), ``memory_s`` (bytes over the efficient bandwidth) and ``latency_s`` (fixed launch time
        of GEMM and memory rows; 0 for attention) in seconds; ``bound``: ``compute``, ``memory`` or ``latency``
        (the fixed latency or the launch floor is the largest term); ``flops`` (FLOP) and ``bytes`` used;
        ``achieved_flop_per_s`` = flops / time_s.
    """
    import pandas as pd

    p = _price(ops, gpu, attention_impl, stack)
    df = pd.DataFrame(p, index=ops.index)
    fixed = np.maximum(p["latency_s"], np.where(p["time_s"] == KERNEL_MIN_TIME_S, KERNEL_MIN_TIME_S, 0.0))
    df["bound"] = np.where(
        fixed >= np.maximum(p["compute_s"], p["memory_s"]),
        "latency",
        np.where(p["compute_s"] >= p["memory_s"], "compute", "memory"),
    )
    df["achieved_flop_per_s"] = p["flops"] / p["time_s"]
    return df[["time_s", "compute_s", "memory_s", "latency_s", "bound", "flops", "bytes", "achieved_flop_per_s"]]


def _trusted_columns(ops) -> dict:
    """:func:`~flowsim.kernels.ops.validate_ops`'s output for a table flowsim built (``op_times(trusted=True)``;
    a DataFrame or a mapping of its columns), read without its checks."""
    out = {c: np.asarray(ops[c], dtype=object) for c in ("kind", "dtype")}
    out.update({c: np.asarray(ops[c], dtype=np.int64) for c in SHAPE_COLUMNS})
    out.update(causal=np.asarray(ops["causal"], dtype=bool), flops=np.asarray(ops["flops"], dtype=np.float64),
               bytes=np.asarray(ops["bytes"], dtype=np.float64))
    out["batch"] = np.where(out["batch"] == 0, 1, out["batch"])
    out["kv_heads"] = np.where(out["kv_heads"] == 0, out["heads"], out["kv_heads"])
    return out


def _price(ops, gpu: GPUSpec, attention_impl: str | None, stack: KernelStack | None,
           trusted: bool = False) -> dict:
    """Roofline terms of every op: dict of float64 arrays time_s, compute_s, memory_s, latency_s, flops, bytes."""
    stack = DEFAULT_STACK if stack is None else stack
    if not isinstance(stack, KernelStack):
        raise ConfigError("stack", "must be a flowsim.kernels.KernelStack", type(stack).__name__)
    attention_impl = attention_impl or stack.attention_impl or "fa2"
    if attention_impl not in attn.IMPLS:
        raise ConfigError("attention_impl", f"must be one of {', '.join(attn.IMPLS)}", attention_impl)
    if attention_impl == "fa3" and gpu.arch != "hopper":
        raise ConfigError("attention_impl", "FlashAttention-3 runs on Hopper GPUs only", f"fa3 on {gpu.key}")
    if attention_impl == "cudnn" and gpu.vendor != "nvidia":
        raise ConfigError("attention_impl", "cuDNN attention runs on NVIDIA GPUs only", f"cudnn on {gpu.key}")
    a = _trusted_columns(ops) if trusted else validate_ops(ops)
    kind = a["kind"]
    terms_cols = ("compute_s", "memory_s", "latency_s", "flops", "bytes")
    out = {c: np.zeros(len(kind)) for c in terms_cols}
    mem_ref = memory_reference(gpu)
    mem_Bps = gpu.hbm_Bps * stream_efficiency(mem_ref.measured)
    refs = [mem_ref]
    for dtype in np.unique(a["dtype"]):
        this = a["dtype"] == dtype
        groups = [("gemm", lambda r: _gemm_terms(a, r, dtype, gpu, mem_Bps, refs, stack))]
        groups += [
            (f"attn_{p_}", lambda r, p_=p_: _attention_terms(a, r, dtype, p_, gpu, mem_Bps, attention_impl, refs,
                                                             stack))
            for p_ in ("fwd", "bwd")
        ]
        groups.append(("memory", lambda r: _memory_terms(a, r, gpu, mem_Bps, refs)))
        for kind_name, terms in groups:
            rows = np.flatnonzero(this & (kind == kind_name))
            if rows.size:
                for col, vals in zip(terms_cols, terms(rows)):
                    out[col][rows] = vals
    warn_if_scaled(gpu, list(dict.fromkeys(refs)), stacklevel=4)
    work = np.maximum(out["compute_s"], out["memory_s"])
    out["time_s"] = np.maximum(out["latency_s"] + work, KERNEL_MIN_TIME_S)
    return out


def _peak(gpu: GPUSpec, dtype: str) -> float:
    if dtype == "nvfp4" and gpu.vendor != "nvidia":
        raise ConfigError("dtype", f"nvfp4 runs on NVIDIA Blackwell tensor cores only ({gpu.key} is {gpu.vendor})",
                          dtype)
    pdt = peak_dtype(dtype)
    if pdt not in gpu.peak_flop_per_s:
        raise ConfigError("dtype", f"{gpu.key} has no {pdt} peak in its spec", dtype)
    return gpu.peak_flop_per_s[pdt]


def _given_or(a: dict, col: str, rows: np.ndarray, derived: np.ndarray) -> np.ndarray:
    """The op table's ``flops``/``bytes`` where given (> 0), else the value derived from the shape."""
    return np.where(a[col][rows] > 0, a[col][rows], derived)


def _gemm_terms(a: dict, rows: np.ndarray, dtype: str, gpu: GPUSpec, mem_Bps: float, refs: list,
                stack: KernelStack):
    m, n, k, batch = (a[c][rows] for c in ("m", "n", "k", "batch"))
    peak = _peak(gpu, dtype)
    ref = gemm_reference(gpu, dtype)
    refs.append(ref)
    ceiling = gemm_ceiling(ref.measured, ref.dtype, stack.release)
    if ceiling.fallback:
        warnings.warn(f"software_release {stack.release}: no {ref.measured} {ref.dtype} GEMM measurement on it; "
                      f"using {ceiling.release} ({ceiling.date}), the nearest {ceiling.fallback} release",
                      FlowsimWarning, stacklevel=5)
    rate = peak * _gemm_ceiling_value(gpu, dtype, ref.measured, ceiling, stack, refs) * stack.gemm_scale
    flops = _given_or(a, "flops", rows, 2.0 * m * n * k * batch)
    nbytes = _given_or(a, "bytes", rows, gemm_bytes(m, n, k, batch, dtype))
    eff, extra = gemm_candidates(m, n, k, batch, gpu.sm_count, tiles_for(gpu))
    with np.errstate(divide="ignore"):
        t_c = flops[:, None] / (rate * eff)
    t_m = (nbytes[:, None] + extra) / mem_Bps
    best = np.argmin(np.maximum(t_c, t_m), axis=1)[:, None]
    lat_ref = latency_reference(gpu)
    refs.append(lat_ref)
    latency = np.full(rows.size, gemm_latency_s(lat_ref.measured))
    return (np.take_along_axis(t_c, best, 1)[:, 0], np.take_along_axis(t_m, best, 1)[:, 0], latency, flops,
            nbytes + np.take_along_axis(extra, best, 1)[:, 0])


def _gemm_ceiling_value(gpu: GPUSpec, dtype: str, measured_key: str, ceiling, stack: KernelStack,
                        refs: list) -> float:
    """GEMM ceiling of ``gpu`` (fraction of its peak): the release's measured ceiling derated to the power limit,
    and under sustained load no higher than the sustained ceiling when it was measured in a short burst
    (:mod:`flowsim.kernels.sustained`; its reference GPU is appended to ``refs``)."""
    value = ceiling.value * clock_fraction(gpu, measured_key, stack.power_limit_w)
    if stack.sustained and ceiling.load == "burst":
        held = sustained_ceiling(gpu, dtype, stack.power_limit_w)
        if held is not None:
            refs.append(sustained_reference(gpu))
            return min(value, held)
    return value


def _attention_terms(a, rows, dtype, pass_, gpu, mem_Bps, impl, refs, stack):
    if dtype not in ("bf16", "fp16", "fp8"):
        raise ConfigError("dtype", "attention rows must be bf16, fp16 or fp8", dtype)
    cols = ("batch", "heads", "kv_heads", "seq_q", "seq_k", "head_dim", "causal")
    b, h, hkv, sq, sk, d, causal = (a[c][rows] for c in cols)
    bwd = pass_ == "bwd"
    flops = _given_or(a, "flops", rows, attn.attention_flops(b, h, sq, sk, d, causal, bwd))
    nbytes = _given_or(a, "bytes", rows, attn.attention_bytes(b, h, hkv, sq, sk, d, DTYPE_BYTES[dtype], bwd))
    ref = attn.attention_reference(gpu, impl)
    refs.append(ref)
    eff = np.empty(rows.size)
    for c in (False, True):
        sel = causal == c
        if sel.any():
            grid = attn.efficiency_grid(ref.measured, impl, pass_, c)
            eff[sel] = attn.interpolate_efficiency(grid, d[sel], sk[sel])
    # Attention was measured in fp16/bf16; fp8 rows are priced at that rate (no fp8 measurement).
    rate = attn.fp16_peak(gpu) * clock_fraction(gpu, ref.measured, stack.power_limit_w)
    return flops / (rate * eff), nbytes / mem_Bps, np.zeros(rows.size), flops, nbytes


def _memory_terms(a, rows, gpu, mem_Bps, refs):
    # Memory-bound rows are priced by their bytes plus the fixed launch time; their FLOP (elementwise arithmetic)
    # are carried for reporting only (an Adam step does ~1 FLOP per byte, far below every GPU's ridge point).
    ref = memory_latency_reference(gpu)
    refs.append(ref)
    latency = np.full(rows.size, memory_latency_s(ref.measured))
    return np.zeros(rows.size), a["bytes"][rows] / mem_Bps, latency, a["flops"][rows], a["bytes"][rows]


def gemm_time(m: int, n: int, k: int, dtype: str, gpu: GPUSpec, batch: int = 1,
              stack: KernelStack | None = None) -> float:
    """Seconds for one GEMM launch C[m, n] = A[m, k] B[k, n] (``batch`` of them); see :func:`op_times`.

    Parameters
    ----------
    m, n, k : int
        GEMM dimensions, >= 1.
    dtype : {"fp32", "tf32", "bf16", "fp16", "fp8", "nvfp4", "mxfp4"}
        Input dtype (the GPU must have a peak for it; both FP4 formats use the ``fp4`` peak).
    gpu : GPUSpec
        The GPU.
    batch : int
        Independent GEMMs of this shape in the launch, >= 1.
    stack : KernelStack, optional
        As in :func:`op_times`.

    Returns
    -------
    float
        Seconds.

    Examples
    --------
    >>> from flowsim.gpu_specs import get_gpu
    >>> round(2 * 8192**3 / gemm_time(8192, 8192, 8192, "bf16", get_gpu("h100-sxm")) / 1e12)
    824
    """
    import pandas as pd

    ops = pd.DataFrame({"kind": ["gemm"], "dtype": [dtype], "m": [m], "n": [n], "k": [k], "batch": [batch]})
    return float(op_times(ops, gpu, stack=stack)[0])


def attention_time(
    batch: int,
    heads: int,
    seq_q: int,
    seq_k: int,
    head_dim: int,
    dtype: str,
    gpu: GPUSpec,
    kv_heads: int = 0,
    causal: bool = False,
    backward: bool = False,
    attention_impl: str | None = None,
) -> float:
    """Seconds for one FlashAttention forward (or backward, ``backward=True``) launch; see :func:`op_times`.

    Parameters
    ----------
    batch, heads : int
        Batch size and query heads, >= 1.
    seq_q, seq_k : int
        Query and key/value lengths in tokens, >= 1.
    head_dim : int
        Head dimension, >= 1.
    dtype : {"bf16", "fp16", "fp8"}
        Element dtype (fp8 is priced at the fp16 rate).
    gpu : GPUSpec
        The GPU.
    kv_heads : int
        Key/value heads (GQA/MQA); 0 means ``heads``.
    causal : bool
        Causal mask (half the FLOP of a full mask).
    backward : bool
        Price the backward pass (2.5x the forward FLOP) instead of the forward.
    attention_impl : {"fa2", "fa3", "cudnn"}, optional
        As in :func:`op_times` (default ``fa2``).

    Returns
    -------
    float
        Seconds.
    """
    import pandas as pd

    ops = pd.DataFrame(
        {
            "kind": ["attn_bwd" if backward else "attn_fwd"], "dtype": [dtype], "batch": [batch], "heads": [heads],
            "kv_heads": [kv_heads], "seq_q": [seq_q], "seq_k": [seq_k], "head_dim": [head_dim], "causal": [causal],
        }
    )
    return float(op_times(ops, gpu, attention_impl=attention_impl)[0])


def memory_time(nbytes: float, gpu: GPUSpec) -> float:
    """Seconds for a memory-bound launch; see :func:`op_times`.

    Parameters
    ----------
    nbytes : float
        HBM bytes read plus written, >= 0.
    gpu : GPUSpec
        The GPU.

    Returns
    -------
    float
        ``max(latency + nbytes / (hbm_Bps * eff_m), KERNEL_MIN_TIME_S)`` seconds (``latency``: the fixed time
        of a memory-bound launch, table ``memory_latency``).
    """
    import pandas as pd

    ops = pd.DataFrame({"kind": ["memory"], "dtype": ["bf16"], "bytes": [nbytes]})
    return float(op_times(ops, gpu)[0])


def kernel_references(gpu: GPUSpec, dtypes: tuple | None = None, attention_impl: str = "fa2") -> list[Reference]:
    """Which measured GPU prices each op kind on ``gpu`` (GEMM ceilings and latency, attention, memory).

    Parameters
    ----------
    gpu : GPUSpec
        The GPU.
    dtypes : tuple of str, optional
        GEMM dtypes to report; default: bf16 and fp8 where the GPU has them (fp16 on a GPU without bf16).
    attention_impl : {"fa2", "fa3", "cudnn"}
        Attention implementation whose reference is reported.

    Returns
    -------
    list of Reference
        GEMM ceiling references (one per dtype), GEMM latency, the GPU measured both ways whose sustained-load
        ceiling caps a training step's GEMMs (:mod:`flowsim.kernels.sustained`; absent when its vendor has
        none), then attention, memory bandwidth, memory latency.
    """
    if dtypes is None:
        dtypes = tuple(d for d in ("bf16", "fp8") if d in gpu.peak_flop_per_s) or ("fp16",)
    refs = [gemm_reference(gpu, dt) for dt in dtypes] + [latency_reference(gpu)]
    refs += [r for r in (sustained_reference(gpu),) if r is not None]
    return refs + [attn.attention_reference(gpu, attention_impl), memory_reference(gpu),
                   memory_latency_reference(gpu)]
