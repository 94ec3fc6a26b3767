"""Flow-level event simulation of transfers sharing links at max-min fair rates.

A transfer is ``size_bytes`` sent along a path of links (from :mod:`flowsim.network.routing`). It becomes *ready*
at ``max(release_s, finish of every transfer it depends on)``; from then on (``start_s``) its bytes drain at
its max-min fair rate, which changes whenever a transfer starts or finishes draining; when the last byte
has drained, the transfer *finishes* ``latency_s`` later (``finish_s``). The latency is a pure delay (the
fluid model has no queueing): it delays the transfer's dependents but does not hold the links.

Event loop (research notes ``research/maxmin-and-traces.md`` sec. 0.4-0.7 and A10):

* the next event is the earlier of the next ready time (a heap of ready transfers) and the next projected
  drain end (a heap keyed by ``t_last + remaining / rate``, updated only for transfers whose rate changed);
* every drain end and ready time within ``rtol`` (relative, of the current time) of the earliest is handled
  in the same batch, so the many equal transfers of a collective step cost one re-solve;
* rates are re-solved incrementally (:mod:`flowsim.network.maxmin_kernels`, local method with the level
  restart as fallback): rates below the smallest departing rate and below the arrivals' lower bound are kept, and only
  transfers connected to a change through links are revisited, so independent components (rails, groups)
  are not re-solved;
* remaining bytes are advanced lazily, only for transfers whose rate changes;
* independent components (rail planes, groups that share no link) can be simulated in parallel threads
  (:mod:`flowsim.network.parallel`, :mod:`flowsim.network.components`);
* by symmetry (:mod:`flowsim.network.symmetry`), one transfer per class of interchangeable transfers (the
  coarsest equitable partition: e.g. the data-parallel rings of the eight rails, the ranks of an all-to-all
  behind one leaf) is simulated with the class size as its max-min weight, its times copied to the others.

A transfer with 0 bytes or an empty path (source = destination) drains instantly.
"""
from __future__ import annotations

import functools
import threading
from dataclasses import dataclass

import numpy as np
from numba import njit

from flowsim.errors import ConfigError
from flowsim.network import parallel
from flowsim.network.components import split
from flowsim.network.maxmin import LOCAL_MAX_ROUNDS, _check_routes
from flowsim.network.maxmin_kernels import (_arrival_bound, _fill_arrivals, _link_csr, _link_offsets, _resolve,
                                            _resolve_local)
from flowsim.network.net_heap import _heap_pop, _heap_push, _heap_update, _run_order
from flowsim.network.symmetry import Quotient, quotient

__all__ = ["NetSimResult", "simulate", "simulate_transfers"]

LOCAL_MAX_FRACTION = 0.25
"""The local re-solve gives up (for the level restart) once it re-fills more than this fraction of the
draining transfers: beyond that a restart costs about the same. A cost cap only (both methods are exact),
set by hand from benchmarks/bench_network.py."""

PARALLEL_MIN_TRANSFERS = 2048
"""Simulations with fewer transfers run on one thread: below this, splitting them into components and starting
the threads costs about as much as it saves. A cost cap only (the results are the same), set by hand from
benchmarks/bench_flow_scaling.py."""


@dataclass(frozen=True, eq=False)
class NetSimResult:
    """Outcome of a flow-level simulation.

    Attributes
    ----------
    start_s : float64[n_transfers]
        When each transfer became ready and started draining, seconds.
    finish_s : float64[n_transfers]
        When its last byte arrived (drain end + latency), seconds.
    capacity_Bps : float64[n_links]
        Link capacities used, bytes/s.
    link_bytes : float64[n_links]
        Bytes each link carried (summed from the paths on first read: the step engine reads only times).
    link_busy_s : float64[n_links]
        Time during which at least one transfer was draining through each link, seconds.
    makespan_s : float
        Latest finish (0 without transfers), seconds.
    n_solves : int
        Rate re-solves (event batches that changed the set of draining transfers) of the simulation run: with
        symmetry, of its quotient.
    """

    start_s: np.ndarray
    finish_s: np.ndarray
    capacity_Bps: np.ndarray
    link_busy_s: np.ndarray
    makespan_s: float
    n_solves: int
    _paths: tuple  # (route_ptr, used, hops as positions in used, size_bytes): the simulation's own, for link_bytes

    @functools.cached_property
    def link_bytes(self) -> np.ndarray:
        """float64[n_links]: bytes each link carried, bytes (summed in hop order, as ``np.bincount``)."""
        route_ptr, used, local, size = self._paths
        out = np.zeros(self.capacity_Bps.size)
        out[used] = np.bincount(local, weights=np.repeat(size, np.diff(route_ptr)), minlength=used.size)
        return out

    @property
    def link_utilization(self) -> np.ndarray:
        """float64[n_links]: bytes carried / (capacity * makespan), in [0, 1] (0 when the makespan is 0)."""
        if self.makespan_s <= 0:
            return np.zeros_like(self.capacity_Bps)
        return self.link_bytes / (self.capacity_Bps * self.makespan_s)

    def to_dict(self) -> dict:
        """Plain mapping: scalars and per-transfer / per-link lists (units in the key names)."""
        return {"makespan_s": self.makespan_s, "n_solves": self.n_solves, "n_transfers": int(self.start_s.size),
                "start_s": self.start_s.tolist(), "finish_s": self.finish_s.tolist(),
                "link_bytes": self.link_bytes.tolist(), "link_busy_s": self.link_busy_s.tolist(),
                "link_utilization": self.link_utilization.tolist()}

    def to_frame(self):
        """pandas DataFrame, one row per transfer: ``start_s``, ``finish_s``, ``duration_s``."""
        import pandas as pd

        return pd.DataFrame({"start_s": self.start_s, "finish_s": self.finish_s,
                             "duration_s": self.finish_s - self.start_s})

    def __repr__(self) -> str:
        return (f"NetSimResult({self.start_s.size} transfers, makespan {self.makespan_s:.6g} s, "
                f"{self.n_solves} solves)")


