"""Cluster + rank group -> CommLayout: nodes, ranks per node, usable NICs."""
import pytest

from flowsim.network.comm_layout import closest_nics, group_layout
from flowsim.config.cluster import ClusterConfig
from flowsim.errors import ConfigError
from flowsim.gpu_specs import GPUSpec

# Datasheet figures as in gpu_specs (H100 SXM: 18 NVLink4 links, 450 GB/s per direction, NVLS, PCIe Gen5
# x16 64 GB/s; GB200: 18 NVLink5 links, 900 GB/s).
H100 = GPUSpec(key="h100-sxm", name="H100 SXM", vendor="nvidia", arch="hopper", compute_capability=90,
               peak_flop_per_s={"bf16": 989e12}, hbm_bytes=80e9, hbm_Bps=3.35e12, sm_count=132, clock_hz=1.98e9,
               l2_bytes=50e6, scaleup_kind="nvswitch", scaleup_Bps=450e9, scaleup_links=18, nvls=True,
               pcie_Bps=64e9, tdp_w=700, sources=("NVIDIA H100 datasheet",))
GB200 = GPUSpec(**{**H100.__dict__, "key": "gb200", "compute_capability": 100, "scaleup_Bps": 900e9})
DGX = ClusterConfig(gpu="h100-sxm", num_gpus=64, gpus_per_node=8, nics_per_node=8, nic_gbps=400, cpu="intel")
NVL72 = ClusterConfig(gpu="gb200", num_gpus=288, gpus_per_node=4, nvlink_domain=72, nics_per_node=4,
                      nic_gbps=400, cpu="arm")


@pytest.mark.parametrize("n_ranks, stride, nodes, ppn, nics", [
    (8, 1, 1, 8, 8),     # TP=8 inside one node: all 8 NICs are closest to some member
    (4, 1, 1, 4, 4),     # TP=4: GPUs 0-3 -> NICs 0-3
    (16, 1, 2, 8, 8),    # two full nodes
    (8, 8, 8, 1, 1),     # DP across 8 nodes, one GPU each: only its own NIC
    (16, 4, 8, 2, 2),    # stride 4: GPUs 0 and 4 of each node
])
def test_dgx_groups(n_ranks, stride, nodes, ppn, nics):
    lay = group_layout(DGX, H100, n_ranks, stride)
    assert (lay.n_nodes, lay.ranks_per_node, lay.nics_per_node) == (nodes, ppn, nics)
    assert lay.nic_Bps == 50e9 and lay.scaleup_links == 18 and lay.nvls


def test_nvl72_domain_is_one_nccl_node():
    lay = group_layout(NVL72, GB200, 72, 1)
    # 72 GPUs on 18 trays share one NVLink domain: one NCCL node; each of the 18 trays brings 4 NICs
    assert (lay.n_nodes, lay.ranks_per_node, lay.nics_per_node) == (1, 72, 72)
    two = group_layout(NVL72, GB200, 144, 1)
    assert (two.n_nodes, two.ranks_per_node) == (2, 72)
    dp = group_layout(NVL72, GB200, 4, 72)
    assert (dp.n_nodes, dp.ranks_per_node, dp.nics_per_node) == (4, 1, 1)


def test_nic_rule_for_other_ratios():
    assert list(closest_nics(5, 8, 8)) == [5]
    assert list(closest_nics(5, 8, 4)) == [2]      # NIC i serves GPUs 2i and 2i+1
    assert list(closest_nics(5, 8, 2)) == [1]      # NIC 1 serves GPUs 4-7
    assert list(closest_nics(3, 4, 8)) == [6, 7]   # two NICs per GPU
    shared = ClusterConfig(gpu="h100-sxm", num_gpus=16, gpus_per_node=8, nics_per_node=4, nic_gbps=400)
    assert group_layout(shared, H100, 16, 1).nics_per_node == 4
    assert group_layout(shared, H100, 4, 2).nics_per_node == 4  # GPUs 0, 2, 4, 6 -> NICs 0, 1, 2, 3
    assert group_layout(shared, H100, 4, 1).nics_per_node == 2  # GPUs 0, 1, 2, 3 -> NICs 0, 0, 1, 1


