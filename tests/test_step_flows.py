"""The step on the flow engine sees contention the per-communicator analytic model cannot."""
import pytest

import flowsim
from flowsim.network.collective_flows import run_collective
from flowsim.config import build_config
from flowsim.gpu_specs import get_gpu
from flowsim.step.flows import flow_time_s, stage_groups

LLAMA = dict(model="llama3-8b", cluster="dgx-h100", seq=4096)


def test_stage_groups_follow_megatron_rank_order():
    cfg = build_config(**LLAMA, gpus=32, tp=2, cp=2, pp=2, gbs=16)  # dp = 4
    assert stage_groups(cfg, "dp")[:2] == [[0, 2, 4, 6, 8, 10, 12, 14], [1, 3, 5, 7, 9, 11, 13, 15]]
    assert stage_groups(cfg, "cp")[0] == [0, 2] and len(stage_groups(cfg, "cp")) == 8
    assert stage_groups(cfg, "pp")[3] == [3, 19]
    # another stage: the same groups shifted by its 16 GPUs; the last stage's pairs wrap to the first
    assert stage_groups(cfg, "dp", 1)[0] == [16, 18, 20, 22, 24, 26, 28, 30]
    assert stage_groups(cfg, "pp", 1)[3] == [19, 3]


def test_two_dp_groups_behind_one_nic_take_twice_as_long():
    # one NIC per node: with tp=2 the two DP groups of a node share it; the analytic model prices each alone
    base = dict(**LLAMA, gpus=16, nics_per_node=1, gbs=16)
    size = 512e6
    one = build_config(**base, tp=1)      # one DP group of 16 ranks, 8 per node
    two = build_config(**base, tp=2)      # two DP groups of 8 ranks, 4 per node, same NIC
    gpu = get_gpu("h100-sxm")
    t_two = flow_time_s(two, gpu, "dp", "allreduce", size)
    t_solo = run_collective(two.cluster, gpu, "allreduce", size, stage_groups(two, "dp")[0]).time_s
    assert t_two == pytest.approx(2 * t_solo, rel=0.1)
    assert flow_time_s(one, gpu, "dp", "allreduce", size) < t_two
    analytic = flowsim.simulate(two)
    flow = flowsim.simulate(build_config(**base, tp=2, comm_engine="flow"))
    assert flow.breakdown()["dp_comm_s"] > analytic.breakdown()["dp_comm_s"]


def test_oversubscribed_spine_slows_cross_leaf_dp_reduction():
    # Non-rail fat-tree with 8-port switches: a leaf holds 4 NIC ports, so the 8 DP rings (one per TP rank)
    # cross a leaf boundary at every node; with ideal spreading the leaf uplinks are the bottleneck and a 2:1
    # oversubscription halves their capacity: the reduction takes twice as long.
    kw = dict(**LLAMA, gpus=128, tp=8, gbs=64, network="fat_tree", switch_radix=8, ecmp="ideal")
    gpu = get_gpu("h100-sxm")
    t1 = flow_time_s(build_config(**kw), gpu, "dp", "allreduce", 1e9)
    t2 = flow_time_s(build_config(**kw, oversubscription=2.0), gpu, "dp", "allreduce", 1e9)
    assert t2 / t1 == pytest.approx(2.0, rel=0.05)
    # the analytic model prices each communicator alone and cannot see the spine
    a1 = flowsim.simulate(build_config(**kw)).breakdown()["dp_comm_s"]
    a2 = flowsim.simulate(build_config(**kw, oversubscription=2.0)).breakdown()["dp_comm_s"]
    assert a1 == a2


def test_pxn_keeps_all_to_all_off_the_oversubscribed_spine():
    # 4 nodes of 8 H100 on a rail-optimised fat-tree whose 8-port leaves hold 4 nodes' NICs of one rail.
    # Without PXN, traffic between GPUs on different rails climbs to the spine; with PXN it first crosses
    # NVLink to the GPU on the destination's rail and stays on that rail.
    from flowsim.config import ClusterConfig

    gpu = get_gpu("h100-sxm")
    ranks = list(range(32))

    def t(over, pxn):
        c = ClusterConfig(gpu="h100-sxm", num_gpus=32, oversubscription=over, ecmp="ideal", switch_radix=8)
        return run_collective(c, gpu, "alltoall", 1e9, ranks, pxn=pxn).time_s

    assert t(1.0, True) == pytest.approx(t(1.0, False), rel=1e-6)  # enough spine: same time
    assert t(2.0, True) == pytest.approx(t(1.0, True), rel=1e-6)   # PXN never touches the spine
    assert t(2.0, False) > 1.4 * t(2.0, True)
    assert t(4.0, False) == pytest.approx(2 * t(2.0, False), rel=0.05)  # spine-bound: halving it doubles time
