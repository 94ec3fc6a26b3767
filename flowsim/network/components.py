"""Independent components of a transfer set, and the sub-problems that simulate groups of them apart.

Max-min fair rates couple only transfers that share a link, and a transfer's timing only the transfers linked
to it by links or dependencies: the transfers split into *components* (connected through shared links and
dependency edges) that evolve independently, e.g. the rail planes of a rail-optimised fabric, each carrying
its own tensor-parallel rank's data-parallel ring. :func:`split` deals the components into a few bins of
about equal transfer counts and renumbers each bin's transfers and links into a self-contained sub-problem, so
that :mod:`flowsim.network.netsim` can simulate the bins in parallel threads (the event loop releases the GIL)
and copy each one's times back. A bin holds whole components, so its simulation is the joint one restricted
to its transfers, but for the event loop's batching of events within ``rtol`` of each other (times agree to
about ``rtol`` relative).
"""
from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["split"]


@njit(cache=True)
def _find(parent, x):
    """Root of ``x`` in the union-find forest, halving the path on the way."""
    while parent[x] != x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x


@njit(cache=True)
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
    parent = np.arange(n + n_links)
    for t in range(n):
        for h in range(route_ptr[t], route_ptr[t + 1]):
            a, b = _find(parent, t), _find(parent, n + route_links[h])
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


@njit(cache=True)
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
