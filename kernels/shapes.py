"""Shape lists for the kernel benchmark harness (:mod:`flowsim.kernels.bench`): which launches to time.

A shape table has one row per benchmark case (``SHAPE_COLUMNS``):

==========  =====  =================================================================================
column      type   meaning
==========  =====  =================================================================================
op          str    benchmark op, one of ``BENCH_OPS`` (required)
dtype       str    ``bf16``, ``fp16`` or ``fp32`` (``BENCH_DTYPES``); empty = the harness default
m, n, k     int    ``gemm``: C[m, n] = A[m, k] B[k, n] (>= 1)
batch       int    ``gemm``: independent GEMMs per launch (``torch.bmm``); ``attention``: batch size;
                   0 or empty is read as 1
heads       int    ``attention``: heads (>= 1; K and V have as many heads as Q, see below)
seq         int    ``attention``: query and key length, tokens (>= 1)
head_dim    int    ``attention``: head dimension (>= 1)
causal      bool   ``attention``: causal mask
rows, cols  int    memory-bound ops: the [rows, cols] tensor they read (>= 1; ``swiglu`` reads
                   [rows, 2 cols] and writes [rows, cols])
origin      str    where the shape comes from (``llama3-8b tp4: qkv.dgrad``, ``sweep``); free text
==========  =====  =================================================================================

Benchmark ops: ``gemm``; ``attention`` (timed forward, and forward + backward); memory-bound ``rmsnorm``,
``layernorm``, ``swiglu``, ``gelu``, ``add`` (the residual add). ``--ops`` also takes the groups ``norm``
(rmsnorm, layernorm), ``activation`` (swiglu, gelu), ``elementwise`` (add) and ``all``.

The default shape list (flowsim's own workload shapes and sweeps) is built above the kernels layer, by
:func:`flowsim.explore.kernel_shapes.default_shapes`.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from flowsim.errors import ConfigError

BENCH_OPS = ("gemm", "attention", "rmsnorm", "layernorm", "swiglu", "gelu", "add")
MEMORY_OPS = ("rmsnorm", "layernorm", "swiglu", "gelu", "add")
OP_GROUPS = {
    "norm": ("rmsnorm", "layernorm"),
    "activation": ("swiglu", "gelu"),
    "elementwise": ("add",),
    "all": BENCH_OPS,
}
BENCH_DTYPES = ("bf16", "fp16", "fp32")
SHAPE_COLUMNS = ("op", "dtype", "m", "n", "k", "batch", "heads", "seq", "head_dim", "causal", "rows", "cols",
                 "origin")
_INT_COLUMNS = ("m", "n", "k", "batch", "heads", "seq", "head_dim", "rows", "cols")
_REQUIRED_DIMS = {"gemm": ("m", "n", "k"), "attention": ("heads", "seq", "head_dim"),
                  **{op: ("rows", "cols") for op in MEMORY_OPS}}

def parse_ops(spec: str) -> tuple:
    """``"gemm,norm"`` -> ``("gemm", "rmsnorm", "layernorm")``: benchmark ops in ``BENCH_OPS`` order.

    Raises
    ------
    ConfigError
        ``ops`` for an empty list or an unknown name.
    """
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise ConfigError("ops", "give at least one op", repr(spec))
    chosen = set()
    for name in names:
        if name in OP_GROUPS:
            chosen.update(OP_GROUPS[name])
        elif name in BENCH_OPS:
            chosen.add(name)
        else:
            raise ConfigError("ops", f"must be among {', '.join(BENCH_OPS + tuple(OP_GROUPS))}", name)
    return tuple(op for op in BENCH_OPS if op in chosen)


def read_shapes(path, default_dtype: str = "bf16") -> pd.DataFrame:
    """Read a shape table from CSV (columns ``SHAPE_COLUMNS``; only ``op`` and the op's dims are required).

    Raises
    ------
    ConfigError
        ``shapes`` if the file cannot be read as CSV; see :func:`validate_shapes` for the rest.
    """
    try:
        df = pd.read_csv(path, keep_default_na=False, na_values=[""])
    except (OSError, ValueError) as e:
        raise ConfigError("shapes", f"cannot read a shape CSV ({type(e).__name__})", str(path)) from None
    return validate_shapes(df, default_dtype)


def validate_shapes(df: pd.DataFrame, default_dtype: str = "bf16") -> pd.DataFrame:
    """Check a shape table and fill its defaults.

    Parameters
    ----------
    df : pandas.DataFrame
        Shape table (module docstring); absent columns are filled (dims 0, ``causal`` False, ``origin`` empty).
    default_dtype : str
        Dtype of rows whose ``dtype`` is absent or empty.

    Returns
    -------
    pandas.DataFrame
        Columns ``SHAPE_COLUMNS``; int64 dims with ``batch`` 0 -> 1, bool ``causal``.

    Raises
    ------
    ConfigError
        Naming the column and row: a missing ``op`` column, an unknown op or dtype, a dim that is not a whole
        number, is negative or is < 1 where the op needs it, or a ``causal`` value that is not true/false.
    """
    if "op" not in df.columns:
        raise ConfigError("op", "column is required in a shape table")
    if default_dtype not in BENCH_DTYPES:
        raise ConfigError("dtype", f"must be one of {', '.join(BENCH_DTYPES)}", default_dtype)
    out = pd.DataFrame(index=df.index)
    out["op"] = df["op"].astype(str)
    bad = ~out["op"].isin(BENCH_OPS)
    if bad.any():
        raise ConfigError("op", f"must be one of {', '.join(BENCH_OPS)}", _where(df, "op", bad))
    dtype = df["dtype"] if "dtype" in df.columns else pd.Series(np.nan, index=df.index)
    out["dtype"] = dtype.where(dtype.notna(), default_dtype).astype(str)
    bad = ~out["dtype"].isin(BENCH_DTYPES)
    if bad.any():
        raise ConfigError("dtype", f"must be one of {', '.join(BENCH_DTYPES)}", _where(out, "dtype", bad))
    for col in _INT_COLUMNS:
        raw = df[col] if col in df.columns else pd.Series(0, index=df.index)
        vals = pd.to_numeric(raw, errors="coerce").where(raw.notna(), 0).to_numpy(dtype=np.float64)
        bad = ~np.isfinite(vals) | (vals != np.floor(vals))
        if bad.any():
            raise ConfigError(col, "must be a whole number", _where(df, col, bad))
        if (vals < 0).any():
            raise ConfigError(col, "must be >= 0", _where(df, col, vals < 0))
        out[col] = vals.astype(np.int64)
    for op, dims in _REQUIRED_DIMS.items():
        for col in dims:
            bad = (out["op"] == op) & (out[col] < 1)
            if bad.any():
                raise ConfigError(col, f"must be >= 1 for {op} rows", _where(out, col, bad))
    out["batch"] = out["batch"].where(out["batch"] >= 1, 1)
    out["causal"] = _causal(df)
    out["origin"] = df["origin"].fillna("").astype(str) if "origin" in df.columns else ""
    return out[list(SHAPE_COLUMNS)]


def _causal(df: pd.DataFrame) -> np.ndarray:
    if "causal" not in df.columns:
        return np.zeros(len(df), dtype=bool)
    words = {"true": True, "1": True, "1.0": True, "false": False, "0": False, "0.0": False, "": False, "nan": False}
    vals = [words.get(str(v).strip().lower()) for v in df["causal"]]
    bad = np.array([v is None for v in vals])
    if bad.any():
        raise ConfigError("causal", "must be true/false (or 1/0)", _where(df, "causal", bad))
    return np.array(vals, dtype=bool)


def _where(df: pd.DataFrame, col: str, bad) -> str:
    i = int(np.argmax(np.asarray(bad)))
    value = df[col].iloc[i]
    value = value.item() if isinstance(value, np.generic) else value
    return f"{value!r} in row {df.index[i]!r}"
