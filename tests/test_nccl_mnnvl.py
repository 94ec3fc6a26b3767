"""NVLink domains: NVL72 racks (multi-node NVLink) and partial NVSwitch groups, as NCCL builds their channels."""
from dataclasses import replace

import pytest

from flowsim.config.cluster import ClusterConfig
from flowsim.config.loader import load_preset
from flowsim.errors import ConfigError
from flowsim.gpu_specs import get_gpu
from flowsim.nccl_models import Algo, Coll, CommLayout, Proto, predict
from flowsim.nccl_models.execution import MNNVL_BW_EFFICIENCY, network_bound
from flowsim.nccl_models.graph import graphs_of
from flowsim.nccl_models.tuning import cost_model, nccl_time_s
from flowsim.network.comm_layout import group_layout

# GB200: 18 NVLink5 links, 900 GB/s per direction (GB200 NVL72 spec); H100 / A100 SXM: 18 / 12 links
GB200 = dict(compute_capability=100, scaleup_Bps=900e9, scaleup_links=18, nvls=True, cpu="arm")
H100 = dict(compute_capability=90, scaleup_Bps=450e9, scaleup_links=18, nvls=True)
A100 = dict(compute_capability=80, scaleup_Bps=300e9, scaleup_links=12, pcie_Bps=32e9)


def _nvl72(gpus: int) -> ClusterConfig:
    return ClusterConfig(**{**load_preset("clusters", "gb200-nvl72"), "num_gpus": gpus})


def test_72_gpu_ring_channels_and_nvlink_share():
    g = graphs_of(CommLayout(72, 1, mnnvl=True, **GB200))
    # NCCL prices a GPU's 18 NVLink5 links at 40.1 GB/s (721.8 GB/s): 8 channels at the top intra speed, 90 GB/s,
    # doubled by ncclTopoDupChannels to 16 x 45; comm channels 2 x 16
    assert (g.ring.n_channels, g.ring.bw_intra_Bps, g.exec_channels) == (16, 45e9, 32)
    assert g.ring.n_channels * g.ring.bw_intra_Bps <= g.intra_Bps  # one ring's share of each GPU's NVLink
    est = predict("allreduce", 8 * 2**30, CommLayout(72, 1, mnnvl=True, **GB200), algo="ring")
    assert est.busbw_Bps == pytest.approx(720e9 * MNNVL_BW_EFFICIENCY, rel=0.03)  # measured 834.6 GB/s


def test_twenty_racks_nccl_2_26_ranks_tree_first_at_every_published_size():
    """20 NVL72 racks (1,440 ranks, 20 NCCL nodes of 72; NVLS and CollNet off as in the CoreWeave run) under
    NCCL 2.26.2's cost model (tuning.cc constants, research notes section 1.2-1.5): Tree first at every size the
    20-rack file publishes, LL128 to 1 GiB and Simple from 2 GiB, with a wide margin: Ring pays 2 (n - 1) = 2,878
    steps of latency. The measured rows' 4.4 ms fixed cost is not in either (docs/NCCL.md, Accuracy)."""
    layout = CommLayout(1440, 20, mnnvl=True, nics_per_node=72, nic_Bps=50e9, nccl_version="2.26.2",
                        **{**GB200, "nvls": False})
    model = cost_model(Coll.ALLREDUCE, layout)
    us = model.latency_s * 1e6
    # Ring: baseLat + (2,878 - 38) NVLink steps + 2 (nNodes - 1) = 38 network steps (Simple NVLink steps at
    # max(hwLat 3.4, 3 x netOverhead 1.0 on Arm))
    assert us[Algo.RING, Proto.LL128] == pytest.approx(14.0 + 2840 * 1.9 + 38 * 4.0)
    assert us[Algo.RING, Proto.SIMPLE] == pytest.approx(8.4 + 2840 * 3.4 + 38 * 14.0)
    # Tree: 2 ((ppn - 1) NVLink hops + log2i(20) = 4 network levels)
    assert us[Algo.TREE, Proto.LL128] == pytest.approx(14.0 + 2 * (71 * 1.25 + 4 * 8.5))
    assert us[Algo.TREE, Proto.SIMPLE] == pytest.approx(8.4 + 2 * (71 * 4.0 + 4 * 14.0))
    # 15 graph channels x 48 GB/s (one NIC each): Tree 0.92 x 0.5 algbw; Ring/LL128 0.92 x n / 2 (n - 1)
    assert model.algbw_Bps[Algo.TREE, Proto.SIMPLE] == pytest.approx(15 * 48e9 * 0.92 * 0.5)
    assert model.algbw_Bps[Algo.RING, Proto.LL128] == pytest.approx(15 * 48e9 * 0.92 * 1440 / 2878)
    sizes = [2**k for k in range(29, 35)]  # 512 MiB .. 16 GiB, the file's rows
    assert [(predict("allreduce", s, layout).algo, predict("allreduce", s, layout).proto) for s in sizes] == \
        [("Tree", "LL128")] * 2 + [("Tree", "Simple")] * 4
    ring_512m = nccl_time_s(model, layout, Algo.RING, Proto.LL128, sizes[0])
    assert ring_512m > 3 * nccl_time_s(model, layout, Algo.TREE, Proto.LL128, sizes[0])  # 7.2 against 2.0 ms

