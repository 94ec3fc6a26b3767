"""The kernels of the exact max-min fair solver (numba): progressive filling with an indexed heap of links,
and its two incremental re-solves. The model, the input checks and the front-ends are in
:mod:`flowsim.network.maxmin`.

Algorithm (research notes ``research/maxmin-and-traces.md`` sec. A10, "bottleneck first"): keep every link
whose flows are not all frozen in a binary min-heap keyed by its fair share
``remaining_capacity / unfrozen_weight``; pop the link with the smallest share, freeze all its unfrozen flows
at that share, take their rate off every other link of their paths and update those links' keys.
Cost O(E log L) for E flow-link incidences and L links.

Incremental re-solve, two exact methods:

* restart from a level (same notes, sec. 0.4 and A10): after departures, every flow whose old rate is below
  the smallest departing rate keeps it; after an arrival of flow g, every flow whose old rate is below
  ``min over links l of g of C_l / N_l`` (N_l counting g) keeps it. The other flows connected to a changed
  flow through links and re-filled flows are re-filled (independent components keep their rates). Cheap when
  the departing flows are the fast ones (equal sizes), costly when a slow flow leaves a large component;
* local (``_resolve_local``, the default): re-fill a set grown from the change, the others fixed, until the
  max-min certificate holds everywhere it could have broken (tracked through each flow's bottleneck link).
  Its cost follows the flows that actually change; past a size or round cap it falls back to the restart.

Flows whose path is empty are unconstrained: their rate is ``inf``.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from flowsim.network.components import _find
from flowsim.network.net_heap import _heap_pop, _heap_push, _run_order, _sift_down

FILL_RUN_MIN_LINKS = 256
"""Progressive filling sorts its links into a run from this many (a window's first fill: tens of thousands);
below it they all go through the heap (a local re-solve's few hundred, where the sort's arrays cost more than
they save: the 20-rack NVL72 sweep's re-solves touch tens of links). A cost cap only (the rates are the same
either way), set by hand from benchmarks/bench_flow_scaling.py and bench_collectives.py."""

ROUNDOFF_RTOL = 1e-14
"""Slack below this fraction of a link's capacity is round-off (float64 eps is 2.2e-16; a link's load is a
sum of many rates), so the local re-solve counts the link as saturated."""


@njit(cache=True, nogil=True)
def _link_offsets(n_links, flow_links):
    """The CSR offsets of the link -> flows transpose (:func:`_link_csr`) without the lists: int64[n_links + 1],
    link l's entries at ``[link_ptr[l], link_ptr[l + 1])``."""
    link_ptr = np.zeros(n_links + 1, dtype=np.int64)
    for h in range(flow_links.shape[0]):
        link_ptr[flow_links[h] + 1] += 1
    for l in range(n_links):
        link_ptr[l + 1] += link_ptr[l]
    return link_ptr


@njit(cache=True, nogil=True)
def _link_csr(n_links, flow_ptr, flow_links):
    """Transpose the flow -> links CSR into link -> flows by a counting sort (stable in flow id).

    Parameters
    ----------
    n_links : int
        Number of links, >= 0.
    flow_ptr : int64[n_flows + 1]
        CSR offsets of the paths.
    flow_links : int64[n_hops]
        Link id of each hop, in [0, n_links).

    Returns
    -------
    link_ptr : int64[n_links + 1]
        CSR offsets: link l carries flows ``link_flows[link_ptr[l]:link_ptr[l + 1]]``.
    link_flows : int64[n_hops]
        Flow id of each incidence, ascending within a link.
    """
    n_flows = flow_ptr.shape[0] - 1
    link_ptr = _link_offsets(n_links, flow_links)
    fill = link_ptr[:-1].copy()
    link_flows = np.empty(flow_links.shape[0], dtype=np.int64)
    for f in range(n_flows):
        for h in range(flow_ptr[f], flow_ptr[f + 1]):
            l = flow_links[h]
            link_flows[fill[l]] = f
            fill[l] += 1
    return link_ptr, link_flows


