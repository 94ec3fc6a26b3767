"""Pipeline schedules on per-stage timelines: GPipe, 1F1B, interleaved 1F1B, ZB-H1 and DualPipe.

Each stage runs its passes (forward F, backward B and, where the backward is split, weight-gradient W) of
every micro-batch and model chunk in the order its schedule prescribes, each as soon as its input has
arrived. A micro-batch flows along a path of virtual stages (a model chunk on a pipeline stage); a pass's
input arrives ``p2p_s`` seconds after the producing pass on the neighbouring virtual stage ends (the
activation or gradient send), or at once when that virtual stage sits on the same GPU. The resulting
timelines give the step's pipeline part: every stage's busy time, idle time (bubble) and the end of its
last backward. With equal pass times per stage and ``p2p_s = 0`` the bubbles equal the closed forms below
(``tests/test_schedules.py``, ``tests/test_memory_schedule.py``).

Orders:

* GPipe: all forwards, then all backwards. Bubble ``(p - 1)(F + B)``.
* 1F1B (Narayanan et al. 2021, sec. 2.2; Megatron-LM ``core/pipeline_parallel/schedules.py``):
  ``min(p - stage - 1, m)`` warm-up forwards, then one forward / one backward pairs, then the remaining
  backwards. Bubble ``(p - 1)(F + B)``, B the whole backward.
* Interleaved 1F1B with ``v`` chunks per stage (Megatron-LM): ``(p - stage - 1) * 2 + (v - 1) * p``
  warm-up forwards (capped at ``m * v``); virtual micro-batch ``k`` is model chunk ``(k // p) % v`` of
  micro-batch ``(k // (p * v)) * p + k % p`` (chunks taken in reverse for backwards). Bubble
  ``(p - 1)(F + B) / v`` with F, B of a whole stage.
* ``zb-h1``, ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", arXiv 2401.10241, sec. 3.1): the
  backward is split into B (input gradients, all the previous stage waits for) and W (weight gradients).
  1F1B's warm-up, and stage ``s`` defers its first ``s`` W passes: in the steady state it runs F B, plus
  the oldest pending W once ``s`` of them are pending, and the deferred Ws fill the cool-down. Order as in
  the authors' ``zbpp_light/auto_schedule.py`` (PyPI ``zbpp-light`` 0.0.1). Every stage keeps at most
  ``p`` micro-batches between F and W, the peak of 1F1B. Bubble ``(p - 1)(F + B - W)`` (paper sec. 3.1,
  B the input-gradient pass; DeepSeek-V3 Table 2 writes it ``(PP - 1)(F + B - 2W)`` with B the whole
  backward), a third of 1F1B's when F = B = W.
* ``dualpipe``, DualPipe (DeepSeek-AI 2024, DeepSeek-V3 technical report, arXiv 2412.19437, sec. 3.2.1 and
  Table 2; order from ``DualPipe.step`` in PyPI ``dualpipe`` 1.0.0): two pipelines run in opposite
  directions over the same ``p`` (even) ranks. Chunk 0 of rank ``s`` is model stage ``s`` of the pipeline
  fed at rank 0; chunk 1 is model stage ``p - 1 - s`` of the pipeline fed at rank ``p - 1`` (each rank holds
  two model stages: twice the parameters of 1F1B). Micro-batches ``0 .. m/2 - 1`` go the first way,
  ``m/2 .. m - 1`` the other. Each rank runs the reference's eight phases (warm-up forwards of both
  directions, zero-bubble B/W steps, the steady state of paired forward-of-one-direction plus
  backward-of-the-other "F&B" chunks, cool-down backwards whose W passes are deferred into the tail).
  Bubble ``(p/2 - 1)(F&B + B - 3W)``, F&B the paired forward and (whole) backward, B the whole backward;
  ``p + 1`` chunk activations in flight at the peak.

With F = B = W and no transfer time every schedule's simulated bubble equals its closed form; with
unequal costs the list schedule gives its own value: ZB-H1's formula holds exactly while W <= min(F, B),
DualPipe's while F = B (the input-gradient pass) and W <= B (checked over random costs).

DualPipe's pairing: in an F&B call the forward's and the backward's expert all-to-alls run beside the other
pass's compute (DeepSeek-V3 sec. 3.2.1), so the call lasts ``overlapped_s(compute, all-to-all, SMs)``
(:func:`flowsim.step.overlap.overlapped_s`: the longer of the two, compute slowed while NCCL holds its SMs)
instead of their sum; the saving is taken off the B pass.

1F1B with EP all-to-all overlap (``overlap_moe_expert_parallel_comm``, Megatron-LM
``--overlap-moe-expert-parallel-comm``: the forward of one micro-batch and the backward of another run
interleaved, each one's all-to-alls beside the other's compute): one more warm-up forward than 1F1B, so
that the two passes of a pair belong to different micro-batches (a backward needs its own forward's loss),
and each steady-state forward forms one call with the backward after it, priced as DualPipe's F&B calls;
the extra forward holds one more micro-batch's activations. With ``p > 1`` a merged call sends its
forward's output only when the backward is done too, which in a plain 1F1B order puts two passes on every
step of the stage-to-stage chain, so flowsim pairs plain 1F1B on one stage only; interleaved 1F1B pairs the
same way (one more warm-up forward, each steady-state forward in one call with the backward after it, which
belongs to another model chunk), as Megatron-LM's A2A overlap with ``vpp > 1`` does.

Each stage's CPU issues its passes in order, running ahead of the GPU across micro-batches (the host-side
timeline, :mod:`flowsim.step.host`), until a synchronisation point: the step's start, and with ``p2p_sync``
every pipeline send and receive (Megatron's ``torch.cuda.synchronize()`` after ``batch_isend_irecv``).

DeepSpeed's ``PipelineEngine`` (``engine="deepspeed"``, ``deepspeed/runtime/pipe/schedule.py``
``TrainSchedule``, ``p2p.py``): 1F1B's per-stage order (forward steps from step ``s``, backward steps from
``2p - s - 1``, alternating), each step's instructions in order, and a send (``dist.send`` or a two-rank
``dist.broadcast``, never asynchronous) holds the stream until it ends. A pass's output leaves at the start of
the stage's next step: in 0.18+ a backward step receives before it sends the previous forward's activation; in
0.6 (``deepspeed-0.6``) a forward step receives before it sends the previous backward's gradient. NCCL's
send/receive rendezvous is not modelled.

What is not modelled: the pipeline sends inside a call are not overlapped; each call's outputs are sent
when it ends, as in the
reference, but its batched receives do not hold the rank back. The gradients of the two copies of each
model stage are not reduced with each other. Sends never block the sender and the two directions'
transfers do not contend. ZB-H1's activations are counted until W (part of them is freed at B).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from flowsim._jit import njit

from flowsim.config.training import PIPELINE_ENGINES
from flowsim.errors import ConfigError
from flowsim.step.host import PassHost
from flowsim.step.overlap import shared_sm_time_s
from flowsim.step.pipeline_orders import BWD, FWD, WGRAD
from flowsim.step.pipeline_orders import SCHEDULE_IDS, path_links  # noqa: F401 -- kept importable from here
from flowsim.step.pipeline_orders import schedule_plan as _plan
from flowsim.step.sums import pairwise_sum

DEEPSPEED_SCHEDULES = ("1f1b",)  # the order of DeepSpeed's TrainSchedule
SPLIT_BACKWARD = ("zb-h1", "dualpipe")  # schedules that run weight gradients as passes of their own


@dataclass(frozen=True)
class PipelineTimeline:
    """Result of one pipeline schedule.

    Attributes
    ----------
    end_s : float64[p]
        When each stage finishes its last backward, seconds from the step start.
    busy_s : float64[p]
        Sum of the stage's pass times, seconds.
    last_bwd_start_s, last_bwd_end_s : float64[p, v]
        Start and end of the last backward pass of each (stage, chunk): the window in which the chunk's
        gradients become final.
    start_s, end_op_s : float64[p, n_ops]
        Start and end of each stage's passes in execution order (for traces), seconds.
    order : int32[p, n_ops, 3]
        (pass kind FWD/BWD/WGRAD, micro-batch, chunk) of each pass in execution order.
    send_to : int32[p, n_ops]
        Stage that each pass's output is sent to, -1 when it stays on the GPU or ends the path.
    send_s : float64[p, n_ops]
        When that send starts, seconds: the pass's end, or for DualPipe the end of the call it belongs to.
    free_end_s : float or None
        With ``free_transfers``: when the last stage would end were the transfers free (the same schedule and
        passes, ``p2p_s = 0``), seconds; None when not asked for.
    """

    end_s: np.ndarray
    busy_s: np.ndarray
    last_bwd_start_s: np.ndarray
    last_bwd_end_s: np.ndarray
    start_s: np.ndarray
    end_op_s: np.ndarray
    order: np.ndarray
    send_to: np.ndarray
    send_s: np.ndarray
    free_end_s: float | None = None


@njit(cache=True)
def _durations(order, publish, fwd_s, bwd_s, w_s, comm_f, comm_b, share):
    """float64[p, n_ops]: seconds of every pass. A forward and the backward after it that share a DualPipe
    call (same ``publish``) together last what the pairing leaves: the two passes' communication
    (``comm_f`` of the forward's chunk, ``comm_b`` of the backward's, seconds, included in ``fwd_s`` and
    ``bwd_s``) runs beside their compute, which it slows while it holds ``share`` of the SMs
    (:func:`flowsim.step.overlap.overlapped_s`)."""
    p, n, _ = order.shape
    dur = np.zeros((p, n))
    for s in range(p):
        for i in range(n):
            kind, c = order[s, i, 0], order[s, i, 2]
            dur[s, i] = fwd_s[s, c] if kind == FWD else (bwd_s[s, c] if kind == BWD else w_s[s, c])
            if kind == BWD and i > 0 and order[s, i - 1, 0] == FWD and publish[s, i - 1] == publish[s, i]:
                cf = order[s, i - 1, 2]
                comm = comm_f[s, cf] + comm_b[s, c]
                comp = fwd_s[s, cf] + bwd_s[s, c] - comm
                paired = shared_sm_time_s(comp, comm, share)
                # the call's outputs leave when it ends, so only the pair's total matters
                dur[s, i - 1] = min(dur[s, i - 1], paired)
                dur[s, i] = paired - dur[s, i - 1]
    return dur


@njit(cache=True)
def _run(order, src, src_pass, dur, p2p_s, host_s, lag_s, dst, p2p_sync, engine):
    """List-schedule every stage's passes (``dur``: seconds of each) with each stage's CPU issuing them;
    returns start/end per pass (seconds) and how many ran. ``host_s`` and ``lag_s`` of no columns: the CPU
    issues every pass in no time.

    A pass's GPU work may start when its stage is free and its input (:func:`_inputs`) has arrived:
    ``p2p_s`` after the source pass's output is sent, when that ran on another stage. The stage's CPU issues
    the passes in order, ``host_s`` seconds each, running ahead of the GPU; a pass started with the CPU at
    ``c`` and the GPU at ``g`` ends at ``max(g + dur, c + max(host, dur + lag))`` (the tandem queue's closed
    form, :mod:`flowsim.step.host`; ``lag_s``: how much later than its kernels a pass issued from an idle CPU
    ends). The reported start is the pass's end less its duration (GPU waits for the CPU show as idle time).

    ``p2p_sync``: the CPU waits for the device at every pipeline send and receive. ``engine``: an index of
    :data:`PIPELINE_ENGINES` (DeepSpeed's send order and blocking sends: module docstring).
    """
    p, n, _ = order.shape
    start = np.zeros((p, n))
    end = np.zeros((p, n))
    sent = np.full((p, n), -1.0)  # when each pass's output leaves its stage (-1: not yet known)
    nxt = np.zeros(p, dtype=np.int64)  # passes each stage has run
    free = np.zeros(p)
    cpu = np.zeros(p)  # when each stage's CPU has issued its passes so far
    issues = host_s.shape[1] > 0
    done = 0
    while done < p * n:
        progressed = False
        for s in range(p):
            while nxt[s] < n:
                i = nxt[s]
                sends = i > 0 and dst[s, i - 1] >= 0
                # DeepSpeed: the previous pass's output leaves at this step's start, after its receive when the
                # step switches direction the release's way
                late = ((engine == 1 and order[s, i - 1, 0] == FWD and order[s, i, 0] == BWD)
                        or (engine == 2 and order[s, i - 1, 0] == BWD and order[s, i, 0] == FWD))
                deepspeed = engine > 0
                if deepspeed and sends and not late and sent[s, i - 1] < 0.0:
                    sent[s, i - 1] = free[s]
                    free[s] += p2p_s
                ready = 0.0
                q = src[s, i]
                if q >= 0:
                    if sent[q, src_pass[s, i]] < 0.0:
                        break
                    ready = sent[q, src_pass[s, i]] + (p2p_s if q != s else 0.0)
                if deepspeed and sends and late:
                    sent[s, i - 1] = max(free[s], ready)
                    free[s] = sent[s, i - 1] + p2p_s
                t0 = max(free[s], ready)
                if p2p_sync and (sends or (q >= 0 and q != s)):  # waits for the device, the send, the input
                    cpu[s] = max(cpu[s], t0, end[s, i - 1] + p2p_s if sends else 0.0)
                host, lag = (host_s[s, i], lag_s[s, i]) if issues else (0.0, 0.0)
                free[s] = max(t0 + dur[s, i], cpu[s] + max(host, dur[s, i] + lag))
                cpu[s] += host
                start[s, i] = free[s] - dur[s, i]
                end[s, i] = free[s]
                if engine == 0 or dst[s, i] < 0 or i == n - 1:
                    sent[s, i] = free[s]
                nxt[s] += 1
                done += 1
                progressed = True
        if not progressed:
            break  # a cycle: cannot happen for the orders built above; caught by the caller
    return start, end, done


@njit(cache=True)
def _timeline_arrays(start, end, publish, last_bwd):
    """What :class:`PipelineTimeline` reads of a run: each pass's send time (the end of the pass that publishes
    it), each stage's busy seconds (its passes' durations summed as numpy sums a row), the start and end of each
    chunk's last backward."""
    p, n = end.shape
    v = last_bwd.shape[1]
    send_s, busy = np.empty((p, n)), np.empty(p)
    lb_start, lb_end = np.empty((p, v)), np.empty((p, v))
    took = np.empty(n)
    for s in range(p):
        for i in range(n):
            send_s[s, i] = end[s, publish[s, i]]
            took[i] = end[s, i] - start[s, i]
        busy[s] = pairwise_sum(took, 0, n)
        for c in range(v):
            lb_start[s, c], lb_end[s, c] = start[s, last_bwd[s, c]], end[s, last_bwd[s, c]]
    return send_s, busy, lb_start, lb_end


