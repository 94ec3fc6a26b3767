"""Fused-attention efficiency, interpolated from the measured FlashAttention-2/3 and cuDNN tables.

FLOP convention (flash-attention ``benchmarks/benchmark_flash_attention.py``): the forward pass of one
attention is ``f = 4 * batch * heads * seq_q * seq_k * head_dim``, halved when causal; the backward pass is
``2.5 f`` and forward+backward ``3.5 f``. A table figure T (TFLOP/s) therefore means time = FLOP / T.

Implementations (``IMPLS``): ``fa2`` (FlashAttention-2, also what PyTorch SDPA's flash backend runs), ``fa3``
(FlashAttention-3, Hopper only) and ``cudnn`` (cuDNN fused attention, what Transformer Engine runs on Hopper and
Blackwell: :func:`flowsim.kernels.stack.attention_kernel`). Per measured GPU, implementation, pass (``fwd``,
``bwd``) and causal flag the model holds a grid of efficiencies ``T / peak_fp16`` over head dim x sequence
length, from the ``flash_attention`` table:

- ``fwd``: the forward table where one exists (H100: FA2, FA3 and cuDNN, from the FlashAttention-3 figure);
  otherwise (A100) the fwd+bwd throughput (assumption: both passes run at the combined rate).
- ``bwd``: derived from fwd+bwd and fwd throughputs: ``T_bwd = 2.5 / (3.5 / T_fwd_bwd - 1 / T_fwd)``
  (time of fwd+bwd minus time of fwd); where no forward figure exists, the fwd+bwd throughput.
- ``fa3`` and ``cudnn`` have no backward measurement: their ``bwd`` grid is the ``fa2`` one (assumption).
- A GPU measured at a few points only (GB200 FA2: one fwd+bwd figure, Azure) is an *anchor*: its grids are those
  of the fully measured GPU the cross-GPU rule picks for it (:mod:`flowsim.kernels.reference`), times the
  geometric mean over its points of measured / that grid's fwd+bwd efficiency (the shape over head dim and
  sequence length is borrowed, the level is its own). FlashAttention-2 on GB200 reaches 374 TFLOP/s, 0.15 of
  its peak, against 0.34 for the same point on H100: FA2's SM80 code path does not use Blackwell's tcgen05
  tensor cores.

A GPU with no rows of an implementation takes the grids of the measured GPU the cross-GPU rule picks among
those that have them (Blackwell ``cudnn``: H100's cuDNN figures scaled by the peak ratio, the FA3-class
assumption that a warp-specialised, asynchronous kernel keeps the same fraction of the tensor-core peak on
the next generation; no Blackwell cuDNN or FlashAttention-4 measurement is in the shared data).

An op's efficiency is interpolated linearly in log2(seq_k) within each measured head dim, then linearly in
head dim; outside the measured range (512..16384 tokens, head dims 64..128 or 64..256) the nearest edge value
is held. The measured configurations keep batch * heads * seq large (16k tokens, hidden 2048), so the grids
describe a full GPU; small problems are not penalised further.
"""
from __future__ import annotations

import functools

import numpy as np

from flowsim.gpu_specs import GPUSpec, get_gpu
from flowsim.kernels.reference import Candidate, Reference, choose_reference
from flowsim.kernels.tables import table
from flowsim.units import TFLOP

IMPLS = ("fa2", "fa3", "cudnn")
# flash-attention benchmarks/benchmark_flash_attention.py: bwd = 2.5 x fwd FLOPs, fwd+bwd = 3.5 x fwd FLOPs.
BWD_FLOP_RATIO = 2.5
FWD_BWD_FLOP_RATIO = 3.5
# Dtype of the measurements (FP16/BF16, same peak on every listed GPU); fp8 attention is priced at this rate.
MEASURED_DTYPE = "fp16"


def attention_flops(batch, heads, seq_q, seq_k, head_dim, causal, backward):
    """FLOP of one attention pass in the flash-attention benchmark convention (module docstring), float64."""
    f = 4.0 * np.asarray(batch) * heads * seq_q * seq_k * head_dim / np.where(causal, 2.0, 1.0)
    return f * np.where(backward, BWD_FLOP_RATIO, 1.0)


