"""Pipeline schedules on per-stage timelines: GPipe, 1F1B and interleaved 1F1B.

Each stage runs its forward and backward passes of every micro-batch (and model chunk) in the order its
schedule prescribes, as soon as the input from the neighbouring stage has arrived. A pass's input arrives
``p2p_s`` after the producing pass ends (the activation or gradient send). The resulting timelines give
the step's pipeline part: every stage's busy time, idle time (bubble) and the end of its last backward.

Orders follow Megatron-LM ``core/pipeline_parallel/schedules.py``:

* GPipe: all forwards, then all backwards.
* 1F1B (Narayanan et al. 2021, sec. 2.2): ``min(p - stage - 1, m)`` warm-up forwards, then one forward /
  one backward pairs, then the remaining backwards.
* ``zb-h1``, the split-backward half of ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", arXiv
  2401.10241, sec. 3): 1F1B whose backward is split into the input-gradient pass B, which is all the
  previous stage waits for, and the weight-gradient pass W, run right after its B. The round trip
  through the pipeline shrinks from ``F + B + W`` to ``F + B`` per stage, so the bubble is
  ``(p - 1)(F + B)`` instead of ``(p - 1)(F + B + W)``. ZB-H1's further step, moving W passes into the
  cool-down to reach ``(p - 1)(F + B - W)``, is not modelled.
* Interleaved 1F1B with ``v`` chunks per stage: ``(p - stage - 1) * 2 + (v - 1) * p`` warm-up forwards
  (capped at ``m * v``); virtual micro-batch ``k`` is model chunk ``(k // p) % v`` of micro-batch
  ``(k // (p * v)) * p + k % p`` (chunks taken in reverse for backwards).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from flowsim.errors import ConfigError

GPIPE, ONE_F_ONE_B, INTERLEAVED, ZB_H1 = 0, 1, 2, 3
SCHEDULE_IDS = {"gpipe": GPIPE, "1f1b": ONE_F_ONE_B, "interleaved": INTERLEAVED, "zb-h1": ZB_H1}
FWD, BWD, WGRAD = 0, 1, 2  # pass kinds: forward, backward (input gradients), weight gradients (ZB-H1 only)


@dataclass(frozen=True)
class PipelineTimeline:
    """Result of one pipeline schedule.

    Attributes
    ----------
    end_s : float64[p]
        When each stage finishes its last backward, seconds from the step start.
    busy_s : float64[p]
        Sum of the stage's forward and backward pass times, seconds.
    last_bwd_start_s, last_bwd_end_s : float64[p, v]
        Start and end of the last micro-batch's backward of each (stage, chunk): the window in which the
        chunk's gradients become final.
    start_s, end_op_s : float64[p, n_ops]
        Start and end of each stage's passes in execution order (for traces).
    order : int64[p, n_ops, 3]
        (pass kind FWD/BWD/WGRAD, micro-batch, chunk) of each pass in execution order.
    """

    end_s: np.ndarray
    busy_s: np.ndarray
    last_bwd_start_s: np.ndarray
    last_bwd_end_s: np.ndarray
    start_s: np.ndarray
    end_op_s: np.ndarray
    order: np.ndarray


@njit(cache=True)
def _orders(kind, p, v, m):
    """Execution order per stage: int64[p, n, 3] of (pass kind, micro-batch, chunk); n = 2mv (3m for ZB-H1)."""
    n = 3 * m if kind == ZB_H1 else 2 * m * v
    order = np.zeros((p, n, 3), dtype=np.int64)
    for s in range(p):
        i = 0
        if kind == ZB_H1:
            warm = min(p - s - 1, m)
            f = 0
            for _ in range(warm):
                order[s, i, 0] = FWD
                order[s, i, 1] = f
                i += 1
                f += 1
            for b in range(m):
                if f < m:
                    order[s, i, 0] = FWD
                    order[s, i, 1] = f
                    i += 1
                    f += 1
                order[s, i, 0] = BWD
                order[s, i, 1] = b
                i += 1
                order[s, i, 0] = WGRAD
                order[s, i, 1] = b
                i += 1
        elif kind == GPIPE:
            for mb in range(m):
                order[s, i, 0] = 0
                order[s, i, 1] = mb
                order[s, i, 2] = 0
                i += 1
            for mb in range(m):
                order[s, i, 0] = 1
                order[s, i, 1] = mb
                order[s, i, 2] = 0
                i += 1
        elif kind == ONE_F_ONE_B:
            warm = min(p - s - 1, m)
            f = 0
            b = 0
            for _ in range(warm):
                order[s, i, 0] = 0
                order[s, i, 1] = f
                i += 1
                f += 1
            for _ in range(m - warm):
                order[s, i, 0] = 0
                order[s, i, 1] = f
                i += 1
                f += 1
                order[s, i, 0] = 1
                order[s, i, 1] = b
                i += 1
                b += 1
            while b < m:
                order[s, i, 0] = 1
                order[s, i, 1] = b
                i += 1
                b += 1
        else:
            total = m * v
            warm = min((p - s - 1) * 2 + (v - 1) * p, total)
            kf = 0
            kb = 0
            for _ in range(warm):
                order[s, i, 0] = 0
                order[s, i, 1] = (kf // (p * v)) * p + kf % p
                order[s, i, 2] = (kf // p) % v
                i += 1
                kf += 1
            for _ in range(total - warm):
                order[s, i, 0] = 0
                order[s, i, 1] = (kf // (p * v)) * p + kf % p
                order[s, i, 2] = (kf // p) % v
                i += 1
                kf += 1
                order[s, i, 0] = 1
                order[s, i, 1] = (kb // (p * v)) * p + kb % p
                order[s, i, 2] = v - 1 - (kb // p) % v
                i += 1
                kb += 1
            while kb < total:
                order[s, i, 0] = 1
                order[s, i, 1] = (kb // (p * v)) * p + kb % p
                order[s, i, 2] = v - 1 - (kb // p) % v
                i += 1
                kb += 1
    return order


@njit(cache=True)
def _run(order, fwd_s, bwd_s, w_s, p2p_s, m):
    """List-schedule every stage's passes; returns start/end per pass and how many ran."""
    p, n, _ = order.shape
    v = fwd_s.shape[1]
    f_end = np.full((p, v, m), np.nan)
    b_end = np.full((p, v, m), np.nan)
    start = np.zeros((p, n))
    end = np.zeros((p, n))
    nxt = np.zeros(p, dtype=np.int64)
    free = np.zeros(p)
    done = 0
    while done < p * n:
        progressed = False
        for s in range(p):
            while nxt[s] < n:
                i = nxt[s]
                is_b, mb, c = order[s, i, 0], order[s, i, 1], order[s, i, 2]
                ready = 0.0
                if is_b == WGRAD:
                    dep = b_end[s, c, mb]
                    ready = dep
                    dur = w_s[s, c]
                elif is_b == FWD:
                    if s > 0:
                        dep = f_end[s - 1, c, mb]
                        ready = dep + p2p_s
                    elif c > 0:
                        dep = f_end[p - 1, c - 1, mb]
                        ready = dep + p2p_s
                    else:
                        dep = 0.0
                    dur = fwd_s[s, c]
                else:
                    if s < p - 1:
                        dep = b_end[s + 1, c, mb]
                        ready = dep + p2p_s
                    elif c < v - 1:
                        dep = b_end[0, c + 1, mb]
                        ready = dep + p2p_s
                    else:
                        dep = f_end[s, c, mb]
                        ready = dep
                    dur = bwd_s[s, c]
                if np.isnan(dep):
                    break
                t0 = max(free[s], ready)
                t1 = t0 + dur
                start[s, i] = t0
                end[s, i] = t1
                free[s] = t1
                if is_b == FWD:
                    f_end[s, c, mb] = t1
                elif is_b == BWD:
                    b_end[s, c, mb] = t1
                nxt[s] += 1
                done += 1
                progressed = True
        if not progressed:
            break  # a cycle: cannot happen for the orders built above; caught by the caller
    return start, end, done