@functools.lru_cache(maxsize=4096)  # a few floats each: every layout of a tune (gpt3-175b on 1,024 GPUs: 388)
def held_microbatches(schedule: str, p: int, v: int, m: int, paired: bool = False) -> tuple:
    """Peak activations each stage holds, in micro-batches through all of the stage's chunks.

    Counts, along the stage's execution order, the chunk activations stored by a forward and not yet
    released by the micro-batch's last backward pass through that chunk (W where the backward is split),
    divided by ``v``: ``m`` for GPipe, ``min(p - s, m)`` for 1F1B, ``p + (p - 1) / v`` on interleaved
    1F1B's first stage (Korthikanti et al. 2022 sec. 4.2.3), ``p`` on every ZB-H1 stage (``m >= p``) and
    ``(p + 1) / 2`` (``p + 1`` chunks, DeepSeek-V3 Table 2) on every DualPipe rank.
    """
    kinds = _plan(schedule, p, v, m, paired).order[:, :, 0]
    release = WGRAD if schedule in SPLIT_BACKWARD else BWD
    held = np.cumsum((kinds == FWD).astype(np.int64) - (kinds == release), axis=1)
    return tuple(float(x) / v for x in held.max(axis=1))


def simulate_pipeline(schedule: str, num_microbatches: int, fwd_s: np.ndarray, bwd_s: np.ndarray,
                      p2p_s: float, wgrad_s: np.ndarray | None = None, overlap_comm=None,
                      paired: bool = False, host: PassHost | None = None, p2p_sync: bool = False,
                      engine: str = "megatron", free_transfers: bool = False) -> PipelineTimeline:
    """Run a pipeline schedule.

    Parameters
    ----------
    schedule : str
        ``gpipe``, ``1f1b``, ``interleaved``, ``zb-h1`` or ``dualpipe``.
    num_microbatches : int
        Micro-batches per step, >= 1 (DualPipe: even and >= 2p).
    fwd_s, bwd_s : float64[p, v]
        Forward and backward (including recompute) time of one micro-batch through model chunk ``c`` of
        stage ``s``, seconds. DualPipe takes ``v = 2``: chunk 0 of the pipeline fed at stage 0, chunk 1 of
        the one fed at stage ``p - 1``.
    p2p_s : float
        Time to move one activation (or gradient) between neighbouring stages, seconds.
    wgrad_s : float64[p, v], optional
        For ``zb-h1`` and ``dualpipe``: the weight-gradient part of ``bwd_s``, run as its own W pass (the
        B pass then lasts ``bwd_s - wgrad_s``). Ignored by the other schedules.
    overlap_comm : (float64[p, v], float64[p, v], float), optional
        For ``dualpipe`` and paired ``1f1b``: the communication inside ``fwd_s`` and inside the B pass
        (seconds) that a paired forward-and-backward call hides behind the other pass's compute (the expert
        all-to-alls, DeepSeek-V3 sec. 3.2.1), and the share of the SMs it holds meanwhile. Ignored by the
        other schedules.
    paired : bool
        ``1f1b`` and ``interleaved``: one more warm-up forward and each steady-state forward paired with the
        backward after it (Megatron-LM ``--overlap-moe-expert-parallel-comm``).
    host : PassHost, optional
        The CPU seconds to issue each (stage, chunk)'s F, B and W pass and their lags
        (:func:`flowsim.step.host.pass_host`); none: the CPU never holds the GPU back.
    p2p_sync : bool
        The CPU waits for the device at every pipeline send and receive (Megatron's
        ``torch.cuda.synchronize()`` after ``batch_isend_irecv``).
    engine : str
        ``megatron`` (sends run beside the compute), ``deepspeed`` or ``deepspeed-0.6`` (DeepSpeed's
        ``PipelineEngine``: 1f1b order, each output sent at the start of the stage's next step, the stream
        waiting for it; module docstring).
    free_transfers : bool
        Also run the schedule with free transfers, on the same pass and host times, for ``free_end_s``.
    """
    if engine.startswith("deepspeed") and schedule not in DEEPSPEED_SCHEDULES:
        raise ConfigError("pipeline_engine", "deepspeed's TrainSchedule runs the 1f1b order", schedule)
    fwd_s = np.ascontiguousarray(fwd_s, dtype=np.float64)
    bwd_s = np.ascontiguousarray(bwd_s, dtype=np.float64)
    p, v = fwd_s.shape
    plan = _plan(schedule, p, v, int(num_microbatches), bool(paired))
    w_s = np.zeros_like(fwd_s)
    if schedule in SPLIT_BACKWARD and wgrad_s is not None:
        w_s = np.ascontiguousarray(wgrad_s, dtype=np.float64)
        bwd_s = bwd_s - w_s
    comm_f = comm_b = np.zeros_like(fwd_s)
    share = 0.0
    if (schedule == "dualpipe" or paired) and overlap_comm is not None:
        comm_f, comm_b = (np.ascontiguousarray(a, dtype=np.float64) for a in overlap_comm[:2])
        share = float(overlap_comm[2])
    dur = _durations(plan.order, plan.publish, fwd_s, bwd_s, w_s, comm_f, comm_b, share)
    hs = lag = np.zeros((p, 0))
    if host is not None:
        rows = np.arange(p)[:, None]
        hs = host.host_s[plan.order[:, :, 0], rows, plan.order[:, :, 2]]
        lag = host.lag_s[plan.order[:, :, 0], rows, plan.order[:, :, 2]]
    before, after = (plan.order, plan.src, plan.src_pass, dur), (hs, lag, plan.send_to, bool(p2p_sync),
                                                                 PIPELINE_ENGINES.index(engine))
    start, end, done = _run(*before, float(p2p_s), *after)
    assert done == end.size, "pipeline schedule deadlocked"
    free_end = None
    if free_transfers:
        _, free, done = _run(*before, 0.0, *after)
        assert done == free.size, "pipeline schedule deadlocked"
        free_end = float(free[:, -1].max())
    send_s, busy, lb_start, lb_end = _timeline_arrays(start, end, plan.publish, plan.last_bwd)
    return PipelineTimeline(end_s=end[:, -1].copy(), busy_s=busy, last_bwd_start_s=lb_start, last_bwd_end_s=lb_end,
                            start_s=start, end_op_s=end, order=plan.order, send_to=plan.send_to, send_s=send_s,
                            free_end_s=free_end)
