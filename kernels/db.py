"""The kernel database: measured kernel timings in one documented schema, seeded from the shipped tables.

Schema (one row per measured kernel configuration; ``DB_COLUMNS``):

===================  =======  ===================================================================================
column               unit     meaning
===================  =======  ===================================================================================
op                   -        ``gemm``, ``attn_fwd``, ``attn_fwd_bwd`` (forward + backward measured together)
                              or ``memory``
impl                 -        kernel family: ``torch.mm`` (cuBLAS/hipBLASLt), ``fa2``, ``fa3``, ``stream_<kernel>``
gpu                  -        flowsim GPU key, or the device name for a device flowsim does not list
dtype                -        ``bf16``, ``fp8``, ``fp16`` (FlashAttention tables: FP16/BF16), ``fp32`` (stream)
m, n, k              -        GEMM shape (C[m, n] = A[m, k] B[k, n]); 0 for other ops
batch, heads         -        attention batch and heads (0 for other ops)
seq_q, seq_k         tokens   attention sequence lengths
head_dim             -        attention head dimension
causal               -        causal mask (bool)
flops                FLOP     FLOP of one launch (flash-attention convention for attention, 3.5x fwd for fwd_bwd)
bytes                bytes    HBM bytes of one launch as flowsim models them (empty when the size is unknown)
time_s               s        time of one launch (empty when the source reports only a rate)
achieved_flop_per_s  FLOP/s   flops / time_s as measured
achieved_Bps         bytes/s  bytes / time_s, or the measured bandwidth for stream rows
bottleneck           -        ``compute`` (MAMF, attention), ``memory`` (stream) or ``latency`` (shortest traced GEMMs)
source               -        where the figure comes from (required)
date                 -        measurement or snapshot date when the source gives one, else empty
stack                -        software release the row was measured on (a ``software_releases`` key, see
                              flowsim.kernels.stack), empty when the source does not state it; optional in
                              files read by :func:`read_db`
===================  =======  ===================================================================================

The seed rows are built from ``data/gemm_mamf.csv``, ``data/gemm_release.csv``, ``data/gemm_latency.csv``,
``data/flash_attention.csv`` and ``data/hbm_stream.csv``;
more rows in this schema (measured elsewhere) can be read with :func:`read_db` and appended.
"""
from __future__ import annotations

import functools

import numpy as np
import pandas as pd

from flowsim.errors import ConfigError
from flowsim.kernels.attention import FWD_BWD_FLOP_RATIO, attention_bytes, attention_flops
from flowsim.kernels.gemm import gemm_bytes
from flowsim.kernels.stack import releases
from flowsim.kernels.tables import load_table, read_measurement_csv
from flowsim.units import GB, TFLOP, US

DB_COLUMNS = (
    "op", "impl", "gpu", "dtype", "m", "n", "k", "batch", "heads", "seq_q", "seq_k", "head_dim", "causal",
    "flops", "bytes", "time_s", "achieved_flop_per_s", "achieved_Bps", "bottleneck", "source", "date", "stack",
)
_OPTIONAL_COLUMNS = ("stack",)
DB_OPS = ("gemm", "attn_fwd", "attn_fwd_bwd", "memory")
# Snapshot month of te42kyfo/gpu-benches used for the stream rows (shared/data/kernel_measurements.md section 4).
STREAM_SNAPSHOT_DATE = "2024-06"
STREAM_KERNELS = ("init", "read", "scale", "triad")


@functools.lru_cache(maxsize=None)
def seed_db() -> pd.DataFrame:
    """The kernel database built from the shipped measurement tables (schema in the module docstring)."""
    parts = [_gemm_rows(), _release_gemm_rows(), _latency_rows(), _attention_rows(), _stream_rows()]
    db = pd.concat(parts, ignore_index=True)
    return _normalise(db)


def read_db(path) -> pd.DataFrame:
    """Read extra kernel-DB rows from a CSV in the DB schema; every row needs ``source``, ``op`` must be known.

    Raises
    ------
    ConfigError
        Missing source (``<file>: source``), missing column or unknown op.
    """
    df = read_measurement_csv(path).frame()
    missing = [c for c in DB_COLUMNS if c not in df.columns and c not in _OPTIONAL_COLUMNS]
    if missing:
        raise ConfigError(f"{path}: {missing[0]}", "column is required in a kernel-DB file")
    bad = ~df["op"].isin(DB_OPS)
    if bad.any():
        raise ConfigError(f"{path}: op", f"must be one of {', '.join(DB_OPS)}", df["op"][bad].iloc[0])
    return _normalise(df)


def _normalise(db: pd.DataFrame) -> pd.DataFrame:
    for c in ("m", "n", "k", "batch", "heads", "seq_q", "seq_k", "head_dim"):
        db[c] = db[c].fillna(0).astype(np.int64)
    db["causal"] = db["causal"].fillna(False).astype(bool)
    for c in ("date", "stack"):
        db[c] = ["" if pd.isna(d) else str(d) for d in db[c]] if c in db.columns else ""
    return db[list(DB_COLUMNS)]


