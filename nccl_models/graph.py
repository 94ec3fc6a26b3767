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

On an NVLink mesh without a switch (``nvlink_mesh``, the DGX-1 hybrid cube-mesh) the capacity bound is not
enough: a ring channel is a Hamiltonian cycle over the node's GPUs along direct NVLinks, and every directed
link of ``k`` NVLinks carries ``floor(k x NVLink bw / speed)`` channels (search.cc ``ncclTopoSearchRec`` with the
ring pattern: each channel subtracts its speed from the links it follows, one direction). :func:`mesh_rings` packs
such cycles at each ladder speed (:func:`_mesh_search`); on a DGX-1V the 8 doubled pairs form one Hamiltonian
cycle and the 8 single ones another, so 6 channels of 20 GB/s (each doubled cycle twice per direction, each single
one once) use every NVLink: 120 GB/s of ring busBw, 12 execution channels.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

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
    mesh_rings : tuple of tuple of int
        ``nvlink_mesh``: the ring graph's channels before duplication as cycles of local ranks along direct
        NVLinks (:func:`mesh_rings`, of the slowest node pattern); ``()`` otherwise or when the GPUs have no
        NVLink cycle (NCCL then rings over PCIe).
    """

    ring: Graph
    tree: Graph
    nvls: Graph | None
    intra_hw: Hw
    intra_Bps: float
    exec_channels: int
    nvls_exec_channels: int
    same_channels: bool
    mesh_rings: tuple = ()


def nccl_pcie_Bps(pcie_Bps: float) -> float:
    """PCIe bandwidth as NCCL's topology prices it, bytes/s (3/4 of nominal; see constants)."""
    return pcie_Bps * PCIE_NCCL_FRACTION


MESH_SEARCH_BUDGET = 20000
"""Most packing steps :func:`_mesh_search` tries per speed before it keeps the best found (a cost cap, like
NCCL's own search timeout, ``NCCL_SEARCH_TIMEOUT``; a DGX-1V needs a few dozen)."""


@lru_cache(maxsize=256)
def _cycles(links: tuple) -> tuple:
    """Directed Hamiltonian cycles from local rank 0 along direct links of ``links`` (ppn x ppn), widest first
    (most links on the cycle's narrowest hop), then lexicographic; on 2 ranks the one cycle ``0 -> 1 -> 0``.

    NCCL's search tries a GPU's neighbours by bandwidth, highest first, and replays the previous channel before
    looking for another (search.cc ``ncclTopoSearchNextGpuSort``, ``ncclTopoReplayGetGpu``), so it repeats the
    widest cycle while the links carry it [inferred from the source's structure; on a DGX-1V this gives the
    doubled cycle twice each way, then the single one each way]."""
    n = len(links)
    out = []

    def extend(path: list) -> None:  # depth-first, lowest rank first: lexicographic order
        if len(path) == n:
            if links[path[-1]][0] > 0:
                out.append(tuple(path))
            return
        for j in range(1, n):
            if j not in path and links[path[-1]][j] > 0:
                extend(path + [j])

    extend([0])
    return tuple(sorted(out, key=lambda c: (-min(links[c[i]][c[(i + 1) % n]] for i in range(n)), c)))


def _pack(cycles: tuple, cap: dict, limit: int) -> list:
    """Most cycles (repeats allowed, at most ``limit``) whose directed edges fit ``cap`` (edge -> channels); a
    depth-first search in cycle order, bounded by each rank's out-capacity and ``MESH_SEARCH_BUDGET`` steps."""
    n = len(cycles[0])
    edges = [[(c[i], c[(i + 1) % n]) for i in range(n)] for c in cycles]
    best: list = []
    chosen: list = []
    steps = 0

    def out_bound() -> int:
        return min(sum(cap.get((i, j), 0) for j in range(n)) for i in range(n))

    def rec(start: int) -> bool:
        nonlocal best, steps
        steps += 1
        if len(chosen) > len(best):
            best = list(chosen)
        if len(best) >= limit or steps > MESH_SEARCH_BUDGET:
            return True
        if len(chosen) + out_bound() <= len(best):
            return False
        for k in range(start, len(cycles)):
            if all(cap[e] > 0 for e in edges[k]):
                for e in edges[k]:
                    cap[e] -= 1
                chosen.append(k)
                done = rec(k)
                chosen.pop()
                for e in edges[k]:
                    cap[e] += 1
                if done:
                    return True
        return False

    rec(0)
    return [cycles[k] for k in best]


