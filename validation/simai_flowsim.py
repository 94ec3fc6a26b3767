"""flowsim's own prediction of a SimAI workload, and its comparison with SimAI-Analytical.

What is kept from the file: every compute time as given (ns) and every collective with its group and size.
What flowsim changes:

* **Collectives** are priced by flowsim's NCCL model (:class:`flowsim.step.pricer.CollectivePricer`: :func:`flowsim.nccl_models.predict`, NCCL 2.30.7
  algorithm/protocol selection) on the communicator each group forms on the cluster
  (:func:`flowsim.network.comm_layout.group_layout`). Rank order follows SimAI's groups (simai-notes section 5)
  with Megatron's TP-DP-PP nesting: TP ranks contiguous (stride 1), DP ranks strided by TP, EP = EP
  consecutive TP groups (stride TP), DP_EP = DP ranks strided by TP * EP, and the pipeline neighbours of a
  rank TP * DP apart.
* **The pipeline** is a real schedule (:func:`flowsim.step.core.run_pipeline`, 1F1B by default) over
  the GA micro-batches of the file, every stage running the file's stage, with the ``pp_comm`` activation
  sent between stages as a Send/Recv. ``interleaved`` splits each micro-batch into the header's ``vpp``
  model chunks, the interleaving SimAI's bubble formula assumes. A micro-batch is the block of lines from
  one ``embedding_layer`` line to the next (AICB unrolls GA micro-batches that way); its forward time is
  the sum of forward compute and blocking forward comm, its backward time that of input-gradient compute
  and comm plus weight-gradient compute. The schedule takes the mean block, so the total compute is the
  file's.
* **Step-level lines** (those outside the micro-batch blocks: gradient gather / reduce-scatter, optimizer,
  cross-entropy syncs) run after the pipeline in SimAI's engine order: forward in file order, then
  backward in reverse order, with each weight-gradient (DP/DP_EP) collective issued non-blocking on a FIFO
  comm stream when its line's weight-gradient compute ends, so it overlaps the backward compute of the
  lines after it (SimAI's ``Workload.cc`` semantics). Weight-gradient collectives inside micro-batch blocks
  are issued when the pipeline ends.

Not modelled: contention between concurrent groups (each collective is priced alone), TP/EP comm overlap.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from flowsim.config.cluster import ClusterConfig
from flowsim.errors import ConfigError
from flowsim.gpu_specs import get_gpu
from flowsim.step import CollectivePricer, PipelineProgram, StreamOp, run_pipeline, run_streams
from flowsim.units import US
from flowsim.validation.simai_analytical import SimaiAnalyticalResult, group_sizes
from flowsim.validation.simai_workload import SimaiComm, SimaiWorkload

BLOCK_START = "embedding_layer"
"""Name of the first line of each micro-batch block in AICB workloads."""
NS = 1e-3 * US
"""One nanosecond in seconds (the file's time unit)."""


@dataclass(frozen=True)
class CollectivePrice:
    """flowsim's price of one distinct collective of the workload.

    Attributes
    ----------
    op, group : str
        Collective and group (``TP``, ``DP``, ``EP``, ``DP_EP``).
    size_bytes : int
        Bytes, nccl-tests convention.
    n_ranks : int
        Ranks of the group.
    time_s : float
        Predicted time, seconds.
    algo, proto : str
        NCCL's choice.
    """

    op: str
    group: str
    size_bytes: int
    n_ranks: int
    time_s: float
    algo: str
    proto: str


@dataclass(frozen=True)
class SimaiFlowsimResult:
    """flowsim's step time for a SimAI workload and its breakdown, seconds (module docstring).

    Attributes
    ----------
    total_s : float
        Step time: the pipeline plus the step-level lines.
    compute_s : float
        All compute of the file (one stage, all micro-batches).
    exposed_tp_s, exposed_ep_s : float
        Blocking TP/EP comm (all of it is exposed: nothing overlaps it).
    exposed_dp_s, exposed_dp_ep_s : float
        Weight-gradient comm not hidden behind later backward compute.
    bubble_s : float
        Idle time of the slowest stage inside the pipeline schedule, including waits for the PP sends.
    p2p_time_s : float
        Time of one ``pp_comm`` send between neighbouring stages.
    schedule : str
        Pipeline schedule.
    num_microbatches : int
        Micro-batch blocks found.
    prices : dict
        ``(op, group, size_bytes) -> CollectivePrice``.
    skipped_lines : int
        Declared layer lines the file did not contain.
    """

    total_s: float
    compute_s: float
    exposed_tp_s: float
    exposed_ep_s: float
    exposed_dp_s: float
    exposed_dp_ep_s: float
    bubble_s: float
    p2p_time_s: float
    schedule: str
    num_microbatches: int
    prices: dict = field(repr=False)
    skipped_lines: int = 0

    def to_dict(self) -> dict:
        """Scalar figures (seconds) and the per-collective prices as a list."""
        out = {k: getattr(self, k) for k in ("total_s", "compute_s", "exposed_tp_s", "exposed_ep_s", "exposed_dp_s",
                                             "exposed_dp_ep_s", "bubble_s", "p2p_time_s", "schedule",
                                             "num_microbatches", "skipped_lines")}
        out["collectives"] = [vars(p) for p in self.prices.values()]
        return out


def _pricer(cluster: ClusterConfig, workload: SimaiWorkload) -> CollectivePricer:
    """The collective pricer with the workload's named groups (module docstring: SimAI's rank order)."""
    sizes = group_sizes(workload, cluster.num_gpus)
    tp, ep = workload.tp, workload.ep
    groups = {"TP": (sizes["TP"], 1), "DP": (sizes["DP"], tp), "EP": (sizes["EP"], tp),
              "DP_EP": (sizes["DP_EP"], tp * ep)}
    if workload.pp > 1:
        groups["PP"] = (2, tp * sizes["DP"])
    return CollectivePricer(cluster, get_gpu(cluster.gpu), groups)


def price_collectives(workload: SimaiWorkload, cluster: ClusterConfig) -> dict:
    """Price every distinct collective of the workload with flowsim's NCCL model.

    Parameters
    ----------
    workload : SimaiWorkload
        The parsed file.
    cluster : ClusterConfig
        The cluster, with ``num_gpus`` the job's GPUs.

    Returns
    -------
    dict
        ``(op, group, size_bytes) -> CollectivePrice``; zero-byte collectives cost 0.

    Raises
    ------
    ConfigError
        ``allreducealltoall`` (no NCCL counterpart), or groups that do not fit the cluster; the message
        names the line.
    """
    pricer = _pricer(cluster, workload)
    prices = {}
    for layer in workload.layers:
        for phase, comm in layer.comms():
            key = (comm.op, comm.group, comm.size_bytes)
            if key in prices:
                continue
            if comm.op == "allreducealltoall":
                raise ConfigError(f"line {layer.line_no} {phase}_comm_type", "ALLREDUCEALLTOALL has no NCCL "
                                  "counterpart in flowsim's model", "ALLREDUCEALLTOALL")
            n_ranks = pricer.groups[comm.group][0]
            est = pricer.estimate(comm.op, comm.size_bytes, pricer.span(comm.group))
            if est is None:  # nothing moves: no bytes (or one rank)
                prices[key] = CollectivePrice(*key, n_ranks, 0.0, "none", "none")
                continue
            prices[key] = CollectivePrice(*key, n_ranks, est.time_s, est.algo, est.proto)
    return prices


def split_blocks(workload: SimaiWorkload) -> tuple[list, list]:
    """Split the lines into micro-batch blocks and step-level lines (module docstring).

    Parameters
    ----------
    workload : SimaiWorkload
        The parsed file.

    Returns
    -------
    blocks : list of list of SimaiLayer
        One list per micro-batch, in file order.
    step_lines : list of SimaiLayer
        Lines outside the blocks, in file order.

    Raises
    ------
    ConfigError
        No ``embedding_layer`` line (micro-batch boundaries unknown).
    """
    layers = workload.layers
    starts = [i for i, layer in enumerate(layers) if layer.name == BLOCK_START]
    if not starts:
        raise ConfigError("workload", f"no {BLOCK_START} line: cannot find the micro-batch blocks")
    length = starts[1] - starts[0] if len(starts) > 1 else len(layers) - starts[0]
    bounds = [(s, min(s + length, len(layers))) for s in starts]
    blocks = [list(layers[a:b]) for a, b in bounds]
    step_lines = list(layers[: starts[0]]) + list(layers[bounds[-1][1]:])
    return blocks, step_lines


def _t(prices: dict, comm: SimaiComm | None) -> float:
    return 0.0 if comm is None else prices[(comm.op, comm.group, comm.size_bytes)].time_s


def _chunk_of_lines(block, v: int) -> list[int]:
    """Model chunk (0..v-1) of each line of a block: its transformer layers split into ``v`` equal runs.

    A transformer layer starts at each line named like the block's second line (the first after
    ``embedding_layer``); the embedding line joins chunk 0 and trailing lines the last chunk.
    """
    if v == 1:
        return [0] * len(block)
    first = block[1].name if len(block) > 1 else ""
    n_layers = sum(layer.name == first for layer in block)
    if n_layers % v:
        raise ConfigError("vpp", f"the {n_layers} transformer layers of a micro-batch (lines named {first}) must "
                                 "split evenly into vpp model chunks", v)
    seen, chunks = 0, []
    for layer in block:
        seen += layer.name == first
        chunks.append(max(seen - 1, 0) // (n_layers // v))
    return chunks


def _block_times(blocks, prices, v: int) -> tuple[np.ndarray, np.ndarray, dict]:
    """Mean forward and backward time per model chunk (float64[v] each, s) and blocking comm per group."""
    fwd, bwd = np.zeros(v), np.zeros(v)
    exposed = {"TP": 0.0, "EP": 0.0}
    for block in blocks:
        for layer, c in zip(block, _chunk_of_lines(block, v)):
            f, ig = _t(prices, layer.fwd_comm), _t(prices, layer.ig_comm)
            fwd[c] += layer.fwd_compute_ns * NS + f
            bwd[c] += (layer.ig_compute_ns + layer.wg_compute_ns) * NS + ig
            for comm, t in ((layer.fwd_comm, f), (layer.ig_comm, ig)):
                if comm is not None:
                    exposed["EP" if comm.group == "EP" else "TP"] += t
    return fwd / len(blocks), bwd / len(blocks), exposed


def _tail_program(step_lines, late_wg, prices) -> tuple[list, list]:
    """The step-level lines as a stream program (:mod:`flowsim.step.streams`): forward lines in file order, then
    backward lines in reverse, blocking TP/EP comm on stream 1, every weight-gradient collective issued
    asynchronously on the FIFO stream 0 when its compute ends (the ones of the micro-batch blocks first, at the
    pipeline's end), its update delay keeping the stream busy (SimAI ``Workload.cc``); and (op index, comm) of
    every collective."""
    prog, comms = [], []

    def compute(ns):
        prog.append(StreamOp(ns * NS))

    def comm(c, blocking, extra_s=0.0):
        comms.append((len(prog), c))
        prog.append(StreamOp(_t(prices, c) + extra_s, comm=True, blocking=blocking, stream=1 if blocking else 0))

    for c in late_wg:
        comm(c, blocking=False)
    for layer in step_lines:
        compute(layer.fwd_compute_ns)
        if layer.fwd_comm is not None:
            comm(layer.fwd_comm, blocking=True)
    for layer in reversed(step_lines):
        compute(layer.ig_compute_ns)
        if layer.ig_comm is not None:
            comm(layer.ig_comm, blocking=True)
        compute(layer.wg_compute_ns)
        if layer.wg_comm is not None:
            comm(layer.wg_comm, blocking=False, extra_s=layer.wg_update_ns * NS)
    return prog, comms


def _step_tail(step_lines, late_wg, prices, start_s: float) -> tuple[float, dict]:
    """Run the step-level lines after the pipeline; return the end and exposed comm per group: blocking comm
    all of it, a weight-gradient collective what runs past the compute stream's end."""
    prog, comms = _tail_program(step_lines, late_wg, prices)
    run = run_streams(prog, start_s)
    exposed = {"TP": 0.0, "EP": 0.0, "DP": 0.0, "DP_EP": 0.0}
    for i, c in comms:
        if prog[i].blocking:
            exposed["EP" if c.group == "EP" else "TP"] += prog[i].time_s
        else:
            group = c.group if c.group in ("DP", "DP_EP") else "DP"
            exposed[group] += max(0.0, run.end_s[i] - max(run.start_s[i], run.compute_end_s))
    return run.end_s_total, exposed


def simulate_flowsim(workload: SimaiWorkload, cluster: ClusterConfig, *, schedule: str = "1f1b"
                     ) -> SimaiFlowsimResult:
    """flowsim's step time for a SimAI workload (module docstring).

    Parameters
    ----------
    workload : SimaiWorkload
        The parsed file (one pipeline stage, GA micro-batches unrolled).
    cluster : ClusterConfig
        The cluster; ``num_gpus`` must equal the job's GPUs.
    schedule : str, optional
        ``1f1b`` (default), ``gpipe`` or ``interleaved``. The file's ``vpp`` is AICB's layers per stage, not
        an interleaving degree, so 1F1B runs one model chunk per stage; ``interleaved`` takes ``vpp`` chunks
        (as SimAI's bubble formula assumes), splitting each micro-batch's transformer layers evenly.

    Returns
    -------
    SimaiFlowsimResult

    Raises
    ------
    ConfigError
        Groups that do not fit the cluster, no micro-batch blocks, an unknown schedule.
    """
    prices = price_collectives(workload, cluster)
    blocks, step_lines = split_blocks(workload)
    v = workload.vpp if schedule == "interleaved" else 1
    fwd_s, bwd_s, exposed = _block_times(blocks, prices, v)
    p2p_s = 0.0
    if workload.pp > 1 and workload.pp_comm_bytes > 0:
        pricer = _pricer(cluster, workload)
        p2p_s = pricer.estimate("sendrecv", workload.pp_comm_bytes, pricer.span("PP")).time_s
    m = len(blocks)
    timeline = run_pipeline(PipelineProgram(schedule, m, np.tile(fwd_s, (workload.pp, 1)),
                                            np.tile(bwd_s, (workload.pp, 1)), p2p_s)).timeline
    pipeline_end = float(timeline.end_s.max())
    critical = int(timeline.end_s.argmax())
    bubble_s = pipeline_end - float(timeline.busy_s[critical])
    late_wg = [layer.wg_comm for block in blocks for layer in block if layer.wg_comm is not None]
    end_s, tail = _step_tail(step_lines, late_wg, prices, pipeline_end)
    compute_s = sum(layer.fwd_compute_ns + layer.ig_compute_ns + layer.wg_compute_ns for layer in workload.layers) * NS
    return SimaiFlowsimResult(
        total_s=end_s, compute_s=compute_s, exposed_tp_s=exposed["TP"] + tail["TP"],
        exposed_ep_s=exposed["EP"] + tail["EP"], exposed_dp_s=tail["DP"], exposed_dp_ep_s=tail["DP_EP"],
        bubble_s=bubble_s, p2p_time_s=p2p_s, schedule=schedule, num_microbatches=m, prices=prices,
        skipped_lines=workload.skipped_lines)


BREAKDOWN = (("compute_s", "compute"), ("exposed_tp_s", "exposed TP comm"), ("exposed_ep_s", "exposed EP comm"),
             ("exposed_dp_s", "exposed DP comm"), ("exposed_dp_ep_s", "exposed DP_EP comm"),
             ("bubble_s", "pipeline bubble (+ PP comm)"), ("total_s", "total"))
"""Rows of the side-by-side breakdown: (field of both results, label)."""


def breakdown_rows(simai: SimaiAnalyticalResult, flowsim: SimaiFlowsimResult) -> list[dict]:
    """Side-by-side breakdown, microseconds (``exposed_pp_s`` of SimAI is folded into the bubble row).

    Parameters
    ----------
    simai, flowsim : SimaiAnalyticalResult, SimaiFlowsimResult
        The two predictions of the same workload.

    Returns
    -------
    list of dict
        ``part``, ``simai_us``, ``flowsim_us``, ``difference_us`` (flowsim - SimAI).
    """
    rows = []
    for key, label in BREAKDOWN:
        a = getattr(simai, key) + (simai.exposed_pp_s if key == "bubble_s" else 0.0)
        b = getattr(flowsim, key)
        rows.append({"part": label, "simai_us": a / US, "flowsim_us": b / US, "difference_us": (b - a) / US})
    return rows


def collective_rows(simai: SimaiAnalyticalResult, flowsim: SimaiFlowsimResult) -> list[dict]:
    """Per distinct collective: count, SimAI's and flowsim's time, and the total difference it makes.

    Parameters
    ----------
    simai, flowsim : SimaiAnalyticalResult, SimaiFlowsimResult
        The two predictions of the same workload.

    Returns
    -------
    list of dict
        ``phase, op, group, n_ranks, size_bytes, count, simai_us, flowsim_us, algo, proto, total_difference_us``,
        largest absolute total difference first.
    """
    rows = []
    for (phase, op, group, size), (count, t_simai) in simai.comm_time_s.items():
        p = flowsim.prices[(op, group, size)]
        rows.append({"phase": phase, "op": op, "group": group, "n_ranks": p.n_ranks, "size_bytes": size,
                     "count": count, "simai_us": t_simai / US, "flowsim_us": p.time_s / US, "algo": p.algo,
                     "proto": p.proto, "total_difference_us": count * (p.time_s - t_simai) / US})
    return sorted(rows, key=lambda r: -abs(r["total_difference_us"]))


def explain(workload: SimaiWorkload, simai: SimaiAnalyticalResult, flowsim: SimaiFlowsimResult) -> list[str]:
    """Sentences that explain the largest differences of the breakdown, largest first.

    Parameters
    ----------
    workload : SimaiWorkload
        The workload (PP, GA, vpp).
    simai, flowsim : SimaiAnalyticalResult, SimaiFlowsimResult
        The two predictions.

    Returns
    -------
    list of str
    """
    rows = {r["part"]: r for r in breakdown_rows(simai, flowsim)}
    why = {
        "compute": "both take the file's compute times as given",
        "pipeline bubble (+ PP comm)": (
            f"SimAI uses Megatron's formula (PP-1)/(GA*vpp) x stage time = {workload.pp - 1}/({workload.ga}*"
            f"{workload.vpp}) with vpp={workload.vpp} as written by AICB (layers per stage) and no PP traffic; "
            f"flowsim runs a {flowsim.schedule} schedule of {flowsim.num_microbatches} micro-batches over "
            f"{workload.pp} stages with a {flowsim.p2p_time_s / US:,.0f} us Send/Recv of pp_comm "
            f"({workload.pp_comm_bytes:,} B) between stages"),
        "exposed TP comm": "SimAI: NVLink busbw x size-efficiency ratio; flowsim: NCCL 2.30.7 model on the TP group",
        "exposed EP comm": ("SimAI: AllToAll busbw NIC x NICs/GPUs-per-node x (N-1)/((nodes-1) x gpn) x ata ratio; "
                            "flowsim: NCCL point-to-point AllToAll model on the EP group's nodes and NICs"),
        "exposed DP comm": ("SimAI: ring busbw on the group's NICs, ratio 1, nothing overlapped (dp_o=0); flowsim: "
                            "NCCL model, FIFO comm stream overlapping the step-level backward compute"),
        "exposed DP_EP comm": ("SimAI: one NIC's busbw, ratio 1, nothing overlapped; flowsim: NCCL model, FIFO comm "
                               "stream overlapping the step-level backward compute"),
    }
    out = []
    for part, reason in sorted(why.items(), key=lambda kv: -abs(rows[kv[0]]["difference_us"])):
        r = rows[part]
        out.append(f"{part}: SimAI {r['simai_us']:,.0f} us, flowsim {r['flowsim_us']:,.0f} us "
                   f"({r['difference_us']:+,.0f} us). {reason}.")
    return out
