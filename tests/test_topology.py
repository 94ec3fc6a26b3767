"""Topology builder: counts, capacities, tiers, NVL72 domains, meshes, and impossible clusters."""
from __future__ import annotations

import numpy as np
import pytest

from flowsim.config.cluster import ClusterConfig
from flowsim.errors import ConfigError
from flowsim.gpu_specs import GPUSpec
from flowsim.network.topology import LinkKind, NodeKind, build_topology
from flowsim.units import GB, gbps_to_Bps

NIC_BPS = gbps_to_Bps(400)  # 50 GB/s


def spec(kind="nvswitch", scaleup_Bps=450 * GB, links=18, pcie_Bps=64 * GB):
    """A test GPU: H100-SXM-like figures by default (NVLink4 450 GB/s per direction, PCIe Gen5 x16 64 GB/s)."""
    return GPUSpec(key="x", name="test GPU", vendor="nvidia", arch="hopper", compute_capability=90,
                   peak_flop_per_s={"bf16": 989e12}, hbm_bytes=80 * GB, hbm_Bps=3.35e12, sm_count=132,
                   clock_hz=1.98e9, l2_bytes=50e6, scaleup_kind=kind, scaleup_Bps=scaleup_Bps, scaleup_links=links,
                   nvls=True, pcie_Bps=pcie_Bps, tdp_w=700, sources=("test",))


def kinds(topo, kind):
    return int((topo.link_kind == kind).sum())


def test_two_dgx_nodes_rail_optimized():
    # 2 hosts x 8 GPUs, 8 rails, radix 64 (32 down / 32 up): one leaf per rail (2 hosts <= 32) = 8 leaves,
    # all in one plane -> two tiers with 32 spines. Links: NVLink 16 up + 16 down; PCIe 16 + 16;
    # NIC<->leaf 16 + 16; leaf<->spine 8 leaves * 32 spines * 2 = 512. Total 608.
    topo = build_topology(ClusterConfig(gpu="x", num_gpus=16), spec())
    s = topo.summary()
    assert (s.gpus, s.nodes, s.nics, s.nvswitches, s.leaves, s.spines, s.cores) == (16, 2, 16, 2, 8, 32, 0)
    assert s.links == 608 == topo.n_links
    assert s.switch_tiers == 2
    assert kinds(topo, LinkKind.NVLINK) == 32 and kinds(topo, LinkKind.LEAF_SPINE) == 256
    assert np.all(topo.capacity_Bps[topo.link_kind == LinkKind.NVLINK] == 450 * GB)
    assert np.all(topo.capacity_Bps[topo.link_kind == LinkKind.NIC_LEAF] == NIC_BPS)
    # NIC r of every host on rail r, on leaf r.
    assert topo.nic_rail.tolist() == list(range(8)) * 2
    assert topo.nic_leaf.tolist() == list(range(8)) * 2
    # Bisection: half the NICs, 8 * 50 GB/s = 400 GB/s.
    assert s.bisection_Bps == 8 * NIC_BPS
    # Link endpoints: NVLink up-links go GPU -> NVSwitch.
    up = topo.gpu_up_link
    assert np.all(topo.node_kind[topo.link_src[up]] == NodeKind.GPU)
    assert np.all(topo.node_kind[topo.link_dst[up]] == NodeKind.NVSWITCH)


def test_fat_tree_oversubscription_halves_leaf_uplinks():
    # fat_tree, radix 64: 32 NICs per leaf -> 64 NICs on 2 leaves; 32 up-links per leaf at 50 / 2 GB/s.
    # Bisection: min(64/2 * 50, 2 * 32 * 25 / 2) = min(1600, 800) GB/s = 800 GB/s.
    topo = build_topology(ClusterConfig(gpu="x", num_gpus=64, network="fat_tree", oversubscription=2.0), spec())
    ups = topo.capacity_Bps[topo.link_kind == LinkKind.LEAF_SPINE]
    assert np.all(ups == NIC_BPS / 2)
    s = topo.summary()
    assert s.leaves == 2 and s.bisection_Bps == 800 * GB and s.leaf_oversubscription == 2.0
    assert topo.nic_leaf.tolist() == [0] * 32 + [1] * 32  # host by host, not by rail


