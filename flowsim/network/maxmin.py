"""Exact max-min fair bandwidth sharing: progressive filling with an indexed heap of links.

Model: flows cross directed links; link ``l`` has capacity ``C_l`` (bytes/s); flow ``f`` stands for
``w_f`` identical flows (its weight, or multiplicity) that each get the rate ``x_f``. Link ``l`` carries
``sum_f a_lf * w_f * x_f <= C_l`` where ``a_lf`` is the number of times flow ``f`` lists link ``l`` (normally
0 or 1). The max-min fair allocation is the unique one in which no flow can get more without taking from a
flow that has less or the same (Bertsekas & Gallager, *Data Networks*, 2nd ed., sec. 6.5.2).

The solver kernels (progressive filling, the local re-solve and the restart from a level) are in
:mod:`flowsim.network.maxmin_kernels`; this module checks the inputs and holds the front-ends and the
certificate check.
"""
from __future__ import annotations

import numpy as np

from flowsim.network.maxmin_kernels import (ROUNDOFF_RTOL, _arrival_bound, _link_csr, _resolve, _resolve_local,
                                            _solve_full)

__all__ = ["solve", "resolve", "check_maxmin", "MaxMinViolation"]


class MaxMinViolation(AssertionError):
    """Solver output that breaks the max-min certificate (a bug in flowsim, not bad input)."""


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
    link_end = link_ptr[1:]  # every flow of a link: inactive ones carry rate 0
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
        done = _resolve_local(capacity_Bps, flow_ptr, flow_links, link_ptr, link_end, link_flows, weights, rate, old,
                              bott, changed, changed.size, clock, link_mark, np.full(n_links, -1, dtype=np.int64),
                              flow_mark, todo, np.empty(n_flows, dtype=np.int64), touched,
                              np.empty(n_links, dtype=np.int64), *scratch, np.empty(n_links),
                              np.zeros(n_links, dtype=np.int64), np.empty(n_flows), np.empty(n_flows, dtype=np.int64),
                              *(np.empty(n_flows, dtype=np.int64) for _ in range(3)), np.empty(n_links, dtype=np.int64),
                              n_flows, LOCAL_MAX_ROUNDS, float(rtol))
    if done < 0:
        _resolve(capacity_Bps, flow_ptr, flow_links, link_ptr, link_end, link_flows, weights, rate, level, changed,
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
