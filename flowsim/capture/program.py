"""Simulate a captured workload (:mod:`flowsim.capture`) on a target cluster.

Compute rows are priced by the kernel model for the target GPU (:func:`flowsim.kernels.op_times`), never
by the CPU the step was captured on. Collectives are priced by NCCL's model
(:func:`flowsim.nccl_models.predict`) on the layout of their group (:func:`flowsim.network.comm_layout.group_layout`);
a group must be an arithmetic progression of global ranks (what DeviceMesh and DDP build), else the
layout is not defined and a ConfigError explains it. A point-to-point row (``peer`` set) is priced on the
two-rank layout of its rank and its peer.

Timeline of one stage: one compute stream and one communication stream, both in capture order. A blocking
collective starts when both streams are free and the compute stream waits for its end. An asynchronous one
starts when the communication stream is free and the compute stream reaches it, and the compute stream
waits for it only at its ``wait`` op (or the end of the step). A prefetched collective (``issue`` set) may
start from the compute clock at its ``issue`` op. While a collective runs it holds ``n_ctas`` SMs and slows
the compute beside it to ``1 - n_ctas / sm_count`` of its speed: the rule of
:func:`flowsim.step.overlap.slowed_end_s`, applied kernel by kernel (compute already timed before a
prefetched collective is reached in capture order is not slowed: an approximation).

Pipeline (several stages, one captured rank each, in stage order): each stage's ops split into its forward
region (ops before its last backward op that the autograd engine did not issue), its backward region (ops
the engine issued) and its tail (after the last backward op: gradient synchronisation, optimizer);
point-to-point rows, which must go to the neighbouring stages' captured ranks, leave the regions and
become the schedule's transfers. The number of micro-batches ``m`` is the number of activations a stage
exchanges with a neighbour (half its point-to-point rows with it: one activation and one gradient each).
One micro-batch's forward and backward times are the two-stream timelines of the regions divided by
``m`` (a collective waited outside its region is waited at the region's end); they run under
:func:`flowsim.step.schedule.simulate_pipeline` (1F1B by default, whatever order the script ran) with the
slowest point-to-point row as the transfer time, and each stage's tail follows its last backward.
"""
from __future__ import annotations

import bisect
import dataclasses

import numpy as np
import pandas as pd

from flowsim.errors import ConfigError
from flowsim.gpu_specs import get_gpu
from flowsim.kernels import OP_COLUMNS, op_times
from flowsim.kernels.calibration import job_stack
from flowsim.step import CollectivePricer, PipelineProgram, StreamOp, run_pipeline, run_streams


@dataclasses.dataclass(frozen=True)
class PipelineResult:
    """Pipeline part of a multi-stage workload (seconds; arrays over stages, in stage order).

    Attributes
    ----------
    schedule : str
        The schedule simulated (:data:`flowsim.step.schedule.SCHEDULE_IDS`).
    microbatches : int
        Micro-batches per step, from the point-to-point rows.
    fwd_s, bwd_s : numpy.ndarray
        One micro-batch's forward and backward time of each stage.
    tail_s : numpy.ndarray
        Each stage's ops after its last backward (gradient synchronisation, optimizer).
    end_s : numpy.ndarray
        When each stage's last backward ends.
    p2p_s : float
        One activation (or gradient) transfer between neighbouring stages.
    p2p_bytes : float
        Its size, bytes.
    critical_stage : int
        The stage that ends the step.
    """

    schedule: str
    microbatches: int
    fwd_s: np.ndarray
    bwd_s: np.ndarray
    tail_s: np.ndarray
    end_s: np.ndarray
    p2p_s: float
    p2p_bytes: float
    critical_stage: int


