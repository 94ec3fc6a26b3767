"""Kernel benchmark harness: time GEMM, attention and memory-bound ops with torch and emit kernel-DB rows.

torch is an optional dependency (``pip install 'flowsim[bench]'``); it is imported only when a benchmark runs.

Method, per shape (a row of a :mod:`flowsim.kernels.shapes` table):

1. Allocate ``n_sets`` independent input sets (``n_sets = clip(ceil(ROTATE_BYTES / input_bytes), 1, repeats)``)
   and rotate through them, so that a repeat reads other memory than the ones before it. When the sets
   together are smaller than ``ROTATE_BYTES`` (small inputs), a ``ROTATE_BYTES`` buffer is also overwritten
   before each timed repeat, outside the timed region, so small inputs are not served from a warm cache either.
   ``ROTATE_BYTES`` is at least the last-level cache of current GPUs.
2. Run ``warmup`` untimed launches (cuBLAS heuristics, allocator, lazy module loading), rotating sets.
3. Time ``repeats`` launches, set ``i % n_sets`` in repeat ``i``. On a CUDA (or ROCm) device each launch
   sits between two CUDA events and the GPU is first given a sleep kernel long enough for the host to queue
   all repeats, so host launch overhead does not leak into the events; on the CPU each launch is timed with
   ``time.perf_counter`` (a torch CPU op returns only when its work is done, so the clock is synchronised
   with it). The row's ``time_s`` is the median of the repeats.

Rows follow the kernel-DB schema (:mod:`flowsim.kernels.db`):

* ``gemm`` -> op ``gemm``, impl ``torch.mm`` (``torch.bmm`` for batch > 1), FLOP ``2 m n k batch``, bytes from
  :func:`flowsim.kernels.gemm.gemm_bytes`; bottleneck from flowsim's roofline on that GPU when ``gpu`` is a
  flowsim key, else empty.
* ``attention`` -> two rows, op ``attn_fwd`` and ``attn_fwd_bwd`` (one launch of
  ``torch.nn.functional.scaled_dot_product_attention`` forward, and forward + backward via
  ``torch.autograd.grad``), impl ``torch.sdpa``, FLOP and bytes in the flash-attention convention of
  :mod:`flowsim.kernels.attention` (fwd+bwd = 3.5 x fwd FLOP), bottleneck ``compute``.
* memory-bound ops -> op ``memory``, impl ``torch.<function>``, FLOP 0 (flowsim prices them by bytes),
  bytes = what the torch calls read and write (``MEMORY_BYTES_PER_ELEM``), bottleneck ``memory``.

``source`` carries the provenance: harness, flowsim and torch versions, device name, timing method, repeats,
warm-up, input sets and the tensor shape; ``date`` is the UTC date of the run.
"""
from __future__ import annotations

import math
import re
import time
from datetime import datetime, timezone

import numpy as np
import pandas as pd

from flowsim._version import __version__
from flowsim.errors import ConfigError
from flowsim.gpu_specs import get_gpu, gpu_keys
from flowsim.kernels.attention import FWD_BWD_FLOP_RATIO, attention_bytes, attention_flops
from flowsim.kernels.db import DB_COLUMNS
from flowsim.kernels.gemm import gemm_bytes
from flowsim.kernels.ingest import TRACE_DEVICE_KEYS
from flowsim.kernels.model import op_breakdown, op_times
from flowsim.kernels.shapes import validate_shapes
from flowsim.units import DTYPE_BYTES, MS, MiB

