"""GEMM efficiency: a measured per-GPU ceiling times tile and wave quantisation of the shape.

Model (for C[m, n] = A[m, k] B[k, n], ``batch`` independent GEMMs per launch). A library kernel cuts C into
output tiles of ``tm x tn`` and walks K in steps of ``TILE_K``; optionally it splits K into ``s`` slices
(split-K) whose fp32 partial sums are reduced afterwards. Each (tile, slice, batch) work unit runs on one SM,
``sm_count`` units at a time. The fraction of the machine doing useful work is

    shape_eff = 2 m n k batch / (waves * sm_count * 2 tm tn ceil(ceil(k / s) / TILE_K) TILE_K)
    waves     = ceil(ceil(m / tm) ceil(n / tn) s batch / sm_count)

(tile quantisation pads m, n and k up to whole tiles; wave quantisation pads the work units up to whole waves).
Split-K (only when the output tiles do not fill one wave) adds ``8 s m n batch`` bytes of HBM traffic (fp32
partials written once and read once; 0 for s = 1).
As a cuBLAS-style heuristic would, the model tries every tile shape in ``TILES_MN`` and split in ``SPLIT_K`` and
keeps the fastest under the roofline. The compute efficiency is ``ceiling * shape_eff``.

A GEMM launch also pays a fixed latency (pipeline fill, epilogue, launch ramp) that does not overlap its work:
``time = latency + max(compute, memory)``. The latency is the time of the shortest GEMM in a profiler trace of
that GPU (table ``gemm_latency``) minus that GEMM's ideal work time ``max(flops / peak, bytes / hbm_Bps)`` at 100%
of peak and bandwidth: an upper bound on the fixed cost. The ceiling is then calibrated so that
the GPU's measured best shape (table ``gemm_mamf``) reproduces its measured MAMF exactly:
``ceiling = flops / ((flops / MAMF - latency) * peak * shape_eff(best shape))``.

There is no separate small-K factor: no measurement here isolates pipeline-fill cost (B300 reaches 79% of peak
at K = 1024), so small-K and skinny GEMMs lose through K-tile padding, wave quantisation and the memory roofline.
"""
from __future__ import annotations

import functools

import numpy as np

from flowsim.gpu_specs import GPUSpec, get_gpu
from flowsim.kernels.reference import Candidate, Reference, choose_reference
from flowsim.kernels.tables import load_table
from flowsim.units import DTYPE_BYTES, TFLOP, US

# Output-tile shapes (tm, tn): the 128/256-wide tensor-core tiles of CUTLASS's SM80/SM90 kernel generator
# (NVIDIA/cutlass python/cutlass_library/generator.py, TileDescription lists of GenerateSM80_TensorOp_16816 and
# GenerateSM90_TensorOp_16b_WGMMA), which cuBLAS's kernels mirror; 64-row tiles serve m <= 64.
TILES_MN = np.array([(256, 128), (128, 256), (128, 128), (128, 64), (64, 128), (64, 256)], dtype=np.int64)
# K step of one main-loop iteration, in elements (the K extent of the same CUTLASS tile descriptions).
TILE_K = 64
# Split-K factors searched (a search space, not a fitted value). Assumption: like cuBLAS's heuristics, the model
# splits K only when the output tiles (times batch) do not fill one wave of SMs; 16 slices bound the search.
SPLIT_K = np.array([1, 2, 4, 8, 16], dtype=np.int64)
# Bytes of split-K partial sums per output element per slice: one fp32 write plus one fp32 read.
SPLIT_K_PARTIAL_BYTES = 8.0


# Element size of a GEMM output: fp8 GEMMs write bf16 (torch._scaled_mm's usual output); others their input dtype.
_GEMM_OUT_DTYPE = {"fp8": "bf16"}


def gemm_bytes(m, n, k, batch, dtype: str) -> np.ndarray:
    """HBM bytes of a GEMM launch when each operand is read once and C written once, float64.

    ``batch * (e_in (m k + k n) + e_out m n)`` with ``e`` from ``flowsim.units.DTYPE_BYTES`` (fp8 writes bf16).
    """
    m, n, k, batch = (np.asarray(a, dtype=np.float64) for a in (m, n, k, batch))
    e_out = DTYPE_BYTES[_GEMM_OUT_DTYPE.get(dtype, dtype)]
    return batch * (DTYPE_BYTES[dtype] * (m * k + k * n) + e_out * m * n)