@lru_cache(maxsize=256)
def _mesh_search(links: tuple, link_Bps: float, ladder: tuple, ring_max: int) -> tuple[int, float, tuple]:
    """(channels, speed in bytes/s, rings) of NCCL's ring search on one node's NVLink mesh ``links`` (module
    docstring): at each ladder speed, highest first, the most Hamiltonian cycles the links carry; the speed
    maximising ``channels x speed`` wins (ties to the higher speed). (0, 0, ()) when the ranks have no NVLink
    cycle."""
    cycles = _cycles(links)
    if not cycles:
        return 0, 0.0, ()
    n = len(links)
    bound_Bps = min(sum(links[i]) for i in range(n)) * link_Bps  # a ring leaves every rank once
    best = (0, 0.0, ())
    for s in ladder:
        s_Bps = s * GB
        if min(ring_max, int(bound_Bps / s_Bps + 1e-9)) * s_Bps <= best[0] * best[1] * (1 + 1e-12):
            continue
        cap = {(i, j): int(links[i][j] * link_Bps / s_Bps + 1e-9) for i in range(n) for j in range(n) if links[i][j]}
        rings = _pack(cycles, cap, ring_max)
        if len(rings) * s_Bps > best[0] * best[1] * (1 + 1e-12):
            best = (len(rings), s_Bps, tuple(rings))
    return best


def mesh_rings(layout: CommLayout) -> tuple[int, float, tuple]:
    """NCCL's one-node ring search on an ``nvlink_mesh`` layout: (channels, per-channel speed in bytes/s, rings as
    cycles of local ranks) of the slowest of ``layout.mesh_links`` (channels x speed; the first on ties); (0, 0,
    ()) when some node's ranks have no NVLink cycle."""
    arch = arch_of(layout.compute_capability, layout.version)
    link_Bps = nvlink_link_Bps(layout.compute_capability, layout.version)
    ladder = speed_ladder_gbps(arch, "intra", layout.version)
    found = [_mesh_search(m, link_Bps, ladder, _ring_max_channels(layout)) for m in layout.mesh_links]
    return min(found, key=lambda f: f[0] * f[1])


def mesh_relays(links: np.ndarray) -> np.ndarray:
    """Relay of each pair of GPUs without a direct NVLink: NCCL's ``P2P/indirect`` over an ``NVB`` path (NVLink
    through one intermediate GPU, NCCL 2.12+ ``paths.cc``).

    Parameters
    ----------
    links : int64[g, g]
        NVLinks between local GPUs (:func:`flowsim.network.topology.nvlink_mesh_links`, or ``mesh_links``).

    Returns
    -------
    int64[g, g]
        Local index of the GPU that relays ``i -> j``: the one maximising ``min(links[i, m], links[m, j])``
        (lowest index on ties) [inferred: NCCL keeps the widest path it finds]; -1 where ``i == j``, the pair is
        linked or no GPU is linked to both.
    """
    g = links.shape[0]
    hop = np.minimum(links[:, :, None], links.T[None, :, :])  # [i, m, j]: links of the weaker hop via m
    best = np.argmax(hop, axis=1)
    ok = (np.take_along_axis(hop, best[:, None, :], axis=1)[:, 0, :] > 0) & (links == 0) & ~np.eye(g, dtype=bool)
    return np.where(ok, best, -1)


def _intra(layout: CommLayout) -> tuple[float, Hw]:
    ppn = layout.ranks_per_node
    if layout.scaleup_kind == "nvlink_mesh" and ppn > 1:
        n, s, _ = mesh_rings(layout)
        return (n * s, Hw.NVLINK) if n else (nccl_pcie_Bps(layout.pcie_Bps), Hw.PCI)
    if layout.scaleup_kind in ("nvswitch", "nvlink_mesh") or (layout.scaleup_kind == "nvlink_bridge" and ppn <= 2):
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
    if layout.n_nodes == 1 and layout.scaleup_kind == "nvlink_mesh" and mesh_rings(layout)[0]:
        return mesh_rings(layout)[:2]
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
    rings = mesh_rings(layout)[2] if layout.mesh_links else ()
    return Graphs(ring, tree, nvls, intra_hw, intra_Bps, exec_channels, nvls_exec, same, rings)