@dataclasses.dataclass(frozen=True)
class WorkloadResult:
    """Predicted step of a captured workload (seconds).

    Attributes
    ----------
    step_time_s : float
        End of the last op of the step, compute or communication, on any stage.
    compute_s : float
        Sum of the compute kernels at full speed (of the critical stage with a pipeline).
    comm_s : dict of str to float
        Sum of collective times per nccl-tests op (of the critical stage with a pipeline).
    exposed_comm_s : float
        ``step_time_s - compute_s - bubble_s``: communication not hidden plus the slowdown of overlapped
        compute.
    bubble_s : float
        Idle time of the critical stage inside the pipeline (0 without one).
    op_time_s : list of numpy.ndarray
        Seconds of every op of each stage in capture order (collectives: their own duration).
    collectives : pandas.DataFrame
        One row per distinct (stage, op, size, group): ranks, algorithm/protocol, seconds, calls per step.
    pipeline : PipelineResult or None
        The pipeline schedule, for a workload of several stages.
    """

    step_time_s: float
    compute_s: float
    comm_s: dict
    exposed_comm_s: float
    bubble_s: float
    op_time_s: list
    collectives: pd.DataFrame
    pipeline: PipelineResult | None = None


def _stride(ranks: list, name: str) -> tuple[int, int]:
    """(first rank, stride) of an arithmetic progression; ConfigError otherwise."""
    if len(ranks) == 1:
        return ranks[0], 1
    step = ranks[1] - ranks[0]
    if step < 1 or any(b - a != step for a, b in zip(ranks, ranks[1:])):
        raise ConfigError(f"groups.{name}", "must be an arithmetic progression of increasing ranks (NCCL's "
                                            "layout model needs the same ranks on every node)",
                          f"{ranks[:6]}{'...' if len(ranks) > 6 else ''}")
    return ranks[0], step


