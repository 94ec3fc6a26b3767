"""NCCL algorithms, protocols and selection (NCCL's cost model, releases 2.18-2.30; default 2.30.7), in ranks only.

Public API::

    from flowsim.nccl_models import CommLayout, predict, cost_table

    layout = CommLayout(n_ranks=8, n_nodes=1, compute_capability=90, scaleup_Bps=450e9,
                        scaleup_links=18, nvls=True)
    est = predict("allreduce", 64 * 2**20, layout)      # CollectiveEstimate
    table = cost_table("allreduce", 64 * 2**20, layout)  # every algo/proto, NCCL TUNING-style

Depends only on numpy/pandas and flowsim.units / flowsim.errors; see docs/NCCL.md.
"""
from flowsim.nccl_models.constants import Algo, Coll, Hw, Proto
from flowsim.nccl_models.estimate import OPS, P2P_OPS, CollectiveEstimate, busbw_factor, cost_table, predict
from flowsim.nccl_models.layout import CommLayout
from flowsim.nccl_models.overrides import parse_override

__all__ = ["OPS", "P2P_OPS", "Algo", "Coll", "CollectiveEstimate", "CommLayout", "Hw", "Proto", "busbw_factor",
           "cost_table", "parse_override", "predict"]
