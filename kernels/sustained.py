"""GEMMs under sustained load: the clock a GPU holds at its power limit, against a short benchmark's.

A training step runs GEMMs back to back for seconds to minutes, so the GPU settles at its board power limit and
its clock drops to what that power sustains. The GEMM measurements differ in how long they load the GPU (column
``load`` of tables ``gemm_mamf`` and ``gemm_release``):

``burst``
    ml-engineering's MAMF: a mean of 100 launches after 50 warm-up launches per shape (tens of milliseconds for
    the best shapes, e.g. B200 1792x16128x3072: 0.18 TFLOP, ~0.1 ms a launch), the best of a search over many
    shapes (kernel_measurements.md s1).
``sustained``
    Azure's cuBLASLt GEMMs: 10,000 warm-up launches before the timed ones, random inputs, unpinned clocks
    (kernel_measurements_additions.md s1, "10,000 warmup iterations"; 16384^3 FP8 on GB200 is 3 ms a launch,
    so the warm-up alone is half a minute of full load).

On a GPU measured both ways (same dtype), the sustained fraction is the ratio of the two ceilings
(:func:`flowsim.kernels.gemm.gemm_ceiling`'s formula, which takes out each shape's tile, wave and latency terms)::

    s = ceiling(best sustained shape) / ceiling(burst best shape)

Measured: A100 SXM 0.929 (FP16 vs BF16, same peak), H100 SXM 0.940 and H200 0.881 (FP8), GB200 0.752 (FP8): the
1200 W Blackwell part loses four times what the 700 W Hopper parts lose. Same-CUDA pairs show it is the load, not
the software: H100 Azure CUDA 12.6 vs MAMF cu126 (0.940); GB200 Azure CUDA 12.8 reaches 2,907 FP8 TFLOP/s while a
1000 W B200 on cu128 bursts to 3,432 in MAMF.

The sustained GEMM ceiling of a GPU (a fraction of its own peak) is then, with R the GPU measured both ways that
stands for it (:mod:`flowsim.kernels.reference`: same architecture, closest 16-bit peak, then board power):

- R itself: its best sustained measurement in that dtype, else ``s_R`` times its burst ceiling (the clock
  fraction carries across dtypes: both saturate the tensor cores at the same clock);
- another GPU X of R's architecture: the sustained clock follows the power per SM by the cube law of
  :mod:`flowsim.kernels.power` (``P ~ f^3`` under DVFS; same die, same work per clock per SM), and the spec clock
  is the 16-bit peak per SM, so ::

      c_X = c_R * (f_R / f_X) * ((P_X / n_X) / (P_R / n_R)) ** (1/3),   f = peak_bf16 / n

  with ``n`` the SM count and ``P`` the board power in force (X: its power limit,
  :func:`flowsim.kernels.power.power_limit_w`, else its board power; R: its board power, as measured);
- a GPU of another architecture of R's vendor: ``s_R`` times its own burst ceiling; no GPU of its vendor
  measured both ways: no sustained ceiling (only the power derate applies).

A job under sustained load (:class:`flowsim.kernels.stack.KernelStack` ``sustained``, every training step) takes
``min(burst ceiling of its release, sustained ceiling)`` when its release's ceiling is a burst measurement; a
release can run below the power limit but not above it. Checks: B200 (1000 W, 148 SMs) from GB200 (1200 W):
``c = 0.584 x (2500/2250) x (1000/1200)^(1/3) = 0.611``, 2,747 FP8 TFLOP/s against 2,907 x (1000/1200)^(1/3) =
2,736 from GB200's sustained rate by the power law alone, and against the B200's own 3,432 in MAMF's burst. The
GB300 (1400 W, same peaks and SMs) sustains (1400/1200)^(1/3) = 1.053x GB200's rate; the 500 W Grand Teton H100
(500/700)^(1/3) = 0.894x the H100's.

Attention kernels keep their tables: they run the tensor cores at 15-55 % of peak (softmax and exponentials on the
SFUs between the MMAs), far from the power limit, and the long-sequence runs priced with them (90 % attention) agree
within 2 % on H100 (docs/CALIBRATION.md).
"""
from __future__ import annotations

import functools

import numpy as np

from flowsim.gpu_specs import GPUSpec, get_gpu
from flowsim.kernels.gemm import LOADS, ceiling_rows, gemm_reference, mamf_dtype, measured_ceiling
from flowsim.kernels.power import POWER_EXPONENT, power_limit_w
from flowsim.kernels.reference import Candidate, Reference, choose_reference
from flowsim.kernels.tables import Table


