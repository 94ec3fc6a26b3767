"""The cluster as flat arrays: nodes (GPUs, NICs, switches) and directed links with capacity and latency.

Scale-up (inside a scale-up domain), by the GPU's ``scaleup_kind``:

* ``nvswitch``: one logical NVSwitch node per NVLink domain (a DGX/HGX node, or a whole GB200 NVL72 rack
  spanning 18 hosts); every GPU has an up-link and a down-link of ``scaleup_Bps`` (the per-GPU NVLink
  bandwidth per direction; the switch fabric itself is non-blocking).
* ``xgmi_mesh``: a direct link between every ordered pair of GPUs in the node, each
  ``scaleup_Bps / scaleup_links`` (MI300X: 7 links of 64 GB/s, AMD Instinct MI300X data sheet).
* ``nvlink_bridge``: GPUs ``2k`` and ``2k + 1`` joined by a bridge of ``scaleup_Bps``; other pairs go over PCIe.
* ``nvlink_mesh``: the DGX-1 hybrid cube-mesh (:func:`nvlink_mesh_links`): a direct link of ``k`` NVLinks
  (``k x scaleup_Bps / scaleup_links``) between the pairs the board wires, none between the others; a GPU
  reaches a peer without a link through one relay GPU linked to both (NCCL's ``P2P/indirect`` over an ``NVB``
  path, NCCL 2.12+ ``paths.cc``), the relay with the most links on its weaker hop (lowest index on ties,
  :func:`flowsim.nccl_models.graph.mesh_relays`), ``relay_gpu``. A host PCIe node carries GPU <-> host traffic
  as for ``pcie``.
* ``pcie``: GPU-to-GPU through a host PCIe node (one per host), ``pcie_Bps`` each way per GPU.

GPU to NIC: a PCIe link of ``pcie_Bps`` each way between a GPU and each NIC closest to it
(:func:`nic_span`).

Scale-out: ``nics_per_node`` rails; NIC ``r`` of every host is on rail ``r``. Leaves have
``switch_radix // 2`` down-ports and ``switch_radix // 2`` up-ports, one to each spine of their pod; each
up-port carries ``nic rate / oversubscription`` (the oversubscription ratio reduces leaf up-link capacity).

* ``rail_optimized``: leaf ``g * R + r`` connects NIC ``r`` of the hosts of group ``g``; all leaves share
  one spine layer, so cross-rail traffic can cross the spines.
* ``rail_only``: the same leaves, but each rail has its own spines (rails are disjoint); traffic between
  rails must first cross the scale-up fabric (PXN).
* ``fat_tree``: NICs fill leaves host by host (not by rail); one spine layer.

A plane (the whole fabric, or one rail for ``rail_only``) with one leaf has no spine; with up to
``switch_radix`` leaves it is two-tier (leaf, spine); beyond, three-tier: pods of ``switch_radix // 2``
leaves with their own ``switch_radix // 2`` spines, spine ``s`` of every pod linked to the
``switch_radix // 2`` cores of core group ``s`` (at most ``switch_radix`` pods: Al-Fares et al., "A
scalable, commodity data center network architecture", SIGCOMM 2008, sec. 3). With ``ecmp='ideal'`` the
parallel up-links of a leaf (and of a pod's spines) are one bundle of the same total capacity into one
logical spine (core) node, so routing cannot collide.

Latency: every scale-out link carries ``nic_latency_s`` (one network hop); scale-up and PCIe links carry 0,
their latency belongs to the per-transfer latency of the caller (NCCL plans give it per step).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from flowsim.config.cluster import ClusterConfig
from flowsim.errors import ConfigError
from flowsim.nccl_models.graph import mesh_relays
from flowsim.units import GB, gbps_to_Bps

__all__ = ["NodeKind", "LinkKind", "Topology", "TopologySummary", "TierSummary", "build_topology",
           "nvlink_mesh_links"]


class NodeKind(enum.IntEnum):
    """Kind of a node of the topology graph."""

    GPU = 0
    NIC = 1
    NVSWITCH = 2
    HOST = 3  # host PCIe root complex / switch
    LEAF = 4
    SPINE = 5
    CORE = 6


class LinkKind(enum.IntEnum):
    """Kind of a directed link (the tier it belongs to)."""

    NVLINK = 0  # GPU <-> NVSwitch, GPU <-> GPU (xGMI, NVLink bridge)
    PCIE = 1  # GPU <-> host, GPU <-> NIC
    NIC_LEAF = 2
    LEAF_NIC = 3
    LEAF_SPINE = 4
    SPINE_LEAF = 5
    SPINE_CORE = 6
    CORE_SPINE = 7


_TIER_NAMES = {LinkKind.NVLINK: "scale-up (NVLink/xGMI)", LinkKind.PCIE: "PCIe (GPU-NIC, GPU-host)",
               LinkKind.NIC_LEAF: "NIC -> leaf", LinkKind.LEAF_NIC: "leaf -> NIC",
               LinkKind.LEAF_SPINE: "leaf -> spine", LinkKind.SPINE_LEAF: "spine -> leaf",
               LinkKind.SPINE_CORE: "spine -> core", LinkKind.CORE_SPINE: "core -> spine"}


@dataclass(frozen=True, eq=False)
class Topology:
    """A cluster as flat arrays. Ids are dense: GPUs ``0..num_gpus-1`` are nodes ``0..num_gpus-1``.

    Attributes
    ----------
    cluster : ClusterConfig
        The description it was built from.
    scaleup_kind : str
        ``nvswitch``, ``xgmi_mesh``, ``nvlink_mesh``, ``nvlink_bridge`` or ``pcie``.
    node_kind : int8[n_nodes]
        :class:`NodeKind` of each node.
    link_src, link_dst : int64[n_links]
        End nodes of each directed link.
    capacity_Bps : float64[n_links]
        Capacity of each link, bytes/s, > 0.
    latency_s : float64[n_links]
        Latency of each link, seconds, >= 0.
    link_kind : int8[n_links]
        :class:`LinkKind` of each link.
    gpu_domain : int64[num_gpus]
        Scale-up domain of each GPU.
    gpu_up_link, gpu_down_link : int64[num_gpus]
        GPU -> NVSwitch/host and NVSwitch/host -> GPU links; -1 where there is none (``xgmi_mesh``).
    peer_link : int64[num_gpus, gpus_per_node]
        Direct GPU -> GPU link to the peer with that local index (``xgmi_mesh``, ``nvlink_mesh``,
        ``nvlink_bridge``); -1 if none.
    gpu_nic : int64[num_gpus, nics_per_gpu]
        NIC ids (0-based among NICs) each GPU uses.
    gpu_nic_link, nic_gpu_link : int64[num_gpus, nics_per_gpu]
        GPU -> NIC and NIC -> GPU links.
    nic_rail, nic_leaf : int64[n_nics]
        Rail (local index on the host) and leaf (0-based among leaves) of each NIC.
    nic_up_link, nic_down_link : int64[n_nics]
        NIC -> leaf and leaf -> NIC links.
    leaf_plane : int64[n_leaves]
        Plane of each leaf: 0 for one shared fabric, the rail for ``rail_only``.
    leaf_pod : int64[n_leaves]
        Pod of each leaf (global; a two-tier plane is one pod).
    leaf_up_link, leaf_down_link : int64[n_leaves, spines_per_pod]
        Leaf -> spine ``s`` of its pod and back; empty second axis when planes have one leaf.
    spine_up_link, spine_down_link : int64[n_spines, cores_per_group]
        Spine -> core ``c`` of its core group and back (three-tier only; otherwise empty).
    n_tiers : int
        Switch tiers: 1 (one leaf per plane), 2 or 3.
    relay_gpu : int64[num_gpus, gpus_per_node]
        ``nvlink_mesh``: local index of the GPU that relays traffic to the peer with that local index when the
        two have no direct link, -1 otherwise; empty for the other kinds.
    """

    cluster: ClusterConfig
    scaleup_kind: str
    node_kind: np.ndarray
    link_src: np.ndarray
    link_dst: np.ndarray
    capacity_Bps: np.ndarray
    latency_s: np.ndarray
    link_kind: np.ndarray
    gpu_domain: np.ndarray
    gpu_up_link: np.ndarray
    gpu_down_link: np.ndarray
    peer_link: np.ndarray
    gpu_nic: np.ndarray
    gpu_nic_link: np.ndarray
    nic_gpu_link: np.ndarray
    nic_rail: np.ndarray
    nic_leaf: np.ndarray
    nic_up_link: np.ndarray
    nic_down_link: np.ndarray
    leaf_plane: np.ndarray
    leaf_pod: np.ndarray
    leaf_up_link: np.ndarray
    leaf_down_link: np.ndarray
    spine_up_link: np.ndarray
    spine_down_link: np.ndarray
    n_tiers: int
    relay_gpu: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))

    @property
    def num_gpus(self) -> int:
        """GPUs in the topology."""
        return int(self.gpu_domain.size)

    @property
    def n_links(self) -> int:
        """Directed links."""
        return int(self.capacity_Bps.size)

    def __repr__(self) -> str:
        return (f"Topology({self.cluster.name}: {self.num_gpus} GPUs, {self.n_links} links, "
                f"{self.n_tiers}-tier {self.cluster.network})")

    def summary(self) -> "TopologySummary":
        """Counts, per-tier bandwidth, bisection bandwidth and oversubscription (see :class:`TopologySummary`)."""
        return _summarize(self)


@dataclass(frozen=True)
class TierSummary:
    """Links of one kind.

    Attributes
    ----------
    tier : str
        Link kind, e.g. ``leaf -> spine``.
    links : int
        Number of directed links.
    link_Bps : float
        Capacity of one link, bytes/s (the largest, if they differ).
    total_Bps : float
        Sum of the capacities, bytes/s.
    """

    tier: str
    links: int
    link_Bps: float
    total_Bps: float


@dataclass(frozen=True)
class TopologySummary:
    """What ``flowsim topo`` prints.

    Attributes
    ----------
    name, network, ecmp, scaleup_kind : str
        Cluster preset name, scale-out network, ECMP mode, scale-up kind.
    gpus, nodes, nics, nvswitches, leaves, spines, cores, links : int
        Counts (NVSwitches are logical: one per NVLink domain).
    scaleup_domain_gpus : int
        GPUs per scale-up domain.
    switch_tiers : int
        Scale-out switch tiers (1, 2 or 3).
    nic_Bps : float
        Line rate of one NIC, bytes/s.
    bisection_Bps : float
        Scale-out bandwidth, one direction, across the worst cut that splits the hosts into two halves:
        per plane, the smallest of half the NIC bandwidth, half the leaf up-link bandwidth and half the
        spine up-link bandwidth, summed over planes (bytes/s).
    oversubscription : float
        The configured leaf down/up bandwidth ratio.
    leaf_oversubscription : float
        The ratio as built: NIC bandwidth attached to the fullest leaf / its up-link bandwidth (NaN with
        no spine layer).
    tiers : tuple[TierSummary, ...]
        One entry per link kind present.
    """

    name: str
    network: str
    ecmp: str
    scaleup_kind: str
    gpus: int
    nodes: int
    nics: int
    nvswitches: int
    leaves: int
    spines: int
    cores: int
    links: int
    scaleup_domain_gpus: int
    switch_tiers: int
    nic_Bps: float
    bisection_Bps: float
    oversubscription: float
    leaf_oversubscription: float
    tiers: tuple

    def to_dict(self) -> dict:
        """Plain mapping (what ``flowsim topo --json`` prints); units in the key names."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "tiers"}
        d["tiers"] = [t.__dict__.copy() for t in self.tiers]
        return d


