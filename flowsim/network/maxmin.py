"""Exact max-min fair bandwidth sharing: progressive filling with an indexed heap of links.

Model: flows cross directed links; link ``l`` has capacity ``C_l`` (bytes/s); flow ``f`` stands for
``w_f`` identical flows (its weight, or multiplicity) that each get the rate ``x_f``. Link ``l`` carries
``sum_f a_lf * w_f * x_f <= C_l`` where ``a_lf`` is the number of times flow ``f`` lists link ``l`` (normally
0 or 1). The max-min fair allocation is the unique one in which no flow can get more without taking from a
flow that has less or the same (Bertsekas & Gallager, *Data Networks*, 2nd ed., sec. 6.5.2).

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

from flowsim.network.net_heap import _heap_pop, _heap_push, _sift_down

__all__ = ["solve", "resolve", "check_maxmin", "MaxMinViolation"]


ROUNDOFF_RTOL = 1e-14
"""Slack below this fraction of a link's capacity is round-off (float64 eps is 2.2e-16; a link's load is a
sum of many rates), so the local re-solve counts the link as saturated."""


class MaxMinViolation(AssertionError):
    """Solver output that breaks the max-min certificate (a bug in flowsim, not bad input)."""


# --------------------------------------------------------------------------------------------- kernels
@njit(cache=True)
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
    link_ptr = np.zeros(n_links + 1, dtype=np.int64)
    for h in range(flow_links.shape[0]):
        link_ptr[flow_links[h] + 1] += 1
    for l in range(n_links):
        link_ptr[l + 1] += link_ptr[l]
    fill = link_ptr[:-1].copy()
    link_flows = np.empty(flow_links.shape[0], dtype=np.int64)
    for f in range(n_flows):
        for h in range(flow_ptr[f], flow_ptr[f + 1]):
            l = flow_links[h]
            link_flows[fill[l]] = f
            fill[l] += 1
    return link_ptr, link_flows


@njit(cache=True)
def _fill(flow_ptr, flow_links, link_ptr, link_flows, weights, rate_Bps, todo, n_todo, touched, n_touched,
          state, heap, hkey, pos, bott):
    """Progressive filling of the flows marked unfrozen, on the residual capacities given.

    Parameters
    ----------
    flow_ptr : int64[n_flows + 1]
        CSR offsets of the paths.
    flow_links : int64[n_hops]
        Link id of each hop.
    link_ptr : int64[n_links + 1]
        CSR offsets of the link -> flows transpose.
    link_flows : int64[n_hops]
        Flow id of each incidence.
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
        Scratch for the indexed heap of links keyed by fair share (see ``flowsim.network.net_heap``); keys are
        refreshed lazily, when a link reaches the top.
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
    size = 0
    for i in range(n_touched):
        l = touched[i]
        if state[l, 2] > 0.0:
            size = _heap_push(heap, hkey, pos, size, l, max(state[l, 0], 0.0) / state[l, 1])
    level = 0.0
    while size > 0:
        # Lazy keys: a link's key is only refreshed when it reaches the top. Keys never decrease (a flow
        # frozen at the current level takes at most its share from each of its other links), so a stale key
        # is a lower bound and the top is the true minimum once its key is fresh.
        l = heap[0]
        if state[l, 2] == 0.0:
            l, size = _heap_pop(heap, hkey, pos, size)
            continue
        share = max(state[l, 0], 0.0) / state[l, 1]
        if share > hkey[0]:
            hkey[0] = share
            _sift_down(heap, hkey, pos, size, 0)
            continue
        l, size = _heap_pop(heap, hkey, pos, size)
        if share < level:
            share = level  # a round-off dip below the previous level (levels never decrease)
        level = share
        for j in range(link_ptr[l], link_ptr[l + 1]):
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


@njit(cache=True)
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
    _fill(flow_ptr, flow_links, link_ptr, link_flows, weights, rate, todo, n_flows, touched, n_links, state,
          np.empty(n_links, dtype=np.int64), np.empty(n_links), np.full(n_links, -1, dtype=np.int64),
          np.empty(n_flows, dtype=np.int64))
    return rate


@njit(cache=True)
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


