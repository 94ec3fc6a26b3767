"""Evaluate many configs: a local process pool (default) or a Dask cluster, a progress bar, the store.

:func:`run_configs` splits the configs into batches, skips those whose key the results store already
holds (and, without re-checking, those it recorded as not fitting in memory), runs
:func:`flowsim.explore.point.evaluate` on the rest, and commits each finished batch to the store in one
transaction as it arrives, so an interrupted run loses at most the batches in flight. A fresh local run first
prices the configs' distinct op tables together (:func:`flowsim.step.simulate.price_op_tables`), before the pool
forks, so no worker prices a table alone.
"""
from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Iterator

from flowsim.errors import ConfigError
from flowsim.explore.lifetime import bind_to_parent, sigterm_as_exit, terminate_workers
from flowsim.explore.point import Outcome, config_key, evaluate
from flowsim.explore.store import ResultStore
from flowsim.step.simulate import price_op_tables

MAX_BATCH = 64  # configs per task: ~0.6 s of work, so progress and resume stay fine-grained
DASK_CONNECT_TIMEOUT_S = 10.0


class Progress:
    """A tqdm progress bar on stderr: done/total, percent, points per second and ETA (``total`` None: a count).

    On a terminal the bar is redrawn in place (at most 10 times a second); otherwise a line is printed at
    most every 10 s and at the end, so logs stay short.
    """

    def __init__(self, total: int | None, label: str, enabled: bool = True, stream=None, unit: str = "point"):
        from tqdm import tqdm

        stream = stream or sys.stderr
        tty = hasattr(stream, "isatty") and stream.isatty()
        self.bar = tqdm(total=total, desc=label, unit=unit, file=stream, disable=not enabled or total == 0,
                        mininterval=0.1 if tty else 10.0, dynamic_ncols=tty, leave=True)

    def advance(self, n: int) -> None:
        """Count ``n`` more points done and redraw if due."""
        self.bar.update(n)

    def close(self) -> None:
        """Draw the final line."""
        self.bar.close()


@dataclass(frozen=True)
class RunReport:
    """What :func:`run_configs` did.

    Attributes
    ----------
    outcomes : tuple[Outcome or Failed, ...]
        One per input config, in input order (``status``: ``evaluated``, ``stored``, ``memory`` or, with
        ``errors="row"``, ``error``).
    evaluated, reused, memory_pruned : int
        Configs simulated now, found in the store (not recomputed), and pruned for memory.
    failed : int
        Configs whose evaluation raised (``errors="row"``).
    elapsed_s : float
        Wall time of the run.
    """

    outcomes: tuple
    evaluated: int
    reused: int
    memory_pruned: int
    elapsed_s: float
    failed: int = 0


@dataclass(frozen=True)
class Failed:
    """A config whose evaluation raised (``run_configs(..., errors="row")``).

    Attributes
    ----------
    index : int
        Position of the config in the batch submitted.
    key : str
        Its :func:`~flowsim.explore.point.config_key` ("" when the key itself could not be computed).
    error_type : str
        Class name of the exception (``ConfigError``, ...).
    error : str
        Its message (for a ConfigError ``<field>: <rule> (got <value>)``).
    """

    index: int
    key: str
    error_type: str
    error: str
    status: str = "error"
    point: None = None
    memory_bytes: float = float("nan")


def evaluate_isolated(batch: list, stored_keys=frozenset(), prune_memory: bool = True, known_pruned=None,
                      time_limit_s: float = 0.0) -> list:
    """:func:`~flowsim.explore.point.evaluate`, but a config that raises becomes a :class:`Failed` entry
    instead of failing the batch (each config is evaluated on its own, so one failure costs no other config a
    second simulation)."""
    out = []
    for item in batch:
        try:
            out += evaluate([item], stored_keys, prune_memory, known_pruned, time_limit_s)
        except Exception as e:  # noqa: BLE001 -- reported as a row, with its type and message
            try:
                key = config_key(item[1])
            except Exception:  # noqa: BLE001
                key = ""
            out.append(Failed(item[0], key, type(e).__name__, str(e)))
    return out


