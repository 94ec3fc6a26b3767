"""Links whose capacity constraint another link of the same paths already implies, dropped from the paths.

Max-min fair rates depend on the links only through their constraints ``sum over f crossing l of x_f <= C_l``. A
link ``l`` is *dominated* by a link ``m`` when every transfer that crosses ``l`` also crosses ``m`` and
``C_m <= C_l``: then ``m``'s constraint implies ``l``'s for every set of draining transfers (any subset of
``l``'s transfers is one of ``m``'s, and their rates are >= 0), so the feasible rates, hence the max-min fair
ones, are the same with or without ``l``, at every instant of an event simulation. Dropping ``l`` from the paths
changes no time; it shortens the paths every re-solve walks (the flow engine's windows: a transfer's kernel link,
PCIe hop, NIC ports and the leaf and spine ports of a lone flow carry the same transfers, and all but the
narrowest are implied; about 45 % of the hops of benchmarks/bench_flow_scaling.py's cross-kind windows).

Domination among links with the same transfers and capacity is broken by link id (the smallest is kept), so the
relation is a strict order and every dropped link has an undropped dominator (the maximal one of its chain).
A link that some path crosses twice is neither dropped nor used as a dominator (its constraint counts that
transfer twice).
"""
from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["dominated_hops"]


@njit(cache=True, nogil=True)
def dominated_hops(capacity_Bps, route_ptr, route_links):
    """Which hops cross a dominated link (module docstring).

    Parameters
    ----------
    capacity_Bps : float64[n_links]
        Link capacities, bytes/s.
    route_ptr, route_links : int64[n + 1], int64[n_hops]
        Paths (CSR) over link ids in [0, n_links).

    Returns
    -------
    bool[n_hops]
        True for every hop over a dominated link (all the hops of that link).
    """
    n = route_ptr.shape[0] - 1
    n_links = capacity_Bps.shape[0]
    cnt = np.zeros(n_links, dtype=np.int64)
    repeated = np.zeros(n_links, dtype=np.bool_)
    for t in range(n):
        for a in range(route_ptr[t], route_ptr[t + 1]):
            cnt[route_links[a]] += 1
            for b in range(a + 1, route_ptr[t + 1]):
                if route_links[b] == route_links[a]:
                    repeated[route_links[a]] = True
    # link -> transfers (a counting sort: ascending transfer ids within a link)
    link_ptr = np.zeros(n_links + 1, dtype=np.int64)
    for l in range(n_links):
        link_ptr[l + 1] = link_ptr[l] + cnt[l]
    fill = link_ptr[:-1].copy()
    link_flows = np.empty(link_ptr[n_links], dtype=np.int64)
    for t in range(n):
        for a in range(route_ptr[t], route_ptr[t + 1]):
            l = route_links[a]
            link_flows[fill[l]] = t
            fill[l] += 1
    drop = np.zeros(n_links, dtype=np.bool_)
    for l in range(n_links):
        if cnt[l] == 0 or repeated[l]:
            continue
        t0 = link_flows[link_ptr[l]]  # a dominator crosses every transfer of l: it lies on this one's path
        for b in range(route_ptr[t0], route_ptr[t0 + 1]):
            m = route_links[b]
            if m == l or repeated[m] or capacity_Bps[m] > capacity_Bps[l] or cnt[m] < cnt[l]:
                continue
            if cnt[m] == cnt[l] and capacity_Bps[m] == capacity_Bps[l] and m > l:
                continue  # the same constraint (equal counts: equal sets, if m has them all): keep the smaller id
            covers = True
            for k in range(link_ptr[l] + 1, link_ptr[l + 1]):
                t = link_flows[k]
                found = False
                for c in range(route_ptr[t], route_ptr[t + 1]):
                    if route_links[c] == m:
                        found = True
                        break
                if not found:
                    covers = False
                    break
            if covers:
                drop[l] = True
                break
    out = np.empty(route_links.shape[0], dtype=np.bool_)
    for a in range(route_links.shape[0]):
        out[a] = drop[route_links[a]]
    return out
