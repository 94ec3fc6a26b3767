"""Predict the step time of many runs-CSV rows, in this process or on a pool of worker processes.

A row's whole path (row -> config -> simulation -> invariant check) runs where the row is predicted, so with
``jobs`` workers the parent only reads the file, hands out chunks of rows and collects one small
:class:`Prediction` per row: nothing it does grows with the cost of a simulation. Rows whose cells (all but
``id`` and ``measured_step_time_s``) are identical are predicted once; in each process, rows that map to the
same config (:func:`flowsim.explore.point.config_key`) are simulated once. Rows that differ only in their
:data:`CLUSTER_COLUMNS` are handed to the same worker, so that their shared workload is built once. The workers'
warnings are passed to the parent, whose filters print each once.
"""
from __future__ import annotations

import math
import multiprocessing
import operator
import os
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Callable

from flowsim.errors import ConfigError
from flowsim.validation.runs_mapping import config_of_row

MAX_CHUNK = 64
"""Rows per task handed to a worker: ~1 s of simulation, so the progress line and the load balance stay
fine-grained while the per-task cost (pickling 64 rows and their predictions, ~1 ms) stays negligible."""


@dataclass(frozen=True)
class Prediction:
    """What flowsim predicts for one row, or why it does not (``reason`` set, the other fields empty).

    Attributes
    ----------
    reason : str or None
        One line when the row is skipped (a field the mapping or build_config rejects, a simulation past the
        time limit, a result that breaks an invariant); None when it was simulated.
    step_time_s : float
        Predicted seconds per optimizer step.
    fits_memory : bool
        Whether flowsim's memory estimate fits the GPU.
    num_gpus, tp, pp, dp, cp : int
        Cluster size and parallel layout as simulated.
    family : str
        Layout family (``dense``, ``dense-fsdp`` or ``moe``; see :class:`~flowsim.validation.runs.RunComparison`).
    assumptions : tuple[str, ...]
        The row's assumptions (:func:`~flowsim.validation.runs_mapping.config_of_row`).
    memory_allocated_bytes : float
        flowsim's peak bytes handed out by PyTorch's caching allocator on the most loaded GPU
        (:attr:`flowsim.step.memory.StageMemory.allocated_bytes`); NaN when ``simulate`` is a stand-in.
    """

    reason: str | None
    step_time_s: float = math.nan
    fits_memory: bool = False
    num_gpus: int = 0
    tp: int = 0
    pp: int = 0
    dp: int = 0
    cp: int = 0
    family: str = ""
    assumptions: tuple = ()
    memory_allocated_bytes: float = math.nan


class RowPredictor:
    """Predicts rows one by one with ``simulate``, keeping each distinct config's outcome (one simulation each).

    Parameters
    ----------
    simulate : callable
        ``simulate(SimConfig)`` -> anything with ``step_time_s`` and ``fits_memory``.
    calibration : str
        Calibration profile applied to every row (empty = none).
    time_limit_s : float
        Wall-clock limit of one simulation, seconds (0 = none).
    """

    def __init__(self, simulate: Callable, calibration: str = "", time_limit_s: float = 0.0):
        self.simulate, self.calibration, self.time_limit_s = simulate, calibration, time_limit_s
        self._outcomes: dict = {}  # config key -> (step_time_s, fits_memory, allocated bytes) or skip reason

    def predict(self, row: dict) -> Prediction:
        """The :class:`Prediction` of one row of :func:`~flowsim.validation.runs_read.read_run_records`."""
        from flowsim.explore.point import config_key

        cfg, assumptions, reason = config_of_row(row, self.calibration)
        if reason is not None:
            return Prediction(reason)
        key = config_key(cfg)
        if key not in self._outcomes:
            self._outcomes[key] = self._simulate(cfg)
        outcome = self._outcomes[key]
        if isinstance(outcome, str):
            return Prediction(outcome)
        t = cfg.training
        family = "moe" if cfg.model.is_moe else ("dense-fsdp" if t.zero_stage >= 2 else "dense")
        return Prediction(None, outcome[0], outcome[1], cfg.cluster.num_gpus, t.tp, t.pp, t.dp, t.cp, family,
                          assumptions, outcome[2])

    def _simulate(self, cfg):
        """``(step_time_s, fits_memory, allocated bytes)`` of ``cfg``, or the one-line reason it has none: flowsim's
        own errors give their message; any other exception its type and message (the row is listed, the
        file goes on)."""
        from flowsim.explore.time_limit import TimeLimitExceeded, time_limit
        from flowsim.step.invariants import InvariantError, check_result
        from flowsim.step.result import Result
        from flowsim.step.simulate import simulate

        try:
            with time_limit(self.time_limit_s):
                result = self.simulate(cfg)
            allocated = math.nan
            if isinstance(result, Result):
                if self.simulate is not simulate:  # flowsim's own simulate checks every result it returns
                    check_result(result)
                from flowsim.model.workload import build_workload
                from flowsim.step.simulate import stage_memories

                allocated = max(m.allocated_bytes for m in stage_memories(cfg, build_workload(cfg)))
            return float(result.step_time_s), bool(result.fits_memory), allocated
        except (ConfigError, TimeLimitExceeded, InvariantError) as e:
            return str(e)
        except Exception as e:  # noqa: BLE001 -- reported as the row's reason, with its type
            return f"{type(e).__name__}: {e}"


