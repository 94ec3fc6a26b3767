"""Measured kernel tables shipped in ``data/``: read with the csv module, every row must cite its source.

Tables (one CSV each; units in the column names):

``gemm_mamf``
    Maximum achievable matmul FLOP/s per GPU and dtype at the best shape of a brute-force search.
    Columns: gpu, dtype, mamf_tflops, theory_tflops, best_m, best_n, best_k, torch_version, load (``burst``:
    how long the measurement kept the GPU busy, :mod:`flowsim.kernels.sustained`), source.
``gemm_release``
    GEMMs of several shapes measured by other benchmarks on a named software stack (dated in
    ``software_releases``, see :mod:`flowsim.kernels.stack`). The fastest shape of each (gpu, dtype, release)
    sets that release's ceiling, as MAMF's best shape does; the other shapes check the tile model
    (:mod:`flowsim.kernels.accuracy`). Columns: gpu, dtype, tflops, m, n, k, release, data (input
    initialisation: ``random``), load (``sustained``: after 10,000 warm-up launches,
    :mod:`flowsim.kernels.sustained`), source.
``gemm_latency``
    The shortest GEMM launch (time and shape) in a profiler trace of each GPU, from which the fixed GEMM latency
    is derived. Columns: gpu, time_us, kernel, dtype, m, n, k, batch, source.
``memory_latency``
    The fixed time of a memory-bound launch per GPU, derived from the memory-bound kernels of a profiler trace
    (:func:`flowsim.kernels.ingest.memory_latency_fit`). Columns: gpu, latency_us, kernels, source.
``flash_attention``
    Fused-attention throughput by implementation (``fa2``, ``fa3``, ``cudnn``), pass (``fwd`` or ``fwd_bwd``),
    causal flag, head dim and sequence length (batch = 16384 / seq_len, heads = 2048 / head_dim), with the
    benchmark stack it was measured on (a ``software_releases`` key). Columns: gpu, impl, pass, causal,
    head_dim, seq_len, batch, heads, tflops, stack, source.
``hbm_stream``
    Stream-like device-memory bandwidth (init, read, scale, triad) per device with the datasheet figure it is
    measured against. Columns: device, gpu (a flowsim key, or empty for devices flowsim does not list), arch,
    vendor, init_GBps, read_GBps, scale_GBps, triad_GBps, spec_GBps, source.

A table is parsed once per process into a :class:`Table` (numpy columns, typed as pandas' ``read_csv`` types
them: int64, float64, bool or str; tests/test_kernel_tables.py compares every cell), so pricing a step imports no
pandas; :meth:`Table.frame` is the DataFrame view for the tools that want one (:func:`load_table`).
"""
from __future__ import annotations

import csv
import functools
import re
from pathlib import Path

import numpy as np

from flowsim.errors import ConfigError

DATA_DIR = Path(__file__).resolve().parent / "data"
TABLES = ("gemm_mamf", "gemm_release", "gemm_latency", "flash_attention", "hbm_stream", "memory_latency")

# What pandas' C parser reads as a number or a boolean (an empty cell is missing: ``na_values=[""]``,
# ``keep_default_na=False``); blanks around a number are allowed, as there.
_INT = re.compile(r"^\s*[+-]?\d+\s*$")
_FLOAT = re.compile(r"^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$|^\s*[+-]?(inf|infinity)\s*$", re.IGNORECASE)
_TRUE, _FALSE = ("True", "TRUE", "true"), ("False", "FALSE", "false")


def _column(cells: list) -> np.ndarray:
    """One column's cells (str) as pandas' ``read_csv`` types them: int64 (whole numbers, none missing), float64
    (numbers; a missing cell is NaN), bool (True/False, none missing), else an object array of str with NaN for
    missing cells."""
    present = [c for c in cells if c != ""]
    missing = len(present) < len(cells)
    if not present:
        return np.full(len(cells), np.nan)
    if not missing and all(_INT.match(c) for c in present):
        return np.array([int(c) for c in cells], dtype=np.int64)
    if all(_FLOAT.match(c) for c in present):
        return np.array([float(c) if c != "" else np.nan for c in cells], dtype=np.float64)
    if not missing and all(c in _TRUE or c in _FALSE for c in present):
        return np.array([c in _TRUE for c in cells], dtype=bool)
    return np.array([c if c != "" else np.nan for c in cells], dtype=object)


