"""Indexed binary min-heap over integer items, for the network kernels.

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