# Bytes of input memory cycled through across repeats: 256 MiB, at least the last-level cache of current GPUs
# (tens of MB of L2 on A100/H100/H200, 126 MiB on B200 per gpu_specs, 256 MiB Infinity Cache on MI300X).
ROTATE_BYTES = 2**28
DEFAULT_REPEATS = 20
DEFAULT_WARMUP = 5
# Host time to enqueue one repeat (events + the op's launches; attention backward launches several kernels),
# in GPU clock cycles at ~2 GHz: 100 us. The sleep kernel before the timed loop lasts this times the repeats.
QUEUE_AHEAD_CYCLES_PER_REPEAT = 200_000
# Elements read + written per element of the [rows, cols] input, as the torch calls run them: a norm reads x and
# writes y (its weight, and bias, add 1-2 cols); swiglu runs silu(a) (read a, write) then * b (read 2, write),
# counted per element of the [rows, cols] output; gelu reads and writes; add reads two and writes one.
MEMORY_BYTES_PER_ELEM = {"rmsnorm": 2, "layernorm": 2, "swiglu": 5, "gelu": 2, "add": 3}
_NORM_PARAMS = {"rmsnorm": 1, "layernorm": 2}  # weight (and bias) vectors of cols elements
_TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
_GPU_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def import_torch():
    """Return the torch module; ConfigError('torch') naming the extra to install when it is absent."""
    try:
        import torch
    except ImportError:
        raise ConfigError("torch", "is required by the benchmark harness; pip install 'flowsim[bench]'") from None
    return torch


def resolve_device(torch, device: str) -> str:
    """``auto`` -> ``cuda`` when torch sees a GPU, else ``cpu``; ConfigError('device') for cuda without one."""
    if device not in ("auto", "cpu", "cuda"):
        raise ConfigError("device", "must be auto, cpu or cuda", device)
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", "torch sees no CUDA/ROCm GPU", device)
    return device


def iter_bench(shapes: pd.DataFrame, gpu_name: str, *, device: str = "auto", repeats: int = DEFAULT_REPEATS,
               warmup: int = DEFAULT_WARMUP, seed: int = 0):
    """Benchmark each shape in turn, yielding its kernel-DB rows as soon as they are measured.

    Parameters
    ----------
    shapes : pandas.DataFrame
        Shape table (:mod:`flowsim.kernels.shapes`); validated here.
    gpu_name : str
        Value of the rows' ``gpu`` column: a flowsim GPU key (see ``flowsim gpus``) for a listed GPU, else a name
        for the device (letters, digits, ``.``, ``_``, ``-``).
    device : str
        ``auto``, ``cpu`` or ``cuda`` (also ROCm builds of torch).
    repeats : int
        Timed launches per shape (>= 1); the median is reported.
    warmup : int
        Untimed launches before timing (>= 0).
    seed : int
        Seed of the random inputs.

    Yields
    ------
    pandas.DataFrame
        Rows in ``DB_COLUMNS`` for one shape (two for attention).

    Raises
    ------
    ConfigError
        ``torch`` not installed, ``device`` unavailable, bad ``repeats`` or ``warmup``, a bad shape table, or a
        ``gpu_name`` that is malformed, is a flowsim GPU key on a CPU run, or is another flowsim key than the one
        of the device torch reports (names in :data:`flowsim.kernels.ingest.TRACE_DEVICE_KEYS`).
    """
    if not isinstance(gpu_name, str) or not _GPU_NAME.match(gpu_name):
        raise ConfigError("gpu_name", "must be a flowsim GPU key or a device name of letters, digits, . _ -",
                          repr(gpu_name))
    if repeats < 1:
        raise ConfigError("repeats", "must be >= 1", repeats)
    if warmup < 0:
        raise ConfigError("warmup", "must be >= 0", warmup)
    shapes = validate_shapes(shapes)
    torch = import_torch()
    device = resolve_device(torch, device)
    spec = get_gpu(gpu_name) if gpu_name in gpu_keys() else None
    if device == "cuda":
        device_name = torch.cuda.get_device_name()
        runtime = f"HIP {torch.version.hip}" if torch.version.hip else f"CUDA {torch.version.cuda}"
        method = "CUDA events"
        measured_key = TRACE_DEVICE_KEYS.get(device_name)
        if spec and measured_key and measured_key != gpu_name:
            raise ConfigError("gpu_name", f"torch runs on {device_name}, flowsim key {measured_key}", gpu_name)
    else:
        device_name = runtime = "cpu"
        method = "wall clock (perf_counter, synchronised)"
        if spec:
            raise ConfigError("gpu_name", "is a flowsim GPU key but the run is on the CPU; name the device", gpu_name)
    gen = torch.Generator(device=device).manual_seed(seed)
    flush_buffer = torch.empty(ROTATE_BYTES, dtype=torch.uint8, device=device)
    date = datetime.now(timezone.utc).date().isoformat()
    for s in shapes.itertuples(index=False):
        cases = _cases(torch, s, device, gen)
        rows = []
        for case in cases:
            n_sets = min(repeats, max(1, math.ceil(ROTATE_BYTES / case["input_bytes"])))
            sets = [case["make"]() for _ in range(n_sets)]
            for i in range(warmup):
                case["run"](*sets[i % n_sets])
            flush = flush_buffer if n_sets * case["input_bytes"] < ROTATE_BYTES else None
            times = (_time_events if device == "cuda" else _time_wall)(torch, case["run"], sets, repeats, flush)
            time_s = float(np.median(times))
            del sets
            source = (f"flowsim kernels bench {__version__}; torch {torch.__version__}; device {device_name} "
                      f"({runtime}); {method}; median of {repeats} after {warmup} warm-up; {n_sets} input sets"
                      + (f", {ROTATE_BYTES // MiB} MiB cache flush before each repeat" if flush is not None else "")
                      + f"; shape {case['shape']}")
            rows.append(dict(
                op=case["op"], impl=case["impl"], gpu=gpu_name, dtype=s.dtype, flops=case["flops"],
                bytes=case["bytes"], time_s=time_s, achieved_flop_per_s=case["flops"] / time_s,
                achieved_Bps=case["bytes"] / time_s, bottleneck=case["bottleneck"], source=source, date=date,
                **case["dims"],
            ))
        df = pd.DataFrame(rows)
        if s.op == "gemm":
            df["bottleneck"] = _gemm_bound(df, spec)
        yield _db_frame(df)