def gemm_candidates(m, n, k, batch, sm_count: int):
    """Shape efficiency and extra bytes of every (tile, split-K) candidate.

    Parameters
    ----------
    m, n, k, batch : int64[n_ops]
        GEMM dimensions (>= 1).
    sm_count : int
        SMs (or CUs) that run work units concurrently.

    Returns
    -------
    shape_eff : float64[n_ops, n_candidates]
        Useful FLOP / issued FLOP, in (0, 1] (formula in the module docstring); 0 for an invalid candidate
        (split-K with more slices than K steps, or when the output tiles already fill a wave).
    extra_bytes : float64[n_ops, n_candidates]
        Split-K partial-sum traffic, bytes.
    """
    m, n, k, batch = (np.asarray(a, dtype=np.int64)[:, None, None] for a in (m, n, k, batch))
    tm = TILES_MN[None, :, 0, None]
    tn = TILES_MN[None, :, 1, None]
    s = SPLIT_K[None, None, :]
    k_iters = -(-(-(-k // s)) // TILE_K)  # ceil(ceil(k / s) / TILE_K)
    units = (-(-m // tm)) * (-(-n // tn)) * s * batch
    waves = -(-units // sm_count)
    issued = waves.astype(np.float64) * sm_count * tm * tn * k_iters * TILE_K
    eff = (m * n * k * batch).astype(np.float64) / issued
    few_tiles = (-(-m // tm)) * (-(-n // tn)) * batch < sm_count
    valid = (s == 1) | (few_tiles & (k >= s * TILE_K))
    eff = np.where(valid, eff, 0.0)
    extra = np.where(s > 1, SPLIT_K_PARTIAL_BYTES * s * m * n * batch, 0).astype(np.float64)
    n_ops = eff.shape[0]
    return eff.reshape(n_ops, -1), np.broadcast_to(extra, eff.shape).reshape(n_ops, -1)


def best_shape_efficiency(m, n, k, batch, sm_count: int) -> np.ndarray:
    """Largest shape efficiency over the candidates (compute only, no memory term), float64[n_ops]."""
    return gemm_candidates(m, n, k, batch, sm_count)[0].max(axis=1)


def mamf_dtype(dtype: str) -> str:
    """Measurement dtype standing for ``dtype``: ``fp8`` for fp8, else ``bf16``.

    fp16, tf32 and fp32 GEMMs have no MAMF row; they take the bf16 ceiling of the same GPU (assumption).
    """
    return "fp8" if dtype == "fp8" else "bf16"


@functools.lru_cache(maxsize=None)
def gemm_reference(gpu: GPUSpec, dtype: str) -> Reference:
    """The measured GPU whose MAMF ceiling prices ``dtype`` GEMMs on ``gpu`` (see flowsim.kernels.reference)."""
    mdt = mamf_dtype(dtype)
    rows = load_table("gemm_mamf")
    keys = sorted(rows.loc[rows["dtype"] == mdt, "gpu"])
    cands = [Candidate.of_gpu(get_gpu(k_), get_gpu(k_).peak(mdt)) for k_ in keys]
    return choose_reference(gpu, gpu.peak(dtype), cands, "gemm_mamf", mdt)


@functools.lru_cache(maxsize=None)
def latency_reference(gpu: GPUSpec) -> Reference:
    """The measured GPU whose GEMM launch latency applies to ``gpu`` (similarity: bf16/fp16 peak)."""
    keys = sorted(load_table("gemm_latency")["gpu"])
    cands = [Candidate.of_gpu(get_gpu(k), _half_peak(get_gpu(k))) for k in keys]
    return choose_reference(gpu, _half_peak(gpu), cands, "gemm_latency", "-")


def _half_peak(gpu: GPUSpec) -> float:
    return gpu.peak_flop_per_s.get("bf16") or gpu.peak("fp16")


@functools.lru_cache(maxsize=None)
def gemm_latency_s(measured_key: str) -> float:
    """Fixed GEMM launch latency of a measured GPU (derivation in the module docstring), seconds."""
    t = load_table("gemm_latency")
    r = t[t["gpu"] == measured_key].iloc[0]
    gpu = get_gpu(measured_key)
    dtype = r["dtype"]  # not r.dtype: that is the Series dtype
    ideal = max(2.0 * r.m * r.n * r.k * r.batch / gpu.peak(dtype),
                float(gemm_bytes(r.m, r.n, r.k, r.batch, dtype)) / gpu.hbm_Bps)
    return float(r.time_us * US - ideal)


@functools.lru_cache(maxsize=None)
def mamf_ceiling(measured_key: str, mdt: str) -> float:
    """Calibrated efficiency ceiling of a measured GPU (formula in the module docstring), dimensionless."""
    rows = load_table("gemm_mamf")
    row = rows[(rows["gpu"] == measured_key) & (rows["dtype"] == mdt)].iloc[0]
    ref = get_gpu(measured_key)
    shape = best_shape_efficiency([row.best_m], [row.best_n], [row.best_k], [1], ref.sm_count)[0]
    flops = 2.0 * row.best_m * row.best_n * row.best_k
    latency = gemm_latency_s(latency_reference(ref).measured)
    return float(flops / ((flops / (row.mamf_tflops * TFLOP) - latency) * ref.peak(mdt) * shape))
