"""NCCL's cost model: latency and bandwidth per (collective, algorithm, protocol), and its time formula.

A faithful port of NCCL v2.30.7 ``src/graph/tuning.cc`` (``ncclTopoTuneModel``, ``ncclTopoGetAlgoTime``)
and of the enable rules in ``src/enqueue.cc`` (``updateCollCostTable``), with the differences of older
releases (2.18-2.29) switched on ``CommLayout.nccl_version`` (:mod:`flowsim.nccl_models.versions`).
NCCL uses this model only to *rank* algorithms and protocols; :mod:`flowsim.nccl_models.execution` turns
the chosen entry into a predicted time. Unavailable entries carry a reason instead of NCCL's zero bandwidth.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from flowsim.nccl_models.constants import (
    COLLNET_ARITY_LAT_S, COLLNET_DIRECT_SM90_FACTOR, COLLNET_MAX_LOCAL_RANKS, LL128_MIN_CC, LL_BW_FACTOR,
    NET_OVERHEAD_S, NVLS_EFFICIENCY, NVLS_MIN_CHANNELS,
    NVLS_RATIO, NVLS_TREE_RATIO_2_18, PAT_BW_FACTOR, PAT_INTER_LAT_DIVISOR, PAT_PER_RANK_LAT_S,
    RING_LL128_BW_FACTOR, RING_LL128_LOW_PPN_FACTOR, RING_LL_FACTOR_OLD, RING_LL_FACTOR_OLD_MULTI,
    RING_PLATEAU_LAT_FACTOR, RING_PLATEAU_LAT_FACTOR_PRE_AMPERE, RING_PLATEAU_MIN_BYTES, SIMPLE_NET_OVERHEAD_FACTOR,
    TREE_AR_BW_FACTOR, TREE_CORRECTION, TREE_CORRECTION_AR_MAX_LOG, TREE_CORRECTION_NVLS_TREE_MAX_LOG,
    TREE_LL128_BW_FACTOR_MULTI, TREE_LL128_BW_FACTOR_N1, TREE_LL_BW_DIVISOR, TREE_RATIO, Algo, Coll, Hw, Proto,
    arch_of, tuning_tables,
)
from flowsim.nccl_models.graph import Graph, Graphs, graphs_of
from flowsim.nccl_models.layout import CommLayout
from flowsim.nccl_models.versions import (
    NVLS_EFFICIENCY_SINCE, NVLS_TREE_RATIO_5_6_SINCE, PAT_SINCE, RING_INTER_STEPS_SINCE, RING_LL128_FLAT_SINCE,
    RING_LL_HALF_SINCE,
)


@dataclass(frozen=True)
class CostModel:
    """NCCL's model for one collective on one communicator.

    Attributes
    ----------
    coll : Coll
        The collective.
    algbw_Bps : float64[7, 3]
        Algorithm bandwidth per (Algo, Proto), bytes/s (NCCL's ``bandwidths``); NaN where unavailable.
    latency_s : float64[7, 3]
        Latency per (Algo, Proto), seconds (NCCL's ``latencies``); NaN where unavailable.
    reason : tuple[tuple[str | None, ...], ...]
        Why each (Algo, Proto) is unavailable; None where it is available.
    graphs : Graphs
        The topology graphs the figures come from.
    """

    coll: Coll
    algbw_Bps: np.ndarray
    latency_s: np.ndarray
    reason: tuple
    graphs: Graphs


def n_steps(coll: Coll, n_ranks: int) -> int:
    """Ring steps of a collective (tuning.cc): AllReduce 2(n-1), AllGather/ReduceScatter n-1, else n."""
    if coll == Coll.ALLREDUCE:
        return 2 * (n_ranks - 1)
    if coll in (Coll.ALLGATHER, Coll.REDUCESCATTER):
        return n_ranks - 1
    return n_ranks


def _log2i(x: int) -> int:
    return int(x).bit_length() - 1 if x > 0 else -1


COLLNET = (Algo.COLLNET_DIRECT, Algo.COLLNET_CHAIN)


def _reason(coll: Coll, a: Algo, p: Proto, layout: CommLayout, g: Graphs) -> str | None:
    """Why NCCL would not consider (coll, a, p) on this communicator; None if it would."""
    nn, ppn, cc = layout.n_nodes, layout.ranks_per_node, layout.compute_capability
    if coll in (Coll.BROADCAST, Coll.REDUCE) and a != Algo.RING:
        return "Broadcast and Reduce run Ring only"
    if coll in (Coll.ALLGATHER, Coll.REDUCESCATTER) and a in (Algo.TREE, Algo.COLLNET_CHAIN, Algo.NVLS_TREE):
        return "not implemented for AllGather/ReduceScatter"
    if coll == Coll.ALLREDUCE and a == Algo.PAT:
        return "PAT runs AllGather/ReduceScatter only"
    if a == Algo.PAT and not layout.version.at_least(PAT_SINCE):
        return f"PAT needs NCCL >= 2.23 (modelling {layout.nccl_version})"
    if a in COLLNET:
        if not layout.collnet:
            return "CollNet needs IB SHARP through the CollNet plugin (NCCL_COLLNET_ENABLE=1)"
        if p != Proto.SIMPLE:
            return "CollNet runs the Simple protocol only"
        if nn == 1:
            return "CollNet needs several nodes"
        if ppn > COLLNET_MAX_LOCAL_RANKS:
            return "CollNet needs <= 8 ranks per node"
        if coll != Coll.ALLREDUCE:
            return "CollNet AllGather/ReduceScatter (SHARP iallgather/ireducescatter) is not modelled"
        if a == Algo.COLLNET_DIRECT and layout.scaleup_kind != "nvswitch":
            return "CollNetDirect needs an NVSwitch"
    if a in (Algo.NVLS, Algo.NVLS_TREE):
        if p != Proto.SIMPLE:
            return "NVLS runs the Simple protocol only"
        if g.nvls is None:
            return "NVLS needs NVSwitch with NVLink SHARP and SM >= 90"
        if g.nvls.n_channels < NVLS_MIN_CHANNELS:
            return "NVLS needs >= 2 NVLS channels (heads)"
        if a == Algo.NVLS_TREE and nn == 1:
            return "NVLSTree needs several nodes"
        if a == Algo.NVLS and nn > 1 and not layout.collnet:
            return "multi-node NVLS needs CollNet (NVLS + IB SHARP, NCCL_COLLNET_ENABLE=1)"
    if a == Algo.PAT:
        if p != Proto.SIMPLE:
            return "PAT runs the Simple protocol only"
        if nn != layout.n_ranks:
            return "PAT needs one rank per node"
    if p == Proto.LL128:
        if cc < LL128_MIN_CC:
            return "LL128 needs SM >= 70"
        if g.intra_hw != Hw.NVLINK:
            return "LL128 is off without NVLink between the GPUs (NCCL enables it for typeIntra <= NVB)"
    return None


def _ring_ll_factor(coll: Coll, layout: CommLayout) -> float:
    """Ring/LL busBw factor: 0.5 from 2.21; before, 1/4 on several nodes or for AllReduce/Reduce, else 1/3."""
    if layout.version.at_least(RING_LL_HALF_SINCE):
        return LL_BW_FACTOR
    if layout.n_nodes > 1 or coll in (Coll.ALLREDUCE, Coll.REDUCE):
        return RING_LL_FACTOR_OLD_MULTI
    return RING_LL_FACTOR_OLD


def _ring_ll128_factor(layout: CommLayout) -> float:
    """Ring/LL128 busBw factor: 0.92; before 2.23, 0.7 when there is one rank per node."""
    if layout.ranks_per_node < 2 and not layout.version.at_least(RING_LL128_FLAT_SINCE):
        return RING_LL128_LOW_PPN_FACTOR
    return RING_LL128_BW_FACTOR


def _nvls_bw(coll: Coll, a: Algo, layout: CommLayout, graph, i2: int) -> float:
    """Per-channel NVLS/NVLSTree bandwidth of tuning.cc from 2.28 (``nvlsEfficiency``), bytes/s."""
    arch = arch_of(layout.compute_capability, layout.version)
    ppn, n_ch = layout.ranks_per_node, graph.n_channels
    intra = graph.bw_intra_Bps * NVLS_EFFICIENCY[arch] * (n_ch - 1) / n_ch
    intra *= 2.0 if coll == Coll.ALLREDUCE else (ppn - 1) / ppn
    inter = graph.bw_inter_Bps * (2.0 if (layout.n_nodes <= 2 and a == Algo.NVLS_TREE) else 1.0)
    caps = tuning_tables(layout.version).per_ch_max_nvls_tree_Bps
    cap = caps[arch, i2] if a == Algo.NVLS_TREE else math.inf
    return min(intra, inter, cap)


def _bus_bw(coll: Coll, a: Algo, p: Proto, layout: CommLayout, g: Graphs) -> float:
    """``busBw`` of tuning.cc for an available (coll, a, p), bytes/s."""
    nn = layout.n_nodes
    version = layout.version
    tables = tuning_tables(version)
    arch = arch_of(layout.compute_capability, version)
    i2 = 0 if nn == 1 else 1 if nn == 2 else 2
    ll_row = int(arch) if nn == 1 else (1 if layout.cpu == "amd" else 0)
    ll_max = tables.ll_max_Bps[ll_row, i2]
    graph = {Algo.TREE: g.tree, Algo.RING: g.ring, Algo.PAT: g.ring}.get(a, g.tree if a in COLLNET else g.nvls)
    n_ch = graph.n_channels
    if a == Algo.COLLNET_DIRECT:  # one channel per NIC (head), carrying the tree graph's bandwidth [inferred]
        heads = min(layout.ranks_per_node, layout.nics_per_node)
        graph = Graph(heads, graph.bw_intra_Bps * n_ch / heads, graph.bw_inter_Bps * n_ch / heads)
        n_ch = heads
    bw = graph.bw_intra_Bps if nn <= 2 or a in COLLNET else graph.bw_inter_Bps
    if a in (Algo.NVLS, Algo.NVLS_TREE) and version.at_least(NVLS_EFFICIENCY_SINCE):
        bw = _nvls_bw(coll, a, layout, graph, i2)
    bus = n_ch * bw
    if a == Algo.RING and p == Proto.LL:
        bus = min(ll_max, bus * _ring_ll_factor(coll, layout))
    elif a == Algo.RING and p == Proto.LL128:
        bus = min(bus * _ring_ll128_factor(layout), n_ch * tables.per_ch_max_ring_ll128_Bps[arch, i2])
    if a == Algo.TREE and coll == Coll.ALLREDUCE:
        bus = min(bus * TREE_AR_BW_FACTOR, n_ch * tables.per_ch_max_tree_Bps[arch, i2])
    if a == Algo.TREE and p == Proto.LL:
        bus = min(bus / TREE_LL_BW_DIVISOR, ll_max)
    elif a == Algo.TREE and p == Proto.LL128:
        f = TREE_LL128_BW_FACTOR_N1 if nn == 1 else TREE_LL128_BW_FACTOR_MULTI
        bus = min(bus * f, n_ch * tables.per_ch_max_tree_ll128_Bps[arch, i2])
    if a == Algo.PAT:
        bus *= PAT_BW_FACTOR
    if a == Algo.COLLNET_DIRECT:  # "Collnet+Direct requires all GPUs to have a local NIC to work at full speed"
        factor = layout.ranks_per_node / n_ch
        bus /= factor - (factor - 1) / 2
        if layout.compute_capability >= 90:
            bus *= COLLNET_DIRECT_SM90_FACTOR
    return bus


def _alg_bw_ratio(coll: Coll, a: Algo, layout: CommLayout) -> float:
    """tuning.cc's busBw -> algBw ratio (dimensionless).

    Ring ``n / nsteps``; Tree and CollNet 0.5; non-Ring AllGather/ReduceScatter (NVLS, PAT) 1 (used as is).
    NVLS/NVLSTree: ``n / nsteps`` from 2.28; 5/6 before (NVLSTree in 2.18: ``0.70 nNodes / (2 (nNodes - 1))``).
    """
    if coll in (Coll.ALLGATHER, Coll.REDUCESCATTER) and a != Algo.RING:
        return 1.0
    if a == Algo.RING:
        return layout.n_ranks / n_steps(coll, layout.n_ranks)
    if a in (Algo.NVLS, Algo.NVLS_TREE):
        version = layout.version
        if version.at_least(NVLS_EFFICIENCY_SINCE):
            return layout.n_ranks / n_steps(coll, layout.n_ranks)
        if a == Algo.NVLS_TREE and not version.at_least(NVLS_TREE_RATIO_5_6_SINCE):
            nn = layout.n_nodes
            return NVLS_TREE_RATIO_2_18 * nn / (2 * (nn - 1))
        return NVLS_RATIO
    return TREE_RATIO


def _ring_inter_steps(coll: Coll, layout: CommLayout) -> int:
    """Network crossings of a ring: AllReduce ``2(nNodes-1)`` (``2 nNodes`` before 2.23), else ``nNodes-1``."""
    nn = layout.n_nodes
    if nn == 1:
        return 0
    if coll != Coll.ALLREDUCE:
        return nn - 1
    return 2 * (nn - 1) if layout.version.at_least(RING_INTER_STEPS_SINCE) else 2 * nn


def _latency(coll: Coll, a: Algo, p: Proto, layout: CommLayout, g: Graphs) -> float:
    """``latencies`` of tuning.cc for an available (coll, a, p), seconds (graph latencyInter taken as 0)."""
    nn, ppn, n = layout.n_nodes, layout.ranks_per_node, layout.n_ranks
    tables = tuning_tables(layout.version)
    hw_lat = tables.hw_lat_s
    hw = g.intra_hw if nn == 1 else Hw.NET
    lat = tables.base_lat_s[a, p]
    intra_lat = hw_lat[g.intra_hw, a, p]
    inter_lat = hw_lat[Hw.NET, Algo.TREE if ppn == 1 else a, p]
    steps = n_steps(coll, n)
    log_nodes = _log2i(nn)
    if a == Algo.RING:
        if coll in (Coll.BROADCAST, Coll.REDUCE):
            if g.same_channels:
                return lat + hw_lat[hw, Algo.RING, p]
            step_lat = hw_lat[hw, Algo.TREE, p] if p == Proto.SIMPLE else hw_lat[hw, Algo.RING, p]
            return lat + steps * step_lat
        net_ovh = 0.0
        if nn > 1:
            net_ovh = NET_OVERHEAD_S[layout.cpu] * (SIMPLE_NET_OVERHEAD_FACTOR if p == Proto.SIMPLE else 1.0)
        intra_lat = max(intra_lat, net_ovh)
        n_inter = _ring_inter_steps(coll, layout)
        return lat + (steps - n_inter) * intra_lat + n_inter * inter_lat
    if a == Algo.TREE:
        return lat + 2 * ((ppn - 1) * intra_lat + log_nodes * inter_lat)
    if a == Algo.COLLNET_DIRECT:
        return lat + 2 * (min(1, ppn - 1) * intra_lat + (ppn - 1) * COLLNET_ARITY_LAT_S) + inter_lat
    if a == Algo.COLLNET_CHAIN:
        return lat + 2 * (ppn - 1) * intra_lat + inter_lat
    if a == Algo.NVLS:
        return lat + intra_lat + (inter_lat if nn > 1 else 0.0)
    if a == Algo.NVLS_TREE:
        return lat + intra_lat + 2 * log_nodes * inter_lat
    # PAT
    return lat + log_nodes * inter_lat / PAT_INTER_LAT_DIVISOR + n * PAT_PER_RANK_LAT_S


@lru_cache(maxsize=4096)
def cost_model(coll: Coll, layout: CommLayout) -> CostModel:
    """NCCL's latency/bandwidth table for ``coll`` on ``layout``.

    Parameters
    ----------
    coll : Coll
        The collective (AllToAll and Send/Recv are not in NCCL's table; see :mod:`.p2p`).
    layout : CommLayout
        The communicator, with at least 2 ranks.

    Returns
    -------
    CostModel
        Algorithm bandwidth (bytes/s) and latency (s) per (Algo, Proto), NaN and a reason where unavailable.

    Notes
    -----
    NCCL 2.30.7 ``src/graph/tuning.cc`` ``ncclTopoTuneModel``: the algorithm bandwidth is
    ``busBw * ratio`` (:func:`_alg_bw_ratio`), as the release ``layout.nccl_version`` computes it.
    """
    g = graphs_of(layout)
    bw = np.full((len(Algo), len(Proto)), np.nan)
    lat = np.full((len(Algo), len(Proto)), np.nan)
    reasons = []
    for a in Algo:
        row = []
        for p in Proto:
            why = _reason(coll, a, p, layout, g)
            row.append(why)
            if why is not None:
                continue
            bw[a, p] = _bus_bw(coll, a, p, layout, g) * _alg_bw_ratio(coll, a, layout)
            lat[a, p] = _latency(coll, a, p, layout, g)
        reasons.append(tuple(row))
    bw.setflags(write=False)
    lat.setflags(write=False)
    return CostModel(coll, bw, lat, tuple(reasons), g)


def nccl_time_s(model: CostModel, layout: CommLayout, a: Algo, p: Proto, n_bytes: float,
                bw_scale: float = 1.0) -> float:
    """NCCL's time estimate ``lat + nBytes / bw`` (``ncclTopoGetAlgoTime``) for one operation, seconds.

    Parameters
    ----------
    model : CostModel
        Table from :func:`cost_model`.
    layout : CommLayout
        The communicator the table was built for.
    a, p : Algo, Proto
        An available entry of the table.
    n_bytes : float
        NCCL's byte count: total buffer for AllGather/ReduceScatter (``nRanks * count * elemSize``), the
        message size otherwise; > 0.
    bw_scale : float, optional
        Factor on the table bandwidth (the execution model's calibrated efficiency); 1 is NCCL's estimate.

    Notes
    -----
    Applies the Tree correction factor (Tree AllReduce, and NVLSTree AllReduce on SM >= 100 x86 hosts)
    and the Ring Simple multi-node "plateau" latency factor, as tuning.cc does.
    """
    bw = model.algbw_Bps[a, p] * bw_scale
    lat = model.latency_s[a, p]
    log_size = _log2i(int(n_bytes) >> 6)
    if model.coll == Coll.ALLREDUCE and 0 <= log_size:
        if a == Algo.TREE and log_size < TREE_CORRECTION_AR_MAX_LOG:
            bw *= TREE_CORRECTION[p, log_size]
        elif (a == Algo.NVLS_TREE and layout.compute_capability >= 100 and layout.cpu in ("intel", "amd")
              and log_size < TREE_CORRECTION_NVLS_TREE_MAX_LOG):
            bw *= TREE_CORRECTION[p, log_size]
    if (a == Algo.RING and p == Proto.SIMPLE and layout.n_nodes > 1 and model.coll == Coll.ALLREDUCE
            and n_bytes / (model.graphs.exec_channels * layout.n_ranks) >= RING_PLATEAU_MIN_BYTES):
        lat *= RING_PLATEAU_LAT_FACTOR_PRE_AMPERE if layout.compute_capability < 80 else RING_PLATEAU_LAT_FACTOR
    return lat + n_bytes / bw