def _cluster(cluster, num_gpus: int, gpu):
    """The cluster to run ``num_gpus`` ranks on: a ClusterConfig as given, or a preset with enough hosts."""
    from flowsim.network.comm_layout import preset_cluster
    from flowsim.config.cluster import ClusterConfig
    from flowsim.config.loader import load_preset

    if isinstance(cluster, ClusterConfig):
        if cluster.num_gpus < num_gpus:
            raise ConfigError("num_gpus", f"must hold the workload's {num_gpus} ranks", cluster.num_gpus)
        return cluster
    per_node = load_preset("clusters", cluster).get("gpus_per_node", 8)
    return preset_cluster(cluster, -(-num_gpus // per_node), gpu=gpu)[0]


def simulate_workload(workload, cluster, *, gpu: str | None = None, schedule: str = "1f1b") -> WorkloadResult:
    """Predict the step time of a captured workload on a cluster.

    Parameters
    ----------
    workload : CapturedWorkload or path
        From :func:`flowsim.capture.capture` / :func:`flowsim.capture.capture_script` or a file written by
        :func:`flowsim.capture.save`.
    cluster : str or ClusterConfig
        A cluster preset name (sized to the workload's world size) or a built cluster.
    gpu : str, optional
        GPU key or spec file overriding the cluster's GPU.
    schedule : str, optional
        Pipeline schedule for a workload of several stages (``1f1b``, ``gpipe``, ``zb-h1``).

    Returns
    -------
    WorkloadResult

    Raises
    ------
    ConfigError
        Unreadable workload, unknown cluster or GPU, a world size the cluster cannot hold, a group whose
        ranks are not an arithmetic progression, or pipeline stages whose point-to-point rows do not form a
        pipeline (module docstring).
    """
    if not hasattr(workload, "stages"):
        from flowsim.capture.fmt import load

        workload = load(workload)
    cl = _cluster(cluster, workload.world_size, gpu)
    spec = get_gpu(gpu or cl.gpu)
    pricer = CollectivePricer(cl, spec)
    priced = [_price_stage(pricer, workload.groups, st.rank, st.ops, s) for s, st in enumerate(workload.stages)]
    times = [t for t, _ in priced]
    if len(workload.stages) == 1:
        step, bubble, crit, pipe = _timeline(workload.ops, times[0], priced[0][1], spec.sm_count), 0.0, 0, None
    else:
        pipe = _pipeline(workload, priced, spec.sm_count, schedule)
        crit = pipe.critical_stage
        step = float(pipe.end_s[crit] + pipe.tail_s[crit])
        bubble = float(pipe.end_s[crit] - pipe.microbatches * (pipe.fwd_s[crit] + pipe.bwd_s[crit]))
    ops, t_crit = workload.stages[crit].ops, times[crit]
    compute_s = float(sum(t for o, t in zip(ops, t_crit) if o["type"] == "compute"))
    comm_s = {}
    for o, t in zip(ops, t_crit):
        if o["type"] == "comm":
            comm_s[o["op"]] = comm_s.get(o["op"], 0.0) + float(t)
    return WorkloadResult(step_time_s=step, compute_s=compute_s, comm_s=comm_s,
                          exposed_comm_s=step - compute_s - bubble, bubble_s=bubble, op_time_s=times,
                          collectives=_collective_table(pricer), pipeline=pipe)


def _price_stage(pricer: CollectivePricer, groups: dict, rank: int, ops: list, index: int) -> tuple:
    """``(times, ests)`` of stage ``index`` (captured rank ``rank``): seconds of each op, and each collective's
    NCCL estimate (None for compute rows and collectives that move nothing), counted in the stage's calls."""
    times, ests = np.zeros(len(ops)), [None] * len(ops)
    comp = [o["type"] == "compute" for o in ops]
    if any(comp):
        frame = pd.DataFrame([{c: o.get(c, 0) for c in OP_COLUMNS} for o in ops if o["type"] == "compute"])
        frame["causal"] = frame["causal"].astype(bool)
        times[np.array(comp)] = op_times(frame, pricer.gpu, stack=job_stack(pricer.gpu))  # a training step
    for i, o in enumerate(ops):
        if o["type"] == "comm" and o["size_bytes"] > 0 and ("peer" in o or len(groups[o["group"]]) > 1):
            if "peer" in o:  # point to point: the pair of ranks, whatever group carried it
                pair = sorted((rank, o["peer"]))
                span, label = (2, max(pair[1] - pair[0], 1), pair[0]), f"peer {o['peer']}"
            else:
                first, stride = _stride(groups[o["group"]], o["group"])
                span, label = (len(groups[o["group"]]), stride, first), o["group"]
            ests[i] = pricer.price(o["op"], float(o["size_bytes"]), span, (index, label, span))
            times[i] = ests[i].time_s
    return times, ests


def _collective_table(pricer: CollectivePricer) -> pd.DataFrame:
    """One row per distinct (stage, op, size, group) priced."""
    rows = [dict(stage=stage, op=op, size_bytes=size, group=group, n_ranks=e.n_ranks, algo=e.algo, proto=e.proto,
                 time_s=e.time_s, count_per_step=n)
            for ((stage, group, _span), op, size), (e, n) in pricer.calls.items()]
    return pd.DataFrame(rows)


def _pipeline(workload, priced: list, sm_count: int, schedule: str) -> PipelineResult:
    """Per-stage forward/backward/tail times and the pipeline schedule over them (module docstring)."""
    m = _microbatches(workload)
    fwd, bwd, tail, p2p_s, p2p_bytes = [], [], [], 0.0, 0.0
    for s, (st, (times, ests)) in enumerate(zip(workload.stages, priced)):
        f_idx, b_idx, t_idx = _regions(st.ops, s)
        fwd.append(_timeline_of(st.ops, times, ests, f_idx, sm_count) / m)
        bwd.append(_timeline_of(st.ops, times, ests, b_idx, sm_count) / m)
        tail.append(_timeline_of(st.ops, times, ests, t_idx, sm_count))
        for o, t in zip(st.ops, times):
            if "peer" in o and t > p2p_s:
                p2p_s, p2p_bytes = float(t), float(o["size_bytes"])
    fwd, bwd, tail = np.array(fwd), np.array(bwd), np.array(tail)
    tl = run_pipeline(PipelineProgram(schedule, m, fwd[:, None], bwd[:, None], p2p_s)).timeline
    return PipelineResult(schedule=schedule, microbatches=m, fwd_s=fwd, bwd_s=bwd, tail_s=tail, end_s=tl.end_s,
                          p2p_s=p2p_s, p2p_bytes=p2p_bytes, critical_stage=int(np.argmax(tl.end_s + tail)))


def _microbatches(workload) -> int:
    """Micro-batches per step: every stage exchanges one activation and one gradient per micro-batch with
    each neighbouring stage, whose captured rank its point-to-point rows must name."""
    ranks = [st.rank for st in workload.stages]
    per_stage = []
    for s, st in enumerate(workload.stages):
        neighbours = [ranks[j] for j in (s - 1, s + 1) if 0 <= j < len(ranks)]
        counts = dict.fromkeys(neighbours, 0)
        for i, o in enumerate(st.ops):
            if "peer" not in o:
                continue
            if o["peer"] not in counts:
                raise ConfigError(f"stages[{s}].ops[{i}].peer", "must be the captured rank of a neighbouring "
                                  f"stage ({' or '.join(map(str, neighbours))})", o["peer"])
            counts[o["peer"]] += 1
        if any(c == 0 or c % 2 for c in counts.values()) or len(set(counts.values())) != 1:
            raise ConfigError(f"stages[{s}]", "must exchange 2 messages per micro-batch (activation and gradient) "
                              "with each neighbouring stage", f"messages per peer rank {counts}")
        per_stage.append(counts[neighbours[0]] // 2)
    if len(set(per_stage)) != 1:
        raise ConfigError("stages", "must all run the same number of micro-batches", per_stage)
    return per_stage[0]


def _regions(ops: list, stage: int) -> tuple:
    """Indices of the forward region, backward region and tail of a stage (point-to-point rows left out)."""
    backward = [i for i, o in enumerate(ops) if o.get("backward")]
    if not backward:
        raise ConfigError(f"stages[{stage}]", "must run a backward pass (capture a training step)", "no backward op")
    last = backward[-1]
    keep = [i for i, o in enumerate(ops) if "peer" not in o]
    return ([i for i in keep if i < last and not ops[i].get("backward")],
            [i for i in keep if ops[i].get("backward")], [i for i in keep if i > last])


def _timeline_of(ops: list, times, ests: list, idx: list, sm_count: int) -> float:
    """Two-stream timeline of the ops ``idx`` alone: ``issue``/``wait`` indices move to the next kept op
    (a wait past the last kept op waits at the end)."""
    if not idx:
        return 0.0

    def kept(j):
        k = bisect.bisect_left(idx, j)
        return k if k < len(idx) else None

    sub = []
    for j in idx:
        o = ops[j]
        if o["type"] == "comm":
            o = dict(o, wait=None if o["wait"] is None else kept(o["wait"]), issue=kept(o.get("issue", j)))
        sub.append(o)
    return _timeline(sub, [times[j] for j in idx], [ests[j] for j in idx], sm_count)


def _timeline(ops, times, ests, sm_count: int) -> float:
    """Step end of the two-stream timeline of the module docstring (:func:`flowsim.step.streams.run_streams`),
    seconds."""
    prog = []
    for i, (o, dt) in enumerate(zip(ops, times)):
        if o["type"] == "compute":
            prog.append(StreamOp(float(dt)))
        else:
            prog.append(StreamOp(float(dt), comm=True, blocking=bool(o["blocking"]), wait=o["wait"],
                                 issue=o.get("issue", i),
                                 share=(ests[i].n_ctas / sm_count) if ests[i] is not None else 0.0))
    return run_streams(prog).end_s_total