def test_first_rank_offsets_the_group():
    lay = group_layout(DGX, H100, 4, 1, first_rank=4)
    assert (lay.n_nodes, lay.nics_per_node) == (1, 4)


@pytest.mark.parametrize("args, message", [
    ((0, 1), "n_ranks: must be a positive integer"),
    ((8, 0), "stride: must be a positive integer"),
    ((16, 8), "n_ranks: group of 16 ranks with stride 8 needs global rank 120"),
])
def test_bad_groups(args, message):
    with pytest.raises(ConfigError, match=message):
        group_layout(DGX, H100, *args)


def test_uneven_groups_on_nvswitch_list_each_node_and_are_refused_elsewhere():
    lay = group_layout(DGX, H100, 3, 4)  # GPUs 0 and 4 of host 0, GPU 0 of host 1
    assert (lay.n_nodes, lay.node_ranks, lay.ranks_per_node, lay.nics_per_node) == (2, (2, 1), 1, 1)
    mesh = GPUSpec(**{**H100.__dict__, "key": "mi300x", "scaleup_kind": "xgmi_mesh", "scaleup_links": 7,
                      "nvls": False})
    with pytest.raises(ConfigError, match="^stride: the group's ranks are spread unevenly over the scale-up "
                                          "domains \\(modelled on NVSwitch fabrics only, not xgmi_mesh\\)"):
        group_layout(DGX, mesh, 3, 4)


def test_job_spreads_evenly_over_nvl72_racks():
    from flowsim.network.comm_layout import job_domain_size
    from flowsim.config import ClusterConfig

    rack = dict(gpu="gb200", gpus_per_node=4, nvlink_domain=72, nics_per_node=4)
    # 128 GPUs do not fill two 72-GPU racks: they run as 2 racks of 64 (16 trays each)
    assert job_domain_size(ClusterConfig(num_gpus=128, **rack)) == 64
    assert job_domain_size(ClusterConfig(num_gpus=64, **rack)) == 64
    assert job_domain_size(ClusterConfig(num_gpus=144, **rack)) == 72


def test_uneven_job_fills_nvl72_racks_in_order():
    """2,496 GPUs on 35 racks (624 trays): 34 full racks and one of 12 trays, as the topology places them; the
    communicator of all of them has 35 NCCL nodes, the last with 48 ranks and 48 NICs."""
    from flowsim.config.cluster import job_domain_size, job_domains

    rack = dict(gpu="gb200", gpus_per_node=4, nvlink_domain=72, nics_per_node=4)
    assert job_domain_size(ClusterConfig(num_gpus=132, **rack)) == 72  # 2 x 66 is not whole trays
    assert job_domains(ClusterConfig(num_gpus=132, **rack)) == (72, 60)
    assert job_domains(ClusterConfig(num_gpus=128, **rack)) == (64, 64)
    job = ClusterConfig(num_gpus=2496, **rack)
    assert job_domains(job) == (72,) * 34 + (48,)
    lay = group_layout(job, GB200, 2496, 1)
    assert (lay.n_nodes, lay.node_ranks, lay.nics_per_node, lay.ranks_per_node) == (35, (72,) * 34 + (48,), 48, 71)
    dp = group_layout(job, GB200, 624, 4, first_rank=3)  # the DP group of TP rank 3 (TP = 4, one tray)
    assert (dp.n_nodes, dp.node_ranks, dp.nics_per_node, dp.mnnvl) == (35, (18,) * 34 + (12,), 12, True)
    assert group_layout(job, GB200, 35, 72).node_ranks == ()  # one rank per rack: even