@functools.lru_cache(maxsize=None)
def sustained_pairs() -> Table:
    """Every (GPU, dtype) measured under both loads, with its sustained fraction, by (gpu, mdt).

    Returns
    -------
    Table
        Columns ``gpu``, ``mdt`` (measurement dtype), ``burst_release`` and ``sustained_release`` (the rows'
        stacks), ``burst_ceiling`` and ``sustained_ceiling`` (dimensionless, the highest of each load),
        ``fraction`` = sustained / burst.
    """
    rows = ceiling_rows()
    ceiling = np.array([measured_ceiling(g, d, m, n, k, f) for g, d, m, n, k, f in
                        zip(rows.gpu, rows.mdt, rows.m, rows.n, rows.k, rows.tflops)])
    out = []
    for gpu, mdt in sorted(set(zip(rows.gpu, rows.mdt))):
        best = {}
        for load in LOADS:
            sel = np.flatnonzero((rows.gpu == gpu) & (rows.mdt == mdt) & (rows["load"] == load))
            if sel.size:
                i = sel[np.argsort(ceiling[sel], kind="stable")[-1]]
                best[load] = (rows.release[i], ceiling[i])
        if len(best) == len(LOADS):
            (b_rel, b), (s_rel, s_) = best["burst"], best["sustained"]
            out.append((gpu, mdt, b_rel, s_rel, b, s_, s_ / b))
    names = ("gpu", "mdt", "burst_release", "sustained_release", "burst_ceiling", "sustained_ceiling", "fraction")
    return Table({c: np.array([r[j] for r in out], dtype=object if j < 4 else np.float64)
                  for j, c in enumerate(names)}, "sustained_pairs")


def measured_fraction(measured_key: str) -> float:
    """Sustained fraction of a GPU of :func:`sustained_pairs` (the geometric mean of its dtypes' pairs)."""
    pairs = sustained_pairs()
    f = pairs.fraction[pairs.gpu == measured_key]
    return float(np.exp(np.log(f).mean()))


def _half_peak(gpu: GPUSpec) -> float:
    return gpu.peak_flop_per_s.get("bf16") or gpu.peak("fp16")


@functools.lru_cache(maxsize=None)
def sustained_reference(gpu: GPUSpec, exclude: str = "") -> Reference | None:
    """The GPU measured under both loads whose sustained fraction applies to ``gpu`` (similarity: the 16-bit
    peak, then board power), leaving out the GPU ``exclude`` (leave-one-out checks); ``None`` when its vendor
    has no such GPU."""
    pairs = sustained_pairs()
    cands = [Candidate.of_gpu(get_gpu(k), _half_peak(get_gpu(k))) for k in sorted(set(pairs["gpu"]) - {exclude})]
    cands = [c for c in cands if c.vendor == gpu.vendor]
    if not cands:
        return None
    return choose_reference(gpu, _half_peak(gpu), cands, "gemm sustained/burst", "-")


@functools.lru_cache(maxsize=None)
def _best_ceiling(measured_key: str, mdt: str, load: str) -> float | None:
    """Highest ceiling of ``measured_key``'s ``mdt`` rows measured under ``load``; None without such a row."""
    rows = ceiling_rows()
    rows = rows[(rows.gpu == measured_key) & (rows.mdt == mdt) & (rows["load"] == load)]
    return max((measured_ceiling(measured_key, mdt, m, n, k, f) for m, n, k, f in
                zip(rows.m, rows.n, rows.k, rows.tflops)), default=None)


@functools.lru_cache(maxsize=None)
def sustained_ceiling(gpu: GPUSpec, dtype: str, limit_w: float = 0.0, exclude: str = "") -> float | None:
    """GEMM ceiling of ``gpu`` for ``dtype`` under continuous load at the power limit in force (formula in the
    module docstring), as a fraction of ``gpu``'s own peak for ``dtype``.

    Parameters
    ----------
    gpu : GPUSpec
        The GPU being priced.
    dtype : str
        GEMM input dtype (``bf16``, ``fp8``, ``nvfp4``, ...; :func:`flowsim.kernels.gemm.mamf_dtype` gives the
        measurement dtype).
    limit_w : float
        Power limit in W; 0 = the GPU's own (:func:`flowsim.kernels.power.power_limit_w`, else its board power).
    exclude : str
        A GPU whose measurements are left out (``flowsim kernels accuracy`` predicts each measured GPU from the
        others); ``""`` = none.

    Returns
    -------
    float or None
        ``None`` when no GPU of ``gpu``'s vendor was measured under both loads (then only the power derate of
        :func:`flowsim.kernels.power.clock_fraction` applies).
    """
    ref = sustained_reference(gpu, exclude)
    if ref is None:
        return None
    measured = get_gpu(ref.measured)
    s = measured_fraction(ref.measured)
    if measured.arch != gpu.arch:  # another generation: its clock fraction only
        return s * _best_ceiling(gemm_reference(gpu, dtype).measured, mamf_dtype(dtype), "burst")
    c = _best_ceiling(ref.measured, mamf_dtype(dtype), "sustained")
    if c is None:  # the clock fraction on the best burst ceiling (of the GPU that prices the dtype on R)
        c = s * _best_ceiling(gemm_reference(measured, dtype).measured, mamf_dtype(dtype), "burst")
    cap = power_limit_w(gpu, limit_w)
    p_x = cap if cap > 0 else gpu.tdp_w  # NaN (no limit set) compares False
    clock_ratio = (_half_peak(measured) / measured.sm_count) / (_half_peak(gpu) / gpu.sm_count)
    power_ratio = (p_x / gpu.sm_count) / (measured.tdp_w / measured.sm_count)
    return c * clock_ratio * power_ratio ** POWER_EXPONENT
