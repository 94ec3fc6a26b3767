"""The flow simulation by symmetry (one transfer per class of interchangeable ones with a multiplicity,
flowsim.network.symmetry) gives the explicit simulation's times: on random transfer sets with copied components,
on symmetric groups sharing links, and on whole steps of the flow engine."""
import functools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import flowsim
from flowsim.network import collective_flows, symmetry
from flowsim.network.lru import BytesLRU
from flowsim.network.netsim import simulate
from flowsim.network.symmetry import quotient
from flowsim.step import flows as step_flows
from reference_maxmin import reference_simulate

RTOL = 1e-9
"""Times agree to the event loop's batching tolerance (netsim's default rtol; flowsim.network.symmetry)."""


def _close(a, b):
    return np.all(np.abs(a - b) <= RTOL * np.maximum(np.abs(b), 1e-300))


@st.composite
def _copied_components(draw):
    """A random component (paths over its own links, sizes, releases, latencies, dependencies on earlier
    transfers), ``k`` copies of it with their transfers interleaved and their links shuffled among all, and one
    more random component; returns the netsim inputs and whether copies keep their transfer order."""
    n_l = draw(st.integers(1, 5))
    m = draw(st.integers(1, 6))
    k = draw(st.integers(2, 4))
    paths = [draw(st.lists(st.integers(0, n_l - 1), min_size=1, max_size=3, unique=True)) for _ in range(m)]
    size = draw(st.lists(st.sampled_from([0.0, 1e3, 2e3, 5e3, 1e4]), min_size=m, max_size=m))
    release = draw(st.lists(st.sampled_from([0.0, 1e-6, 3e-6]), min_size=m, max_size=m))
    latency = draw(st.lists(st.sampled_from([0.0, 2e-6]), min_size=m, max_size=m))
    deps = [draw(st.lists(st.integers(0, j - 1), max_size=2, unique=True)) if j else [] for j in range(m)]
    cap = draw(st.lists(st.sampled_from([1e9, 2e9, 5e9]), min_size=n_l, max_size=n_l))
    # one more, different component: a single transfer over its own link
    perm = np.random.default_rng(draw(st.integers(0, 2**16))).permutation(k * n_l + 1)
    n = k * m + 1
    tid = lambda c, j: j * k + c  # noqa: E731  transfer j of copy c (copies interleaved, order kept)
    route = [None] * n
    dep = [None] * n
    for c in range(k):
        for j in range(m):
            route[tid(c, j)] = [int(perm[c * n_l + li]) for li in paths[j]]
            dep[tid(c, j)] = [tid(c, d) for d in deps[j]]
    route[n - 1], dep[n - 1] = [int(perm[k * n_l])], []
    capacity = np.empty(k * n_l + 1)
    for c in range(k):
        capacity[perm[c * n_l:(c + 1) * n_l]] = cap
    capacity[perm[k * n_l]] = 3e9
    ptr = np.cumsum([0] + [len(r) for r in route])
    dep_ptr = np.cumsum([0] + [len(d) for d in dep])
    tile = lambda v, last: np.array([v[j] for j in range(m) for _ in range(k)] + [last])  # noqa: E731
    return dict(capacity_Bps=capacity, route_ptr=ptr, route_links=np.concatenate(route).astype(np.int64),
                size_bytes=tile(size, 7e3), release_s=tile(release, 0.0), latency_s=tile(latency, 1e-6),
                dep_ptr=dep_ptr, dep_idx=np.array(sum(dep, []), dtype=np.int64))


