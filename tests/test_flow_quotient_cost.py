"""Issue 22, session 12: the quotient's attempts that find nothing and the cross-kind windows' assembly cost less,
with the same answers. Slow references kept here: the refinement as it was (each round's link colours from the
link -> transfers transpose, before the growth stop is tested), and the simulation of a window over the whole
topology's links (``collective_flows._simulate_together`` now hands it the links the window crosses)."""
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from numba import njit

from flowsim.config import ClusterConfig
from flowsim.gpu_specs import get_gpu
from flowsim.network import collective_flows, symmetry
from flowsim.network.maxmin_kernels import _link_csr
from flowsim.network.netsim import simulate
from flowsim.network.symmetry import _SALT_DEP, _SALT_FLOW, _SALT_LINK, _dense_into, _depths, _h, _table


@njit
def _refine_reference(route_ptr, route_links, dep_ptr, dep_idx, link_ptr, link_flows, used, size_bits,
                      release_bits, latency_bits, cap_bits, max_rounds, max_classes, growth, growth_min):
    """``symmetry._refine`` before session 12: every round colours the links from their transfer lists, then
    tests stability, then the growth stop."""
    n = size_bits.shape[0]
    depth = _depths(dep_ptr, dep_idx)
    key = np.empty(n, dtype=np.int64)
    for t in range(n):
        key[t] = _h(_h(_h(_h(size_bits[t], 1), release_bits[t]), latency_bits[t]), depth[t])
    t_tab = _table(n)
    l_tab = _table(used.shape[0])
    tcol, n_tc = _dense_into(key, *t_tab)
    lcol = np.full(cap_bits.shape[0], -1, dtype=np.int64)
    lkey = np.empty(used.shape[0], dtype=np.int64)
    for i in range(used.shape[0]):
        lkey[i] = cap_bits[used[i]]
    lc, n_lc = _dense_into(lkey, *l_tab)
    for i in range(used.shape[0]):
        lcol[used[i]] = lc[i]
    stable = False
    for _ in range(max_rounds):
        if n_tc > max_classes:
            break
        for t in range(n):
            a = np.int64(0)
            for h in range(route_ptr[t], route_ptr[t + 1]):
                a += _h(lcol[route_links[h]], _SALT_LINK)
            d = np.int64(0)
            for j in range(dep_ptr[t], dep_ptr[t + 1]):
                d += _h(tcol[dep_idx[j]], _SALT_DEP)
            key[t] = _h(_h(tcol[t], a), d)
        for i in range(used.shape[0]):
            l = used[i]
            a = np.int64(0)
            for k in range(link_ptr[l], link_ptr[l + 1]):
                a += _h(tcol[link_flows[k]], _SALT_FLOW)
            lkey[i] = _h(lcol[l], a)
        tc2, n_tc2 = _dense_into(key, *t_tab)
        lc2, n_lc2 = _dense_into(lkey, *l_tab)
        if n_tc2 == n_tc and n_lc2 == n_lc:
            stable = True
            break
        if n_tc2 >= growth_min and n_tc2 >= growth * n_tc and n_tc2 * n_tc2 > max_classes * n_tc:
            break
        tcol, n_tc, n_lc = tc2, n_tc2, n_lc2
        for i in range(used.shape[0]):
            lcol[used[i]] = lc2[i]
    return tcol, n_tc, lcol, n_lc, stable


def _both_refinements(n_links, ptr, links, dptr, didx, size, release, latency, cap):
    used = np.flatnonzero(np.bincount(links, minlength=n_links))
    bits = (size.view(np.int64), release.view(np.int64), latency.view(np.int64), cap.view(np.int64))
    max_classes = int((ptr.size - 1) * symmetry.MAX_CLASS_FRACTION)
    got = symmetry._refine(ptr, links, dptr, didx, used, *bits, symmetry.MAX_ROUNDS, max_classes)
    link_ptr, link_flows = _link_csr(n_links, ptr, links)
    want = _refine_reference(ptr, links, dptr, didx, link_ptr, link_flows, used, *bits, symmetry.MAX_ROUNDS,
                             max_classes, symmetry.MAX_ROUND_GROWTH, symmetry.GROWTH_MIN_CLASSES)
    return got, want


def _assert_same(got, want):
    for g, w in zip(got, want):
        assert np.array_equal(g, w)