def test_rail_only_has_spines_per_rail():
    # 4096 GPUs, 512 hosts, radix 64: 16 leaves per rail; rail_only gives each rail its own 32 spines.
    topo = build_topology(ClusterConfig(gpu="x", num_gpus=4096, network="rail_only"), spec())
    s = topo.summary()
    assert (s.leaves, s.spines, s.switch_tiers) == (128, 256, 2)
    assert np.all(topo.leaf_plane == np.arange(128) % 8)


def test_three_tier_when_one_spine_layer_is_not_enough():
    # One GPU and NIC per host, radix 8: 4 hosts per leaf. 64 hosts -> 16 leaves > radix 8 -> three tiers:
    # pods of 4 leaves (4 pods), 4 spines per pod (16), core groups of 4 (4 groups * 4 = 16 cores).
    cfg = ClusterConfig(gpu="x", num_gpus=64, gpus_per_node=1, nics_per_node=1, switch_radix=8)
    topo = build_topology(cfg, spec())
    s = topo.summary()
    assert (s.leaves, s.spines, s.cores, s.switch_tiers) == (16, 16, 16, 3)
    assert topo.spine_up_link.shape == (16, 4)
    # With 32 hosts (8 leaves <= radix) it stays two-tier.
    cfg2 = ClusterConfig(gpu="x", num_gpus=32, gpus_per_node=1, nics_per_node=1, switch_radix=8)
    assert build_topology(cfg2, spec()).n_tiers == 2


def test_ideal_ecmp_bundles_uplinks():
    # Ideal spreading: one bundle per leaf of 32 up-ports * 50 GB/s = 1600 GB/s into one logical spine.
    topo = build_topology(ClusterConfig(gpu="x", num_gpus=64, network="fat_tree", ecmp="ideal"), spec())
    assert topo.leaf_up_link.shape == (2, 1)
    assert np.all(topo.capacity_Bps[topo.leaf_up_link] == 32 * NIC_BPS)


def test_nvl72_domain_spans_hosts():
    # GB200 NVL72: 4 GPUs per host, 72 GPUs per NVLink domain: 144 GPUs = 2 domains, 36 hosts, 4 rails.
    cfg = ClusterConfig(gpu="x", num_gpus=144, gpus_per_node=4, nvlink_domain=72, nics_per_node=4)
    topo = build_topology(cfg, spec(scaleup_Bps=900 * GB))
    assert topo.gpu_domain[0] == topo.gpu_domain[71] != topo.gpu_domain[72]
    assert topo.summary().nvswitches == 2
    assert topo.link_dst[topo.gpu_up_link[0]] == topo.link_dst[topo.gpu_up_link[71]]


def test_xgmi_mesh():
    # MI300X-like: 7 xGMI links of 64 GB/s (448 GB/s per GPU): a direct link to each of the 7 peers.
    topo = build_topology(ClusterConfig(gpu="x", num_gpus=16), spec("xgmi_mesh", 448 * GB, 7))
    assert kinds(topo, LinkKind.NVLINK) == 16 * 7
    assert np.all(topo.capacity_Bps[topo.link_kind == LinkKind.NVLINK] == 64 * GB)
    assert topo.peer_link[0, 0] == -1 and topo.link_dst[topo.peer_link[0, 5]] == 5
    assert topo.gpu_up_link.tolist() == [-1] * 16


def test_pcie_and_bridge_nodes_have_host_links():
    t = build_topology(ClusterConfig(gpu="x", num_gpus=8), spec("pcie", 0.0, 0, 32 * GB))
    assert t.summary().nvswitches == 0 and int((t.node_kind == NodeKind.HOST).sum()) == 1
    b = build_topology(ClusterConfig(gpu="x", num_gpus=8), spec("nvlink_bridge", 300 * GB, 12))
    assert b.link_dst[b.peer_link[2, 3]] == 3 and b.peer_link[2, 4] == -1


def test_shared_and_multiple_nics():
    # 4 NICs for 8 GPUs: GPUs 0, 1 share NIC 0. 16 NICs for 8 GPUs at 200 Gb/s: 2 per GPU (50 GB/s <= 64).
    shared = build_topology(ClusterConfig(gpu="x", num_gpus=8, nics_per_node=4), spec())
    assert shared.gpu_nic[:, 0].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    two = build_topology(ClusterConfig(gpu="x", num_gpus=8, nics_per_node=16, nic_gbps=200), spec())
    assert two.gpu_nic[1].tolist() == [2, 3]


