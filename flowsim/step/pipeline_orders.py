"""The execution plan of a pipeline schedule: each stage's order of passes and where each pass's input comes from.

What a schedule fixes before any pass time is known (the orders of :mod:`flowsim.step.schedule`'s module
docstring), built by numba kernels and kept per layout (:func:`schedule_plan`) in int32 arrays, read-only, so
that the schedule simulator runs many configs of one layout without rebuilding it.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from flowsim._jit import njit

from flowsim.config.layout import PIPELINE_SCHEDULES, check_layout
from flowsim.errors import ConfigError

SCHEDULE_IDS = {name: i for i, name in enumerate(PIPELINE_SCHEDULES)}
"""Integer id of each schedule (the numba kernels' ``kind``), in config.layout's order."""
GPIPE, ONE_F_ONE_B, INTERLEAVED, ZB_H1, DUALPIPE = (SCHEDULE_IDS[n] for n in
                                                   ("gpipe", "1f1b", "interleaved", "zb-h1", "dualpipe"))
FWD, BWD, WGRAD = 0, 1, 2  # pass kinds: forward, backward (input gradients), weight gradients


def path_links(kind: int, p: int, v: int) -> tuple[np.ndarray, np.ndarray]:
    """int64[p, v, 2] (stage, chunk) of the virtual stage before (``up``) and after (``down``) each one on
    a micro-batch's path, -1 at the ends. Interleaved: virtual stage ``c * p + s``; DualPipe: chunk 1
    runs from stage ``p - 1`` down to 0."""
    up = np.full((p, v, 2), -1, dtype=np.int64)
    down = np.full((p, v, 2), -1, dtype=np.int64)
    for s in range(p):
        for c in range(v):
            if kind == DUALPIPE:
                step = 1 if c == 0 else -1
                if 0 <= s - step < p:
                    up[s, c] = (s - step, c)
                if 0 <= s + step < p:
                    down[s, c] = (s + step, c)
                continue
            k = c * p + s
            if k > 0:
                up[s, c] = ((k - 1) % p, (k - 1) // p)
            if k < p * v - 1:
                down[s, c] = ((k + 1) % p, (k + 1) // p)
    return up, down


@njit(cache=True)
def _put(order, s, i, kind, mb, c):
    """Write pass ``i`` of stage ``s``; returns the next slot."""
    order[s, i, 0] = kind
    order[s, i, 1] = mb
    order[s, i, 2] = c
    return i + 1


@njit(cache=True)
def _gpipe(order, p, m):
    """GPipe: all forwards, then all backwards."""
    for s in range(p):
        i = 0
        for mb in range(m):
            i = _put(order, s, i, FWD, mb, 0)
        for mb in range(m):
            i = _put(order, s, i, BWD, mb, 0)


@njit(cache=True)
def _one_f_one_b(order, publish, p, m, paired):
    """1F1B: warm-up forwards, forward/backward pairs, cool-down backwards. ``paired`` (EP all-to-all
    overlap): one more warm-up forward, and each steady-state pair runs as one call (same ``publish``)."""
    for s in range(p):
        warm = min(p - s - 1 + (1 if paired else 0), m)
        i = 0
        for f in range(warm):
            i = _put(order, s, i, FWD, f, 0)
        for b in range(m - warm):
            i = _put(order, s, i, FWD, warm + b, 0)
            if paired:
                publish[s, i - 1] = i
            i = _put(order, s, i, BWD, b, 0)
        for b in range(m - warm, m):
            i = _put(order, s, i, BWD, b, 0)


@njit(cache=True)
def _zb_h1(order, p, m):
    """ZB-H1 as ``zbpp_light.auto_schedule``: 1F1B with stage ``s``'s first ``s`` W passes deferred."""
    for s in range(p):
        warm = min(p - s - 1, m)
        i = 0
        w = 0
        for f in range(warm):
            i = _put(order, s, i, FWD, f, 0)
        for b in range(m):
            if b < m - warm:
                i = _put(order, s, i, FWD, warm + b, 0)
            i = _put(order, s, i, BWD, b, 0)
            if b >= s:
                i = _put(order, s, i, WGRAD, w, 0)
                w += 1
        for r in range(w, m):
            i = _put(order, s, i, WGRAD, r, 0)


@njit(cache=True)
def _interleaved(order, publish, p, v, m, paired):
    """Megatron-LM interleaved 1F1B over ``v`` chunks (module docstring). ``paired`` (EP all-to-all overlap):
    one more warm-up forward, and each steady-state forward runs as one call with the backward after it."""
    total = m * v
    for s in range(p):
        warm = min((p - s - 1) * 2 + (v - 1) * p + (1 if paired else 0), total)
        i = 0
        kb = 0
        for kf in range(total):
            i = _put(order, s, i, FWD, (kf // (p * v)) * p + kf % p, (kf // p) % v)
            if kf >= warm:
                if paired:
                    publish[s, i - 1] = i
                i = _put(order, s, i, BWD, (kb // (p * v)) * p + kb % p, v - 1 - (kb // p) % v)
                kb += 1
        while kb < total:
            i = _put(order, s, i, BWD, (kb // (p * v)) * p + kb % p, v - 1 - (kb // p) % v)
            kb += 1


# DualPipe per-rank state, int64[7]: next slot, next forward of direction 0 and 1, next backward of
# direction 0 and 1, head and tail of the deferred-W queue.
_SLOT, _NF, _NB, _QH, _QT = 0, 1, 3, 5, 6


@njit(cache=True)
def _dp_pass(order, s, st, kind, d, half):
    """Put the next forward (``kind`` FWD) or backward (BWD) of direction ``d`` (chunk ``d``); returns
    its micro-batch."""
    nxt = _NF if kind == FWD else _NB
    mb = d * half + st[nxt + d]
    st[nxt + d] += 1
    st[_SLOT] = _put(order, s, st[_SLOT], kind, mb, d)
    return mb


@njit(cache=True)
def _dp_call(order, publish, s, st, queue, f, b, zb, w, half):
    """One call of the reference on rank ``s``: the forward of direction ``f`` (skipped when -1), the
    backward of direction ``b`` (skipped when -1) whose W runs inline unless ``zb`` defers it to the
    FIFO queue, and ``w`` W passes popped from the queue (``WeightGradStore.pop``). The call sends its
    outputs when its last pass ends."""
    first = st[_SLOT]
    if f >= 0:
        _dp_pass(order, s, st, FWD, f, half)
    if b >= 0:
        mb = _dp_pass(order, s, st, BWD, b, half)
        if zb:
            queue[st[_QT]] = mb
            st[_QT] += 1
        else:
            st[_SLOT] = _put(order, s, st[_SLOT], WGRAD, mb, b)
    for _ in range(w):
        mb = queue[st[_QH]]
        st[_QH] += 1
        st[_SLOT] = _put(order, s, st[_SLOT], WGRAD, mb, mb // half)
    publish[s, first:st[_SLOT]] = st[_SLOT] - 1


@njit(cache=True)
def _dualpipe(order, publish, p, m):
    """The eight steps of ``DualPipe.step`` (PyPI ``dualpipe`` 1.0.0) for every rank.

    Phase 0 is the direction fed at the rank's nearer end (``phase ^ is_in_second_half``); ``a`` and
    ``b`` below are the directions of phases 0 and 1. An F&B call is the forward of one phase with the
    whole backward of the other.
    """
    nh, half = p // 2, m // 2
    for s in range(p):
        hr = min(s, p - 1 - s)
        a = 1 if s >= nh else 0
        b = 1 - a
        st = np.zeros(7, dtype=np.int64)
        q = np.zeros(m, dtype=np.int64)
        for _ in range((nh - hr - 1) * 2):                      # 1: nF0
            _dp_call(order, publish, s, st, q, a, -1, False, 0, half)
        for _ in range(hr + 1):                                 # 2: nF0F1
            _dp_call(order, publish, s, st, q, a, -1, False, 0, half)
            _dp_call(order, publish, s, st, q, b, -1, False, 0, half)
        for _ in range(nh - hr - 1):                            # 3: nB1W1F1
            _dp_call(order, publish, s, st, q, -1, b, True, 0, half)
            _dp_call(order, publish, s, st, q, -1, -1, False, 1, half)
            _dp_call(order, publish, s, st, q, b, -1, False, 0, half)
        for _ in range(half - p + hr + 1):                      # 4: nF0B1F1B0
            _dp_call(order, publish, s, st, q, a, b, False, 0, half)
            _dp_call(order, publish, s, st, q, b, a, False, 0, half)
        for _ in range(nh - hr - 1):                            # 5: nB1F1B0
            _dp_call(order, publish, s, st, q, -1, b, False, 0, half)
            _dp_call(order, publish, s, st, q, b, a, False, 0, half)
        zb = False
        for i in range(hr + 1):                                 # 6: nB1B0, second half zero-bubble
            if i == (hr + 1) // 2 and hr % 2 == 1:
                zb = True
            _dp_call(order, publish, s, st, q, -1, b, zb, 0, half)
            if i == (hr + 1) // 2 and hr % 2 == 0:
                zb = True
            _dp_call(order, publish, s, st, q, -1, a, zb, 0, half)
        for _ in range(nh - hr - 1):                            # 7: nWB0
            _dp_call(order, publish, s, st, q, -1, -1, False, 1, half)
            _dp_call(order, publish, s, st, q, -1, a, True, 0, half)
        for _ in range(hr + 1):                                 # 8: nW
            _dp_call(order, publish, s, st, q, -1, -1, False, 1, half)


@njit(cache=True)
def _orders(kind, p, v, m, paired):
    """Execution order per stage, int32[p, n, 3] of (pass kind, micro-batch, chunk), and int32[p, n] the
    pass at whose end each pass's output is sent (itself, but for the calls of several passes of DualPipe
    and of 1F1B with ``paired``)."""
    n = 3 * m if kind == ZB_H1 or kind == DUALPIPE else 2 * m * v
    order = np.zeros((p, n, 3), dtype=np.int32)
    publish = np.empty((p, n), dtype=np.int32)
    for s in range(p):
        for i in range(n):
            publish[s, i] = i
    if kind == GPIPE:
        _gpipe(order, p, m)
    elif kind == ONE_F_ONE_B:
        _one_f_one_b(order, publish, p, m, paired)
    elif kind == ZB_H1:
        _zb_h1(order, p, m)
    elif kind == DUALPIPE:
        _dualpipe(order, publish, p, m)
    else:
        _interleaved(order, publish, p, v, m, paired)
    return order, publish


@njit(cache=True)
def _inputs(order, publish, up, down, m):
    """Where each pass's input comes from: int32[p, n] source stage (-1: none, or the stage itself) and
    int32[p, n] the source pass at whose end the input is sent.

    A forward takes the output of the forward of the virtual stage ``up`` of it, a backward that of the
    backward of the one ``down`` of it. Dependencies on the stage's own earlier passes (the last virtual
    stage's backward on its forward, a W on its B) hold by the order itself.
    """
    p, n, _ = order.shape
    v = up.shape[1]
    f_pub = np.zeros((p, v, m), dtype=np.int32)  # pass whose end sends each forward's output
    b_pub = np.zeros((p, v, m), dtype=np.int32)
    for s in range(p):
        for i in range(n):
            if order[s, i, 0] == FWD:
                f_pub[s, order[s, i, 2], order[s, i, 1]] = publish[s, i]
            elif order[s, i, 0] == BWD:
                b_pub[s, order[s, i, 2], order[s, i, 1]] = publish[s, i]
    src = np.full((p, n), -1, dtype=np.int32)
    src_pass = np.zeros((p, n), dtype=np.int32)
    for s in range(p):
        for i in range(n):
            kind, mb, c = order[s, i, 0], order[s, i, 1], order[s, i, 2]
            if kind == FWD and up[s, c, 0] >= 0:
                src[s, i] = up[s, c, 0]
                src_pass[s, i] = f_pub[up[s, c, 0], up[s, c, 1], mb]
            elif kind == BWD and down[s, c, 0] >= 0:
                src[s, i] = down[s, c, 0]
                src_pass[s, i] = b_pub[down[s, c, 0], down[s, c, 1], mb]
    return src, src_pass

@njit(cache=True)
def _send_targets(order, up, down):
    """int32[p, n]: stage each pass sends its output to (forward: downstream, backward: upstream), -1 when
    it stays on the GPU or ends the path."""
    p, n, _ = order.shape
    dst = np.full((p, n), -1, dtype=np.int32)
    for s in range(p):
        for i in range(n):
            kind, c = order[s, i, 0], order[s, i, 2]
            to = down[s, c, 0] if kind == FWD else (up[s, c, 0] if kind == BWD else -1)
            if to != s:
                dst[s, i] = to
    return dst


@njit(cache=True)
def _last_backwards(order, v):
    """int32[p, v]: index of the last backward (or weight-gradient) pass of each (stage, chunk)."""
    p, n, _ = order.shape
    last = np.zeros((p, v), dtype=np.int32)
    for s in range(p):
        for i in range(n):
            if order[s, i, 0] != FWD:
                last[s, order[s, i, 2]] = i
    return last


@dataclass(frozen=True)
class Plan:
    """What a schedule fixes before any pass time is known (int32 arrays, read-only, shared between calls)."""

    order: np.ndarray       # [p, n, 3], see flowsim.step.schedule.PipelineTimeline
    publish: np.ndarray     # [p, n], see _orders
    src: np.ndarray         # [p, n], see _inputs
    src_pass: np.ndarray    # [p, n]
    send_to: np.ndarray     # [p, n], see PipelineTimeline
    last_bwd: np.ndarray    # [p, v]: index of the last backward pass of each chunk

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.order, self.publish, self.src, self.src_pass, self.send_to, self.last_bwd))


def _build(schedule: str, p: int, v: int, m: int, paired: bool) -> Plan:
    check_layout(schedule, p, v, m)
    kind = SCHEDULE_IDS[schedule]
    if paired and kind not in (ONE_F_ONE_B, INTERLEAVED):
        raise ConfigError("overlap_moe_expert_parallel_comm", "pairs the passes of 1f1b and interleaved (dualpipe "
                          "pairs its own)", schedule)
    if kind == INTERLEAVED and m % p:  # the order's micro-batch numbers would run past m
        raise ConfigError("global_batch_size", "interleaved schedule needs the number of micro-batches to be a "
                          "multiple of pipeline_model_parallel_size", f"{m} micro-batches, pp={p}")
    up, down = path_links(kind, p, v)
    order, publish = _orders(kind, p, v, m, paired)
    src, src_pass = _inputs(order, publish, up, down, m)
    plan = Plan(order, publish, src, src_pass, _send_targets(order, up, down), _last_backwards(order, v))
    for arr in (plan.order, plan.publish, plan.src, plan.src_pass, plan.send_to, plan.last_bwd):
        arr.flags.writeable = False
    return plan


PLAN_CACHE_BYTES = 160 * 2**20
"""Bytes of plans kept per process, least recently used dropped first: every layout of a tune of gpt3-175b on
1,024 GPUs (388 plans, 106 MB, the largest 8.3 MB) with room to spare; 28 bytes per pass."""
_PLANS: OrderedDict = OrderedDict()
_PLANS_LOCK = threading.Lock()
_plans_bytes = 0


def schedule_plan(schedule: str, p: int, v: int, m: int, paired: bool = False) -> Plan:
    """The execution orders and input sources of ``schedule`` on ``p`` stages of ``v`` chunks and ``m``
    micro-batches (checked with :func:`check_layout`); ``paired``: 1F1B with its steady-state passes paired (EP
    all-to-all overlap). Built once and kept (:data:`PLAN_CACHE_BYTES`)."""
    global _plans_bytes
    key = (schedule, p, v, m, paired)
    plan = _PLANS.get(key)
    if plan is not None:
        with _PLANS_LOCK:
            if key in _PLANS:
                _PLANS.move_to_end(key)
        return plan
    plan = _build(schedule, p, v, m, paired)
    with _PLANS_LOCK:
        if key not in _PLANS:
            _PLANS[key] = plan
            _plans_bytes += plan.nbytes
        while _plans_bytes > PLAN_CACHE_BYTES and len(_PLANS) > 1:
            _plans_bytes -= _PLANS.popitem(last=False)[1].nbytes
    return plan
