"""Independent components of a transfer set: identical ones merged, and the sub-problems that simulate groups of
them apart.

Max-min fair rates couple only transfers that share a link, and a transfer's timing only the transfers linked
to it by links or dependencies: the transfers split into *components* (connected through shared links and
dependency edges) that evolve independently, e.g. the rail planes of a rail-optimised fabric, each carrying
its own tensor-parallel rank's data-parallel ring. :func:`split` deals the components into a few bins of
about equal transfer counts and renumbers each bin's transfers and links into a self-contained sub-problem, so
that :mod:`flowsim.network.netsim` can simulate the bins in parallel threads (the event loop releases the GIL)
and copy each one's times back. A bin holds whole components, so its simulation is the joint one restricted
to its transfers, but for the event loop's batching of events within ``rtol`` of each other (times agree to
about ``rtol`` relative).

Many components of a step are copies of each other: the data-parallel groups of the eight tensor-parallel
ranks, each on its own rail, or the pipeline pairs of a stage boundary. Two components are *identical* when,
listing each one's transfers in increasing id and numbering its links in order of first use along those paths,
they have the same sizes, release times, latencies, paths (local link numbers), link capacities and
dependencies (local transfer numbers). :func:`identical` keeps one component per class (found by a 64-bit
hash of that canonical form, then checked element by element, so a hash collision cannot merge different
components); identical components have identical times. It needs no refinement rounds, so it merges copies
whose inside is too irregular for :mod:`flowsim.network.symmetry`'s colour refinement to settle quickly (rings
over hash-ECMP spines).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

__all__ = ["Reduced", "identical", "split"]

_MIX = np.int64(-7046029254386353131)  # 0x9E3779B97F4A7C15, splitmix64's odd constant (routing.py cites it)


@njit(cache=True, nogil=True)
def _find(parent, x):
    """Root of ``x`` in the union-find forest, halving the path on the way."""
    while parent[x] != x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x


@njit(cache=True, nogil=True)
def _components(n_links, route_ptr, route_links, dep_ptr, dep_idx):
    """Component of every transfer (numbered in order of their smallest transfer id) and their count.

    Parameters
    ----------
    n_links : int
        Number of links.
    route_ptr, route_links : int64[n + 1], int64[n_hops]
        Paths (CSR).
    dep_ptr, dep_idx : int64[n + 1], int64[n_deps]
        Dependencies (CSR).
    """
    n = route_ptr.shape[0] - 1
    # A forest over the transfers alone: each link joins its transfers to the first one met on it (``owner``).
    parent = np.arange(n)
    owner = np.full(n_links, -1, dtype=np.int64)
    for t in range(n):
        for h in range(route_ptr[t], route_ptr[t + 1]):
            o = owner[route_links[h]]
            if o < 0:
                owner[route_links[h]] = t
                continue
            a, b = _find(parent, t), _find(parent, o)
            if a != b:
                parent[max(a, b)] = min(a, b)
        for j in range(dep_ptr[t], dep_ptr[t + 1]):
            a, b = _find(parent, t), _find(parent, dep_idx[j])
            if a != b:
                parent[max(a, b)] = min(a, b)
    comp = np.empty(n, dtype=np.int64)
    of_root = np.full(n, -1, dtype=np.int64)
    n_comp = 0
    for t in range(n):
        r = _find(parent, t)  # a transfer root is the component's smallest transfer id (smaller ids win)
        if of_root[r] < 0:
            of_root[r] = n_comp
            n_comp += 1
        comp[t] = of_root[r]
    return comp, n_comp


@njit(cache=True, nogil=True)
def _sub(ids, route_ptr, route_links, dep_ptr, dep_idx, t_new, l_new):
    """Paths and dependencies of the transfers ``ids`` renumbered by ``t_new`` (transfers) and ``l_new``
    (links)."""
    m = ids.shape[0]
    ptr = np.zeros(m + 1, dtype=np.int64)
    dptr = np.zeros(m + 1, dtype=np.int64)
    for i in range(m):
        t = ids[i]
        ptr[i + 1] = ptr[i] + route_ptr[t + 1] - route_ptr[t]
        dptr[i + 1] = dptr[i] + dep_ptr[t + 1] - dep_ptr[t]
    links = np.empty(ptr[m], dtype=np.int64)
    deps = np.empty(dptr[m], dtype=np.int64)
    for i in range(m):
        t = ids[i]
        for k in range(route_ptr[t + 1] - route_ptr[t]):
            links[ptr[i] + k] = l_new[route_links[route_ptr[t] + k]]
        for k in range(dep_ptr[t + 1] - dep_ptr[t]):
            deps[dptr[i] + k] = t_new[dep_idx[dep_ptr[t] + k]]
    return ptr, links, dptr, deps


@njit(cache=True, nogil=True)
def _canonical(n_links, route_ptr, route_links, dep_ptr, dep_idx, comp, n_comp):
    """Local numbering of transfers and links within their components, and the components' transfers.

    Returns
    -------
    comp_ptr, members : int64[n_comp + 1], int64[n]
        Transfers of each component, increasing (CSR).
    t_local : int64[n]
        Position of each transfer in its component.
    l_local : int64[n_links]
        Number of each link in its component, in order of first use along the component's paths (-1: unused).
    n_local_links : int64[n_comp]
        Links of each component.
    """
    n = comp.shape[0]
    comp_ptr = np.zeros(n_comp + 1, dtype=np.int64)
    for t in range(n):
        comp_ptr[comp[t] + 1] += 1
    for c in range(n_comp):
        comp_ptr[c + 1] += comp_ptr[c]
    fill = comp_ptr[:-1].copy()
    members = np.empty(n, dtype=np.int64)
    t_local = np.empty(n, dtype=np.int64)
    for t in range(n):
        c = comp[t]
        members[fill[c]] = t
        t_local[t] = fill[c] - comp_ptr[c]
        fill[c] += 1
    l_local = np.full(n_links, -1, dtype=np.int64)
    n_local_links = np.zeros(n_comp, dtype=np.int64)
    for c in range(n_comp):
        for k in range(comp_ptr[c], comp_ptr[c + 1]):
            t = members[k]
            for h in range(route_ptr[t], route_ptr[t + 1]):
                l = route_links[h]
                if l_local[l] < 0:
                    l_local[l] = n_local_links[c]
                    n_local_links[c] += 1
    return comp_ptr, members, t_local, l_local, n_local_links


@njit(cache=True, nogil=True)
def _mix(h, x):
    h = (h ^ x) * _MIX
    return h ^ ((h >> 29) & 0x7FFFFFFFF)


@njit(cache=True, nogil=True)
def _fingerprints(route_ptr, route_links, dep_ptr, dep_idx, comp_ptr, members, t_local, l_local, size_bits,
                  release_bits, latency_bits, cap_bits):
    """64-bit hash of each component's canonical form (``*_bits``: the float64 inputs viewed as int64)."""
    n_comp = comp_ptr.shape[0] - 1
    out = np.empty(n_comp, dtype=np.int64)
    for c in range(n_comp):
        h = np.int64(comp_ptr[c + 1] - comp_ptr[c])
        for k in range(comp_ptr[c], comp_ptr[c + 1]):
            t = members[k]
            h = _mix(_mix(_mix(h, size_bits[t]), release_bits[t]), latency_bits[t])
            h = _mix(h, route_ptr[t + 1] - route_ptr[t])
            for j in range(route_ptr[t], route_ptr[t + 1]):
                h = _mix(_mix(h, l_local[route_links[j]]), cap_bits[route_links[j]])
            h = _mix(h, dep_ptr[t + 1] - dep_ptr[t])
            for j in range(dep_ptr[t], dep_ptr[t + 1]):
                h = _mix(h, t_local[dep_idx[j]])
        out[c] = h
    return out