@njit(cache=True, nogil=True)
def _done(t, now, latency_s, finish_s, next_ptr, next_idx, deps_left, ready_s, arr_heap, arr_key, arr_pos,
          n_arr):
    """Record that transfer ``t`` drained at ``now``; release its dependents whose last dependency it was.

    Parameters
    ----------
    t : int
        Transfer id.
    now : float
        Drain end, seconds.
    latency_s : float64[n_transfers]
        Latency of each transfer, seconds.
    finish_s : float64[n_transfers]
        Out: ``finish_s[t] = now + latency_s[t]``.
    next_ptr, next_idx : int64[n_transfers + 1], int64[n_deps]
        CSR of dependents (transfer -> transfers that wait for it).
    deps_left : int64[n_transfers]
        Unfinished dependencies of each transfer (decremented).
    ready_s : float64[n_transfers]
        Ready time of each transfer (raised to the finish of its dependencies).
    arr_heap, arr_key, arr_pos : int64[n_transfers], float64[n_transfers], int64[n_transfers]
        Heap of ready transfers keyed by ready time.
    n_arr : int
        Its size.

    Returns
    -------
    int
        The new size of the ready heap.
    """
    finish_s[t] = now + latency_s[t]
    for j in range(next_ptr[t], next_ptr[t + 1]):
        d = next_idx[j]
        ready_s[d] = max(ready_s[d], finish_s[t])
        deps_left[d] -= 1
        if deps_left[d] == 0:
            n_arr = _heap_push(arr_heap, arr_key, arr_pos, n_arr, d, ready_s[d])
    return n_arr


@njit(cache=True, nogil=True)
def _compact(count):
    """The ids with a count > 0 (increasing), and each id's position among them (``pos``; meaningless for an id
    with none)."""
    kept = np.empty(count.shape[0] + 1, dtype=np.int64)
    pos = np.empty(count.shape[0], dtype=np.int64)
    k = 0
    for l in range(count.shape[0]):  # without branches: kept and dropped ids alternate irregularly
        kept[k] = l
        pos[l] = k
        k += count[l] > 0
    return kept[:k].copy(), pos


@njit(cache=True, nogil=True)
def _used_links(n_links, route_links):
    """The links some path uses (increasing) and the paths' hops renumbered into that list.

    Returns
    -------
    used : int64[n_used]
        Original ids.
    local : int64[n_hops]
        ``route_links`` as positions in ``used`` (the order of links is kept).
    """
    hit = np.zeros(n_links, dtype=np.int64)
    for h in range(route_links.shape[0]):
        hit[route_links[h]] = 1
    used, pos = _compact(hit)
    local = np.empty(route_links.shape[0], dtype=np.int64)
    for h in range(route_links.shape[0]):
        local[h] = pos[route_links[h]]
    return used, local


@njit(cache=True, nogil=True)
def _activate(t, now, weights, route_ptr, route_links, link_ptr, link_end, active, active_weight, busy_since):
    """Start transfer ``t`` draining at ``now``: insert it into the active segment ``active[link_ptr[l]:link_end[l]]``
    of each link of its path (kept increasing, the order of ``_link_csr``'s lists, so the solver's sums run in the
    same order as over the whole lists; once per hop, as a path may cross a link twice), add its weight to the link's
    ``active_weight`` and start the link's busy period (``busy_since``) when it was idle."""
    w = weights[t]
    for h in range(route_ptr[t], route_ptr[t + 1]):
        l = route_links[h]
        k = link_end[l]
        while k > link_ptr[l] and active[k - 1] > t:
            active[k] = active[k - 1]
            k -= 1
        active[k] = t
        link_end[l] += 1
        if active_weight[l] == 0.0:
            busy_since[l] = now
        active_weight[l] += w