def test_refinement_that_explodes_matches_the_reference():
    # 2,048 equal transfers over three random links of 500 each (hash ECMP): the round that sees the links'
    # loads explodes and ends the refinement, now before that round's link colours are computed
    rng = np.random.default_rng(7)
    n, n_l = 2048, 500
    links = np.concatenate([rng.choice(n_l, 3, replace=False) for _ in range(n)]).astype(np.int64)
    ptr = np.arange(0, 3 * n + 1, 3, dtype=np.int64)
    zeros = np.zeros(n)
    got, want = _both_refinements(n_l, ptr, links, np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.int64),
                                  np.full(n, 1e6), zeros, zeros, np.full(n_l, 1e10))
    assert not want[4] and want[1] < symmetry.GROWTH_MIN_CLASSES  # the growth stop, not stability
    _assert_same(got, want)


def test_rings_that_settle_match_the_reference():
    # 64 rings of 16 ranks, each step on its own link, chained: a quotient of one ring (stable colouring)
    G, m = 64, 16
    n = G * m
    links = np.arange(n, dtype=np.int64)
    ptr = np.arange(n + 1, dtype=np.int64)
    dptr = np.concatenate([[0], np.cumsum(np.arange(n) % m > 0)]).astype(np.int64)
    didx = np.array([t - 1 for t in range(n) if t % m], dtype=np.int64)
    zeros = np.zeros(n)
    got, want = _both_refinements(n, ptr, links, dptr, didx, np.full(n, 1e6), zeros, zeros, np.full(n, 5e10))
    assert want[4] and want[1] == m
    _assert_same(got, want)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 400), st.integers(1, 60), st.integers(1, 4),
       st.sampled_from([1, 2, 3]), st.booleans())
def test_random_refinements_match_the_reference(seed, n, n_l, hops, n_sizes, chain):
    # random paths (a link may repeat on a path), sizes, capacities and dependency chains: stable or not,
    # stopped by the cap, the growth stop or the rounds, the colourings and counts are the reference's
    rng = np.random.default_rng(seed)
    lens = rng.integers(1, hops + 1, n)
    ptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    links = rng.integers(0, n_l, ptr[-1]).astype(np.int64)
    if chain:
        dptr = np.concatenate([[0], np.cumsum(np.arange(n) % 4 > 0)]).astype(np.int64)
        didx = np.array([t - 1 for t in range(n) if t % 4], dtype=np.int64)
    else:
        dptr, didx = np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.int64)
    size = rng.choice([1e6, 2e6, 4e6][:n_sizes], n)
    zeros = np.zeros(n)
    got, want = _both_refinements(n_l, ptr, links, dptr, didx, size, zeros, zeros, rng.choice([1e10, 2e10], n_l))
    _assert_same(got, want)


def _root_dep(dep_ptr, dep_idx, barrier):
    """The dependency CSR with ``barrier`` added to every transfer that had no dependency."""
    cnt = np.diff(dep_ptr)
    root = cnt == 0
    ptr = np.zeros(cnt.size + 1, dtype=np.int64)
    np.cumsum(cnt + root, out=ptr[1:])
    idx = np.empty(ptr[-1], dtype=np.int64)
    owner = np.repeat(np.arange(cnt.size), cnt)
    idx[ptr[owner] + np.arange(dep_idx.size) - dep_ptr[owner]] = dep_idx
    idx[ptr[:-1][root]] = barrier
    return ptr, idx


def _dep_csr(p):
    """Dependencies of a prepared collective's plan, tiled over its groups (local transfer ids)."""
    G, m, nd = p.groups.shape[0], p.plan.n_transfers, p.plan.dep_idx.size
    ptr = np.concatenate([(p.plan.dep_ptr[:-1][None, :] + nd * np.arange(G)[:, None]).ravel(), [nd * G]])
    return ptr, (p.plan.dep_idx[None, :] + m * np.arange(G)[:, None]).ravel()


def _simulate_together_reference(topo, preps, after):
    """``collective_flows._simulate_together`` before session 12: the simulation over every topology link, the
    window's arrays concatenated from each collective's."""
    base = np.cumsum([0] + [p.n_transfers for p in preps])
    n = int(base[-1])
    chained = [i for i, a in enumerate(after) if a is not None]
    barrier = {i: n + k for k, i in enumerate(chained)}
    ptrs, links, dep_ptrs, dep_idxs = [np.zeros(1, dtype=np.int64)], [], [np.zeros(1, dtype=np.int64)], []
    hops = deps = kernels = 0
    for i, p in enumerate(preps):
        links.append(np.where(p.links >= topo.n_links, p.links + kernels, p.links))
        ptrs.append(p.ptr[1:] + hops)
        hops += p.links.size
        kernels += p.kernel_Bps.size
        dp, di = _dep_csr(p)
        if i in barrier:
            dp, di = _root_dep(dp, di, barrier[i] - base[i])
        dep_ptrs.append(dp[1:] + deps)
        dep_idxs.append(di + base[i])
        deps += di.size
    for i in chained:
        ptrs.append(np.array([hops], dtype=np.int64))
        deps += preps[after[i]].n_transfers
        dep_ptrs.append(np.array([deps], dtype=np.int64))
        dep_idxs.append(np.arange(base[after[i]], base[after[i] + 1]))
    size = np.concatenate([np.tile(p.plan.payload_bytes * p.plan.wire_factor, p.groups.shape[0]) for p in preps]
                          + [np.zeros(len(chained))])
    latency = np.concatenate([np.tile(p.plan.latency_s, p.groups.shape[0]) for p in preps]
                             + [[preps[after[i]].plan.base_latency_s for i in chained]])
    return simulate(np.concatenate([collective_flows._capacity(topo)] + [p.kernel_Bps for p in preps]),
                    np.concatenate(ptrs), np.concatenate(links), size, dep_ptr=np.concatenate(dep_ptrs),
                    dep_idx=np.concatenate(dep_idxs), latency_s=latency)


