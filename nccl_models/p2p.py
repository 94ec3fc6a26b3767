"""AllToAll and Send/Recv: point-to-point operations, which NCCL's tuning table does not price.

NCCL runs both as grouped ``ncclSend``/``ncclRecv`` calls over p2p channels; there is no (algo, proto)
choice and no cost model upstream. We price them as transfers over the slowest tier they cross:

* **AllToAll** (nccl-tests ``alltoall_perf``; ``size_bytes`` = one rank's send buffer, S/n to every rank):
  each rank sends ``(ppn - 1) / n * S`` over the scale-up fabric and ``(n - ppn) / n * S`` over the
  network, where the node's NICs are shared by its ``ppn`` ranks (rail-aligned, PXN). The two parts run
  concurrently: ``time = lat + max(intra_bytes / intra_bw, inter_bytes / (net_bw * ALLTOALL_NET_EFFICIENCY))``.
* **Send/Recv** (nccl-tests ``sendrecv_perf``: every rank sends S to the next rank and receives S from
  the previous): the slowest pair decides; across nodes a pair uses one NIC at
  ``SENDRECV_NET_EFFICIENCY``, inside a node one GPU's scale-up bandwidth.

Latency: NCCL has no p2p entry; we use the Ring/Simple base latency plus one Ring/Simple hop of the
slowest tier (NCCL 2.30.7 tuning.cc ``baseLat``, ``hwLat``), documented as an approximation.
"""
from __future__ import annotations

from flowsim.nccl_models.constants import Algo, Hw, Proto, tuning_tables
from flowsim.nccl_models.execution import ALLTOALL_NET_EFFICIENCY, SENDRECV_NET_EFFICIENCY, bw_efficiency
from flowsim.nccl_models.graph import graphs_of
from flowsim.nccl_models.layout import CommLayout


def p2p_latency_s(layout: CommLayout) -> float:
    """Ring/Simple base latency + one hop of the slowest tier, seconds (see module docstring)."""
    hw = Hw.NET if layout.n_nodes > 1 else graphs_of(layout).intra_hw
    tables = tuning_tables(layout.version)
    return tables.base_lat_s[Algo.RING, Proto.SIMPLE] + tables.hw_lat_s[hw, Algo.RING, Proto.SIMPLE]


def _intra_Bps(layout: CommLayout) -> float:
    eff = bw_efficiency(layout) if layout.n_nodes == 1 else 1.0
    return graphs_of(layout).intra_Bps * eff


def alltoall_time_s(layout: CommLayout, size_bytes: float) -> float:
    """AllToAll time, seconds.

    Parameters
    ----------
    layout : CommLayout
        The communicator, >= 2 ranks.
    size_bytes : float
        One rank's send buffer (nccl-tests size: S/n goes to every rank), bytes, > 0.
    """
    n, ppn = layout.n_ranks, layout.ranks_per_node
    t_intra = (ppn - 1) / n * size_bytes / _intra_Bps(layout) if ppn > 1 else 0.0
    t_inter = 0.0
    if layout.n_nodes > 1:
        net_Bps = layout.nics_per_node * layout.nic_Bps * ALLTOALL_NET_EFFICIENCY / ppn
        t_inter = (n - ppn) / n * size_bytes / net_Bps
    return p2p_latency_s(layout) + max(t_intra, t_inter)


def sendrecv_time_s(layout: CommLayout, size_bytes: float) -> float:
    """Time for every rank to send a buffer to the next rank (nccl-tests sendrecv), seconds.

    Parameters
    ----------
    layout : CommLayout
        The communicator, >= 2 ranks.
    size_bytes : float
        Bytes each rank sends, > 0.
    """
    if layout.n_nodes > 1:
        bw = min(layout.nic_Bps, layout.nics_per_node * layout.nic_Bps / layout.ranks_per_node)
        bw *= SENDRECV_NET_EFFICIENCY
    else:
        bw = _intra_Bps(layout)
    return p2p_latency_s(layout) + size_bytes / bw