@njit(cache=True, nogil=True)
def _same(a, b, route_ptr, route_links, dep_ptr, dep_idx, comp_ptr, members, t_local, l_local, size_bits,
          release_bits, latency_bits, cap_bits):
    """Whether components ``a`` and ``b`` have the same canonical form (element by element)."""
    if comp_ptr[a + 1] - comp_ptr[a] != comp_ptr[b + 1] - comp_ptr[b]:
        return False
    for k in range(comp_ptr[a + 1] - comp_ptr[a]):
        s, t = members[comp_ptr[a] + k], members[comp_ptr[b] + k]
        if size_bits[s] != size_bits[t] or release_bits[s] != release_bits[t] or latency_bits[s] != latency_bits[t]:
            return False
        if route_ptr[s + 1] - route_ptr[s] != route_ptr[t + 1] - route_ptr[t]:
            return False
        for j in range(route_ptr[s + 1] - route_ptr[s]):
            ls, lt = route_links[route_ptr[s] + j], route_links[route_ptr[t] + j]
            if l_local[ls] != l_local[lt] or cap_bits[ls] != cap_bits[lt]:
                return False
        if dep_ptr[s + 1] - dep_ptr[s] != dep_ptr[t + 1] - dep_ptr[t]:
            return False
        for j in range(dep_ptr[s + 1] - dep_ptr[s]):
            if t_local[dep_idx[dep_ptr[s] + j]] != t_local[dep_idx[dep_ptr[t] + j]]:
                return False
    return True


