"""Slow, obviously correct max-min fair sharing for tests: textbook progressive filling over dicts.

Bertsekas & Gallager, *Data Networks*, 2nd ed., sec. 6.5.2: raise the rate of every unfrozen flow at the
same speed; when a link is full, freeze every flow on it; repeat until every flow is frozen. Here the
"speed" step is computed exactly: the next level is the smallest share remaining / unfrozen weight.
"""
from __future__ import annotations


def reference_maxmin(capacity, paths, weights=None, rtol=1e-12):
    """Max-min fair rate of each flow.

    Parameters
    ----------
    capacity : list[float]
        Capacity of each link.
    paths : list[list[int]]
        Links of each flow (a link listed twice counts twice).
    weights : list[float], optional
        Multiplicity of each flow (default 1).
    rtol : float
        Links whose share is within this relative distance of the minimum saturate together.

    Returns
    -------
    list[float]
        Rate of each flow (``inf`` for an empty path).
    """
    n = len(paths)
    w = [1.0] * n if weights is None else list(weights)
    rate = {f: 0.0 for f in range(n)}
    unfrozen = {f for f in range(n) if paths[f]}
    frozen_load = {l: 0.0 for l in range(len(capacity))}
    while unfrozen:
        weight_on = {}
        for f in unfrozen:
            for l in paths[f]:
                weight_on[l] = weight_on.get(l, 0.0) + w[f]
        share = {l: (capacity[l] - frozen_load[l]) / weight_on[l] for l in weight_on}
        level = min(share.values())
        full = {l for l, s in share.items() if s <= level * (1 + rtol)}
        newly = {f for f in unfrozen if any(l in full for l in paths[f])}
        for f in newly:
            rate[f] = level
            for l in paths[f]:
                frozen_load[l] += w[f] * level
        unfrozen -= newly
    return [rate[f] if paths[f] else float("inf") for f in range(n)]


def reference_simulate(capacity, paths, size, release, deps, latency):
    """Brute-force fluid event simulation: full max-min re-solve at every event, one event at a time.

    Parameters
    ----------
    capacity : list[float]
        Link capacities, bytes/s.
    paths : list[list[int]]
        Links of each transfer.
    size, release, latency : list[float]
        Bytes, earliest start (s) and drain-end-to-finish delay (s) of each transfer.
    deps : list[list[int]]
        Transfers each transfer waits for.

    Returns
    -------
    start, finish : list[float]
        Seconds.
    """
    n = len(size)
    start = [None] * n
    finish = [None] * n
    remaining = list(size)
    active = []
    now = 0.0
    while any(f is None for f in finish):
        ready = {t: max([release[t]] + [finish[d] for d in deps[t]]) for t in range(n)
                 if start[t] is None and all(finish[d] is not None for d in deps[t])}
        rates = dict(zip(active, reference_maxmin(capacity, [paths[t] for t in active]))) if active else {}
        next_start = min(ready.values(), default=float("inf"))
        next_done = min((now + remaining[t] / rates[t] for t in active), default=float("inf"))
        t_next = min(next_start, next_done)
        for t in active:
            remaining[t] -= rates[t] * (t_next - now)
        now = t_next
        for t in list(active):
            if remaining[t] <= 1e-12 * size[t]:
                active.remove(t)
                finish[t] = now + latency[t]
        for t, r in ready.items():
            if r <= now:
                start[t] = now
                if size[t] == 0 or not paths[t]:
                    finish[t] = now + latency[t]
                else:
                    active.append(t)
    return start, finish