class _Graph:
    """Accumulates nodes and links while building (arrays appended per call)."""

    def __init__(self):
        self.kinds: list[np.ndarray] = []
        self.n_nodes = 0
        self.parts: list[tuple] = []
        self.n_links = 0

    def nodes(self, kind: NodeKind, count: int) -> np.ndarray:
        ids = np.arange(self.n_nodes, self.n_nodes + count, dtype=np.int64)
        self.kinds.append(np.full(count, int(kind), dtype=np.int8))
        self.n_nodes += count
        return ids

    def links(self, src, dst, capacity_Bps: float, latency_s: float, kind: LinkKind) -> np.ndarray:
        src, dst = np.broadcast_arrays(np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64))
        n = src.size
        ids = np.arange(self.n_links, self.n_links + n, dtype=np.int64).reshape(src.shape)
        self.parts.append((src.ravel(), dst.ravel(), np.full(n, capacity_Bps), np.full(n, latency_s),
                           np.full(n, int(kind), dtype=np.int8)))
        self.n_links += n
        return ids

    def arrays(self):
        cat = [np.concatenate([p[i] for p in self.parts]) if self.parts else np.zeros(0) for i in range(5)]
        return np.concatenate(self.kinds), cat[0].astype(np.int64), cat[1].astype(np.int64), cat[2], cat[3], \
            cat[4].astype(np.int8)