@njit(cache=True, nogil=True)
def _fill(flow_ptr, flow_links, link_ptr, link_end, link_flows, weights, rate_Bps, todo, n_todo, touched,
          n_touched, state, heap, hkey, pos, bott):
    """Progressive filling of the flows marked unfrozen, on the residual capacities given.

    Parameters
    ----------
    flow_ptr : int64[n_flows + 1]
        CSR offsets of the paths.
    flow_links : int64[n_hops]
        Link id of each hop.
    link_ptr, link_end, link_flows : int64[n_links + 1], int64[n_links], int64[n_hops]
        The link -> flows transpose: link l's flows are ``link_flows[link_ptr[l]:link_end[l]]`` (every flow
        that can have a rate there: all of them, ``link_end = link_ptr[1:]``, or the event loop's active ones).
    weights : float64[n_flows]
        Multiplicity of each flow, > 0.
    rate_Bps : float64[n_flows]
        In: -1 for the flows to fill (exactly those in ``todo``), their final rate (>= 0) for the others.
        Out: every flow of ``todo`` gets its max-min rate in bytes/s (``inf`` when its path is empty).
    todo : int64[>= n_todo]
        The flows to fill.
    n_todo : int
        Number of entries of ``todo`` in use.
    touched : int64[>= n_touched]
        Every link crossed by a flow of ``todo`` (each once).
    n_touched : int
        Number of entries of ``touched`` in use.
    state : float64[n_links, 3]
        Per link, side by side for locality: remaining capacity (bytes/s), unfrozen weight, unfrozen flow
        count. In: ``state[l, 0]`` of each touched link is its capacity minus the load of the flows not in
        ``todo``. Scratch afterwards.
    heap, hkey, pos : int64[n_links], float64[n_links], int64[n_links] (all -1 on entry and exit)
        Scratch for the indexed heap of links keyed by fair share (see ``flowsim.network.net_heap``) that
        holds the links whose key was refreshed (lazily, when a link reaches the front); the others wait in a
        run sorted by their first key.
    bott : int64[n_flows]
        Out: for each flow of ``todo`` with a non-empty path, the link that froze it (its bottleneck:
        saturated, and no flow on it has a higher rate); -1 for an empty path.
    """
    for i in range(n_touched):
        l = touched[i]
        state[l, 1] = 0.0
        state[l, 2] = 0.0
    for i in range(n_todo):
        f = todo[i]
        for h in range(flow_ptr[f], flow_ptr[f + 1]):
            l = flow_links[h]
            state[l, 1] += weights[f]
            state[l, 2] += 1.0
    # Many links: a run sorted by (initial share, id), merged with a heap that holds only the links whose share
    # was refreshed. Most links never bind (every flow on them freezes elsewhere first) and leave the run in
    # O(1) instead of a pop's sift through the heap; the order in which links come to the front is that of one
    # heap over all of them, so the rates are the same. A few links: all in the heap (no sort to pay for).
    size = 0
    n_run = 0
    if n_touched >= FILL_RUN_MIN_LINKS:
        ids = np.empty(n_touched, dtype=np.int64)
        n_links = state.shape[0]
        if 4 * n_touched >= n_links:  # a good part of the links: listed in increasing id by a scan (no id passes)
            for i in range(n_touched):
                l = touched[i]
                if state[l, 2] > 0.0:
                    pos[l] = 0  # a mark, reset below (pos is all -1 outside the heap)
            for l in range(n_links):
                if pos[l] == 0:
                    pos[l] = -1
                    ids[n_run] = l
                    n_run += 1
        else:
            for i in range(n_touched):
                l = touched[i]
                if state[l, 2] > 0.0:
                    ids[n_run] = l
                    n_run += 1
        keys = np.empty(n_run)
        for i in range(n_run):
            l = ids[i]
            keys[i] = max(state[l, 0], 0.0) / state[l, 1]
        order = _run_order(ids[:n_run], keys)  # by share, equal shares in increasing id
        run = ids[order]
        run_key = keys[order]
    else:  # no run: empty views of the scratch (a local re-solve's fills allocate nothing)
        run = touched[:0]
        run_key = hkey[:0]
        for i in range(n_touched):
            l = touched[i]
            if state[l, 2] > 0.0:
                size = _heap_push(heap, hkey, pos, size, l, max(state[l, 0], 0.0) / state[l, 1])
    p = 0
    level = 0.0
    while p < n_run or size > 0:
        # Lazy keys: a link's key is only refreshed when it reaches the front. Keys never decrease (a flow
        # frozen at the current level takes at most its share from each of its other links), so a stale key
        # is a lower bound and the front is the true minimum once its key is fresh.
        from_heap = size > 0 and (p == n_run or hkey[0] < run_key[p] or (hkey[0] == run_key[p]
                                                                         and heap[0] < run[p]))
        l = heap[0] if from_heap else run[p]
        if state[l, 2] == 0.0:
            if from_heap:
                l, size = _heap_pop(heap, hkey, pos, size)
            else:
                p += 1
            continue
        share = max(state[l, 0], 0.0) / state[l, 1]
        if from_heap:
            if share > hkey[0]:
                hkey[0] = share
                _sift_down(heap, hkey, pos, size, 0)
                continue
            l, size = _heap_pop(heap, hkey, pos, size)
        else:
            p += 1
            if share > run_key[p - 1]:
                size = _heap_push(heap, hkey, pos, size, l, share)
                continue
        if share < level:
            share = level  # a round-off dip below the previous level (levels never decrease)
        level = share
        for j in range(link_ptr[l], link_end[l]):
            f = link_flows[j]
            if rate_Bps[f] >= 0.0:
                continue
            rate_Bps[f] = share
            bott[f] = l
            w = weights[f]
            for h in range(flow_ptr[f], flow_ptr[f + 1]):
                m = flow_links[h]
                state[m, 0] -= w * share
                state[m, 1] -= w
                state[m, 2] -= 1.0
    for i in range(n_todo):
        f = todo[i]
        if rate_Bps[f] < 0.0:
            rate_Bps[f] = np.inf
            bott[f] = -1


