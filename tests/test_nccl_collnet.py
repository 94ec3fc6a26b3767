"""IB SHARP through NCCL's CollNet: availability, NCCL's cost formulas, selection, the SHARP measurement."""
from dataclasses import replace

import pytest

from flowsim.errors import ConfigError
from flowsim.nccl_models import Algo, Coll, CommLayout, Proto, predict
from flowsim.nccl_models.tuning import cost_model
from flowsim.validation.nccl_tests import compare_nccl_tests, read_nccl_tests

# 8 x HGX H100 (18 NVLink4 links, 450 GB/s), 8 x 400 Gb/s NICs per node (NVIDIA DGX H100 datasheet)
H100_8N = CommLayout(64, 8, compute_capability=90, scaleup_Bps=450e9, scaleup_links=18, nvls=True,
                     nics_per_node=8, nic_Bps=50e9)
# 8 x HGX A100 (12 NVLink3 links, 300 GB/s), 8 x 200 Gb/s NICs (NVIDIA DGX A100 datasheet)
A100_8N = CommLayout(64, 8, compute_capability=80, scaleup_Bps=300e9, scaleup_links=12, pcie_Bps=32e9,
                     nics_per_node=8, nic_Bps=25e9)


def test_collnet_needs_the_plugin_simple_and_several_nodes():
    off = cost_model(Coll.ALLREDUCE, H100_8N)
    assert "NCCL_COLLNET_ENABLE=1" in off.reason[Algo.COLLNET_CHAIN][Proto.SIMPLE]
    assert "multi-node NVLS needs CollNet" in off.reason[Algo.NVLS][Proto.SIMPLE]
    on = cost_model(Coll.ALLREDUCE, replace(H100_8N, collnet=True))
    assert on.reason[Algo.COLLNET_CHAIN][Proto.SIMPLE] is None and on.reason[Algo.NVLS][Proto.SIMPLE] is None
    assert on.reason[Algo.COLLNET_CHAIN][Proto.LL] == "CollNet runs the Simple protocol only"
    one_node = CommLayout(8, 1, compute_capability=90, scaleup_Bps=450e9, scaleup_links=18, collnet=True)
    assert cost_model(Coll.ALLREDUCE, one_node).reason[Algo.COLLNET_DIRECT][Proto.SIMPLE] == \
        "CollNet needs several nodes"


def test_collnet_bandwidth_and_latency_follow_tuning_cc():
    m = cost_model(Coll.ALLREDUCE, replace(H100_8N, collnet=True))
    tree = m.graphs.tree  # 16 channels, bwIntra 25 GB/s on H100 x 8 nodes (graph.py: 8 x 50 doubled)
    assert (tree.n_channels, tree.bw_intra_Bps) == (16, 25e9)
    # Chain: nChannels x bwIntra x 0.5; Direct: one channel per NIC (8) with the same total, / (ppn/nCh -
    # (ppn/nCh - 1)/2) = 1 (8 GPUs, 8 NICs), x 0.85 on SM90
    assert m.algbw_Bps[Algo.COLLNET_CHAIN, Proto.SIMPLE] == pytest.approx(16 * 25e9 * 0.5)
    assert m.algbw_Bps[Algo.COLLNET_DIRECT, Proto.SIMPLE] == pytest.approx(16 * 25e9 * 0.5 * 0.85)
    four_nics = cost_model(Coll.ALLREDUCE, replace(H100_8N, collnet=True, nics_per_node=4))
    factor = 8 / 4 - (8 / 4 - 1) / 2  # "requires all GPUs to have a local NIC to work at full speed"
    assert four_nics.algbw_Bps[Algo.COLLNET_DIRECT, Proto.SIMPLE] == pytest.approx(
        four_nics.graphs.tree.n_channels * four_nics.graphs.tree.bw_intra_Bps * 0.5 * 0.85 / factor)
    # latency: Chain 2 (ppn-1) NVLink hops (2.8 us) + one NET hop (30 us); Direct 2 (3.7 + 7 x 0.4) + 31 us
    assert m.latency_s[Algo.COLLNET_CHAIN, Proto.SIMPLE] == pytest.approx((2 * 7 * 2.8 + 30) * 1e-6)
    assert m.latency_s[Algo.COLLNET_DIRECT, Proto.SIMPLE] == pytest.approx((2 * (3.7 + 7 * 0.4) + 31) * 1e-6)


