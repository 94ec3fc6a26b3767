"""NCCL's topology graphs for a communicator: channels and per-channel bandwidth per algorithm.

NCCL searches, per algorithm pattern, for the largest number of channels at the highest speed of a
fixed ladder that the links can carry (``src/graph/search.cc`` ``ncclTopoCompute``), then duplicates
channels (``ncclTopoDupChannels``). We do not rebuild NCCL's topology; we emulate the search on the
bottlenecks that decide it:

* one node: every channel crosses each GPU's scale-up port once, so ``n * speed <= intra bandwidth``;
* several nodes: every ring/tree channel enters and leaves each node through one NIC (PCIe to the NIC
  with GPUDirect), so a NIC carries ``floor(min(NIC, PCIe) / speed)`` channels; inside the node the
  channel crosses ``ppn - 1`` of the ``ppn`` GPUs' scale-up ports.

The speed maximising ``channels * speed`` wins (ties go to the higher speed, which the search tries first).
This reproduces the graphs NCCL logs on DGX/HGX systems (docs/NCCL.md, research notes section 1.8):
A100 6x40 -> 12x20, H100 6x60 -> 12x30, B200 8x90 -> 16x45, H100 multi-node 8x48, A100 multi-node 8x24.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from flowsim.nccl_models.constants import (
    DUP_MIN_BW_INTRA_GBPS, DUP_SM90_MAX_BW_INTRA_GBPS, DUP_SM90_MAX_CHANNELS, NVLS_CHANNELS_SM90,
    NVLS_CHANNELS_SM100_MULTI_NODE, NVLS_CHANNELS_SM100_SINGLE_NODE, NVLS_MAX_HEADS, PCIE_NCCL_FRACTION,
    SM90_MULTINODE_EXTRA_DUP_BW_GBPS, SM90_MULTINODE_EXTRA_DUP_MAX_CHANNELS, Arch,
    Hw, arch_of, max_channels, nvlink_link_Bps, speed_ladder_gbps,
)
from flowsim.nccl_models.layout import CommLayout
from flowsim.units import GB


@dataclass(frozen=True)
class Graph:
    """One NCCL topology graph (the search result for one pattern).

    Attributes
    ----------
    n_channels : int
        Graph channels after duplication (``graph->nChannels``, the count the cost model uses).
    bw_intra_Bps : float
        Per-channel bandwidth inside a node, bytes/s (``graph->bwIntra``).
    bw_inter_Bps : float
        Per-channel bandwidth across nodes, bytes/s (``graph->bwInter``).
    """

    n_channels: int
    bw_intra_Bps: float
    bw_inter_Bps: float


@dataclass(frozen=True)
class Graphs:
    """The graphs of one communicator.

    Attributes
    ----------
    ring, tree : Graph
        Ring and Tree graphs.
    nvls : Graph or None
        NVLS graph (heads as channels); None when the fabric has no NVLink SHARP.
    intra_hw : Hw
        ``Hw.NVLINK`` when the intra-node path is NVLink/xGMI, else ``Hw.PCI``.
    intra_Bps : float
        Scale-up bandwidth of one GPU as NCCL counts it, bytes/s (links x NCCL per-link bandwidth).
    exec_channels : int
        Channels NCCL runs collectives on (``comm->nChannels``, after ``ncclTopoPostset``).
    nvls_exec_channels : int
        Channels NVLS runs on (16 on Hopper; 24 / 32 on Blackwell for one / several nodes; never more
        than ``exec_channels`` on several nodes); 0 without NVLS.
    same_channels : bool
        All ring channels visit the GPUs in the same order (``graph->sameChannels``); true on one
        NVSwitch node [inferred: the search finds the same ring in every channel there].
    """

    ring: Graph
    tree: Graph
    nvls: Graph | None
    intra_hw: Hw
    intra_Bps: float
    exec_channels: int
    nvls_exec_channels: int
    same_channels: bool


def nccl_pcie_Bps(pcie_Bps: float) -> float:
    """PCIe bandwidth as NCCL's topology prices it, bytes/s (3/4 of nominal; see constants)."""
    return pcie_Bps * PCIE_NCCL_FRACTION