@njit(cache=True, nogil=True)
def _solve_full(capacity_Bps, flow_ptr, flow_links, weights):
    """Max-min fair rates of all flows from scratch.

    Parameters
    ----------
    capacity_Bps : float64[n_links]
        Link capacities in bytes/s, > 0.
    flow_ptr : int64[n_flows + 1]
        CSR offsets of the paths.
    flow_links : int64[n_hops]
        Link id of each hop, in [0, n_links).
    weights : float64[n_flows]
        Multiplicity of each flow, > 0.

    Returns
    -------
    float64[n_flows]
        Rate of one flow of each class, bytes/s.
    """
    n_links = capacity_Bps.shape[0]
    n_flows = flow_ptr.shape[0] - 1
    link_ptr, link_flows = _link_csr(n_links, flow_ptr, flow_links)
    rate = np.full(n_flows, -1.0)
    todo = np.arange(n_flows)
    touched = np.arange(n_links)
    state = np.zeros((n_links, 3))
    state[:, 0] = capacity_Bps
    _fill(flow_ptr, flow_links, link_ptr, link_ptr[1:].copy(), link_flows, weights, rate, todo, n_flows, touched,
          n_links, state, np.empty(n_links, dtype=np.int64), np.empty(n_links), np.full(n_links, -1, dtype=np.int64),
          np.empty(n_flows, dtype=np.int64))
    return rate


