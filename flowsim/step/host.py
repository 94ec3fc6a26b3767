"""The host-side timeline: the CPU issues every kernel before the GPU can run it.

A framework's Python, autograd, dispatcher and driver spend CPU time on every kernel they launch (the op's
*host cost*, seconds); the GPU starts a kernel no earlier than the CPU has issued it, and the CPU runs ahead of
the GPU (kernels queue on the stream) until a *synchronisation point* (a ``.item()`` of the loss scale or the
gradient norm, an optimizer step that waits, the end of the step) makes it wait for the GPU. That is a
two-server tandem queue, per op ``i`` of one stream::

    cpu_i = cpu_{i-1} + h_i                     # the CPU has issued op i
    gpu_i = max(gpu_{i-1}, cpu_i) + g_i          # the GPU ran it
    cpu_i = gpu_i            if op i is a sync point

When every kernel is longer than its host cost the CPU stays ahead and the GPU never waits (the step is the
GPU's sum); when every kernel is shorter, the GPU waits on the CPU and the step runs at the CPU's pace (the sum
of the host costs plus the last kernel).

A block of ops run ``n`` times in a row (a layer, once per layer and micro-batch) has a closed form, so the step
core prices a block once: with ``H`` and ``G`` the block's host and GPU seconds and
``A = max_j (h_1 + .. + h_j + g_j + .. + g_k)`` the block's span from an idle CPU and GPU, the GPU finishes the
``n`` runs, started with the CPU at ``c`` and the GPU free at ``g``, at
``max(g + n G, c + A + (n - 1) max(G, H))`` (:func:`repeated_block_end_s`): each run after the first costs
``max(G, H)``, the steady state of whichever server is slower.

CUDA graphs replace the per-op host costs of the ops they capture by one launch per graph replay plus a small
cost per node (:func:`flowsim.model.host_costs.graphed_host_s`); torch.compile reduces the op count to its fused kernels (the workload's
``fused`` kernel set) at the compiled launcher's cost per kernel (:mod:`flowsim.model.host_costs`).

The recurrences are ``numba.njit(cache=True)`` loops over flat float64 arrays; blocks are segments of one flat array
(``offsets`` int64[n_blocks + 1], as CSR) so one call prices every block of a configuration.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit


class IssueRun(NamedTuple):
    """One stream run op by op (:func:`issue_timeline`), seconds.

    Attributes
    ----------
    gpu_end_s : numpy.ndarray
        float64[n]: when the GPU finished each op.
    cpu_end_s : float
        When the CPU finished issuing (or, after a final sync point, waiting).
    gpu_idle_s : float
        Seconds the GPU waited for the CPU between the first op's start and the last op's end.
    """

    gpu_end_s: np.ndarray
    cpu_end_s: float
    gpu_idle_s: float


class BlockHost(NamedTuple):
    """Host terms of blocks of ops (:func:`block_terms`), float64[n_blocks] each, seconds.

    Attributes
    ----------
    host_s : numpy.ndarray
        ``H``: CPU seconds to issue the block.
    gpu_s : numpy.ndarray
        ``G``: GPU seconds of its kernels.
    span_s : numpy.ndarray
        ``A``: from an idle CPU and GPU until the GPU finishes the block (``>= max(H, G)``).
    """

    host_s: np.ndarray
    gpu_s: np.ndarray
    span_s: np.ndarray


@njit(cache=True)
def _tandem(host_s, gpu_s, sync, cpu0, gpu0, gpu_end):
    cpu, gpu, idle = cpu0, gpu0, 0.0
    for i in range(host_s.size):
        cpu += host_s[i]
        if cpu > gpu:
            if i > 0:
                idle += cpu - gpu
            gpu = cpu
        gpu += gpu_s[i]
        gpu_end[i] = gpu
        if sync[i]:
            cpu = gpu
    return cpu, idle


def issue_timeline(host_s, gpu_s, sync=None, cpu_start_s: float = 0.0, gpu_start_s: float = 0.0) -> IssueRun:
    """Run ops on one stream through the tandem queue (module docstring).

    Parameters
    ----------
    host_s, gpu_s : array_like of float, shape (n,)
        Per op: CPU seconds to issue it, GPU seconds to run it.
    sync : array_like of bool, shape (n,), optional
        Ops after which the CPU waits for the GPU (``.item()``, a blocking collective, the step's end).
    cpu_start_s, gpu_start_s : float
        When the CPU starts issuing and when the GPU is free, seconds.
    """
    h = np.ascontiguousarray(host_s, dtype=np.float64)
    g = np.ascontiguousarray(gpu_s, dtype=np.float64)
    if h.shape != g.shape or h.ndim != 1:
        raise ValueError(f"host_s and gpu_s must be 1-d of one length (got {h.shape} and {g.shape})")
    s = np.zeros(h.size, dtype=np.bool_) if sync is None else np.ascontiguousarray(sync, dtype=np.bool_)
    if s.shape != h.shape:
        raise ValueError(f"sync must have the ops' length {h.size} (got {s.shape})")
    end = np.empty(h.size)
    cpu, idle = _tandem(h, g, s, float(cpu_start_s), float(gpu_start_s), end)
    return IssueRun(end, float(cpu), float(idle))


@njit(cache=True)
def _block_terms(host_s, gpu_s, offsets, out_h, out_g, out_a):
    for b in range(offsets.size - 1):
        lo, hi = offsets[b], offsets[b + 1]
        # A = max_j (prefix host through j + suffix GPU from j): the tandem recurrence from (0, 0)
        cpu = gpu = 0.0
        for i in range(lo, hi):
            cpu += host_s[i]
            gpu = max(gpu, cpu) + gpu_s[i]
        out_h[b], out_a[b] = cpu, gpu
        g = 0.0
        for i in range(lo, hi):
            g += gpu_s[i]
        out_g[b] = g


def block_terms(host_s, gpu_s, offsets) -> BlockHost:
    """``H``, ``G`` and ``A`` (module docstring) of every block of a flat op array.

    Parameters
    ----------
    host_s, gpu_s : array_like of float, shape (n,)
        Per op host and GPU seconds, blocks one after another.
    offsets : array_like of int, shape (n_blocks + 1,)
        Block ``b`` is ops ``offsets[b]:offsets[b + 1]`` (non-decreasing, from 0 to n).
    """
    h = np.ascontiguousarray(host_s, dtype=np.float64)
    g = np.ascontiguousarray(gpu_s, dtype=np.float64)
    off = np.ascontiguousarray(offsets, dtype=np.int64)
    if h.shape != g.shape or off.size < 1 or off[0] != 0 or off[-1] != h.size or np.any(np.diff(off) < 0):
        raise ValueError("offsets must rise from 0 to the number of ops, one more than the blocks")
    n = off.size - 1
    out = BlockHost(np.empty(n), np.empty(n), np.empty(n))
    _block_terms(h, g, off, out.host_s, out.gpu_s, out.span_s)
    return out


def repeated_block_end_s(terms: BlockHost, runs, cpu_start_s=0.0, gpu_start_s=0.0) -> np.ndarray:
    """When the GPU finishes ``runs`` back-to-back runs of each block with no sync point inside, seconds.

    ``max(gpu_start + n G, cpu_start + A + (n - 1) max(G, H))`` (module docstring); 0 runs end at
    ``gpu_start_s``. Vectorised over the blocks of ``terms`` (and broadcast against ``runs`` and the starts).
    """
    n = np.asarray(runs, dtype=np.float64)
    if np.any(n < 0):
        raise ValueError("runs must be >= 0")
    end = np.maximum(gpu_start_s + n * terms.gpu_s,
                     cpu_start_s + terms.span_s + (n - 1) * np.maximum(terms.gpu_s, terms.host_s))
    return np.where(n > 0, end, gpu_start_s + 0.0 * end)


def steady_run_s(gpu_s, host_s):
    """Seconds each run of a block adds once the stream is in steady state: ``max(G, H)`` (the step core's
    :func:`flowsim.step.blocks.block_times` with ``G`` its kernels and exposed communication)."""
    return np.maximum(gpu_s, host_s)
