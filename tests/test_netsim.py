"""Event simulation: closed forms, fat-tree sanity, brute-force reference, bad input."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from flowsim.config.cluster import ClusterConfig
from flowsim.errors import ConfigError
from flowsim.network.maxmin import check_maxmin, solve
from flowsim.network.netsim import simulate, simulate_transfers
from flowsim.network.routing import route
from flowsim.network.topology import build_topology
from flowsim.units import GB, MB, US, gbps_to_Bps
from reference_maxmin import reference_simulate
from test_topology import spec

NIC_BPS = gbps_to_Bps(400)  # 50 GB/s


def test_one_flow_latency_plus_size_over_bandwidth():
    # GPU 0 -> GPU 8 (next host, same rail, same leaf): PCIe 64 GB/s, NIC->leaf, leaf->NIC, PCIe.
    # Bottleneck B = 50 GB/s; two scale-out hops of 2 us each; 1 us software latency.
    # finish = 1e-6 + 2 * 2e-6 + 100 MB / 50 GB/s = 5e-6 + 2e-3.
    topo = build_topology(ClusterConfig(gpu="x", num_gpus=16), spec())
    res = simulate_transfers(topo, [0], [8], [100 * MB], latency_s=1 * US)
    assert res.finish_s[0] == pytest.approx(5e-6 + 100 * MB / NIC_BPS, rel=1e-12)
    assert res.start_s[0] == 0.0


def test_n_flows_share_a_bottleneck_and_finish_together():
    # 4 flows of S = 10 bytes on one link of 10 B/s: each gets 10/4, all finish at n*S/B = 4 s.
    res = simulate([10.0], [0, 1, 2, 3, 4], [0, 0, 0, 0], [10.0] * 4)
    np.testing.assert_allclose(res.finish_s, [4.0] * 4, rtol=1e-12)
    assert res.link_busy_s.tolist() == [4.0]
    assert res.link_bytes.tolist() == [40.0]
    assert res.link_utilization.tolist() == [1.0]


def test_staggered_arrivals():
    # Link 10 B/s; A (10 B) at t=0, B (10 B) at t=0.5, C (5 B) at t=1.0.
    # [0, 0.5): A alone at 10 -> A has 5 left.  [0.5, 1.0): A, B at 5 each -> A 2.5 left, B 7.5 left.
    # From 1.0: A, B, C at 10/3: A finishes at 1.0 + 2.5 / (10/3) = 1.75 (B 5 left, C 2.5 left).
    # Then B, C at 5: C finishes at 1.75 + 2.5 / 5 = 2.25 (B 2.5 left); B alone: 2.25 + 2.5 / 10 = 2.5.
    res = simulate([10.0], [0, 1, 2, 3], [0, 0, 0], [10.0, 10.0, 5.0], release_s=[0.0, 0.5, 1.0])
    np.testing.assert_allclose(res.finish_s, [1.75, 2.5, 2.25], rtol=1e-12)
    np.testing.assert_allclose(res.start_s, [0.0, 0.5, 1.0])


def test_dependencies_and_latency():
    # A (10 B on a 10 B/s link, latency 0.5) then B depends on A: B starts at 1.5, ends at 2.5.
    # C (empty path, 0 bytes) depends on B: finishes when B does plus its latency 0.25.
    res = simulate([10.0], [0, 1, 2, 2], [0, 0], [10.0, 10.0, 0.0], dep_ptr=[0, 0, 1, 2], dep_idx=[0, 1],
                   latency_s=[0.5, 0.0, 0.25])
    np.testing.assert_allclose(res.start_s, [0.0, 1.5, 2.5])
    np.testing.assert_allclose(res.finish_s, [1.5, 2.5, 2.75])
    assert res.makespan_s == 2.75


def node_derangement(n_nodes, gpn, seed=0):
    """GPU g -> the same local GPU of another host (hosts follow one random cycle: no fixed point)."""
    order = np.random.default_rng(seed).permutation(n_nodes)
    host_dst = np.empty(n_nodes, dtype=np.int64)
    host_dst[order] = np.roll(order, -1)
    g = np.arange(n_nodes * gpn)
    return g, host_dst[g // gpn] * gpn + g % gpn


@pytest.mark.parametrize("over, expect", [(1.0, NIC_BPS), (2.0, NIC_BPS / 2)])
def test_fat_tree_permutation_line_rate_and_oversubscription(over, expect):
    # fat_tree, radix 16: 8 down-ports per leaf = one host per leaf, so every host-to-host flow crosses the
    # spines. Ideal spreading: a leaf's 8 up-links act as one 8 * 50 / over GB/s bundle carrying the host's
    # 8 flows: 50 / over GB/s each; 1:1 gives line rate, 2:1 half of it.
    cfg = ClusterConfig(gpu="x", num_gpus=64, network="fat_tree", switch_radix=16, oversubscription=over,
                        ecmp="ideal")
    topo = build_topology(cfg, spec())
    src, dst = node_derangement(8, 8)
    r = route(topo, src, dst)
    rates = solve(topo.capacity_Bps, r.ptr, r.links)
    np.testing.assert_allclose(rates, expect, rtol=1e-12)
    res = simulate_transfers(topo, src, dst, np.full(64, 64 * MB))
    # 4 scale-out hops of 2 us each (NIC-leaf, leaf-spine, spine-leaf, leaf-NIC).
    np.testing.assert_allclose(res.finish_s, 64 * MB / expect + 4 * 2e-6, rtol=1e-12)


def test_hash_ecmp_collisions_never_exceed_line_rate():
    cfg = ClusterConfig(gpu="x", num_gpus=64, network="fat_tree", switch_radix=16)
    topo = build_topology(cfg, spec())
    src, dst = node_derangement(8, 8)
    r = route(topo, src, dst)
    rates = solve(topo.capacity_Bps, r.ptr, r.links)
    check_maxmin(topo.capacity_Bps, r.ptr, r.links, rates)
    assert rates.max() <= NIC_BPS * (1 + 1e-12)
    assert rates.min() < NIC_BPS  # 64 flows hashed onto 8 spines per leaf: some collide


@st.composite
def transfer_sets(draw):
    n_links = draw(st.integers(1, 4))
    cap = draw(st.lists(st.sampled_from([1.0, 2.0, 5.0, 10.0]), min_size=n_links, max_size=n_links))
    n = draw(st.integers(1, 7))
    paths = [sorted(draw(st.sets(st.integers(0, n_links - 1), max_size=n_links))) for _ in range(n)]
    size = draw(st.lists(st.sampled_from([0.0, 1.0, 3.0, 10.0, 7.5]), min_size=n, max_size=n))
    release = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.25]), min_size=n, max_size=n))
    latency = draw(st.lists(st.sampled_from([0.0, 0.1, 1.0]), min_size=n, max_size=n))
    deps = [sorted(draw(st.sets(st.integers(0, t - 1), max_size=2))) if t else [] for t in range(n)]
    return cap, paths, size, release, deps, latency


@settings(max_examples=120, deadline=None)
@given(transfer_sets())
def test_matches_brute_force_event_simulation(inst):
    cap, paths, size, release, deps, latency = inst
    ptr = np.r_[0, np.cumsum([len(p) for p in paths])]
    links = np.array([l for p in paths for l in p], dtype=np.int64)
    dptr = np.r_[0, np.cumsum([len(d) for d in deps])]
    didx = np.array([d for ds in deps for d in ds], dtype=np.int64)
    res = simulate(cap, ptr, links, size, release_s=release, dep_ptr=dptr, dep_idx=didx, latency_s=latency)
    start, finish = reference_simulate(cap, paths, size, release, deps, latency)
    np.testing.assert_allclose(res.start_s, start, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(res.finish_s, finish, rtol=1e-9, atol=1e-12)
    busy_bound = res.link_bytes / np.array(cap)  # a link is busy at least bytes / capacity
    assert np.all(res.link_busy_s >= busy_bound * (1 - 1e-9))
    unused = np.ones(len(cap), dtype=bool)
    unused[links] = False  # links no path uses (left out of the event loop) are never busy
    assert res.link_busy_s.shape == (len(cap),) and np.all(res.link_busy_s[unused] == 0)


@settings(max_examples=80, deadline=None)
@given(transfer_sets(), transfer_sets())
def test_components_in_parallel_threads_match_brute_force(a, b):
    """Two independent transfer sets (disjoint links) and a random one simulated together, with every
    simulation split into components over two threads (parallel.THREADS, PARALLEL_MIN_TRANSFERS forced)."""
    import flowsim.network.netsim as netsim
    from flowsim.network import parallel

    off = len(a[0])
    cap = a[0] + b[0]
    paths = a[1] + [[l + off for l in p] for p in b[1]]
    deps = a[4] + [[d + len(a[1]) for d in ds] for ds in b[4]]
    size, release, latency = (a[i] + b[i] for i in (2, 3, 5))
    ptr = np.r_[0, np.cumsum([len(p) for p in paths])]
    links = np.array([l for p in paths for l in p], dtype=np.int64)
    dptr = np.r_[0, np.cumsum([len(d) for d in deps])]
    didx = np.array([d for ds in deps for d in ds], dtype=np.int64)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(parallel, "THREADS", 2)
        mp.setattr(netsim, "PARALLEL_MIN_TRANSFERS", 0)
        res = simulate(cap, ptr, links, size, release_s=release, dep_ptr=dptr, dep_idx=didx, latency_s=latency,
                       symmetry=False)
    start, finish = reference_simulate(cap, paths, size, release, deps, latency)
    np.testing.assert_allclose(res.start_s, start, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(res.finish_s, finish, rtol=1e-9, atol=1e-12)
    busy_bound = res.link_bytes / np.array(cap)
    assert np.all(res.link_busy_s >= busy_bound * (1 - 1e-9))


def test_distinct_links_known_answer():
    # Links 0 and 2 carry transfer 0 only, link 1 transfers 0 and 1: of 0 and 2 the one with less capacity (2) is
    # kept; link 3 carries nothing (kept).
    from flowsim.network.netsim import _distinct_links

    keep, link_of, ptr, hops = _distinct_links(np.array([5.0, 1.0, 3.0, 9.0]), np.array([0, 3, 4]),
                                               np.array([0, 1, 2, 1]))
    assert keep.tolist() == [1, 2, 3] and link_of.tolist() == [1, 0, 1, 2]
    assert ptr.tolist() == [0, 2, 3] and hops.tolist() == [0, 1, 0]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 12).flatmap(lambda n_links: st.tuples(
    st.lists(st.sampled_from([1.0, 2.0, 3.0]), min_size=n_links, max_size=n_links),
    st.lists(st.lists(st.integers(0, n_links - 1), max_size=6), max_size=8))))
def test_distinct_links_groups_links_by_their_transfer_lists(inst):
    """_distinct_links against a brute force: links grouped by the list of transfers crossing them (with
    multiplicity, paths may cross a link twice), the least (capacity, id) of each group kept."""
    from flowsim.network.netsim import _distinct_links

    cap, paths = inst
    lists = [tuple(t for t, p in enumerate(paths) for l in p if l == link) for link in range(len(cap))]
    best = {}
    for link, key in enumerate(lists):
        if not key:
            key = ("empty", link)  # links with no transfer are all kept
        best[key] = min(best.get(key, (cap[link], link)), (cap[link], link))
    keep_want = sorted(b for _, b in best.values())
    new_id = {l: i for i, l in enumerate(keep_want)}
    of_want = [new_id[best[key if key else ("empty", link)][1]] for link, key in enumerate(lists)]
    ptr = np.cumsum([0] + [len(p) for p in paths])
    hops = np.array([l for p in paths for l in p], dtype=np.int64)
    keep, link_of, kept_ptr, kept = _distinct_links(np.array(cap), ptr, hops)
    assert keep.tolist() == keep_want and link_of.tolist() == of_want
    kept_paths = [[new_id[l] for l in p if l in new_id] for p in paths]
    assert kept_ptr.tolist() == np.cumsum([0] + [len(p) for p in kept_paths]).tolist()
    assert kept.tolist() == [l for p in kept_paths for l in p]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 12).flatmap(lambda n_links: st.tuples(
    st.just(n_links), st.lists(st.lists(st.integers(0, n_links - 1), max_size=6), max_size=8))))
def test_used_links_against_numpy(inst):
    """_used_links against numpy: the used links (np.unique) and the hops as positions among them (searchsorted)."""
    from flowsim.network.netsim import _used_links

    n_links, paths = inst
    hops = np.array([l for p in paths for l in p], dtype=np.int64)
    used, local = _used_links(n_links, hops)
    assert used.tolist() == np.unique(hops).tolist()
    assert local.tolist() == np.searchsorted(np.unique(hops), hops).tolist()


@settings(max_examples=100, deadline=None)
@given(transfer_sets())
def test_link_bytes_are_the_paths_bytes_after_the_inputs_change(inst):
    """NetSimResult.link_bytes (summed on first read) is np.bincount of the paths' bytes bit for bit, also when the
    caller has since overwritten the arrays it passed."""
    cap, paths, size, release, deps, latency = inst
    ptr = np.r_[0, np.cumsum([len(p) for p in paths])].astype(np.int64)
    links = np.array([l for p in paths for l in p], dtype=np.int64)
    size = np.array(size)
    want = np.bincount(links, weights=np.repeat(size, np.diff(ptr)), minlength=len(cap))
    res = simulate(cap, ptr, links, size)
    ptr[1:], links[:], size[:] = ptr[-1], 0, 1e9
    assert res.link_bytes.tobytes() == want.tobytes()


@settings(max_examples=200, deadline=None)
@given(transfer_sets())
def test_components_against_brute_force(inst):
    """components._components against a search over transfers joined by shared links and dependencies:
    the same partition, numbered in order of each component's smallest transfer id."""
    from flowsim.network.components import _components

    cap, paths, _, _, deps, _ = inst
    n = len(paths)
    ptr = np.cumsum([0] + [len(p) for p in paths]).astype(np.int64)
    hops = np.array([l for p in paths for l in p], dtype=np.int64)
    dptr = np.cumsum([0] + [len(d) for d in deps]).astype(np.int64)
    didx = np.array([d for ds in deps for d in ds], dtype=np.int64)
    near = [{u for u in range(n) if u != t and (set(paths[t]) & set(paths[u]) or u in deps[t] or t in deps[u])}
            for t in range(n)]
    want, n_want = [-1] * n, 0
    for t in range(n):
        if want[t] < 0:
            stack = [t]
            while stack:
                u = stack.pop()
                if want[u] < 0:
                    want[u] = n_want
                    stack += near[u]
            n_want += 1
    comp, n_comp = _components(len(cap), ptr, hops, dptr, didx)
    assert comp.tolist() == want and n_comp == n_want