@njit(cache=True, nogil=True)
def _arrival_bound(capacity_Bps, flow_ptr, flow_links, active_weight, f):
    """Lower bound on the new rate of an arriving flow: ``min over its links of C_l / N_l``.

    Parameters
    ----------
    capacity_Bps : float64[n_links]
        Link capacities, bytes/s.
    flow_ptr, flow_links : int64[n_flows + 1], int64[n_hops]
        Paths (CSR).
    active_weight : float64[n_links]
        Total weight of the active flows on each link, the arriving flow included.
    f : int
        The arriving flow.

    Returns
    -------
    float
        Bytes/s; ``inf`` for an empty path.
    """
    bound = np.inf
    for h in range(flow_ptr[f], flow_ptr[f + 1]):
        l = flow_links[h]
        bound = min(bound, capacity_Bps[l] / active_weight[l])
    return bound


@njit(cache=True, nogil=True)
def _resolve(capacity_Bps, flow_ptr, flow_links, link_ptr, link_end, link_flows, weights, rate_Bps, level_Bps, seeds,
             n_seeds, clock, link_mark, flow_mark, todo, touched, state, heap, hkey, pos, bott):
    """Incremental re-solve: re-fill only the flows that can change, keep all others.

    The flows re-filled are those reachable from the links of the seed flows through links and flows whose
    rate is >= ``level_Bps`` (or unassigned); every other flow keeps its rate (see the module docstring
    for why this is exact).

    Parameters
    ----------
    capacity_Bps : float64[n_links]
        Link capacities, bytes/s.
    flow_ptr, flow_links : int64[n_flows + 1], int64[n_hops]
        Paths (CSR).
    link_ptr, link_end, link_flows : int64[n_links + 1], int64[n_links], int64[n_hops]
        The link -> flows transpose (``_link_csr``; ``link_end`` as in ``_fill``: every flow with a rate > 0 on
        link l is among ``link_flows[link_ptr[l]:link_end[l]]``).
    weights : float64[n_flows]
        Multiplicity of each flow, > 0.
    rate_Bps : float64[n_flows]
        In: the previous rates of the active flows, 0 for inactive flows (departed ones included) and -1 for
        flows that just arrived. Out: new rates of the re-filled flows (others unchanged).
    level_Bps : float
        Flows with ``0 <= rate < level_Bps`` keep their rate; > 0.
    seeds : int64[>= n_seeds]
        The flows that arrived or departed.
    n_seeds : int
        Entries of ``seeds`` in use.
    clock : int64[1]
        Stamp counter shared by all calls with these mark arrays (incremented here; marks equal to the
        current stamp mean "visited").
    link_mark : int64[n_links]
        Visit marks of links.
    flow_mark : int64[n_flows]
        Visit marks of flows.
    todo : int64[n_flows]
        Out: the re-filled flows in ``todo[:n_todo]``.
    touched : int64[n_links]
        Scratch: the links visited.
    state, heap, hkey, pos :
        Scratch for ``_fill``, sized n_links (``pos`` all -1).
    bott : int64[n_flows]
        Bottleneck link of each flow (updated for the re-filled flows).

    Returns
    -------
    int
        ``n_todo``, the number of flows re-filled.
    """
    clock[0] += 1
    epoch = clock[0]
    n_touched = 0
    n_todo = 0
    for i in range(n_seeds):
        f = seeds[i]
        if rate_Bps[f] < 0.0 and flow_mark[f] != epoch:
            flow_mark[f] = epoch
            todo[n_todo] = f
            n_todo += 1
        for h in range(flow_ptr[f], flow_ptr[f + 1]):
            l = flow_links[h]
            if link_mark[l] != epoch:
                link_mark[l] = epoch
                touched[n_touched] = l
                n_touched += 1
    head = 0
    while head < n_touched:
        l = touched[head]
        head += 1
        r = capacity_Bps[l]
        for j in range(link_ptr[l], link_end[l]):
            f = link_flows[j]
            x = rate_Bps[f]
            if 0.0 <= x < level_Bps:
                r -= weights[f] * x
            elif flow_mark[f] != epoch:
                flow_mark[f] = epoch
                rate_Bps[f] = -1.0
                todo[n_todo] = f
                n_todo += 1
                for h in range(flow_ptr[f], flow_ptr[f + 1]):
                    m = flow_links[h]
                    if link_mark[m] != epoch:
                        link_mark[m] = epoch
                        touched[n_touched] = m
                        n_touched += 1
        state[l, 0] = r
    _fill(flow_ptr, flow_links, link_ptr, link_end, link_flows, weights, rate_Bps, todo, n_todo, touched,
          n_touched, state, heap, hkey, pos, bott)
    return n_todo