@settings(max_examples=60, deadline=None)
@given(_copied_components())
def test_quotient_equals_the_explicit_simulation(case):
    args = dict(case)
    pos = [args.pop(k) for k in ("capacity_Bps", "route_ptr", "route_links", "size_bytes")]
    fast, slow = simulate(*pos, **args), simulate(*pos, **args, symmetry=False)
    assert _close(fast.start_s, slow.start_s) and _close(fast.finish_s, slow.finish_s)
    assert _close(fast.link_busy_s, slow.link_busy_s)
    np.testing.assert_array_equal(fast.link_bytes, slow.link_bytes)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(symmetry, "MAX_CLASS_FRACTION", 1.0)  # build the quotient however little it saves
        q = quotient(np.asarray(case["capacity_Bps"]), case["route_ptr"], case["route_links"],
                     np.asarray(case["size_bytes"], float), np.asarray(case["release_s"], float),
                     np.asarray(case["latency_s"], float), case["dep_ptr"], case["dep_idx"])
    assert q is not None and q.n_classes < case["route_ptr"].size - 1  # the copies were recognised


@st.composite
def _rotated_groups(draw):
    """``k`` rotated copies of a random transfer pattern over ``k * n_l`` own links that also share ``n_s``
    links (one component, no identical copies): the ranks of a collective behind one switch. Returns the netsim
    inputs and the paths and dependency lists of the slow reference."""
    n_l, n_s = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    m, k = draw(st.integers(1, 4)), draw(st.integers(2, 4))
    # a transfer of copy c crosses own links of copies c + shift (shift 0: its own), and shared links
    hops = [draw(st.lists(st.tuples(st.integers(0, n_l - 1), st.integers(0, k - 1)), min_size=1, max_size=3,
                          unique=True)) for _ in range(m)]
    shared = [draw(st.lists(st.integers(0, n_s - 1), max_size=n_s, unique=True)) for _ in range(m)]
    size = draw(st.lists(st.sampled_from([0.0, 1e3, 2e3, 5e3]), min_size=m, max_size=m))
    release = draw(st.lists(st.sampled_from([0.0, 1e-6]), min_size=m, max_size=m))
    deps = [draw(st.lists(st.integers(0, j - 1), max_size=2, unique=True)) if j else [] for j in range(m)]
    cap = draw(st.lists(st.sampled_from([1e9, 2e9]), min_size=n_l, max_size=n_l))
    paths, dep = [], []
    for c in range(k):
        for j in range(m):
            paths.append([((c + sh) % k) * n_l + li for li, sh in hops[j]] + [k * n_l + s for s in shared[j]])
            dep.append([c * m + d for d in deps[j]])
    n = k * m
    capacity = [cap[li] for _ in range(k) for li in range(n_l)] + [3e9] * n_s
    tile = lambda v: [v[t % m] for t in range(n)]  # noqa: E731
    return capacity, paths, tile(size), tile(release), dep, [1e-6] * n