@njit(cache=True, nogil=True)
def _deactivate(t, now, weights, route_ptr, route_links, link_ptr, link_end, active, active_weight, busy_since,
                link_busy_s):
    """Stop transfer ``t`` at ``now`` (``_activate`` undone, one entry per hop): a link whose active weight falls to 0
    adds its busy period to ``link_busy_s``."""
    w = weights[t]
    for h in range(route_ptr[t], route_ptr[t + 1]):
        l = route_links[h]
        k = link_ptr[l]
        while active[k] != t:
            k += 1
        link_end[l] -= 1
        for j in range(k, link_end[l]):
            active[j] = active[j + 1]
        active_weight[l] -= w
        if active_weight[l] == 0.0:  # weights are whole numbers: the sums are exact
            link_busy_s[l] += now - busy_since[l]


@njit(cache=True, nogil=True)
def _same_flows(link_ptr, link_flows, a, b):
    """Whether links ``a`` and ``b`` carry the same transfers (``_link_csr``'s increasing lists)."""
    if link_ptr[a + 1] - link_ptr[a] != link_ptr[b + 1] - link_ptr[b]:
        return False
    for j in range(link_ptr[a + 1] - link_ptr[a]):
        if link_flows[link_ptr[a] + j] != link_flows[link_ptr[b] + j]:
            return False
    return True


@njit(cache=True, nogil=True)
def _distinct_links(capacity_Bps, route_ptr, route_links):
    """The links that can bind: of the links that carry exactly the same transfers (a transfer's own PCIe and NIC
    hops at both ends, a chain's links used by its steps alone), only the first in (capacity, id) order.

    Such links have the same draining transfers at every moment, so the same load and the same busy times, and
    the one with the least capacity is always the tighter: max-min filling pops it first (its share is the
    smallest; ties go to the smaller id) and freezes the transfers that the others would have frozen at the same
    rate. Dropping the others changes no rate and no time (the certificate of the local re-solve, the arrival
    bound and every sum run over the same transfers with the same values) and leaves the event loop fewer links
    and hops (a llama3.1-405b window: 126,838 links and 223,296 hops -> 75,527 and 139,021). Links with no
    transfer are kept.

    Parameters
    ----------
    capacity_Bps : float64[n_links]
        Link capacities, bytes/s.
    route_ptr, route_links : int64[n_transfers + 1], int64[n_hops]
        Paths (CSR).

    Returns
    -------
    keep : int64[n_kept]
        The links kept, increasing (so their order, which breaks ties in the solver's heap, is kept).
    link_of : int64[n_links]
        For each link, the position in ``keep`` of the kept link that carries the same transfers.
    kept_ptr, kept_links : int64[n_transfers + 1], int64[n_kept_hops]
        The paths over the kept links (positions in ``keep``), hops in their order.
    """
    n_links = capacity_Bps.shape[0]
    link_ptr, link_flows = _link_csr(n_links, route_ptr, route_links)
    # Equal lists start with the same transfer, whose path crosses all their links: each link is compared only with
    # the links before it on the path of its list's first transfer that it is also first on (a few hops), gathered
    # in path order into ``own`` first.
    head = np.arange(n_links)  # the first link met with the same list
    n = route_ptr.shape[0] - 1
    longest = 0
    for t in range(n):
        longest = max(longest, route_ptr[t + 1] - route_ptr[t])
    own = np.empty(longest, dtype=np.int64)
    for t in range(n):
        n_own = 0
        for hop in range(route_ptr[t], route_ptr[t + 1]):
            l = route_links[hop]
            if link_flows[link_ptr[l]] == t:
                own[n_own] = l
                n_own += 1
        for i in range(n_own):
            l = own[i]
            if head[l] != l:
                continue
            for j in range(i):
                m = own[j]
                if m == l:  # the path crosses l twice: l was met at its first crossing
                    break
                if head[m] == m and _same_flows(link_ptr, link_flows, l, m):
                    head[l] = m
                    break
    best = np.arange(n_links)
    for l in range(n_links):
        b = best[head[l]]
        if capacity_Bps[l] < capacity_Bps[b] or (capacity_Bps[l] == capacity_Bps[b] and l < b):
            best[head[l]] = l
    new_id = np.full(n_links, -1, dtype=np.int64)
    n_kept = 0
    for l in range(n_links):
        if best[head[l]] == l:
            new_id[l] = n_kept
            n_kept += 1
    keep = np.empty(n_kept, dtype=np.int64)
    link_of = np.empty(n_links, dtype=np.int64)
    for l in range(n_links):
        if new_id[l] >= 0:
            keep[new_id[l]] = l
        link_of[l] = new_id[best[head[l]]]
    kept_ptr = np.zeros(n + 1, dtype=np.int64)
    kept_links = np.empty(route_links.shape[0], dtype=np.int64)
    k = 0
    for t in range(n):
        for hop in range(route_ptr[t], route_ptr[t + 1]):
            l = route_links[hop]
            if new_id[l] >= 0:
                kept_links[k] = new_id[l]
                k += 1
        kept_ptr[t + 1] = k
    return keep, link_of, kept_ptr, kept_links[:k]


@njit(cache=True, nogil=True)
def _workspace_size(n, n_links, n_hops):
    """Entries of the int64 and float64 work buffers of :func:`_event_loop_in` for ``n`` transfers, ``n_links``
    links and ``n_hops`` path hops."""
    return (n_hops + 1) // 2 + 9 * n_links + 14 * n + 1, 8 * n + 7 * n_links