@njit(cache=True, nogil=True)
def _fill_arrivals(capacity_Bps, flow_ptr, flow_links, link_ptr, link_end, link_flows, weights, rate_Bps, seeds,
                   n_seeds, clock, link_mark, todo, touched, state, heap, hkey, pos, bott):
    """Progressive filling of flows that all just arrived, when no other flow is active: ``_resolve`` at level 0
    without its walk through the links' lists, which would find no other flow (every flow on a link of a seed is a
    seed) and no load to subtract (each link's residual is its capacity); the same ``_fill``, so the same rates.

    Parameters
    ----------
    capacity_Bps, flow_ptr, flow_links, link_ptr, link_end, link_flows, weights :
        As in ``_resolve``.
    rate_Bps : float64[n_flows]
        In: -1 for the seeds. Out: their rates.
    seeds : int64[>= n_seeds]
        The active flows, each once.
    n_seeds : int
        Entries of ``seeds`` in use.
    clock, link_mark, todo, touched, state, heap, hkey, pos, bott :
        As in ``_resolve``.

    Returns
    -------
    int
        ``n_seeds``, the flows filled (``todo[:n_seeds]``).
    """
    clock[0] += 1
    epoch = clock[0]
    n_touched = 0
    for i in range(n_seeds):
        f = seeds[i]
        todo[i] = f
        for h in range(flow_ptr[f], flow_ptr[f + 1]):
            l = flow_links[h]
            if link_mark[l] != epoch:
                link_mark[l] = epoch
                touched[n_touched] = l
                n_touched += 1
                state[l, 0] = capacity_Bps[l]
    _fill(flow_ptr, flow_links, link_ptr, link_end, link_flows, weights, rate_Bps, todo, n_seeds, touched,
          n_touched, state, heap, hkey, pos, bott)
    return n_seeds


@njit(cache=True, nogil=True)
def _add_flow(f, stamp, flow_mark, todo, saved_bott, bott, n_todo):
    """Put flow ``f`` into the re-filled set (once); return the new set size.

    Parameters
    ----------
    f : int
        Flow id.
    stamp : int
        Membership stamp of this call (``flow_mark[f] == stamp`` means "in the set").
    flow_mark : int64[n_flows]
        Membership marks.
    todo : int64[n_flows]
        The set, ``todo[:n_todo]``.
    saved_bott : int64[n_flows]
        ``saved_bott[i]`` keeps the bottleneck of ``todo[i]`` before this call (restored on fallback).
    bott : int64[n_flows]
        Bottleneck link of each flow.
    n_todo : int
        Current set size.

    Returns
    -------
    int
        The new set size.
    """
    if flow_mark[f] == stamp:
        return n_todo
    flow_mark[f] = stamp
    todo[n_todo] = f
    saved_bott[n_todo] = bott[f]
    return n_todo + 1


