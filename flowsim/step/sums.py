"""numpy's float64 summation reproduced in numba kernels, so that a kernel's sums equal numpy's ``sum`` bit for bit.

numpy sums a contiguous float64 run pairwise (``pairwise_sum`` in numpy/_core/src/umath/loops_utils.h.src): a run
of fewer than 8 in order; of at most 128 with 8 accumulators, combined as ``((r0 + r1) + (r2 + r3)) + ((r4 + r5) +
(r6 + r7))``, then the rest in order; a longer run as the sums of its two halves, split at a multiple of 8. A row
of a C-contiguous 2-D array summed along ``axis=1`` is one such run (tests/test_fast_path.py compares).
"""
from __future__ import annotations

import numpy as np
from flowsim._jit import njit


@njit(cache=True)
def _block_sum(a, lo, n):
    """numpy's sum of at most 128 float64: 8 accumulators, then the rest in order (``pairwise_sum``'s leaf)."""
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    acc = a[lo:lo + 8].copy()
    i = 8
    while i < n - n % 8:
        for j in range(8):
            acc[j] += a[lo + i + j]
        i += 8
    res = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
    for j in range(lo + i, lo + n):
        res += a[j]
    return res


@njit(cache=True)
def pairwise_sum(a, lo, n):
    """``a[lo:lo + n].sum()`` as numpy sums float64 (pairwise summation, numpy's ``pairwise_sum``: halves split at
    a multiple of 8 down to blocks of at most 128, :func:`_block_sum`), so that the sums equal numpy's bit for bit.
    The halves are added in numpy's order from an explicit stack: the recursive kernel crashed when loaded from
    numba's cache (segmentation fault, numba 0.68.1)."""
    if n <= 128:
        return _block_sum(a, lo, n)
    span = np.empty((64, 3), dtype=np.int64)  # (first, count, halves done) of the open ranges
    sums = np.empty(64)
    top, held = 0, 0
    span[0, 0], span[0, 1], span[0, 2] = lo, n, 0
    while top >= 0:
        first, count, done = span[top, 0], span[top, 1], span[top, 2]
        if count <= 128:  # a leaf
            sums[held] = _block_sum(a, first, count)
            held += 1
            top -= 1
            continue
        if done == 2:  # both halves summed: left + right
            held -= 1
            sums[held - 1] += sums[held]
            top -= 1
            continue
        half = count // 2
        half -= half % 8
        span[top, 2] = done + 1
        top += 1
        span[top, 0], span[top, 1], span[top, 2] = (first, half, 0) if done == 0 else (first + half, count - half, 0)
    return sums[0]