@settings(max_examples=60, deadline=None)
@given(_rotated_groups())
def test_symmetric_groups_sharing_links_match_the_slow_reference(inst):
    cap, paths, size, release, deps, latency = inst
    ptr = np.r_[0, np.cumsum([len(p) for p in paths])]
    links = np.array([l for p in paths for l in p], dtype=np.int64)
    dptr = np.r_[0, np.cumsum([len(d) for d in deps])]
    didx = np.array([d for ds in deps for d in ds], dtype=np.int64)
    args = dict(release_s=release, dep_ptr=dptr, dep_idx=didx, latency_s=latency)
    fast, slow = simulate(cap, ptr, links, size, **args), simulate(cap, ptr, links, size, **args, symmetry=False)
    start, finish = reference_simulate(cap, paths, size, release, deps, latency)
    np.testing.assert_allclose(fast.start_s, start, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(fast.finish_s, finish, rtol=1e-9, atol=1e-15)
    assert _close(fast.link_busy_s, slow.link_busy_s)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(symmetry, "MAX_CLASS_FRACTION", 1.0)
        q = quotient(np.asarray(cap, float), ptr, links, np.asarray(size, float), np.asarray(release, float),
                     np.asarray(latency, float), dptr, didx)
    assert q is not None and q.n_classes <= len(paths) // 2  # the k rotations are one class


def test_components_that_differ_are_not_merged():
    # two transfers on two links that differ only in capacity: two classes, nothing to save
    args = ([1e9, 2e9], [0, 1, 2], np.array([0, 1]), np.array([1e3, 1e3]), np.zeros(2), np.zeros(2),
            np.zeros(3, dtype=np.int64), np.zeros(0, dtype=np.int64))
    assert quotient(np.asarray(args[0]), np.asarray(args[1]), *args[2:]) is None
    res = simulate([1e9, 2e9, 1e9], [0, 1, 2, 3], [0, 1, 2], [1e3, 1e3, 1e3])
    assert res.finish_s.tolist() == [1e-6, 5e-7, 1e-6]


def test_quotient_is_reused_for_the_same_structure_at_other_sizes(monkeypatch):
    monkeypatch.setattr(symmetry, "MAX_CLASS_FRACTION", 1.0)  # build the quotient however little it saves
    # four copies of a two-step chain over their own links, sharing link 0: one class per step
    cap = np.array([4e9, 1e9, 1e9, 1e9, 1e9])
    ptr = np.arange(0, 17, 2)
    links = np.array([l for c in range(4) for l in (0, c + 1, 0, c + 1)])
    dptr = np.repeat(np.arange(5), 2)[:-1]  # transfer 2c + 1 waits for 2c
    didx = np.arange(0, 8, 2)
    zeros = np.zeros(8)

    def q(size):
        return quotient(cap, ptr, links, np.asarray(size, float), zeros, zeros, dptr, didx)

    first = q([1e6] * 8)
    assert first is not None and first.n_classes == 2
    assert q([3e6] * 8) is first  # equal sizes again: the partition is the same
    uneven = q([1e6, 1e6, 1e6, 1e6, 3e6, 3e6, 3e6, 3e6])
    assert uneven is not first and uneven.n_classes == 4
    for size in ([3e6] * 8, [1e6] * 4 + [3e6] * 4):
        paths = [list(links[ptr[t]:ptr[t + 1]]) for t in range(8)]
        _, finish = reference_simulate(cap, paths, size, zeros, [[t - 1] if t % 2 else [] for t in range(8)], zeros)
        res = simulate(cap, ptr, links, size, dep_ptr=dptr, dep_idx=didx)
        np.testing.assert_allclose(res.finish_s, finish, rtol=1e-9)


FLOW_CASES = {
    "gpt3 dp rails": dict(model="gpt3-175b", cluster="dgx-h100", gpus=256, tp=8, pp=4, gbs=128, sp=True,
                          distributed_optimizer=True),
    "mixtral ep": dict(model="mixtral-8x7b", cluster="dgx-h100", gpus=64, tp=2, pp=2, ep=4, gbs=64, sp=True,
                       distributed_optimizer=True),
}


@pytest.mark.parametrize("name", FLOW_CASES)
def test_flow_step_by_symmetry_equals_the_explicit_one(name, monkeypatch):
    cfg = flowsim.build_config(**FLOW_CASES[name], comm_engine="flow")

    def run():
        step_flows._flow.cache_clear()
        step_flows._together_s.cache_clear()
        return flowsim.simulate(cfg).to_dict()

    fast = run()
    monkeypatch.setattr(collective_flows, "simulate", functools.partial(simulate, symmetry=False))
    slow = run()
    assert fast["step_time_s"] == pytest.approx(slow["step_time_s"], rel=RTOL)
    for a, b in zip(fast["stages"], slow["stages"]):
        for key, value in b.items():
            if isinstance(value, float):
                assert a[key] == pytest.approx(value, rel=RTOL, abs=1e-15), key


def test_prepared_collectives_are_reused_and_bounded_by_bytes():
    from flowsim.config import build_config
    from flowsim.gpu_specs import get_gpu

    cfg = build_config(model="llama3-8b", cluster="dgx-h100", gpus=32, tp=8, gbs=32)
    gpu = get_gpu("h100-sxm")
    groups = np.array([[0, 8, 16, 24], [1, 9, 17, 25]])
    first = collective_flows._prepare(cfg.cluster, gpu, "allreduce", 1e8, groups, None, None, True, 8192)
    again = collective_flows._prepare(cfg.cluster, gpu, "allreduce", 1e8, groups.copy(), None, None, True, 8192)
    assert again is first and not first.links.flags.writeable
    cache = BytesLRU(max_bytes=100)
    for k in range(3):
        cache.put(k, str(k), 60)
    assert cache.get(0) is None and cache.get(1) is None and cache.get(2) == "2" and cache.bytes == 60


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the hashes' sums wrap, as in numba
def test_refinement_that_explodes_stops_after_that_round(monkeypatch):
    # 2,048 equal transfers over three random links of 500 each (hash ECMP): one class until a round sees the
    # links' loads, then hundreds at once; the refinement ends there (MAX_ROUND_GROWTH), without the extra round
    # that would pass the class cap, and with the same answer: no quotient, the explicit simulation's times
    rng = np.random.default_rng(7)
    n, n_l = 2048, 500
    links = np.concatenate([rng.choice(n_l, 3, replace=False) for _ in range(n)]).astype(np.int64)
    ptr = np.arange(0, 3 * n + 1, 3, dtype=np.int64)
    cap, size = np.full(n_l, 1e10), np.full(n, 1e6)
    zeros, dptr, didx = np.zeros(n), np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.int64)
    used = np.flatnonzero(np.bincount(links, minlength=n_l))
    bits = (size.view(np.int64), zeros.view(np.int64), zeros.view(np.int64), cap.view(np.int64))
    max_classes = int(n * symmetry.MAX_CLASS_FRACTION)

    args = (ptr, links, dptr, didx, used, *bits, symmetry.MAX_ROUNDS, max_classes)
    _, n_tc, _, _, stable = symmetry._refine(*args)
    assert not stable and n_tc < symmetry.GROWTH_MIN_CLASSES  # stopped before accepting the exploding round
    # without the growth stop (the Python function reads the module's globals at each call), one more round:
    # past the class cap, so no quotient either way
    monkeypatch.setattr(symmetry, "MAX_ROUND_GROWTH", n)
    _, n_tc, _, _, stable = symmetry._refine.py_func(*args)
    assert not stable and n_tc > max_classes
    assert quotient(cap, ptr, links, size, zeros, zeros, dptr, didx) is None
    fast, slow = simulate(cap, ptr, links, size), simulate(cap, ptr, links, size, symmetry=False)
    assert np.array_equal(fast.finish_s, slow.finish_s)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(-2**62, 2**62) | st.integers(0, 5), min_size=1, max_size=60), min_size=1,
                max_size=6))