@njit(cache=True, nogil=True)
def _simulate(capacity_Bps, route_ptr, route_links, size_bytes, release_s, dep_ptr, dep_idx, latency_s, weights,
              max_rounds, rtol):
    """:func:`_event_loop` on the links that can bind (:func:`_distinct_links`); the same outputs, each dropped
    link's busy time that of the kept link with its transfers."""
    keep, link_of, kept_ptr, kept_links = _distinct_links(capacity_Bps, route_ptr, route_links)
    if keep.shape[0] == capacity_Bps.shape[0]:
        return _event_loop(capacity_Bps, route_ptr, route_links, size_bytes, release_s, dep_ptr, dep_idx,
                           latency_s, weights, max_rounds, rtol)
    start_s, finish_s, kept_busy_s, n_solves = _event_loop(capacity_Bps[keep], kept_ptr, kept_links, size_bytes,
                                                           release_s, dep_ptr, dep_idx, latency_s, weights,
                                                           max_rounds, rtol)
    return start_s, finish_s, kept_busy_s[link_of], n_solves


@njit(cache=True, nogil=True)
def _event_loop(capacity_Bps, route_ptr, route_links, size_bytes, release_s, dep_ptr, dep_idx, latency_s, weights,
                max_rounds, rtol):
    """:func:`_event_loop_in` with work buffers of its own."""
    n_int, n_float = _workspace_size(size_bytes.shape[0], capacity_Bps.shape[0], route_links.shape[0])
    return _event_loop_in(capacity_Bps, route_ptr, route_links, size_bytes, release_s, dep_ptr, dep_idx, latency_s,
                          weights, max_rounds, rtol, np.empty(n_int, dtype=np.int64), np.empty(n_float))