@njit(cache=True, nogil=True)
def _resolve_local(capacity_Bps, flow_ptr, flow_links, link_ptr, link_end, link_flows, weights, rate_Bps, old_rate_Bps,
                   bott, seeds, n_seeds, clock, link_mark, changed_mark, flow_mark, todo, saved_bott,
                   touched, changed, state, heap, hkey, pos, resid, n_diff, prev_rate, prev_bott, part, comp_mark, sub,
                   link_part, max_todo, max_rounds, rtol):
    """Local incremental re-solve: re-fill a growing set of flows until the max-min certificate holds.

    Round: re-fill the set with every other flow fixed at its rate (exact for the set if the others are
    right: the restriction of the max-min allocation to any set of flows is max-min fair on the capacity the
    others leave). Then check the certificate (module docstring of ``check_maxmin``) where it can have broken:
    on the links whose load changed (links of departed or arrived flows and of re-filled flows whose rate
    changed), a fixed flow whose recorded bottleneck is such a link must still find it saturated with no
    higher rate on it; on the bottleneck of each re-filled flow, no fixed flow may have a higher rate. Flows
    that fail join the set. When nothing fails, every flow has a valid bottleneck and no link is over
    capacity: the allocation is the max-min fair one. Cost follows the flows that really change, not the
    size of the component.

    Rounds after the first repeat only the work whose inputs moved: a link's residual (its capacity less the
    fixed flows' load, summed in its list order) is summed again only when a flow on it joined the set; a link
    is checked again only when the rate of a flow on it moved since the last fill (else every value of the
    check is the one the previous round saw, and the flows that failed it joined the set then), and a re-filled
    flow's bottleneck only when its rate or bottleneck moved (fixed rates never move, the set only grows). The
    set that results is the one the full checks of every round would build, and ``_fill`` gives the same rates
    for a set whatever the order of its flows and links, so the results are the same bit for bit; the cost of
    a round follows the flows whose rate moved in it, not the whole set (a re-solve at 65,536 GPUs grows sets of
    thousands of flows over up to ``max_rounds`` rounds).

    A round re-fills only the components of the set (flows linked through the links they share) that gained a
    member: a component without a new member has the same flows, links and residuals as at the last fill, and a
    fill's steps on one component read and write that component's links only, so re-filling it would give it the
    same rates and bottlenecks again. (One caveat, of round-off size: ``_fill`` raises a share that round-off put
    below the last level to that level, and in a fill of the whole set that level could come from another
    component, a few ulps apart. The event loops of the gpt3-175b steps at 1,024 and 65,536 GPUs, llama3.1-405b
    at 16,384 and deepseek-v3 at 2,048 raise 328 shares so, all by less than 5e-16 relative, and every result
    stays equal bit for bit.) The mass departures of the 65,536-GPU windows (thousands of transfers finishing at
    once) grow sets of about 1,400 components, of which a round re-fills a fifth.

    Parameters
    ----------
    capacity_Bps : float64[n_links]
        Link capacities, bytes/s.
    flow_ptr, flow_links, link_ptr, link_end, link_flows : int64 arrays
        Paths (CSR) and their link -> flows transpose (as in ``_resolve``).
    weights : float64[n_flows]
        Multiplicity of each flow.
    rate_Bps : float64[n_flows]
        In: old rates of active flows, 0 for inactive flows (departed ones included), -1 for arrivals.
        Out: new rates of the flows of ``todo[:n_todo]`` (all other entries unchanged).
    old_rate_Bps : float64[n_flows]
        The rates before the change (0 for arrivals and inactive flows).
    bott : int64[n_flows]
        Bottleneck link of every active flow (from the fill that set its rate); updated.
    seeds : int64[>= n_seeds]
        The flows that arrived or departed (each once).
    n_seeds : int
        Entries of ``seeds`` in use.
    clock : int64[1]
        Stamp counter (see ``_resolve``).
    link_mark, changed_mark : int64[n_links]
        Link marks (touched in this call; listed for checking in this round).
    flow_mark : int64[n_flows]
        Flow marks (member of the re-filled set).
    todo : int64[n_flows]
        Out: the re-filled set.
    saved_bott : int64[n_flows]
        Scratch: bottlenecks of the set's flows before the call.
    touched, changed : int64[n_links]
        Scratch link lists.
    state, heap, hkey, pos :
        Scratch for ``_fill`` (``pos`` all -1).
    resid : float64[n_links]
        Scratch: the residual of each touched link (NaN: to be summed again).
    n_diff : int64[n_links]
        All 0 on entry and exit. Scratch: per link, the hops of seeds and of re-filled flows whose rate differs
        from the old one (> 0: the link's load changed).
    prev_rate, prev_bott : float64[n_flows], int64[n_flows]
        Scratch: rate and bottleneck of ``todo[i]`` before the round's fill.
    part, comp_mark, sub : int64[n_flows]
        Scratch: the union-find forest of the set's components over positions in ``todo``
        (:func:`flowsim.network.components._find`), the round stamp of the components to re-fill (by root
        position), the flows re-filled in a round.
    link_part : int64[n_links]
        Scratch: a position in ``todo`` of a member crossing each touched link.
    max_todo : int
        Give up when the set grows beyond this many flows.
    max_rounds : int
        Give up after this many rounds.
    rtol : float
        Relative tolerance, >= 0. The certificate is checked at ``tol = rtol / 4``: a link is saturated when
        its slack is at most ``tol * (highest rate on it) + ROUNDOFF_RTOL * capacity``, so a fixed flow that
        passes is within about ``rtol`` of its exact rate.

    Returns
    -------
    int
        ``n_todo`` on success; -1 when it gave up, with ``rate_Bps`` and ``bott`` restored to their input
        values (then call ``_resolve``).
    """
    tol = 0.25 * rtol
    clock[0] += 1
    stamp = clock[0]
    n_todo = 0
    for i in range(n_seeds):
        f = seeds[i]
        if rate_Bps[f] < 0.0:
            n_todo = _add_flow(f, stamp, flow_mark, todo, saved_bott, bott, n_todo)
        for h in range(flow_ptr[f], flow_ptr[f + 1]):
            n_diff[flow_links[h]] += 1  # a seed's links count as changed in every round
    n_arrived = n_todo  # todo[:n_arrived] are seeds
    n_touched = 0
    n_filled = 0  # the set's size at the previous fill
    result = -1
    for rnd in range(max_rounds):
        clock[0] += 1
        round_stamp = clock[0]
        # New members join the components of the set (flows linked through shared links, kept by union-find over
        # positions in todo); the residuals of their links are summed again.
        for i in range(n_filled, n_todo):
            f = todo[i]
            part[i] = i
            comp_mark[i] = -1
            for h in range(flow_ptr[f], flow_ptr[f + 1]):
                m = flow_links[h]
                if link_mark[m] != stamp:
                    link_mark[m] = stamp
                    touched[n_touched] = m
                    n_touched += 1
                    link_part[m] = i
                else:
                    a = _find(part, i)
                    b = _find(part, link_part[m])
                    part[max(a, b)] = min(a, b)
                resid[m] = np.nan
        # Only the components with a new member are re-filled: a component without one has the same flows, links
        # and residuals as at the last fill, so its fill (which reads only its own links) gives the same rates.
        for i in range(n_filled, n_todo):
            comp_mark[_find(part, i)] = round_stamp
        n_sub = 0
        for i in range(n_todo):
            f = todo[i]
            prev_rate[i] = rate_Bps[f]
            prev_bott[i] = bott[f]
            if i >= n_filled or comp_mark[_find(part, i)] == round_stamp:
                rate_Bps[f] = -1.0
                sub[n_sub] = f
                n_sub += 1
        clock[0] += 1
        fill_stamp = clock[0]
        n_sub_links = 0  # the links of the re-filled flows, listed in changed (free until the checks)
        for i in range(n_sub):
            f = sub[i]
            for h in range(flow_ptr[f], flow_ptr[f + 1]):
                m = flow_links[h]
                if changed_mark[m] == fill_stamp:
                    continue
                changed_mark[m] = fill_stamp
                changed[n_sub_links] = m
                n_sub_links += 1
                if np.isnan(resid[m]):
                    r = capacity_Bps[m]
                    for j in range(link_ptr[m], link_end[m]):
                        g = link_flows[j]
                        if flow_mark[g] != stamp:
                            r -= weights[g] * rate_Bps[g]
                    resid[m] = r
                state[m, 0] = resid[m]
        _fill(flow_ptr, flow_links, link_ptr, link_end, link_flows, weights, rate_Bps, sub, n_sub, changed,
              n_sub_links, state, heap, hkey, pos, bott)
        # Links to check: those of flows whose rate moved in this fill (new members count as moved; in the first
        # round also the seeds'), among the links whose load changed (n_diff > 0, counted after all the moves).
        n_changed = 0
        for i in range(n_seeds + n_todo):
            if i < n_seeds:
                if rnd > 0:
                    continue
                f = seeds[i]
            else:
                k = i - n_seeds
                f = todo[k]
                if k < n_filled and rate_Bps[f] == prev_rate[k]:
                    continue
                if k >= n_arrived:
                    d = (1 if rate_Bps[f] != old_rate_Bps[f] else 0) - (
                        1 if k < n_filled and prev_rate[k] != old_rate_Bps[f] else 0)
                    if d != 0:
                        for h in range(flow_ptr[f], flow_ptr[f + 1]):
                            n_diff[flow_links[h]] += d
            for h in range(flow_ptr[f], flow_ptr[f + 1]):
                m = flow_links[h]
                if changed_mark[m] != round_stamp:
                    changed_mark[m] = round_stamp
                    changed[n_changed] = m
                    n_changed += 1
        n_before = n_todo
        # Fixed flows whose recorded bottleneck changed: still saturated, still no higher rate on it?
        for i in range(n_changed):
            m = changed[i]
            if n_diff[m] == 0:
                continue
            load = 0.0
            top = 0.0
            for j in range(link_ptr[m], link_end[m]):
                g = link_flows[j]
                x = rate_Bps[g]
                load += weights[g] * x
                top = max(top, x)
            saturated = capacity_Bps[m] - load <= tol * top + ROUNDOFF_RTOL * capacity_Bps[m]
            for j in range(link_ptr[m], link_end[m]):
                g = link_flows[j]
                x = rate_Bps[g]
                if flow_mark[g] == stamp or x <= 0.0 or bott[g] != m:
                    continue
                if not (saturated and x >= top * (1.0 - tol)):
                    n_todo = _add_flow(g, stamp, flow_mark, todo, saved_bott, bott, n_todo)
        # Re-filled flows whose rate or bottleneck moved: no fixed flow may have a higher rate on their bottleneck.
        for i in range(n_before):
            f = todo[i]
            b = bott[f]
            if b < 0 or (i < n_filled and rate_Bps[f] == prev_rate[i] and b == prev_bott[i]):
                continue
            for j in range(link_ptr[b], link_end[b]):
                g = link_flows[j]
                if flow_mark[g] != stamp and rate_Bps[g] > rate_Bps[f] * (1.0 + tol):
                    n_todo = _add_flow(g, stamp, flow_mark, todo, saved_bott, bott, n_todo)
        n_filled = n_before
        if n_todo == n_before:
            result = n_todo
            break
        if n_todo > max_todo:
            break
    for i in range(n_seeds):
        f = seeds[i]
        for h in range(flow_ptr[f], flow_ptr[f + 1]):
            n_diff[flow_links[h]] = 0
    for i in range(n_touched):
        n_diff[touched[i]] = 0
    if result < 0:  # give up: restore the input state
        for i in range(n_todo):
            f = todo[i]
            rate_Bps[f] = old_rate_Bps[f] if old_rate_Bps[f] > 0.0 else -1.0
            bott[f] = saved_bott[i]
    return result
