"""glibc malloc settings for the flow engine's many large, short-lived arrays (:func:`keep_freed_memory`).

They are process-wide, so the library does not set them on its own: the ``flowsim`` command sets them when it
starts (every verb, ``flowsim serve`` included), and a program that embeds flowsim and runs large flow simulations
may call :func:`keep_freed_memory` itself (its own memory then behaves the same way)."""
from __future__ import annotations

import ctypes
import functools

__all__ = ["keep_freed_memory"]

HEAP_MMAP_THRESHOLD_BYTES = 32 * 2**20
"""glibc malloc's M_MMAP_THRESHOLD set by :func:`keep_freed_memory`: blocks up to this size come from the heap, so
that a freed one is re-used. 32 MiB is glibc's maximum on 64-bit systems (HEAP_MAX_SIZE / 2, mallopt(3))."""

HEAP_TRIM_THRESHOLD_BYTES = 2**30
"""glibc malloc's M_TRIM_THRESHOLD set by :func:`keep_freed_memory`: free memory at the top of the heap is returned
to the system only past this much (mallopt(3) takes a C int: below 2 GiB)."""


@functools.lru_cache(maxsize=1)
def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed blocks of up to :data:`HEAP_MMAP_THRESHOLD_BYTES` for the next allocation
    instead of returning them to the system (process-wide, once; whether it was set).

    A step's simulations allocate and free arrays of megabytes by the hundred (the window's paths, the quotient's
    colour tables, the event loop's link lists and heaps). By default glibc maps a block above its dynamic mmap
    threshold (128 KiB at start, raised to the largest block freed so far) afresh and unmaps it on free, and trims
    the heap's top once twice that lies free there: every such array then pays a page fault and the zeroing of
    each 4 KiB page on first write. Setting both thresholds (which also stops the dynamic one) re-uses the freed
    pages: benchmarks/bench_flow_scaling.py's gpt3-175b re-run on 65,536 H100 takes 4.2-4.4 -> 3.8 s, the same
    results, max RSS 445 -> 441 MB (the peak is the peak; memory freed after it stays with the process, up to
    :data:`HEAP_TRIM_THRESHOLD_BYTES`). Does nothing where the C library is not glibc."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own symbols, the C library's among them
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's <malloc.h>
    return bool(mallopt(m_mmap_threshold, HEAP_MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(m_trim_threshold, HEAP_TRIM_THRESHOLD_BYTES))
