"""NVLink domains: NVL72 racks (multi-node NVLink) and partial NVSwitch groups, as NCCL builds their channels."""
from dataclasses import replace

import pytest

from flowsim.config.cluster import ClusterConfig
from flowsim.config.loader import load_preset
from flowsim.gpu_specs import get_gpu
from flowsim.nccl_models import CommLayout, predict
from flowsim.nccl_models.execution import MNNVL_BW_EFFICIENCY, network_bound
from flowsim.nccl_models.graph import graphs_of
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


def test_mnnvl_efficiency_stays_off_on_one_tray():
    tray = CommLayout(4, 1, **GB200)
    rack = replace(tray, mnnvl=True)
    t_tray = predict("allreduce", 2**33, tray, algo="ring").time_s
    assert predict("allreduce", 2**33, rack, algo="ring").time_s < t_tray