@contextlib.contextmanager
def _frozen_heap():
    """Leave the objects alive now out of the garbage collector's walks while the block runs (``gc.freeze``),
    unless something else froze objects already: a tune's enumeration is 300,000 objects, which each full
    collection of the parent walked as the outcomes came in (0.3-0.5 s each, about half of its CPU)."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _batches(configs: list, jobs: int) -> list:
    size = max(1, min(MAX_BATCH, len(configs) // (8 * jobs) or 1))
    items = list(enumerate(configs))
    return [items[i:i + size] for i in range(0, len(items), size)]


_KNOWN = (frozenset(), {}, 0.0)  # (stored keys, known memory-pruned keys, time limit s) of a worker process


def _init_worker(stored: frozenset, known_pruned: dict, parent_pid: int, time_limit_s: float = 0.0) -> None:
    global _KNOWN
    bind_to_parent(parent_pid)  # the worker ends with the sweep, even one killed with SIGKILL
    _KNOWN = (stored, known_pruned, time_limit_s)
    # what the worker inherits (a forked parent's configs and caches: 300,000 objects after a tune's enumeration)
    # is never garbage here; left to the collector, each full collection walked it (0.2 s each)
    gc.freeze()


def _evaluate_in_worker(batch: list, prune_memory: bool, isolate: bool) -> list:
    return (evaluate_isolated if isolate else evaluate)(batch, _KNOWN[0], prune_memory, _KNOWN[1], _KNOWN[2])


def _run_local(batches: list, stored: frozenset, known_pruned: dict, jobs: int,
               prune_memory: bool, isolate: bool = False, time_limit_s: float = 0.0) -> Iterator[list]:
    run = evaluate_isolated if isolate else evaluate
    if not stored and not known_pruned:  # a fresh run: its distinct op tables priced at once, before any fork
        price_op_tables(cfg for b in batches for _, cfg in b)
    if jobs == 1 or len(batches) == 1:
        for b in batches:
            yield run(b, stored, prune_memory, known_pruned, time_limit_s)
        return
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    if ctx.get_start_method() == "fork":
        run(batches[0][:1], frozenset(), False, None)  # JIT-compiled kernels and caches go to the forked workers
    with sigterm_as_exit():  # SIGTERM shuts the pool down through the finally below
        ex = ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_init_worker,
                                 initargs=(stored, known_pruned, os.getpid(), time_limit_s))
        try:
            futures = [ex.submit(_evaluate_in_worker, b, prune_memory, isolate) for b in batches]
            for f in as_completed(futures):
                yield f.result()
        except BaseException:  # SIGTERM, Ctrl-C, a failed batch or a consumer that stopped: no batch is awaited
            terminate_workers(ex)
            raise
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


def _run_dask(client, batches: list, stored: frozenset, known_pruned: dict, prune_memory: bool,
              isolate: bool = False) -> Iterator[list]:
    from dask.distributed import as_completed as dask_completed

    try:
        stored_f, pruned_f = client.scatter([stored, known_pruned], broadcast=True)
        futures = client.map(evaluate_isolated if isolate else evaluate, batches, stored_keys=stored_f,
                             prune_memory=prune_memory, known_pruned=pruned_f, pure=False)
        for f in dask_completed(futures):
            yield f.result()
    finally:
        client.close()


def run_configs(configs: list, *, store: ResultStore | None = None, study: str = "", jobs: int = 0,
                scheduler: str | None = None, prune_memory: bool = True, progress: bool = True,
                label: str = "evaluate", errors: str = "raise", time_limit_s: float = 0.0) -> RunReport:
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
    errors : str
        ``raise`` (a config whose evaluation raises stops the run with its exception) or ``row`` (it becomes a
        :class:`Failed` outcome; the others are evaluated).
    time_limit_s : float
        Wall-clock limit of each simulation in local runs (0 = none): one past it raises
        :class:`~flowsim.explore.time_limit.TimeLimitExceeded` (with ``errors="row"``: a failed row).

    Raises
    ------
    ConfigError
        ``jobs`` negative, ``errors`` not raise/row, a malformed or unreachable scheduler, or dask missing.
    """
    with _frozen_heap():  # the caller's objects (a tune's enumeration) are not walked by each collection
        return _run_configs(configs, store, study, jobs, scheduler, prune_memory, progress, label, errors,
                            time_limit_s)


