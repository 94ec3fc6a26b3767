"""Simulate a captured workload (:mod:`flowsim.capture`) on a target cluster.

Compute rows are priced by the kernel model for the target GPU (:func:`flowsim.kernels.op_times`), never
by the CPU the step was captured on. Collectives are priced by NCCL's model
(:func:`flowsim.nccl_models.predict`) on the layout of their group (:func:`flowsim.comm_layout.group_layout`);
a group must be an arithmetic progression of global ranks (what DeviceMesh and DDP build), else the
layout is not defined and a ConfigError explains it.

Timeline: one compute stream and one communication stream, both in capture order. A blocking collective
starts when both streams are free and the compute stream waits for its end. An asynchronous one starts
when the communication stream is free and the compute stream reaches it, and the compute stream waits for
it only at its ``wait`` op (or the end of the step). A prefetched collective (``issue`` set) may start
from the compute clock at its ``issue`` op. While a collective runs it holds ``n_ctas`` SMs and slows the
compute beside it to ``1 - n_ctas / sm_count`` of its speed: the rule of
:func:`flowsim.simulate.overlapped_s`, applied kernel by kernel (compute already timed before a
prefetched collective is reached in capture order is not slowed: an approximation).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from flowsim.comm_layout import group_layout
from flowsim.errors import ConfigError
from flowsim.gpu_specs import get_gpu
from flowsim.kernels import OP_COLUMNS, op_times
from flowsim.nccl_models import predict


@dataclasses.dataclass(frozen=True)
class WorkloadResult:
    """Predicted step of a captured workload (seconds).

    Attributes
    ----------
    step_time_s : float
        End of the last op of the step, compute or communication.
    compute_s : float
        Sum of the compute kernels at full speed.
    comm_s : dict of str to float
        Sum of collective times per nccl-tests op.
    exposed_comm_s : float
        ``step_time_s - compute_s``: communication not hidden plus the slowdown of overlapped compute.
    op_time_s : numpy.ndarray
        Seconds of every op in capture order (collectives: their own duration).
    collectives : pandas.DataFrame
        One row per distinct (op, size, group): ranks, algorithm/protocol, seconds, calls per step.
    """

    step_time_s: float
    compute_s: float
    comm_s: dict
    exposed_comm_s: float
    op_time_s: np.ndarray
    collectives: pd.DataFrame


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
    from flowsim.comm_layout import preset_cluster
    from flowsim.config.cluster import ClusterConfig
    from flowsim.config.loader import load_preset

    if isinstance(cluster, ClusterConfig):
        if cluster.num_gpus < num_gpus:
            raise ConfigError("num_gpus", f"must hold the workload's {num_gpus} ranks", cluster.num_gpus)
        return cluster
    per_node = load_preset("clusters", cluster).get("gpus_per_node", 8)
    return preset_cluster(cluster, -(-num_gpus // per_node), gpu=gpu)[0]


def simulate_workload(workload, cluster, *, gpu: str | None = None) -> WorkloadResult:
    """Predict the step time of a captured workload on a cluster.

    Parameters
    ----------
    workload : CapturedWorkload or path
        From :func:`flowsim.capture.capture` or a file written by :func:`flowsim.capture.save`.
    cluster : str or ClusterConfig
        A cluster preset name (sized to the workload's world size) or a built cluster.
    gpu : str, optional
        GPU key or spec file overriding the cluster's GPU.

    Returns
    -------
    WorkloadResult

    Raises
    ------
    ConfigError
        Unreadable workload, unknown cluster or GPU, a world size the cluster cannot hold, or a group whose
        ranks are not an arithmetic progression.
    """
    if not hasattr(workload, "ops"):
        from flowsim.capture.fmt import load

        workload = load(workload)
    cl = _cluster(cluster, workload.world_size, gpu)
    spec = get_gpu(gpu or cl.gpu)
    ops = workload.ops
    is_comp = np.array([o["type"] == "compute" for o in ops], dtype=bool)
    times = np.zeros(len(ops))
    comp_rows = [o for o in ops if o["type"] == "compute"]
    if comp_rows:
        frame = pd.DataFrame([{c: o.get(c, 0) for c in OP_COLUMNS} for o in comp_rows])
        frame["causal"] = frame["causal"].astype(bool)
        times[is_comp] = op_times(frame, spec)
    layouts, ests, calls = {}, {}, {}
    for i, o in enumerate(ops):
        if o["type"] != "comm" or o["size_bytes"] <= 0 or len(workload.groups[o["group"]]) == 1:
            continue
        g = o["group"]
        if g not in layouts:
            ranks = workload.groups[g]
            first, stride = _stride(ranks, g)
            layouts[g] = group_layout(cl, spec, len(ranks), stride, first_rank=first)
        key = (o["op"], float(o["size_bytes"]), g)
        if key not in ests:
            ests[key] = predict(o["op"], float(o["size_bytes"]), layouts[g])
        calls[key] = calls.get(key, 0) + 1
        times[i] = ests[key].time_s
    step = _timeline(ops, times, [ests.get((o.get("op"), float(o.get("size_bytes", 0)), o.get("group")))
                                  for o in ops], spec.sm_count)
    comm_s = {}
    for o, t in zip(ops, times):
        if o["type"] == "comm":
            comm_s[o["op"]] = comm_s.get(o["op"], 0.0) + float(t)
    compute_s = float(times[is_comp].sum())
    table = pd.DataFrame([dict(op=k[0], size_bytes=k[1], group=k[2], n_ranks=e.n_ranks, algo=e.algo,
                               proto=e.proto, time_s=e.time_s, count_per_step=calls[k])
                          for k, e in ests.items()])
    return WorkloadResult(step_time_s=step, compute_s=compute_s, comm_s=comm_s,
                          exposed_comm_s=step - compute_s, op_time_s=times, collectives=table)


def _timeline(ops, times, ests, sm_count: int) -> float:
    """Step end of the two-stream timeline of the module docstring, seconds."""
    t = 0.0            # compute stream clock
    comm_free = 0.0    # communication stream free from
    comm_share = 0.0   # share of SMs held by the collectives queued until comm_free
    waits = {}         # op index -> latest end of the async collectives it waits for
    tail = 0.0         # latest end of collectives waited at the end of the step
    clock = []         # compute clock at the start of each op
    for i, (o, dt) in enumerate(zip(ops, times)):
        t = max(t, waits.pop(i, 0.0))
        clock.append(t)
        if o["type"] == "compute":
            t = _slowed(t, float(dt), comm_free, comm_share)
            continue
        share = (ests[i].n_ctas / sm_count) if ests[i] is not None else 0.0
        ready = clock[o.get("issue", i)]  # a prefetched collective may start at an earlier op
        # the stream is idle: this collective alone holds SMs; else it queues behind the running ones
        comm_share = share if ready >= comm_free else max(comm_share, share)
        comm_free = max(ready, comm_free) + float(dt)
        if o["blocking"]:
            t = comm_free
        elif o["wait"] is None or o["wait"] >= len(ops):
            tail = max(tail, comm_free)
        else:
            waits[o["wait"]] = max(waits.get(o["wait"], 0.0), comm_free)
    return max(t, tail, *waits.values()) if waits else max(t, tail)


def _slowed(t: float, work_s: float, comm_end: float, share: float) -> float:
    """End of a kernel of ``work_s`` full-speed seconds started at ``t`` while communication holding
    ``share`` of the SMs runs until ``comm_end`` (:func:`flowsim.simulate.overlapped_s`'s rule)."""
    r = max(1.0 - share, 0.0)
    if comm_end <= t or share == 0.0:
        return t + work_s
    if r == 0.0:
        return comm_end + work_s
    if (comm_end - t) * r >= work_s:
        return t + work_s / r
    return comm_end + work_s - (comm_end - t) * r