def test_mnnvl_is_a_domain_spanning_hosts():
    gpu = get_gpu("gb200")
    assert group_layout(_nvl72(72), gpu, 72, 1).mnnvl
    assert group_layout(_nvl72(144), gpu, 8, 1).mnnvl  # two trays of one rack
    assert not group_layout(_nvl72(144), gpu, 4, 1).mnnvl  # one tray
    assert not group_layout(_nvl72(144), gpu, 2, 72).mnnvl  # one GPU per rack: NICs only
    two_racks = group_layout(_nvl72(144), gpu, 144, 1)
    assert (two_racks.n_nodes, two_racks.nics_per_node, two_racks.mnnvl) == (2, 72, True)


def test_racks_are_nvlink_bound_hgx_nodes_nic_bound():
    two_racks = CommLayout(144, 2, nics_per_node=72, nic_Bps=50e9, mnnvl=True, **GB200)
    assert not network_bound(two_racks)  # 72 NICs per rack, 30 channels: each channel has its own NIC
    assert network_bound(CommLayout(16, 2, nics_per_node=8, nic_Bps=50e9, **H100))  # 8 NICs, 16 channels


@pytest.mark.parametrize("spec, channels, speed", [(H100, 12, 30e9), (A100, 12, 20e9)])
def test_partial_nvswitch_groups_keep_a_full_node_s_channels(spec, channels, speed):
    """Each GPU of an NVSwitch node has all its links on the switches, so 2-7 GPUs find the rings 8 do."""
    for n in range(2, 9):
        g = graphs_of(CommLayout(n, 1, **spec))
        assert (g.ring.n_channels, g.ring.bw_intra_Bps, g.exec_channels) == (channels, speed, 2 * channels)
        if spec.get("nvls"):
            assert g.nvls.n_channels == n  # one NVLS head per GPU


def test_partial_h100_ring_matches_measured_peak(shared_data):
    """nccl_peaks.csv (NVIDIA/nccl#1455): Ring busbw 365-370 GB/s for 2..8 H100 at 2-4 GiB."""
    for n in (2, 4, 8):
        busbw = predict("allreduce", 2**31, CommLayout(n, 1, **H100), algo="ring").busbw_Bps
        assert 365e9 * 0.95 < busbw < 370e9 * 1.02


def test_partial_h100_nvls_matches_measured_peaks(shared_data):
    """nccl_peaks.csv (NVIDIA/nccl#1455, 2-4 GiB): NVLS busbw 420 / 440 / 460 / 480 GB/s on 5-8 H100. Each GPU
    moves S (1 + 1/n) through its NVLink, so the algbw is nearly flat in n (NCCL's figure alone: 296 / 355 /
    414 / 473)."""
    import pandas as pd

    peaks = pd.read_csv(shared_data / "nccl-tests" / "nccl_peaks.csv")
    rows = peaks[(peaks["algo"] == "NVLS") & peaks["source"].str.contains("nccl/issues/1455")]
    rows = rows.drop_duplicates("gpus_per_node")
    assert sorted(rows["gpus_per_node"].astype(int)) == [5, 6, 7, 8]
    for n, measured in zip(rows["gpus_per_node"].astype(int), rows["busbw_gbps"].astype(float)):
        busbw = predict("allreduce", 2**31, CommLayout(n, 1, **H100), algo="nvls").busbw_Bps / 1e9
        assert busbw == pytest.approx(measured, rel=0.04)


def test_mnnvl_efficiency_stays_off_on_one_tray():
    tray = CommLayout(4, 1, **GB200)
    rack = replace(tray, mnnvl=True)
    t_tray = predict("allreduce", 2**33, tray, algo="ring").time_s
    assert predict("allreduce", 2**33, rack, algo="ring").time_s < t_tray


# A partly filled rack: 100 GPUs of NVL72 racks (25 trays) fill rack 0 and 7 trays of rack 1.
UNEVEN = CommLayout(100, 2, nics_per_node=28, nic_Bps=50e9, mnnvl=True, node_ranks=(72, 28), **GB200)


def test_uneven_nodes_are_checked_and_an_even_list_is_no_list():
    assert CommLayout(16, 2, nics_per_node=8, nic_Bps=50e9, node_ranks=[8, 8], **H100).node_ranks == ()
    assert UNEVEN.uneven and UNEVEN.node_sizes == (72, 28) and UNEVEN.ranks_per_node == 50
    with pytest.raises(ConfigError, match=r"^node_ranks: must list n_nodes = 2 positive integers summing to "
                                          r"n_ranks = 100 \(got \(72, 27\)\)"):
        replace(UNEVEN, node_ranks=(72, 27))
    with pytest.raises(ConfigError, match="^node_ranks: uneven nodes are modelled on NVSwitch fabrics only"):
        CommLayout(12, 2, compute_capability=94, vendor="amd", scaleup_kind="xgmi_mesh", scaleup_Bps=448e9,
                   scaleup_links=7, nics_per_node=4, nic_Bps=50e9, node_ranks=(8, 4))
    with pytest.raises(ConfigError, match="^n_nodes: must divide n_ranks"):
        CommLayout(101, 2, nics_per_node=8, nic_Bps=50e9, **H100)