def _run_configs(configs: list, store: ResultStore | None, study: str, jobs: int, scheduler: str | None,
                 prune_memory: bool, progress: bool, label: str, errors: str, time_limit_s: float) -> RunReport:
    if errors not in ("raise", "row"):
        raise ConfigError("errors", "must be raise or row", errors)
    if not isinstance(jobs, int) or jobs < 0:
        raise ConfigError("jobs", "must be a non-negative integer (0 = one per CPU)", jobs)
    start = time.perf_counter()
    jobs = jobs or os.cpu_count() or 1
    stored = store.keys() if store is not None else frozenset()
    known_pruned = store.memory_pruned() if store is not None else {}
    batches = _batches(list(configs), jobs)
    outcomes: list = [None] * len(configs)
    if scheduler:
        stream = _run_dask(connect_dask(scheduler), batches, stored, known_pruned, prune_memory, errors == "row")
    else:
        stream = _run_local(batches, stored, known_pruned, jobs, prune_memory, errors == "row", time_limit_s)
    bar = Progress(len(configs), label, progress)
    try:
        for result in stream:
            new = [(configs[o.index], o.point) for o in result if o.status == "evaluated"]
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
    counts = {s: sum(o.status == s for o in outcomes) for s in ("evaluated", "stored", "memory", "error")}
    return RunReport(outcomes=tuple(outcomes), evaluated=counts["evaluated"], reused=counts["stored"],
                     memory_pruned=counts["memory"], elapsed_s=time.perf_counter() - start,
                     failed=counts["error"])


def simulate_many(configs, jobs: int = 0, store=None, progress: bool = False,
                  time_limit_s: float = 0.0) -> "pd.DataFrame":
    """Simulate many configs in parallel; one row per config, errors as rows.

    Parameters
    ----------
    configs : iterable of SimConfig, mapping or path
        What :func:`flowsim.simulate` accepts, one per row.
    jobs : int
        Worker processes; 0 = one per CPU.
    store : ResultStore, str or Path, optional
        A results database (or its path): configs already there are read back, not recomputed, and new ones
        are written to it.
    progress : bool
        Draw a progress line on stderr.
    time_limit_s : float
        Wall-clock limit of each simulation, seconds (0 = none); one past it is an error row
        (``TimeLimitExceeded: ...``).

    Returns
    -------
    pandas.DataFrame
        Indexed by the config's position, flat columns with units in their names: ``model``, ``gpu``,
        ``num_gpus``, the layout (``tp``, ``pp``, ``vpp``, ``cp``, ``ep``, ``dp``, ``sp``, ``mbs``, ``recompute``,
        ``zero``, ``schedule``), ``step_time_s``, ``tokens_per_s``, ``mfu`` (fraction), ``memory_bytes_per_gpu``,
        ``memory_capacity_bytes``, ``fits_memory``, ``exposed_comm_share`` (fraction of the step), the critical
        stage's seconds per step (``compute_s``, ``tp_comm_s``, ..., ``optimizer_s``), ``key`` (the store key),
        and ``error`` (empty, or ``<type>: <message>`` for a config that could not be built or simulated; its
        figures are then NaN).

    Raises
    ------
    ConfigError
        ``jobs`` negative or ``store`` not a flowsim results database.
    """
    import pandas as pd

    from flowsim.config import SimConfig, build_config

    built: dict = {}
    rows: dict = {}
    for i, c in enumerate(configs):
        try:
            built[i] = c if isinstance(c, SimConfig) else build_config(c)
        except ConfigError as e:
            rows[i] = {"error": f"ConfigError: {e}"}
    own = isinstance(store, (str, os.PathLike))
    db = ResultStore(store) if own else store
    try:
        order = list(built)
        report = run_configs([built[i] for i in order], store=db, jobs=jobs, prune_memory=False, progress=progress,
                             time_limit_s=time_limit_s,
                             label="simulate", errors="row")
    finally:
        if own:
            db.close()
    for i, o in zip(order, report.outcomes):
        cfg = built[i]
        head = {"model": cfg.model.name, "gpu": cfg.cluster.gpu, "num_gpus": cfg.cluster.num_gpus}
        if o.status == "error":
            rows[i] = {**head, "key": o.key, "error": f"{o.error_type}: {o.error}"}
        else:
            rows[i] = {**head, **o.point.to_dict(), "error": ""}
    frame = pd.DataFrame([rows[i] for i in sorted(rows)], index=pd.Index(sorted(rows), name="config"))
    first = ["model", "gpu", "num_gpus"]
    return frame[first + [c for c in frame.columns if c not in first]]