def _gemm_rows() -> pd.DataFrame:
    t = load_table("gemm_mamf")
    flops = 2.0 * t.best_m * t.best_n * t.best_k
    rate = t.mamf_tflops * TFLOP
    nbytes = np.array([gemm_bytes(r.best_m, r.best_n, r.best_k, 1, r.dtype) for r in t.itertuples()])
    return pd.DataFrame(
        {
            "op": "gemm", "impl": "torch.mm", "gpu": t.gpu, "dtype": t.dtype, "m": t.best_m, "n": t.best_n,
            "k": t.best_k, "flops": flops, "bytes": nbytes, "time_s": flops / rate, "achieved_flop_per_s": rate,
            "achieved_Bps": nbytes * rate / flops, "bottleneck": "compute", "source": t.source, "date": "",
            "stack": "pytorch-" + t.torch_version.astype(str),
        }
    )


def _release_gemm_rows() -> pd.DataFrame:
    t = load_table("gemm_release")
    flops = 2.0 * t.m * t.n * t.k
    rate = t.tflops * TFLOP
    nbytes = np.array([gemm_bytes(r.m, r.n, r.k, 1, r["dtype"]) for _, r in t.iterrows()])
    return pd.DataFrame(
        {
            "op": "gemm", "impl": "cublaslt", "gpu": t.gpu, "dtype": t["dtype"], "m": t.m, "n": t.n, "k": t.k,
            "flops": flops, "bytes": nbytes, "time_s": flops / rate, "achieved_flop_per_s": rate,
            "achieved_Bps": nbytes * rate / flops, "bottleneck": "compute", "source": t.source,
            "date": [releases()[k].date for k in t.release], "stack": t.release,
        }
    )


def _latency_rows() -> pd.DataFrame:
    t = load_table("gemm_latency")
    flops = 2.0 * t.m * t.n * t.k * t.batch
    time_s = t.time_us * US
    nbytes = np.array([gemm_bytes(r.m, r.n, r.k, r.batch, r["dtype"]) for _, r in t.iterrows()])
    return pd.DataFrame(
        {
            "op": "gemm", "impl": t.kernel, "gpu": t.gpu, "dtype": t["dtype"], "m": t.m, "n": t.n, "k": t.k,
            "batch": t.batch, "flops": flops, "bytes": nbytes, "time_s": time_s, "achieved_flop_per_s": flops / time_s,
            "achieved_Bps": nbytes / time_s, "bottleneck": "latency", "source": t.source, "date": "",
        }
    )


def _attention_rows() -> pd.DataFrame:
    t = load_table("flash_attention")
    fwd_flops = attention_flops(t.batch, t.heads, t.seq_len, t.seq_len, t.head_dim, t.causal.astype(bool), False)
    both = (t["pass"] == "fwd_bwd").to_numpy()
    flops = fwd_flops * np.where(both, FWD_BWD_FLOP_RATIO, 1.0)
    shape = (t.batch, t.heads, t.heads, t.seq_len, t.seq_len, t.head_dim, 2)  # 2-byte elements (FP16/BF16)
    nbytes = attention_bytes(*shape, False) + np.where(both, attention_bytes(*shape, True), 0.0)
    rate = t.tflops * TFLOP
    return pd.DataFrame(
        {
            "op": np.where(both, "attn_fwd_bwd", "attn_fwd"), "impl": t.impl, "gpu": t.gpu, "dtype": "fp16",
            "batch": t.batch, "heads": t.heads, "seq_q": t.seq_len, "seq_k": t.seq_len, "head_dim": t.head_dim,
            "causal": t.causal.astype(bool), "flops": flops, "bytes": nbytes, "time_s": flops / rate,
            "achieved_flop_per_s": rate, "achieved_Bps": nbytes * rate / flops, "bottleneck": "compute",
            "source": t.source, "date": [releases()[k].date for k in t["stack"]], "stack": t["stack"],
        }
    )


def _stream_rows() -> pd.DataFrame:
    t = load_table("hbm_stream")
    rows = []
    for kern in STREAM_KERNELS:
        rows.append(
            pd.DataFrame(
                {
                    "op": "memory", "impl": f"stream_{kern}", "gpu": np.where(t.gpu.fillna("") != "", t.gpu, t.device),
                    "dtype": "fp32", "flops": 0.0, "bytes": np.nan, "time_s": np.nan, "achieved_flop_per_s": np.nan,
                    "achieved_Bps": t[f"{kern}_GBps"] * GB, "bottleneck": "memory", "source": t.source,
                    "date": STREAM_SNAPSHOT_DATE,
                }
            )
        )
    return pd.concat(rows, ignore_index=True)