@njit(cache=True, nogil=True)
def _event_loop_in(capacity_Bps, route_ptr, route_links, size_bytes, release_s, dep_ptr, dep_idx, latency_s,
                   weights, max_rounds, rtol, iw, fw):
    """The event loop (see the module docstring).

    Parameters
    ----------
    capacity_Bps : float64[n_links]
        Link capacities, bytes/s, > 0.
    route_ptr, route_links : int64[n_transfers + 1], int64[n_hops]
        Path of each transfer (CSR), link ids in [0, n_links).
    size_bytes : float64[n_transfers]
        Bytes of each transfer, finite, >= 0.
    release_s : float64[n_transfers]
        Earliest start of each transfer, seconds, finite, >= 0 (the order of :func:`_run_order`'s keys).
    dep_ptr, dep_idx : int64[n_transfers + 1], int64[n_deps]
        CSR of dependencies: transfer t waits for ``dep_idx[dep_ptr[t]:dep_ptr[t + 1]]``.
    latency_s : float64[n_transfers]
        Delay between drain end and finish, seconds, >= 0.
    weights : float64[n_transfers]
        Multiplicity of each transfer (> 0): it stands for that many identical transfers, each at its rate
        (:mod:`flowsim.network.maxmin`); 1 but in a quotient (:mod:`flowsim.network.symmetry`).
    max_rounds : int
        Rounds of the local re-solve before falling back to the level restart (``maxmin_kernels._resolve_local``).
    rtol : float
        Relative tolerance for batching events and for the local re-solve's certificate, in [0, 1e-3).
    iw, fw : int64[>= n_int], float64[>= n_float]
        Work buffers (:func:`_workspace_size`), overwritten: the solver's per-transfer and per-link state is cut
        from them and given its initial values here, so that a caller can keep them across simulations instead of
        allocating tens of megabytes each time (fresh memory costs page faults: docs/PERFORMANCE.md, session 10).

    Returns
    -------
    start_s, finish_s : float64[n_transfers]
        NaN for transfers that never became ready (a dependency cycle).
    link_busy_s : float64[n_links]
        Time with at least one draining transfer, seconds.
    n_solves : int
        Number of re-solves.
    """
    n_links = capacity_Bps.shape[0]
    n = size_bytes.shape[0]
    link_ptr = _link_offsets(n_links, route_links)  # the lists are built by _activate, draining transfers only
    # The solver visits each link's draining transfers only: active[link_ptr[l]:link_end[l]], kept in
    # increasing id by _activate / _deactivate (a link of a long chain carries all its steps, one at a time).
    n_hops = route_links.shape[0]
    # int64 work: half an entry per hop, 9 per link, 14 per transfer, 1 (_workspace_size). The paths and the
    # links' lists of draining transfers in int32 (ids below 2**31: arrays of that many float64 would not fit in
    # memory), halving the memory that their walks read.
    hops = route_links.astype(np.int32)
    o = (n_hops + 1) // 2
    active = iw[:o].view(np.int32)[:n_hops]
    link_end, link_mark, changed_mark, touched, changed, l_heap, l_pos, n_diff, link_part = (
        iw[o:o + n_links], iw[o + n_links:o + 2 * n_links], iw[o + 2 * n_links:o + 3 * n_links],
        iw[o + 3 * n_links:o + 4 * n_links], iw[o + 4 * n_links:o + 5 * n_links],
        iw[o + 5 * n_links:o + 6 * n_links], iw[o + 6 * n_links:o + 7 * n_links], iw[o + 7 * n_links:o + 8 * n_links],
        iw[o + 8 * n_links:o + 9 * n_links])
    o += 9 * n_links
    deps_left, arr_heap, arr_pos, fin_heap, fin_pos, seeds, flow_mark, todo, saved_bott, bott, prev_bott = (
        iw[o:o + n], iw[o + n:o + 2 * n], iw[o + 2 * n:o + 3 * n], iw[o + 3 * n:o + 4 * n], iw[o + 4 * n:o + 5 * n],
        iw[o + 5 * n:o + 6 * n], iw[o + 6 * n:o + 7 * n], iw[o + 7 * n:o + 8 * n], iw[o + 8 * n:o + 9 * n],
        iw[o + 9 * n:o + 10 * n], iw[o + 10 * n:o + 11 * n])
    part, comp_mark, sub = iw[o + 11 * n:o + 12 * n], iw[o + 12 * n:o + 13 * n], iw[o + 13 * n:o + 14 * n]
    clock = iw[o + 14 * n:o + 14 * n + 1]
    # float64 work: 8 per transfer, 7 per link
    ready_s, rate, committed, remaining, t_last, arr_key, fin_key, prev_rate = (
        fw[:n], fw[n:2 * n], fw[2 * n:3 * n], fw[3 * n:4 * n], fw[4 * n:5 * n], fw[5 * n:6 * n], fw[6 * n:7 * n],
        fw[7 * n:8 * n])
    o = 8 * n
    active_weight, busy_since, l_key, resid = fw[o:o + n_links], fw[o + n_links:o + 2 * n_links], \
        fw[o + 2 * n_links:o + 3 * n_links], fw[o + 3 * n_links:o + 4 * n_links]
    state = fw[o + 4 * n_links:o + 7 * n_links].reshape((n_links, 3))
    link_end[:] = link_ptr[:-1]
    next_ptr, next_idx = _link_csr(n, dep_ptr, dep_idx)  # dependency -> dependents

    start_s = np.full(n, np.nan)
    finish_s = np.full(n, np.nan)
    ready_s[:] = release_s
    for t in range(n):
        deps_left[t] = dep_ptr[t + 1] - dep_ptr[t]
    rate[:] = 0.0  # solver state: -1 unassigned, 0 inactive, > 0 draining
    committed[:] = 0.0  # the rate the remaining bytes were last advanced with
    remaining[:] = size_bytes
    t_last[:] = 0.0
    active_weight[:] = 0.0
    busy_since[:] = 0.0
    link_busy_s = np.zeros(n_links)

    arr_pos[:] = -1
    fin_pos[:] = -1
    n_arr = 0
    n_fin = 0
    # The transfers without dependencies wait in a run sorted by (release, id), the others in the heap once their
    # dependencies finish; arrivals are taken from both in (ready time, id) order, that of one heap over all of
    # them, without a heap's push and pop for each of the many transfers released at the start.
    n_roots = 0
    for t in range(n):
        if deps_left[t] == 0:
            arr_heap[n_roots] = t
            n_roots += 1
    roots = arr_heap[:n_roots].copy()
    root_run = roots[_run_order(roots, release_s[roots])]
    p_root = 0

    clock[0] = 0
    link_mark[:] = -1
    changed_mark[:] = -1
    n_diff[:] = 0
    flow_mark[:] = -1
    bott[:] = -1
    state[:] = 0.0
    l_pos[:] = -1
    n_active = 0
    n_solves = 0

    while n_arr > 0 or n_fin > 0 or p_root < n_roots:
        t_next = np.inf
        if n_arr > 0:
            t_next = arr_key[0]
        if p_root < n_roots:
            t_next = min(t_next, release_s[root_run[p_root]])
        if n_fin > 0:
            t_next = min(t_next, fin_key[0])
        now = t_next
        window = now + rtol * abs(now)
        n_seeds = 0
        n_arrived = 0
        level = np.inf
        while n_fin > 0 and fin_key[0] <= window:
            t, n_fin = _heap_pop(fin_heap, fin_key, fin_pos, n_fin)
            n_active -= 1
            level = min(level, committed[t])
            rate[t] = 0.0
            committed[t] = 0.0
            _deactivate(t, now, weights, route_ptr, hops, link_ptr, link_end, active, active_weight, busy_since,
                        link_busy_s)
            seeds[n_seeds] = t
            n_seeds += 1
            n_arr = _done(t, now, latency_s, finish_s, next_ptr, next_idx, deps_left, ready_s, arr_heap, arr_key,
                          arr_pos, n_arr)
        while True:
            from_run = p_root < n_roots and release_s[root_run[p_root]] <= window
            if n_arr > 0 and arr_key[0] <= window and (not from_run or arr_key[0] < release_s[root_run[p_root]] or (
                    arr_key[0] == release_s[root_run[p_root]] and arr_heap[0] < root_run[p_root])):
                t, n_arr = _heap_pop(arr_heap, arr_key, arr_pos, n_arr)
            elif from_run:
                t = root_run[p_root]
                p_root += 1
            else:
                break
            start_s[t] = now
            if size_bytes[t] == 0.0 or route_ptr[t + 1] == route_ptr[t]:
                n_arr = _done(t, now, latency_s, finish_s, next_ptr, next_idx, deps_left, ready_s, arr_heap,
                              arr_key, arr_pos, n_arr)
                continue
            rate[t] = -1.0
            n_active += 1
            t_last[t] = now
            _activate(t, now, weights, route_ptr, hops, link_ptr, link_end, active, active_weight, busy_since)
            seeds[n_seeds] = t
            n_seeds += 1
            n_arrived += 1
        if n_seeds == 0:
            continue
        for i in range(n_seeds):
            t = seeds[i]
            if rate[t] < 0.0:
                level = min(level, _arrival_bound(capacity_Bps, route_ptr, hops, active_weight, t))
        level *= 1.0 - rtol
        n_solves += 1
        if n_arrived == n_seeds == n_active:
            # Every draining transfer has just arrived (a window's start, a chain's next step): fill them all
            # from scratch (the level restart at level 0), which the local re-solve would do in its first round
            # before checking a certificate that cannot fail, as no transfer is fixed.
            n_todo = _fill_arrivals(capacity_Bps, route_ptr, hops, link_ptr, link_end, active, weights, rate,
                                    seeds, n_seeds, clock, link_mark, todo, touched, state, l_heap, l_key, l_pos, bott)
        else:
            # Local re-solve while the re-filled set stays below LOCAL_MAX_FRACTION of the draining transfers;
            # else the level restart (both exact; see flowsim.network.maxmin).
            n_todo = _resolve_local(capacity_Bps, route_ptr, hops, link_ptr, link_end, active, weights, rate,
                                    committed, bott, seeds, n_seeds, clock, link_mark, changed_mark, flow_mark,
                                    todo, saved_bott, touched, changed, state, l_heap, l_key, l_pos, resid, n_diff,
                                    prev_rate, prev_bott, part, comp_mark, sub, link_part,
                                    max(64, int(n_active * LOCAL_MAX_FRACTION)), max_rounds,
                                    rtol)
            if n_todo < 0:
                n_todo = _resolve(capacity_Bps, route_ptr, hops, link_ptr, link_end, active, weights, rate,
                                  level, seeds, n_seeds, clock, link_mark, flow_mark, todo, touched, state, l_heap,
                                  l_key, l_pos, bott)
        for i in range(n_todo):
            t = todo[i]
            x = rate[t]
            if x == committed[t]:
                continue
            remaining[t] = max(remaining[t] - committed[t] * (now - t_last[t]), 0.0)
            t_last[t] = now
            committed[t] = x
            key = now + remaining[t] / x
            if fin_pos[t] >= 0:
                _heap_update(fin_heap, fin_key, fin_pos, n_fin, t, key)
            else:
                n_fin = _heap_push(fin_heap, fin_key, fin_pos, n_fin, t, key)
    return start_s, finish_s, link_busy_s, n_solves


