"""Orderings for the network kernels: an indexed binary min-heap over integer items, and a radix sort by
(key, id) (:func:`_run_order`, the sorted run of progressive filling).

The heap stores item ids with their keys side by side in heap order (``heap[i]``, ``hkey[i]``, so a
comparison touches one contiguous region) and each item's position in ``pos`` (-1 when absent), so an
item's key can be changed in place in O(log n) (Cormen et al., *Introduction to Algorithms*, 3rd ed.,
sec. 6.5, priority queues). Ties are broken by the smaller item id, so the pop order is fully
deterministic. Used by the max-min solver (items = links, key = fair share) and the event loop (items =
transfers, key = time). All functions are ``numba.njit(cache=True)``; the arrays are owned by the caller.

Arrays shared by every function
-------------------------------
heap : int64[capacity]
    ``heap[0:size]`` holds the items in heap order.
hkey : float64[capacity]
    ``hkey[i]`` is the key of ``heap[i]`` (any unit; the caller's).
pos : int64[n_items]
    Position of each item in ``heap``; -1 when the item is not in the heap.
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _sift_up(heap, hkey, pos, i):
    """Move the entry at heap index ``i`` up until its parent orders before it.

    Parameters
    ----------
    heap, hkey, pos : see module docstring.
    i : int
        Heap index in [0, size).
    """
    item = heap[i]
    k = hkey[i]
    while i > 0:
        parent = (i - 1) >> 1
        pk = hkey[parent]
        if pk < k or (pk == k and heap[parent] < item):
            break
        heap[i] = heap[parent]
        hkey[i] = pk
        pos[heap[i]] = i
        i = parent
    heap[i] = item
    hkey[i] = k
    pos[item] = i


@njit(cache=True, nogil=True)
def _sift_down(heap, hkey, pos, size, i):
    """Move the entry at heap index ``i`` down until both children order after it.

    Parameters
    ----------
    heap, hkey, pos : see module docstring.
    size : int
        Number of items in the heap.
    i : int
        Heap index in [0, size).
    """
    item = heap[i]
    k = hkey[i]
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        right = child + 1
        if right < size and (hkey[right] < hkey[child] or (hkey[right] == hkey[child]
                                                            and heap[right] < heap[child])):
            child = right
        ck = hkey[child]
        if k < ck or (k == ck and item < heap[child]):
            break
        heap[i] = heap[child]
        hkey[i] = ck
        pos[heap[i]] = i
        i = child
    heap[i] = item
    hkey[i] = k
    pos[item] = i


@njit(cache=True, nogil=True)
def _heap_push(heap, hkey, pos, size, item, k):
    """Insert ``item`` (not already present) with key ``k``; return the new size.

    Parameters
    ----------
    heap, hkey, pos : see module docstring.
    size : int
        Number of items before the push.
    item : int
        Item id in [0, n_items).
    k : float
        Its key.

    Returns
    -------
    int
        ``size + 1``.
    """
    heap[size] = item
    hkey[size] = k
    pos[item] = size
    _sift_up(heap, hkey, pos, size)
    return size + 1


@njit(cache=True, nogil=True)
def _heap_pop(heap, hkey, pos, size):
    """Remove and return the first item; the heap must not be empty.

    Parameters
    ----------
    heap, hkey, pos : see module docstring.
    size : int
        Number of items before the pop, >= 1.

    Returns
    -------
    item : int
        The item with the smallest key (smallest id among ties).
    size : int
        ``size - 1``.
    """
    top = heap[0]
    pos[top] = -1
    size -= 1
    if size == 0:
        return top, size
    # Bottom-up (Wegener, "Bottom-up heapsort", Theor. Comput. Sci. 118, 1993): move the hole at the root down
    # along the smaller children to a leaf (one comparison a level), then the last entry up from there; it
    # belongs near the bottom, so this costs about half the comparisons of a sift-down from the root. The heap
    # is valid either way and pops by (key, id), a total order, so the items come out in the same order.
    item = heap[size]
    k = hkey[size]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        right = child + 1
        if right < size and (hkey[right] < hkey[child] or (hkey[right] == hkey[child] and heap[right] < heap[child])):
            child = right
        heap[i] = heap[child]
        hkey[i] = hkey[child]
        pos[heap[i]] = i
        i = child
    heap[i] = item
    hkey[i] = k
    _sift_up(heap, hkey, pos, i)
    return top, size


@njit(cache=True, nogil=True)
def _heap_update(heap, hkey, pos, size, item, k):
    """Give ``item`` (present) the key ``k`` and restore heap order.

    Parameters
    ----------
    heap, hkey, pos : see module docstring.
    size : int
        Number of items in the heap.
    item : int
        Item id whose key changes.
    k : float
        The new key.
    """
    i = pos[item]
    hkey[i] = k
    _sift_up(heap, hkey, pos, i)
    _sift_down(heap, hkey, pos, size, pos[item])


@njit(cache=True, nogil=True)
def _radix_pass(src, dst, value, shift, cnt):
    """One stable counting-sort pass of the positions ``src`` into ``dst`` by the byte ``shift`` of ``value[p]``;
    False, ``dst`` untouched, when that byte is the same for all (the pass would keep the order)."""
    n = src.shape[0]
    cnt[:] = 0
    for i in range(n):
        cnt[((value[src[i]] >> shift) & 255) + 1] += 1
    if cnt[((value[src[0]] >> shift) & 255) + 1] == n:
        return False
    for d in range(256):
        cnt[d + 1] += cnt[d]
    for i in range(n):
        d = (value[src[i]] >> shift) & 255
        dst[cnt[d]] = src[i]
        cnt[d] += 1
    return True


RUN_RANK_MAX_KEYS = 1024
""":func:`_run_order` sorts by the rank of each key among the distinct keys (one counting pass) when there are at
most this many; beyond, by the bytes of the keys (eight passes). A cost cap only (the order is the same), set by
hand from benchmarks/bench_flow_scaling.py: a fabric's fair shares take few values (capacities over small counts:
12 distinct among the 343,584 links of a 65,536-GPU window's first fill)."""

