"""NCCL algorithms as plans of point-to-point transfers between ranks (no topology; numpy only).

A :class:`Plan` lists, for one collective on one communicator, every transfer NCCL's kernels make: source and
destination rank, payload bytes, channel (ring/tree), step, the transfers it waits for (CSR) and a latency.
:mod:`flowsim.network.collective_flows` maps ranks onto GPUs of a topology and runs the plan with the flow engine.
Research notes ``shared/research/nccl-model.md`` sec. 1.5 (chunking) and 1.7 (structure).

Rank placement (NCCL 2.30.7 ``src/graph/search.cc``, ``connect.cc``, ``trees.cc``): communicator ranks are
node-major, ``ppn = n_ranks / n_nodes`` per node. Ring ``c`` visits in every node the local ranks ``s_c, s_c +
1, ..., s_c - 1`` (mod ``ppn``) with ``s_c = c * ppn / R``, then the next node, so each ring enters and leaves
each node once, through the NIC rail of its first GPU (the exit goes through PXN to that rail). On a full xGMI
mesh the rings follow edge-disjoint Walecki cycles (one node) or zigzag paths (several nodes; the path of node
``j + 1`` starts at the local rank where node ``j``'s ended, so the ring stays on one rail without PXN), so that
rings use different mesh links. ``R``, the number of *distinct* rings, is 1 on one NVSwitch node (every channel
follows the same ring, ``graph->sameChannels``), ``ppn - 2`` on one mesh node, and ``min(channels, NICs, ppn)``
on several nodes: NCCL's channels that follow the same ring are merged into one ring carrying their bytes
(identical flows on identical paths drain at the same rate). Tree channel ``c`` uses the same intra-node chain
from ``s_c`` and the NCCL double binary tree across nodes (``trees.cc`` ``ncclGetBtree`` / ``ncclGetDtree``):
tree ``c % 2``.

Structure (sec. 1.7): Ring AllReduce ``2(n-1)`` steps per loop, AllGather/ReduceScatter ``n-1``; a loop moves
``n x chunk`` per channel, the chunk by protocol (sec. 1.5: Simple ``min(2 MiB, S / (channels x n))``, LL 32
KiB, LL128 576,000 B). Loops pipeline through the steps: (loop l, step s, rank r) waits for (l, s - 1) of the
previous rank (its data) and for (l - 1, s) of the same rank (the connection's FIFO). Tree AllReduce: reduce up
the chain and tree, broadcast down, pipelined in chunks (Simple 512 KiB, LL 32 KiB, LL128 one LL128 step; Simple
and LL128 shrunk by NCCL's ladders when a channel has few chunks for the tree's depth). Broadcast/Reduce: the
ring as a chain from/to root 0, chunks of 512 KiB. NVLS: every GPU sends its chunk up to the NVSwitch (``dst =
SWITCH``), a zero-byte barrier (``src = dst = SWITCH``) stands for the switch-side reduction once every GPU's
chunk has arrived, then every GPU receives the result (``src = SWITCH``); on one scale-up domain only (NVLS
across nodes, NVLS + IB SHARP, has no plan). CollNet (IB SHARP): the reduction is resident in the network
(``NET_SWITCH``), streamed. NVLSTree AllReduce: an NVLS reduce in each node to one head per NIC, NCCL's double
binary tree among the heads of each index across nodes, an NVLS broadcast back. (NVLS, NVLSTree and CollNet:
:mod:`flowsim.nccl_models.switch_plans`; ring orders and trees: :mod:`flowsim.nccl_models.rank_orders`.) PAT
AllGather/ReduceScatter, one rank per node: ``ceil(log2 n)`` Bruck steps (:func:`_pat`). AllToAll:
every rank sends ``S / n`` to every other rank, all at once. Send/Recv: rank ``r`` sends ``S`` to ``r + 1``.

Merging: a plan with more transfers than ``max_transfers`` merges consecutive steps and loops (Ring, PAT) or
chunks (Tree, chains, NVLS, NVLSTree) into fewer, larger transfers. In a ring every rank works in every step, so
merged steps move the same bytes over the same links and keep the bandwidth time. Trees, chains and NVLSTrees are
pipelines whose fill grows with the merged chunk: when the budget leaves fewer than ``STREAM_CHUNKS_PER_HOP``
(:mod:`~flowsim.nccl_models.rank_orders`) chunk groups per hop, every edge instead streams its bytes at once
without dependencies (a long pipeline's steady state) and the fill of NCCL's real chunks, ``(depth - 1)`` chunks
at the per-channel rate, is added as latency.

Latency: NCCL's latency for the chosen (algorithm, protocol), ``tuning.cc`` ``latencies`` (base + per-step
``hwLat``), is what the plan must cost when nothing else runs; NVLS adds the analytic model's calibrated
pipeline fill (``NVLS_FILL_CHUNKS``) and small-chunk cost (``NVLS_CHUNK_OVERHEAD_S``), which its three-stage
plan (up, switch, down) does not produce; NVLSTree adds the small-chunk cost (its pipeline has its own fill), and
streamed trees/chains/NVLSTrees add their fill (see Merging). In the flow
engine a transfer's latency also delays the transfers that wait on it through the FIFO, so a per-step ``hwLat``
on every transfer would charge it once per chunk. The plan therefore spreads NCCL's step latencies evenly over
its critical path (the longest chain of dependent transfers, ``critical_path``) and keeps the base latency apart
(``base_latency_s``), so an uncontended run costs exactly NCCL's latency whatever the merging.

Protocols: ``wire_factor`` scales payload to bytes on the wire: LL sends 8 B of data per 16 B line (x2), LL128
120 B of data per 128 B line (x128/120); Simple x1.

Kernel rates: a collective's CTAs move data at most as fast as NCCL's graph bandwidth (channels x per-channel
speed, ``tuning.cc`` busBw), often below the wires (H100: 360 GB/s of ring bandwidth on 450 GB/s NVLink). Each
plan carries, per rank, that rate in wire bytes/s (``kernel_Bps``): ``NCCL algbw x wire bytes the rank sends /
size``, so that a rank alone moves its bytes in NCCL's time. The algbw is the calibrated one of
:mod:`~flowsim.nccl_models.execution` less ``NET_BW_EFFICIENCY`` (which the flow engine puts on the scale-out
links instead); AllToAll and Send/Recv (no NCCL bandwidth) use the analytic time less its latency.

Front door: :func:`plan_collective` picks the algorithm and protocol as NCCL does among those with a plan
(:func:`flowsim.nccl_models.predict`) and builds the plan; :func:`build_plan` builds one for a given choice.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from flowsim._moved import module_getattr
from flowsim.errors import ConfigError
from flowsim.nccl_models.constants import (
    ALGO_NAMES, BCAST_CHUNK_STEPS, LL128_STEP_DATA_BYTES, LL_BW_FACTOR, LL_STEP_DATA_BYTES, PROTO_NAMES,
    RING_CHUNK_STEPS, SIMPLE_STEP_BYTES, TREE_LL128_BW_FACTOR_MULTI, Algo, Coll, Proto, tuning_tables,
)
from flowsim.nccl_models.estimate import COLL_OF_OP, P2P_OPS, CollectiveEstimate, check_size, predict
from flowsim.nccl_models.execution import (
    bw_efficiency, execution_layout, nvls_allreduce_factor, nvls_chunk_overhead_s, pipeline_fill_s,
    tree_chunk_bytes,
)
from flowsim.nccl_models.graph import graphs_of
from flowsim.nccl_models.layout import CommLayout
from flowsim.nccl_models.overrides import parse_override
from flowsim.nccl_models.p2p import alltoall_time_s, p2p_latency_s, sendrecv_time_s
from flowsim.nccl_models.rank_orders import (
    chunk_groups, distinct_rings, dtree_parent, even_groups, parent_depth, pipelined, ring_order,
)
from flowsim.nccl_models.switch_plans import collnet_parts, nvls_parts, nvls_tree_parts
from flowsim.nccl_models.tuning import cost_model, n_steps

__all__ = ["PLANNED_ALGOS", "Plan", "build_plan", "plan_collective"]
__getattr__ = module_getattr(__name__)  # rank orders and NVLS helpers moved to rank_orders / switch_plans

PLANNED_ALGOS = ("Ring", "Tree", "NVLS", "NVLSTree", "PAT", "CollNetDirect", "CollNetChain", "P2P")
"""Algorithms (NCCL names) that have a plan. NVLS across nodes (NVLS + SHARP) has none."""

_EVEN_ONLY = ("CollNetDirect", "CollNetChain")
"""Algorithms whose plans (:func:`~flowsim.nccl_models.switch_plans.collnet_parts`) need the same ranks on every
node: on uneven nodes the flow engine picks among the others (PAT needs one rank per node anyway)."""

DEFAULT_MAX_TRANSFERS = 1 << 13
"""Transfers above which a plan merges steps/loops/chunks (a cost cap, set from benchmarks/bench_collectives.py)."""

_WIRE_FACTOR = {Proto.LL: 1.0 / LL_BW_FACTOR,  # NCCL 2.30.7 device.h: LL line = 8 B data + 8 B flags
                Proto.LL128: 1.0 / TREE_LL128_BW_FACTOR_MULTI,  # NCCL 2.30.7 device.h: 120 B data / 128 B line
                Proto.SIMPLE: 1.0}
_PROTO = {"LL": Proto.LL, "LL128": Proto.LL128, "Simple": Proto.SIMPLE}
_ALGO = {"Ring": Algo.RING, "Tree": Algo.TREE, "NVLS": Algo.NVLS, "NVLSTree": Algo.NVLS_TREE, "PAT": Algo.PAT,
         "CollNetDirect": Algo.COLLNET_DIRECT, "CollNetChain": Algo.COLLNET_CHAIN}


@dataclass(frozen=True, eq=False)
class Plan:
    """Point-to-point transfers of one collective on one communicator.

    Attributes
    ----------
    op : str
        Collective.
    algo : Algo or None
        NCCL algorithm; None for point-to-point (AllToAll, Send/Recv). ``algo_name`` is NCCL's name (``P2P``).
    proto : Proto
        NCCL protocol (``Proto.SIMPLE`` for point-to-point).
    n_ranks : int
        Ranks of the communicator.
    size_bytes : float
        Collective size, nccl-tests convention (total buffer for AllGather/ReduceScatter/AllToAll).
    src, dst : int64[n_transfers]
        Communicator ranks; ``SWITCH`` (-1) is the NVSwitch in NVLS plans, ``NET_SWITCH`` (-2) the network's
        SHARP reduction in CollNet plans (:mod:`flowsim.nccl_models.switch_plans`).
    payload_bytes : float64[n_transfers]
        User data each transfer carries, bytes (wire bytes = ``payload_bytes * wire_factor``).
    channel : int64[n_transfers]
        Ring or tree (distinct path) the transfer belongs to.
    step : int64[n_transfers]
        Ring step group, tree/chain/NVLS chunk group, PAT loop group, or AllToAll peer offset.
    dep_ptr, dep_idx : int64[n_transfers + 1], int64[n_deps]
        CSR: transfer t waits for ``dep_idx[dep_ptr[t]:dep_ptr[t + 1]]``.
    latency_s : float64[n_transfers]
        Delay after each transfer's last byte before its dependents may start, seconds (module docstring).
    base_latency_s : float
        NCCL's base latency of the (algorithm, protocol), paid once, seconds.
    wire_factor : float
        Wire bytes per payload byte of the protocol (LL 2, LL128 128/120, Simple 1).
    critical_path : int
        Transfers on the longest dependency chain.
    kernel_Bps : float64[n_ranks]
        Each rank's kernel rate, wire bytes/s (module docstring, Kernel rates).
    """

    op: str
    algo: Algo | None
    proto: Proto
    n_ranks: int
    size_bytes: float
    src: np.ndarray
    dst: np.ndarray
    payload_bytes: np.ndarray
    channel: np.ndarray
    step: np.ndarray
    dep_ptr: np.ndarray
    dep_idx: np.ndarray
    latency_s: np.ndarray
    base_latency_s: float
    wire_factor: float
    critical_path: int
    kernel_Bps: np.ndarray

    @property
    def algo_name(self) -> str:
        """NCCL's name of the algorithm (``Ring``, ``Tree``, ... ``P2P`` for point-to-point)."""
        return "P2P" if self.algo is None else ALGO_NAMES[self.algo]

    @property
    def proto_name(self) -> str:
        """NCCL's name of the protocol (``LL``, ``LL128``, ``Simple``)."""
        return PROTO_NAMES[self.proto]

    @property
    def n_transfers(self) -> int:
        """Number of transfers."""
        return int(self.src.size)

    def sent_bytes(self) -> np.ndarray:
        """float64[n_ranks]: payload bytes each rank sends (transfers from the switch excluded)."""
        ok = self.src >= 0
        return np.bincount(self.src[ok], weights=self.payload_bytes[ok], minlength=self.n_ranks)

    def received_bytes(self) -> np.ndarray:
        """float64[n_ranks]: payload bytes each rank receives (transfers to the switch excluded)."""
        ok = self.dst >= 0
        return np.bincount(self.dst[ok], weights=self.payload_bytes[ok], minlength=self.n_ranks)

    def __repr__(self) -> str:
        return (f"Plan({self.op} {self.algo_name}/{self.proto_name} on {self.n_ranks} ranks: "
                f"{self.n_transfers} transfers, critical path {self.critical_path})")


