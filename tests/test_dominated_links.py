"""Links dominated by another link of the same transfers (flowsim.network.dominated_links): dropping them from the
paths leaves the max-min rates and every time of a simulation unchanged (slow reference and the event loop), and
the flow engine's windows drop them only where no other collective crosses the link."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from flowsim.config import ClusterConfig
from flowsim.gpu_specs import get_gpu
from flowsim.network import collective_flows
from flowsim.network.dominated_links import dominated_hops
from flowsim.network.netsim import simulate
from reference_maxmin import reference_maxmin, reference_simulate


def _kept(ptr, links, drop):
    """The paths (none empty) without the dropped hops (CSR)."""
    keep = ~drop
    return np.r_[0, np.cumsum(np.add.reduceat(keep.astype(np.int64), ptr[:-1]))], links[keep]


def _csr(paths):
    return np.r_[0, np.cumsum([len(p) for p in paths])].astype(np.int64), \
        np.array([l for p in paths for l in p], dtype=np.int64)


def test_known_dominations():
    # t0 crosses links 0 (3 GB/s), 1 (1 GB/s), 2 (1 GB/s); t1 crosses 1, 3 (1 GB/s), 4 (2 GB/s, twice)
    cap = np.array([3e9, 1e9, 1e9, 1e9, 2e9])
    ptr, links = _csr([[0, 1, 2], [1, 3, 4, 4]])
    drop = dominated_hops(cap, ptr, links)
    # 0 and 2 carry {t0}, a subset of 1's {t0, t1} at no less capacity; 3 carries {t1}, the same capacity as 1:
    # dropped; 1 is kept (nothing covers it); 4 is crossed twice by t1: kept
    assert drop.tolist() == [True, False, True, False, True, False, False]
    # equal transfers and capacities: the smallest id stays
    ptr, links = _csr([[2, 0, 1], [1, 2, 0]])
    assert dominated_hops(np.full(3, 1e9), ptr, links).tolist() == [True, False, True, True, True, False]
    # a narrower private link is not implied by a wider shared one
    ptr, links = _csr([[0, 1], [0]])
    assert not dominated_hops(np.array([2e9, 1e9]), ptr, links).any()


@st.composite
def _transfer_sets(draw):
    """Random paths (a link may repeat on a path), capacities from a few values (ties), sizes, releases,
    latencies and dependencies on earlier transfers."""
    n_l, n = draw(st.integers(1, 6)), draw(st.integers(1, 8))
    paths = [draw(st.lists(st.integers(0, n_l - 1), min_size=1, max_size=4)) for _ in range(n)]
    cap = draw(st.lists(st.sampled_from([1e9, 2e9, 3e9]), min_size=n_l, max_size=n_l))
    size = draw(st.lists(st.sampled_from([0.0, 1e3, 2e3, 5e3]), min_size=n, max_size=n))
    release = draw(st.lists(st.sampled_from([0.0, 1e-6, 3e-6]), min_size=n, max_size=n))
    latency = draw(st.lists(st.sampled_from([0.0, 1e-6]), min_size=n, max_size=n))
    deps = [draw(st.lists(st.integers(0, t - 1), max_size=2, unique=True)) if t else [] for t in range(n)]
    return cap, paths, size, release, deps, latency


@settings(max_examples=150, deadline=None)
@given(_transfer_sets())
def test_dropping_dominated_links_keeps_rates_and_times(inst):
    cap, paths, size, release, deps, latency = inst
    ptr, links = _csr(paths)
    drop = dominated_hops(np.asarray(cap), ptr, links)
    kept = [[l for l, d in zip(p, drop[ptr[t]:ptr[t + 1]]) if not d] for t, p in enumerate(paths)]
    assert all(kept)  # a transfer keeps a link (the narrowest of its path is never implied by a wider one)
    for t, p in enumerate(paths):  # a link is dropped from every path or none
        for l, d in zip(p, drop[ptr[t]:ptr[t + 1]]):
            assert d == (l not in {k for q in kept for k in q})
    np.testing.assert_allclose(reference_maxmin(cap, kept), reference_maxmin(cap, paths), rtol=1e-12)
    want_start, want_finish = reference_simulate(cap, paths, size, release, deps, latency)
    kptr, klinks = _kept(ptr, links, drop)
    dptr = np.r_[0, np.cumsum([len(d) for d in deps])]
    didx = np.array([d for ds in deps for d in ds], dtype=np.int64)
    res = simulate(cap, kptr, klinks, size, release_s=release, latency_s=latency, dep_ptr=dptr, dep_idx=didx)
    np.testing.assert_allclose(res.start_s, want_start, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(res.finish_s, want_finish, rtol=1e-9, atol=1e-15)


CLUSTER = ClusterConfig(gpu="h100-sxm", num_gpus=128, switch_radix=16)  # 8 hosts a leaf: rings cross spines
H100 = get_gpu("h100-sxm")
WINDOW_PARTS = {
    "dp": ("allreduce", np.array([[b + 8 * k for k in range(16)] for b in range(8)])),  # the 8 rails' rings
    "dp_half": ("reducescatter", np.array([[b + 8 * k for k in range(8)] for b in range(8)])),
    "pp": ("sendrecv", np.array([[g, g + 64] for g in range(64)])),  # hash-ECMP pairs across the spines
    "ep": ("alltoall", np.array([[b + 32 * k for k in range(4)] for b in range(32)])),
}


@settings(max_examples=12, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(WINDOW_PARTS)), st.sampled_from([3e6, 4e7, 3e8])), min_size=1,
                max_size=4), st.booleans())
def test_windows_without_dominated_links_have_the_same_times(parts, chain):
    # random windows of collectives on a small rail-optimised fabric with spines: with and without the drop, the
    # same time for every collective and group
    collectives = [(WINDOW_PARTS[k][0], size, WINDOW_PARTS[k][1]) for k, size in parts]
    after = [None] + [i if chain else None for i in range(len(parts) - 1)]

    def run(drop):
        collective_flows._PREPARED.clear()
        with pytest.MonkeyPatch.context() as mp:
            if not drop:
                mp.setattr(collective_flows, "dominated_hops", lambda cap, ptr, links: np.zeros(links.size, bool))
            return collective_flows.run_concurrent(CLUSTER, H100, collectives, after=after, utilization=False)

    fast, slow = run(True), run(False)
    collective_flows._PREPARED.clear()
    for a, b in zip(fast, slow):
        np.testing.assert_allclose(a.group_time_s, b.group_time_s, rtol=1e-9)
        assert a.time_s == pytest.approx(b.time_s, rel=1e-9)


def test_a_collective_on_the_fabric_drops_most_of_its_hops():
    # a ring transfer's kernel link, PCIe hop and the NIC and switch ports it alone uses are implied by the
    # narrowest of them; the hops left are those of links that several transfers share
    for op, groups in WINDOW_PARTS.values():
        p = collective_flows._prepare(CLUSTER, H100, op, 4e7, groups, None, None, True, 256)
        assert p.dominated.mean() > 0.5 and not p.dominated.flags.writeable
        kept = np.add.reduceat((~p.dominated).astype(np.int64), p.ptr[:-1])
        assert (kept >= 1).all()