_HASH_MUL = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing's odd constant, 2^64 / golden ratio (Knuth, TAOCP 3, 6.4)


@njit(cache=True, nogil=True)
def _key_ranks(bits, max_keys):
    """Rank of each value of ``bits`` among its distinct values in increasing order (as float64 bit patterns of
    keys >= 0, which order as the keys), and their count; count -1 when there are more than ``max_keys``
    (``max_keys`` a power of two). Distinct values through an open-addressing hash table, twice ``max_keys``
    slots (linear probing)."""
    n = bits.shape[0]
    size = 2 * max_keys
    log2 = 0
    while (1 << log2) < size:
        log2 += 1
    shift = np.uint64(64 - log2)  # the top log2 bits of the product index the table
    slot_bits = np.empty(size, dtype=np.int64)
    slot_val = np.full(size, -1, dtype=np.int64)  # index into ``distinct``; -1: empty
    distinct = np.empty(max_keys, dtype=np.int64)
    val_of = np.empty(n, dtype=np.int64)
    n_d = 0
    for i in range(n):
        b = bits[i]
        s = np.int64((np.uint64(b) * _HASH_MUL) >> shift)
        while slot_val[s] >= 0 and slot_bits[s] != b:
            s = (s + 1) & (size - 1)
        if slot_val[s] < 0:
            if n_d == max_keys:
                return val_of, -1
            slot_bits[s] = b
            slot_val[s] = n_d
            distinct[n_d] = b
            n_d += 1
        val_of[i] = slot_val[s]
    rank_of = np.empty(n_d, dtype=np.int64)
    order = np.argsort(distinct[:n_d])
    for r in range(n_d):
        rank_of[order[r]] = r
    for i in range(n):
        val_of[i] = rank_of[val_of[i]]
    return val_of, n_d


@njit(cache=True, nogil=True)
def _run_order(ids, keys):
    """Positions of ``ids`` (distinct, >= 0) ordered by (``keys``, id), the order of a stable sort of the keys of
    the ids sorted: a least-significant-digit sort, the bytes of the id first (none when the ids already
    increase), then the key (finite and >= 0, whose float64 bit patterns order as the values once -0.0 is made
    0.0): by its rank among the distinct keys in one counting pass (:data:`RUN_RANK_MAX_KEYS`), else by its eight
    bytes; O(n) per pass, where numba's comparison sorts took most of a window's first fill (70,000 links: 9 ms
    to sort, 2 to fill)."""
    n = ids.shape[0]
    pos = np.arange(n)
    if n < 2:
        return pos
    tmp = np.empty(n, dtype=np.int64)
    cnt = np.empty(257, dtype=np.int64)
    top = ids[0]
    increasing = True
    for i in range(1, n):
        top = max(top, ids[i])
        if ids[i] <= ids[i - 1]:
            increasing = False
    shift = 0
    while not increasing and (top >> shift) > 0:
        if _radix_pass(pos, tmp, ids, shift, cnt):
            pos, tmp = tmp, pos
        shift += 8
    bits = (keys + 0.0).view(np.int64)
    rank, n_ranks = _key_ranks(bits, RUN_RANK_MAX_KEYS)
    if n_ranks > 0:
        count = np.zeros(n_ranks + 1, dtype=np.int64)
        for i in range(n):
            count[rank[i] + 1] += 1
        for r in range(n_ranks):
            count[r + 1] += count[r]
        for i in range(n):
            p = pos[i]
            tmp[count[rank[p]]] = p
            count[rank[p]] += 1
        return tmp
    for shift in range(0, 64, 8):
        if _radix_pass(pos, tmp, bits, shift, cnt):
            pos, tmp = tmp, pos
    return pos
