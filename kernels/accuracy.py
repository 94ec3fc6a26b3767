"""Leave-one-out accuracy of the kernel model against its own measurements.

Each measured figure is predicted with that figure removed, in two modes:

``same_gpu``
    From the GPU's other measurements. GEMM: the MAMF of one dtype from the GPU's ceiling for the other dtype
    (GPUs with both bf16 and fp8 rows). Attention: each point of a sequence-length series from its neighbours
    (interpolation in log2(seq), the nearest value held at the ends; single anchor points are not predicted).
``shape``
    GEMM only: every non-ceiling shape of table ``gemm_release`` from the ceiling of its own GPU and release
    (the fastest shape measured on that stack): the tile, wave and latency model against measured shapes.
``sustained``
    GEMM only: every GPU's best sustained-load measurement (Azure, :mod:`flowsim.kernels.sustained`) from the other
    GPUs measured both ways, by the sustained-load transfer (same architecture: their sustained ceiling moved by
    clock and power per SM; another architecture: their sustained fraction on the GPU's own burst ceiling).
``cross_gpu``
    From other GPUs only, by the reference rule of :mod:`flowsim.kernels.reference`. GEMM: the ceiling of the
    most similar other GPU, times the target's peak and shape efficiency. Attention: A100 fwd+bwd from H100's
    efficiency table and the reverse. Memory: each device's stream efficiency from the most similar other device.

Errors are ``predicted / measured - 1``; :func:`loo_summary` gives the median and max absolute error.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd

from flowsim.gpu_specs import get_gpu
from flowsim.kernels.gemm import (
    best_shape_efficiency,
    ceiling_rows,
    gemm_latency_s,
    latency_reference,
    mamf_ceiling,
    mamf_dtype,
    tiles_for,
)
from flowsim.kernels.model import gemm_time
from flowsim.kernels.stack import KernelStack
from flowsim.kernels.sustained import sustained_ceiling, sustained_pairs, sustained_reference
from flowsim.kernels.memory import stream_efficiency
from flowsim.kernels.reference import Candidate, choose_reference
from flowsim.kernels.tables import load_table
from flowsim.units import GB, TFLOP

LOO_COLUMNS = ("kind", "mode", "gpu", "case", "measured", "predicted", "error")


def leave_one_out() -> pd.DataFrame:
    """Every leave-one-out prediction: columns ``LOO_COLUMNS`` (measured/predicted in TFLOP/s or GB/s)."""
    rows = _gemm_loo() + _gemm_shape_rows() + _sustained_loo() + _attention_loo() + _memory_loo()
    df = pd.DataFrame(rows, columns=list(LOO_COLUMNS[:-1]))
    df["error"] = df["predicted"] / df["measured"] - 1.0
    return df


def loo_summary(loo: pd.DataFrame | None = None) -> pd.DataFrame:
    """Median and max absolute leave-one-out error per op kind and mode (fractions), with the row count."""
    loo = leave_one_out() if loo is None else loo
    g = loo.assign(abs_error=loo["error"].abs()).groupby(["kind", "mode"])["abs_error"]
    return pd.DataFrame({"n": g.size(), "median_abs_error": g.median(), "max_abs_error": g.max()}).reset_index()


def _gemm_loo() -> list:
    t = load_table("gemm_mamf")
    out = []
    for r in t.itertuples():
        gpu = get_gpu(r.gpu)
        shape = best_shape_efficiency([r.best_m], [r.best_n], [r.best_k], [1], gpu.sm_count, tiles_for(gpu))[0]
        flops = 2.0 * r.best_m * r.best_n * r.best_k
        latency = gemm_latency_s(latency_reference(gpu).measured)

        def predicted_tflops(ceiling):
            return flops / (latency + flops / (gpu.peak(r.dtype) * ceiling * shape)) / TFLOP

        case = f"{r.dtype} {r.best_m}x{r.best_n}x{r.best_k}"
        other_dtype = t[(t.gpu == r.gpu) & (t.dtype != r.dtype)]
        for o in other_dtype.itertuples():
            pred = predicted_tflops(mamf_ceiling(r.gpu, o.dtype))
            out.append(("gemm", "same_gpu", r.gpu, f"{case} from {o.dtype}", r.mamf_tflops, pred))
        others = t[(t.dtype == r.dtype) & (t.gpu != r.gpu)]
        cands = [Candidate.of_gpu(get_gpu(k), get_gpu(k).peak(r.dtype)) for k in others.gpu]
        ref = choose_reference(gpu, gpu.peak(r.dtype), cands, "gemm_mamf", r.dtype)
        pred = predicted_tflops(mamf_ceiling(ref.measured, r.dtype))
        out.append(("gemm", "cross_gpu", r.gpu, f"{case} from {ref.measured}", r.mamf_tflops, pred))
    return out


def _gemm_shape_rows() -> list:
    t = load_table("gemm_release")
    ceilings = ceiling_rows().frame()
    out = []
    for r in t.itertuples():
        ceiling = ceilings[(ceilings.gpu == r.gpu) & (ceilings.release == r.release)
                           & (ceilings.mdt == mamf_dtype(r.dtype))].iloc[0]
        if (r.m, r.n, r.k) == (ceiling.m, ceiling.n, ceiling.k):
            continue
        dtype = "nvfp4" if r.dtype == "fp4" else r.dtype  # FP4 rows: block-scaled FP4 (format not stated)
        t_s = gemm_time(r.m, r.n, r.k, dtype, get_gpu(r.gpu), stack=KernelStack(r.release))
        out.append(("gemm", "shape", r.gpu, f"{r.dtype} {r.m}x{r.n}x{r.k} on {r.release}", r.tflops,
                    2.0 * r.m * r.n * r.k / t_s / TFLOP))
    return out


def _sustained_loo() -> list:
    out = []
    for r in sustained_pairs().frame().itertuples():
        gpu = get_gpu(r.gpu)
        rows = ceiling_rows().frame()
        best = rows[(rows.gpu == r.gpu) & (rows.mdt == r.mdt) & (rows["load"] == "sustained")]
        best = best.loc[best.tflops.idxmax()]
        shape = best_shape_efficiency([best.m], [best.n], [best.k], [1], gpu.sm_count, tiles_for(gpu))[0]
        flops = 2.0 * best.m * best.n * best.k
        latency = gemm_latency_s(latency_reference(gpu).measured)
        ceiling = sustained_ceiling(gpu, r.mdt, exclude=r.gpu)
        pred = flops / (latency + flops / (gpu.peak(r.mdt) * ceiling * shape)) / TFLOP
        ref = sustained_reference(gpu, r.gpu)
        out.append(("gemm", "sustained", r.gpu, f"{r.mdt} {best.m}x{best.n}x{best.k} from {ref.measured}",
                    best.tflops, pred))
    return out


def _attention_loo() -> list:
    t = load_table("flash_attention")
    out = []
    for (gpu, impl, pass_, causal, hd), s in t.groupby(["gpu", "impl", "pass", "causal", "head_dim"]):
        if len(s) < 2:  # an anchor point (GB200 FA2) has no neighbours to predict it from
            continue
        s = s.sort_values("seq_len")
        x, y = np.log2(s.seq_len.to_numpy(float)), s.tflops.to_numpy(float)
        for i in range(len(s)):
            keep = np.arange(len(s)) != i
            pred = np.interp(x[i], x[keep], y[keep])
            case = f"{impl} {pass_} {'causal' if causal else 'full'} hd{hd} seq{int(2 ** x[i])}"
            out.append(("attention", "same_gpu", gpu, case, y[i], pred))
    both = t[(t["pass"] == "fwd_bwd")]
    for gpu, other in (("a100-sxm4-80gb", "h100-sxm"), ("h100-sxm", "a100-sxm4-80gb")):
        mine = both[both.gpu == gpu].set_index(["causal", "head_dim", "seq_len"]).tflops
        theirs = both[both.gpu == other].set_index(["causal", "head_dim", "seq_len"]).tflops
        ratio = get_gpu(gpu).peak("fp16") / get_gpu(other).peak("fp16")
        for (causal, hd, seq), v in mine.items():
            case = f"fa2 fwd_bwd {'causal' if causal else 'full'} hd{hd} seq{seq} from {other}"
            out.append(("attention", "cross_gpu", gpu, case, v, theirs[(causal, hd, seq)] * ratio))
    return out


def _memory_loo() -> list:
    t = load_table("hbm_stream")
    names = np.where(t.gpu.fillna("") != "", t.gpu, t.device)
    devices = [Candidate(nm, r.arch, r.vendor, r.spec_GBps * GB) for nm, r in zip(names, t.itertuples())]
    out = []
    for dev, r in zip(devices, t.itertuples()):
        target = SimpleNamespace(key=dev.name, arch=dev.arch, vendor=dev.vendor)  # what choose_reference reads
        others = [c for c in devices if c.name != dev.name]
        ref = choose_reference(target, dev.figure, others, "hbm_stream", "-")
        measured = max(r.scale_GBps, r.triad_GBps)
        out.append(("memory", "cross_gpu", dev.name, f"max(scale, triad) from {ref.measured}", measured,
                    r.spec_GBps * stream_efficiency(ref.measured)))
    return out
