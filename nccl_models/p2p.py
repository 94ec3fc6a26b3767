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

On an NVLink mesh (``nvlink_mesh``: the DGX-1) a pair of GPUs uses its own direct NVLinks, or the two hops
through a relay GPU (:func:`flowsim.nccl_models.graph.mesh_relays`), or PCIe when neither exists; every pair
sending at once, the most loaded link decides: ``bytes per pair x max over links (pairs on it / its bandwidth)``
at NCCL's per-link NVLink bandwidth, on the slowest of the node patterns (:func:`_mesh_s_per_byte`).

Latency: NCCL has no p2p entry; we use the Ring/Simple base latency plus one Ring/Simple hop of the
slowest tier (NCCL 2.30.7 tuning.cc ``baseLat``, ``hwLat``), documented as an approximation.
"""
from __future__ import annotations

import numpy as np

from flowsim.nccl_models.constants import Algo, Hw, Proto, nvlink_link_Bps, tuning_tables
from flowsim.nccl_models.execution import ALLTOALL_NET_EFFICIENCY, SENDRECV_NET_EFFICIENCY, bw_efficiency
from flowsim.nccl_models.graph import graphs_of, mesh_relays, nccl_pcie_Bps
from flowsim.nccl_models.layout import CommLayout


def p2p_latency_s(layout: CommLayout) -> float:
    """Ring/Simple base latency + one hop of the slowest tier, seconds (see module docstring)."""
    hw = Hw.NET if layout.n_nodes > 1 else graphs_of(layout).intra_hw
    tables = tuning_tables(layout.version)
    return tables.base_lat_s[Algo.RING, Proto.SIMPLE] + tables.hw_lat_s[hw, Algo.RING, Proto.SIMPLE]


def _intra_Bps(layout: CommLayout) -> float:
    eff = bw_efficiency(layout) if layout.n_nodes == 1 else 1.0
    return graphs_of(layout).intra_Bps * eff


def _mesh_s_per_byte(layout: CommLayout, pairs) -> float:
    """Seconds per byte of each pair when the ``pairs`` (local ranks ``(src, dst)``) of every node send at once
    over its NVLink mesh (module docstring): the most loaded link of the slowest node pattern."""
    link_Bps = nvlink_link_Bps(layout.compute_capability, layout.version)
    pcie_Bps = nccl_pcie_Bps(layout.pcie_Bps)
    worst = 0.0
    for links in layout.mesh_links:
        mesh = np.asarray(links)
        relay = mesh_relays(mesh)
        load, cap = {}, {}
        for a, b in pairs:
            m = relay[a, b]
            if mesh[a, b]:
                hops = [((a, b), mesh[a, b] * link_Bps)]
            elif m >= 0:
                hops = [((a, m), mesh[a, m] * link_Bps), ((m, b), mesh[m, b] * link_Bps)]
            else:  # through the host: the GPUs' PCIe links
                hops = [(("out", a), pcie_Bps), (("in", b), pcie_Bps)]
            for edge, bw in hops:
                load[edge] = load.get(edge, 0) + 1
                cap[edge] = bw
        worst = max(worst, max(load[e] / cap[e] for e in load))
    return worst


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
    if layout.mesh_links:  # every ordered pair of a node's ranks moves S / n
        t_intra = size_bytes / n * _mesh_s_per_byte(layout, [(a, b) for a in range(ppn) for b in range(ppn) if a != b])
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
    elif layout.mesh_links:  # rank r sends to r + 1 (mod ppn) over its NVLinks
        bw = 1.0 / _mesh_s_per_byte(layout, [(a, (a + 1) % layout.ranks_per_node)
                                              for a in range(layout.ranks_per_node)])
    else:
        bw = _intra_Bps(layout)
    return p2p_latency_s(layout) + size_bytes / bw