def _intra(layout: CommLayout) -> tuple[float, Hw]:
    ppn = layout.ranks_per_node
    if layout.scaleup_kind == "nvswitch" or (layout.scaleup_kind == "nvlink_bridge" and ppn <= 2):
        return layout.scaleup_links * nvlink_link_Bps(layout.compute_capability, layout.version), Hw.NVLINK
    if layout.scaleup_kind == "xgmi_mesh":
        return layout.scaleup_Bps, Hw.NVLINK
    return nccl_pcie_Bps(layout.pcie_Bps), Hw.PCI


def _best(candidates):
    """(channels, speed) maximising channels * speed; the first (highest speed) wins ties."""
    best = (0, 0.0)
    for n, s in candidates:
        if n * s > best[0] * best[1] * (1 + 1e-12):
            best = (n, s)
    return best


def _ring_max_channels(layout: CommLayout) -> int:
    """Most channels a ring graph may have: ``MAXCHANNELS / 2`` of the release (search.cc)."""
    return max_channels(layout.version) // 2


def _dup(n_channels: int, bw_intra: float, bw_inter: float, layout: CommLayout) -> tuple[int, float, float]:
    """``ncclTopoDupChannels``: double channels, halve per-channel bandwidth, unless excluded."""
    gb = bw_intra / GB
    if gb < DUP_MIN_BW_INTRA_GBPS or (layout.compute_capability > 80 and gb < DUP_SM90_MAX_BW_INTRA_GBPS
                                      and n_channels > DUP_SM90_MAX_CHANNELS):
        return n_channels, bw_intra, bw_inter
    return min(2 * n_channels, _ring_max_channels(layout)), bw_intra / 2, bw_inter / 2