def attention_bytes(batch, heads, kv_heads, seq_q, seq_k, head_dim, elem_bytes, backward):
    """HBM bytes of one FlashAttention pass, float64.

    Forward reads Q, K, V and writes O: ``e (2 b h s_q d + 2 b h_kv s_k d)``. Backward reads Q, O, dO, K, V and
    writes dQ, dK, dV: ``e (4 b h s_q d + 4 b h_kv s_k d)``. The fp32 softmax statistics (b h s_q) are ignored.
    """
    q = np.asarray(batch, dtype=np.float64) * heads * seq_q * head_dim
    kv = np.asarray(batch, dtype=np.float64) * kv_heads * seq_k * head_dim
    return elem_bytes * (q + kv) * np.where(backward, 4.0, 2.0)


@functools.lru_cache(maxsize=None)
def attention_reference(gpu: GPUSpec, impl: str = "fa2") -> Reference:
    """The measured GPU whose ``impl`` attention tables price attention on ``gpu`` (the GPUs measured with
    ``impl``, anchors included, picked by the cross-GPU rule)."""
    t = table("flash_attention")
    return _choose(gpu, sorted(set(t.gpu[t.impl == impl])))


def _choose(gpu: GPUSpec, keys: list) -> Reference:
    cands = [Candidate.of_gpu(get_gpu(k), get_gpu(k).peak(MEASURED_DTYPE)) for k in keys]
    return choose_reference(gpu, fp16_peak(gpu), cands, "flash_attention", MEASURED_DTYPE)


def _full_grid_gpus(impl: str) -> list:
    """GPUs with ``impl`` rows for both causal flags (a full grid, not an anchor)."""
    t = table("flash_attention")
    t = t[t.impl == impl]
    return sorted(k for k in set(t.gpu) if set(t.causal[t.gpu == k]) == {0, 1})


def fp16_peak(gpu: GPUSpec) -> float:
    """Peak FLOP/s of the measured attention dtype on ``gpu`` (fp16, or bf16 where fp16 is not listed)."""
    return gpu.peak(MEASURED_DTYPE) if MEASURED_DTYPE in gpu.peak_flop_per_s else gpu.peak("bf16")


@functools.lru_cache(maxsize=None)
def efficiency_grid(measured_key: str, impl: str, pass_: str, causal: bool):
    """Efficiency grid of one measured GPU (construction in the module docstring).

    Returns
    -------
    head_dims : float64[n_hd]
    log2_seq : float64[n_seq]
    eff : float64[n_hd, n_seq]
        Achieved / fp16 peak of the measured GPU.
    """
    if measured_key not in _full_grid_gpus(impl):
        base = _choose(get_gpu(measured_key), _full_grid_gpus(impl)).measured
        head_dims, log2_seq, eff = efficiency_grid(base, impl, pass_, causal)
        return head_dims, log2_seq, eff * anchor_scale(measured_key, base, impl)
    t = table("flash_attention")
    t = t[(t.gpu == measured_key) & (t.causal == int(causal))]
    peak_tflops = get_gpu(measured_key).peak(MEASURED_DTYPE) / TFLOP

    def grid_of(impl_, pass__):
        sub = t[(t.impl == impl_) & (t["pass"] == pass__)]
        return _pivot(sub.head_dim, sub.seq_len, sub.tflops)

    fwd_bwd = grid_of("fa2", "fwd_bwd")
    if pass_ == "fwd":
        fwd = grid_of(impl, "fwd")
        assert impl == "fa2" or fwd[2].size, "fa3 and cudnn are priced from GPUs with their forward rows"
        head_dims, seqs, tflops = fwd if fwd[2].size else fwd_bwd
    else:  # FA3 and cuDNN have no backward measurement: every implementation uses FA2's backward
        fwd = grid_of("fa2", "fwd")
        head_dims, seqs, tflops = fwd_bwd
        tflops = tflops.copy()
        rows = np.flatnonzero(np.isin(head_dims, fwd[0]))  # head dims measured both ways
        if rows.size:
            fwd_rows = np.searchsorted(fwd[0], head_dims[rows])
            fwd_cols = np.minimum(np.searchsorted(fwd[1], seqs), fwd[1].size - 1)
            # a sequence length without a forward figure has no backward one (NaN), as column alignment gives
            has_fwd = fwd[1][fwd_cols] == seqs
            f = np.full((rows.size, seqs.size), np.nan)
            f[:, has_fwd] = fwd[2][fwd_rows[:, None], fwd_cols[has_fwd][None, :]]
            tflops[rows] = BWD_FLOP_RATIO / (FWD_BWD_FLOP_RATIO / tflops[rows] - 1.0 / f)
    return head_dims.astype(float), np.log2(seqs.astype(float)), tflops / peak_tflops


