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


@njit(cache=True)
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


@njit(cache=True)
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


@njit(cache=True)
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


@njit(cache=True)
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
    if size > 0:
        heap[0] = heap[size]
        hkey[0] = hkey[size]
        pos[heap[0]] = 0
        _sift_down(heap, hkey, pos, size, 0)
    return top, size


@njit(cache=True)
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


@njit(cache=True)
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


@njit(cache=True)
def _run_order(ids, keys):
    """Positions of ``ids`` (distinct, >= 0) ordered by (``keys``, id), the order of a stable sort of the keys of
    the ids sorted: a least-significant-digit radix sort, bytes of the id first, then of the key (finite and
    >= 0, whose float64 bit patterns order as the values once -0.0 is made 0.0); O(n) per byte, where numba's
    comparison sorts took most of a window's first fill (70,000 links: 9 ms to sort, 2 to fill)."""
    n = ids.shape[0]
    pos = np.arange(n)
    if n < 2:
        return pos
    tmp = np.empty(n, dtype=np.int64)
    cnt = np.empty(257, dtype=np.int64)
    top = 0
    for i in range(n):
        top = max(top, ids[i])
    shift = 0
    while (top >> shift) > 0:
        if _radix_pass(pos, tmp, ids, shift, cnt):
            pos, tmp = tmp, pos
        shift += 8
    bits = (keys + 0.0).view(np.int64)
    for shift in range(0, 64, 8):
        if _radix_pass(pos, tmp, bits, shift, cnt):
            pos, tmp = tmp, pos
    return pos