@settings(max_examples=120, deadline=None)
@given(transfer_sets(), st.data())
def test_links_with_the_same_transfers_are_simulated_once(inst, data):
    """Twins (links on exactly the paths of another, capacity 0.5-2x, anywhere in the path) change nothing: the
    simulation over the distinct links equals the event loop over all of them bit for bit, busy times included."""
    import flowsim.network.netsim as netsim

    cap, paths, size, release, deps, latency = inst
    twins = data.draw(st.lists(st.tuples(st.integers(0, len(cap) - 1), st.sampled_from([0.5, 1.0, 1.5, 2.0])),
                               max_size=4))
    cap = list(cap)
    paths = [list(p) for p in paths]
    for of, scale in twins:
        cap.append(cap[of] * scale)
        for p in paths:
            if of in p:
                p.insert(data.draw(st.integers(0, len(p))), len(cap) - 1)
    cap = np.array(cap)
    ptr = np.r_[0, np.cumsum([len(p) for p in paths])].astype(np.int64)
    links = np.array([l for p in paths for l in p], dtype=np.int64)
    dptr = np.r_[0, np.cumsum([len(d) for d in deps])].astype(np.int64)
    didx = np.array([d for ds in deps for d in ds], dtype=np.int64)
    args = (cap, ptr, links, np.array(size), np.array(release), dptr, didx, np.array(latency), np.ones(len(paths)),
            netsim.LOCAL_MAX_ROUNDS, 1e-9)
    got, want = netsim._simulate(*args), netsim._event_loop(*args)
    for g, w in zip(got[:3], want[:3]):
        assert np.array_equal(g, w, equal_nan=True)
    assert got[3] == want[3]