def test_dense_colours_through_one_reused_table(key_lists):
    """Refinement rounds share one hash table (symmetry._dense_into): each call numbers its keys by first
    occurrence, as a dictionary does, and leaves the table empty for the next."""
    tab = symmetry._table(max(len(k) for k in key_lists))
    for keys in key_lists:
        first = {}
        want = [first.setdefault(k, len(first)) for k in keys]
        got, n = symmetry._dense_into(np.array(keys, dtype=np.int64), *tab)
        assert got.tolist() == want and n == len(first)
        assert (tab[1] == -1).all()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-2**40, 2**40), min_size=1, max_size=11), st.data())
def test_structure_digest_sees_every_element_and_the_order(x, data):
    """symmetry._absorb (the quotient cache's key) changes when any one element changes, in any of its four lanes or
    the tail, when two different elements swap, and when an element is appended."""
    from flowsim.network.symmetry import _absorb

    x = np.array(x, dtype=np.int64)
    base = _absorb(np.int64(1), np.int64(2), x)
    i = data.draw(st.integers(0, x.size - 1))
    y = x.copy()
    y[i] += 1
    assert _absorb(np.int64(1), np.int64(2), y) != base
    j = data.draw(st.integers(0, x.size - 1))
    if x[i] != x[j]:
        y = x.copy()
        y[i], y[j] = x[j], x[i]
        assert _absorb(np.int64(1), np.int64(2), y) != base
    assert _absorb(np.int64(1), np.int64(2), np.append(x, 0)) != base