@njit(cache=True, nogil=True)
def _check_classes(rep, route_ptr, route_links, dep_ptr, dep_idx, comp_ptr, members, t_local, l_local, size_bits,
                   release_bits, latency_bits, cap_bits):
    """``rep`` (each component's class representative, by hash) with every component that is not identical to
    its representative made its own representative."""
    for c in range(rep.shape[0]):
        if rep[c] != c and not _same(rep[c], c, route_ptr, route_links, dep_ptr, dep_idx, comp_ptr, members,
                                     t_local, l_local, size_bits, release_bits, latency_bits, cap_bits):
            rep[c] = c
    return rep


@njit(cache=True, nogil=True)
def _build_reduced(is_rep, route_ptr, route_links, dep_ptr, dep_idx, comp_ptr, members, t_local, l_local, t_off, l_off,
           link_comp):
    """The quotient's transfers (the representatives' ones, component by component) with paths and
    dependencies renumbered: transfer ``members[k]`` of representative ``c`` becomes ``t_off[c] + t_local``,
    its link ``l`` becomes ``l_off[c] + l_local[l]``."""
    n_q = 0
    n_hops = 0
    n_deps = 0
    for c in range(is_rep.shape[0]):
        if is_rep[c]:
            for k in range(comp_ptr[c], comp_ptr[c + 1]):
                t = members[k]
                n_q += 1
                n_hops += route_ptr[t + 1] - route_ptr[t]
                n_deps += dep_ptr[t + 1] - dep_ptr[t]
    q_ids = np.empty(n_q, dtype=np.int64)
    q_ptr = np.zeros(n_q + 1, dtype=np.int64)
    q_links = np.empty(n_hops, dtype=np.int64)
    q_dep_ptr = np.zeros(n_q + 1, dtype=np.int64)
    q_dep_idx = np.empty(n_deps, dtype=np.int64)
    i = 0
    for c in range(is_rep.shape[0]):
        if is_rep[c]:
            for k in range(comp_ptr[c], comp_ptr[c + 1]):
                t = members[k]
                q_ids[i] = t
                q_ptr[i + 1] = q_ptr[i]
                for h in range(route_ptr[t], route_ptr[t + 1]):
                    l = route_links[h]
                    q_links[q_ptr[i + 1]] = l_off[link_comp[l]] + l_local[l]
                    q_ptr[i + 1] += 1
                q_dep_ptr[i + 1] = q_dep_ptr[i]
                for j in range(dep_ptr[t], dep_ptr[t + 1]):
                    q_dep_idx[q_dep_ptr[i + 1]] = t_off[c] + t_local[dep_idx[j]]
                    q_dep_ptr[i + 1] += 1
                i += 1
    return q_ids, q_ptr, q_links, q_dep_ptr, q_dep_idx


@dataclass(frozen=True, eq=False)
class Reduced:
    """One component per class of identical ones, and how to copy its results back.

    Attributes
    ----------
    route_ptr, route_links, dep_ptr, dep_idx : int64 arrays
        The kept transfers' paths and dependencies (CSR), in kept transfer and link numbers.
    transfers : int64[n_kept]
        The original id of each kept transfer.
    links : int64[n_kept_links]
        The original id of each kept link.
    transfer_of : int64[n]
        The kept transfer whose times each original transfer takes.
    link_of : int64[n_links]
        The kept link whose busy time each original link takes (-1: unused).
    """

    route_ptr: np.ndarray
    route_links: np.ndarray
    dep_ptr: np.ndarray
    dep_idx: np.ndarray
    transfers: np.ndarray
    links: np.ndarray
    transfer_of: np.ndarray
    link_of: np.ndarray


