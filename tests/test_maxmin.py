"""Max-min solver: textbook known answers, certificate, reference comparison, incremental re-solve."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from flowsim.network.maxmin import MaxMinViolation, check_maxmin, resolve, solve
from flowsim.units import gbps_to_Bps
from reference_maxmin import reference_maxmin


def csr(paths):
    """flow_ptr, flow_links of a list of paths."""
    ptr = np.zeros(len(paths) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(p) for p in paths])
    links = np.array([l for p in paths for l in p], dtype=np.int64)
    return ptr, links


def run(capacity, paths, weights=None):
    ptr, links = csr(paths)
    return solve(np.array(capacity, dtype=float), ptr, links, weights, check=True)


# ------------------------------------------------------------------------------------------ known answers
def test_five_node_example():
    # Links AC=0, BC=1, CE=2, DE=3, capacity 1; flows ACE, BC, BC, DE, BCE.
    # BC carries 3 flows -> 1/3 each (BC, BC, BCE); CE then has 1 - 1/3 = 2/3 left for ACE; DE alone -> 1.
    rates = run([1, 1, 1, 1], [[0, 2], [1], [1], [3], [1, 2]])
    np.testing.assert_allclose(rates, [2 / 3, 1 / 3, 1 / 3, 1, 1 / 3], rtol=1e-12)


def test_parking_lot():
    # Three tandem links of capacity 1: the long flow and each short flow split every link: 1/2 each.
    rates = run([1, 1, 1], [[0, 1, 2], [0], [1], [2]])
    np.testing.assert_allclose(rates, [0.5] * 4, rtol=1e-12)


def test_unequal_capacities():
    # link0 (10) shared by f0, f1; link1 (3) only f1: f1 is held to 3, f0 takes 10 - 3 = 7.
    np.testing.assert_allclose(run([10, 3], [[0], [0, 1]]), [7, 3], rtol=1e-12)


def test_incast():
    # 8 senders, each on its own 400 Gb/s uplink, into one 400 Gb/s downlink (link 8): 400/8 = 50 Gb/s each.
    cap = [gbps_to_Bps(400)] * 9
    rates = run(cap, [[i, 8] for i in range(8)])
    np.testing.assert_allclose(rates, [gbps_to_Bps(50)] * 8, rtol=1e-12)


def test_local_min_counterexample():
    # Links [4, 3, 1]; flows {0}, {0,1}, {1,2}. Link 2 freezes f2 at 1; link 1 then has 3 - 1 = 2 for f1,
    # link 0 has 4 for f0 and f1 -> 2 each. Exact [2, 2, 1] (the local-min shortcut gives [2.25, 1.75, 1]).
    np.testing.assert_allclose(run([4, 3, 1], [[0], [0, 1], [1, 2]]), [2, 2, 1], rtol=1e-12)


# SimGrid src/kernel/lmm/maxmin_test.cpp maps onto multiplicities: penalty p -> weight 1/p, consumption
# weight a -> the link listed a times; SimGrid's rho is the class total weight * rate.
def test_simgrid_penalties():
    # C=3, penalties 1, 2: 3 = (1 + 1/2) x -> x = 2; totals (2, 1).
    w = np.array([1.0, 0.5])
    np.testing.assert_allclose(w * run([3], [[0], [0]], w), [2, 1], rtol=1e-12)


def test_simgrid_consumption_weights():
    # C=3, consumption 1, 2: 3 = x + 2x -> x = 1 for both.
    np.testing.assert_allclose(run([3], [[0], [0, 0]]), [1, 1], rtol=1e-12)


def test_simgrid_consumption_and_penalty():
    # C=20, consumption 1, 2, penalties 1, 2: 20 = x + 2 * (1/2) x -> x = 10; totals (10, 5).
    w = np.array([1.0, 0.5])
    np.testing.assert_allclose(w * run([20], [[0], [0, 0]], w), [10, 5], rtol=1e-12)


def test_simgrid_two_constraints():
    # C1=20 {r1*1, r2*2}, C2=60 {r1*2, r3*1}, penalties (1, 2, 1): link 0 share 20 / (1 + 2*1/2) = 10 is
    # the bottleneck (link 1: 60 / 3 = 20); r1 = r2 = 10; link 1 keeps 60 - 2*10 = 40 for r3.
    w = np.array([1.0, 0.5, 1.0])
    rates = run([20, 60], [[0, 1, 1], [0, 0], [1]], w)
    np.testing.assert_allclose(w * rates, [10, 5, 40], rtol=1e-12)


def test_empty_path_is_unconstrained():
    assert solve([1.0], [0, 0, 1], [0]).tolist() == [np.inf, 1.0]


def test_no_flows():
    assert solve([1.0], [0], []).shape == (0,)


def test_resolve_departure_keeps_lower_rates():
    # Parking lot; the long flow (rate 1/2) leaves: every short flow becomes 1.
    ptr, links = csr([[0, 1, 2], [0], [1], [2]])
    cap = np.ones(3)
    before = solve(cap, ptr, links)
    active = np.array([False, True, True, True])
    after = resolve(cap, ptr, links, before, active, [0])
    np.testing.assert_allclose(after, [0, 1, 1, 1], rtol=1e-12)


def test_resolve_arrival():
    # Unequal capacities; f1 arrives into link 0 held by f0 alone (rate 10): f1 = 3, f0 = 7.
    ptr, links = csr([[0], [0, 1]])
    cap = np.array([10.0, 3.0])
    after = resolve(cap, ptr, links, np.array([10.0, 0.0]), np.array([True, True]), [1])
    np.testing.assert_allclose(after, [7, 3], rtol=1e-12)


# ------------------------------------------------------------------------------------------ properties
@st.composite
def instances(draw):
    n_links = draw(st.integers(1, 7))
    cap = draw(st.lists(st.sampled_from([1.0, 2.0, 3.0, 5.0, 0.7, 12.5, 1e9]), min_size=n_links,
                        max_size=n_links))
    n_flows = draw(st.integers(1, 12))
    paths = [sorted(draw(st.sets(st.integers(0, n_links - 1), min_size=1, max_size=n_links)))
             for _ in range(n_flows)]
    weights = draw(st.none() | st.lists(st.sampled_from([1.0, 2.0, 3.0, 0.5]), min_size=n_flows,
                                        max_size=n_flows))
    return cap, paths, weights


@settings(max_examples=150, deadline=None)
@given(instances())
def test_solve_matches_reference_and_certificate(inst):
    cap, paths, weights = inst
    ptr, links = csr(paths)
    rates = solve(np.array(cap), ptr, links, weights)
    check_maxmin(np.array(cap), ptr, links, rates, weights)
    np.testing.assert_allclose(rates, reference_maxmin(cap, paths, weights), rtol=1e-9)


def subset_solve(cap, paths, weights, active):
    """Full solve on the active flows only, scattered back (0 for inactive)."""
    idx = np.flatnonzero(active)
    ptr, links = csr([paths[i] for i in idx])
    w = None if weights is None else np.asarray(weights)[idx]
    out = np.zeros(len(paths))
    out[idx] = solve(np.array(cap), ptr, links, w)
    return out


@pytest.mark.parametrize("local", [True, False])
@settings(max_examples=120, deadline=None)
@given(inst=instances(), data=st.data())
def test_incremental_equals_full(local, inst, data):
    cap, paths, weights = inst
    n = len(paths)
    before_active = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    changed = sorted(data.draw(st.sets(st.integers(0, n - 1), max_size=n)))
    after_active = before_active.copy()
    after_active[changed] = ~after_active[changed]
    before = subset_solve(cap, paths, weights, before_active)
    ptr, links = csr(paths)
    after = resolve(np.array(cap), ptr, links, before, after_active, np.array(changed, dtype=np.int64), weights,
                    local=local)
    np.testing.assert_allclose(after, subset_solve(cap, paths, weights, after_active), rtol=1e-9)
    check_maxmin(np.array(cap), ptr, links, after, weights, active=after_active)


def test_checker_rejects_wrong_answers():
    ptr, links = csr([[0], [0, 1]])
    cap = np.array([10.0, 3.0])
    with pytest.raises(MaxMinViolation, match="link 0 carries"):
        check_maxmin(cap, ptr, links, np.array([8.0, 3.0]))
    with pytest.raises(MaxMinViolation, match="flow 0 .* no bottleneck"):
        check_maxmin(cap, ptr, links, np.array([6.0, 3.0]))


# ------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("cap, msg", [
    ([1.0, -2.0], r"capacity_Bps: every capacity must be finite and > 0 \(got -2.0 at link 1\)"),
    ([0.0, 1.0], r"capacity_Bps: every capacity must be finite and > 0 \(got 0.0 at link 0\)"),
    ([np.nan, 1.0], r"capacity_Bps: every capacity must be finite and > 0 \(got nan at link 0\)"),
])
def test_bad_capacity(cap, msg):
    with pytest.raises(ValueError, match=msg):
        solve(cap, [0, 1], [0])


def test_link_that_does_not_exist():
    with pytest.raises(ValueError, match=r"flow_links: link id 5 at hop 1 does not exist \(links are 0..1\)"):
        solve([1.0, 1.0], [0, 2], [0, 5])


def test_bad_ptr_and_weights():
    with pytest.raises(ValueError, match="flow_ptr: must start at 0 and end at len"):
        solve([1.0], [0, 2], [0])
    with pytest.raises(ValueError, match="flow_ptr: must be non-decreasing"):
        solve([1.0], [0, 2, 1, 2], [0, 0])
    with pytest.raises(ValueError, match="flow_links: must hold integers"):
        solve([1.0], [0, 1], [0.5])
    with pytest.raises(ValueError, match="weights: every weight must be finite and > 0"):
        solve([1.0], [0, 1], [0], weights=[0.0])
    with pytest.raises(ValueError, match=r"weights: must have one entry per flow, 1 \(got shape \(2,\)\)"):
        solve([1.0], [0, 1], [0], weights=[1.0, 1.0])


def test_kernels_run_without_jit():
    code = ("import numpy as np; from flowsim.network.maxmin import solve, resolve;"
            "r = solve([4.0, 3.0, 1.0], [0, 1, 3, 5], [0, 0, 1, 1, 2]); assert r.tolist() == [2.0, 2.0, 1.0], r;"
            "r2 = resolve([4.0, 3.0, 1.0], [0, 1, 3, 5], [0, 0, 1, 1, 2], r, np.array([True, True, False]), [2]);"
            "assert np.allclose(r2, [2.0, 2.0, 0.0]), r2;"
            "from flowsim.network.netsim import simulate;"
            "s = simulate([10.0], [0, 1, 2], [0, 0], [10.0, 10.0], release_s=[0.0, 0.5]);"
            "assert np.allclose(s.finish_s, [1.5, 2.0]), s.finish_s")
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


# ------------------------------------------------------------------------------------------ indexed heap
@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=40), st.data())
def test_indexed_heap_pops_in_key_order(keys, data):
    from flowsim.network.net_heap import _heap_pop, _heap_push, _heap_update

    n = len(keys)
    heap, hkey, pos = np.empty(n, dtype=np.int64), np.empty(n), np.full(n, -1, dtype=np.int64)
    size = 0
    for item, k in enumerate(keys):
        size = _heap_push(heap, hkey, pos, size, item, k)
    final = list(keys)
    for item in data.draw(st.lists(st.integers(0, n - 1), max_size=n)):
        final[item] = data.draw(st.floats(0, 100, allow_nan=False))
        _heap_update(heap, hkey, pos, size, item, final[item])
    order = []
    while size:
        item, size = _heap_pop(heap, hkey, pos, size)
        order.append(item)
    assert order == sorted(range(n), key=lambda i: (final[i], i))  # ties by smaller id
    assert np.all(pos == -1)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["push", "pop", "update"]), st.integers(0, 29),
                          st.sampled_from([0.0, 1.0, 2.5, 7.0, 7.0, 40.0])), min_size=1, max_size=200))
def test_indexed_heap_stays_valid_under_mixed_operations(ops):
    """Pushes, pops (bottom-up) and key updates interleaved, with many equal keys: every pop returns the least
    (key, id) present, and after every operation the heap is ordered and ``pos`` indexes it."""
    from flowsim.network.net_heap import _heap_pop, _heap_push, _heap_update

    n = 30
    heap, hkey, pos = np.empty(n, dtype=np.int64), np.empty(n), np.full(n, -1, dtype=np.int64)
    size, present = 0, {}
    for op, item, k in ops:
        if op == "push" and item not in present:
            size = _heap_push(heap, hkey, pos, size, item, k)
            present[item] = k
        elif op == "update" and item in present:
            _heap_update(heap, hkey, pos, size, item, k)
            present[item] = k
        elif op == "pop" and present:
            got, size = _heap_pop(heap, hkey, pos, size)
            assert got == min(present, key=lambda i: (present[i], i))
            del present[got]
        assert size == len(present)
        for i in range(1, size):
            parent = (i - 1) // 2
            assert (hkey[parent], heap[parent]) < (hkey[i], heap[i])
        assert all(pos[heap[i]] == i for i in range(size))
        assert all(pos[i] == -1 for i in range(n) if i not in present)
        assert all(hkey[pos[i]] == k for i, k in present.items())
