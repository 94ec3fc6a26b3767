"""One GPU's op sequence on a compute stream and communication streams, in issue order.

This is the step core's op-level timeline, for programs given op by op (captured workloads, the step-level lines
of SimAI/AICB workloads). Each op is compute or a collective. A collective runs on a communication stream
(``stream``, default 0: one NCCL stream), FIFO per stream:

* a **blocking** collective starts when the compute stream reaches it and its stream is free, and the compute
  stream waits for its end;
* an **asynchronous** one starts when its stream is free and the compute stream has reached its ``issue`` op
  (itself, or an earlier op for a prefetch); the compute stream waits for it only at its ``wait`` op (none: at
  the end of the step).

While collectives run they hold SMs: compute beside them is slowed by the SM-sharing rule
(:func:`flowsim.step.overlap.slowed_end_s`), with the largest share among the collectives queued on the
streams until the latest of their ends (one stream: exactly the rule; several: an approximation). Compute
already timed before a prefetched collective is reached in issue order is not slowed (an approximation).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flowsim.step.overlap import slowed_end_s


@dataclass(frozen=True)
class StreamOp:
    """One op of a stream program.

    Attributes
    ----------
    time_s : float
        Full-speed seconds (a collective: its own duration, with whatever keeps its stream busy after it).
    comm : bool
        A collective (True) or compute (False).
    blocking : bool
        Collectives: the compute stream waits for the end.
    wait : int or None
        Asynchronous collectives: the op index whose start waits for it; None or past the end = end of step.
    issue : int or None
        Asynchronous collectives: the op index at which it may start (default: itself).
    share : float
        Share of the GPU's SMs the collective holds while it runs (0..1).
    stream : int
        Communication stream of the collective.
    """

    time_s: float
    comm: bool = False
    blocking: bool = True
    wait: int | None = None
    issue: int | None = None
    share: float = 0.0
    stream: int = 0


@dataclass(frozen=True)
class StreamRun:
    """Timeline of a stream program, seconds.

    Attributes
    ----------
    start_s, end_s : numpy.ndarray
        float64[n]: when each op starts and ends (compute: on the compute stream; collectives: on their stream).
    compute_end_s : float
        When the compute stream finishes its last op.
    end_s_total : float
        When everything has finished: the compute stream, and every collective waited at the end.
    """

    start_s: np.ndarray
    end_s: np.ndarray
    compute_end_s: float
    end_s_total: float


def run_streams(ops: list, start_s: float = 0.0) -> StreamRun:
    """Run a stream program (module docstring) from ``start_s``, seconds."""
    n = len(ops)
    starts, ends = np.zeros(n), np.zeros(n)
    t = start_s        # compute stream clock
    free: dict = {}    # stream -> free from
    share: dict = {}   # stream -> largest SM share of the collectives queued until it is free
    waits: dict = {}   # op index -> latest end of the asynchronous collectives it waits for
    tail = start_s     # latest end of the collectives waited at the end of the step
    clock = []         # compute clock when each op is reached
    for i, o in enumerate(ops):
        t = max(t, waits.pop(i, start_s))
        clock.append(t)
        if not o.comm:
            busy_until = max(free.values(), default=start_s)
            starts[i] = t
            t = float(slowed_end_s(t, o.time_s, busy_until, max(share.values(), default=0.0)))
            ends[i] = t
            continue
        s = o.stream
        ready = clock[i if o.issue is None else o.issue]
        was_free = free.get(s, start_s)
        share[s] = o.share if ready >= was_free else max(share.get(s, 0.0), o.share)
        starts[i] = max(ready, was_free)
        ends[i] = free[s] = starts[i] + o.time_s
        if o.blocking:
            t = ends[i]
        elif o.wait is None or o.wait >= n:
            tail = max(tail, ends[i])
        else:
            waits[o.wait] = max(waits.get(o.wait, start_s), ends[i])
    return StreamRun(start_s=starts, end_s=ends, compute_end_s=t,
                     end_s_total=max(t, tail, *waits.values()) if waits else max(t, tail))