WORK_BUFFER_MAX_BYTES = 32 * 2**20
"""Bytes of event-loop work buffers kept per thread between simulations (:func:`_work_buffers`). Fresh buffers
for every simulation cost page faults and clearing, as glibc returns freed memory to the system (llama3.1-405b's
69 event loops: 0.87-0.93 -> 0.64-0.72 s with them kept, its largest simulation needing 20 MB); buffers kept
for the largest simulations at 65,536 GPUs (40-60 MB) would lift that case's peak memory past issue 22's 500 MB
(452 -> 501 MB measured). A memory cap only (the results do not depend on it), set by hand from
benchmarks/bench_flow_scaling.py."""

_WORK = threading.local()


def _simulate_reusing(capacity_Bps, route_ptr, route_links, size, release, dep_ptr, dep_idx, latency, weights,
                      rtol) -> tuple:
    """:func:`_simulate` with this thread's work buffers (:func:`_work_buffers`, sized for the links that can bind);
    the same outputs (when every link is kept, the kept paths are the paths)."""
    keep, link_of, kept_ptr, kept_links = _distinct_links(capacity_Bps, route_ptr, route_links)
    start_s, finish_s, kept_busy_s, n_solves = _event_loop_in(
        capacity_Bps[keep], kept_ptr, kept_links, size, release, dep_ptr, dep_idx, latency, weights,
        LOCAL_MAX_ROUNDS, rtol, *_work_buffers(size.shape[0], keep.shape[0], kept_links.shape[0]))
    return start_s, finish_s, kept_busy_s[link_of], n_solves


