"""NCCL collectives executed as flows on the cluster topology, several groups at once.

:func:`run_collective` takes NCCL's algorithm and protocol among those with a plan and the rank-level plan
from :func:`flowsim.nccl_models.plan_collective` (the plan carries each rank's kernel rate), maps each group's
ranks onto its GPUs, routes every transfer through :func:`flowsim.network.topology.build_topology`'s graph
(:func:`flowsim.network.routing.route`) and runs the transfers of all groups in one flow simulation
(:func:`flowsim.network.netsim.simulate`), so that groups sharing NICs, leaves or spines share their bandwidth
max-min fairly.

Two things are added to the topology's links, both from the analytic model's calibration:

* **Kernel link.** A collective's CTAs move data at most as fast as NCCL's graph bandwidth. Each (group, rank)
  gets one virtual link on all its outgoing transfers, of the capacity the plan gives that rank
  (``Plan.kernel_Bps``, :mod:`flowsim.nccl_models.plans`): alone, a rank moves its bytes in NCCL's time.
* **Network efficiency.** Scale-out links (NIC to leaf and above) carry
  :data:`flowsim.nccl_models.NET_BW_EFFICIENCY` of their line rate: the analytic model's measured
  achieved fraction of a NIC, here a property of the link, so that groups sharing a NIC split what it
  really delivers.

:func:`run_concurrent` runs collectives of several kinds (each a list of groups, e.g. a stage's DP reduction
and the pipeline sends beside it) in one simulation, so that they share links too; each reports its own time.
Collectives with no chain of shared links to the ones of interest are left out (max-min rates only couple
flows of one connected component), and a collective can be ordered after another (one stream).

Latency: link latencies of the path are not added; NCCL's per-step ``hwLat`` (spread over the plan's critical
path) already covers the network hop. Ring and tree transfers leaving a node go through the NIC on their
ring's rail (PXN, as NCCL's rings enter and leave a node on one rail), except on an xGMI mesh, where a ring
leaves through its last GPU's own NIC (:mod:`flowsim.nccl_models.plans`); AllToAll uses PXN when asked.

Comparing the flow engine with nccl-tests logs is :mod:`flowsim.validation.nccl_flows`.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
from numba import njit

from flowsim._moved import module_getattr
from flowsim.config.cluster import ClusterConfig, job_domain_size
from flowsim.network.comm_layout import group_layout
from flowsim.network.dominated_links import dominated_hops
from flowsim.errors import ConfigError
from flowsim.gpu_specs import GPUSpec
from flowsim.nccl_models import (
    DEFAULT_MAX_TRANSFERS, DEFAULT_NCCL_VERSION, NET_BW_EFFICIENCY, NET_SWITCH, P2P_OPS, SWITCH, CollectiveEstimate,
    CommLayout, Plan, busbw_factor, plan_collective,
)
from flowsim.network.lru import BytesLRU
from flowsim.network.netsim import _compact, simulate
from flowsim.network.routing import route
from flowsim.network.topology import _TIER_NAMES, LinkKind, Topology, build_topology

__all__ = ["FlowCollectiveResult", "run_collective", "run_concurrent", "strided_groups", "cached_topology"]
__getattr__ = module_getattr(__name__)  # flow_comparison moved to flowsim.validation.nccl_flows


@dataclass(frozen=True)
class FlowCollectiveResult:
    """One collective run as flows by every group at once.

    Attributes
    ----------
    op, algo, proto : str
        Collective and NCCL's algorithm / protocol names (``P2P``/``Simple`` for AllToAll and Send/Recv).
    size_bytes : float
        Size per group, nccl-tests convention.
    n_ranks : int
        Ranks per group.
    time_s : float
        Time until the last group finishes, seconds (NCCL base latency included).
    algbw_Bps, busbw_Bps : float
        ``size / time_s`` and its nccl-tests bus bandwidth, bytes/s.
    group_time_s : tuple[float, ...]
        Time of each group, seconds.
    n_transfers : int
        Transfers simulated (all groups).
    link_utilization : tuple[dict, ...]
        Per link tier carrying traffic: ``tier``, ``links`` (used), ``max_utilization`` and
        ``mean_utilization`` (wire bytes / (capacity x time), over the used links; scale-out capacity is the
        effective one, line rate x ``NET_BW_EFFICIENCY``); ``tier = "kernel"`` is the virtual kernel link
        (module docstring).
    """

    op: str
    algo: str
    proto: str
    size_bytes: float
    n_ranks: int
    time_s: float
    algbw_Bps: float
    busbw_Bps: float
    group_time_s: tuple
    n_transfers: int
    link_utilization: tuple

    def to_dict(self) -> dict:
        """Field mapping with units in the key names (what ``--json`` prints)."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}

    def __repr__(self) -> str:
        return (f"FlowCollectiveResult({self.op} {self.size_bytes:.0f} B x {len(self.group_time_s)} group(s) of "
                f"{self.n_ranks}: {self.time_s * 1e6:.1f} us {self.algo}/{self.proto}, "
                f"busbw {self.busbw_Bps / 1e9:.1f} GB/s)")