@pytest.mark.parametrize("cfg, gpu, msg", [
    (dict(oversubscription=0.5), {},
     r"oversubscription: must be a finite number in \[1, 100\] \(1 = non-blocking\) \(got 0.5\)"),
    (dict(nics_per_node=3), {}, r"nics_per_node: must divide gpus_per_node or be a multiple of it.* \(got 3 and 8\)"),
    (dict(nics_per_node=16), {}, r"nics_per_node: 2 NICs per GPU need 100 GB/s, more than the GPU's PCIe link "
                                 r"\(64 GB/s\) \(got 16\)"),
    (dict(nvlink_domain=16), dict(kind="xgmi_mesh", scaleup_Bps=448 * GB, links=7),
     r"nvlink_domain: a scale-up domain larger than a host needs NVSwitches \(x has xgmi_mesh\) \(got 16\)"),
    (dict(gpus_per_node=1, nics_per_node=1, num_gpus=200, switch_radix=8), {},
     r"switch_radix: 8 ports cannot connect 50 leaves in three tiers \(at most radix \* radix / 2 = 32\) \(got 8\)"),
    (dict(leaves_per_rail=1, num_gpus=8 * 40), {},
     r"leaves_per_rail: 40 hosts on 1 leaves per rail need 40 down-ports per leaf, more than switch_radix // 2 = 32"),
    (dict(switch_radix=1), {}, r"switch_radix: must be >= 2"),
    (dict(ecmp="random"), {}, r"ecmp: must be one of hash, ideal \(got random\)"),
    (dict(network="fat_tree", leaves_per_rail=2), {}, r"leaves_per_rail: applies to rail networks only"),
])
def test_impossible_topologies(cfg, gpu, msg):
    base = dict(gpu="x", num_gpus=16)
    base.update(cfg)
    with pytest.raises(ConfigError, match=msg):
        build_topology(ClusterConfig(**base), spec(**gpu))


def test_mesh_needs_enough_links():
    with pytest.raises(ConfigError, match=r"gpus_per_node: a full xGMI mesh needs a link to every peer: at most "
                                          r"scaleup_links \+ 1 = 4 GPUs per node \(got 8\)"):
        build_topology(ClusterConfig(gpu="x", num_gpus=8), spec("xgmi_mesh", 192 * GB, 3))


def test_summary_to_dict():
    d = build_topology(ClusterConfig(gpu="x", num_gpus=16), spec()).summary().to_dict()
    assert d["gpus"] == 16 and d["bisection_Bps"] == 8 * NIC_BPS
    assert d["tiers"][0] == {"tier": "scale-up (NVLink/xGMI)", "links": 32, "link_Bps": 450 * GB,
                             "total_Bps": 32 * 450 * GB}


# ------------------------------------------------------------------------------------------ CLI
def test_cli_table():
    from click.testing import CliRunner

    from flowsim.cli import main

    res = CliRunner().invoke(main, ["topo", "--cluster", "dgx-h100", "--gpus", "16"])
    assert res.exit_code == 0, res.output
    assert "dgx-h100: 16 GPUs, rail_optimized (2-tier, ECMP hash)" in res.output
    assert "bisection bandwidth (scale-out, one direction): 0.400 TB/s" in res.output
    assert "leaf -> spine" in res.output


def test_cli_json_nvl72():
    import json

    from click.testing import CliRunner

    from flowsim.cli import main

    res = CliRunner().invoke(main, ["topo", "--cluster", "gb200-nvl72", "--gpus", "144", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert (d["gpus"], d["nvswitches"], d["scaleup_domain_gpus"], d["nics"]) == (144, 2, 72, 144)


def test_cli_bad_input_is_one_line_exit_2():
    from click.testing import CliRunner

    from flowsim.cli import main

    res = CliRunner().invoke(main, ["topo", "--gpus", "16", "--oversubscription", "0.5"])
    assert res.exit_code == 2
    assert res.output.strip() == ("Error: oversubscription: must be a finite number in [1, 100] (1 = non-blocking) "
                                  "(got 0.5)")
    res = CliRunner().invoke(main, ["topo", "--gpus", "16", "--nics-per-node", "3"])
    assert res.exit_code == 2 and "nics_per_node: must divide gpus_per_node" in res.output
