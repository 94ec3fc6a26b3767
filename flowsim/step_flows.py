"""Flow-level pricing of a step's collectives: every group that communicates at once shares the fabric.

With ``comm_engine: flow`` the data-parallel, expert, context-parallel and pipeline collectives of a step are
run as NCCL plans on the cluster topology (:func:`flowsim.collective_flows.run_collective`), with all the
groups of that kind in one pipeline stage in one simulation, as rank symmetry prescribes (DESIGN.md): the
DP groups of every TP/CP rank reduce together, the EP groups of a stage exchange tokens together, every
GPU of a stage sends to the next stage together. So several groups behind one NIC, a rail shared by
several groups or an oversubscribed spine slow them as they would on the real fabric. Tensor-parallel
groups stay inside a scale-up domain and keep the analytic price. Collectives of different kinds that
overlap in time (a stage's DP reduction beside another stage's PP sends) are still priced separately.
"""
from __future__ import annotations

import functools

from flowsim.collective_flows import run_collective
from flowsim.config import SimConfig

FLOW_GROUPS = ("dp", "edp", "ep", "cp", "pp")
"""Groups priced on the flow engine; ``tp`` and ``etp`` stay analytic (inside one scale-up domain)."""


def stage_groups(cfg: SimConfig, group: str) -> list[list[int]]:
    """Global GPU ids of every ``group`` of the first pipeline stage (pairs with the second for ``pp``).

    Ranks follow Megatron-LM's order (``tp`` fastest, then ``cp``, ``dp``, ``pp``; experts ``etp``, ``ep``,
    expert-``dp``); a stage holds ``tp * cp * dp`` consecutive ranks.
    """
    t = cfg.training
    tp, cp, dp, ep, etp = t.tp, t.cp, t.dp, t.ep, t.expert_tensor_parallel_size
    stage = tp * cp * dp
    if group == "dp":
        return [[i + k * tp for k in range(dp * cp)] for i in range(tp)]
    if group == "cp":
        return [[d * tp * cp + i + k * tp for k in range(cp)] for d in range(dp) for i in range(tp)]
    if group == "ep":
        return [[b * ep * etp + i + k * etp for k in range(ep)] for b in range(stage // (ep * etp))
                for i in range(etp)]
    if group == "edp":
        return [[i + k * ep * etp for k in range(stage // (ep * etp))] for i in range(ep * etp)]
    if group == "pp":
        return [[i, i + stage] for i in range(stage)]
    raise ValueError(f"group {group!r} is not priced on the flow engine")


@functools.lru_cache(maxsize=4096)
def _flow(cfg: SimConfig, gpu, group: str, op: str, size_bytes: float):
    groups = stage_groups(cfg, group)
    return run_collective(cfg.cluster, gpu, op, size_bytes, groups[0], concurrent_groups=groups[1:])


def flow_time_s(cfg: SimConfig, gpu, group: str, op: str, size_bytes: float) -> float:
    """Seconds of one ``op`` of ``size_bytes`` when every ``group`` of a stage runs it at once (the slowest)."""
    return _flow(cfg, gpu, group, op, float(size_bytes)).time_s
