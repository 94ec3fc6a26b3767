"""Benchmark launch setup: how many GPUs one host thread drives, and the time floor that sets per iteration.

nccl-tests can drive several GPUs from one thread (``all_reduce_perf -g N``, banner "nThread 1 nGpus N",
"single process"): every iteration that thread enqueues one collective per GPU (``ncclGroupStart``, N calls,
``ncclGroupEnd``, which launches the N kernels one after the other). Iterations run back to back without a
synchronisation (nccl-tests ``BenchTime``: ``iters`` calls to ``startColl``, then one ``completeColl``), so
the host enqueue (``H = g x HOST_LAUNCH_S`` for ``g`` GPUs per thread) and the collective on the GPUs (``d``,
the model's time) form a two-stage pipeline. A collective cannot finish before its last GPU's kernel is
launched, and iteration ``k`` cannot start before ``k - 1`` finished, so iteration ``k`` ends at
``max(end of k - 1, k-th enqueue done) + d``: the steady-state period is ``max(H, d)``, and the mean over
``iters`` iterations ``max(H, d) + min(H, d) / iters``. The second term is at most ``H / iters`` (5 % with
nccl-tests' 20 iterations) and on the flat floor rows (``d << H``) is part of what the calibration of
``HOST_LAUNCH_S`` measures; the benchmark time is therefore

    ``time = max(model time, g x HOST_LAUNCH_S)``  for ``g > 1``; the model time for ``g = 1``.

Checked against smoother combinations on the single-process logs (docs/NCCL.md, "Launch setup"): the
pipeline mean with the ``min / iters`` term, ``(d^p + H^p)^(1/p)`` for p = 8, 4, 2 and ``d + H`` give
equal or larger small-size errors; NVLS, whose model time sits at the floor, separates them most.

With one process per GPU (``g = 1``, the default, what training jobs run) there is no floor: one launch
(4.6 us) is below every predicted time of a collective of >= 2 ranks (>= 7.2 us: Ring/LL base latency 6.6
us plus one NVLink hop of 0.6 us, 2 ranks), so the host always runs ahead and the model time stands.
:func:`flowsim.simulate` never applies this module.
"""
from __future__ import annotations

import dataclasses

from flowsim.errors import ConfigError

HOST_LAUNCH_S = 4.57e-6
"""Host time to enqueue one GPU's collective in a single-thread multi-GPU benchmark, seconds.
Calibrated on ONE file, a100_8gpu_allreduce_sxm4_80gb_g8.txt (``all_reduce_perf -g 8``, single process, NCCL
2.19.3; its header documents the floor): median measured time of the flat rows, 8 B to 64 KiB (34.84-37.48
us, 14 rows; the model gives 15.0-16.4 us there), 36.58 us, divided by the 8 GPUs the thread drives: 4.57 us.
Leave-one-out (the same statistic on each other single-process file alone): H100 Ring AllReduce 4.55,
AllGather 4.35, ReduceScatter 4.37, NVLS 4.43 (together, NCCL 2.26.2), H200 NVLS (Azure) 3.85 us; the
errors each gives on the others are in docs/NCCL.md. A host-CPU property (the H200 host, a Xeon 8480C, is the
fastest; the other logs do not name theirs), one constant for all, not per file."""

_GPUS_RULE = "must be an integer >= 1"


def check_gpus_per_process(value, ranks_per_node: int) -> int:
    """Validate a GPUs-per-process count against the communicator.

    Parameters
    ----------
    value : int or str
        GPUs one host thread/process drives (an integer, or its decimal text as the CLI passes it).
    ranks_per_node : int
        Ranks of the communicator on one node: a process drives GPUs of its own host only.

    Returns
    -------
    int
        The count, ``1 <= count <= ranks_per_node``.

    Raises
    ------
    ConfigError
        ``gpus_per_process``: not an integer >= 1, or more than ``ranks_per_node``.
    """
    if isinstance(value, str) and value.strip().isdigit():
        count = int(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        count = value
    else:
        raise ConfigError("gpus_per_process", _GPUS_RULE, value)
    if count < 1:
        raise ConfigError("gpus_per_process", _GPUS_RULE, value)
    if count > ranks_per_node:
        raise ConfigError("gpus_per_process", f"must not exceed the communicator's {ranks_per_node} GPU(s) per node "
                                              "(a process drives GPUs of its own host)", value)
    return count


def launch_floor_s(gpus_per_process: int) -> float:
    """Shortest benchmark iteration with ``gpus_per_process`` GPUs per host thread, seconds.

    ``gpus_per_process x HOST_LAUNCH_S`` when more than one GPU shares the thread, else 0 (module docstring).
    """
    return gpus_per_process * HOST_LAUNCH_S if gpus_per_process > 1 else 0.0


def with_launch_floor(result, gpus_per_process: int):
    """A predicted collective as the benchmark measures it with ``gpus_per_process`` GPUs per host thread.

    Parameters
    ----------
    result : CollectiveEstimate or FlowCollectiveResult
        A prediction (a frozen dataclass with ``time_s`` in seconds and ``algbw_Bps``, ``busbw_Bps`` in
        bytes/s; ``runner_up_time_s``, when present, is floored too).
    gpus_per_process : int
        GPUs one host thread drives (:func:`check_gpus_per_process`).

    Returns
    -------
    The same type, with ``time = max(time, launch floor)`` and the bandwidths scaled to it; ``result``
    itself when the floor does not bind.
    """
    floor = launch_floor_s(gpus_per_process)
    if result.time_s >= floor:
        return result
    slower = result.time_s / floor
    changes = {"time_s": floor, "algbw_Bps": result.algbw_Bps * slower, "busbw_Bps": result.busbw_Bps * slower}
    if getattr(result, "runner_up_time_s", None) is not None:
        changes["runner_up_time_s"] = max(result.runner_up_time_s, floor)
    return dataclasses.replace(result, **changes)
