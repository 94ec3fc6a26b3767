"""maxmin_kernels._resolve_local (rounds that repeat only the work whose inputs moved, issue 22 session 12) against
the previous kernel, kept below as the slow reference: the same rates and bottlenecks bit for bit, the same
re-filled set, the same give-ups, on random re-solves in both calling conventions (the event loop's lists of
draining flows per link, and maxmin.resolve's lists of every flow with inactive ones at rate 0)."""
from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from flowsim.network.maxmin import _bottlenecks
from flowsim.network.maxmin_kernels import (ROUNDOFF_RTOL, _add_flow, _fill, _link_csr, _resolve_local,
                                            _solve_full)


@njit
def _resolve_local_reference(capacity_Bps, flow_ptr, flow_links, link_ptr, link_end, link_flows, weights, rate_Bps,
                             old_rate_Bps, bott, seeds, n_seeds, clock, link_mark, changed_mark, flow_mark, todo,
                             saved_bott, touched, changed, state, heap, hkey, pos, max_todo, max_rounds, rtol):
    """The local re-solve before session 12 (commit d1e55cc): every round sums every touched link's residual and
    checks every changed link and every re-filled flow's bottleneck again."""
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
            for j in range(link_ptr[m], link_end[m]):
                g = link_flows[j]
                if flow_mark[g] != stamp:
                    r -= weights[g] * rate_Bps[g]
            state[m, 0] = r
        _fill(flow_ptr, flow_links, link_ptr, link_end, link_flows, weights, rate_Bps, todo, n_todo, touched,
              n_touched, state, heap, hkey, pos, bott)
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
        for i in range(n_changed):
            m = changed[i]
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
        for i in range(n_before):
            f = todo[i]
            b = bott[f]
            if b < 0:
                continue
            for j in range(link_ptr[b], link_end[b]):
                g = link_flows[j]
                if flow_mark[g] != stamp and rate_Bps[g] > rate_Bps[f] * (1.0 + tol):
                    n_todo = _add_flow(g, stamp, flow_mark, todo, saved_bott, bott, n_todo)
        if n_todo == n_before:
            return n_todo
        if n_todo > max_todo:
            break
    for i in range(n_todo):
        f = todo[i]
        rate_Bps[f] = old_rate_Bps[f] if old_rate_Bps[f] > 0.0 else -1.0
        bott[f] = saved_bott[i]
    return -1