def _pivot(head_dim, seq_len, tflops):
    """(sorted head dims, sorted sequence lengths, float64[n_hd, n_seq] TFLOP/s with NaN where not measured)
    of one measured grid; a (head dim, sequence length) measured twice is an error."""
    head_dims, rows = np.unique(head_dim, return_inverse=True)
    seqs, cols = np.unique(seq_len, return_inverse=True)
    grid = np.full((head_dims.size, seqs.size), np.nan)
    if np.unique(rows * seqs.size + cols).size < rows.size:
        raise ValueError("flash_attention: a (head_dim, seq_len) cell is measured twice")
    grid[rows, cols] = tflops
    return head_dims, seqs, grid


def interpolate_efficiency(grid, head_dim, seq_k) -> np.ndarray:
    """Efficiency at each (head_dim, seq_k) from ``efficiency_grid`` output, edge values held outside.

    Parameters
    ----------
    grid : tuple
        ``(head_dims, log2_seq, eff)`` from :func:`efficiency_grid`.
    head_dim, seq_k : float64[n_ops]
        Head dimension and key/value sequence length (>= 1).

    Returns
    -------
    float64[n_ops]
    """
    head_dims, log2_seq, eff = grid
    x = np.log2(np.asarray(seq_k, dtype=np.float64))
    per_hd = np.stack([np.interp(x, log2_seq, row) for row in eff])  # [n_hd, n_ops]
    hd = np.clip(np.asarray(head_dim, dtype=np.float64), head_dims[0], head_dims[-1])
    hi = np.clip(np.searchsorted(head_dims, hd), 1, max(len(head_dims) - 1, 1))
    if len(head_dims) == 1:
        return per_hd[0]
    lo = hi - 1
    w = (hd - head_dims[lo]) / (head_dims[hi] - head_dims[lo])
    cols = np.arange(x.size)
    return per_hd[lo, cols] * (1 - w) + per_hd[hi, cols] * w


@functools.lru_cache(maxsize=None)
def anchor_scale(anchor_key: str, base_key: str, impl: str) -> float:
    """Level of an anchor GPU's ``impl`` attention over its base GPU's: geometric mean over the anchor's
    (fwd+bwd) rows of measured efficiency / the base's fwd+bwd efficiency at the same head dim, sequence length
    and mask (module docstring)."""
    t = table("flash_attention")
    own = t[(t.gpu == anchor_key) & (t.impl == impl)]
    assert (own["pass"] == "fwd_bwd").all(), "anchor rows are fwd+bwd figures"
    base = t[(t.gpu == base_key) & (t.impl == impl) & (t["pass"] == "fwd_bwd")]
    peak_own = get_gpu(anchor_key).peak(MEASURED_DTYPE) / TFLOP
    peak_base = get_gpu(base_key).peak(MEASURED_DTYPE) / TFLOP
    ratios = []
    for causal, head_dim, seq_len, tflops in zip(own.causal, own.head_dim, own.seq_len, own.tflops):
        sub = base[base.causal == causal]
        head_dims, seqs, grid = _pivot(sub.head_dim, sub.seq_len, sub.tflops)
        eff = interpolate_efficiency((head_dims.astype(float), np.log2(seqs.astype(float)), grid / peak_base),
                                     [head_dim], [seq_len])[0]
        ratios.append((tflops / peak_own) / eff)
    return float(np.exp(np.mean(np.log(ratios))))