def simulate_pipeline(schedule: str, num_microbatches: int, fwd_s: np.ndarray, bwd_s: np.ndarray,
                      p2p_s: float, wgrad_s: np.ndarray | None = None) -> PipelineTimeline:
    """Run a pipeline schedule.

    Parameters
    ----------
    schedule : str
        ``gpipe``, ``1f1b``, ``interleaved`` or ``zb-h1``.
    num_microbatches : int
        Micro-batches per step, >= 1.
    fwd_s, bwd_s : float64[p, v]
        Forward and backward (including recompute) time of one micro-batch through model chunk ``c`` of
        stage ``s``, seconds.
    p2p_s : float
        Time to move one activation (or gradient) between neighbouring stages, seconds.
    wgrad_s : float64[p, v], optional
        For ``zb-h1``: the weight-gradient part of ``bwd_s``, run as its own deferred pass (the B pass then
        lasts ``bwd_s - wgrad_s``). Ignored by the other schedules.
    """
    if schedule not in SCHEDULE_IDS:
        raise ConfigError("pipeline_schedule", f"must be one of {', '.join(SCHEDULE_IDS)}", schedule)
    fwd_s = np.ascontiguousarray(fwd_s, dtype=np.float64)
    bwd_s = np.ascontiguousarray(bwd_s, dtype=np.float64)
    p, v = fwd_s.shape
    if schedule != "interleaved" and v != 1:
        raise ConfigError("pipeline_schedule", f"{schedule} runs one model chunk per stage", f"vpp={v}")
    if schedule == "zb-h1" and v != 1:
        raise ConfigError("pipeline_schedule", "zb-h1 runs one model chunk per stage", f"vpp={v}")
    w_s = np.zeros_like(fwd_s)
    if schedule == "zb-h1" and wgrad_s is not None:
        w_s = np.ascontiguousarray(wgrad_s, dtype=np.float64)
        bwd_s = bwd_s - w_s
    order = _orders(SCHEDULE_IDS[schedule], p, v, num_microbatches)
    start, end, done = _run(order, fwd_s, bwd_s, w_s, float(p2p_s), num_microbatches)
    assert done == order.shape[0] * order.shape[1], "pipeline schedule deadlocked"
    busy = (end - start).sum(axis=1)
    lbs = np.zeros((p, v))
    lbe = np.zeros((p, v))
    for s in range(p):
        for c in range(v):
            sel = (order[s, :, 0] != FWD) & (order[s, :, 2] == c)
            last = np.nonzero(sel)[0][-1]
            lbs[s, c] = start[s, last]
            lbe[s, c] = end[s, last]
    return PipelineTimeline(end_s=end[:, -1].copy(), busy_s=busy, last_bwd_start_s=lbs, last_bwd_end_s=lbe,
                            start_s=start, end_op_s=end, order=order)