@lru_cache(maxsize=16)
def cached_topology(cluster: ClusterConfig, gpu: GPUSpec) -> Topology:
    """:func:`flowsim.network.topology.build_topology`, cached per (cluster, GPU)."""
    return build_topology(cluster, gpu)


def strided_groups(n_ranks: int, stride: int, n_groups: int = 1) -> list[list[int]]:
    """Groups ``[i + k * stride for k < n_ranks]`` for ``i < n_groups`` (e.g. the DP groups of all TP ranks).

    Parameters
    ----------
    n_ranks, stride, n_groups : int
        Ranks per group, distance between members, number of groups (>= 1 each).

    Returns
    -------
    list of list of int
        Global GPU ids.
    """
    for name, v in (("n_ranks", n_ranks), ("stride", stride), ("n_groups", n_groups)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(name, "must be a positive integer", v)
    return [[i + k * stride for k in range(n_ranks)] for i in range(n_groups)]


def _groups_of(group_ranks, concurrent_groups, num_gpus: int) -> np.ndarray:
    """int64[n_groups, n_ranks] of global GPU ids, checked."""
    try:
        first = np.asarray(group_ranks, dtype=np.int64)
    except (TypeError, ValueError):
        raise ConfigError("group_ranks", "must be a list of global GPU ids", group_ranks) from None
    if first.ndim != 1 or first.size < 1:
        raise ConfigError("group_ranks", "must be a non-empty list of global GPU ids", group_ranks)
    if isinstance(concurrent_groups, int) and not isinstance(concurrent_groups, bool):
        if concurrent_groups < 1:
            raise ConfigError("concurrent_groups", "must be >= 1 or a list of groups", concurrent_groups)
        groups = first[None, :] + np.arange(concurrent_groups)[:, None]
    elif isinstance(concurrent_groups, np.ndarray) and concurrent_groups.ndim == 2 and \
            concurrent_groups.shape[1] == first.size:  # the step engine's groups (flowsim.step.flows)
        groups = np.concatenate([first[None, :], concurrent_groups.astype(np.int64, copy=False)])
    else:
        try:
            groups = np.asarray([first, *concurrent_groups], dtype=np.int64)
        except (TypeError, ValueError):
            raise ConfigError("concurrent_groups", "groups must all have the same number of ranks",
                              concurrent_groups) from None
    if groups.min() < 0 or groups.max() >= num_gpus:
        raise ConfigError("group_ranks", f"GPU ids must be in [0, {num_gpus})", int(groups.max()))
    if np.bincount(groups.ravel()).max() > 1:  # a GPU in two groups (bincount: no sort)
        raise ConfigError("concurrent_groups", "groups must not share GPUs (or repeat one)",
                          groups.tolist() if groups.size <= 32 else f"{groups.shape[0]} groups")
    return groups


def _layout(cluster: ClusterConfig, gpu: GPUSpec, groups: np.ndarray, nccl_version: str,
            collnet: bool = False) -> CommLayout:
    """Layout of the groups; each must be an increasing arithmetic progression, all of one shape (``collnet``:
    IB SHARP enabled)."""
    g = np.sort(groups, axis=1)
    n = g.shape[1]
    stride = int(g[0, 1] - g[0, 0]) if n > 1 else 1
    if n > 1 and np.any(np.diff(g, axis=1) != stride):
        raise ConfigError("group_ranks", "groups must be evenly spaced global ranks (first + k * stride), "
                                         "all with the same stride", groups[0].tolist()[:16])
    # a group's layout depends only on where it starts within its scale-up domain (domains hold whole nodes)
    layouts = {group_layout(cluster, gpu, n, stride, first_rank=int(f), nccl_version=nccl_version)
               for f in np.unique(g[:, 0] % job_domain_size(cluster))}
    if len(layouts) != 1:
        raise ConfigError("concurrent_groups", "groups must have the same layout (nodes, NICs)", len(layouts))
    return replace(layouts.pop(), collnet=collnet)


def _paths(topo: Topology, plan: Plan, groups: np.ndarray, kernel_base: int, pxn: bool):
    """CSR paths (kernel link + topology links) of every transfer of every group."""
    G, n = groups.shape
    m = plan.n_transfers
    src = np.tile(plan.src, G)
    dst = np.tile(plan.dst, G)
    gi = np.repeat(np.arange(G), m)
    src_gpu = np.where(src >= 0, groups[gi, np.maximum(src, 0)], -1)
    dst_gpu = np.where(dst >= 0, groups[gi, np.maximum(dst, 0)], -1)
    routed = np.flatnonzero((src >= 0) & (dst >= 0))
    up = np.flatnonzero((src >= 0) & (dst == SWITCH))
    down = np.flatnonzero((src == SWITCH) & (dst >= 0))
    if (up.size or down.size) and np.any(topo.gpu_up_link < 0):
        raise ConfigError("algo", "NVLS needs an NVSwitch in the topology", topo.scaleup_kind)
    net_up = np.flatnonzero((src >= 0) & (dst == NET_SWITCH))  # CollNet: GPU -> its NIC -> leaf (SHARP)
    net_down = np.flatnonzero((src == NET_SWITCH) & (dst >= 0))
    channels = int(plan.channel.max()) + 1
    r = route(topo, src_gpu[routed], dst_gpu[routed], flow_id=gi[routed] * channels + np.tile(plan.channel, G)[routed],
              pxn=pxn)
    has_kernel = src >= 0
    count = has_kernel.astype(np.int64)
    count[routed] += np.diff(r.ptr)
    count[up] += 1
    count[down] += 1
    count[net_up] += 2
    count[net_down] += 2
    ptr = np.zeros(count.size + 1, dtype=np.int64)
    np.cumsum(count, out=ptr[1:])
    links = np.empty(ptr[-1], dtype=np.int64)
    first = ptr[:-1]
    links[first[has_kernel]] = kernel_base + gi[has_kernel] * n + src[has_kernel]
    after = first + has_kernel
    hop = np.arange(r.links.size) - np.repeat(r.ptr[:-1], np.diff(r.ptr))
    links[np.repeat(after[routed], np.diff(r.ptr)) + hop] = r.links
    links[after[up]] = topo.gpu_up_link[src_gpu[up]]
    links[after[down]] = topo.gpu_down_link[dst_gpu[down]]
    g_up, g_down = src_gpu[net_up], dst_gpu[net_down]
    links[after[net_up]] = topo.gpu_nic_link[g_up, 0]
    links[after[net_up] + 1] = topo.nic_up_link[topo.gpu_nic[g_up, 0]]
    links[after[net_down]] = topo.nic_down_link[topo.gpu_nic[g_down, 0]]
    links[after[net_down] + 1] = topo.nic_gpu_link[g_down, 0]
    return ptr, links


def _utilization(topo: Topology, link_bytes: np.ndarray, capacity: np.ndarray, time_s: float) -> tuple:
    kinds = np.concatenate([topo.link_kind.astype(np.int64), np.full(capacity.size - topo.n_links, -1)])
    util = link_bytes / (capacity * time_s) if time_s > 0 else np.zeros_like(capacity)
    out = []
    for k in np.unique(kinds[link_bytes > 0]):
        used = (kinds == k) & (link_bytes > 0)
        out.append({"tier": "kernel" if k < 0 else _TIER_NAMES[LinkKind(k)], "links": int(used.sum()),
                    "max_utilization": float(util[used].max()), "mean_utilization": float(util[used].mean())})
    return tuple(out)


@lru_cache(maxsize=16)
def _capacity(topo: Topology) -> np.ndarray:
    """Capacities of the topology's links as the flows see them, bytes/s (scale-out x ``NET_BW_EFFICIENCY``);
    read-only, cached per topology (as many as :func:`cached_topology` keeps)."""
    capacity = topo.capacity_Bps.copy()
    capacity[topo.link_kind >= LinkKind.NIC_LEAF] *= NET_BW_EFFICIENCY
    capacity.flags.writeable = False
    return capacity


@dataclass(frozen=True, eq=False)
class _Prepared:
    """One collective ready to simulate: its plan for every group, routed (kernel links numbered from
    ``topo.n_links``, one per (group, rank))."""

    est: CollectiveEstimate
    plan: Plan
    groups: np.ndarray
    ptr: np.ndarray
    links: np.ndarray
    kernel_Bps: np.ndarray
    net_links: np.ndarray  # the distinct topology links its transfers cross (for _connected, _simulate_together)
    dominated: np.ndarray  # bool per hop: its link is dominated among this collective's (dominated_links)

    @property
    def n_transfers(self) -> int:
        """Transfers of all groups."""
        return self.plan.n_transfers * self.groups.shape[0]


PREPARED_CACHE_BYTES = 192 * 2**20
"""Bytes of prepared collectives (plan and routes of one collective on one set of groups) kept per process,
least recently used dropped first. A cost cap only: a step prepares a few dozen to a few hundred distinct ones
(deepseek-v3 on 2,048 H800: 267, each window's traffic its own sizes) and every cross-kind simulation re-uses
them; a cap by count thrashes on the larger steps, one by bytes bounds the memory of the largest
(benchmarks/bench_flow_scaling.py, max RSS)."""


_PREPARED = BytesLRU(PREPARED_CACHE_BYTES)

ROUTES_CACHE_BYTES = 128 * 2**20
"""Bytes of routed plans (paths of every transfer of one plan structure on one set of groups) kept per process,
least recently used dropped first. A cost cap only: plans of one collective at different sizes often share their
transfers' endpoints and channels (every size below a chunk per channel; every streamed size), and routing them
again is most of the preparation of a large plan (20 NVL72 racks: 184,192 tree transfers)."""

_ROUTES = BytesLRU(ROUTES_CACHE_BYTES)


def _prepare(cluster: ClusterConfig, gpu: GPUSpec, op: str, size_bytes: float, groups: np.ndarray, algo, proto,
             pxn: bool, max_transfers: int, nccl_version: str = DEFAULT_NCCL_VERSION, collnet: bool = False):
    """Plan and route one collective on every group (on ``cached_topology(cluster, gpu)``); a
    :class:`FlowCollectiveResult` for single-rank groups. Cached per (collective, groups) in ``_PREPARED``: the
    arrays are read-only."""
    key = (cluster, gpu, op, size_bytes, groups.tobytes(), groups.shape, algo, proto, pxn, max_transfers,
           nccl_version, collnet)
    p = _PREPARED.get(key)
    if p is None:
        p = _plan_and_route(cluster, gpu, op, size_bytes, np.array(groups, dtype=np.int64), algo, proto, pxn,
                            max_transfers, nccl_version, collnet)
        arrays = ((p.groups, p.ptr, p.links, p.kernel_Bps, p.net_links, p.dominated) if isinstance(p, _Prepared)
                  else ())
        _PREPARED.put(key, p, sum(a.nbytes for a in arrays) + len(key[4]))
    return p


def _plan_and_route(cluster: ClusterConfig, gpu: GPUSpec, op: str, size_bytes: float, groups: np.ndarray, algo,
                    proto, pxn: bool, max_transfers: int, nccl_version: str, collnet: bool):
    topo = cached_topology(cluster, gpu)
    est, plan = plan_collective(op, size_bytes, _layout(cluster, gpu, groups, nccl_version, collnet), algo=algo,
                                proto=proto, max_transfers=max_transfers)
    if plan is None:
        return FlowCollectiveResult(op, est.algo, est.proto, est.size_bytes, 1, 0.0, est.algbw_Bps, est.busbw_Bps,
                                    (0.0,) * groups.shape[0], 0, ())
    ring_pxn = topo.scaleup_kind != "xgmi_mesh"  # mesh rings leave through their last GPU's NIC (plans.py)
    ptr, links, net_links = _routed(cluster, gpu, topo, plan, groups, pxn if op in P2P_OPS else ring_pxn)
    kernel = np.tile(plan.kernel_Bps, groups.shape[0])
    # links numbered compactly: the topology links it crosses (net_links, increasing), then its kernel links
    local = np.where(links < topo.n_links, np.searchsorted(net_links, links), net_links.size + links - topo.n_links)
    dominated = dominated_hops(np.concatenate([_capacity(topo)[net_links], kernel]), ptr, local)
    for a in (groups, kernel, dominated):
        a.flags.writeable = False
    return _Prepared(est, plan, groups, ptr, links, kernel, net_links, dominated)


def _routed(cluster: ClusterConfig, gpu: GPUSpec, topo: Topology, plan: Plan, groups: np.ndarray, pxn: bool):
    """``_paths`` of a plan on the groups and the topology links they use, read-only; cached in ``_ROUTES`` by
    what the paths depend on (the transfers' endpoints and channels, not their bytes)."""
    digest = hashlib.blake2b(digest_size=16)
    for a in (plan.src, plan.dst, plan.channel, groups):
        digest.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
    key = (cluster, gpu, groups.shape, plan.src.size, pxn, digest.digest())
    hit = _ROUTES.get(key)
    if hit is None:
        ptr, links = _paths(topo, plan, groups, topo.n_links, pxn=pxn)
        hit = (ptr, links, np.unique(links[links < topo.n_links]))
        for a in hit:
            a.flags.writeable = False
        _ROUTES.put(key, hit, sum(a.nbytes for a in hit))
    return hit


@njit(cache=True, nogil=True)
def _claim_links(owner, links, i, met):
    """The collectives ``owner`` records on ``links`` before collective ``i`` (each once, in order of first
    appearance; ``met``: one entry per collective, none equal to ``i`` on entry), then ``owner[links] = i``."""
    out = np.empty(links.shape[0], dtype=np.int64)
    k = 0
    for a in range(links.shape[0]):
        o = owner[links[a]]
        if o >= 0 and met[o] != i:
            met[o] = i
            out[k] = o
            k += 1
        owner[links[a]] = i
    return out[:k]


@njit(cache=True, nogil=True)
def _count_links(count, links):
    """``count[l] += 1`` for each of ``links``."""
    for a in range(links.shape[0]):
        count[links[a]] += 1


def _connected(topo: Topology, preps: list, after: list, focus) -> np.ndarray:
    """bool[n]: the collectives that can change the rates of the ``focus`` ones, i.e. those linked to them by
    a chain of shared topology links or ``after`` orderings (the others cannot: max-min rates depend only on
    the flows of a connected component). One pass: union-find over the collectives, each link remembering the
    last collective that crossed it."""
    n = len(preps)
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner = np.full(topo.n_links, -1, dtype=np.int64)
    met = np.full(n, -1, dtype=np.int64)
    for i, p in enumerate(preps):
        shared = _claim_links(owner, p.net_links, i, met).tolist()  # earlier ones on its links
        for j in shared + ([after[i]] if after[i] is not None else []):
            parent[root(j)] = root(i)
    roots = {root(i) for i in focus}
    return np.array([root(i) in roots for i in range(n)], dtype=bool)


def _reindex(after: list, subset: list) -> list:
    """``after`` restricted to the collectives ``subset`` (orderings on one outside it dropped), renumbered."""
    return [subset.index(after[i]) if after[i] in subset else None for i in subset]


@njit(cache=True, nogil=True)
def _put_paths(ptr, links, dominated, owners, n_topo, net_pos, kernel_base, t_base, out_ptr, out_links, h):
    """A collective's paths (CSR ``ptr``, ``links``) into the window's CSR from hop ``h`` on, its transfer ``t``
    as the window's ``t_base + t`` (offsets to ``out_ptr[t_base + 1 ...]``): a topology link ``l < n_topo`` as
    ``net_pos[l]``, a kernel link ``l`` as ``kernel_base + l - n_topo``; a hop over a link ``dominated`` among
    the collective's own is left out unless another collective of the window crosses that link (``owners[l]``, the
    window's collectives on it, > 1: its transfers may not all cross the dominator). Returns the next free hop."""
    for t in range(ptr.shape[0] - 1):
        for a in range(ptr[t], ptr[t + 1]):
            l = links[a]
            if dominated[a] and (l >= n_topo or owners[l] < 2):
                continue
            out_links[h] = net_pos[l] if l < n_topo else kernel_base + l - n_topo
            h += 1
        out_ptr[t_base + t + 1] = h
    return h


@njit(cache=True, nogil=True)
def _put_deps(dep_ptr, dep_idx, n_groups, t_base, barrier, out_ptr, out_idx, k):
    """A plan's dependencies (CSR over its ``m`` transfers) tiled over ``n_groups`` groups into the window's CSR:
    transfer ``t`` of group ``g`` is the window's ``t_base + g * m + t`` and depends on the window's transfers of
    its plan dependencies in its group; with ``barrier`` >= 0 a transfer with no dependency depends on that
    transfer instead. Entries are written from ``out_idx[k]``, offsets to ``out_ptr[t_base + 1 ...]``; returns
    the next free entry."""
    m = dep_ptr.shape[0] - 1
    for g in range(n_groups):
        shift = t_base + g * m
        for t in range(m):
            if barrier >= 0 and dep_ptr[t + 1] == dep_ptr[t]:
                out_idx[k] = barrier
                k += 1
            for j in range(dep_ptr[t], dep_ptr[t + 1]):
                out_idx[k] = dep_idx[j] + shift
                k += 1
            out_ptr[shift + t + 1] = k
    return k


def _simulate_together(topo: Topology, preps: list, after: list) -> tuple:
    """Run prepared collectives in one flow simulation; a collective with ``after[i] = j`` starts when every
    group of ``j`` has finished (a zero-byte barrier transfer after all of ``j``'s). Returns the netsim
    result (its per-link arrays over the links of this simulation: the topology links the collectives cross,
    in increasing id, then their kernel links), the offsets of each collective's transfers (``n + 1``) and its
    start, seconds (the barrier's finish, else 0).

    Only the topology links some collective crosses are handed to the simulation (a window crosses a tenth of
    a 16,384-GPU fabric's links, and the simulation's checks and per-link arrays are sized by the links it is
    given); they keep their order, so the simulation, which keeps the used links in increasing order, is the
    same as over the whole topology. The window's arrays are written in place, collective by collective.

    Hops over a link that a link of the same collective dominates (:mod:`flowsim.network.dominated_links`: it
    carries a subset of that link's transfers and no less capacity) are left out when no other collective of the
    window crosses the link, so its transfers are still a subset of the dominator's: the max-min rates, hence the
    times, are the same, and the simulation walks shorter paths. Such a link may then carry nothing: its busy
    time in the result is 0."""
    base = np.cumsum([0] + [p.n_transfers for p in preps])
    n = int(base[-1])
    chained = [i for i, a in enumerate(after) if a is not None]
    barrier = {i: n + k for k, i in enumerate(chained)}
    owners = np.zeros(topo.n_links, dtype=np.int64)
    for p in preps:
        _count_links(owners, p.net_links)  # net_links are distinct
    net, net_pos = _compact(owners)
    n_all = n + len(chained)
    route_ptr = np.empty(n_all + 1, dtype=np.int64)
    route_ptr[0] = 0
    links = np.empty(sum(p.links.size for p in preps), dtype=np.int64)
    dep_ptr = np.empty(n_all + 1, dtype=np.int64)
    dep_ptr[0] = 0
    # at most one barrier entry per transfer of a chained collective, then each barrier's
    dep_idx = np.empty(sum(p.groups.shape[0] * p.plan.dep_idx.size for p in preps)
                       + sum(preps[i].n_transfers + preps[after[i]].n_transfers for i in chained), dtype=np.int64)
    size = np.empty(n_all)
    latency = np.empty(n_all)
    # Each collective's paths after the hops before it, its kernel links (numbered from topo.n_links) after the
    # topology links and the kernel links before it, its transfers' dependencies after those before it.
    hops = deps = kernels = 0
    for i, p in enumerate(preps):
        lo, hi = base[i], base[i + 1]
        hops = _put_paths(p.ptr, p.links, p.dominated, owners, topo.n_links, net_pos, net.size + kernels, lo,
                          route_ptr, links, hops)
        kernels += p.kernel_Bps.size
        deps = _put_deps(p.plan.dep_ptr, p.plan.dep_idx, p.groups.shape[0], lo, barrier.get(i, -1), dep_ptr, dep_idx,
                         deps)
        size[lo:hi].reshape(p.groups.shape[0], -1)[:] = p.plan.payload_bytes * p.plan.wire_factor
        latency[lo:hi].reshape(p.groups.shape[0], -1)[:] = p.plan.latency_s
    for i in chained:  # barrier i (no hops, no bytes) waits for every transfer of after[i]
        j, b = after[i], barrier[i]
        route_ptr[b + 1] = hops
        dep_idx[deps:deps + preps[j].n_transfers] = np.arange(base[j], base[j + 1])
        deps += preps[j].n_transfers
        dep_ptr[b + 1] = deps
        size[b], latency[b] = 0.0, preps[j].plan.base_latency_s
    res = simulate(np.concatenate([_capacity(topo)[net]] + [p.kernel_Bps for p in preps]), route_ptr, links[:hops],
                   size, dep_ptr=dep_ptr, dep_idx=dep_idx[:deps], latency_s=latency)
    start = [float(res.finish_s[barrier[i]]) if i in barrier else 0.0 for i in range(len(preps))]
    return res, base, start


def _result(topo: Topology, p: _Prepared, finish_s: np.ndarray, start_s: float,
            utilization: bool = True) -> FlowCollectiveResult:
    """A collective's result from the finish times of its own transfers (``start_s``: when it began); with
    ``utilization`` False its ``link_utilization`` is left empty (it costs a pass over every link)."""
    G, m = p.groups.shape[0], p.plan.n_transfers
    group_t = finish_s.reshape(G, m).max(axis=1) + p.plan.base_latency_s - start_s
    t = float(group_t.max())
    algbw = p.est.size_bytes / t
    util = ()
    if utilization:
        capacity = np.concatenate([_capacity(topo), p.kernel_Bps])
        link_bytes = np.bincount(p.links, weights=np.repeat(np.tile(p.plan.payload_bytes * p.plan.wire_factor, G),
                                                             np.diff(p.ptr)), minlength=capacity.size)
        util = _utilization(topo, link_bytes, capacity, t)
    return FlowCollectiveResult(p.plan.op, p.est.algo, p.est.proto, p.est.size_bytes, p.plan.n_ranks, t, algbw,
                                algbw * busbw_factor(p.plan.op, p.plan.n_ranks), tuple(group_t.tolist()),
                                m * G, util)


def run_collective(cluster: ClusterConfig, gpu: GPUSpec, op: str, size_bytes: float, group_ranks, *,
                   algo: str | None = None, proto: str | None = None, concurrent_groups=1, pxn: bool = True,
                   max_transfers: int = DEFAULT_MAX_TRANSFERS, nccl_version: str = DEFAULT_NCCL_VERSION,
                   collnet: bool = False, utilization: bool = True) -> FlowCollectiveResult:
    """Run one collective per group as flows on the cluster, all groups at once.

    Parameters
    ----------
    cluster : ClusterConfig
        The cluster (its topology is built once and cached).
    gpu : GPUSpec
        The GPU.
    op : str
        One of :data:`flowsim.nccl_models.OPS`.
    size_bytes : float
        Bytes per group, nccl-tests convention; > 0.
    group_ranks : sequence of int
        Global GPU ids of the first group, evenly spaced (``first + k * stride``); see :func:`strided_groups`.
    algo, proto : str, optional
        NCCL_ALGO / NCCL_PROTO overrides. The choice is NCCL's among the algorithms with a plan (Ring, Tree,
        NVLS on one domain, NVLSTree, PAT, and CollNetDirect / CollNetChain with ``collnet``).
    concurrent_groups : int or sequence of sequences of int
        ``k``: the first group and its copies shifted by ``1 .. k-1`` GPUs (e.g. the DP groups of all TP
        ranks); or the other groups' GPU ids. Groups must not share GPUs.
    pxn : bool, optional
        AllToAll / Send/Recv leave the host through the NIC on the destination's rail (NCCL PXN). Rings and
        trees always do (module docstring).
    max_transfers : int, optional
        Per group; see :func:`flowsim.nccl_models.build_plan`.
    nccl_version : str, optional
        NCCL release whose algorithm/protocol choice is modelled (docs/NCCL.md, NCCL releases).
    collnet : bool, optional
        IB SHARP through NCCL's CollNet plugin (NCCL_COLLNET_ENABLE=1): CollNetDirect / CollNetChain become
        available, their reduction resident in the network (transfers to and from the GPUs' leaf switches).
    utilization : bool, optional
        Fill the result's ``link_utilization`` (default); False leaves it empty and saves a pass over every link
        (the step engine reads only the time).

    Returns
    -------
    FlowCollectiveResult

    Raises
    ------
    ConfigError
        Bad op, size, groups (out of range, overlapping, uneven), or an algorithm without a plan.
    """
    topo = cached_topology(cluster, gpu)
    groups = _groups_of(group_ranks, concurrent_groups, topo.num_gpus)
    p = _prepare(cluster, gpu, op, size_bytes, groups, algo, proto, pxn, max_transfers, nccl_version, collnet)
    if isinstance(p, FlowCollectiveResult):
        return p
    res, _, start = _simulate_together(topo, [p], [None])
    return _result(topo, p, res.finish_s, start[0], utilization)


def run_concurrent(cluster: ClusterConfig, gpu: GPUSpec, collectives, *, after=None, focus=None, pxn: bool = True,
                   max_transfers: int = DEFAULT_MAX_TRANSFERS, utilization: bool = True) -> tuple:
    """Run collectives of several kinds (each on its own groups) in one flow simulation, so that they share
    links max-min fairly; each reports its own time.

    Parameters
    ----------
    cluster : ClusterConfig
        The cluster.
    gpu : GPUSpec
        The GPU.
    collectives : sequence of (op, size_bytes, groups)
        ``op`` and ``size_bytes`` as in :func:`run_collective`; ``groups``: the global GPU ids of every group
        that runs it (a list of evenly spaced lists, disjoint, all of one layout). Different collectives may
        use the same GPUs. NCCL's own algorithm and protocol choice.
    after : sequence of (int or None), optional
        ``after[i] = j`` (``j < i``): collective ``i`` starts once every group of ``j`` has finished (one
        stream issuing them in turn); ``None`` (default for all): it starts at time 0.
    focus : sequence of int, optional
        Indices whose times are wanted. Collectives that share no link with them, directly or through other
        collectives (nor an ``after`` ordering), cannot change their rates and are left out (result ``None``).
        Default: all.
    pxn, max_transfers
        As in :func:`run_collective`.
    utilization : bool, optional
        Fill each result's ``link_utilization`` (default); False leaves it empty and saves a pass over every
        link per collective (the step engine reads only the times).

    Returns
    -------
    tuple of (FlowCollectiveResult or None)
        One per collective; ``time_s`` is from the collective's own start (time 0, or the end of its ``after``).

    Raises
    ------
    ConfigError
        As :func:`run_collective`, or a bad ``after`` index.
    """
    topo = cached_topology(cluster, gpu)
    n = len(collectives)
    after = [None] * n if after is None else list(after)
    if len(after) != n or any(a is not None and not 0 <= a < i for i, a in enumerate(after)):
        raise ConfigError("after", "needs one entry per collective, None or the index of an earlier one", after)
    preps = [_prepare(cluster, gpu, op, size, _groups_of(groups[0], groups[1:], topo.num_gpus), None, None, pxn,
                      max_transfers) for op, size, groups in collectives]
    out = [p if isinstance(p, FlowCollectiveResult) else None for p in preps]  # single-rank groups: 0 s
    live = [i for i, p in enumerate(preps) if isinstance(p, _Prepared)]
    keep = _connected(topo, [preps[i] for i in live], _reindex(after, live),
                      [live.index(i) for i in (range(n) if focus is None else focus) if i in live])
    sim = [i for i, k in zip(live, keep) if k]
    if sim:
        res, base, start = _simulate_together(topo, [preps[i] for i in sim], _reindex(after, sim))
        for k, i in enumerate(sim):
            out[i] = _result(topo, preps[i], res.finish_s[base[k]:base[k + 1]], start[k], utilization)
    return tuple(out)
