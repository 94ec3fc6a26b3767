"""NCCL's cost model: latency and bandwidth per (collective, algorithm, protocol), and its time formula.

A faithful port of NCCL v2.30.7 ``src/graph/tuning.cc`` (``ncclTopoTuneModel``, ``ncclTopoGetAlgoTime``)
and of the enable rules in ``src/enqueue.cc`` (``updateCollCostTable``). NCCL uses this model only to
*rank* algorithms and protocols; :mod:`flowsim.nccl_models.execution` turns the chosen entry into a
predicted time. Unavailable entries carry a reason instead of NCCL's zero bandwidth.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from flowsim.nccl_models.constants import (
    BASE_LAT_S, COLLNET_MAX_LOCAL_RANKS, HW_LAT_S, LL128_MIN_CC, LL_BW_FACTOR, LL_MAX_BPS, NET_OVERHEAD_S,
    NVLS_EFFICIENCY, NVLS_MIN_CHANNELS, PAT_BW_FACTOR, PAT_INTER_LAT_DIVISOR, PAT_PER_RANK_LAT_S,
    PER_CH_MAX_NVLS_TREE_BPS, PER_CH_MAX_RING_LL128_BPS, PER_CH_MAX_TREE_BPS, PER_CH_MAX_TREE_LL128_BPS,
    RING_LL128_BW_FACTOR, RING_PLATEAU_LAT_FACTOR, RING_PLATEAU_LAT_FACTOR_PRE_AMPERE, RING_PLATEAU_MIN_BYTES,
    SIMPLE_NET_OVERHEAD_FACTOR, TREE_AR_BW_FACTOR, TREE_CORRECTION, TREE_CORRECTION_AR_MAX_LOG,
    TREE_CORRECTION_NVLS_TREE_MAX_LOG, TREE_LL128_BW_FACTOR_MULTI, TREE_LL128_BW_FACTOR_N1, TREE_LL_BW_DIVISOR,
    TREE_RATIO, Algo, Coll, Hw, Proto, arch_of,
)
from flowsim.nccl_models.graph import Graphs, graphs_of
from flowsim.nccl_models.layout import CommLayout


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


def _reason(coll: Coll, a: Algo, p: Proto, layout: CommLayout, g: Graphs) -> str | None:
    """Why NCCL would not consider (coll, a, p) on this communicator; None if it would."""
    nn, ppn, cc = layout.n_nodes, layout.ranks_per_node, layout.compute_capability
    if coll in (Coll.BROADCAST, Coll.REDUCE) and a != Algo.RING:
        return "Broadcast and Reduce run Ring only"
    if coll in (Coll.ALLGATHER, Coll.REDUCESCATTER) and a in (Algo.TREE, Algo.COLLNET_CHAIN, Algo.NVLS_TREE):
        return "not implemented for AllGather/ReduceScatter"
    if coll == Coll.ALLREDUCE and a == Algo.PAT:
        return "PAT runs AllGather/ReduceScatter only"
    if a in (Algo.COLLNET_DIRECT, Algo.COLLNET_CHAIN):
        if ppn > COLLNET_MAX_LOCAL_RANKS:
            return "CollNet needs <= 8 ranks per node"
        return "CollNet needs the IB SHARP plugin (NCCL_COLLNET_ENABLE), not modelled"
    if a in (Algo.NVLS, Algo.NVLS_TREE):
        if p != Proto.SIMPLE:
            return "NVLS runs the Simple protocol only"
        if g.nvls is None:
            return "NVLS needs NVSwitch with NVLink SHARP and SM >= 90"
        if g.nvls.n_channels < NVLS_MIN_CHANNELS:
            return "NVLS needs >= 2 NVLS channels (heads)"
        if a == Algo.NVLS_TREE and nn == 1:
            return "NVLSTree needs several nodes"
        if a == Algo.NVLS and nn > 1:
            return "multi-node NVLS needs CollNet (NVLS + IB SHARP), not modelled"
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


def _bus_bw(coll: Coll, a: Algo, p: Proto, layout: CommLayout, g: Graphs) -> float:
    """``busBw`` of tuning.cc for an available (coll, a, p), bytes/s."""
    nn, ppn = layout.n_nodes, layout.ranks_per_node
    arch = arch_of(layout.compute_capability)
    i2 = 0 if nn == 1 else 1 if nn == 2 else 2
    ll_row = int(arch) if nn == 1 else (1 if layout.cpu == "amd" else 0)
    ll_max = LL_MAX_BPS[ll_row, i2]
    graph = {Algo.TREE: g.tree, Algo.RING: g.ring, Algo.PAT: g.ring}.get(a, g.nvls)
    n_ch = graph.n_channels
    bw = graph.bw_intra_Bps if nn <= 2 else graph.bw_inter_Bps
    if a in (Algo.NVLS, Algo.NVLS_TREE):
        intra = graph.bw_intra_Bps * NVLS_EFFICIENCY[arch] * (n_ch - 1) / n_ch
        intra *= 2.0 if coll == Coll.ALLREDUCE else (ppn - 1) / ppn
        inter = graph.bw_inter_Bps * (2.0 if (nn <= 2 and a == Algo.NVLS_TREE) else 1.0)
        cap = PER_CH_MAX_NVLS_TREE_BPS[arch, i2] if a == Algo.NVLS_TREE else math.inf
        bw = min(intra, inter, cap)
    bus = n_ch * bw
    if a == Algo.RING and p == Proto.LL:
        bus = min(ll_max, bus * LL_BW_FACTOR)
    elif a == Algo.RING and p == Proto.LL128:
        bus = min(bus * RING_LL128_BW_FACTOR, n_ch * PER_CH_MAX_RING_LL128_BPS[arch, i2])
    if a == Algo.TREE and coll == Coll.ALLREDUCE:
        bus = min(bus * TREE_AR_BW_FACTOR, n_ch * PER_CH_MAX_TREE_BPS[arch, i2])
    if a == Algo.TREE and p == Proto.LL:
        bus = min(bus / TREE_LL_BW_DIVISOR, ll_max)
    elif a == Algo.TREE and p == Proto.LL128:
        f = TREE_LL128_BW_FACTOR_N1 if nn == 1 else TREE_LL128_BW_FACTOR_MULTI
        bus = min(bus * f, n_ch * PER_CH_MAX_TREE_LL128_BPS[arch, i2])
    if a == Algo.PAT:
        bus *= PAT_BW_FACTOR
    return bus


def _latency(coll: Coll, a: Algo, p: Proto, layout: CommLayout, g: Graphs) -> float:
    """``latencies`` of tuning.cc for an available (coll, a, p), seconds (graph latencyInter taken as 0)."""
    nn, ppn, n = layout.n_nodes, layout.ranks_per_node, layout.n_ranks
    hw = g.intra_hw if nn == 1 else Hw.NET
    lat = BASE_LAT_S[a, p]
    intra_lat = HW_LAT_S[g.intra_hw, a, p]
    inter_lat = HW_LAT_S[Hw.NET, Algo.TREE if ppn == 1 else a, p]
    steps = n_steps(coll, n)
    log_nodes = _log2i(nn)
    if a == Algo.RING:
        if coll in (Coll.BROADCAST, Coll.REDUCE):
            if g.same_channels:
                return lat + HW_LAT_S[hw, Algo.RING, p]
            step_lat = HW_LAT_S[hw, Algo.TREE, p] if p == Proto.SIMPLE else HW_LAT_S[hw, Algo.RING, p]
            return lat + steps * step_lat
        net_ovh = 0.0
        if nn > 1:
            net_ovh = NET_OVERHEAD_S[layout.cpu] * (SIMPLE_NET_OVERHEAD_FACTOR if p == Proto.SIMPLE else 1.0)
        intra_lat = max(intra_lat, net_ovh)
        n_inter = 0 if nn == 1 else (2 * (nn - 1) if coll == Coll.ALLREDUCE else nn - 1)
        return lat + (steps - n_inter) * intra_lat + n_inter * inter_lat
    if a == Algo.TREE:
        return lat + 2 * ((ppn - 1) * intra_lat + log_nodes * inter_lat)
    if a == Algo.NVLS:
        return intra_lat + (inter_lat if nn > 1 else 0.0)
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
    ``busBw * ratio`` with ratio ``n / nsteps`` for Ring, NVLS and NVLSTree and 0.5 for Tree; for
    non-Ring AllGather/ReduceScatter (NVLS, PAT) NCCL uses ``busBw`` as is.
    """
    g = graphs_of(layout)
    bw = np.full((len(Algo), len(Proto)), np.nan)
    lat = np.full((len(Algo), len(Proto)), np.nan)
    reasons = []
    steps = n_steps(coll, layout.n_ranks)
    for a in Algo:
        row = []
        for p in Proto:
            why = _reason(coll, a, p, layout, g)
            row.append(why)
            if why is not None:
                continue
            bus = _bus_bw(coll, a, p, layout, g)
            if a in (Algo.RING, Algo.NVLS, Algo.NVLS_TREE):
                ratio = layout.n_ranks / steps
                if coll in (Coll.ALLGATHER, Coll.REDUCESCATTER) and a != Algo.RING:
                    ratio = 1.0
            elif a == Algo.TREE:
                ratio = TREE_RATIO
            else:  # PAT: AllGather/ReduceScatter, used as is
                ratio = 1.0
            bw[a, p] = bus * ratio
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