def _case(seed: int) -> dict:
    """A random re-solve: flows over shared links at their max-min rates, then some depart and some arrive."""
    rng = np.random.default_rng(seed)
    n_links = int(rng.integers(3, 120))
    n_flows = int(rng.integers(4, 600))
    lengths = rng.integers(1, 5, n_flows)
    flow_ptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    if rng.random() < 0.5:  # a few shared links, as spines are
        hub = rng.integers(0, n_links, max(1, n_links // 5))
        flow_links = np.where(rng.random(flow_ptr[-1]) < 0.4, rng.choice(hub, flow_ptr[-1]),
                              rng.integers(0, n_links, flow_ptr[-1])).astype(np.int64)
    else:  # overlapping runs of consecutive links: changes travel along the chain over several rounds
        first = np.repeat(rng.integers(0, n_links, n_flows), lengths)
        flow_links = ((first + np.arange(flow_ptr[-1]) - np.repeat(flow_ptr[:-1], lengths)) % n_links).astype(
            np.int64)
    capacity = (rng.choice([10.0, 25.0, 40.0, 100.0], n_links) if rng.random() < 0.5
                else rng.uniform(5.0, 100.0, n_links))
    weights = rng.integers(1, 5, n_flows).astype(np.float64) if rng.random() < 0.3 else np.ones(n_flows)
    was = rng.random(n_flows) < rng.uniform(0.3, 0.95)
    sub = np.flatnonzero(was)
    sub_ptr = np.concatenate([[0], np.cumsum(lengths[sub])]).astype(np.int64)
    sub_links = np.concatenate([flow_links[flow_ptr[f]:flow_ptr[f + 1]] for f in sub]) if sub.size else \
        np.zeros(0, np.int64)
    prev = np.zeros(n_flows)
    prev[sub] = _solve_full(capacity, sub_ptr, sub_links, weights[sub])
    departed = sub[rng.random(sub.size) < rng.uniform(0.0, 0.3)]
    arrived = np.flatnonzero(~was)
    arrived = arrived[rng.random(arrived.size) < rng.uniform(0.0, 0.3)]
    if departed.size + arrived.size == 0:
        departed = sub[:1]
    seeds = rng.permutation(np.concatenate([departed, arrived])).astype(np.int64)
    now = was.copy()
    now[departed] = False
    now[arrived] = True
    rate = np.where(now, prev, 0.0)
    rate[arrived] = -1.0
    event_loop = rng.random() < 0.5
    # The event loop passes committed rates (0 for the departed) and lists of draining flows; maxmin.resolve
    # passes the old rates and every flow of each link.
    old = np.where(was & now, prev, 0.0) if event_loop else np.where(was, prev, 0.0)
    link_ptr, link_flows = _link_csr(n_links, flow_ptr, flow_links)
    if event_loop:
        link_end = link_ptr[:-1].copy()
        active = np.empty_like(link_flows)
        for l in range(n_links):
            on = link_flows[link_ptr[l]:link_ptr[l + 1]]
            on = on[now[on]]
            active[link_ptr[l]:link_ptr[l] + on.size] = on
            link_end[l] = link_ptr[l] + on.size
        link_flows = active
    else:
        link_end = link_ptr[1:].copy()
    bott = _bottlenecks(capacity, flow_ptr, flow_links, np.where(was & now, prev, 0.0), weights, 1e-9)
    return dict(capacity=capacity, flow_ptr=flow_ptr, flow_links=flow_links, link_ptr=link_ptr, link_end=link_end,
                link_flows=link_flows, weights=weights, rate=rate, old=old, bott=bott, seeds=seeds,
                max_todo=int(rng.choice([2, 8, n_flows])), max_rounds=int(rng.choice([1, 2, 4, 16])),
                rtol=float(rng.choice([0.0, 1e-9, 1e-6])))


def _scratch(n_flows: int, n_links: int) -> dict:
    return dict(clock=np.zeros(1, np.int64), link_mark=np.full(n_links, -1, np.int64),
                changed_mark=np.full(n_links, -1, np.int64), flow_mark=np.full(n_flows, -1, np.int64),
                todo=np.empty(n_flows, np.int64), saved_bott=np.empty(n_flows, np.int64),
                touched=np.empty(n_links, np.int64), changed=np.empty(n_links, np.int64),
                state=np.zeros((n_links, 3)), heap=np.empty(n_links, np.int64), hkey=np.empty(n_links),
                pos=np.full(n_links, -1, np.int64))


def _run(c: dict, new: bool) -> tuple:
    n_flows, n_links = c["flow_ptr"].size - 1, c["capacity"].size
    rate, bott, s = c["rate"].copy(), c["bott"].copy(), _scratch(n_flows, n_links)
    head = (c["capacity"], c["flow_ptr"], c["flow_links"], c["link_ptr"], c["link_end"], c["link_flows"],
            c["weights"], rate, c["old"], bott, c["seeds"], c["seeds"].size, s["clock"], s["link_mark"],
            s["changed_mark"], s["flow_mark"], s["todo"], s["saved_bott"], s["touched"], s["changed"], s["state"],
            s["heap"], s["hkey"], s["pos"])
    tail = (c["max_todo"], c["max_rounds"], c["rtol"])
    n_diff = np.zeros(n_links, np.int64)
    if new:
        n = _resolve_local(*head, np.full(n_links, 7.0), n_diff, np.full(n_flows, 3.0),
                           np.full(n_flows, 5, np.int64), *(np.full(n_flows, 9, np.int64) for _ in range(3)),
                           np.full(n_links, 9, np.int64), *tail)
    else:
        n = _resolve_local_reference(*head, *tail)
    assert not n_diff.any()  # left as found
    assert (s["pos"] == -1).all()
    return n, rate, bott, np.sort(s["todo"][:max(n, 0)])


@pytest.mark.parametrize("block", range(8))
def test_local_resolve_matches_the_previous_kernel_bit_for_bit(block):
    outcomes = set()
    for seed in range(block * 1000, (block + 1) * 1000):
        c = _case(seed)
        n_ref, rate_ref, bott_ref, set_ref = _run(c, new=False)
        n_new, rate_new, bott_new, set_new = _run(c, new=True)
        assert n_new == n_ref, seed
        assert np.array_equal(rate_new, rate_ref), seed  # bit for bit: no tolerance
        assert np.array_equal(bott_new, bott_ref), seed
        assert np.array_equal(set_new, set_ref), seed
        arrivals = int((c["rate"][c["seeds"]] < 0).sum())
        outcomes.add("gave up" if n_ref < 0 else "grew" if n_ref > arrivals else "arrivals only")
    assert outcomes == {"gave up", "grew", "arrivals only"}  # the cases reach every path


@pytest.mark.parametrize("block", range(2))
def test_fill_of_arrivals_alone_equals_the_level_restart_at_zero(block):
    """When every active flow just arrived (a window's start), _fill_arrivals gives the rates and bottlenecks of
    _resolve at level 0 bit for bit (the event loop's first fill), and leaves the heap positions as found."""
    from flowsim.network.maxmin_kernels import _fill_arrivals, _resolve

    for seed in range(block * 500, (block + 1) * 500):
        c = _case(seed)
        n_flows, n_links = c["flow_ptr"].size - 1, c["capacity"].size
        now = np.flatnonzero(c["rate"] != 0.0)  # the flows active after the change, all arriving now
        link_end = c["link_ptr"][:-1].copy()
        active = np.empty_like(c["link_flows"])
        on_all = np.zeros(n_flows, bool)
        on_all[now] = True
        link_ptr, link_flows = _link_csr(n_links, c["flow_ptr"], c["flow_links"])
        for l in range(n_links):
            on = link_flows[link_ptr[l]:link_ptr[l + 1]]
            on = on[on_all[on]]
            active[link_ptr[l]:link_ptr[l] + on.size] = on
            link_end[l] = link_ptr[l] + on.size
        seeds = np.random.default_rng(seed).permutation(now).astype(np.int64)
        out = []
        for fill in (_resolve, _fill_arrivals):
            rate = np.zeros(n_flows)
            rate[now] = -1.0
            bott = np.full(n_flows, -1, np.int64)
            s = _scratch(n_flows, n_links)
            common = (c["capacity"], c["flow_ptr"], c["flow_links"], link_ptr, link_end, active, c["weights"], rate)
            if fill is _resolve:
                n = _resolve(*common, 0.0, seeds, seeds.size, s["clock"], s["link_mark"], s["flow_mark"], s["todo"],
                             s["touched"], s["state"], s["heap"], s["hkey"], s["pos"], bott)
            else:
                n = _fill_arrivals(*common, seeds, seeds.size, s["clock"], s["link_mark"], s["todo"], s["touched"],
                                   s["state"], s["heap"], s["hkey"], s["pos"], bott)
            assert (s["pos"] == -1).all()
            out.append((n, rate, bott, np.sort(s["todo"][:n])))
        assert out[0][0] == out[1][0] == now.size, seed
        for a, b in zip(out[0][1:], out[1][1:]):
            assert np.array_equal(a, b), seed