class Table:
    """A parsed table: equal-length numpy columns by name, in file order (read-only; treat as immutable).

    ``t["gpu"]`` or ``t.gpu`` is a column, ``t[mask]`` the rows where a boolean array is true (a new Table),
    ``len(t)`` the row count, :meth:`rows` the rows as dicts; :meth:`frame` is the pandas view.
    """

    def __init__(self, columns: dict, name: str = ""):
        self.columns = {k: np.asarray(v) for k, v in columns.items()}
        for v in self.columns.values():
            v.flags.writeable = False
        self.name = name
        lengths = {len(v) for v in self.columns.values()}
        assert len(lengths) <= 1, f"{name}: columns of unequal length"
        self._len = lengths.pop() if lengths else 0

    def __len__(self) -> int:
        return self._len

    def __contains__(self, column) -> bool:
        return column in self.columns

    def __getitem__(self, key):
        if isinstance(key, str):
            return self.columns[key]
        return Table({k: v[key] for k, v in self.columns.items()}, self.name)

    def __getattr__(self, column):
        try:
            return self.__dict__["columns"][column]
        except KeyError:
            raise AttributeError(column) from None

    def rows(self) -> list:
        """Every row as a dict of column -> cell (numpy scalars as numpy gives them)."""
        cols = list(self.columns.items())
        return [{k: v[i] for k, v in cols} for i in range(self._len)]

    def sort(self, *by: str) -> "Table":
        """Rows sorted by the columns ``by`` (first the most significant), stably."""
        return self[np.lexsort(tuple(self.columns[c] for c in reversed(by)))]

    def with_columns(self, **columns) -> "Table":
        """A copy with columns added or replaced."""
        return Table({**self.columns, **columns}, self.name)

    def frame(self):
        """The table as a pandas DataFrame (a copy; pandas is imported here)."""
        import pandas as pd

        return pd.DataFrame({k: v.copy() for k, v in self.columns.items()})


def read_measurement_csv(path) -> Table:
    """Read a measurement CSV and check that every row names its source.

    Parameters
    ----------
    path : str or pathlib.Path
        CSV file with a header row and a ``source`` column.

    Returns
    -------
    Table
        Its columns, typed as pandas' ``read_csv(keep_default_na=False, na_values=[""])`` types them.

    Raises
    ------
    ConfigError
        ``<file>: source: every row needs a source (got row N)`` for the first row without one (N counts data
        rows from 1), when the column is absent, or for a row with more cells than the header.
    """
    path = Path(path)
    with open(path, newline="", encoding="utf-8") as f:
        lines = list(csv.reader(f))
    header, body = (lines[0], lines[1:]) if lines else ([], [])
    body = [r for r in body if r]  # blank lines are skipped, as pandas does
    for i, r in enumerate(body):
        if len(r) > len(header):
            raise ConfigError(f"{path.name}: row {i + 1}", f"has {len(r)} cells, the header {len(header)}")
    body = [r + [""] * (len(header) - len(r)) for r in body]
    table = Table({h: _column([r[j] for r in body]) for j, h in enumerate(header)}, path.name)
    if "source" not in table:
        raise ConfigError(f"{path.name}: source", "column is required")
    empty = np.array([not isinstance(s, str) or not s.strip() for s in table["source"]], dtype=bool)
    if empty.any():
        raise ConfigError(f"{path.name}: source", "every row needs a source", f"row {int(empty.argmax()) + 1}")
    return table


@functools.lru_cache(maxsize=None)
def table(name: str) -> Table:
    """One of the shipped tables, parsed once per process (treat as read-only).

    Parameters
    ----------
    name : str
        One of ``TABLES``: ``gemm_mamf``, ``gemm_release``, ``gemm_latency``, ``flash_attention``, ``hbm_stream``,
        ``memory_latency``.
    """
    if name not in TABLES:
        raise ConfigError("table", f"must be one of {', '.join(TABLES)}", name)
    return read_measurement_csv(DATA_DIR / f"{name}.csv")


def load_table(name: str):
    """One of the shipped tables as a pandas DataFrame (a view of :func:`table`'s columns, for the kernel tools
    and tests; imports pandas)."""
    return table(name).frame()