def run_bench(shapes: pd.DataFrame, gpu_name: str, **kwargs) -> pd.DataFrame:
    """All rows of :func:`iter_bench` as one kernel-DB frame (same parameters)."""
    parts = list(iter_bench(shapes, gpu_name, **kwargs))
    return pd.concat(parts, ignore_index=True) if parts else _db_frame(pd.DataFrame())


def _db_frame(df: pd.DataFrame) -> pd.DataFrame:
    out = pd.DataFrame({c: df[c] if c in df.columns else None for c in DB_COLUMNS}, index=df.index)
    for c in ("m", "n", "k", "batch", "heads", "seq_q", "seq_k", "head_dim"):
        out[c] = out[c].fillna(0).astype(np.int64)
    out["causal"] = out["causal"].fillna(False).astype(bool)
    return out


def _gemm_bound(df: pd.DataFrame, spec) -> list:
    if spec is None:
        return [""] * len(df)
    ops = df.assign(kind="gemm")[["kind", "dtype", "m", "n", "k", "batch"]]
    return list(op_breakdown(ops, spec)["bound"])


def _cases(torch, s, device: str, gen) -> list:
    """Timed cases of one shape row: dicts with make (-> input tensors), run, op, impl, dims, flops, bytes,
    input_bytes, bottleneck and a shape string."""
    dt = getattr(torch, _TORCH_DTYPES[s.dtype])
    e = DTYPE_BYTES[s.dtype]

    def rand(*size, grad=False):
        return torch.randn(size, generator=gen, device=device, dtype=dt, requires_grad=grad)

    if s.op == "gemm":
        a_shape, b_shape = ((s.batch, s.m, s.k), (s.batch, s.k, s.n)) if s.batch > 1 else ((s.m, s.k), (s.k, s.n))
        return [dict(
            make=lambda: (rand(*a_shape), rand(*b_shape)), run=torch.bmm if s.batch > 1 else torch.mm,
            op="gemm", impl="torch.bmm" if s.batch > 1 else "torch.mm",
            dims=dict(m=s.m, n=s.n, k=s.k, batch=s.batch), flops=2.0 * s.m * s.n * s.k * s.batch,
            bytes=float(gemm_bytes(s.m, s.n, s.k, s.batch, s.dtype)), input_bytes=e * s.batch * (s.m + s.n) * s.k,
            bottleneck="", shape=f"{s.batch}x{s.m}x{s.n}x{s.k}" if s.batch > 1 else f"{s.m}x{s.n}x{s.k}",
        )]
    if s.op == "attention":
        return _attention_cases(torch, s, rand, e)
    return [_memory_case(torch, s, rand, e)]


