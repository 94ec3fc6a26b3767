"""Classes of interchangeable transfers and links of a flow simulation, and the quotient that simulates one
transfer per class with a multiplicity.

Max-min fair sharing is a sequence of linear programs, and a linear program can be solved on the quotient of
its variables and constraints by their coarsest *equitable partition*, the stable colouring of colour
refinement (Grohe, Kersting, Mladenov & Selman, "Dimension reduction via colour refinement", ESA 2014). Here
the partition is of transfers and links: two transfers are in one class when they have the same size, release
time and latency, the same number of links of each link class on their paths and the same number of
dependencies in each transfer class; two links when they have the same capacity and carry the same number of
path hops of each transfer class. Then, by induction over the events of the simulation, the transfers of a
class become ready together, drain at one max-min rate (progressive filling raises and freezes them together:
every link of a class carries the same load of each class and saturates at the same level) and finish
together, and the links of a class are busy over the same intervals.

The quotient has one transfer per class, of weight (multiplicity) the class size, whose path lists each link
class as often as one member's path crosses links of that class, and one link per class, of capacity the
class size times the link capacity: a link class carries ``sum_F a_LF * |F| * x_F <= |L| * C`` (``a_LF``
hops of one member of ``F`` in ``L``), which is the members' constraint ``sum_F (|F| a_LF / |L|) x_F <= C``
summed over the class. This covers identical independent groups (the data-parallel rings of the eight rails,
the pipeline pairs of a boundary: corresponding elements of identical components get one colour) and symmetric
groups within one component (the ranks of an all-to-all inside a leaf). Identical components are merged first
by their canonical form (:func:`flowsim.network.components.identical`), which needs no rounds; refinement then
runs on the components kept. Hash ECMP that loads links unevenly
leaves the transfers it concerns in classes of their own: no approximation is made. The step engine's
cross-kind windows (a stage's gradient reduction or parameter gather beside the pipeline sends of every
boundary, :mod:`flowsim.step.flows`) are the large case: the sends cross leaf, spine (and core) ports chosen by
the hash, each rail draws its own collisions, and the collisions bind (switch ports made infinite shorten the
windows of gpt3-175b on 1,024 GPUs by up to 0.3 %). Their coarsest equitable partition is discrete (gpt3-175b
on 1,024 and 65,536 GPUs, llama3.1-405b on 16,384), so they have no symmetry at all (the orbits of the
automorphisms are an equitable partition) and run explicitly; with ``ecmp: ideal`` the same windows have a few
dozen classes.

Colours are refined by 64-bit hashes (splitmix64 mixing of a colour and the sums of hashed neighbour
colours) until the number of classes stops growing; the final partition is then checked element by element
(attributes and neighbour-colour counts of every member against its class's first member), so a hash
collision cannot merge elements that are not interchangeable (the quotient is dropped instead).

The one difference from the explicit simulation: there, events of different transfers that fall within the
event loop's relative tolerance (``rtol``) of each other are handled in one batch, and sums of rates over a
link are taken in another order. Times agree to about ``rtol`` relative (tests/test_flow_symmetry.py).

The partition depends on the sizes, releases and latencies only through which transfers share them, so
:func:`quotient` keeps its answers (a quotient, or none) in a small cache keyed by the structure (capacities,
paths, dependencies) and that labelling: the same collective at another size (a sweep, or the streamed plans of
one step's buckets) re-uses its quotient without another refinement.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from flowsim.network.components import identical
from flowsim.network.lru import BytesLRU
from flowsim.network.maxmin_kernels import _link_csr

__all__ = ["Quotient", "quotient"]

MAX_CLASS_FRACTION = 0.25
"""Refinement stops, and no quotient is made, once the transfer classes exceed this fraction of the transfers:
the quotient would save less than this factor of the event loop's work for the cost of more rounds. A cost cap
only (the quotient is exact either way), set by hand from benchmarks/bench_flow_scaling.py: the simulations that
pay have far fewer classes (deepseek-v3: 135 for 25,729 transfers; llama3.1-405b: 4,096 for 65,536), those with
hash-ECMP traffic across leaves end with most transfers in classes of their own, and a lower cap stops their
refinement sooner (65,536 GPUs: 0.2-0.9 s of refinement per simulation of 90k-123k transfers at 0.5)."""

MAX_ROUNDS = 12
"""Refinement rounds before giving up on the quotient (the explicit simulation runs instead). Each round costs a
pass over every path hop and dependency. The simulations of benchmarks/bench_flow_scaling.py's gpt3-175b and
deepseek-v3 cases settle in at most 8 rounds; hash-ECMP traffic over three tiers refines about one step of a
dependency chain per round (a ring's asymmetry travels round it): two of llama3.1-405b's simulations on 16,384 GPUs
settle after 65 rounds (65,536 transfers in 4,096 classes, 1.2 s saved per simulation), but gpt3-175b's
data-parallel rings on 16,384 GPUs (65,536 transfers, 128 re-solves, 0.6 s each) had not settled after 96
rounds, which cost 0.5-0.9 s each. A cost cap only, set by hand from those runs."""

MAX_ROUND_GROWTH = 2
"""Refinement also stops, with no quotient, after a round that multiplies the transfer classes by at least this
factor when one more round growing by the same factor would pass the class cap (:data:`MAX_CLASS_FRACTION`).
A cost cap only, set by hand from benchmarks/bench_flow_scaling.py: llama3.1-405b's hash-ECMP windows grow 4, 8,
~700, ~1,300 classes, then most of the transfers, in their first five rounds (stopped after the third now), while
the refinements that end in a quotient (deepseek-v3's, the gpt3-175b rings) grow by a few classes a round once
past the first two."""

GROWTH_MIN_CLASSES = 128
"""The :data:`MAX_ROUND_GROWTH` stop applies from this many transfer classes on: below, rounds cost microseconds
and a small set's classes can jump once and settle (three transfers per class after one round of a six-transfer
rotation, tests/test_flow_symmetry.py). A cost cap only, set by hand."""

QUOTIENT_CACHE_BYTES = 64 * 2**20
"""Bytes of quotients (:class:`Quotient` arrays) kept per process, least recently used dropped first; answers
of "no quotient" cost nothing. A cost cap only: the 30-size AllReduce sweep on 20 NVL72 racks has four
structures (benchmarks/bench_collectives.py), a step's windows rarely repeat one."""

_MIX = np.int64(-7046029254386353131)  # 0x9E3779B97F4A7C15, splitmix64's odd constant (routing.py cites it)
_M1 = np.int64(-4658895280553007687)  # 0xBF58476D1CE4E5B9, splitmix64's first multiplier
_M2 = np.int64(-7723592293110705685)  # 0x94D049BB133111EB, splitmix64's second multiplier
_SALT_LINK, _SALT_DEP, _SALT_FLOW = np.int64(0x51ED27), np.int64(0xDE9E7D), np.int64(0xF10A5E)


@njit(cache=True, nogil=True)
def _h(x, salt):
    """splitmix64 finaliser of ``x + salt`` (int64, wrapping)."""
    z = (x + salt) * _MIX
    z = (z ^ ((z >> 30) & 0x3FFFFFFFF)) * _M1
    z = (z ^ ((z >> 27) & 0x1FFFFFFFFF)) * _M2
    return z ^ ((z >> 31) & 0x1FFFFFFFF)


@njit(cache=True, nogil=True)
def _dense(keys):
    """Dense colours of int64 ``keys`` numbered in order of first occurrence (open-addressing hash table), and
    their count."""
    return _dense_into(keys, *_table(keys.shape[0]))


@njit(cache=True, nogil=True)
def _dense_into(keys, slot_key, slot_col, first):
    """:func:`_dense` with the caller's table (``slot_key``, ``slot_col``: a power of two of at least twice the
    keys, ``slot_col`` all -1 on entry and again on exit) and scratch (``first``, one entry per key): a
    refinement re-uses one table over its rounds instead of allocating and clearing a fresh one each round (the
    links' table of a llama3.1-405b window is 262,144 slots for 84,000 keys). The colours do not depend on the
    table."""
    n = keys.shape[0]
    mask = slot_col.shape[0] - 1
    out = np.empty(n, dtype=np.int64)
    n_col = 0
    for i in range(n):
        k = keys[i]
        j = _h(k, 0) & mask
        while slot_col[j] >= 0 and slot_key[j] != k:
            j = (j + 1) & mask
        if slot_col[j] < 0:
            slot_key[j] = k
            slot_col[j] = n_col
            first[n_col] = j
            n_col += 1
        out[i] = slot_col[j]
    for c in range(n_col):
        slot_col[first[c]] = -1
    return out, n_col


@njit(cache=True, nogil=True)
def _table(n):
    """An empty table and scratch for :func:`_dense_into` of ``n`` keys."""
    size = 1
    while size < 2 * n:
        size *= 2
    return np.empty(size, dtype=np.int64), np.full(size, -1, dtype=np.int64), np.empty(n, dtype=np.int64)


@njit(cache=True, nogil=True)
def _constant(x):
    for i in range(1, x.shape[0]):
        if x[i] != x[0]:
            return False
    return True


@njit(cache=True, nogil=True)
def _labels(size_bits, release_bits, latency_bits):
    """Dense labels of the transfers' (size, release, latency) triples, numbered in order of first occurrence:
    equal labels for equal triples, exactly (each attribute's dense colours, then pairs of them; constant
    attributes skipped)."""
    out = np.zeros(size_bits.shape[0], dtype=np.int64)
    tab = _table(0)
    for x in (size_bits, release_bits, latency_bits):
        if not _constant(x):
            if tab[2].shape[0] == 0:
                tab = _table(x.shape[0])  # one table for all (_dense_into)
            c, n_c = _dense_into(x, *tab)
            out = _dense_into(out * n_c + c, *tab)[0]  # both < n: no overflow below 3e9 transfers
    return out


@njit(cache=True, inline="always")
def _step1(h, v):
    """One element ``v`` into a state of :func:`_absorb`'s first chain."""
    h = (h ^ v) * _M1
    return h ^ ((h >> 32) & 0xFFFFFFFF)


@njit(cache=True, inline="always")
def _step2(h, v):
    """One element ``v`` into a state of :func:`_absorb`'s second chain."""
    h = (h + v) * _M2
    return h ^ ((h >> 29) & 0x7FFFFFFFF)


@njit(cache=True, nogil=True)
def _absorb(h1, h2, x):
    """Two independent 64-bit hash chains with the array ``x`` absorbed, its length first: each element is
    xor-ed (added) into a state, multiplied by an odd constant (splitmix64's two multipliers) and its high half
    folded down. Each chain runs four lanes, lane ``k`` taking the elements ``i = k (mod 4)`` (the last ``n mod 4``
    lane 0), absorbed into the chain in turn at the end: independent lanes overlap their multiplications (1.5M
    elements: 2.2 -> 1.0 ms)."""
    n = x.shape[0]
    h1 = (h1 ^ n) * _M1
    h2 = (h2 + n) * _M2
    a0, a1, a2, a3 = h1, h1 ^ 1, h1 ^ 2, h1 ^ 3
    b0, b1, b2, b3 = h2, h2 + 1, h2 + 2, h2 + 3
    m = n - n % 4
    for i in range(0, m, 4):
        a0, a1, a2, a3 = _step1(a0, x[i]), _step1(a1, x[i + 1]), _step1(a2, x[i + 2]), _step1(a3, x[i + 3])
        b0, b1, b2, b3 = _step2(b0, x[i]), _step2(b1, x[i + 1]), _step2(b2, x[i + 2]), _step2(b3, x[i + 3])
    for i in range(m, n):
        a0, b0 = _step1(a0, x[i]), _step2(b0, x[i])
    return (_step1(_step1(_step1(_step1(h1, a0), a1), a2), a3),
            _step2(_step2(_step2(_step2(h2, b0), b1), b2), b3))


@njit(cache=True, nogil=True)
def _digest(cap_bits, route_ptr, route_links, dep_ptr, dep_idx, labels):
    """128-bit hash (two 64-bit lanes) of a transfer set's structure: capacities, paths, dependencies and the
    labels of :func:`_labels`."""
    h1, h2 = _absorb(np.int64(1), np.int64(2), cap_bits)
    h1, h2 = _absorb(h1, h2, route_ptr)
    h1, h2 = _absorb(h1, h2, route_links)
    h1, h2 = _absorb(h1, h2, dep_ptr)
    h1, h2 = _absorb(h1, h2, dep_idx)
    return _absorb(h1, h2, labels)


@njit(cache=True, nogil=True)
def _depths(dep_ptr, dep_idx):
    """Longest dependency chain below each transfer (0: none; -1 on a dependency cycle), by Kahn's algorithm.
    A refinement invariant (a transfer's depth is one more than its deepest dependency's), so starting from it
    saves one round per level of a long chain (a ring's steps) without changing the stable colouring."""
    n = dep_ptr.shape[0] - 1
    nxt_ptr, nxt = _link_csr(n, dep_ptr, dep_idx)  # the transposed graph: each transfer's dependents
    left = np.diff(dep_ptr)
    depth = np.full(n, -1, dtype=np.int64)
    queue = np.empty(n, dtype=np.int64)
    n_q = 0
    for t in range(n):
        if left[t] == 0:
            depth[t] = 0
            queue[n_q] = t
            n_q += 1
    i = 0
    while i < n_q:
        t = queue[i]
        i += 1
        for j in range(nxt_ptr[t], nxt_ptr[t + 1]):
            d = nxt[j]
            depth[d] = max(depth[d], depth[t] + 1)
            left[d] -= 1
            if left[d] == 0:
                queue[n_q] = d
                n_q += 1
    return depth


@njit(cache=True, nogil=True)
def _refine(route_ptr, route_links, dep_ptr, dep_idx, used, size_bits, release_bits, latency_bits, cap_bits,
            max_rounds, max_classes):
    """Colour refinement from the transfers' attributes and depths and the links' capacities: each round hashes
    a transfer's colour with the sums of its path links' and dependencies' hashed colours, a used link's with
    the sum of its transfers' (multiset hashes), until the class counts stop growing (the colouring is stable),
    the transfer classes pass ``max_classes`` (or a round grows them so fast that the next would,
    :data:`MAX_ROUND_GROWTH`) or ``max_rounds`` rounds have run. Returns the transfer colours,
    their count, the link colours (-1 for unused links), their count and whether the colouring is stable.

    A round colours the transfers first and stops there when they grew too fast (such a round is not stable,
    so its link colours are never read); the links' sums are scattered from the transfers' paths in the same pass
    over the hops (wrapping int64 additions: the sums of the links' transfer lists, in another order), so no
    link -> transfers transpose is built for a refinement that finds nothing."""
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
    # Each colour's hashes, once per element and round rather than once per hop (the same sums)
    lhash = np.zeros(cap_bits.shape[0], dtype=np.int64)
    lsum = np.zeros(cap_bits.shape[0], dtype=np.int64)
    thash = np.empty(n, dtype=np.int64)
    for _ in range(max_rounds):
        if n_tc > max_classes:
            break
        for i in range(used.shape[0]):
            lhash[used[i]] = _h(lcol[used[i]], _SALT_LINK)
            lsum[used[i]] = 0
        for t in range(n):
            thash[t] = _h(tcol[t], _SALT_DEP)
        # One pass over the hops: each transfer's sum of its links' hashes, and each link's sum of its transfers'
        # (the links' are read only if the transfers do not grow too fast)
        for t in range(n):
            a = np.int64(0)
            ht = _h(tcol[t], _SALT_FLOW)
            for h in range(route_ptr[t], route_ptr[t + 1]):
                a += lhash[route_links[h]]
                lsum[route_links[h]] += ht
            d = np.int64(0)
            for j in range(dep_ptr[t], dep_ptr[t + 1]):
                d += thash[dep_idx[j]]
            key[t] = _h(_h(tcol[t], a), d)
        tc2, n_tc2 = _dense_into(key, *t_tab)
        if (n_tc2 >= GROWTH_MIN_CLASSES and n_tc2 >= MAX_ROUND_GROWTH * n_tc
                and n_tc2 * n_tc2 > max_classes * n_tc):
            break  # another round growing as much would pass max_classes: no quotient
        for i in range(used.shape[0]):
            lkey[i] = _h(lcol[used[i]], lsum[used[i]])
        lc2, n_lc2 = _dense_into(lkey, *l_tab)
        if n_tc2 == n_tc and n_lc2 == n_lc:
            stable = True
            break
        tcol, n_tc, n_lc = tc2, n_tc2, n_lc2
        for i in range(used.shape[0]):
            lcol[used[i]] = lc2[i]
    return tcol, n_tc, lcol, n_lc, stable


@njit(cache=True, nogil=True)
def _same_counts(cnt, a_idx, a_lo, a_hi, b_idx, b_lo, b_hi, col):
    """Whether ``col[a_idx[a_lo:a_hi]]`` and ``col[b_idx[b_lo:b_hi]]`` are the same multiset (``cnt``: zeros
    over the colours, left zero)."""
    if a_hi - a_lo != b_hi - b_lo:
        return False
    for k in range(a_lo, a_hi):
        cnt[col[a_idx[k]]] += 1
    for k in range(b_lo, b_hi):
        cnt[col[b_idx[k]]] -= 1
    ok = True
    for k in range(a_lo, a_hi):
        if cnt[col[a_idx[k]]] != 0:
            ok = False
        cnt[col[a_idx[k]]] = 0
    for k in range(b_lo, b_hi):
        cnt[col[b_idx[k]]] = 0
    return ok


@njit(cache=True, nogil=True)
def _equitable(route_ptr, route_links, dep_ptr, dep_idx, link_ptr, link_flows, used, tcol, lcol, t_rep, l_rep,
               size_bits, release_bits, latency_bits, cap_bits, n_tc, n_lc):
    """Whether the colouring is equitable: every transfer has its class representative's attributes, link-colour
    counts on its path and transfer-colour counts among its dependencies; every used link its representative's
    capacity and transfer-colour counts among its transfers."""
    lcnt = np.zeros(n_lc, dtype=np.int64)
    tcnt = np.zeros(n_tc, dtype=np.int64)
    for t in range(tcol.shape[0]):
        r = t_rep[tcol[t]]
        if r == t:
            continue
        if size_bits[t] != size_bits[r] or release_bits[t] != release_bits[r] or latency_bits[t] != latency_bits[r]:
            return False
        if not _same_counts(lcnt, route_links, route_ptr[r], route_ptr[r + 1], route_links, route_ptr[t],
                            route_ptr[t + 1], lcol):
            return False
        if not _same_counts(tcnt, dep_idx, dep_ptr[r], dep_ptr[r + 1], dep_idx, dep_ptr[t], dep_ptr[t + 1], tcol):
            return False
    for i in range(used.shape[0]):
        l = used[i]
        r = l_rep[lcol[l]]
        if r == l:
            continue
        if cap_bits[l] != cap_bits[r]:
            return False
        if not _same_counts(tcnt, link_flows, link_ptr[r], link_ptr[r + 1], link_flows, link_ptr[l],
                            link_ptr[l + 1], tcol):
            return False
    return True


@njit(cache=True, nogil=True)
def _build(t_rep, route_ptr, route_links, dep_ptr, dep_idx, tcol, lcol):
    """The quotient's paths (each representative's links as link classes) and dependencies (its dependencies as
    transfer classes, each class once)."""
    n_q = t_rep.shape[0]
    q_ptr = np.zeros(n_q + 1, dtype=np.int64)
    n_deps = 0
    for c in range(n_q):
        r = t_rep[c]
        q_ptr[c + 1] = q_ptr[c] + route_ptr[r + 1] - route_ptr[r]
        n_deps += dep_ptr[r + 1] - dep_ptr[r]
    q_links = np.empty(q_ptr[n_q], dtype=np.int64)
    q_dep_ptr = np.zeros(n_q + 1, dtype=np.int64)
    q_dep_idx = np.empty(n_deps, dtype=np.int64)
    seen = np.full(n_q, -1, dtype=np.int64)
    for c in range(n_q):
        r = t_rep[c]
        for k in range(route_ptr[r + 1] - route_ptr[r]):
            q_links[q_ptr[c] + k] = lcol[route_links[route_ptr[r] + k]]
        q_dep_ptr[c + 1] = q_dep_ptr[c]
        for j in range(dep_ptr[r], dep_ptr[r + 1]):
            d = tcol[dep_idx[j]]
            if seen[d] != c:
                seen[d] = c
                q_dep_idx[q_dep_ptr[c + 1]] = d
                q_dep_ptr[c + 1] += 1
    return q_ptr, q_links, q_dep_ptr, q_dep_idx[:q_dep_ptr[n_q]].copy()


@dataclass(frozen=True, eq=False)
class Quotient:
    """One transfer per class of interchangeable transfers, one link per class of links, and how to copy the
    results back.

    Attributes
    ----------
    capacity_Bps : float64[n_link_classes]
        Each link class's capacity: its links' total, bytes/s.
    route_ptr, route_links : int64 arrays
        The quotient's paths (CSR) over link classes, a class listed as often as one member crosses it.
    dep_ptr, dep_idx : int64 arrays
        The quotient's dependencies (CSR) over transfer classes.
    weights : float64[n_classes]
        Transfers in each class (the multiplicity of its quotient transfer).
    transfers : int64[n_classes]
        Each class's first transfer (original id): its size, release and latency are the class's.
    transfer_of : int64[n]
        The class of each original transfer.
    link_of : int64[n_links]
        The class of each original link (-1: no transfer uses it).
    n_classes, n_link_classes : int
        Transfer and link classes.
    """

    capacity_Bps: np.ndarray
    route_ptr: np.ndarray
    route_links: np.ndarray
    dep_ptr: np.ndarray
    dep_idx: np.ndarray
    weights: np.ndarray
    transfers: np.ndarray
    transfer_of: np.ndarray
    link_of: np.ndarray
    n_classes: int
    n_link_classes: int


def _equitable_quotient(capacity_Bps: np.ndarray, route_ptr: np.ndarray, route_links: np.ndarray,
                        size_bytes: np.ndarray, release_s: np.ndarray, latency_s: np.ndarray, dep_ptr: np.ndarray,
                        dep_idx: np.ndarray):
    """The quotient by the coarsest equitable partition alone; ``None`` when the classes are more than
    :data:`MAX_CLASS_FRACTION` of the transfers (little to save), the refinement takes more than
    :data:`MAX_ROUNDS` rounds, or the partition fails its check (a hash collision)."""
    n, n_links = route_ptr.shape[0] - 1, capacity_Bps.shape[0]
    if n < 2:
        return None
    bits = (size_bytes.view(np.int64), release_s.view(np.int64), latency_s.view(np.int64))
    cap_bits = capacity_Bps.view(np.int64)
    used = np.flatnonzero(np.bincount(route_links, minlength=n_links))
    tcol, n_tc, lcol, n_lc, stable = _refine(route_ptr, route_links, dep_ptr, dep_idx, used, *bits, cap_bits,
                                             MAX_ROUNDS, int(n * MAX_CLASS_FRACTION))
    if not stable:
        return None
    link_ptr, link_flows = _link_csr(n_links, route_ptr, route_links)
    _, t_rep = np.unique(tcol, return_index=True)  # colours are numbered by first occurrence: increasing
    _, first = np.unique(lcol[used], return_index=True)
    l_rep = used[first]
    if not _equitable(route_ptr, route_links, dep_ptr, dep_idx, link_ptr, link_flows, used, tcol, lcol, t_rep,
                      l_rep, *bits, cap_bits, n_tc, n_lc):
        return None
    t_rep = t_rep.astype(np.int64)
    q_ptr, q_links, q_dep_ptr, q_dep_idx = _build(t_rep, route_ptr, route_links, dep_ptr, dep_idx, tcol, lcol)
    weights = np.bincount(tcol, minlength=n_tc).astype(np.float64)
    capacity = np.bincount(lcol[used], minlength=n_lc) * capacity_Bps[l_rep]
    return Quotient(capacity, q_ptr, q_links, q_dep_ptr, q_dep_idx, weights, t_rep, tcol, lcol, n_tc, n_lc)


def quotient(capacity_Bps: np.ndarray, route_ptr: np.ndarray, route_links: np.ndarray, size_bytes: np.ndarray,
             release_s: np.ndarray, latency_s: np.ndarray, dep_ptr: np.ndarray, dep_idx: np.ndarray):
    """The quotient of a checked transfer set (:func:`flowsim.network.netsim.simulate`'s arrays): one component per
    class of identical ones (:func:`flowsim.network.components.identical`, no refinement rounds needed), then the
    kept transfers' coarsest equitable partition; ``None`` when neither saves anything. Answers are cached by the
    structure (module docstring; the arrays of a cached quotient are read-only).

    Returns
    -------
    Quotient or None
    """
    ints = [np.ascontiguousarray(a, dtype=np.int64) for a in (route_ptr, route_links, dep_ptr, dep_idx)]
    labels = _labels(*(np.ascontiguousarray(a, dtype=np.float64).view(np.int64)
                       for a in (size_bytes, release_s, latency_s)))
    key = (MAX_CLASS_FRACTION, MAX_ROUNDS, *_digest(np.ascontiguousarray(capacity_Bps, dtype=np.float64).view(np.int64),
                                                    *ints, labels))
    q = _QUOTIENTS.get(key, _MISS)
    if q is _MISS:
        q = _quotient(capacity_Bps, route_ptr, route_links, size_bytes, release_s, latency_s, dep_ptr, dep_idx)
        arrays = () if q is None else [getattr(q, f) for f in _ARRAYS]
        for a in arrays:
            a.flags.writeable = False
        _QUOTIENTS.put(key, q, sum(a.nbytes for a in arrays))
    return q


_ARRAYS = ("capacity_Bps", "route_ptr", "route_links", "dep_ptr", "dep_idx", "weights", "transfers", "transfer_of",
           "link_of")
_MISS = object()
_QUOTIENTS = BytesLRU(QUOTIENT_CACHE_BYTES)


def _quotient(capacity_Bps: np.ndarray, route_ptr: np.ndarray, route_links: np.ndarray, size_bytes: np.ndarray,
              release_s: np.ndarray, latency_s: np.ndarray, dep_ptr: np.ndarray, dep_idx: np.ndarray):
    """:func:`quotient` without the cache."""
    red = identical(capacity_Bps, route_ptr, route_links, size_bytes, release_s, latency_s, dep_ptr, dep_idx)
    if red is None:
        return _equitable_quotient(capacity_Bps, route_ptr, route_links, size_bytes, release_s, latency_s, dep_ptr,
                                   dep_idx)
    t, cap = red.transfers, capacity_Bps[red.links]
    q = _equitable_quotient(cap, red.route_ptr, red.route_links, size_bytes[t], release_s[t], latency_s[t],
                            red.dep_ptr, red.dep_idx)
    used = red.link_of >= 0
    link_of = np.full(capacity_Bps.shape[0], -1, dtype=np.int64)
    if q is None:  # the kept components as they are
        link_of[used] = red.link_of[used]
        return Quotient(cap, red.route_ptr, red.route_links, red.dep_ptr, red.dep_idx, np.ones(t.size), t,
                        red.transfer_of, link_of, int(t.size), int(cap.size))
    link_of[used] = q.link_of[red.link_of[used]]
    return Quotient(q.capacity_Bps, q.route_ptr, q.route_links, q.dep_ptr, q.dep_idx, q.weights, t[q.transfers],
                    q.transfer_of[red.transfer_of], link_of, q.n_classes, q.n_link_classes)