def nic_span(local_gpu, gpus_per_node: int, nics_per_node: int):
    """(first NIC, number of NICs) closest to a host's local GPU: the one rule of which GPU uses which NIC.

    NICs are numbered per host like GPUs. With ``nics_per_node == gpus_per_node`` NIC ``i`` is the closest
    NIC of GPU ``i``. With fewer NICs (``k`` per host, ``g`` GPUs), NIC ``i`` serves the ``g / k``
    consecutive GPUs ``[i * g / k, (i + 1) * g / k)``; with more, GPU ``j`` owns the ``k / g`` NICs
    ``[j * k / g, (j + 1) * k / g)``.

    Parameters
    ----------
    local_gpu : int or int64 array
        GPU index on its host, in ``[0, gpus_per_node)``.
    gpus_per_node, nics_per_node : int
        GPUs and NICs per host.

    Returns
    -------
    (first, count)
        Index of the first closest NIC on the same host (same shape as ``local_gpu``) and how many
        consecutive NICs each GPU owns (an int).
    """
    if nics_per_node >= gpus_per_node:
        per = nics_per_node // gpus_per_node
        return local_gpu * per, per
    return local_gpu * nics_per_node // gpus_per_node, 1


# NVLinks between the 8 GPUs of a DGX-1 with V100 (hybrid cube-mesh; 6 NVLink2 links per GPU, 24 in all): two
# fully connected quads (GPUs 0-3, 4-7) and the links i <-> i + 4, with 8 of the 16 GPU pairs doubled. NVIDIA, "NVIDIA
# DGX-1 With Tesla V100 System Architecture", WP-08437-002_v01 (2017), the hybrid cube-mesh figure; the link counts
# per pair as `nvidia-smi topo -m` prints them on a DGX-1V (NV1 / NV2) and as Li et al., "Evaluating Modern GPU
# Interconnect: PCIe, NVLink, NV-SLI, NVSwitch and GPUDirect" (IEEE TPDS 2020, arXiv:1903.04611) draw the V100
# DGX-1. The same board with P100 (4 NVLink1 links per GPU) has one link on each of the 16 pairs (NVIDIA, "NVIDIA
# DGX-1 System Architecture" white paper, 2017). An AWS p3.16xlarge is this board, a p3.8xlarge its first quad.
_DGX1V_NVLINKS = np.array([
    [0, 1, 1, 2, 2, 0, 0, 0],
    [1, 0, 2, 1, 0, 2, 0, 0],
    [1, 2, 0, 2, 0, 0, 1, 0],
    [2, 1, 2, 0, 0, 0, 0, 1],
    [2, 0, 0, 0, 0, 1, 1, 2],
    [0, 2, 0, 0, 1, 0, 2, 1],
    [0, 0, 1, 0, 1, 2, 0, 2],
    [0, 0, 0, 1, 2, 1, 2, 0],
], dtype=np.int64)
_MESH_LINKS = {6: _DGX1V_NVLINKS, 4: (_DGX1V_NVLINKS > 0).astype(np.int64)}  # scaleup_links -> board


