"""Measured kernel tables shipped in ``data/``: loaded with pandas, every row must cite its source.

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
"""
from __future__ import annotations

import functools
from pathlib import Path

import pandas as pd

from flowsim.errors import ConfigError

DATA_DIR = Path(__file__).resolve().parent / "data"
TABLES = ("gemm_mamf", "gemm_release", "gemm_latency", "flash_attention", "hbm_stream", "memory_latency")


def read_measurement_csv(path) -> pd.DataFrame:
    """Read a measurement CSV and check that every row names its source.

    Parameters
    ----------
    path : str or pathlib.Path
        CSV file with a ``source`` column.

    Returns
    -------
    pandas.DataFrame

    Raises
    ------
    ConfigError
        ``<file>: source: every row needs a source (got row N)`` for the first row without one (N counts data
        rows from 1), or when the column is absent.
    """
    path = Path(path)
    df = pd.read_csv(path, keep_default_na=False, na_values=[""])
    if "source" not in df.columns:
        raise ConfigError(f"{path.name}: source", "column is required")
    empty = df["source"].isna() | (df["source"].astype(str).str.strip() == "")
    if empty.any():
        raise ConfigError(f"{path.name}: source", "every row needs a source", f"row {int(empty.idxmax()) + 1}")
    return df


@functools.lru_cache(maxsize=None)
def load_table(name: str) -> pd.DataFrame:
    """Return one of the shipped tables (cached; treat as read-only).

    Parameters
    ----------
    name : str
        One of ``TABLES``: ``gemm_mamf``, ``gemm_release``, ``gemm_latency``, ``flash_attention``, ``hbm_stream``,
        ``memory_latency``.
    """
    if name not in TABLES:
        raise ConfigError("table", f"must be one of {', '.join(TABLES)}", name)
    return read_measurement_csv(DATA_DIR / f"{name}.csv")