def _ring_search(layout: CommLayout, arch: Arch, intra_Bps: float) -> tuple[int, float]:
    """Graph channels and per-channel speed (bytes/s) of the ring search, before duplication."""
    ppn = layout.ranks_per_node
    ring_max = _ring_max_channels(layout)
    if layout.n_nodes == 1:
        return _best((min(int(intra_Bps // (s * GB)), ring_max), s * GB)
                     for s in speed_ladder_gbps(arch, "intra", layout.version))
    path_Bps = min(layout.nic_Bps, nccl_pcie_Bps(layout.pcie_Bps))
    cands = []
    for s in speed_ladder_gbps(arch, "inter", layout.version):
        s_Bps = s * GB
        n = layout.nics_per_node * int(path_Bps // s_Bps)
        if ppn > 1:  # a channel crosses the scale-up ports of ppn - 1 of the ppn GPUs
            n = min(n, int(intra_Bps // (s_Bps * (ppn - 1) / ppn)))
        cands.append((min(n, ring_max), s_Bps))
    return _best(cands)


def _smallest(per_node: list) -> Graphs:
    """The graphs NCCL keeps from several nodes' searches: the minimum channel count and speeds of each."""
    def least(graphs):
        graphs = [g for g in graphs if g is not None]
        if len(graphs) < len(per_node):
            return None
        return Graph(min(g.n_channels for g in graphs), min(g.bw_intra_Bps for g in graphs),
                     min(g.bw_inter_Bps for g in graphs))

    first = per_node[0]
    return Graphs(least([g.ring for g in per_node]), least([g.tree for g in per_node]),
                  least([g.nvls for g in per_node]), first.intra_hw, min(g.intra_Bps for g in per_node),
                  min(g.exec_channels for g in per_node), min(g.nvls_exec_channels for g in per_node),
                  first.same_channels)


def _top_speed(ladder, limit_Bps: float) -> float:
    """Highest ladder speed (bytes/s) not above ``limit_Bps``; the lowest rung if none fits."""
    for s in ladder:
        if s * GB <= limit_Bps:
            return s * GB
    return ladder[-1] * GB


@lru_cache(maxsize=4096)
def graphs_of(layout: CommLayout) -> Graphs:
    """Emulate NCCL's graph search for ``layout``.

    Parameters
    ----------
    layout : CommLayout
        The communicator.

    Returns
    -------
    Graphs
        Ring, Tree and NVLS graphs, intra-node hardware class and execution channels.

    Notes
    -----
    NCCL 2.30.7 ``src/graph/search.cc`` (``ncclTopoCompute``, ``ncclTopoDupChannels``) and
    ``src/graph/connect.cc`` (``ncclTopoPostset``); older releases differ in the NVLink bandwidth, the
    SM90/SM100 speed ladders and ``MAXCHANNELS`` (:mod:`flowsim.nccl_models.versions`). The NVLS graph has
    one channel per head: every GPU of the node on one node, one head per NIC on several nodes, at most 16
    [inferred from NCCL logs "NVLS comm ... nHeads 8" and the 480 GB/s H100 busbw].
    ``NCCL_MAX_CTAS`` (``layout.max_ctas``) caps the graph and execution channels, ``NCCL_MIN_CTAS`` raises the
    execution channels (NCCL 2.30.7 ``init.cc`` / ``connect.cc`` honour them after ``ncclTopoPostset``,
    duplicating channels for the minimum) [inferred: NCCL's cost model then sees the capped graph].
    Uneven nodes (``layout.node_ranks``): every node searches its own graph and NCCL keeps the smallest channel
    count and speeds of all (``init.cc`` ``initTransportsRank``: the all-gathered graph info is reduced with
    ``min`` over the nodes), so each distinct node size is searched as an even layout of that size.
    """
    if layout.uneven:
        return _smallest([graphs_of(replace(layout, n_ranks=m * layout.n_nodes, node_ranks=()))
                          for m in sorted(set(layout.node_ranks))])
    cc = layout.compute_capability
    arch = arch_of(cc, layout.version)
    intra_ladder = speed_ladder_gbps(arch, "intra", layout.version)
    ppn = layout.ranks_per_node
    intra_Bps, intra_hw = _intra(layout)
    n, s = _ring_search(layout, arch, intra_Bps)
    n = max(n, 1)
    ring = Graph(*_dup(n, s, s, layout))
    if layout.n_nodes == 1:
        tree = ring
    else:
        # Pass 2 of the search raises bwIntra of trees up to 2x bwInter while the intra chain fits.
        fit_Bps = intra_Bps / (n * (ppn - 1) / ppn) if ppn > 1 else math.inf
        bw_intra = max(s, _top_speed(intra_ladder, min(2 * s, fit_Bps)))
        tree = Graph(*_dup(n, bw_intra, s, layout))
    nvls = None
    if layout.nvls and layout.scaleup_kind == "nvswitch" and cc >= 90:
        heads = ppn if layout.n_nodes == 1 else min(ppn, layout.nics_per_node)
        bw_intra = _top_speed(intra_ladder, intra_Bps)
        bw_inter = (bw_intra if layout.n_nodes == 1 else
                    _top_speed(speed_ladder_gbps(arch, "inter", layout.version),
                               min(layout.nic_Bps, nccl_pcie_Bps(layout.pcie_Bps))))
        nvls = Graph(min(heads, NVLS_MAX_HEADS), bw_intra, bw_inter)
    most = max_channels(layout.version)
    exec_channels = min(2 * ring.n_channels, most)
    if (cc >= 90 and layout.n_nodes > 1 and ring.bw_intra_Bps > SM90_MULTINODE_EXTRA_DUP_BW_GBPS * GB
            and exec_channels < SM90_MULTINODE_EXTRA_DUP_MAX_CHANNELS):
        exec_channels = min(2 * exec_channels, most)
    nvls_exec = 0
    if nvls is not None:
        if arch == Arch.BLACKWELL:
            nvls_exec = NVLS_CHANNELS_SM100_SINGLE_NODE if layout.n_nodes == 1 else NVLS_CHANNELS_SM100_MULTI_NODE
        else:
            nvls_exec = NVLS_CHANNELS_SM90
        if layout.n_nodes > 1:
            nvls_exec = min(nvls_exec, exec_channels)
    if layout.max_ctas:  # NCCL_MAX_CTAS caps every channel count (graph channels carry the bandwidth)
        ring, tree = (replace(g, n_channels=min(g.n_channels, layout.max_ctas)) for g in (ring, tree))
        exec_channels = min(exec_channels, layout.max_ctas)
        nvls_exec = min(nvls_exec, layout.max_ctas)
    exec_channels = max(exec_channels, layout.min_ctas)  # NCCL_MIN_CTAS: channels duplicated, no faster
    same = layout.n_nodes == 1 and layout.scaleup_kind == "nvswitch"
    return Graphs(ring, tree, nvls, intra_hw, intra_Bps, exec_channels, nvls_exec, same)
