"""Rules of the parallel layout that every layer above the config reads: Megatron-LM's rank order (the size
and stride of each communicator) and which model chunks and micro-batches a pipeline schedule places where.

Pure Python: the pipeline simulator (:mod:`flowsim.step.schedule`, numba) builds on these rules, and the
config checks them without loading it.
"""
from __future__ import annotations

import numpy as np

from flowsim.errors import ConfigError

PIPELINE_SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "dualpipe")
"""Pipeline schedules flowsim simulates (:mod:`flowsim.step.schedule`), in the order of its integer ids."""


def group_spans(training) -> dict[str, tuple[int, int]]:
    """(ranks, stride between consecutive members' global ranks) of each communicator kind.

    Megatron-LM's rank order (``tp`` fastest, then ``cp``, ``dp``, ``pp``; a pipeline stage holds
    ``tp * cp * dp`` consecutive ranks). Expert layers follow Megatron-LM's expert rank generator (order
    ``tp-ep-dp-pp`` with the expert tensor-parallel size as ``tp``).

    Parameters
    ----------
    training : flowsim.config.TrainingConfig
        A resolved training config (``data_parallel_size`` filled in).

    Returns
    -------
    dict
        ``tp``, ``cp``, ``dp`` (the gradient-reduction group: data- and context-parallel ranks), ``dps`` and
        ``dpr`` (hybrid sharding: shard groups of ``dp_shard`` consecutive DP ranks, replicas across them),
        ``pp`` (a pair of neighbouring stages), ``etp``, ``ep``, ``edp`` (expert data parallel) and ``tpep``
        (the all-gather token dispatcher's group, Megatron-LM ``tp_ep_group``).
    """
    t = training
    etp, ep = t.expert_tensor_parallel_size, t.ep
    return {
        "tp": (t.tp, 1),
        "cp": (t.cp, t.tp),
        "dp": (t.dp * t.cp, t.tp),
        "dps": (t.dp_shard, t.tp),
        "dpr": (t.dp * t.cp // t.dp_shard, t.tp * t.dp_shard),
        "pp": (2, t.tp * t.cp * t.dp),
        "etp": (etp, 1),
        "ep": (ep, etp),
        "edp": (t.tp * t.cp * t.dp // (ep * etp), ep * etp),
        "tpep": (etp * ep, 1),
    }


def chunks_per_stage(schedule: str, vpp: int) -> int:
    """Model chunks each pipeline stage holds: 2 for DualPipe (one per direction), else ``vpp``."""
    return 2 if schedule == "dualpipe" else vpp


def microbatches_per_chunk(schedule: str, m: int, v: int) -> np.ndarray:
    """int64[v]: micro-batches that pass through each model chunk of a stage in one step.

    DualPipe sends half of the ``m`` micro-batches each way, each through one chunk; the other schedules
    send every micro-batch through every chunk.
    """
    return np.full(v, m // 2 if schedule == "dualpipe" else m, dtype=np.int64)


def end_chunks(schedule: str, p: int, v: int) -> tuple[tuple, tuple]:
    """((stage, chunk) of each path's first virtual stage, ... of each path's last): where the embedding
    and the LM head / loss run. DualPipe's two paths start at opposite ends."""
    if schedule == "dualpipe":
        return ((0, 0), (p - 1, 1)), ((p - 1, 0), (0, 1))
    return ((0, 0),), ((p - 1, v - 1),)


def check_layout(schedule: str, p: int, v: int, m: int) -> None:
    """Raise ConfigError when ``schedule`` cannot run ``m`` micro-batches on ``p`` stages of ``v`` chunks.

    DualPipe needs an even ``p``, two chunks and an even ``m >= 2p`` (``DualPipe.step`` asserts
    ``num_ranks % 2 == 0`` and ``num_chunks % 2 == 0 and num_chunks >= num_ranks * 2``).
    """
    if schedule not in PIPELINE_SCHEDULES:
        raise ConfigError("pipeline_schedule", f"must be one of {', '.join(PIPELINE_SCHEDULES)}", schedule)
    if schedule == "dualpipe":
        if p % 2 or v != 2:
            raise ConfigError("pipeline_schedule", "dualpipe runs two chunks on an even number of stages",
                              f"pp={p}, chunks={v}")
        if m % 2 or m < 2 * p:
            raise ConfigError("global_batch_size", "dualpipe needs an even number of micro-batches, at least "
                              "2 * pipeline_model_parallel_size", f"{m} micro-batches, pp={p}")
    elif schedule != "interleaved" and v != 1:
        raise ConfigError("pipeline_schedule", f"{schedule} runs one model chunk per stage", f"vpp={v}")