def _work_buffers(n: int, n_links: int, n_hops: int) -> tuple:
    """The int64 and float64 work buffers of a simulation of ``n`` transfers, ``n_links`` links and ``n_hops`` hops
    (:func:`_event_loop_in`): kept per thread and grown, never shrunk, so that the simulations of a step re-use one
    allocation, up to :data:`WORK_BUFFER_MAX_BYTES`; a larger simulation gets buffers of its own, and the kept ones
    are dropped."""
    n_int, n_float = _workspace_size(n, n_links, n_hops)
    if 8 * (n_int + n_float) > WORK_BUFFER_MAX_BYTES:
        _WORK.iw = _WORK.fw = None  # not held beside a large simulation's own: its peak memory stays as it was
        return np.empty(n_int, dtype=np.int64), np.empty(n_float)
    if getattr(_WORK, "iw", None) is None or _WORK.iw.size < n_int:
        _WORK.iw = np.empty(n_int, dtype=np.int64)
    if getattr(_WORK, "fw", None) is None or _WORK.fw.size < n_float:
        _WORK.fw = np.empty(n_float)
    return _WORK.iw, _WORK.fw


def _run(capacity_Bps, route_ptr, route_links, size, release, dep_ptr, dep_idx, latency, weights, rtol) -> tuple:
    """:func:`_simulate`, with the independent components (:mod:`flowsim.network.components`) dealt into
    :func:`flowsim.network.parallel.threads` bins simulated in parallel threads when there are
    :data:`PARALLEL_MIN_TRANSFERS` transfers or more; the same outputs."""
    n = size.shape[0]
    threads = parallel.threads()
    parts = (split(threads, capacity_Bps.size, route_ptr, route_links, dep_ptr, dep_idx)
             if threads > 1 and n >= PARALLEL_MIN_TRANSFERS else [])
    if not parts:
        return _simulate_reusing(capacity_Bps, route_ptr, route_links, size, release, dep_ptr, dep_idx, latency,
                                 weights, rtol)

    def one(part):
        ids, links, ptr, hops, dptr, deps = part
        return _simulate_reusing(capacity_Bps[links], ptr, hops, size[ids], release[ids], dptr, deps, latency[ids],
                                 weights[ids], rtol)

    start, finish, busy, n_solves = np.empty(n), np.empty(n), np.zeros(capacity_Bps.size), 0
    for (ids, links, *_), (s, f, b, k) in zip(parts, parallel.map_ordered(one, parts)):
        start[ids], finish[ids], busy[links] = s, f, b
        n_solves += k
    return start, finish, busy, n_solves


def _floats(name: str, a, n: int, default: float, lower: float) -> np.ndarray:
    if a is None:
        return np.full(n, default)
    arr = np.asarray(a, dtype=np.float64)
    if arr.ndim == 0:
        arr = np.full(n, float(arr))
    if arr.shape != (n,):
        raise ConfigError(name, f"must have one entry per transfer, {n}", f"shape {arr.shape}")
    bad = ~(np.isfinite(arr) & (arr >= lower))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ConfigError(name, f"must be finite and >= {lower:g}", f"{float(arr[i])!r} at transfer {i}")
    return np.ascontiguousarray(arr)


def _simulate_quotient(q: Quotient, capacity_Bps, size, release, latency, rtol: float) -> tuple:
    """:func:`_simulate` of one transfer per class of interchangeable ones, weighted by the class size, its times
    copied to the class's transfers and each link class's busy time to its links."""
    t = q.transfers
    start, finish, busy, n_solves = _run(q.capacity_Bps, q.route_ptr, q.route_links, size[t], release[t], q.dep_ptr,
                                         q.dep_idx, latency[t], q.weights, rtol)
    link_busy_s = np.zeros(capacity_Bps.size)
    used = q.link_of >= 0
    link_busy_s[used] = busy[q.link_of[used]]
    return start[q.transfer_of], finish[q.transfer_of], link_busy_s, n_solves