def nvlink_mesh_links(gpus_per_node: int, scaleup_links: int) -> np.ndarray:
    """NVLinks between each pair of a host's GPUs on the DGX-1 hybrid cube-mesh (``nvlink_mesh``).

    Parameters
    ----------
    gpus_per_node : int
        GPUs per host: 8 (a DGX-1), or 4 or 2 (the board's first quad or pair).
    scaleup_links : int
        NVLink links per GPU: 6 (V100, NVLink2: the DGX-1V wiring) or 4 (P100, NVLink1: one link per pair).

    Returns
    -------
    int64[gpus_per_node, gpus_per_node]
        Links between local GPUs ``i`` and ``j`` (symmetric, 0 on the diagonal and where there is none).

    Raises
    ------
    ConfigError
        Another GPU count or link count (no other NVLink mesh board is modelled).
    """
    if scaleup_links not in _MESH_LINKS:
        raise ConfigError("scaleup_links", "an nvlink_mesh (DGX-1 hybrid cube-mesh) GPU has 6 (V100) or 4 (P100) "
                          "NVLinks", scaleup_links)
    if gpus_per_node not in (2, 4, 8):
        raise ConfigError("gpus_per_node", "an nvlink_mesh host is a DGX-1 hybrid cube-mesh: 8 GPUs (or its first "
                          "4 or 2)", gpus_per_node)
    return _MESH_LINKS[scaleup_links][:gpus_per_node, :gpus_per_node].copy()


