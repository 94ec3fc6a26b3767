"""The flow engine's threads: independent simulations run at once.

Two kinds of work are independent: the cross-kind windows of a step's pipeline stages (each stage's gradient
reduction and parameter gather with the traffic of its own window, :mod:`flowsim.step.data_parallel`), and the
components of one simulation that share no link (:mod:`flowsim.network.components`). Their event loops are numba
kernels that release the GIL (``nogil``), so threads of one process run them on separate cores and share the
caches of prepared collectives and quotients (:class:`flowsim.network.lru.BytesLRU` locks its entries).

Work handed to :func:`map_ordered` from a thread of the pool runs in that thread: a window's simulation is not
split again into components while the windows already fill the pool (nor could the pool's threads wait on tasks
queued behind them).
"""
from __future__ import annotations

import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

from flowsim.errors import ConfigError

__all__ = ["THREADS", "map_ordered", "threads"]

THREADS = None
"""Threads of the flow engine; ``None``: the environment variable ``FLOWSIM_NETSIM_THREADS`` (a whole number
>= 1), default 1. Opt-in: each thread holds one more simulation's working set at once (gpt3-175b on 65,536 GPUs:
about 100-130 MB per cross-kind window, so two threads lift the step's peak memory past issue 22's 500 MB;
docs/PERFORMANCE.md), and on a shared machine the other thread's core may be busy; set it to the idle cores of a
machine that has them and the memory."""

_LOCAL = threading.local()  # .worker is True in the pool's threads


@functools.lru_cache(maxsize=1)
def _env_threads() -> int:
    raw = os.environ.get("FLOWSIM_NETSIM_THREADS", "1")
    if not raw.strip().isdigit() or int(raw) < 1:
        raise ConfigError("FLOWSIM_NETSIM_THREADS", "must be a whole number >= 1", repr(raw))
    return int(raw)


def _mark_worker() -> None:
    _LOCAL.worker = True


@functools.lru_cache(maxsize=8)
def _pool(n: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(n, thread_name_prefix="flowsim-netsim", initializer=_mark_worker)


def threads() -> int:
    """Threads the calling code may use: :data:`THREADS` (or its environment variable), 1 in a thread of the
    pool."""
    if getattr(_LOCAL, "worker", False):
        return 1
    return _env_threads() if THREADS is None else THREADS


def map_ordered(fn: Callable, items: Sequence) -> list:
    """``[fn(x) for x in items]``, the calls spread over :func:`threads` threads when there are more than one
    and more than one item; results in the order of ``items``, the first exception raised."""
    n = threads()
    if n <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    return list(_pool(n).map(fn, items))