def test_selection_switches_to_collnet_when_enabled_and_large():
    size = 8 * 2**30
    assert predict("allreduce", size, A100_8N).algo == "Ring"
    on = predict("allreduce", size, replace(A100_8N, collnet=True))
    assert on.algo.startswith("CollNet") and on.time_s < predict("allreduce", size, A100_8N).time_s
    # with NVLink SHARP too, multi-node NVLS (NVLS + IB SHARP) is in the running
    assert predict("allreduce", size, replace(H100_8N, collnet=True)).algo in ("NVLS", "CollNetChain")


def test_sharp_measurement_within_target(shared_data):
    log = read_nccl_tests(shared_data / "nccl-tests" / "h100_64gpu_8node_allreduce_sharp_collnetchain_coreweave.txt")
    cmp = compare_nccl_tests(log, replace(H100_8N, nccl_version=log.nccl_version or "2.30.7"))
    assert set(cmp.rows["algo"]) == {"CollNetChain"}  # the log's NCCL_ALGO=COLLNETCHAIN, COLLNET_ENABLE=1
    assert cmp.summary.median_abs_error_large <= 0.03


# --- CollNet plans: the reduction is resident in the network (NET_SWITCH) --------------------------------------

def _plan(algo):
    from flowsim.nccl_models import NET_SWITCH, build_plan
    layout = replace(H100_8N, collnet=True)
    return NET_SWITCH, build_plan("allreduce", 2**30, layout, algo, "Simple")


@pytest.mark.parametrize("algo", ["CollNetChain", "CollNetDirect"])
def test_collnet_plan_sends_each_node_s_once_to_the_switch(algo):
    import numpy as np
    ns, plan = _plan(algo)
    S, ppn = 2**30, 8
    node_of = lambda r: r // ppn  # noqa: E731
    to_switch = np.bincount(node_of(plan.src[plan.dst == ns]), weights=plan.payload_bytes[plan.dst == ns])
    from_switch = np.bincount(node_of(plan.dst[plan.src == ns]), weights=plan.payload_bytes[plan.src == ns])
    assert to_switch == pytest.approx(np.full(8, S)) and from_switch == pytest.approx(np.full(8, S))
    # every GPU sends S once on the way up (to its chain parent / the heads, or to the switch): the transfers
    # listed before the first one out of the switch
    up = np.arange(plan.n_transfers) < np.flatnonzero(plan.src == ns)[0]
    sent_up = np.bincount(plan.src[up], weights=plan.payload_bytes[up], minlength=64)
    assert sent_up == pytest.approx(np.full(64, S))
    assert plan.algo_name == algo and plan.n_transfers > 0 and (plan.kernel_Bps > 0).all()


def test_flow_engine_runs_sharp_in_the_network(shared_data):
    from flowsim.config.cluster import ClusterConfig
    from flowsim.config.loader import load_preset
    from flowsim.gpu_specs import get_gpu
    from flowsim.network.collective_flows import run_collective
    cluster = ClusterConfig(**{**load_preset("clusters", "dgx-h100"), "num_gpus": 64})
    ranks = list(range(64))
    r = run_collective(cluster, get_gpu("h100-sxm"), "allreduce", 8 * 2**30, ranks, algo="collnetchain",
                       collnet=True)
    assert r.algo == "CollNetChain"
    assert r.busbw_Bps == pytest.approx(384.5e9, rel=0.05)  # measured 384.5 GB/s at 8 GiB (CoreWeave, SHARP)
    tiers = {u["tier"]: u for u in r.link_utilization}
    assert tiers["NIC -> leaf"]["links"] == 64  # one head per NIC rail on every node
    with pytest.raises(ConfigError, match="CollNet needs IB SHARP"):
        run_collective(cluster, get_gpu("h100-sxm"), "allreduce", 2**30, ranks, algo="collnetchain")