def _csr_args(inst):
    cap, paths, size, release, deps, latency = inst
    ptr = np.r_[0, np.cumsum([len(p) for p in paths])].astype(np.int64)
    links = np.array([l for p in paths for l in p], dtype=np.int64)
    dptr = np.r_[0, np.cumsum([len(d) for d in deps])].astype(np.int64)
    didx = np.array([d for ds in deps for d in ds], dtype=np.int64)
    return (np.array(cap), ptr, links, np.array(size), np.array(release), dptr, didx, np.array(latency),
            np.ones(len(paths)), 1e-9)


@settings(max_examples=100, deadline=None)
@given(st.lists(transfer_sets(), min_size=2, max_size=4))
def test_work_buffers_reused_across_simulations_change_nothing(insts):
    """Simulations that share one thread's work buffers (netsim._run, left dirty by the previous, larger or smaller
    one) equal those with fresh buffers bit for bit."""
    import flowsim.network.netsim as netsim

    for inst in insts:
        args = _csr_args(inst)
        got, want = netsim._run(*args), netsim._simulate(*args[:9], netsim.LOCAL_MAX_ROUNDS, args[9])
        for g, w in zip(got[:3], want[:3]):
            assert np.array_equal(g, w, equal_nan=True)
        assert got[3] == want[3]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 70000), st.sampled_from([0.0, -0.0, 1.0, 2.5e10, 5e10 / 3, 1e-300, 7e300])),
                min_size=1, max_size=400, unique_by=lambda x: x[0]), st.floats(0.0, 1e12))
