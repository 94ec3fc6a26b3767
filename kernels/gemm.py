"""GEMM efficiency: a measured per-GPU ceiling times tile and wave quantisation of the shape.

Model (for C[m, n] = A[m, k] B[k, n], ``batch`` independent GEMMs per launch). A library kernel cuts C into
output tiles of ``tm x tn`` and walks K in steps of ``TILE_K``; optionally it splits K into ``s`` slices
(split-K) whose fp32 partial sums are reduced afterwards. Each (tile, slice, batch) work unit runs on ``c`` SMs
(``c = 1``; ``c = 2`` for Blackwell's 2-CTA MMA, where an SM pair computes one ``tm x tn`` tile, ``tm / 2`` rows
each), ``sm_count / c`` units at a time. The fraction of the machine doing useful work is

    shape_eff = 2 m n k batch / (waves * sm_count * 2 (tm / c) tn ceil(ceil(k / s) / TILE_K) TILE_K)
    waves     = ceil(ceil(m / tm) ceil(n / tn) s batch / floor(sm_count / c))

(tile quantisation pads m, n and k up to whole tiles; wave quantisation pads the work units up to whole waves).
Split-K (only when the output tiles do not fill one wave) adds ``8 s m n batch`` bytes of HBM traffic (fp32
partials written once and read once; 0 for s = 1).
As a cuBLAS-style heuristic would, the model tries every tile shape of the GPU's generation (``TILES_SM90`` up to
Hopper, ``TILES_SM100`` on Blackwell; :func:`tiles_for`) and split in ``SPLIT_K`` and keeps the fastest under the
roofline. The compute efficiency is ``ceiling * shape_eff``.

A GEMM launch also pays a fixed latency (pipeline fill, epilogue, launch ramp) that does not overlap its work:
``time = latency + max(compute, memory)``. The latency is the time of the shortest GEMM in a profiler trace of
that GPU (table ``gemm_latency``) minus that GEMM's ideal work time ``max(flops / peak, bytes / hbm_Bps)`` at 100%
of peak and bandwidth: an upper bound on the fixed cost. The ceiling is then calibrated so that
the GPU's measured best shape (table ``gemm_mamf``) reproduces its measured MAMF exactly:
``ceiling = flops / ((flops / MAMF - latency) * peak * shape_eff(best shape))``.

Ceilings by software release: every measured large GEMM (``gemm_mamf`` rows, whose stack is their torch
version, and the dated ``gemm_release`` rows of other benchmarks) gives a ceiling by the same formula; a job on
release R takes the row of the nearest older release on the reference GPU (nearest newer when none is older),
the default stack the newest row (:func:`gemm_ceiling`; releases in :mod:`flowsim.kernels.stack`). Each row also
says how long it kept the GPU busy (``load``: ``burst`` or ``sustained``); a training step caps a burst ceiling by
the sustained one (:mod:`flowsim.kernels.sustained`).

There is no separate small-K factor: no measurement here isolates pipeline-fill cost (B300 reaches 79% of peak
at K = 1024), so small-K and skinny GEMMs lose through K-tile padding, wave quantisation and the memory roofline.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from flowsim.errors import ConfigError
from flowsim.gpu_specs import GPUSpec, get_gpu
from flowsim.kernels.reference import Candidate, Reference, choose_reference
from flowsim.kernels.stack import releases
from flowsim.kernels.tables import Table, table
from flowsim.units import DTYPE_BYTES, TFLOP, US

# Output-tile shapes (tm, tn, SMs per tile): the 128/256-wide tensor-core tiles of CUTLASS's SM80/SM90 kernel
# generator (NVIDIA/cutlass python/cutlass_library/generator.py, TileDescription lists of
# GenerateSM80_TensorOp_16816 and GenerateSM90_TensorOp_16b_WGMMA), which cuBLAS's kernels mirror; 64-row tiles
# serve m <= 64. One SM per tile.
TILES_SM90 = np.array([(256, 128, 1), (128, 256, 1), (128, 128, 1), (128, 64, 1), (64, 128, 1), (64, 256, 1)],
                      dtype=np.int64)
TILES_MN = TILES_SM90[:, :2]
# Blackwell (SM100) tcgen05 UMMA tiles of CUTLASS's generator (GenerateSM100_TensorOp_16b_UMMA): 1-SM MMA with
# M = 64 or 128 and N = 64..256, and 2-SM ("2-CTA") MMA with M = 256 split over an SM pair (128 rows each),
# N = 64..256; the cluster shape only multicasts operands and does not change the tile.
TILES_SM100 = np.array([(128, 256, 1), (128, 128, 1), (128, 64, 1), (64, 128, 1), (64, 256, 1),
                        (256, 256, 2), (256, 128, 2), (256, 64, 2)], dtype=np.int64)
# First compute capability (x10) with SM100 tiles: Blackwell data-centre parts (B200/GB200 100, B300/GB300 103).
SM100_CC = 100
# K step of one main-loop iteration, in elements (the K extent of the same CUTLASS tile descriptions).
TILE_K = 64
# Split-K factors searched (a search space, not a fitted value). Assumption: like cuBLAS's heuristics, the model
# splits K only when the output tiles (times batch) do not fill one wave of SMs; 16 slices bound the search.
SPLIT_K = np.array([1, 2, 4, 8, 16], dtype=np.int64)
# Bytes of split-K partial sums per output element per slice: one fp32 write plus one fp32 read.
SPLIT_K_PARTIAL_BYTES = 8.0


LOADS = ("burst", "sustained")
"""Values of the ``load`` column of the GEMM tables: how long a measurement kept the GPU busy
(:mod:`flowsim.kernels.sustained`)."""


# Element size of a GEMM output: fp8 and block-scaled fp4 GEMMs write bf16 (torch._scaled_mm's usual output, TE's
# FP8/NVFP4 GEMMs); others their input dtype.
_GEMM_OUT_DTYPE = {"fp8": "bf16", "nvfp4": "bf16", "mxfp4": "bf16"}


def gemm_bytes(m, n, k, batch, dtype: str) -> np.ndarray:
    """HBM bytes of a GEMM launch when each operand is read once and C written once, float64.

    ``batch * (e_in (m k + k n) + e_out m n)`` with ``e`` from ``flowsim.units.DTYPE_BYTES`` (fp8 writes bf16).
    """
    m, n, k, batch = (np.asarray(a, dtype=np.float64) for a in (m, n, k, batch))
    e_out = DTYPE_BYTES[_GEMM_OUT_DTYPE.get(dtype, dtype)]
    return batch * (DTYPE_BYTES[dtype] * (m * k + k * n) + e_out * m * n)


def tiles_for(gpu: GPUSpec) -> np.ndarray:
    """Tile table of ``gpu``'s generation: ``TILES_SM100`` for NVIDIA compute capability >= 10.0, else
    ``TILES_SM90`` (int64[n_tiles, 3]: tm, tn, SMs per tile)."""
    return TILES_SM100 if gpu.vendor == "nvidia" and gpu.compute_capability >= SM100_CC else TILES_SM90


def gemm_candidates(m, n, k, batch, sm_count: int, tiles: np.ndarray = TILES_SM90):
    """Shape efficiency and extra bytes of every (tile, split-K) candidate.

    Parameters
    ----------
    m, n, k, batch : int64[n_ops]
        GEMM dimensions (>= 1).
    sm_count : int
        SMs (or CUs) that run work units concurrently.
    tiles : int64[n_tiles, 3]
        Candidate tiles (tm, tn, SMs per tile), :func:`tiles_for` the GPU; default ``TILES_SM90``.

    Returns
    -------
    shape_eff : float64[n_ops, n_candidates]
        Useful FLOP / issued FLOP, in (0, 1] (formula in the module docstring); 0 for an invalid candidate
        (split-K with more slices than K steps, or when the output tiles already fill a wave).
    extra_bytes : float64[n_ops, n_candidates]
        Split-K partial-sum traffic, bytes.
    """
    m, n, k, batch = (np.asarray(a, dtype=np.int64)[:, None, None] for a in (m, n, k, batch))
    tm = tiles[None, :, 0, None]
    tn = tiles[None, :, 1, None]
    c = tiles[None, :, 2, None]
    slots = np.maximum(sm_count // c, 1)  # work units running at once
    s = SPLIT_K[None, None, :]
    k_iters = -(-(-(-k // s)) // TILE_K)  # ceil(ceil(k / s) / TILE_K)
    units = (-(-m // tm)) * (-(-n // tn)) * s * batch
    waves = -(-units // slots)
    issued = waves.astype(np.float64) * sm_count * (tm / c) * tn * k_iters * TILE_K
    eff = (m * n * k * batch).astype(np.float64) / issued
    few_tiles = (-(-m // tm)) * (-(-n // tn)) * batch < slots
    valid = (s == 1) | (few_tiles & (k >= s * TILE_K))
    eff = np.where(valid, eff, 0.0)
    extra = np.where(s > 1, SPLIT_K_PARTIAL_BYTES * s * m * n * batch, 0).astype(np.float64)
    n_ops = eff.shape[0]
    return eff.reshape(n_ops, -1), np.broadcast_to(extra, eff.shape).reshape(n_ops, -1)


def best_shape_efficiency(m, n, k, batch, sm_count: int, tiles: np.ndarray = TILES_SM90) -> np.ndarray:
    """Largest shape efficiency over the candidates (compute only, no memory term), float64[n_ops]."""
    return gemm_candidates(m, n, k, batch, sm_count, tiles)[0].max(axis=1)


def mamf_dtype(dtype: str) -> str:
    """Measurement dtype standing for ``dtype``: ``fp8`` for fp8, ``fp4`` for nvfp4/mxfp4, else ``bf16``.

    fp16, tf32 and fp32 GEMMs take the 16-bit ceiling of the same GPU (assumption; fp16 measurements count as
    16-bit rows); both FP4 formats take the FP4 rows (the GEMM runs on the same FP4 tensor cores; the block
    scales differ).
    """
    return {"fp8": "fp8", "nvfp4": "fp4", "mxfp4": "fp4", "fp4": "fp4"}.get(dtype, "bf16")


def peak_dtype(dtype: str) -> str:
    """Key of ``GPUSpec.peak_flop_per_s`` that prices ``dtype`` GEMMs: ``fp4`` for nvfp4/mxfp4, else ``dtype``."""
    return "fp4" if dtype in ("nvfp4", "mxfp4") else dtype


@functools.lru_cache(maxsize=None)
def ceiling_rows() -> Table:
    """Every measured GEMM that sets a ceiling: ``gemm_mamf`` rows and the fastest ``gemm_release`` shape of each
    (gpu, dtype, release; the first such row on a tie), in one table: the MAMF rows in file order, then the
    release rows by (gpu, dtype, release).

    Columns: gpu, mdt (measurement dtype, :func:`mamf_dtype`), tflops, m, n, k, release (a key of
    ``software_releases``; a MAMF row's stack is ``pytorch-<torch_version>``), load (``burst`` or ``sustained``,
    :mod:`flowsim.kernels.sustained`), date (``YYYY-MM``), table.

    Raises
    ------
    ConfigError
        A row whose release is not in ``software_releases``, or whose load is not one of ``LOADS``.
    """
    mamf = table("gemm_mamf")
    extra = table("gemm_release")
    fastest = {}  # (gpu, dtype, release) -> row of its fastest shape
    for i, key in enumerate(zip(extra.gpu, extra["dtype"], extra.release)):
        if key not in fastest or extra.tflops[i] > extra.tflops[fastest[key]]:
            fastest[key] = i
    extra = extra[np.array([fastest[key] for key in sorted(fastest)], dtype=np.int64)]
    parts = [
        {"gpu": mamf.gpu, "mdt": [mamf_dtype(d) for d in mamf["dtype"]], "tflops": mamf.mamf_tflops,
         "m": mamf.best_m, "n": mamf.best_n, "k": mamf.best_k,
         "release": ["pytorch-" + str(v) for v in mamf.torch_version], "load": mamf["load"],
         "table": ["gemm_mamf"] * len(mamf)},
        {"gpu": extra.gpu, "mdt": [mamf_dtype(d) for d in extra["dtype"]], "tflops": extra.tflops,
         "m": extra.m, "n": extra.n, "k": extra.k, "release": extra.release, "load": extra["load"],
         "table": ["gemm_release"] * len(extra)},
    ]
    rows = Table({c: np.concatenate([np.asarray(p[c], dtype=object if c in _TEXT else None) for p in parts])
                  for c in parts[0]}, "ceiling_rows")
    for load, tab in zip(rows["load"], rows.table):
        if load not in LOADS:
            raise ConfigError(f"{tab}: load", f"must be one of {', '.join(LOADS)}", load)
    rel = releases()
    for rel_key, tab in zip(rows.release, rows.table):
        if rel_key not in rel:
            raise ConfigError(f"{tab}: release", "must be a key of software_releases.csv", rel_key)
    return rows.with_columns(date=np.array([rel[k].date for k in rows.release], dtype=object))


_TEXT = ("gpu", "mdt", "release", "load", "table")


@functools.lru_cache(maxsize=None)
def gemm_reference(gpu: GPUSpec, dtype: str) -> Reference:
    """The measured GPU whose GEMM ceiling prices ``dtype`` GEMMs on ``gpu`` (see flowsim.kernels.reference)."""
    mdt = mamf_dtype(dtype)
    rows = ceiling_rows()
    keys = sorted(set(rows.gpu[rows.mdt == mdt]))
    cands = [Candidate.of_gpu(get_gpu(k_), get_gpu(k_).peak(mdt)) for k_ in keys]
    table = "gemm_mamf" if mdt in ("bf16", "fp8") else "gemm_release"
    return choose_reference(gpu, gpu.peak(peak_dtype(dtype)), cands, table, mdt)


@dataclass(frozen=True)
class Ceiling:
    """A GEMM ceiling and the measurement it comes from.

    Attributes
    ----------
    value : float
        Efficiency ceiling of the measured GPU (formula in the module docstring), dimensionless.
    release : str
        Release (stack) of the measurement used.
    date : str
        Its date, ``YYYY-MM``.
    fallback : str
        ``""`` when the measurement is of the requested release (or the default stack was asked for), else
        ``"older"`` or ``"newer"``: the nearest measured release on that side was used.
    load : str
        How long the measurement loaded the GPU: ``burst`` or ``sustained`` (:mod:`flowsim.kernels.sustained`).
    """

    value: float
    release: str
    date: str
    fallback: str = ""
    load: str = "burst"


@functools.lru_cache(maxsize=None)
def gemm_ceiling(measured_key: str, mdt: str, release: str = "") -> Ceiling:
    """Ceiling of a measured GPU for measurement dtype ``mdt`` on software ``release`` (``""``: newest row).

    Parameters
    ----------
    measured_key : str
        A GPU with rows in :func:`ceiling_rows` for ``mdt``.
    mdt : str
        ``bf16``, ``fp8`` or ``fp4``.
    release : str
        Release key (:mod:`flowsim.kernels.stack`); the row of that release if measured, else of the nearest
        older release, else of the nearest newer one.
    """
    rows = ceiling_rows()
    rows = rows[(rows.gpu == measured_key) & (rows.mdt == mdt)].sort("date", "table")
    fallback = ""
    if not release:
        i = len(rows) - 1
    elif (rows.release == release).any():
        i = int(np.flatnonzero(rows.release == release)[-1])
    else:
        older = np.flatnonzero(rows.date <= releases()[release].date)
        i, fallback = (int(older[-1]), "older") if older.size else (0, "newer")
    value = measured_ceiling(measured_key, mdt, rows.m[i], rows.n[i], rows.k[i], rows.tflops[i])
    return Ceiling(value, rows.release[i], rows.date[i], fallback, rows["load"][i])


def measured_ceiling(measured_key: str, mdt: str, m: int, n: int, k: int, tflops: float) -> float:
    """Ceiling that makes the model reproduce ``tflops`` (TFLOP/s) measured at shape (m, n, k) on the measured GPU
    ``measured_key`` in measurement dtype ``mdt`` (formula in the module docstring), dimensionless."""
    ref = get_gpu(measured_key)
    shape = best_shape_efficiency([m], [n], [k], [1], ref.sm_count, tiles_for(ref))[0]
    flops = 2.0 * m * n * k
    latency = gemm_latency_s(latency_reference(ref).measured)
    return float(flops / ((flops / (tflops * TFLOP) - latency) * ref.peak(mdt) * shape))


@functools.lru_cache(maxsize=None)
def latency_reference(gpu: GPUSpec) -> Reference:
    """The measured GPU whose GEMM launch latency applies to ``gpu`` (similarity: bf16/fp16 peak)."""
    keys = sorted(table("gemm_latency").gpu)
    cands = [Candidate.of_gpu(get_gpu(k), _half_peak(get_gpu(k))) for k in keys]
    return choose_reference(gpu, _half_peak(gpu), cands, "gemm_latency", "-")


def _half_peak(gpu: GPUSpec) -> float:
    return gpu.peak_flop_per_s.get("bf16") or gpu.peak("fp16")


@functools.lru_cache(maxsize=None)
def gemm_latency_s(measured_key: str) -> float:
    """Fixed GEMM launch latency of a measured GPU (derivation in the module docstring), seconds."""
    t = table("gemm_latency")
    r = t[t.gpu == measured_key].rows()[0]
    gpu = get_gpu(measured_key)
    m, n, k, batch, dtype = r["m"], r["n"], r["k"], r["batch"], r["dtype"]
    ideal = max(2.0 * m * n * k * batch / gpu.peak(dtype), float(gemm_bytes(m, n, k, batch, dtype)) / gpu.hbm_Bps)
    return float(r["time_us"] * US - ideal)


@functools.lru_cache(maxsize=None)
def mamf_ceiling(measured_key: str, mdt: str) -> float:
    """Ceiling from a measured GPU's ``gemm_mamf`` row (formula in the module docstring), dimensionless."""
    rows = table("gemm_mamf")
    row = rows[(rows.gpu == measured_key) & (rows["dtype"] == mdt)].rows()[0]
    return measured_ceiling(measured_key, mdt, row["best_m"], row["best_n"], row["best_k"], row["mamf_tflops"])