def test_uneven_nodes_keep_the_smallest_graph_of_their_nodes():
    """NCCL all-gathers every node's search and keeps the minimum channels and speeds (init.cc)."""
    hgx = CommLayout(10, 2, nics_per_node=2, nic_Bps=50e9, node_ranks=(8, 2), **H100)
    big, small = (graphs_of(CommLayout(2 * m, 2, nics_per_node=2, nic_Bps=50e9, **H100)) for m in (8, 2))
    g = graphs_of(hgx)
    for name in ("ring", "tree", "nvls"):
        a, b, c = getattr(g, name), getattr(big, name), getattr(small, name)
        assert a.n_channels == min(b.n_channels, c.n_channels)
        assert a.bw_intra_Bps == min(b.bw_intra_Bps, c.bw_intra_Bps)
    assert g.exec_channels == min(big.exec_channels, small.exec_channels)
    from flowsim.nccl_models.execution import tree_depth
    assert tree_depth(UNEVEN) == 71 + 1  # the full rack's chain, then one binary-tree hop


def test_uneven_ring_and_tree_plans_visit_each_node_as_nccl_builds_them():
    import numpy as np

    from flowsim.nccl_models import build_plan
    from flowsim.nccl_models.rank_orders import ring_order

    six = CommLayout(6, 2, nics_per_node=2, nic_Bps=50e9, node_ranks=(4, 2), **H100)
    # every node entered at local 0 and 1 (the smaller node's rails), then its own ranks in order
    assert ring_order(six, 2).tolist() == [[0, 1, 2, 3, 4, 5], [1, 2, 3, 0, 5, 4]]
    ring = build_plan("allreduce", 2**30, UNEVEN, "Ring", "Simple")
    R = int(ring.channel.max()) + 1
    assert R == 28  # one ring per NIC rail of the smaller node
    cross = (ring.src >= 72) != (ring.dst >= 72)
    # each step of a ring is one transfer per rank, 2 of them between the nodes (out of each node once)
    assert cross.sum() * 100 == 2 * ring.n_transfers
    sent = ring.sent_bytes()
    assert np.allclose(sent, sent[0])  # every rank sends 2 (n - 1) / n of each ring's share
    tree = build_plan("allreduce", 2**30, UNEVEN, "Tree", "Simple")
    assert int(tree.channel.max()) + 1 == 2 * 28  # each ring path runs both binary trees
    edges = {(int(c), int(a), int(b)) for c, a, b in zip(tree.channel, tree.src, tree.dst)}
    assert [sum(1 for e in edges if e[0] == c) for c in range(56)] == [2 * 99] * 56  # 99 edges, up and down
    heads = {(c, b) for c, a, b in edges if a < 72 <= b or b < 72 <= a}
    assert len(heads) == 2 * 56  # one inter-node edge per tree: head of node 1 <-> head of node 0
    with pytest.raises(ConfigError, match="^algo: CollNetChain plans need the same ranks on every node"):
        build_plan("allreduce", 2**30, replace(UNEVEN, collnet=True), "CollNetChain", "Simple")
    from flowsim.nccl_models import SWITCH
    from flowsim.nccl_models.switch_plans import nvls_heads

    heads = nvls_heads(UNEVEN, 16)
    assert heads[0].tolist() == (heads[1] - 72).tolist() == [h * 28 // 16 for h in range(16)]  # same rails
    nvls = build_plan("allreduce", 2**30, UNEVEN, "NVLSTree", "Simple")
    up = (nvls.dst == SWITCH) & (nvls.src >= 0)
    sent_up = np.bincount(nvls.src[up], weights=nvls.payload_bytes[up], minlength=100)
    is_head = np.isin(np.arange(100), heads)
    assert np.allclose(sent_up[~is_head], 2**30) and np.allclose(sent_up[is_head], 2**30 * (1 + 1 / 16))


def test_uneven_rack_flows_agree_with_the_analytic_model():
    from flowsim.network.collective_flows import run_collective

    cluster, gpu = _nvl72(100), get_gpu("gb200")
    layout = group_layout(cluster, gpu, 100, 1)
    assert layout.node_ranks == (72, 28)
    for algo in ("ring", "tree"):
        flow = run_collective(cluster, gpu, "allreduce", 2**30, list(range(100)), algo=algo)
        est = predict("allreduce", 2**30, layout, algo=algo)
        assert flow.algo == est.algo
        assert flow.time_s == pytest.approx(est.time_s, rel=0.15)
    flow = run_collective(cluster, gpu, "allreduce", 2**30, list(range(100)))  # NVLS on: NVLSTree
    est = predict("allreduce", 2**30, layout)
    assert flow.algo == est.algo == "NVLSTree"
    assert flow.time_s == pytest.approx(est.time_s, rel=0.15)