def test_run_order_is_the_stable_sort_by_share_then_id(items, extra):
    """The radix order of progressive filling's run equals numpy's sort by (key, id) (keys >= 0, -0.0 as 0.0)."""
    from flowsim.network.maxmin_kernels import _run_order

    ids = np.array([i for i, _ in items], dtype=np.int64)
    keys = np.array([k for _, k in items])
    keys[::3] += extra
    got = _run_order(ids, keys)
    assert ids[got].tolist() == ids[np.lexsort((ids, keys))].tolist()


@pytest.mark.parametrize("n_keys", [1, 7, 1024, 1025, 5000])
@pytest.mark.parametrize("increasing", [True, False])
def test_run_order_by_rank_and_by_bytes(n_keys, increasing):
    """Both ways of ordering the keys (their rank among at most ``RUN_RANK_MAX_KEYS`` distinct ones, else their
    bytes), with ids given in increasing order or not, give numpy's sort by (key, id)."""
    from flowsim.network.net_heap import RUN_RANK_MAX_KEYS, _run_order

    rng = np.random.default_rng(n_keys)
    ids = rng.choice(1 << 22, size=6000, replace=False)
    if increasing:
        ids.sort()
    values = rng.uniform(0.0, 1e11, size=n_keys)
    values[0] = -0.0  # orders (and counts) as 0.0
    keys = values[rng.integers(0, n_keys, size=ids.size)]
    keys[:n_keys] = values  # every value present: the rank path exactly up to RUN_RANK_MAX_KEYS
    assert (np.unique(keys).size <= RUN_RANK_MAX_KEYS) == (n_keys <= RUN_RANK_MAX_KEYS)
    got = _run_order(ids, keys)
    assert ids[got].tolist() == ids[np.lexsort((ids, keys))].tolist()