def _attention_cases(torch, s, rand, e: int) -> list:
    sdpa = torch.nn.functional.scaled_dot_product_attention
    qkv = (s.batch, s.heads, s.seq, s.head_dim)
    dims = dict(batch=s.batch, heads=s.heads, seq_q=s.seq, seq_k=s.seq, head_dim=s.head_dim, causal=s.causal)
    geom = (s.batch, s.heads, s.heads, s.seq, s.seq, s.head_dim, e)
    fwd_flops = float(attention_flops(s.batch, s.heads, s.seq, s.seq, s.head_dim, s.causal, False))
    fwd_bytes = float(attention_bytes(*geom, False))

    def fwd(q, k, v):
        return sdpa(q, k, v, is_causal=s.causal)

    def fwd_bwd(q, k, v, grad_out):
        return torch.autograd.grad(sdpa(q, k, v, is_causal=s.causal), (q, k, v), grad_out)

    shape = f"b{s.batch} h{s.heads} s{s.seq} d{s.head_dim}" + (" causal" if s.causal else "")
    common = dict(impl="torch.sdpa", dims=dims, bottleneck="compute", shape=shape)
    return [
        dict(make=lambda: (rand(*qkv), rand(*qkv), rand(*qkv)), run=fwd, op="attn_fwd", flops=fwd_flops,
             bytes=fwd_bytes, input_bytes=3 * e * math.prod(qkv), **common),
        dict(make=lambda: (rand(*qkv, grad=True), rand(*qkv, grad=True), rand(*qkv, grad=True), rand(*qkv)),
             run=fwd_bwd, op="attn_fwd_bwd", flops=FWD_BWD_FLOP_RATIO * fwd_flops,
             bytes=fwd_bytes + float(attention_bytes(*geom, True)), input_bytes=4 * e * math.prod(qkv), **common),
    ]


def memory_bytes(op: str, rows, cols, elem_bytes: float):
    """Bytes the torch calls of memory-bound benchmark op ``op`` read and write on a [rows, cols] tensor
    (``MEMORY_BYTES_PER_ELEM`` per element, plus the norm's weight and bias vectors)."""
    return elem_bytes * (MEMORY_BYTES_PER_ELEM[op] * rows * cols + _NORM_PARAMS.get(op, 0) * cols)


def _memory_case(torch, s, rand, e: int) -> dict:
    F = torch.nn.functional
    n_elem = s.rows * s.cols
    if s.op == "rmsnorm":
        make, run, impl = (lambda: (rand(s.rows, s.cols), rand(s.cols))), \
            (lambda x, w: F.rms_norm(x, (s.cols,), w)), "torch.rms_norm"
    elif s.op == "layernorm":
        make, run, impl = (lambda: (rand(s.rows, s.cols), rand(s.cols), rand(s.cols))), \
            (lambda x, w, b: F.layer_norm(x, (s.cols,), w, b)), "torch.layer_norm"
    elif s.op == "swiglu":
        make, run, impl = (lambda: (rand(s.rows, 2 * s.cols),)), \
            (lambda x: F.silu(x[:, :s.cols]) * x[:, s.cols:]), "torch.silu*mul"
    elif s.op == "gelu":
        make, run, impl = (lambda: (rand(s.rows, s.cols),)), F.gelu, "torch.gelu"
    else:  # add
        make, run, impl = (lambda: (rand(s.rows, s.cols), rand(s.rows, s.cols))), torch.add, "torch.add"
    input_elems = {"swiglu": 2 * n_elem, "add": 2 * n_elem}.get(s.op, n_elem) + _NORM_PARAMS.get(s.op, 0) * s.cols
    return dict(make=make, run=run, op="memory", impl=impl, dims={}, flops=0.0,
                bytes=float(memory_bytes(s.op, s.rows, s.cols, e)), input_bytes=e * input_elems,
                bottleneck="memory", shape=f"{s.op} {s.rows}x{s.cols}")


