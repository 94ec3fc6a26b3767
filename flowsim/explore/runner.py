"""Evaluate many configs: a local process pool (default) or a Dask cluster, a progress bar, the store.

:func:`run_configs` splits the configs into batches, skips those whose key the results store already
holds (and, without re-checking, those it recorded as not fitting in memory), runs
:func:`flowsim.explore.point.evaluate` on the rest, and commits each finished batch to the store in one
transaction as it arrives, so an interrupted run loses at most the batches in flight.
"""
from __future__ import annotations

import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Iterator

from flowsim.errors import ConfigError
from flowsim.explore.point import Outcome, config_dict, evaluate
from flowsim.step.simulate import simulate
from flowsim.explore.store import ResultStore

MAX_BATCH = 64  # configs per task: ~0.6 s of work, so progress and resume stay fine-grained
DASK_CONNECT_TIMEOUT_S = 10.0


class Progress:
    """A progress line on stderr: done/total, percent, points per second and ETA.

    On a terminal the line is redrawn in place (at most 10 times a second); otherwise a line is
    printed every 10 s and at the end, so logs stay short.
    """

    def __init__(self, total: int, label: str, enabled: bool = True, stream=None):
        self.total, self.label, self.enabled = total, label, enabled and total > 0
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.done = 0
        self.start_s = time.perf_counter()
        self._last_s = 0.0

    def advance(self, n: int) -> None:
        """Count ``n`` more points done and redraw if due."""
        self.done += n
        now = time.perf_counter()
        if self.enabled and now - self._last_s >= (0.1 if self.tty else 10.0):
            self._last_s = now
            self._draw(now, end="\r" if self.tty else "\n")

    def close(self) -> None:
        """Draw the final line (nothing when nothing was done)."""
        if self.enabled and self.done:
            self._draw(time.perf_counter(), end="\n")

    def _draw(self, now: float, end: str) -> None:
        elapsed = max(now - self.start_s, 1e-9)
        rate = self.done / elapsed
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        eta_txt = f"{eta:5.0f} s" if eta != float("inf") else "    ? s"
        self.stream.write(f"{self.label} {self.done}/{self.total} ({100 * self.done / self.total:5.1f}%)  "
                          f"{rate:7.1f} points/s  ETA {eta_txt}   {end}")
        self.stream.flush()


@dataclass(frozen=True)
class RunReport:
    """What :func:`run_configs` did.

    Attributes
    ----------
    outcomes : tuple[Outcome, ...]
        One per input config, in input order (``status``: ``evaluated``, ``stored`` or ``memory``).
    evaluated, reused, memory_pruned : int
        Configs simulated now, found in the store (not recomputed), and pruned for memory.
    elapsed_s : float
        Wall time of the run.
    """

    outcomes: tuple
    evaluated: int
    reused: int
    memory_pruned: int
    elapsed_s: float


