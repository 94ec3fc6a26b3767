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

A block of ops run ``n`` times in a row (a layer, once per layer of a pass) has a closed form: with ``H`` and
``G`` the block's host and GPU seconds and ``A = max_j (h_1 + .. + h_j + g_j + .. + g_k)`` the block's span from
an idle CPU and GPU, the GPU finishes the ``n`` runs, started with the CPU at ``c`` and the GPU free at ``g``, at
``max(g + n G, c + A + (n - 1) max(G, H))`` (:func:`repeated_block_end_s`): each run after the first costs
``max(G, H)``, the steady state of whichever server is slower. A chain of such runs (a pipeline pass: the
embedding, the layers, the head) is again one block, with ``H`` and ``G`` the sums and its own span: so a pass
started at ``(c, g)`` ends at ``max(g + G, c + G + lag)``, ``lag = A - G >= 0`` (:func:`pass_host`).

The step core carries each pipeline stage's CPU clock through the schedule (:func:`flowsim.step.schedule._run`):
the CPU issues the stage's passes in schedule order, ``H`` each, running ahead of the GPU across micro-batches
until a synchronisation point: the step's start (the previous step's optimizer waited), and, where the framework
synchronises at pipeline transfers (``p2p_sync``), every send and receive.

CUDA graphs replace the per-op host costs of the ops they capture by one launch per graph replay plus a small
cost per node (:func:`flowsim.model.host_costs.graphed_host_s`); torch.compile reduces the op count to its fused kernels (the workload's
``fused`` kernel set) at the compiled launcher's cost per kernel (:mod:`flowsim.model.host_costs`).

The recurrences are ``numba.njit(cache=True)`` loops over flat float64 arrays; blocks are segments of one flat array
(``offsets`` int64[n_blocks + 1], as CSR) so one call prices every block of a configuration.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from flowsim._jit import njit


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


class PassHost(NamedTuple):
    """Host terms of every pipeline pass (:func:`pass_host`), float64[3, p, v] over pass kind (F, B, W),
    stage and model chunk, seconds.

    Attributes
    ----------
    host_s : numpy.ndarray
        CPU seconds to issue one micro-batch's pass.
    lag_s : numpy.ndarray
        How much later than its kernels' sum the pass ends when issued from an idle CPU (``A - G``).
    """

    host_s: np.ndarray
    lag_s: np.ndarray


SEGMENTS = ("fwd", "rec_bwd", "bwd", "rec_dgrad", "dgrad", "wgrad")
"""The op segments of a block that passes are made of: its forward; its backward with (``rec_bwd``) and without
the recompute of its forward; the same without the weight-gradient GEMMs (``dgrad``: the B pass of the
split-backward schedules); its weight-gradient GEMMs (the W pass)."""


def segment_terms(phase, wgrad, gpu_s, host_s, phase_s: dict) -> BlockHost:
    """``H``, ``G`` and ``A`` of each of a block's :data:`SEGMENTS`.

    Parameters
    ----------
    phase : array_like of str, shape (n,)
        Each op row's phase (``fwd``, ``bwd``, ``recompute``), rows in issue order.
    wgrad : array_like of bool, shape (n,)
        Rows that are weight-gradient GEMMs.
    gpu_s, host_s : array_like of float, shape (n,)
        GPU and CPU seconds of each row (all its instances).
    phase_s : dict
        Seconds of one run of each phase with its exposed communication: each phase's rows are stretched to
        it (the communication spread over the phase's kernels), seconds.
    """
    phase = np.asarray(phase)
    g = np.asarray(gpu_s, dtype=np.float64).copy()
    for ph, total in phase_s.items():
        sel = phase == ph
        g[sel] *= total / g[sel].sum() if g[sel].sum() > 0 else 1.0
    rec, bwd, w = phase == "recompute", phase == "bwd", np.asarray(wgrad, dtype=bool)
    idx = [np.flatnonzero(m) for m in (phase == "fwd", rec, bwd, rec, bwd & ~w, bwd & w)]
    idx[1] = np.concatenate([idx[1], idx[2]])
    idx[3] = np.concatenate([idx[3], idx[4]])
    order = np.concatenate(idx)
    offsets = np.concatenate([[0], np.cumsum([i.size for i in idx])])
    return block_terms(np.asarray(host_s, dtype=np.float64)[order], g[order], offsets)


def _chain(runs) -> tuple:
    """Total host seconds and lag of a chain of block runs ``(terms, segment, n)`` (n: float64[p, v] runs),
    issued back to back from an idle CPU and GPU."""
    cpu = gpu = kernels = 0.0
    for terms, seg, n in runs:
        one = BlockHost(*(x[seg] for x in terms))
        gpu = repeated_block_end_s(one, n, cpu, gpu)
        cpu = cpu + n * one.host_s
        kernels = kernels + n * one.gpu_s
    return cpu, gpu - kernels


def pass_host(layers, emb: BlockHost, head: BlockHost, first, last, split: bool) -> PassHost:
    """Host terms of every stage's and chunk's F, B and W passes.

    ``layers``: per layer kind, ``(terms, layers per chunk, recomputed layers per chunk)`` (terms from
    :func:`segment_terms`, counts float64[p, v]); ``emb``, ``head``: the embedding's and the LM head's terms,
    run by the (stage, chunk) pairs ``first`` and ``last``; ``split``: the schedule runs the weight gradients as
    passes of their own (B then leaves the layers' out). A forward runs the embedding, the layers and the head; a
    backward the head, the layers (a recomputed one recomputes its forward first) and the embedding.
    """
    shape = layers[0][1].shape
    at_first, at_last = np.zeros(shape), np.zeros(shape)
    for s, c in first:
        at_first[s, c] = 1.0
    for s, c in last:
        at_last[s, c] = 1.0
    fwd = [(emb, 0, at_first)] + [(t, 0, n) for t, n, _ in layers] + [(head, 0, at_last)]
    rb, b = (3, 4) if split else (1, 2)
    bwd = ([(head, 2, at_last)] + [x for t, n, r in layers for x in ((t, rb, r), (t, b, n - r))]
           + [(emb, 2, at_first)])
    wgt = [(t, 5, n if split else 0.0 * n) for t, n, _ in layers]
    parts = [_chain(runs) for runs in (fwd, bwd, wgt)]
    return PassHost(np.stack([np.broadcast_to(h, shape) for h, _ in parts]),
                    np.stack([np.broadcast_to(lag, shape) for _, lag in parts]))


def optimizer_end_s(gpu_s, kernels, host_per_kernel_s: float) -> np.ndarray:
    """End of an optimizer step issued from an idle CPU (after the gradient norm's synchronisation), seconds:
    ``kernels`` equal kernels sharing ``gpu_s`` GPU seconds, each issued in ``host_per_kernel_s`` (vectorised over
    stages): ``max(G + h, n h + G / n)``, the GPU's work or the CPU's pace."""
    n = np.maximum(np.asarray(kernels, dtype=np.float64), 1.0)
    g = np.asarray(gpu_s, dtype=np.float64) / n
    h = np.full_like(g, host_per_kernel_s)
    return repeated_block_end_s(BlockHost(h, g, h + g), n)