def model_times(rows: pd.DataFrame, gpu) -> np.ndarray:
    """flowsim's predicted time of each kernel-DB row of the harness's kinds on ``gpu``, seconds.

    ``gemm``, ``attn_fwd`` and ``memory`` (by its bytes) rows are priced as one op each; an ``attn_fwd_bwd`` row as
    the sum of a forward and a backward op of its shape.

    Parameters
    ----------
    rows : pandas.DataFrame
        Kernel-DB rows (``DB_COLUMNS``) with op ``gemm``, ``attn_fwd``, ``attn_fwd_bwd`` or ``memory``.
    gpu : GPUSpec
        The GPU to price on.

    Returns
    -------
    float64[len(rows)]
    """
    cols = ["dtype", "m", "n", "k", "batch", "heads", "seq_q", "seq_k", "head_dim", "causal", "bytes"]
    base = rows[cols].reset_index(drop=True)
    base["bytes"] = np.where(rows.op.to_numpy() == "memory", base["bytes"], 0.0)  # others: derived from shape
    kind = rows.op.replace({"attn_fwd_bwd": "attn_fwd"}).to_numpy()
    both = rows.op.to_numpy() == "attn_fwd_bwd"
    fwd = op_times(base.assign(kind=kind), gpu)
    bwd = op_times(base[both].assign(kind="attn_bwd"), gpu)
    fwd[both] += bwd
    return fwd


def predicted_device_time_s(shapes: pd.DataFrame, gpu, repeats: int = DEFAULT_REPEATS,
                            warmup: int = DEFAULT_WARMUP) -> float:
    """flowsim's predicted GPU time of a benchmark run's launches, to size a run before starting it.

    Parameters
    ----------
    shapes : pandas.DataFrame
        Shape table (:mod:`flowsim.kernels.shapes`).
    gpu : GPUSpec
        The GPU to price on.
    repeats, warmup : int
        Launches per case, as in :func:`iter_bench`.

    Returns
    -------
    float
        Seconds of kernel time of the ``repeats + warmup`` launches of every case (:func:`model_times` of the
        rows the run would write). Host time (torch import, input creation, launch overhead) comes on top.
    """
    s = validate_shapes(shapes)
    attn = s[s.op == "attention"].rename(columns={"seq": "seq_q"}).assign(seq_k=lambda d: d.seq_q)
    mem = s[s.op.isin(MEMORY_BYTES_PER_ELEM)]
    mem_bytes = [memory_bytes(r.op, r.rows, r.cols, DTYPE_BYTES[r.dtype]) for r in mem.itertuples()]
    rows = _db_frame(pd.concat([
        s[s.op == "gemm"][["dtype", "m", "n", "k", "batch"]].assign(op="gemm"),
        attn.assign(op="attn_fwd"),
        attn.assign(op="attn_fwd_bwd"),
        pd.DataFrame({"op": "memory", "dtype": mem.dtype.to_numpy(), "bytes": mem_bytes}),
    ], ignore_index=True))
    return float(model_times(rows, gpu).sum()) * (repeats + warmup)


def _time_wall(torch, run, sets, repeats: int, flush) -> np.ndarray:
    """Seconds of each repeat by the host clock; torch returns from a CPU op only when its work (all intra-op
    threads) is done, so the two clock reads bracket the whole launch. ``flush`` (a tensor or None) is
    overwritten before each repeat, outside the clock reads."""
    out = np.empty(repeats)
    for i in range(repeats):
        args = sets[i % len(sets)]
        if flush is not None:
            flush.zero_()
        t0 = time.perf_counter()
        run(*args)
        out[i] = time.perf_counter() - t0
    return out


def _time_events(torch, run, sets, repeats: int, flush) -> np.ndarray:
    """Seconds of each repeat between CUDA events, with the launches queued behind a sleep kernel; ``flush``
    (a tensor or None) is overwritten before each repeat, outside the events."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    torch.cuda.synchronize()
    torch.cuda._sleep(QUEUE_AHEAD_CYCLES_PER_REPEAT * repeats)
    for i in range(repeats):
        if flush is not None:
            flush.zero_()
        starts[i].record()
        run(*sets[i % len(sets)])
        ends[i].record()
    torch.cuda.synchronize()
    return np.array([a.elapsed_time(b) for a, b in zip(starts, ends)]) * MS