CLUSTER_COLUMNS = ("gpu", "num_gpus", "gpus_per_node", "nic_gbps_per_gpu", "power_limit_w")
"""Cells that set only the cluster: rows that differ in nothing else share their workload
(:func:`flowsim.model.workload.build_workload` keeps one per model and training config)."""


def _signatures(rows: list, skip: tuple = ()) -> list:
    """Per row, the cells its prediction depends on (all but ``line``, ``id``, the measurement and ``skip``; NaN
    as None, so that two empty cells compare equal). The rows share their keys, as those of
    :func:`~flowsim.validation.runs_read.read_run_records` do."""
    if not rows:
        return []
    cells = operator.itemgetter(*(k for k in rows[0] if k not in ("line", "id", "measured_step_time_s", *skip)))
    return [tuple(v if v == v else None for v in cells(row)) for row in rows]  # v != v: NaN


_WORKER: list = []  # the worker process's RowPredictor (set by _init_worker)


def _init_worker(predictor: RowPredictor, parent_pid: int) -> None:
    from flowsim.explore.lifetime import bind_to_parent

    bind_to_parent(parent_pid)  # the worker ends with validate, even one killed with SIGKILL
    _WORKER[:] = [predictor]


def _predict_chunk(rows: list) -> tuple[list, list]:
    """Predictions of ``rows`` and the distinct warnings they raised (for the parent to issue: its filters
    print each once per command, where two workers would print it twice)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        predictions = [_WORKER[0].predict(row) for row in rows]
    return predictions, list({(str(w.message), w.category): None for w in caught})


def predict_rows(rows: list, predictor: RowPredictor, jobs: int = 1, progress: bool = False) -> list:
    """The :class:`Prediction` of each row, in order.

    Parameters
    ----------
    rows : list of dict
        Rows of :func:`~flowsim.validation.runs_read.read_run_records`.
    predictor : RowPredictor
        Predicts one row; the workers get a copy of it.
    jobs : int
        Worker processes (0 = one per CPU); 1 predicts every row in this process.
    progress : bool
        Draw a progress line on stderr (distinct rows predicted).
    """
    from flowsim.explore.runner import Progress

    signatures = _signatures(rows)
    first: dict = {}
    for i, sig in enumerate(signatures):
        first.setdefault(sig, i)
    distinct = list(first.values())
    done: dict = {}
    bar = Progress(len(distinct), "validate", progress, unit="run")
    try:
        jobs = jobs or os.cpu_count() or 1
        local = distinct if jobs == 1 else distinct[:1]  # the first in this process warms the caches the workers fork
        for i in local:
            done[i] = predictor.predict(rows[i])
            bar.advance(1)
        rest = distinct[len(local):]
        if rest:  # rows that share a workload go to one worker, which builds it once
            groups: dict = {}
            for i, sig in zip(rest, _signatures([rows[i] for i in rest], CLUSTER_COLUMNS)):
                groups.setdefault(sig, []).append(i)
            rest = [i for group in groups.values() for i in group]
            for indices, (predictions, caught) in _on_pool(rows, rest, predictor, jobs):
                done.update(zip(indices, predictions))
                for message, category in caught:
                    warnings.warn(message, category, stacklevel=1)
                bar.advance(len(indices))
    finally:
        bar.close()
    return [done[first[sig]] for sig in signatures]


def _on_pool(rows: list, indices: list, predictor: RowPredictor, jobs: int):
    """Yield ``(indices, (predictions, warnings))`` of chunks of ``rows[indices]`` as ``jobs`` worker processes
    finish them."""
    from flowsim.explore.lifetime import sigterm_as_exit, terminate_workers

    size = max(1, min(MAX_CHUNK, len(indices) // (8 * jobs)))
    chunks = [indices[i:i + size] for i in range(0, len(indices), size)]
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with sigterm_as_exit():  # SIGTERM shuts the pool down through the finally below
        ex = ProcessPoolExecutor(max_workers=min(jobs, len(chunks)), mp_context=ctx, initializer=_init_worker,
                                 initargs=(predictor, os.getpid()))
        try:
            futures = {ex.submit(_predict_chunk, [rows[i] for i in chunk]): chunk for chunk in chunks}
            for f in as_completed(futures):
                yield futures[f], f.result()
        except BaseException:  # SIGTERM, Ctrl-C or a failed chunk: no chunk is awaited
            terminate_workers(ex)
            raise
        finally:
            ex.shutdown(wait=True, cancel_futures=True)