def _batches(configs: list, jobs: int) -> list:
    size = max(1, min(MAX_BATCH, len(configs) // (8 * jobs) or 1))
    items = list(enumerate(configs))
    return [items[i:i + size] for i in range(0, len(items), size)]


_KNOWN = (frozenset(), {})  # (stored keys, known memory-pruned keys) of a worker process


def _init_worker(stored: frozenset, known_pruned: dict) -> None:
    global _KNOWN
    _KNOWN = (stored, known_pruned)


def _evaluate_in_worker(batch: list, prune_memory: bool) -> list:
    return evaluate(batch, _KNOWN[0], prune_memory, _KNOWN[1])


def _run_local(batches: list, stored: frozenset, known_pruned: dict, jobs: int,
               prune_memory: bool) -> Iterator[list]:
    if jobs == 1 or len(batches) == 1:
        for b in batches:
            yield evaluate(b, stored, prune_memory, known_pruned)
        return
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    if ctx.get_start_method() == "fork":
        simulate(batches[0][0][1])  # JIT-compiled kernels and caches are inherited by the forked workers
    ex = ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_init_worker,
                             initargs=(stored, known_pruned))
    try:
        futures = [ex.submit(_evaluate_in_worker, b, prune_memory) for b in batches]
        for f in as_completed(futures):
            yield f.result()
    finally:
        ex.shutdown(wait=True, cancel_futures=True)


def dask_address(scheduler: str) -> str:
    """``scheduler`` (``dask://HOST:PORT`` or ``tcp://HOST:PORT``) as a dask.distributed address."""
    if scheduler.startswith("dask://"):
        scheduler = "tcp://" + scheduler[len("dask://"):]
    host_port = scheduler.split("://", 1)[-1]
    if not scheduler.startswith(("tcp://", "tls://", "inproc://")) or ":" not in host_port:
        raise ConfigError("scheduler", "must look like dask://HOST:PORT", scheduler)
    return scheduler


def connect_dask(scheduler: str):
    """A dask.distributed Client of ``scheduler`` (``dask://HOST:PORT``); ConfigError if it cannot be had."""
    address = dask_address(scheduler)
    try:
        from dask.distributed import Client
    except ImportError:
        raise ConfigError("scheduler", "needs the optional dask[distributed] package "
                          "(pip install 'flowsim[dask]')", scheduler) from None
    try:
        return Client(address, timeout=DASK_CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError) as e:
        raise ConfigError("scheduler", f"cannot reach the Dask scheduler ({type(e).__name__})", scheduler) from None


def _run_dask(client, batches: list, stored: frozenset, known_pruned: dict, prune_memory: bool) -> Iterator[list]:
    from dask.distributed import as_completed as dask_completed

    try:
        stored_f, pruned_f = client.scatter([stored, known_pruned], broadcast=True)
        futures = client.map(evaluate, batches, stored_keys=stored_f, prune_memory=prune_memory,
                             known_pruned=pruned_f, pure=False)
        for f in dask_completed(futures):
            yield f.result()
    finally:
        client.close()


def run_configs(configs: list, *, store: ResultStore | None = None, study: str = "", jobs: int = 0,
                scheduler: str | None = None, prune_memory: bool = True, progress: bool = True,
                label: str = "evaluate") -> RunReport:
    """Evaluate ``configs`` (SimConfigs), reusing and filling ``store``.

    Parameters
    ----------
    configs : list of SimConfig
        The points.
    store : ResultStore, optional
        Where results are read from (points already there are not recomputed) and written to, one
        transaction per finished batch.
    study : str
        Label stored with each row.
    jobs : int
        Local worker processes; 0 = one per CPU. Ignored with ``scheduler``.
    scheduler : str, optional
        ``dask://HOST:PORT`` of a running dask.distributed scheduler.
    prune_memory : bool
        Skip simulating configs that do not fit in GPU memory.
    progress : bool
        Draw a progress line on stderr.
    label : str
        First word of the progress line.

    Raises
    ------
    ConfigError
        ``jobs`` negative, a malformed or unreachable scheduler, or dask missing.
    """
    if not isinstance(jobs, int) or jobs < 0:
        raise ConfigError("jobs", "must be a non-negative integer (0 = one per CPU)", jobs)
    start = time.perf_counter()
    jobs = jobs or os.cpu_count() or 1
    stored = store.keys() if store is not None else frozenset()
    known_pruned = store.memory_pruned() if store is not None else {}
    batches = _batches(list(configs), jobs)
    outcomes: list = [None] * len(configs)
    if scheduler:
        stream = _run_dask(connect_dask(scheduler), batches, stored, known_pruned, prune_memory)
    else:
        stream = _run_local(batches, stored, known_pruned, jobs, prune_memory)
    bar = Progress(len(configs), label, progress)
    try:
        for result in stream:
            new = [(config_dict(configs[o.index]), o.point) for o in result if o.status == "evaluated"]
            too_big = {o.key: o.memory_bytes for o in result if o.status == "memory" and o.key not in known_pruned}
            if store is not None and new:
                store.put(new, study)
            if store is not None and too_big:
                store.put_memory_pruned(too_big)
            for o in result:
                outcomes[o.index] = o
            bar.advance(len(result))
    finally:
        bar.close()
    reused = [o for o in outcomes if o.status == "stored"]
    if reused:
        points = store.get(o.key for o in reused)
        for o in reused:
            outcomes[o.index] = Outcome(o.index, "stored", o.key, points[o.key], points[o.key].memory_bytes_per_gpu)
    counts = {s: sum(o.status == s for o in outcomes) for s in ("evaluated", "stored", "memory")}
    return RunReport(outcomes=tuple(outcomes), evaluated=counts["evaluated"], reused=counts["stored"],
                     memory_pruned=counts["memory"], elapsed_s=time.perf_counter() - start)
