"""Paths of GPU-to-GPU flows through a :class:`~flowsim.network.topology.Topology`, as CSR arrays (flow -> links).

Rules, vectorised over all flows at once (numpy, no per-flow Python):

* same GPU: empty path (no link is used);
* same scale-up domain: NVSwitch up + down, or the direct xGMI / bridge / NVLink mesh link, or (NVLink mesh)
  the two links through the pair's relay GPU, or host PCIe up + down;
* otherwise GPU -> NIC (PCIe) -> leaf [-> spine [-> core -> spine] -> leaf] -> NIC -> GPU. A GPU with several
  NICs uses NIC ``j``, and the destination GPU its NIC ``j`` too, ``j`` chosen by the flow hash.
  Equal-cost up-links (spine of the pod, core of the group) are chosen by the same hash (deterministic
  ECMP); with ``ecmp='ideal'`` the topology has one bundle per leaf, so there is no choice to make.
* PXN (NCCL's ``NCCL_PXN_DISABLE=0`` path, NCCL 2.12 release notes): the source first crosses the scale-up
  fabric to the GPU of its own host whose NIC is on the destination NIC's rail, then leaves through that
  NIC. ``rail_only`` networks always route cross-rail flows this way (there is no other path).

The ECMP hash is splitmix64 (Steele, Lea & Flood, "Fast splittable pseudorandom number generators",
OOPSLA 2014) of ``(src * 2**42) ^ (dst * 2**21) ^ flow_id``; different bit ranges of the hash pick the NIC,
the spine and the core.

The hash covers global GPU ids, not ids relative to the rail. Switches hash header fields (hash-threshold
ECMP, RFC 2992): for RoCEv2 the source and destination IP addresses and the UDP source port that the NIC sets
per queue pair for entropy (IBTA, RoCEv2, Annex A17 to the InfiniBand Architecture Specification, 2014). On a
rail-optimised fabric every NIC has its own address, so corresponding flows of two rails hash independently:
each rail draws its own collisions, and a collective waits for the rail that drew the worst. InfiniBand's
static fat-tree routing (OpenSM's ftree, d-mod-k over destination LIDs that the subnet manager hands out per
port) is not rail-relative either. A rail-relative hash would make the rails exact copies, cheaper to simulate
(:mod:`flowsim.network.symmetry` would merge them), but would replace the worst of the rails' draws by one
draw; so each rail keeps its own paths and its own results wherever they differ, and rails merge only where
they are exact copies (traffic that stays under one leaf, or ``ecmp='ideal'``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flowsim.network.topology import Topology

__all__ = ["Routes", "route"]


@dataclass(frozen=True, eq=False)
class Routes:
    """Paths of a set of flows.

    Attributes
    ----------
    ptr : int64[n_flows + 1]
        CSR offsets: flow f crosses ``links[ptr[f]:ptr[f + 1]]``.
    links : int64[n_hops]
        Link ids in path order.
    latency_s : float64[n_flows]
        Sum of the link latencies of each path, seconds.
    """

    ptr: np.ndarray
    links: np.ndarray
    latency_s: np.ndarray

    @property
    def n_flows(self) -> int:
        """Number of flows."""
        return int(self.ptr.size - 1)

    def path(self, f: int) -> np.ndarray:
        """Link ids of flow ``f``."""
        return self.links[self.ptr[f]:self.ptr[f + 1]]

    def __repr__(self) -> str:
        return f"Routes({self.n_flows} flows, {self.links.size} hops)"


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser over uint64 arrays (wrapping arithmetic)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _ints(name: str, a, n: int | None, upper: int) -> np.ndarray:
    arr = np.asarray(a)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"{name}: must be a one-dimensional integer array (got {arr.dtype}, shape {arr.shape})")
    if n is not None and arr.size != n:
        raise ValueError(f"{name}: must have one entry per flow, {n} (got {arr.size})")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and (arr.min() < 0 or arr.max() >= upper):
        bad = arr[(arr < 0) | (arr >= upper)][0]
        raise ValueError(f"{name}: GPU ids must be in [0, {upper}) (got {bad})")
    return arr


def _intra(t: Topology, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Scale-up path (two columns, -1 = no hop) from GPUs ``a`` to GPUs ``b`` of the same domain, a != b."""
    out = np.full((a.size, 2), -1, dtype=np.int64)
    gpn = t.cluster.gpus_per_node
    direct = t.peer_link[a, b % gpn] if t.peer_link.size else np.full(a.size, -1, dtype=np.int64)
    has = direct >= 0
    out[has, 0] = direct[has]
    if t.relay_gpu.size:  # nvlink_mesh: through the relay GPU's two direct links (topology.mesh_relays)
        m = np.where(has, -1, t.relay_gpu[a, b % gpn])
        via = m >= 0
        out[via, 0] = t.peer_link[a[via], m[via]]
        out[via, 1] = t.peer_link[(a[via] // gpn) * gpn + m[via], b[via] % gpn]
        has = has | via
    out[~has, 0] = t.gpu_up_link[a[~has]]
    out[~has, 1] = t.gpu_down_link[b[~has]]
    return out


def route(topo: Topology, src_gpu, dst_gpu, flow_id=None, *, pxn: bool = False) -> Routes:
    """Paths of flows from ``src_gpu`` to ``dst_gpu``.

    Parameters
    ----------
    topo : Topology
        The cluster.
    src_gpu, dst_gpu : int[n_flows]
        GPU ids in [0, topo.num_gpus).
    flow_id : int[n_flows], optional
        Any integers that tell flows of the same GPU pair apart (NCCL channel, message index) for the ECMP
        hash; default ``arange(n_flows)``.
    pxn : bool
        Cross the scale-up fabric to the GPU on the destination's rail before leaving the host (NCCL PXN).

    Returns
    -------
    Routes

    Raises
    ------
    ValueError
        Ids out of range or arrays of different lengths; the message names the argument.
    """
    n_gpus = topo.num_gpus
    src = _ints("src_gpu", src_gpu, None, n_gpus)
    dst = _ints("dst_gpu", dst_gpu, src.size, n_gpus)
    n = src.size
    fid = np.arange(n, dtype=np.int64) if flow_id is None else _ints("flow_id", flow_id, n, 2**62)
    c = topo.cluster
    gpn, R = c.gpus_per_node, c.nics_per_node
    h = _splitmix64((src.astype(np.uint64) << np.uint64(42)) ^ (dst.astype(np.uint64) << np.uint64(21))
                    ^ fid.astype(np.uint64))
    cols = np.full((n, 10), -1, dtype=np.int64)

    same_domain = (topo.gpu_domain[src] == topo.gpu_domain[dst]) & (src != dst)
    cols[same_domain, 0:2] = _intra(topo, src[same_domain], dst[same_domain])

    out = np.flatnonzero(topo.gpu_domain[src] != topo.gpu_domain[dst])
    s, d, hh = src[out], dst[out], h[out]
    k = topo.gpu_nic.shape[1]
    j = (hh % np.uint64(k)).astype(np.int64)
    dst_nic = topo.gpu_nic[d, j]
    dst_rail = topo.nic_rail[dst_nic]
    src_nic = topo.gpu_nic[s, j]
    via = np.ones(out.size, dtype=bool) if pxn else topo.nic_rail[src_nic] != dst_rail
    if not pxn and c.network != "rail_only":
        via[:] = False
    if via.any():
        # The proxy: the GPU of the source's host attached to the NIC on the destination rail.
        sv = s[via]
        rail = dst_rail[via]
        proxy_local = rail * gpn // R if R < gpn else rail // k
        proxy = (sv // gpn) * gpn + proxy_local
        proxy_j = np.zeros(sv.size, dtype=np.int64) if R < gpn else rail % k
        moved = proxy != sv
        intra = np.full((sv.size, 2), -1, dtype=np.int64)
        intra[moved] = _intra(topo, sv[moved], proxy[moved])
        rows = out[via]
        cols[rows, 0:2] = intra
        src_nic[via] = topo.gpu_nic[proxy, proxy_j]
        cols[rows, 2] = topo.gpu_nic_link[proxy, proxy_j]
    direct = ~via
    cols[out[direct], 2] = topo.gpu_nic_link[s[direct], j[direct]]
    cols[out, 3] = topo.nic_up_link[src_nic]
    a, b = topo.nic_leaf[src_nic], topo.nic_leaf[dst_nic]
    cross = a != b
    if cross.any():
        S = topo.leaf_up_link.shape[1]
        if S == 0 or np.any(topo.leaf_plane[a[cross]] != topo.leaf_plane[b[cross]]):
            raise AssertionError("routing bug: leaves in different planes")  # rail_only forces PXN
        sp = ((hh[cross] >> np.uint64(16)) % np.uint64(S)).astype(np.int64)
        rows = out[cross]
        cols[rows, 4] = topo.leaf_up_link[a[cross], sp]
        cols[rows, 7] = topo.leaf_down_link[b[cross], sp]
        pa, pb = topo.leaf_pod[a[cross]], topo.leaf_pod[b[cross]]
        other_pod = pa != pb
        if other_pod.any():
            C = topo.spine_up_link.shape[1]
            core = ((hh[cross][other_pod] >> np.uint64(40)) % np.uint64(C)).astype(np.int64)
            spa = pa[other_pod] * S + sp[other_pod]
            spb = pb[other_pod] * S + sp[other_pod]
            cols[rows[other_pod], 5] = topo.spine_up_link[spa, core]
            cols[rows[other_pod], 6] = topo.spine_down_link[spb, core]
    cols[out, 8] = topo.nic_down_link[dst_nic]
    cols[out, 9] = topo.nic_gpu_link[d, j]

    keep = cols >= 0
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(keep.sum(axis=1), out=ptr[1:])
    links = cols[keep]
    hop_flow = np.repeat(np.arange(n), np.diff(ptr))
    latency = np.bincount(hop_flow, weights=topo.latency_s[links], minlength=n)
    return Routes(ptr=ptr, links=links, latency_s=latency)