def identical(capacity_Bps: np.ndarray, route_ptr: np.ndarray, route_links: np.ndarray, size_bytes: np.ndarray,
              release_s: np.ndarray, latency_s: np.ndarray, dep_ptr: np.ndarray, dep_idx: np.ndarray):
    """One component per class of identical ones (:class:`Reduced`) of a checked transfer set
    (:func:`flowsim.network.netsim.simulate`'s arrays); ``None`` when every component is distinct.
    """
    n_links = capacity_Bps.shape[0]
    comp, n_comp = _components(n_links, route_ptr, route_links, dep_ptr, dep_idx)
    if n_comp < 2:
        return None
    link_comp = np.full(n_links, -1, dtype=np.int64)
    link_comp[route_links] = np.repeat(comp, np.diff(route_ptr))
    comp_ptr, members, t_local, l_local, n_local_links = _canonical(n_links, route_ptr, route_links, dep_ptr,
                                                                    dep_idx, comp, n_comp)
    bits = (size_bytes.view(np.int64), release_s.view(np.int64), latency_s.view(np.int64),
            capacity_Bps.view(np.int64))
    fp = _fingerprints(route_ptr, route_links, dep_ptr, dep_idx, comp_ptr, members, t_local, l_local, *bits)
    _, first, inverse = np.unique(fp, return_index=True, return_inverse=True)
    rep = _check_classes(first[inverse].astype(np.int64), route_ptr, route_links, dep_ptr, dep_idx, comp_ptr,
                         members, t_local, l_local, *bits)
    is_rep = rep == np.arange(n_comp)
    if is_rep.all():
        return None
    t_off = np.zeros(n_comp, dtype=np.int64)
    t_off[is_rep] = np.cumsum(np.diff(comp_ptr)[is_rep]) - np.diff(comp_ptr)[is_rep]
    l_off = np.zeros(n_comp, dtype=np.int64)
    l_off[is_rep] = np.cumsum(n_local_links[is_rep]) - n_local_links[is_rep]
    q_ids, q_ptr, q_links, q_dep_ptr, q_dep_idx = _build_reduced(is_rep, route_ptr, route_links, dep_ptr, dep_idx,
                                                                 comp_ptr, members, t_local, l_local, t_off, l_off,
                                                                 link_comp)
    used = np.flatnonzero(link_comp >= 0)
    link_of = np.full(n_links, -1, dtype=np.int64)
    link_of[used] = l_off[rep[link_comp[used]]] + l_local[used]
    q_link_ids = np.empty(int(n_local_links[is_rep].sum()), dtype=np.int64)
    rep_used = used[is_rep[link_comp[used]]]
    q_link_ids[link_of[rep_used]] = rep_used
    return Reduced(q_ptr, q_links, q_dep_ptr, q_dep_idx, q_ids, q_link_ids, t_off[rep[comp]] + t_local, link_of)


def split(n_bins: int, n_links: int, route_ptr: np.ndarray, route_links: np.ndarray, dep_ptr: np.ndarray,
          dep_idx: np.ndarray) -> list:
    """The transfers dealt into at most ``n_bins`` bins of whole components, largest component first into the
    bin with the fewest transfers so far; an empty list when there is only one component.

    Returns
    -------
    list of (ids, links, route_ptr, route_links, dep_ptr, dep_idx)
        Per non-empty bin: its transfers' original ids (increasing), its links' original ids (increasing), and
        its paths and dependencies in the bin's own numbering (CSR).
    """
    comp, n_comp = _components(n_links, route_ptr, route_links, dep_ptr, dep_idx)
    if n_comp < 2:
        return []
    sizes = np.bincount(comp, minlength=n_comp)
    load = np.zeros(min(n_bins, n_comp), dtype=np.int64)
    bin_of = np.empty(n_comp, dtype=np.int64)
    for c in np.argsort(-sizes, kind="stable"):
        b = int(np.argmin(load))
        bin_of[c] = b
        load[b] += sizes[c]
    t_bin = bin_of[comp]
    hop_bin = np.repeat(t_bin, np.diff(route_ptr))
    out = []
    t_new = np.empty(comp.size, dtype=np.int64)
    l_new = np.full(n_links, -1, dtype=np.int64)
    for b in range(load.size):
        ids = np.flatnonzero(t_bin == b)
        links = np.unique(route_links[hop_bin == b])
        t_new[ids] = np.arange(ids.size)
        l_new[links] = np.arange(links.size)
        out.append((ids, links) + _sub(ids, route_ptr, route_links, dep_ptr, dep_idx, t_new, l_new))
    return out