@njit(cache=True)
def _resolve(capacity_Bps, flow_ptr, flow_links, link_ptr, link_flows, weights, rate_Bps, level_Bps, seeds,
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
    link_ptr, link_flows : int64[n_links + 1], int64[n_hops]
        The link -> flows transpose (``_link_csr``).
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
        for j in range(link_ptr[l], link_ptr[l + 1]):
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
    _fill(flow_ptr, flow_links, link_ptr, link_flows, weights, rate_Bps, todo, n_todo, touched, n_touched,
          state, heap, hkey, pos, bott)
    return n_todo


@njit(cache=True)
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


@njit(cache=True)
def _resolve_local(capacity_Bps, flow_ptr, flow_links, link_ptr, link_flows, weights, rate_Bps, old_rate_Bps,
                   bott, seeds, n_seeds, clock, link_mark, changed_mark, flow_mark, todo, saved_bott,
                   touched, changed, state, heap, hkey, pos, max_todo, max_rounds, rtol):
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

    Parameters
    ----------
    capacity_Bps : float64[n_links]
        Link capacities, bytes/s.
    flow_ptr, flow_links, link_ptr, link_flows : int64 arrays
        Paths (CSR) and their link -> flows transpose.
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
        The flows that arrived or departed.
    n_seeds : int
        Entries of ``seeds`` in use.
    clock : int64[1]
        Stamp counter (see ``_resolve``).
    link_mark, changed_mark : int64[n_links]
        Link marks (touched in this round; load changed in this round).
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
    for _ in range(max_rounds):
        clock[0] += 1
        round_stamp = clock[0]
        # Re-fill the set with the other flows fixed.
        n_touched = 0
        for i in range(n_todo):
            f = todo[i]
            rate_Bps[f] = -1.0
            for h in range(flow_ptr[f], flow_ptr[f + 1]):
                m = flow_links[h]
                if link_mark[m] != round_stamp:
                    link_mark[m] = round_stamp
                    touched[n_touched] = m
                    n_touched += 1
        for i in range(n_touched):
            m = touched[i]
            r = capacity_Bps[m]
            for j in range(link_ptr[m], link_ptr[m + 1]):
                g = link_flows[j]
                if flow_mark[g] != stamp:
                    r -= weights[g] * rate_Bps[g]
            state[m, 0] = r
        _fill(flow_ptr, flow_links, link_ptr, link_flows, weights, rate_Bps, todo, n_todo, touched, n_touched,
              state, heap, hkey, pos, bott)
        # Links whose load changed.
        n_changed = 0
        for i in range(n_seeds + n_todo):
            f = seeds[i] if i < n_seeds else todo[i - n_seeds]
            if i >= n_seeds and rate_Bps[f] == old_rate_Bps[f]:
                continue
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
            load = 0.0
            top = 0.0
            for j in range(link_ptr[m], link_ptr[m + 1]):
                g = link_flows[j]
                x = rate_Bps[g]
                load += weights[g] * x
                top = max(top, x)
            saturated = capacity_Bps[m] - load <= tol * top + ROUNDOFF_RTOL * capacity_Bps[m]
            for j in range(link_ptr[m], link_ptr[m + 1]):
                g = link_flows[j]
                x = rate_Bps[g]
                if flow_mark[g] == stamp or x <= 0.0 or bott[g] != m:
                    continue
                if not (saturated and x >= top * (1.0 - tol)):
                    n_todo = _add_flow(g, stamp, flow_mark, todo, saved_bott, bott, n_todo)
        # Re-filled flows: no fixed flow may have a higher rate on their bottleneck.
        for i in range(n_before):
            f = todo[i]
            b = bott[f]
            if b < 0:
                continue
            for j in range(link_ptr[b], link_ptr[b + 1]):
                g = link_flows[j]
                if flow_mark[g] != stamp and rate_Bps[g] > rate_Bps[f] * (1.0 + tol):
                    n_todo = _add_flow(g, stamp, flow_mark, todo, saved_bott, bott, n_todo)
        if n_todo == n_before:
            return n_todo
        if n_todo > max_todo:
            break
    # Give up: restore the input state.
    for i in range(n_todo):
        f = todo[i]
        rate_Bps[f] = old_rate_Bps[f] if old_rate_Bps[f] > 0.0 else -1.0
        bott[f] = saved_bott[i]
    return -1


# --------------------------------------------------------------------------------------------- front-ends
LOCAL_MAX_ROUNDS = 16
"""Rounds of the local re-solve before it falls back to the restart from the level. Only a cost cap (both
methods are exact); 16 was the fastest of 4, 8, 16, 32 on the mixed-size case of benchmarks/bench_network.py
(docs/PERFORMANCE.md)."""


def _check_routes(capacity_Bps, flow_ptr, flow_links, weights, rtol):
    """Convert and validate the solver inputs; raise ValueError naming the argument."""
    capacity_Bps = np.ascontiguousarray(capacity_Bps, dtype=np.float64)
    if capacity_Bps.ndim != 1:
        raise ValueError(f"capacity_Bps: must be one-dimensional (got shape {capacity_Bps.shape})")
    bad = ~(np.isfinite(capacity_Bps) & (capacity_Bps > 0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"capacity_Bps: every capacity must be finite and > 0 (got {float(capacity_Bps[i])!r} "
                         f"at link {i})")
    flow_ptr = _as_int64("flow_ptr", flow_ptr)
    flow_links = _as_int64("flow_links", flow_links)
    if flow_ptr.size == 0 or flow_ptr[0] != 0 or flow_ptr[-1] != flow_links.size:
        raise ValueError(f"flow_ptr: must start at 0 and end at len(flow_links) = {flow_links.size} "
                         f"(got {flow_ptr[:1].tolist()}...{flow_ptr[-1:].tolist()})")
    if np.any(np.diff(flow_ptr) < 0):
        raise ValueError("flow_ptr: must be non-decreasing")
    if flow_links.size and (flow_links.min() < 0 or flow_links.max() >= capacity_Bps.size):
        i = int(np.flatnonzero((flow_links < 0) | (flow_links >= capacity_Bps.size))[0])
        raise ValueError(f"flow_links: link id {flow_links[i]} at hop {i} does not exist "
                         f"(links are 0..{capacity_Bps.size - 1})")
    n_flows = flow_ptr.size - 1
    if weights is None:
        weights = np.ones(n_flows)
    else:
        weights = np.ascontiguousarray(weights, dtype=np.float64)
        if weights.shape != (n_flows,):
            raise ValueError(f"weights: must have one entry per flow, {n_flows} (got shape {weights.shape})")
        if not np.all(np.isfinite(weights) & (weights > 0)):
            raise ValueError("weights: every weight must be finite and > 0")
    if not (0.0 <= rtol < 1e-3):
        raise ValueError(f"rtol: must be in [0, 1e-3) (got {rtol!r})")
    return capacity_Bps, flow_ptr, flow_links, weights


def _as_int64(name, a):
    arr = np.asarray(a)
    if arr.ndim != 1:
        raise ValueError(f"{name}: must be one-dimensional (got shape {arr.shape})")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name}: must hold integers (got dtype {arr.dtype})")
    return np.ascontiguousarray(arr, dtype=np.int64)


def solve(capacity_Bps, flow_ptr, flow_links, weights=None, *, rtol: float = 1e-9,
          check: bool = False) -> np.ndarray:
    """Max-min fair rate of every flow (bytes/s), by exact progressive filling.

    Parameters
    ----------
    capacity_Bps : float64[n_links]
        Link capacity in bytes per second; finite and > 0.
    flow_ptr : int[n_flows + 1]
        CSR offsets: flow f crosses ``flow_links[flow_ptr[f]:flow_ptr[f + 1]]``; starts at 0, non-decreasing,
        ends at ``len(flow_links)``.
    flow_links : int[n_hops]
        Link id of each hop, in [0, n_links). A link listed twice by one flow is loaded twice.
    weights : float64[n_flows], optional
        Multiplicity of each flow (that many identical flows merged into one); finite, > 0; default 1.
    rtol : float
        Relative tolerance in [0, 1e-3) of the optional certificate check; default 1e-9. (The filling itself
        is exact up to float64 round-off.)
    check : bool
        Debug flag: re-check the answer with :func:`check_maxmin` (costs about as much as the solve).

    Returns
    -------
    float64[n_flows]
        Rate of each flow in bytes/s (one flow of the class, not the class total); ``inf`` for a flow with
        an empty path.

    Raises
    ------
    ValueError
        An input breaks a rule; the message names the argument.
    MaxMinViolation
        Only with ``check=True``, if the answer fails the certificate (a flowsim bug).

    Examples
    --------
    Two flows share link 0 (capacity 10); flow 1 also crosses link 1 (capacity 3), which limits it to 3, so
    flow 0 gets the remaining 7:

    >>> solve([10.0, 3.0], [0, 1, 3], [0, 0, 1]).tolist()
    [7.0, 3.0]
    """
    capacity_Bps, flow_ptr, flow_links, weights = _check_routes(capacity_Bps, flow_ptr, flow_links, weights, rtol)
    rates = _solve_full(capacity_Bps, flow_ptr, flow_links, weights)
    if check:
        check_maxmin(capacity_Bps, flow_ptr, flow_links, rates, weights, rtol=max(rtol, 1e-9))
    return rates


def resolve(capacity_Bps, flow_ptr, flow_links, rates_Bps, active, changed, weights=None, *,
            rtol: float = 1e-9, local: bool = True) -> np.ndarray:
    """Re-solve after flows arrived or departed, keeping every rate that provably cannot change.

    Parameters
    ----------
    capacity_Bps, flow_ptr, flow_links, weights, rtol
        As in :func:`solve`; the paths cover every flow, active or not.
    rates_Bps : float64[n_flows]
        The max-min rates before the change (bytes/s) of the flows that were active then; other entries are
        ignored.
    active : bool[n_flows]
        Which flows are active after the change.
    changed : int[n_changed]
        The flows that arrived (active now, not before) or departed (active before, not now).
    local : bool
        True (default): re-fill a set of flows grown from the change until the max-min certificate holds
        (falls back to the restart below when the set grows large). False: re-fill every flow connected to
        the change whose old rate is at or above the restart level (research notes sec. 0.4).

    Returns
    -------
    float64[n_flows]
        The max-min rates of the active flows after the change (equal to ``solve`` on the active flows);
        0 for inactive flows.

    Raises
    ------
    ValueError
        An input breaks a rule; the message names the argument.
    """
    capacity_Bps, flow_ptr, flow_links, weights = _check_routes(capacity_Bps, flow_ptr, flow_links, weights, rtol)
    n_flows = flow_ptr.size - 1
    n_links = capacity_Bps.size
    active = np.asarray(active)
    if active.shape != (n_flows,) or active.dtype != np.bool_:
        raise ValueError(f"active: must be bool with one entry per flow, {n_flows} (got {active.dtype}, "
                         f"shape {active.shape})")
    changed = _as_int64("changed", changed)
    if changed.size and (changed.min() < 0 or changed.max() >= n_flows):
        raise ValueError(f"changed: flow ids must be in [0, {n_flows})")
    prev = np.asarray(rates_Bps, dtype=np.float64)
    if prev.shape != (n_flows,):
        raise ValueError(f"rates_Bps: must have one entry per flow, {n_flows} (got shape {prev.shape})")
    was_changed = np.zeros(n_flows, dtype=bool)
    was_changed[changed] = True
    kept = active & ~was_changed
    if np.any(~(prev[kept] >= 0)):
        raise ValueError("rates_Bps: the unchanged active flows must have rates >= 0 (not NaN)")
    was_active = kept | (was_changed & ~active)
    old = np.where(was_active, prev, 0.0)
    rate = np.where(kept, prev, 0.0)
    arrived = changed[active[changed]]
    departed = changed[~active[changed]]
    rate[arrived] = -1.0
    path_len = np.diff(flow_ptr)
    active_weight = np.bincount(flow_links, weights=np.repeat(weights * active, path_len), minlength=n_links)
    level = np.inf
    if departed.size:
        dep = prev[departed]
        if np.any(~(dep >= 0)):
            raise ValueError("rates_Bps: the departed flows must have rates >= 0 (not NaN)")
        level = float(dep.min())
    for g in arrived:
        level = min(level, _arrival_bound(capacity_Bps, flow_ptr, flow_links, active_weight, int(g)))
    if not changed.size:
        return rate
    level = level * (1.0 - rtol) if np.isfinite(level) else np.inf
    link_ptr, link_flows = _link_csr(n_links, flow_ptr, flow_links)
    bott = _bottlenecks(capacity_Bps, flow_ptr, flow_links, old, weights, rtol)
    clock = np.zeros(1, dtype=np.int64)
    link_mark = np.full(n_links, -1, dtype=np.int64)
    flow_mark = np.full(n_flows, -1, dtype=np.int64)
    todo = np.empty(n_flows, dtype=np.int64)
    touched = np.empty(n_links, dtype=np.int64)
    scratch = (np.zeros((n_links, 3)), np.empty(n_links, dtype=np.int64), np.empty(n_links),
               np.full(n_links, -1, dtype=np.int64))
    done = -1
    if local:
        done = _resolve_local(capacity_Bps, flow_ptr, flow_links, link_ptr, link_flows, weights, rate, old, bott,
                              changed, changed.size, clock, link_mark, np.full(n_links, -1, dtype=np.int64),
                              flow_mark, todo, np.empty(n_flows, dtype=np.int64), touched,
                              np.empty(n_links, dtype=np.int64), *scratch, n_flows, LOCAL_MAX_ROUNDS, float(rtol))
    if done < 0:
        _resolve(capacity_Bps, flow_ptr, flow_links, link_ptr, link_flows, weights, rate, level, changed,
                 changed.size, clock, link_mark, flow_mark, todo, touched, *scratch, bott)
    return rate


def _bottlenecks(capacity_Bps, flow_ptr, flow_links, rates, weights, rtol):
    """int64[n_flows]: a bottleneck link of each flow with a positive rate (saturated, no higher rate on it);
    -1 when there is none (inactive flows, empty paths)."""
    n_flows = flow_ptr.size - 1
    hop_flow = np.repeat(np.arange(n_flows), np.diff(flow_ptr))
    hop_rate = rates[hop_flow]
    load = np.bincount(flow_links, weights=hop_rate * weights[hop_flow], minlength=capacity_Bps.size)
    link_max = np.zeros(capacity_Bps.size)
    np.maximum.at(link_max, flow_links, hop_rate)
    tol = 0.25 * rtol  # the criterion of _resolve_local
    slack = (capacity_Bps - load)[flow_links]
    top = link_max[flow_links]
    ok = (slack <= tol * top + ROUNDOFF_RTOL * capacity_Bps[flow_links]) & (hop_rate >= top * (1 - tol)) \
        & (hop_rate > 0)
    bott = np.full(n_flows, -1, dtype=np.int64)
    idx = np.flatnonzero(ok)[::-1]  # the first valid hop of each flow wins
    bott[hop_flow[idx]] = flow_links[idx]
    return bott


def check_maxmin(capacity_Bps, flow_ptr, flow_links, rates_Bps, weights=None, *, rtol: float = 1e-9,
                 active=None) -> None:
    """Check the max-min certificate of a solution; raise :class:`MaxMinViolation` if it fails.

    The certificate (Bertsekas & Gallager sec. 6.5.2): (1) no link carries more than
    ``capacity * (1 + rtol)``; (2) every active flow with a non-empty path crosses a bottleneck link: one
    loaded to at least ``capacity * (1 - rtol)`` on which no flow has a rate above its own by more than
    ``rtol`` relative. Together they imply the allocation is the max-min fair one.

    Parameters
    ----------
    capacity_Bps, flow_ptr, flow_links, weights
        As in :func:`solve`.
    rates_Bps : float64[n_flows]
        Claimed rates, bytes/s.
    rtol : float
        Relative tolerance, >= 0.
    active : bool[n_flows], optional
        Flows to check (default all); inactive flows carry nothing.

    Raises
    ------
    MaxMinViolation
        With the first link over capacity or the first flow without a bottleneck.
    ValueError
        Bad input.
    """
    capacity_Bps, flow_ptr, flow_links, weights = _check_routes(capacity_Bps, flow_ptr, flow_links, weights,
                                                                min(rtol, 1e-4))
    n_flows = flow_ptr.size - 1
    rates = np.asarray(rates_Bps, dtype=np.float64)
    act = np.ones(n_flows, dtype=bool) if active is None else np.asarray(active, dtype=bool)
    path_len = np.diff(flow_ptr)
    hop_flow = np.repeat(np.arange(n_flows), path_len)
    hop_active = act[hop_flow]
    hop_rate = np.where(hop_active, rates[hop_flow], 0.0)
    if np.any(np.isnan(hop_rate)) or np.any(hop_rate < 0) or np.any(np.isinf(hop_rate)):
        raise MaxMinViolation("a flow on a link has a NaN, negative or infinite rate")
    load = np.bincount(flow_links, weights=hop_rate * weights[hop_flow], minlength=capacity_Bps.size)
    over = load > capacity_Bps * (1 + rtol)
    if over.any():
        l = int(np.flatnonzero(over)[0])
        raise MaxMinViolation(f"link {l} carries {float(load[l])!r} > capacity {float(capacity_Bps[l])!r}")
    link_max = np.zeros(capacity_Bps.size)
    np.maximum.at(link_max, flow_links, hop_rate)
    saturated = load >= capacity_Bps * (1 - rtol)
    hop_ok = saturated[flow_links] & (hop_rate >= link_max[flow_links] * (1 - rtol)) & hop_active
    ok = np.zeros(n_flows, dtype=bool)
    np.logical_or.at(ok, hop_flow, hop_ok)
    need = act & (path_len > 0)
    bad = need & ~ok
    if bad.any():
        f = int(np.flatnonzero(bad)[0])
        raise MaxMinViolation(f"flow {f} (rate {float(rates[f])!r}) has no bottleneck link on its path")
