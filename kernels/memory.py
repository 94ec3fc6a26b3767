"""Achievable device-memory bandwidth of memory-bound ops, from stream measurements.

A memory-bound op (norm, activation, dropout, residual add, softmax, rotary, cross-entropy, optimizer step)
reads and writes HBM like the stream kernels ``scale`` (1 load + 1 store) and ``triad`` (2 loads + 1 store).
Its efficiency is the better of those two measured bandwidths over the datasheet bandwidth the measurement
was taken against (table ``hbm_stream``): ``eff_m = max(scale, triad) / spec``.

Every memory-bound launch also pays a fixed time (table ``memory_latency``): the median over the memory-bound
kernels of a profiler trace of ``time - bytes / (hbm_Bps * eff_m)``, derived by
:func:`flowsim.kernels.ingest.memory_latency_fit` (docs/KERNELS.md). A GPU without a trace takes the value of the
most similar measured GPU (similarity: HBM bandwidth).
"""
from __future__ import annotations

import functools

import numpy as np

from flowsim.gpu_specs import GPUSpec, get_gpu
from flowsim.kernels.reference import Candidate, Reference, choose_reference
from flowsim.kernels.tables import table
from flowsim.units import GB, US


def _candidates() -> list[Candidate]:
    t = table("hbm_stream")
    return [Candidate(gpu if isinstance(gpu, str) and gpu else device, arch, vendor, spec * GB)
            for gpu, device, arch, vendor, spec in zip(t.gpu, t.device, t.arch, t.vendor, t.spec_GBps)]


@functools.lru_cache(maxsize=None)
def memory_reference(gpu: GPUSpec) -> Reference:
    """The measured device whose stream efficiency prices memory-bound ops on ``gpu``."""
    return choose_reference(gpu, gpu.hbm_Bps, _candidates(), "hbm_stream", "-")


@functools.lru_cache(maxsize=None)
def stream_efficiency(measured: str) -> float:
    """``max(scale, triad) / spec`` of a measured device (a flowsim key or the table's device name)."""
    t = table("hbm_stream")
    i = int(np.flatnonzero((t.gpu == measured) | (t.device == measured))[0])
    return float(max(t.scale_GBps[i], t.triad_GBps[i]) / t.spec_GBps[i])


def memory_latency_candidates() -> list[Candidate]:
    """The GPUs of table ``memory_latency`` as reference candidates (similarity figure: HBM bandwidth, B/s)."""
    return [Candidate.of_gpu(get_gpu(k), get_gpu(k).hbm_Bps) for k in sorted(table("memory_latency").gpu)]


@functools.lru_cache(maxsize=None)
def memory_latency_reference(gpu: GPUSpec) -> Reference:
    """The measured GPU whose fixed memory-bound launch time applies to ``gpu``."""
    return choose_reference(gpu, gpu.hbm_Bps, memory_latency_candidates(), "memory_latency", "-")


@functools.lru_cache(maxsize=None)
def memory_latency_s(measured_key: str) -> float:
    """Fixed time of a memory-bound launch on a measured GPU (table ``memory_latency``), seconds."""
    t = table("memory_latency")
    return float(t.latency_us[t.gpu == measured_key][0] * US)