def test_bad_thread_count_is_one_line_error(monkeypatch):
    from flowsim.network import parallel

    monkeypatch.setenv("FLOWSIM_NETSIM_THREADS", "two")
    parallel._env_threads.cache_clear()
    try:
        with pytest.raises(ConfigError, match="FLOWSIM_NETSIM_THREADS: must be a whole number >= 1"):
            simulate([1.0], [0, 1], [0], [1.0])
    finally:
        parallel._env_threads.cache_clear()


def test_result_views():
    res = simulate([10.0], [0, 1], [0], [10.0])
    d = res.to_dict()
    assert d["makespan_s"] == 1.0 and d["finish_s"] == [1.0] and d["link_utilization"] == [1.0]
    assert list(res.to_frame().columns) == ["start_s", "finish_s", "duration_s"]
    assert "1 transfers" in repr(res)


def test_no_transfers():
    res = simulate([1.0], [0], [], [])
    assert res.makespan_s == 0.0 and res.n_solves == 0


@pytest.mark.parametrize("kwargs, msg", [
    (dict(size_bytes=[np.nan]), r"size_bytes: must be finite and >= 0 \(got nan at transfer 0\)"),
    (dict(size_bytes=[-1.0]), r"size_bytes: must be finite and >= 0 \(got -1.0 at transfer 0\)"),
    (dict(size_bytes=[1.0], release_s=[np.inf]), r"release_s: must be finite and >= 0 \(got inf at transfer 0\)"),
    (dict(size_bytes=[1.0], latency_s=[-1e-6]), r"latency_s: must be finite and >= 0"),
    (dict(size_bytes=[1.0, 2.0]), r"size_bytes: must have one entry per transfer, 1 \(got shape \(2,\)\)"),
    (dict(size_bytes=[1.0], dep_ptr=[0, 1], dep_idx=[3]), r"dep_idx: transfer ids must be in \[0, 1\) \(got 3 "),
    (dict(size_bytes=[1.0], dep_ptr=[0, 1], dep_idx=[0]), r"dep_idx: dependency cycle: these transfers never "
                                                           r"become ready \(got \[0\]\)"),
    (dict(size_bytes=[1.0], dep_ptr=[0, 1]), "dep_ptr: dep_ptr and dep_idx must be given together"),
])
def test_bad_transfers(kwargs, msg):
    size = kwargs.pop("size_bytes")
    with pytest.raises(ConfigError, match=msg):
        simulate([1.0], [0, 1], [0], size, **kwargs)


def test_bad_links():
    with pytest.raises(ValueError, match="capacity_Bps: every capacity must be finite and > 0"):
        simulate([0.0], [0, 1], [0], [1.0])
    with pytest.raises(ValueError, match="flow_links: link id 2 at hop 0 does not exist"):
        simulate([1.0], [0, 1], [2], [1.0])


def test_gb_scale_units():
    # 1 GB over 400 Gb/s = 1e9 / 5e10 = 0.02 s.
    res = simulate([gbps_to_Bps(400)], [0, 1], [0], [1 * GB])
    assert res.finish_s[0] == pytest.approx(0.02, rel=1e-12)


def test_freed_memory_kept_on_glibc():
    """The flowsim command sets glibc's malloc thresholds once (allocator.keep_freed_memory); elsewhere it does
    nothing."""
    import platform

    from click.testing import CliRunner

    from flowsim.cli import main
    from flowsim.network.allocator import keep_freed_memory

    keep_freed_memory.cache_clear()
    assert CliRunner().invoke(main, ["gpus"]).exit_code == 0
    assert keep_freed_memory.cache_info().currsize == 1
    assert keep_freed_memory() is (platform.libc_ver()[0] == "glibc")
