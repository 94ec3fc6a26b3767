"""The plan front door of flowsim.nccl_models (issue 14): what the flow engine may use, and what it gets."""
import ast
from pathlib import Path

import numpy as np
import pytest

import flowsim.nccl_models as nm
from flowsim.errors import ConfigError
from flowsim.nccl_models import Algo, CommLayout, Proto, build_plan, plan_collective

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, []


def test_nccl_models_imports_only_units_errors_and_itself():
    allowed = ("flowsim.nccl_models", "flowsim.units", "flowsim.errors", "flowsim._moved")
    for path in sorted((ROOT / "nccl_models").glob("*.py")):
        for module, _ in _imports(path):
            if module.startswith("flowsim"):
                assert module.startswith(allowed), f"{path.name} imports {module}"
            else:
                assert module.split(".")[0] in ("__future__", "dataclasses", "enum", "functools", "math", "re",
                                                "numpy", "pandas", "typing"), f"{path.name} imports {module}"


def test_collective_flows_uses_the_front_door_only():
    for module, names in _imports(ROOT / "flowsim" / "network" / "collective_flows.py"):
        assert not module.startswith("flowsim.nccl_models."), f"submodule import {module}"
        assert not module.startswith("flowsim.validation"), module
        if module == "flowsim.nccl_models":
            assert set(names) <= set(nm.__all__)


def test_plan_carries_enums_and_kernel_rates():
    layout = CommLayout(n_ranks=8, n_nodes=1, compute_capability=90, scaleup_Bps=450e9, scaleup_links=18)
    est, plan = plan_collective("allreduce", 256 * 2**20, layout, algo="ring")
    assert (plan.algo, plan.proto) == (Algo.RING, Proto.SIMPLE)
    assert (plan.algo_name, plan.proto_name) == (est.algo, est.proto) == ("Ring", "Simple")
    # alone, every rank moves its wire bytes in NCCL's bandwidth time: sent / kernel rate = size / algbw
    model_algbw = nm.predict("allreduce", 256 * 2**20, layout, algo="ring").algbw_Bps
    t = plan.sent_bytes() * plan.wire_factor / plan.kernel_Bps
    assert np.allclose(t, t[0])
    assert t[0] < 256 * 2**20 / model_algbw  # the analytic time also holds latency and fill
    same = build_plan("allreduce", 256 * 2**20, layout, Algo.RING, Proto.SIMPLE)
    assert np.array_equal(same.kernel_Bps, plan.kernel_Bps)


def test_point_to_point_plan_has_no_algorithm():
    layout = CommLayout(n_ranks=4, n_nodes=1, compute_capability=90, scaleup_Bps=450e9, scaleup_links=18)
    est, plan = plan_collective("alltoall", 2**20, layout)
    assert plan.algo is None and plan.algo_name == est.algo == "P2P"
    assert plan.kernel_Bps.shape == (4,) and np.all(plan.kernel_Bps > 0)


def test_single_rank_has_no_plan():
    layout = CommLayout(n_ranks=1, n_nodes=1, compute_capability=90, scaleup_Bps=450e9, scaleup_links=18)
    est, plan = plan_collective("allreduce", 2**20, layout)
    assert plan is None and est.time_s == 0.0


def test_planned_override_rejects_collnet_only():
    layout = CommLayout(n_ranks=16, n_nodes=2, compute_capability=90, scaleup_Bps=450e9, scaleup_links=18,
                        nics_per_node=8, nic_Bps=50e9)
    with pytest.raises(ConfigError, match="algo"):
        plan_collective("allreduce", 2**20, layout, algo="collnetdirect")


def test_moved_names_warn_and_resolve():
    import warnings

    import flowsim.network.collective_flows as cf
    import flowsim.nccl_models.plans as plans
    from flowsim.nccl_models.rank_orders import btree_parent
    from flowsim.validation.nccl_flows import flow_comparison
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cf.flow_comparison is flow_comparison and plans.btree_parent is btree_parent
    assert [w.category for w in caught] == [DeprecationWarning, DeprecationWarning]
