"""Flow-level pricing of a step's collectives: every group that communicates at once shares the fabric.

With ``comm_engine: flow`` the data-parallel, expert, context-parallel and pipeline collectives of a step are
run as NCCL plans on the cluster topology (:func:`flowsim.network.collective_flows.run_collective`), with all the
groups of that kind in one pipeline stage in one simulation, as rank symmetry prescribes (DESIGN.md): the
DP groups of every TP/CP rank reduce together, the EP groups of a stage exchange tokens together, every
GPU of a stage sends to the next stage together. So several groups behind one NIC, a rail shared by
several groups or an oversubscribed spine slow them as they would on the real fabric. Tensor-parallel
groups stay inside a scale-up domain and keep the analytic price.

Different kinds that overlap in time share the network too (:func:`cross_kind_extra_s`): a stage's
gradient reduction, and the distributed optimizer's parameter all-gather beside the next step's first
forward passes, each run in one simulation with the pipeline sends, expert all-to-alls and context-parallel
transfers that the schedule puts in the same window, anywhere in the pipeline (:func:`window_traffic`), and
each reports its own, longer time (:func:`flowsim.network.collective_flows.run_concurrent`). ZeRO-3/FSDP's
per-layer gathers and reduce-scatters run beside the all-to-alls, context-parallel transfers and pipeline
sends of one layer's window (:func:`layer_cross_kind_extra_s`). The all-to-alls' own slow-down lengthens
the stage's passes; that of the context-parallel transfers, which run beside the attention kernels, and of
the pipeline sends is not charged.
"""
from __future__ import annotations

import functools

import numpy as np

from flowsim.config import SimConfig
from flowsim.config.layout import group_spans, microbatches_per_chunk
from flowsim.step.schedule import BWD, FWD

FLOW_GROUPS = ("dp", "dps", "dpr", "edp", "ep", "epn", "epx", "cp", "pp")
"""Groups priced on the flow engine; ``tp`` and ``etp`` stay analytic (inside one scale-up domain). ``epn`` and
``epx`` are the flex token dispatcher's NVLink and network stages (:func:`flowsim.model.moe.flex_stage_bytes`);
the cross-kind windows count the ``ep`` all-to-alls only."""

CROSS_KIND_MAX_TRANSFERS = 256
"""Transfers per group in the cross-kind simulations (``max_transfers`` of
:func:`flowsim.nccl_models.plans.build_plan`; beyond it a plan merges steps, docs/NCCL.md). A cost cap only:
both sides of each difference (together, alone) use it. Set by hand with benchmarks/bench_step_flow.py:
on gpt3-175b (1,024 H100) the per-stage extras at 256 are within 0.04 ms (15 %) of those at 2,048, for a
sixth of the time."""

Traffic = tuple
"""``(group, stage, op, size_bytes)``: every ``group`` of pipeline stage ``stage`` (for ``pp``: the pairs
between ``stage`` and the next stage) running ``op`` of ``size_bytes`` (nccl-tests convention)."""