CLUSTER = ClusterConfig(gpu="h100-sxm", num_gpus=256)
H100 = get_gpu("h100-sxm")
DP = np.array([[b + 8 * k for k in range(16)] for b in range(8)])          # 8 rails' rings over 16 hosts
DP2 = DP + 128
PP = np.array([[g, g + 128] for g in range(128)])                          # every GPU to the other half
EP = np.array([[b + 64 * k for k in range(2)] for b in range(64)])          # pairs 64 apart


@pytest.mark.parametrize("window, after", [
    ([("allreduce", 3e8, DP)], [None]),
    ([("allreduce", 3e8, DP), ("sendrecv", 2e7, PP)], [None, None]),
    ([("reducescatter", 2e8, DP), ("allgather", 2e8, DP), ("sendrecv", 4e7, PP), ("alltoall", 8e7, EP)],
     [None, 0, None, None]),
    ([("allreduce", 1e8, DP2), ("allreduce", 1e8, DP), ("sendrecv", 1e7, PP)], [None, 0, 1]),
])
@pytest.mark.parametrize("symmetry_on", [True, False])
def test_window_over_the_links_it_crosses_matches_the_whole_topology(window, after, symmetry_on, monkeypatch):
    # the same finish times, bit for bit, with and without the quotient; the window's links are a small part of
    # the fabric's, its paths shorter (dominated links dropped)
    monkeypatch.setattr(collective_flows, "simulate", lambda *a, **k: simulate(*a, **k, symmetry=symmetry_on))
    topo = collective_flows.cached_topology(CLUSTER, H100)
    preps = [collective_flows._prepare(CLUSTER, H100, op, size, groups, None, None, True, 256)
             for op, size, groups in window]
    got, base, start = collective_flows._simulate_together(topo, preps, after)
    want = _simulate_together_reference(topo, preps, after)
    assert np.array_equal(got.finish_s, want.finish_s) and np.array_equal(got.start_s, want.start_s)
    assert got.n_solves == want.n_solves
    chained = [i for i, a in enumerate(after) if a is not None]
    assert start == [float(want.finish_s[base[-1] + chained.index(i)]) if i in chained else 0.0
                     for i in range(len(preps))]
    assert got.capacity_Bps.size < want.capacity_Bps.size
    net = np.flatnonzero(np.isin(np.arange(topo.n_links), np.concatenate([p.net_links for p in preps])))
    # links dominated by another of their collective's (flowsim.network.dominated_links) are left out of the paths
    # where no other collective crosses them: no bytes, no busy time; the others as over the whole topology
    got_bytes = got.link_bytes
    want_bytes = np.concatenate([want.link_bytes[net], want.link_bytes[topo.n_links:]])
    want_busy = np.concatenate([want.link_busy_s[net], want.link_busy_s[topo.n_links:]])
    kept = got_bytes > 0
    assert np.array_equal(got_bytes[kept], want_bytes[kept]) and np.array_equal(got.link_busy_s[kept], want_busy[kept])
    assert not got.link_busy_s[~kept].any() and (~kept & (want_bytes > 0)).any()
    owners = np.bincount(np.concatenate([p.net_links for p in preps]), minlength=topo.n_links)[net]
    assert kept[:net.size][owners > 1].all()  # a link two collectives cross stays


def test_run_collective_without_utilization_has_the_same_times():
    full = collective_flows.run_collective(CLUSTER, H100, "allreduce", 3e8, DP[0], concurrent_groups=DP[1:])
    bare = collective_flows.run_collective(CLUSTER, H100, "allreduce", 3e8, DP[0], concurrent_groups=DP[1:],
                                           utilization=False)
    assert full.link_utilization and not bare.link_utilization
    assert replace(full, link_utilization=()) == bare