def simulate(capacity_Bps, route_ptr, route_links, size_bytes, *, release_s=None, dep_ptr=None, dep_idx=None,
             latency_s=None, rtol: float = 1e-9, symmetry: bool = True) -> NetSimResult:
    """Simulate transfers over links; return start and finish times and per-link busy time.

    Parameters
    ----------
    capacity_Bps : float64[n_links]
        Link capacity, bytes/s, finite and > 0.
    route_ptr : int[n_transfers + 1]
        CSR offsets of the paths (as :class:`flowsim.network.routing.Routes` ``ptr``).
    route_links : int[n_hops]
        Link ids, in [0, n_links).
    size_bytes : float64[n_transfers]
        Bytes per transfer, finite, >= 0.
    release_s : float64[n_transfers] or float, optional
        Earliest start, seconds, finite, >= 0; default 0.
    dep_ptr, dep_idx : int[n_transfers + 1], int[n_deps], optional
        Dependencies (CSR): transfer t starts only after every transfer of ``dep_idx[dep_ptr[t]:dep_ptr[t+1]]``
        has finished. Default: none.
    latency_s : float64[n_transfers] or float, optional
        Delay from drain end to finish, seconds, >= 0 (path latency plus software latency); default 0.
    rtol : float
        Relative tolerance in [0, 1e-3) for batching events (and the re-solve's certificate); default 1e-9.
    symmetry : bool, optional
        Simulate one transfer per class of interchangeable ones, weighted by the class size, and copy its times
        to the others (:mod:`flowsim.network.symmetry`; default). Times agree with the explicit simulation
        (``False``) to about ``rtol`` relative.

    Returns
    -------
    NetSimResult

    Raises
    ------
    ConfigError
        Bad transfer input (NaN bytes, negative times, dependency ids out of range or cyclic).
    ValueError
        Bad link or path arrays (see :func:`flowsim.network.maxmin.solve`).

    Examples
    --------
    One 1 GB transfer over a 100 GB/s link with 2 us latency finishes at 2e-6 + 1e9 / 1e11 = 0.010002 s:

    >>> simulate([1e11], [0, 1], [0], [1e9], latency_s=2e-6).finish_s.tolist()
    [0.010002]
    """
    capacity_Bps, route_ptr, route_links, _ = _check_routes(capacity_Bps, route_ptr, route_links, None, rtol)
    n = route_ptr.size - 1
    size = _floats("size_bytes", size_bytes, n, 0.0, 0.0)
    release = _floats("release_s", release_s, n, 0.0, 0.0)
    latency = _floats("latency_s", latency_s, n, 0.0, 0.0)
    if (dep_ptr is None) != (dep_idx is None):
        raise ConfigError("dep_ptr", "dep_ptr and dep_idx must be given together")
    if dep_ptr is None:
        dep_ptr = np.zeros(n + 1, dtype=np.int64)
        dep_idx = np.zeros(0, dtype=np.int64)
    dep_ptr = np.ascontiguousarray(dep_ptr, dtype=np.int64)
    dep_idx = np.ascontiguousarray(dep_idx, dtype=np.int64)
    if dep_ptr.shape != (n + 1,) or dep_ptr[0] != 0 or dep_ptr[-1] != dep_idx.size or np.any(np.diff(dep_ptr) < 0):
        raise ConfigError("dep_ptr", f"must be CSR offsets: {n + 1} non-decreasing entries from 0 to "
                          f"len(dep_idx) = {dep_idx.size}")
    if dep_idx.size and (dep_idx.min() < 0 or dep_idx.max() >= n):
        i = int(np.flatnonzero((dep_idx < 0) | (dep_idx >= n))[0])
        raise ConfigError("dep_idx", f"transfer ids must be in [0, {n})", f"{int(dep_idx[i])} at entry {i}")
    # The used links only, renumbered in increasing order (the per-link arrays of the quotient and the event loop
    # are sized by the links: a step's window uses a tenth of a 16,384-GPU fabric's).
    used, links = _used_links(capacity_Bps.size, route_links)
    cap = capacity_Bps[used]
    q = quotient(cap, route_ptr, links, size, release, latency, dep_ptr, dep_idx) if symmetry else None
    if q is None:
        start, finish, used_busy, n_solves = _run(cap, route_ptr, links, size, release, dep_ptr, dep_idx, latency,
                                                  np.ones(n), float(rtol))
    else:
        start, finish, used_busy, n_solves = _simulate_quotient(q, cap, size, release, latency, float(rtol))
    busy = np.zeros(capacity_Bps.size)
    busy[used] = used_busy
    stuck = np.isnan(finish)
    if stuck.any():
        ids = np.flatnonzero(stuck)
        raise ConfigError("dep_idx", "dependency cycle: these transfers never become ready",
                          f"{ids[:10].tolist()}{' ...' if ids.size > 10 else ''}")
    return NetSimResult(start_s=start, finish_s=finish, capacity_Bps=capacity_Bps, link_busy_s=busy,
                        makespan_s=float(finish.max()) if n else 0.0, n_solves=int(n_solves),
                        _paths=(route_ptr.copy(), used, links, size.copy()))


def simulate_transfers(topo, src_gpu, dst_gpu, size_bytes, *, release_s=None, dep_ptr=None, dep_idx=None,
                       latency_s=None, flow_id=None, pxn: bool = False, rtol: float = 1e-9) -> NetSimResult:
    """Route GPU-to-GPU transfers through a topology and simulate them.

    Parameters
    ----------
    topo : flowsim.network.topology.Topology
        The cluster.
    src_gpu, dst_gpu : int[n_transfers]
        GPU ids.
    size_bytes, release_s, dep_ptr, dep_idx, rtol
        As in :func:`simulate`.
    latency_s : float64[n_transfers] or float, optional
        Software latency per transfer, seconds (NCCL step latency); the path's link latencies are added.
    flow_id, pxn
        As in :func:`flowsim.network.routing.route`.

    Returns
    -------
    NetSimResult
    """
    from flowsim.network.routing import route

    routes = route(topo, src_gpu, dst_gpu, flow_id, pxn=pxn)
    latency = _floats("latency_s", latency_s, routes.n_flows, 0.0, 0.0) + routes.latency_s
    return simulate(topo.capacity_Bps, routes.ptr, routes.links, size_bytes, release_s=release_s, dep_ptr=dep_ptr,
                    dep_idx=dep_idx, latency_s=latency, rtol=rtol)
