"""NCCL algorithms, protocols and selection (NCCL's cost model, releases 2.18-2.30; default 2.30.7), in ranks only.

Public API::

    from flowsim.nccl_models import CommLayout, predict, cost_table

    layout = CommLayout(n_ranks=8, n_nodes=1, compute_capability=90, scaleup_Bps=450e9,
                        scaleup_links=18, nvls=True)
    est = predict("allreduce", 64 * 2**20, layout)      # CollectiveEstimate
    table = cost_table("allreduce", 64 * 2**20, layout)  # every algo/proto, NCCL TUNING-style

    est, plan = plan_collective("allreduce", 64 * 2**20, layout)  # the flow engine's front door: Plan

Depends only on numpy (pandas for :func:`cost_table`'s DataFrame) and flowsim.units / flowsim.errors; see
docs/NCCL.md.
"""
from flowsim.nccl_models.constants import ALGO_NAMES, PROTO_NAMES, Algo, Coll, Hw, Proto
from flowsim.nccl_models.env import NcclEnv
from flowsim.nccl_models.estimate import OPS, P2P_OPS, CollectiveEstimate, busbw_factor, cost_table, predict
from flowsim.nccl_models.execution import NET_BW_EFFICIENCY
from flowsim.nccl_models.layout import CommLayout
from flowsim.nccl_models.overrides import parse_override
from flowsim.nccl_models.plans import DEFAULT_MAX_TRANSFERS, Plan, build_plan, plan_collective
from flowsim.nccl_models.switch_plans import NET_SWITCH, SWITCH
from flowsim.nccl_models.versions import DEFAULT_NCCL_VERSION

__all__ = ["ALGO_NAMES", "DEFAULT_MAX_TRANSFERS", "DEFAULT_NCCL_VERSION", "NET_BW_EFFICIENCY", "NET_SWITCH", "OPS",
           "P2P_OPS", "PROTO_NAMES", "SWITCH", "Algo", "Coll", "CollectiveEstimate", "CommLayout", "Hw", "NcclEnv",
           "Plan", "Proto", "build_plan", "busbw_factor", "cost_table", "parse_override", "plan_collective",
           "predict"]