def stage_groups(cfg: SimConfig, group: str, stage: int = 0) -> list[list[int]]:
    """Global GPU ids of every ``group`` of pipeline stage ``stage`` (for ``pp``: pairs with the next stage,
    the last stage's with the first).

    Ranks follow Megatron-LM's order (:func:`flowsim.config.layout.group_spans`: ``tp`` fastest, then ``cp``,
    ``dp``, ``pp``; experts ``etp``, ``ep``, expert-``dp``); a stage holds ``tp * cp * dp`` consecutive ranks.
    A group of ``n`` ranks with stride ``d`` starts at every rank of the stage whose ``(rank // d) % n`` is 0.
    """
    if group not in FLOW_GROUPS:
        raise ValueError(f"group {group!r} is not priced on the flow engine")
    t = cfg.training
    size = t.tp * t.cp * t.dp
    o = stage * size
    if group == "pp":
        nxt = (stage + 1) % max(t.pp, 2) * size
        return [[o + i, nxt + i] for i in range(size)]
    n, stride = group_spans(t)[group]
    return [[o + b + k * stride for k in range(n)] for b in range(size) if (b // stride) % n == 0]


@functools.lru_cache(maxsize=1024)
def _stage_groups_array(cfg: SimConfig, group: str, stage: int) -> np.ndarray:
    """:func:`stage_groups` as a read-only int64[n_groups, n_ranks] array, cached (the cross-kind simulations ask
    for the same groups many times)."""
    out = np.array(stage_groups(cfg, group, stage), dtype=np.int64)
    out.flags.writeable = False
    return out


@functools.lru_cache(maxsize=4096)
def _flow(cfg: SimConfig, gpu, group: str, op: str, size_bytes: float):
    groups = _stage_groups_array(cfg, group, 0)
    from flowsim.network.collective_flows import run_collective  # the flow engine loads when a flow runs

    return run_collective(cfg.cluster, gpu, op, size_bytes, groups[0], concurrent_groups=groups[1:],
                          utilization=False)


def flow_time_s(cfg: SimConfig, gpu, group: str, op: str, size_bytes: float) -> float:
    """Seconds of one ``op`` of ``size_bytes`` when every ``group`` of a stage runs it at once (the slowest)."""
    return _flow(cfg, gpu, group, op, float(size_bytes)).time_s


@functools.lru_cache(maxsize=4096)
def _together_s(cfg: SimConfig, gpu, items: tuple, n_chain: int, focus: tuple) -> tuple:
    """Seconds of each ``focus`` item when all ``items`` run in one simulation, the first ``n_chain`` one
    after another (one stream), the rest from time 0."""
    after = [None] + list(range(n_chain - 1)) + [None] * (len(items) - n_chain)
    from flowsim.network.collective_flows import run_concurrent

    res = run_concurrent(cfg.cluster, gpu, [(op, size, _stage_groups_array(cfg, g, s)) for g, s, op, size in items],
                         after=after, focus=focus, max_transfers=CROSS_KIND_MAX_TRANSFERS, utilization=False)
    return tuple(res[i].time_s for i in focus)


def _alone_s(cfg: SimConfig, gpu, item: Traffic) -> float:
    """Seconds of one traffic item with nothing else on the network."""
    return _together_s(cfg, gpu, (item,), 1, (0,))[0]


def _a2a_bytes(wl) -> dict:
    """Expert all-to-all bytes of one MoE layer for one micro-batch, per phase (``fwd``, ``bwd``,
    ``recompute``)."""
    return {ph: sum(c.count * c.size_bytes for c in wl.moe_layer.comms if c.group == "ep" and c.phase == ph)
            for ph in ("fwd", "bwd", "recompute")}


def _cp_bytes(wl) -> dict:
    """Context-parallel bytes of one layer for one micro-batch: ``{op: {phase: bytes}}`` (ring attention's
    K/V ``sendrecv``, or the all-gather variant's ``allgather`` and ``reducescatter``). Dense and MoE layers
    run the same attention."""
    out = {}
    for c in wl.layer.comms:
        if c.group == "cp":
            ph = out.setdefault(c.op, dict.fromkeys(("fwd", "bwd", "recompute"), 0.0))
            ph[c.phase] += c.count * c.size_bytes
    return out


def window_traffic(cfg: SimConfig, gpu, wl, timeline, t0_s: float, t1_s: float) -> tuple:
    """Pipeline sends, expert all-to-alls and context-parallel transfers of the whole pipeline that run between
    ``t0_s`` and ``t1_s``.

    Each stage's all-to-alls and context-parallel transfers are the bytes of its passes (forward, backward with
    its recompute) that overlap the window, pro rata of the overlap; each boundary's sends are the sends (one
    ``p2p_bytes`` transfer after each pass that feeds the neighbouring stage, lasting the stage-0 send time)
    that overlap it, counted per direction, the busier direction's count carried both ways (``sendrecv``).

    Parameters
    ----------
    cfg : SimConfig
        The job.
    gpu : GPUSpec
        Its GPU.
    wl : flowsim.model.workload.Workload
        Its workload (MoE layer comms, layers per chunk, ``p2p_bytes``).
    timeline : flowsim.step.schedule.PipelineTimeline
        The pipeline schedule, seconds.
    t0_s, t1_s : float
        The window, seconds from the step start.

    Returns
    -------
    tuple of Traffic
        ``("ep", stage, "alltoall", bytes)``, ``("cp", stage, op, bytes)`` and ``("pp", boundary, "sendrecv",
        bytes)``, non-zero only.
    """
    t = cfg.training
    p, v = t.pp, t.vpp
    kind, chunk = timeline.order[:, :, 0], timeline.order[:, :, 2]
    start, end = timeline.start_s, timeline.end_op_s
    stage = np.arange(p)[:, None]
    out = []
    frac = np.clip(np.minimum(end, t1_s) - np.maximum(start, t0_s), 0.0, None) / np.maximum(end - start, 1e-30)
    if t.ep > 1 and wl.moe_layer is not None:
        per = _a2a_bytes(wl)
        moe, rec = wl.chunk_moe_layers[stage, chunk], wl.chunk_recompute_moe_layers[stage, chunk]
        pass_bytes = np.where(kind == FWD, moe * per["fwd"],
                              np.where(kind == BWD, moe * per["bwd"] + rec * per["recompute"], 0.0))
        out += [("ep", s, "alltoall", float(b)) for s, b in enumerate((frac * pass_bytes).sum(axis=1)) if b > 0]
    layers, rec = wl.chunk_layers[stage, chunk], wl.chunk_recompute_layers[stage, chunk]
    for op, per in _cp_bytes(wl).items():
        pass_bytes = np.where(kind == FWD, layers * per["fwd"],
                              np.where(kind == BWD, layers * per["bwd"] + rec * per["recompute"], 0.0))
        out += [("cp", s, op, float(b)) for s, b in enumerate((frac * pass_bytes).sum(axis=1)) if b > 0]
    if p > 1:
        p2p_s = flow_time_s(cfg, gpu, "pp", "sendrecv", wl.p2p_bytes)
        sending = (end < t1_s) & (end + p2p_s > t0_s)
        up = sending & (kind == FWD) & ~((stage == p - 1) & (chunk == v - 1))
        down = sending & (kind == BWD) & ~((stage == 0) & (chunk == 0))
        n_up = np.bincount(np.broadcast_to(stage, kind.shape)[up], minlength=p)
        n_down = np.bincount((np.broadcast_to(stage, kind.shape)[down] - 1) % p, minlength=p)
        out += [("pp", b, "sendrecv", float(n * wl.p2p_bytes)) for b, n in enumerate(np.maximum(n_up, n_down))
                if n > 0]
    return tuple(out)


def layer_traffic(cfg: SimConfig, wl, stage: int) -> dict:
    """Expert all-to-alls, context-parallel transfers and pipeline sends of one layer's forward and backward
    window of a stage, bytes.

    Volumes, as :func:`window_traffic` takes them, averaged over the stage's layer passes of the step: the
    all-to-all bytes of its MoE layers (backward with their recompute), one layer's context-parallel bytes
    (backward with its share of recompute) and the sends over its boundary to
    the next stage (one ``p2p_bytes`` each way per chunk pass: activations up after the forward, gradients
    back after the backward), divided by the layer passes of each phase. For a stage with a next stage (the
    last stage's boundary wraps to the first).

    Returns
    -------
    dict
        ``{"fwd": tuple of Traffic, "bwd": tuple of Traffic}``, non-zero items only.
    """
    t = cfg.training
    v = wl.chunk_layers.shape[1]
    runs = microbatches_per_chunk(t.schedule, cfg.num_microbatches, v)
    n_layers = max(float(wl.chunk_layers[stage] @ runs), 1.0)
    per = {"fwd": 0.0, "bwd": 0.0}
    if t.ep > 1 and wl.moe_layer is not None:
        a2a = _a2a_bytes(wl)
        moe, rec = float(wl.chunk_moe_layers[stage] @ runs), float(wl.chunk_recompute_moe_layers[stage] @ runs)
        per = {"fwd": moe * a2a["fwd"], "bwd": moe * a2a["bwd"] + rec * a2a["recompute"]}
    sends = (("pp", stage, "sendrecv", float(runs.sum()) * wl.p2p_bytes / n_layers),) if t.pp > 1 else ()
    rec = float(wl.chunk_recompute_layers[stage] @ runs) / n_layers  # recomputed share of the layer passes
    cp = {ph: tuple(("cp", stage, op, b) for op, per in _cp_bytes(wl).items()
                    if (b := per[ph] + (rec * per["recompute"] if ph == "bwd" else 0.0)) > 0)
          for ph in ("fwd", "bwd")}
    return {ph: ((("ep", stage, "alltoall", b / n_layers),) if b > 0 else ()) + cp[ph] + sends
            for ph, b in per.items()}


def _extra_beside_s(cfg: SimConfig, gpu, parts: tuple, n_chain: int, others: tuple) -> tuple:
    """Extra seconds of ``parts`` (the first ``n_chain`` one after another on one stream, the rest from time 0)
    and of their stage's own all-to-alls among ``others`` when all run in one simulation, against each alone.

    Returns
    -------
    extra_s : float64[len(parts)]
        Per part, seconds (>= 0: the difference is clamped, as adding flows can only lower a flow's max-min
        share; sub-tolerance event-batching noise is not a slow-down).
    ep_extra_s : float
        The stage's own all-to-alls in ``others``, seconds (>= 0).
    """
    n = len(parts)
    if not others:
        return np.zeros(n), 0.0
    stage = parts[0][1]
    focus = tuple(range(n)) + tuple(n + k for k, it in enumerate(others) if it[0] == "ep" and it[1] == stage)
    items = tuple(parts) + tuple(others)
    together = _together_s(cfg, gpu, items, n_chain, focus)
    extra = np.array([max(0.0, x - _alone_s(cfg, gpu, items[i])) for x, i in zip(together, focus)])
    return extra[:n], float(extra[n:].sum())


def layer_cross_kind_extra_s(cfg: SimConfig, gpu, wl, phase: str, parts: tuple, n_chain: int) -> tuple:
    """Extra seconds that ZeRO-3/FSDP's per-layer collectives of one layer window (``phase`` ``fwd``: the next
    layer's all-gather; ``bwd``: the all-gather and reduce-scatter, ``n_chain`` of them on one stream, and the
    replicas' all-reduce) and the stage's all-to-alls of that window cost each other when they run in one
    simulation with :func:`layer_traffic`. Returns as :func:`_extra_beside_s`, seconds per layer pass."""
    return _extra_beside_s(cfg, gpu, parts, n_chain, layer_traffic(cfg, wl, parts[0][1])[phase])


def cross_kind_extra_s(cfg: SimConfig, gpu, wl, timeline, reduction: tuple, t0_s: float, t1_s: float):
    """Extra seconds that sharing the network with the traffic of other kinds costs a stage's gradient
    reduction or parameter all-gather, and its own expert all-to-alls.

    The parts (``reduction``: one Traffic per group kind, the whole step's bytes of each, one stream
    issuing them in turn) run in one simulation with :func:`window_traffic` of their window ``[t0_s, t1_s]``
    (their span when they run alone: for the reduction from its first bucket to the end of the stream; for
    the distributed optimizer's gather, the next step's first forward passes). Each part's extra is its time
    there less its time alone; spread over its buckets it is the slow-down of each bucket (on a saturated
    link the fair share costs the other kinds' bytes over the link's capacity, wherever in the window they
    fall). The all-to-alls of the stage in the window (its last backward passes, under
    ``overlap_grad_reduce``; its first forward passes, under ``overlap_param_gather``) likewise take longer
    by their extra, which lengthens the stage's passes.

    Parameters
    ----------
    cfg, gpu, wl, timeline
        As in :func:`window_traffic`.
    reduction : tuple of Traffic
        ``(group, stage, op, bytes)`` of each part of one stage's gradient reduction or parameter gather, in
        issue order.
    t0_s, t1_s : float
        Its window, seconds from the step start.

    Returns
    -------
    extra_s, ep_extra_s
        As :func:`_extra_beside_s`, seconds.
    """
    others = window_traffic(cfg, gpu, wl, timeline, t0_s, t1_s)
    return _extra_beside_s(cfg, gpu, reduction, len(reduction), others)
