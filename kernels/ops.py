"""The op-table schema that :func:`flowsim.kernels.op_times` prices, and its validation.

One row is one kernel launch. Columns (absent numeric columns and empty (NaN) cells mean 0; absent or empty
``causal`` means False, so op tables of different kinds can be concatenated with ``pandas.concat``):

============  ========  ==============================================================================
column        type      meaning
============  ========  ==============================================================================
kind          str       ``gemm``, ``attn_fwd``, ``attn_bwd`` or ``memory`` (required)
dtype         str       ``fp32``, ``tf32``, ``bf16``, ``fp16``, ``fp8``, ``nvfp4`` or ``mxfp4`` (required;
                        block-scaled FP4 on GEMM rows only)
m, n, k       int       GEMM C[m, n] = A[m, k] B[k, n] (>= 1 on gemm rows)
batch         int       GEMM: independent GEMMs of that shape in one launch; attention: batch size
                        (0 is read as 1)
heads         int       attention query heads (>= 1 on attention rows)
kv_heads      int       attention key/value heads (GQA/MQA); 0 is read as ``heads``
seq_q, seq_k  int       attention query and key/value lengths, tokens (>= 1 on attention rows)
head_dim      int       attention head dimension (>= 1 on attention rows)
causal        bool      causal mask
flops         float     FLOP of one launch; 0 = derived from the shape (gemm: 2 m n k batch; attention:
                        flash-attention convention, see flowsim.kernels.attention); memory rows: reported only
bytes         float     HBM bytes read + written by one launch; 0 = derived from the shape (gemm: inputs
                        once, output once; attention: see flowsim.kernels.attention). Memory rows give it.
============  ========  ==============================================================================
"""
from __future__ import annotations

import numpy as np

from flowsim.errors import ConfigError

KINDS = ("gemm", "attn_fwd", "attn_bwd", "memory")
DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "nvfp4", "mxfp4")
SHAPE_COLUMNS = ("m", "n", "k", "batch", "heads", "kv_heads", "seq_q", "seq_k", "head_dim")
OP_COLUMNS = ("kind", "dtype") + SHAPE_COLUMNS + ("causal", "flops", "bytes")
"""Column names of an op table, in documentation order."""

_GEMM_DIMS = ("m", "n", "k")
_ATTN_DIMS = ("heads", "seq_q", "seq_k", "head_dim")


def validate_ops(ops) -> dict:
    """Check an op table and return its columns as numpy arrays (defaults filled in).

    Parameters
    ----------
    ops : pandas.DataFrame
        Op table (schema in this module's docstring). Extra columns are ignored.

    Returns
    -------
    dict
        ``kind``, ``dtype`` (object arrays of str), the shape columns (int64; ``batch`` 0 -> 1, ``kv_heads``
        0 -> ``heads``), ``causal`` (bool) and ``flops``, ``bytes`` (float64), each of length ``len(ops)``.

    Raises
    ------
    ConfigError
        Naming the column: a missing ``kind``/``dtype`` column, an unknown kind or dtype, a non-numeric,
        infinite, negative or fractional value, a dimension that must be >= 1 for the row's kind (an empty cell
        counts as 0), or a ``causal`` value that is not a boolean.
    """
    import pandas as pd

    if not isinstance(ops, pd.DataFrame):
        raise ConfigError("ops", "must be a pandas DataFrame", type(ops).__name__)
    n_rows = len(ops)
    out = {}
    for col, allowed in (("kind", KINDS), ("dtype", DTYPES)):
        if col not in ops.columns:
            raise ConfigError(col, "column is required in the op table")
        vals = ops[col].to_numpy(dtype=object)
        bad = ~np.isin(vals, allowed)
        if bad.any():
            raise ConfigError(col, f"must be one of {', '.join(allowed)}", _where(ops, vals, bad))
        out[col] = vals
    for col in SHAPE_COLUMNS + ("flops", "bytes"):
        out[col] = _numeric(ops, col, n_rows, integer=col in SHAPE_COLUMNS)
    out["causal"] = _boolean(ops, "causal", n_rows)
    kind = out["kind"]
    for dims, kinds in ((_GEMM_DIMS, ("gemm",)), (_ATTN_DIMS, ("attn_fwd", "attn_bwd"))):
        rows = np.isin(kind, kinds)
        for col in dims:
            bad = rows & (out[col] < 1)
            if bad.any():
                raise ConfigError(col, f"must be >= 1 for {'/'.join(kinds)} rows", _where(ops, out[col], bad))
    out["batch"] = np.where(out["batch"] == 0, 1, out["batch"])
    out["kv_heads"] = np.where(out["kv_heads"] == 0, out["heads"], out["kv_heads"])
    return out


def _numeric(ops, col: str, n_rows: int, integer: bool) -> np.ndarray:
    import pandas as pd

    if col not in ops.columns:
        return np.zeros(n_rows, dtype=np.int64 if integer else np.float64)
    raw = ops[col]
    empty = raw.isna().to_numpy()
    vals = np.where(empty, 0.0, pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64))
    for bad, rule in (
        (~np.isfinite(vals), "must be a finite number"),
        (vals < 0, "must be >= 0"),
        ((vals != np.floor(vals)) if integer else np.zeros(n_rows, bool), "must be a whole number"),
    ):
        if bad.any():
            raise ConfigError(col, rule, _where(ops, raw.to_numpy(dtype=object), bad))
    return vals.astype(np.int64) if integer else vals


def _boolean(ops, col: str, n_rows: int) -> np.ndarray:
    if col not in ops.columns:
        return np.zeros(n_rows, dtype=bool)
    if ops[col].dtype == bool:
        return ops[col].to_numpy()
    vals = np.where(ops[col].isna().to_numpy(), False, ops[col].to_numpy(dtype=object))
    bad = ~np.array([v is True or v is False or (isinstance(v, (int, np.integer, np.bool_)) and v in (0, 1))
                     for v in vals], dtype=bool)
    if bad.any():
        raise ConfigError(col, "must be true/false (or 1/0)", _where(ops, vals, bad))
    return vals.astype(bool)


def _where(ops, vals: np.ndarray, bad: np.ndarray) -> str:
    i = int(np.argmax(bad))
    value = vals[i].item() if isinstance(vals[i], np.generic) else vals[i]
    return f"{value!r} in row {ops.index[i]!r}"