def _csr(n: int, dependent: np.ndarray, dependency: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR (transfer -> dependencies) from pairs ``(dependent[i], dependency[i])``."""
    order = np.argsort(dependent, kind="stable")
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dependent, minlength=n), out=ptr[1:])
    return ptr, dependency[order].astype(np.int64)


def _names(algo, proto) -> tuple[str, str]:
    """(algorithm name, protocol name) from NCCL names or the :class:`Algo` / :class:`Proto` enums."""
    a = ALGO_NAMES[algo] if isinstance(algo, Algo) else ("P2P" if algo is None else algo)
    p = PROTO_NAMES[proto] if isinstance(proto, Proto) else proto
    return a, p


def _check(op: str, size_bytes: float, layout: CommLayout, algo: str, proto: str) -> float:
    if op not in (*COLL_OF_OP, "alltoall", "sendrecv"):
        raise ConfigError("op", "must be one of allreduce, allgather, reducescatter, broadcast, reduce, "
                                "alltoall, sendrecv", op)
    size = check_size(size_bytes)
    if layout.n_ranks < 2:
        raise ConfigError("n_ranks", "a plan needs >= 2 ranks (one rank moves no data)", layout.n_ranks)
    if algo not in PLANNED_ALGOS:
        raise ConfigError("algo", f"the flow engine has plans for {', '.join(PLANNED_ALGOS)} only", algo)
    if (algo == "P2P") != (op in P2P_OPS):
        raise ConfigError("algo", f"{op} does not run {algo}", algo)
    if algo != "P2P" and proto not in _PROTO:
        raise ConfigError("proto", "must be LL, LL128 or Simple", proto)
    if algo == "NVLS" and (layout.n_nodes > 1 or op not in ("allreduce", "allgather", "reducescatter")):
        raise ConfigError("algo", "NVLS plans cover AllReduce/AllGather/ReduceScatter on one scale-up domain",
                          f"{op} on {layout.n_nodes} nodes")
    if algo in ("Tree", "NVLSTree") and op != "allreduce":
        raise ConfigError("algo", f"{algo} runs AllReduce only", op)
    if algo == "PAT" and op not in ("allgather", "reducescatter"):
        raise ConfigError("algo", "PAT runs AllGather/ReduceScatter only", op)
    if layout.uneven and algo in _EVEN_ONLY:
        raise ConfigError("algo", f"{algo} plans need the same ranks on every node", layout.node_ranks)
    return size


def kernel_rates_Bps(op: str, size_bytes: float, layout: CommLayout, algo: Algo | None, proto: Proto,
                     sent_wire_bytes: np.ndarray) -> np.ndarray:
    """Each rank's kernel rate, wire bytes/s (module docstring, Kernel rates).

    ``algo`` None is point-to-point (the analytic time less its latency); ``sent_wire_bytes`` is what each rank
    sends on the wire (ranks sending nothing get the algbw itself).
    """
    if algo is None:
        t = alltoall_time_s(layout, size_bytes) if op == "alltoall" else sendrecv_time_s(layout, size_bytes)
        algbw = size_bytes / (t - p2p_latency_s(layout))
    else:
        coll = COLL_OF_OP[op]
        algbw = cost_model(coll, layout).algbw_Bps[algo, proto] * bw_efficiency(layout, algo, network=False) \
            * nvls_allreduce_factor(coll, layout, algo)
    return np.where(sent_wire_bytes > 0, algbw * sent_wire_bytes / size_bytes, algbw)


def build_plan(op: str, size_bytes: float, layout: CommLayout, algo, proto, *,
               max_transfers: int = DEFAULT_MAX_TRANSFERS) -> Plan:
    """The transfers of one collective as NCCL runs it with (``algo``, ``proto``).

    Parameters
    ----------
    op : str
        ``allreduce``, ``allgather``, ``reducescatter``, ``broadcast``, ``reduce``, ``alltoall`` or ``sendrecv``.
    size_bytes : float
        Bytes, nccl-tests convention; > 0.
    layout : CommLayout
        The communicator (>= 2 ranks).
    algo, proto : Algo and Proto, or str
        The enums, or NCCL names as :func:`flowsim.nccl_models.predict` reports them (``Ring``, ``Tree``,
        ``NVLS`` ... with ``LL``/``LL128``/``Simple``); ``None`` or ``P2P`` (proto ignored) for AllToAll and
        Send/Recv.
    max_transfers : int, optional
        Merge steps/loops/chunks until the plan has at most about this many transfers (module docstring).

    Returns
    -------
    Plan

    Raises
    ------
    ConfigError
        Unknown op, size <= 0, fewer than 2 ranks, or an algorithm without a plan or not valid for ``op``.
    """
    algo, proto = _names(algo, proto)
    size = _check(op, size_bytes, layout, algo, proto)
    if not isinstance(max_transfers, int) or max_transfers < 1:
        raise ConfigError("max_transfers", "must be a positive integer", max_transfers)
    if algo == "P2P":
        return _p2p_plan(op, size, layout)
    a, p = _ALGO[algo], _PROTO[proto]
    coll = COLL_OF_OP[op]
    model = cost_model(coll, layout)
    if model.reason[a][p] is not None:
        raise ConfigError("algo", f"NCCL cannot run {algo}/{proto} here: {model.reason[a][p]}", algo)
    base = float(tuning_tables(layout.version).base_lat_s[a, p])
    step_lat = float(model.latency_s[a, p]) - base
    g = graphs_of(layout)
    if a == Algo.NVLS:
        parts = nvls_parts(op, size, layout, g.nvls_exec_channels, g.nvls.n_channels, max_transfers)
    elif a == Algo.NVLS_TREE:
        parts = nvls_tree_parts(size, layout, g.nvls_exec_channels, g.nvls.n_channels, max_transfers)
    elif a == Algo.PAT:
        parts = _pat(coll, size, layout, g.exec_channels, max_transfers)
    elif a in (Algo.COLLNET_DIRECT, Algo.COLLNET_CHAIN):
        parts = collnet_parts(a, size, layout, g.exec_channels)
    elif a == Algo.TREE:
        parts = _tree(size, layout, g.exec_channels, p, max_transfers)
    elif coll in (Coll.BROADCAST, Coll.REDUCE):
        parts = _chain(op, size, layout, g.exec_channels, max_transfers)
    else:
        parts = _ring(coll, size, layout, g.exec_channels, p, max_transfers)
    src, dst, payload, channel, step, dependent, dependency, depth, fill_bytes = parts
    n = src.size
    ptr, idx = _csr(n, dependent, dependency)
    nvls = a in (Algo.NVLS, Algo.NVLS_TREE)
    channels = g.nvls_exec_channels if nvls else g.exec_channels
    fill_s = fill_bytes / (float(model.algbw_Bps[a, p]) / channels)  # one chunk at the per-channel rate
    if nvls:  # the per-chunk cost of small NVLS chunks (execution.py), not in the plan
        fill_s += nvls_chunk_overhead_s(model, size)
    if a == Algo.NVLS:  # single-node NVLS's measured pipeline depth, which its three stages do not produce
        fill_s += pipeline_fill_s(model, layout, a, p, size, model.algbw_Bps[a, p] * bw_efficiency(layout, a)
                                  * nvls_allreduce_factor(coll, layout, a))
    sent = np.bincount(src[src >= 0], weights=payload[src >= 0], minlength=layout.n_ranks) * _WIRE_FACTOR[p]
    return Plan(op, a, p, layout.n_ranks, size, src, dst, payload, channel, step, ptr, idx,
                np.full(n, (step_lat + fill_s) / depth), base, _WIRE_FACTOR[p], depth,
                kernel_rates_Bps(op, size, layout, a, p, sent))


def _ring_chunk_bytes(p: Proto, size: float, channels: int, n: int) -> float:
    """Per-channel chunk of one ring step (sec. 1.5, enqueue.cc calcCollChunking)."""
    if p == Proto.SIMPLE:
        return min(RING_CHUNK_STEPS * SIMPLE_STEP_BYTES, size / (channels * n))
    return LL_STEP_DATA_BYTES if p == Proto.LL else LL128_STEP_DATA_BYTES


def _ring(coll: Coll, size: float, layout: CommLayout, channels: int, p: Proto, max_transfers: int):
    """Ring AllReduce / AllGather / ReduceScatter: (ring, loop group, step group, position) transfers."""
    n = layout.n_ranks
    R = distinct_rings(layout, channels)
    steps = n_steps(coll, n)
    loops = max(1, math.ceil(size / (n * channels * _ring_chunk_bytes(p, size, channels, n))))
    allowed = max(1, max_transfers // (R * n))
    n_lg = min(loops, max(math.isqrt(allowed), allowed // steps))  # loop groups overlap in a wavefront
    n_sg = min(steps, max(1, allowed // n_lg))
    step_sizes = even_groups(steps, n_sg)
    loop_frac = even_groups(loops, n_lg) / loops
    order = ring_order(layout, R)
    shape = (R, n_lg, n_sg, n)
    c, lg, sg, q = (a.ravel() for a in np.indices(shape))
    src = order[c, q]
    dst = order[c, (q + 1) % n]
    payload = size / (n * R) * step_sizes[sg] * loop_frac[lg]
    tid = np.arange(src.size).reshape(shape)
    prev_rank = tid[:, :, :-1, np.r_[n - 1, 0:n - 1]]  # (sg - 1, q - 1)
    fifo = tid[:, :-1]  # (lg - 1, same sg, same q)
    dependent = np.concatenate([tid[:, :, 1:].ravel(), tid[:, 1:].ravel()])
    dependency = np.concatenate([prev_rank.ravel(), fifo.ravel()])
    return src, dst, payload, c, sg, dependent, dependency, n_sg + n_lg - 1, 0.0


def _tree(size: float, layout: CommLayout, channels: int, p: Proto, max_transfers: int):
    """Tree AllReduce: intra-node chains + double binary tree, reduce up then broadcast down."""
    nn = layout.n_nodes
    R = distinct_rings(layout, channels) * (2 if nn > 1 else 1)  # each ring path runs both trees
    order = ring_order(layout, R)  # node by node, each node's chain head first
    first = np.concatenate([[0], np.cumsum(layout.node_sizes)[:-1]])
    inner = np.setdiff1d(np.arange(layout.n_ranks), first)  # chain positions below a head
    t0, t1 = dtree_parent(nn)
    node_parent = np.stack([t0, t1])[np.arange(R) % 2]  # [R, nn]
    parent = np.full((R, layout.n_ranks), -1, dtype=np.int64)
    parent[np.arange(R)[:, None], order[:, inner]] = order[:, inner - 1]
    heads = order[:, first]
    up_node = np.maximum(node_parent, 0)
    parent[np.arange(R)[:, None], heads] = np.where(node_parent >= 0, heads[np.arange(R)[:, None], up_node], -1)
    depth = parent_depth(parent)
    per_channel = size / channels
    chunk = tree_chunk_bytes(p, per_channel, depth, layout)
    n_chunks = max(1, math.ceil(per_channel / chunk))
    groups, frac, path, fill, stream = chunk_groups(n_chunks, 2 * R * (layout.n_ranks - 1), 2 * depth,
                                                 min(chunk, per_channel), max_transfers)
    return (*pipelined(parent, groups, frac, size, True, True, stream), path, fill)


def _chain(op: str, size: float, layout: CommLayout, channels: int, max_transfers: int):
    """Broadcast (root 0 -> ring order) or Reduce (ring order -> root 0), pipelined in 512 KiB chunks."""
    n = layout.n_ranks
    R = distinct_rings(layout, channels)
    order = ring_order(layout, R)
    root_pos = np.argmax(order == 0, axis=1)[:, None]
    seq = order[np.arange(R)[:, None], (root_pos + np.arange(n)) % n]  # chain from the root
    parent = np.full((R, n), -1, dtype=np.int64)
    parent[np.arange(R)[:, None], seq[:, 1:]] = seq[:, :-1]
    chunk = BCAST_CHUNK_STEPS * SIMPLE_STEP_BYTES
    per_channel = size / channels
    n_chunks = max(1, math.ceil(per_channel / chunk))
    groups, frac, path, fill, stream = chunk_groups(n_chunks, R * (n - 1), n - 1, min(chunk, per_channel),
                                                 max_transfers)
    return (*pipelined(parent, groups, frac, size, op == "reduce", op == "broadcast", stream), path, fill)


def _pat(coll: Coll, size: float, layout: CommLayout, channels: int, max_transfers: int):
    """PAT AllGather / ReduceScatter, one rank per node (research notes sec. 1.7: a Bruck variant, NCCL 2.23+).

    ``L = ceil(log2 n)`` steps; AllGather step ``i`` sends ``min(2^i, n - 2^i)`` blocks of ``S / n`` from rank
    ``r`` to ``r - 2^i`` (what ``r`` has gathered so far); ReduceScatter runs the steps in reverse order with
    partial sums. Every rank sends and receives ``(n - 1) / n x S``. Step ``i`` of ``r`` waits for the data that
    reached ``r`` in step ``i - 1`` and for ``r``'s own step ``i - 1``. The buffer is cut in loops like a Simple
    ring's (:func:`_ring_chunk_bytes`), loops pipeline through the steps (FIFO), merged to fit the budget.
    """
    n = layout.n_ranks
    L = max(1, math.ceil(math.log2(n)))
    dist = 1 << np.arange(L)
    blocks = np.minimum(dist, n - dist)
    if coll == Coll.REDUCESCATTER:
        dist, blocks = dist[::-1], blocks[::-1]
    loops = max(1, math.ceil(size / (n * channels * _ring_chunk_bytes(Proto.SIMPLE, size, channels, n))))
    groups = min(loops, max(1, max_transfers // (L * n)))
    frac = even_groups(loops, groups) / loops
    shape = (groups, L, n)
    k, i, r = (a.ravel() for a in np.indices(shape))
    tid = np.arange(k.size).reshape(shape)
    feeder = tid[:, np.arange(L - 1)[:, None], (np.arange(n)[None, :] + dist[:-1, None]) % n]  # sent to r in i-1
    dependent = np.concatenate([tid[:, 1:].ravel(), tid[:, 1:].ravel(), tid[1:].ravel()])
    dependency = np.concatenate([feeder.ravel(), tid[:, :-1].ravel(), tid[:-1].ravel()])
    return (r, (r - dist[i]) % n, size / n * blocks[i] * frac[k], np.zeros(k.size, dtype=np.int64), k,
            dependent, dependency, groups + L - 1, 0.0)


def _p2p_plan(op: str, size: float, layout: CommLayout) -> Plan:
    """AllToAll (every rank ``S / n`` to every other rank) or Send/Recv (``S`` to the next rank), no deps."""
    n = layout.n_ranks
    if op == "alltoall":
        r, i = (a.ravel() for a in np.indices((n, n - 1)))
        src, dst, step = r, (r + i + 1) % n, i + 1
        payload = np.full(src.size, size / n)
    else:
        src, dst, step = np.arange(n), (np.arange(n) + 1) % n, np.ones(n, dtype=np.int64)
        payload = np.full(n, size)
    m = src.size
    lat = p2p_latency_s(layout)
    sent = np.bincount(src, weights=payload, minlength=n)
    return Plan(op, None, Proto.SIMPLE, n, size, src, dst, payload, np.zeros(m, dtype=np.int64), step,
                np.zeros(m + 1, dtype=np.int64), np.zeros(0, dtype=np.int64), np.full(m, lat), 0.0, 1.0, 1,
                kernel_rates_Bps(op, size, layout, None, Proto.SIMPLE, sent))


def _planned_override(op: str, algo: str | None, layout: CommLayout) -> str | None:
    """NCCL_ALGO text allowing only the algorithms with a plan, within the user's override ``algo`` (NVLS across
    nodes, NVLS + SHARP, has none)."""
    if op in P2P_OPS:
        return algo
    allowed = parse_override(algo, op, "algo") if algo else frozenset(Algo)
    planned = {a for a in allowed if ALGO_NAMES[a] in PLANNED_ALGOS and not (a == Algo.NVLS and layout.n_nodes > 1)
               and not (layout.uneven and ALGO_NAMES[a] in _EVEN_ONLY)}
    if not planned:
        raise ConfigError("algo", f"the flow engine has plans for {', '.join(PLANNED_ALGOS[:-1])} only (and NVLS "
                                  "on one NVLink domain; Ring and Tree on uneven nodes)", algo)
    return ",".join(sorted(ALGO_NAMES[a].lower() for a in planned))


def plan_collective(op: str, size_bytes: float, layout: CommLayout, *, algo: str | None = None,
                    proto: str | None = None,
                    max_transfers: int = DEFAULT_MAX_TRANSFERS) -> tuple[CollectiveEstimate, Plan | None]:
    """NCCL's choice among the algorithms with a plan, and its plan: the front door of the flow engine.

    Parameters
    ----------
    op : str
        One of :data:`flowsim.nccl_models.OPS`.
    size_bytes : float
        Bytes, nccl-tests convention; > 0.
    layout : CommLayout
        The communicator, at the release whose choice is modelled.
    algo, proto : str, optional
        NCCL_ALGO / NCCL_PROTO overrides (:func:`flowsim.nccl_models.predict`).
    max_transfers : int, optional
        See :func:`build_plan`.

    Returns
    -------
    (CollectiveEstimate, Plan or None)
        The analytic estimate of the choice, and its plan (None for a single rank, which moves no data). The
        release chose (algo, proto); the plan runs at the newest release's speeds
        (:func:`~flowsim.nccl_models.execution.execution_layout`), as the analytic model prices it.
    """
    est = predict(op, size_bytes, layout, algo=_planned_override(op, algo, layout), proto=proto)
    if layout.n_ranks == 1:
        return est, None
    run = layout if op in P2P_OPS else execution_layout(layout)
    return est, build_plan(op, est.size_bytes, run, est.algo, est.proto, max_transfers=max_transfers)
