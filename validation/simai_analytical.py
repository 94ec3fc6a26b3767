"""SimAI-Analytical compatibility mode: SimAI's own closed-form cost model, reproduced exactly.

Restates SimAI 1.7 (aliyun/SimAI commit cef83f9) ``astra-sim-alibabacloud``: ``Layer::compute_time`` and
``Layer::report`` (ANALYTICAL branch), ``calbusbw.cc`` (``cal_busbw``, ``cal_ratio``, ``getValue``) and the
ratio tables of :mod:`flowsim.validation.simai_ratio`, as ../shared/research/simai-notes.md section 3 reads
them. On SimAI's example workload (``example/workload_analytical.txt``, ``-g 9216 -nv 360 -nic 48.5
-n_p_s 8 -g_p_s 8``) SimAI prints a total of 7,545,619 us (PR #294); tests/test_simai.py checks that.

The model, per collective of ``size`` bytes in a group of ``n`` ranks:

* forward comm sizes in (0, 4096) B become 4096 B;
* ``1 < size < 1 MiB``: a fixed time by group size (:data:`SMALL_MESSAGE_US`; other sizes cost 0);
* otherwise ``t = size / 2**30 / (ratio * busbw) * 1e9 * (n - 1) / n`` ns, doubled for AllReduce, truncated
  to whole ns. ``busbw`` is SimAI's "GB/s", used as GiB/s (its ``GBps`` macro is ``1 / 2**30``); ``ratio``
  is 1 except for TP AllGather/ReduceScatter and AllToAll (:func:`size_ratio`).

Per line, with compute times ``cF, cI, cW`` and comm times ``f, ig, wg``: the step is
``sum(cF + cI + cW) + sum(f + ig) * (1 - overlap of the forward comm's group, TP or EP) +
sum(wg) * (1 - dp_overlap) + bubble + exposed PP``, with ``bubble = sum(cF + cI + cW + f + ig over lines
other than embedding_layer) * (PP - 1) / (GA * vpp)`` (Megatron's interleaved-1F1B bubble) and
``exposed PP = 2 * vpp * GA * pp_comm / 2**30 / pp_overlap * 1e9 / 1000 * (1 - pp_overlap)`` us, which is
0 with the default ``pp_overlap = 1``. SimAI's quirks are kept on purpose (no contention, ratio 1 for all
AllReduce and DP traffic, zero cost for small messages in groups outside the table).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from flowsim.errors import ConfigError
from flowsim.units import GiB, MiB, US
from flowsim.validation.simai_ratio import ATA_RATIO, MULTI_COLUMN, NIC_RATIO, NVLINK_RATIO
from flowsim.validation.simai_workload import SimaiComm, SimaiWorkload

SMALL_MESSAGE_US = {2: 10, 4: 12, 8: 15, 16: 66, 32: 135, 64: 200, 128: 320}
"""Time of a collective of 1 B < size < 1 MiB by group size, us (SimAI 1.7 ``Layer::compute_time``)."""
SMALL_MESSAGE_MAX_BYTES = MiB
"""Upper bound (exclusive) of the small-message table, bytes (SimAI 1.7 ``Layer::compute_time``)."""
FWD_MIN_BYTES = 4096
"""Forward comm sizes in (0, 4096) B are raised to this, bytes (SimAI 1.7 ``Workload.cc``)."""
RATIO_MIN_BYTES = 16 * MiB
"""Smallest row of the ratio tables; smaller sizes take its value (SimAI 1.7 ``getValue``)."""
RATIO_MAX_BYTES = 16 * GiB
"""Largest row of the ratio tables; larger sizes are an error in SimAI ("Data size out of range")."""
NVLINK_DEFAULT_GBPS = {"A100": 240.0, "A800": 160.0, "H100": 370.8, "H20": 370.8, "H800": 164.8}
"""``-nv`` default by ``-g_type``: 20 GB/s per link x links (A100 12, A800 8), 20.6 x 18 (H100, H20), 20.6 x 8
(H800); SimAI 1.7 ``calbusbw.cc`` (simai-notes 3.1)."""
NIC_DEFAULT_GBPS = {"cx6": 23.5, "cx7": 48.5, "bf3": 48.5}
"""``-nic`` default by ``-nic_t``, SimAI "GB/s"; SimAI 1.7 ``calbusbw.cc`` (simai-notes 3.1)."""


@dataclass(frozen=True)
class SimaiSystem:
    """The system flags of ``SimAI_analytical``.

    Attributes
    ----------
    num_gpus : int
        ``-g``: GPUs of the job.
    nvlink_GBps : float
        ``-nv``: NVLink bus bandwidth in SimAI's "GB/s" (applied as 2**30 bytes/s, see module docstring).
    nic_GBps : float
        ``-nic``: bus bandwidth of one NIC, SimAI "GB/s".
    nics_per_server, gpus_per_server : int
        ``-n_p_s`` and ``-g_p_s``.
    dp_overlap, tp_overlap, ep_overlap : float
        ``-dp_o``, ``-tp_o``, ``-ep_o``: share of the group's comm hidden behind compute, in [0, 1] (default 0).
    pp_overlap : float
        ``-pp_o``, in (0, 1] (default 1; SimAI divides by it).
    """

    num_gpus: int
    nvlink_GBps: float
    nic_GBps: float
    nics_per_server: int = 8
    gpus_per_server: int = 8
    dp_overlap: float = 0.0
    tp_overlap: float = 0.0
    ep_overlap: float = 0.0
    pp_overlap: float = 1.0

    def __post_init__(self):
        for name in ("num_gpus", "nics_per_server", "gpus_per_server"):
            if getattr(self, name) < 1:
                raise ConfigError(name, "must be >= 1", getattr(self, name))
        for name in ("nvlink_GBps", "nic_GBps"):
            if not getattr(self, name) > 0:
                raise ConfigError(name, "must be > 0", getattr(self, name))
        for name in ("dp_overlap", "tp_overlap", "ep_overlap"):
            if not 0 <= getattr(self, name) <= 1:
                raise ConfigError(name, "must be in [0, 1]", getattr(self, name))
        if not 0 < self.pp_overlap <= 1:
            raise ConfigError("pp_overlap", "must be in (0, 1] (SimAI divides by it)", self.pp_overlap)


@dataclass(frozen=True)
class GroupGeometry:
    """How SimAI sees one communicator (simai-notes 3.1 table; all divisions integer).

    Attributes
    ----------
    n_ranks : int
        Ranks in the group.
    node_count, gpus_per_node, nics : int
        Servers spanned, group ranks per server, NICs the group uses per server.
    """

    n_ranks: int
    node_count: int
    gpus_per_node: int
    nics: int


def group_sizes(workload: SimaiWorkload, num_gpus: int) -> dict:
    """Ranks per group: TP and EP from the header, ``DP = num_gpus / (TP * PP)``, ``DP_EP = DP / EP``.

    Parameters
    ----------
    workload : SimaiWorkload
        The workload (TP, EP, PP).
    num_gpus : int
        GPUs of the job.

    Returns
    -------
    dict
        ``{"TP": int, "EP": int, "DP": int, "DP_EP": int}``.

    Raises
    ------
    ConfigError
        When the GPU count is not a multiple of TP * PP, or DP of EP.
    """
    tp, ep, pp = workload.tp, workload.ep, workload.pp
    if num_gpus % (tp * pp):
        raise ConfigError("num_gpus", "must be a multiple of TP * PP", f"{num_gpus} and TP {tp} x PP {pp}")
    dp = num_gpus // (tp * pp)
    if dp % ep:
        raise ConfigError("ep", "the DP size must be a multiple of EP", f"DP {dp} and EP {ep}")
    return {"TP": tp, "EP": ep, "DP": dp, "DP_EP": dp // ep}


def geometry(group: str, n: int, tp: int, ep: int, system: SimaiSystem) -> GroupGeometry:
    """SimAI's (node count, GPUs per node, NICs) of a group (simai-notes 3.1 table).

    Parameters
    ----------
    group : str
        ``TP``, ``EP``, ``DP`` or ``DP_EP``.
    n : int
        Ranks in the group.
    tp, ep : int
        TP and EP sizes of the workload.
    system : SimaiSystem
        Servers' GPUs and NICs.

    Returns
    -------
    GroupGeometry
    """
    g, k = system.gpus_per_server, system.nics_per_server
    if group == "TP":
        return GroupGeometry(n, 1, tp, k) if tp <= g else GroupGeometry(n, tp // g, g, k)
    if group == "EP":
        if tp * n <= g:
            return GroupGeometry(n, 1, g // tp, k)
        return GroupGeometry(n, tp * n // g, max(g // tp, 1), k // g if tp > g else k // tp)
    if group == "DP":
        return GroupGeometry(n, n, g // tp, k // tp) if tp <= g else GroupGeometry(n, n, 1, k // g)
    if tp * ep <= g:
        return GroupGeometry(n, n, g // (tp * ep), k // (tp * ep))
    return GroupGeometry(n, n, 1, k // g)


def bus_bandwidth(op: str, geo: GroupGeometry, system: SimaiSystem) -> tuple[float, bool]:
    """SimAI's ``cal_busbw``: bus bandwidth of a collective on a group, and whether NVLink bounds it.

    Parameters
    ----------
    op : str
        Lower-case collective name.
    geo : GroupGeometry
        The group as SimAI sees it.
    system : SimaiSystem
        ``-nv``, ``-nic``.

    Returns
    -------
    busbw : float
        SimAI "GB/s" (GiB/s in effect).
    nvlink_bound : bool
        True when the NVLink term is the smaller one (selects ``nvlink_ratio`` over ``nic_ratio``).
    """
    nv, nic = system.nvlink_GBps, system.nic_GBps
    net = nic * geo.nics
    if geo.node_count == 1:
        allgather, nvlink_bound = nv, True
    elif geo.gpus_per_node == 1:
        allgather, nvlink_bound = net, False
    else:
        nvl = nv * geo.gpus_per_node / (geo.gpus_per_node - 1) if net > nv else nv  # cross_nic
        allgather, nvlink_bound = min(nvl, net), nvl <= net
    if op != "alltoall":
        return allgather, nvlink_bound
    if geo.node_count == 1:
        return nv, True
    n_all = geo.node_count * geo.gpus_per_node
    return net / geo.gpus_per_node * (n_all - 1) / ((geo.node_count - 1) * geo.gpus_per_node), False


def _node_column(nodes: int) -> int:
    """Ratio-table column of a node count: 1, 2, 4, ..., 128 nodes are columns 0..7.

    A count that is not a power of two takes the column of the next power of two (capped at 128): the
    notes do not say what SimAI does then, so this is flowsim's choice, not SimAI's.
    """
    return min(max(math.ceil(math.log2(max(nodes, 1))), 0), 7)


def _interp(table, col: int, size: float) -> float:
    def value(row):
        v = row[1][col]
        return 1.0 if v is None else v

    size = max(size, RATIO_MIN_BYTES)
    for lo, hi in zip(table, table[1:]):
        if size <= hi[0]:
            w = (size - lo[0]) / (hi[0] - lo[0])
            return value(lo) + w * (value(hi) - value(lo))
    return value(table[-1])


def size_ratio(comm: SimaiComm, geo: GroupGeometry, tp: int, nvlink_bound: bool, system: SimaiSystem) -> float:
    """SimAI's size-efficiency ratio ``interp(table[size, col]) / table[16 GiB, col]`` (simai-notes 3.2).

    Applies to TP AllGather/ReduceScatter (``nvlink_ratio`` when NVLink bounds, else ``nic_ratio``; column
    = TP / GPUs per server nodes) and to AllToAll (``ata_ratio``; EP: 1 node when TP * n fits a server,
    the ``Multi`` column when TP fills one, else TP * n / GPUs per server nodes). Everything else is 1.

    Parameters
    ----------
    comm : SimaiComm
        The collective.
    geo : GroupGeometry
        Its group.
    tp : int
        TP size of the workload.
    nvlink_bound : bool
        From :func:`bus_bandwidth`.
    system : SimaiSystem
        GPUs per server.

    Returns
    -------
    float
        The ratio, > 0.

    Raises
    ------
    ConfigError
        A size beyond the tables' 16 GiB (SimAI stops with "Data size out of range").
    """
    g = system.gpus_per_server
    if comm.op == "alltoall" and comm.group == "EP":
        table = ATA_RATIO
        col = 0 if tp * geo.n_ranks <= g else MULTI_COLUMN if tp >= g else _node_column(tp * geo.n_ranks // g)
    elif comm.op == "alltoall" and comm.group == "TP":
        table, col = ATA_RATIO, _node_column(tp // g if tp > g else 1)
    elif comm.op in ("allgather", "reducescatter") and comm.group == "TP":
        table, col = (NVLINK_RATIO if nvlink_bound else NIC_RATIO), _node_column(tp // g if tp > g else 1)
    else:
        return 1.0
    if comm.size_bytes > RATIO_MAX_BYTES:
        raise ConfigError("size_bytes", "beyond SimAI's ratio tables (16 GiB; SimAI: Data size out of range)",
                          comm.size_bytes)
    return _interp(table, col, comm.size_bytes) / _interp(table, col, RATIO_MAX_BYTES)


def collective_time_ns(comm: SimaiComm, phase: str, sizes: dict, tp: int, ep: int, system: SimaiSystem) -> int:
    """SimAI-Analytical's time of one collective, whole ns (module docstring).

    Parameters
    ----------
    comm : SimaiComm
        The collective.
    phase : str
        ``fwd``, ``ig`` or ``wg`` (forward sizes below 4096 B are raised to 4096 B).
    sizes : dict
        Ranks per group, from :func:`group_sizes`.
    tp, ep : int
        TP and EP sizes.
    system : SimaiSystem
        The system flags.

    Returns
    -------
    int
        Nanoseconds.

    Raises
    ------
    ConfigError
        ``allreducealltoall`` (not restated in the notes, so not modelled) or a size past the ratio tables.
    """
    if comm.op == "allreducealltoall":
        raise ConfigError("comm type", "ALLREDUCEALLTOALL is not modelled by the SimAI-Analytical restatement",
                          comm.op)
    size = comm.size_bytes
    if phase == "fwd" and 0 < size < FWD_MIN_BYTES:
        size = FWD_MIN_BYTES
    n = sizes[comm.group]
    if 1 < size < SMALL_MESSAGE_MAX_BYTES:
        return int(SMALL_MESSAGE_US.get(n, 0) * 1000)
    if size == 0 or n == 1:
        return 0
    geo = geometry(comm.group, n, tp, ep, system)
    busbw, nvlink_bound = bus_bandwidth(comm.op, geo, system)
    ratio = size_ratio(SimaiComm(comm.op, comm.group, size), geo, tp, nvlink_bound, system)
    t = size / GiB / (ratio * busbw) * 1e9 * (n - 1) / n
    return int(t * 2 if comm.op == "allreduce" else t)


@dataclass(frozen=True)
class SimaiAnalyticalResult:
    """SimAI-Analytical's iteration time and its breakdown (its ``EndToEnd.csv`` summary), seconds.

    Attributes
    ----------
    total_s : float
        Iteration time.
    compute_s : float
        Sum of all compute of the file (all GA micro-batches of one stage).
    exposed_tp_s, exposed_ep_s, exposed_dp_s, exposed_dp_ep_s, exposed_pp_s : float
        Exposed comm per group after the overlap ratios.
    bubble_s : float
        Pipeline bubble by SimAI's formula.
    comm_time_s : dict
        ``(phase, op, group, size_bytes) -> (count, time of one, s)`` for every distinct collective.
    skipped_lines : int
        Declared layer lines the file did not contain.
    """

    total_s: float
    compute_s: float
    exposed_tp_s: float
    exposed_ep_s: float
    exposed_dp_s: float
    exposed_dp_ep_s: float
    exposed_pp_s: float
    bubble_s: float
    comm_time_s: dict = field(repr=False)
    skipped_lines: int = 0

    def to_dict(self) -> dict:
        """Scalar figures, seconds (the per-collective table is left out)."""
        return {k: getattr(self, k) for k in ("total_s", "compute_s", "exposed_tp_s", "exposed_ep_s", "exposed_dp_s",
                                              "exposed_dp_ep_s", "exposed_pp_s", "bubble_s", "skipped_lines")}


def simulate_analytical(workload: SimaiWorkload, system: SimaiSystem) -> SimaiAnalyticalResult:
    """Run SimAI-Analytical's cost model on a workload (module docstring).

    Parameters
    ----------
    workload : SimaiWorkload
        The parsed file.
    system : SimaiSystem
        SimAI's command-line flags.

    Returns
    -------
    SimaiAnalyticalResult

    Raises
    ------
    ConfigError
        Group sizes that do not divide, or a collective SimAI cannot price; the message names the line.
    """
    sizes = group_sizes(workload, system.num_gpus)
    ns = {"compute": 0, "bubble_acc": 0}
    exposed = {"TP": 0.0, "EP": 0.0, "DP": 0.0, "DP_EP": 0.0}
    per_comm = {}
    for layer in workload.layers:
        t = {"fwd": 0, "ig": 0, "wg": 0}
        for phase, comm in layer.comms():
            try:
                t[phase] = collective_time_ns(comm, phase, sizes, workload.tp, workload.ep, system)
            except ConfigError as e:
                raise ConfigError(f"line {layer.line_no} {phase}_comm", e.rule, e.got) from None
            key = (phase, comm.op, comm.group, comm.size_bytes)
            count = per_comm.get(key, (0, 0))[0]
            per_comm[key] = (count + 1, t[phase] * 1e-3 * US)
        compute = layer.fwd_compute_ns + layer.ig_compute_ns + layer.wg_compute_ns
        ns["compute"] += compute
        if layer.name != "embedding_layer":
            ns["bubble_acc"] += compute + t["fwd"] + t["ig"]
        blocking_group = "EP" if layer.fwd_comm is not None and layer.fwd_comm.group == "EP" else "TP"
        overlap = system.ep_overlap if blocking_group == "EP" else system.tp_overlap
        exposed[blocking_group] += (t["fwd"] + t["ig"]) * (1 - overlap)
        if layer.wg_comm is not None:
            exposed[layer.wg_comm.group if layer.wg_comm.group in ("DP", "DP_EP") else "DP"] += (
                t["wg"] * (1 - system.dp_overlap))
    bubble_ns = ns["bubble_acc"] * (workload.pp - 1) / (workload.ga * workload.vpp)
    pp_us = (2 * workload.vpp * workload.ga * (workload.pp_comm_bytes / GiB / system.pp_overlap * 1e9) / 1000
             * (1 - system.pp_overlap))
    to_s = 1e-3 * US
    total_s = (ns["compute"] + sum(exposed.values()) + bubble_ns) * to_s + pp_us * US
    return SimaiAnalyticalResult(
        total_s=total_s, compute_s=ns["compute"] * to_s, exposed_tp_s=exposed["TP"] * to_s,
        exposed_ep_s=exposed["EP"] * to_s, exposed_dp_s=exposed["DP"] * to_s, exposed_dp_ep_s=exposed["DP_EP"] * to_s,
        exposed_pp_s=pp_us * US, bubble_s=bubble_ns * to_s, comm_time_s=per_comm,
        skipped_lines=workload.skipped_lines)