def _check(cluster: ClusterConfig, gpu) -> None:
    """Rules of a buildable topology beyond ClusterConfig.validate(); raise ConfigError."""
    cluster.validate()
    gpn, nics = cluster.gpus_per_node, cluster.nics_per_node
    if gpu.scaleup_kind not in ("nvswitch", "xgmi_mesh", "nvlink_mesh", "nvlink_bridge", "pcie"):
        raise ConfigError("scaleup_kind", "must be nvswitch, xgmi_mesh, nvlink_mesh, nvlink_bridge or pcie",
                          gpu.scaleup_kind)
    if cluster.nvlink_domain > gpn and gpu.scaleup_kind != "nvswitch":
        raise ConfigError("nvlink_domain", f"a scale-up domain larger than a host needs NVSwitches "
                          f"({gpu.key} has {gpu.scaleup_kind})", cluster.nvlink_domain)
    if gpu.scaleup_kind != "pcie" and not gpu.scaleup_Bps > 0:
        raise ConfigError("scaleup_Bps", f"must be > 0 for {gpu.scaleup_kind}", gpu.scaleup_Bps)
    if gpu.scaleup_kind == "xgmi_mesh" and gpu.scaleup_links < gpn - 1:
        raise ConfigError("gpus_per_node", f"a full xGMI mesh needs a link to every peer: at most "
                          f"scaleup_links + 1 = {gpu.scaleup_links + 1} GPUs per node", gpn)
    if gpu.scaleup_kind == "nvlink_mesh":
        nvlink_mesh_links(gpn, gpu.scaleup_links)  # raises for a board that is not modelled
    if gpu.scaleup_kind == "nvlink_bridge" and gpn % 2:
        raise ConfigError("gpus_per_node", "NVLink bridges join GPU pairs: must be even", gpn)
    if not gpu.pcie_Bps > 0:
        raise ConfigError("pcie_Bps", "must be > 0", gpu.pcie_Bps)
    if nics % gpn and gpn % nics:
        raise ConfigError("nics_per_node", "must divide gpus_per_node or be a multiple of it, so that every "
                          "GPU has the same share of NICs", f"{nics} and {gpn}")
    per_gpu_Bps = max(nics // gpn, 1) * gbps_to_Bps(cluster.nic_gbps)
    if nics > gpn and per_gpu_Bps > gpu.pcie_Bps:
        raise ConfigError("nics_per_node", f"{nics // gpn} NICs per GPU need {per_gpu_Bps / GB:g} GB/s, more "
                          f"than the GPU's PCIe link ({gpu.pcie_Bps / GB:g} GB/s)", nics)
    if cluster.switch_radix < 2:
        raise ConfigError("switch_radix", "must be >= 2 (one down-port and one up-port)", cluster.switch_radix)
    if cluster.network == "fat_tree" and cluster.leaves_per_rail:
        raise ConfigError("leaves_per_rail", "applies to rail networks only; must be 0 for fat_tree",
                          cluster.leaves_per_rail)


def build_topology(cluster: ClusterConfig, gpu) -> Topology:
    """Build the cluster's nodes and directed links.

    Parameters
    ----------
    cluster : ClusterConfig
        Cluster description (validated here).
    gpu : GPUSpec
        The GPU's datasheet; uses ``scaleup_kind``, ``scaleup_Bps`` (per GPU per direction),
        ``scaleup_links`` and ``pcie_Bps``.

    Returns
    -------
    Topology

    Raises
    ------
    ConfigError
        An impossible topology: NICs that do not split evenly over GPUs or that a GPU's PCIe link cannot
        feed, a switch radix too small for three tiers, a multi-host scale-up domain without NVSwitch, ...
    """
    _check(cluster, gpu)
    g = _Graph()
    num_gpus, gpn, R = cluster.num_gpus, cluster.gpus_per_node, cluster.nics_per_node
    n_hosts = cluster.num_nodes
    gpus = g.nodes(NodeKind.GPU, num_gpus)
    local = gpus % gpn
    host = gpus // gpn
    domain = gpus // cluster.nvlink_domain
    kind = gpu.scaleup_kind

    up = np.full(num_gpus, -1, dtype=np.int64)
    down = np.full(num_gpus, -1, dtype=np.int64)
    peer = np.full((num_gpus, gpn), -1, dtype=np.int64)
    relay = np.zeros((0, 0), dtype=np.int64)
    if kind == "nvswitch":
        switches = g.nodes(NodeKind.NVSWITCH, int(domain.max()) + 1)
        up = g.links(gpus, switches[domain], gpu.scaleup_Bps, 0.0, LinkKind.NVLINK)
        down = g.links(switches[domain], gpus, gpu.scaleup_Bps, 0.0, LinkKind.NVLINK)
    else:
        if kind in ("pcie", "nvlink_bridge", "nvlink_mesh"):
            hosts = g.nodes(NodeKind.HOST, n_hosts)
            up = g.links(gpus, hosts[host], gpu.pcie_Bps, 0.0, LinkKind.PCIE)
            down = g.links(hosts[host], gpus, gpu.pcie_Bps, 0.0, LinkKind.PCIE)
        if kind == "xgmi_mesh":
            a, j = np.meshgrid(gpus, np.arange(gpn), indexing="ij")
            b = host[a] * gpn + j
            ok = (j != local[a]) & (b < num_gpus)
            peer[ok] = g.links(a[ok], b[ok], gpu.scaleup_Bps / gpu.scaleup_links, 0.0, LinkKind.NVLINK)
        elif kind == "nvlink_bridge":
            partner = gpus ^ 1
            ok = partner < num_gpus
            peer[gpus[ok], local[partner[ok]]] = g.links(gpus[ok], partner[ok], gpu.scaleup_Bps, 0.0,
                                                         LinkKind.NVLINK)
        elif kind == "nvlink_mesh":
            board = nvlink_mesh_links(gpn, gpu.scaleup_links)
            a, j = np.meshgrid(gpus, np.arange(gpn), indexing="ij")
            b = host[a] * gpn + j
            count = board[local[a], j]
            for k in np.unique(count[count > 0]):  # one link per linked pair, k NVLinks wide
                ok = (count == k) & (b < num_gpus)
                peer[ok] = g.links(a[ok], b[ok], k * gpu.scaleup_Bps / gpu.scaleup_links, 0.0, LinkKind.NVLINK)
            relay = mesh_relays(board)[local]

    # GPU <-> NIC over PCIe.
    nic_ids = g.nodes(NodeKind.NIC, n_hosts * R)
    first, k = nic_span(local, gpn, R)
    gpu_nic = host[:, None] * R + first[:, None] + np.arange(k)[None, :]
    gpu_nic_link = g.links(gpus[:, None], nic_ids[gpu_nic], gpu.pcie_Bps, 0.0, LinkKind.PCIE)
    nic_gpu_link = g.links(nic_ids[gpu_nic], gpus[:, None], gpu.pcie_Bps, 0.0, LinkKind.PCIE)

    fabric = _build_fabric(g, cluster, nic_ids)
    node_kind, src, dst, cap, lat, lkind = g.arrays()
    return Topology(cluster=cluster, scaleup_kind=kind, node_kind=node_kind, link_src=src, link_dst=dst,
                    capacity_Bps=cap, latency_s=lat, link_kind=lkind, gpu_domain=domain, gpu_up_link=up,
                    gpu_down_link=down, peer_link=peer, gpu_nic=gpu_nic, gpu_nic_link=gpu_nic_link,
                    nic_gpu_link=nic_gpu_link, relay_gpu=relay, **fabric)


def _build_fabric(g: _Graph, cluster: ClusterConfig, nic_ids: np.ndarray) -> dict:
    """Leaves, spines and cores of the scale-out network; returns the Topology fields they fill."""
    R = cluster.nics_per_node
    n_hosts = cluster.num_nodes
    radix = cluster.switch_radix
    half = radix // 2
    nic_Bps = gbps_to_Bps(cluster.nic_gbps)
    lat = cluster.nic_latency_s
    n_nics = nic_ids.size
    nic = np.arange(n_nics)
    rail = nic % R
    nic_host = nic // R
    if cluster.network == "fat_tree":
        nic_leaf = nic // half
        n_leaves = int(nic_leaf.max()) + 1
        leaf_plane = np.zeros(n_leaves, dtype=np.int64)
    else:
        leaves_per_rail = cluster.leaves_per_rail or -(-n_hosts // half)
        hosts_per_leaf = -(-n_hosts // leaves_per_rail)
        if hosts_per_leaf > half:
            raise ConfigError("leaves_per_rail", f"{n_hosts} hosts on {leaves_per_rail} leaves per rail need "
                              f"{hosts_per_leaf} down-ports per leaf, more than switch_radix // 2 = {half}",
                              leaves_per_rail)
        nic_leaf = (nic_host // hosts_per_leaf) * R + rail
        n_leaves = leaves_per_rail * R
        leaf_plane = (np.arange(n_leaves) % R) if cluster.network == "rail_only" else np.zeros(n_leaves,
                                                                                                 dtype=np.int64)
    leaves = g.nodes(NodeKind.LEAF, n_leaves)
    nic_up = g.links(nic_ids, leaves[nic_leaf], nic_Bps, lat, LinkKind.NIC_LEAF)
    nic_down = g.links(leaves[nic_leaf], nic_ids, nic_Bps, lat, LinkKind.LEAF_NIC)

    n_planes = int(leaf_plane.max()) + 1
    per_plane = n_leaves // n_planes
    # Index of each leaf within its plane (planes hold equal numbers of leaves, in id order).
    order = np.argsort(leaf_plane, kind="stable")
    in_plane = np.empty(n_leaves, dtype=np.int64)
    in_plane[order] = np.arange(n_leaves) % per_plane
    if per_plane == 1:
        n_tiers, leaves_per_pod = 1, 1
    elif per_plane <= radix:
        n_tiers, leaves_per_pod = 2, per_plane
    else:
        n_tiers, leaves_per_pod = 3, half
        if -(-per_plane // half) > radix:
            raise ConfigError("switch_radix", f"{radix} ports cannot connect {per_plane} leaves in three tiers "
                              f"(at most radix * radix / 2 = {radix * half})", radix)
    pods_per_plane = -(-per_plane // leaves_per_pod)
    leaf_pod = leaf_plane * pods_per_plane + in_plane // leaves_per_pod
    n_pods = n_planes * pods_per_plane
    ideal = cluster.ecmp == "ideal"
    empty = np.zeros((0, 0), dtype=np.int64)
    out = dict(nic_rail=rail, nic_leaf=nic_leaf, nic_up_link=nic_up, nic_down_link=nic_down, leaf_plane=leaf_plane,
               leaf_pod=leaf_pod,
               leaf_up_link=np.zeros((n_leaves, 0), dtype=np.int64),
               leaf_down_link=np.zeros((n_leaves, 0), dtype=np.int64), spine_up_link=empty,
               spine_down_link=empty, n_tiers=n_tiers)
    if n_tiers == 1:
        return out
    # Spines: half up-ports per leaf, one to each spine of the pod (or one bundle when ideal).
    S = 1 if ideal else half
    up_Bps = nic_Bps * (half if ideal else 1) / cluster.oversubscription
    spines = g.nodes(NodeKind.SPINE, n_pods * S)
    spine_of = leaf_pod[:, None] * S + np.arange(S)[None, :]
    out["leaf_up_link"] = g.links(leaves[:, None], spines[spine_of], up_Bps, lat, LinkKind.LEAF_SPINE)
    out["leaf_down_link"] = g.links(spines[spine_of], leaves[:, None], up_Bps, lat, LinkKind.SPINE_LEAF)
    if n_tiers == 3:
        # Core group s of a plane links spine s of every pod of the plane; half cores per group.
        C = 1 if ideal else half
        core_Bps = nic_Bps * (half * half if ideal else 1)
        cores = g.nodes(NodeKind.CORE, n_planes * S * C)
        spine_ids = np.arange(n_pods * S)
        plane_of_spine = (spine_ids // S) // pods_per_plane
        core_of = (plane_of_spine * S + spine_ids % S)[:, None] * C + np.arange(C)[None, :]
        out["spine_up_link"] = g.links(spines[:, None], cores[core_of], core_Bps, lat, LinkKind.SPINE_CORE)
        out["spine_down_link"] = g.links(cores[core_of], spines[:, None], core_Bps, lat, LinkKind.CORE_SPINE)
    return out


def _summarize(t: Topology) -> TopologySummary:
    c = t.cluster
    kinds = t.node_kind
    nic_Bps = gbps_to_Bps(c.nic_gbps)
    tiers = []
    for lk in LinkKind:
        sel = t.link_kind == lk
        if sel.any():
            tiers.append(TierSummary(_TIER_NAMES[lk], int(sel.sum()), float(t.capacity_Bps[sel].max()),
                                     float(t.capacity_Bps[sel].sum())))
    n_leaves = t.nic_leaf.max() + 1
    nics_per_leaf = np.bincount(t.nic_leaf, minlength=n_leaves)
    if t.n_tiers == 1:
        leaf_over = float("nan")
        bisection = nics_per_leaf.sum() / 2 * nic_Bps
    else:
        leaf_up_Bps = t.capacity_Bps[t.leaf_up_link].sum(axis=1)
        leaf_over = float((nics_per_leaf * nic_Bps / leaf_up_Bps).max())
        bisection = 0.0
        for p in range(int(t.leaf_plane.max()) + 1):
            sel = t.leaf_plane == p
            cut = min(nics_per_leaf[sel].sum() * nic_Bps, leaf_up_Bps[sel].sum())
            if t.n_tiers == 3:
                spines = np.unique(t.leaf_pod[sel])
                S = t.leaf_up_link.shape[1]
                sp = (spines[:, None] * S + np.arange(S)[None, :]).ravel()
                cut = min(cut, t.capacity_Bps[t.spine_up_link[sp]].sum())
            bisection += cut / 2
    return TopologySummary(
        name=c.name, network=c.network, ecmp=c.ecmp, scaleup_kind=t.scaleup_kind, gpus=t.num_gpus,
        nodes=c.num_nodes, nics=int((kinds == NodeKind.NIC).sum()), nvswitches=int((kinds == NodeKind.NVSWITCH).sum()),
        leaves=int((kinds == NodeKind.LEAF).sum()), spines=int((kinds == NodeKind.SPINE).sum()),
        cores=int((kinds == NodeKind.CORE).sum()), links=t.n_links, scaleup_domain_gpus=c.nvlink_domain,
        switch_tiers=t.n_tiers, nic_Bps=nic_Bps, bisection_Bps=float(bisection),
        oversubscription=float(c.oversubscription), leaf_oversubscription=leaf_over, tiers=tuple(tiers))
