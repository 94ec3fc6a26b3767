"""Routing: path shapes per case, continuity on every topology, ECMP determinism and spread, PXN."""
from __future__ import annotations

import numpy as np
import pytest

from flowsim.config.cluster import ClusterConfig
from flowsim.network.routing import route
from flowsim.network.topology import LinkKind as K, build_topology
from flowsim.units import GB
from test_topology import spec

TOPOLOGIES = {
    "dgx-2tier": (dict(num_gpus=16), {}),
    "rail_only": (dict(num_gpus=64, network="rail_only", switch_radix=8), {}),
    "fat_tree-2to1": (dict(num_gpus=64, network="fat_tree", oversubscription=2.0, switch_radix=16), {}),
    "3tier": (dict(num_gpus=64, gpus_per_node=1, nics_per_node=1, switch_radix=8), {}),
    "3tier-ideal": (dict(num_gpus=64, gpus_per_node=1, nics_per_node=1, switch_radix=8, ecmp="ideal"), {}),
    "nvl72": (dict(num_gpus=144, gpus_per_node=4, nvlink_domain=72, nics_per_node=4), {}),
    "mi300x": (dict(num_gpus=32), dict(kind="xgmi_mesh", scaleup_Bps=448 * GB, links=7)),
    "pcie-shared-nic": (dict(num_gpus=32, nics_per_node=2), dict(kind="pcie", scaleup_Bps=0.0, links=0)),
    "bridge-2nics": (dict(num_gpus=32, nics_per_node=16, nic_gbps=200),
                     dict(kind="nvlink_bridge", scaleup_Bps=300 * GB, links=12)),
}


def build(name):
    cfg, gpu = TOPOLOGIES[name]
    return build_topology(ClusterConfig(gpu="x", **cfg), spec(**gpu))


def kinds(topo, r, f):
    return [K(k).name for k in topo.link_kind[r.path(f)]]


@pytest.mark.parametrize("name", sorted(TOPOLOGIES))
@pytest.mark.parametrize("pxn", [False, True])
def test_paths_are_connected_from_src_to_dst(name, pxn):
    topo = build(name)
    n = topo.num_gpus
    src, dst = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    src, dst = src.ravel(), dst.ravel()
    r = route(topo, src, dst, pxn=pxn)
    for f in range(r.n_flows):
        p = r.path(f)
        if src[f] == dst[f]:
            assert p.size == 0
            continue
        assert topo.link_src[p[0]] == src[f] and topo.link_dst[p[-1]] == dst[f]
        assert np.all(topo.link_dst[p[:-1]] == topo.link_src[p[1:]])
        assert len(set(p.tolist())) == p.size  # no link twice
    np.testing.assert_allclose(r.latency_s, [topo.latency_s[r.path(f)].sum() for f in range(r.n_flows)])


def test_path_shapes_two_tier():
    topo = build("dgx-2tier")
    r = route(topo, [0, 0, 0, 0], [0, 1, 8, 9])
    assert kinds(topo, r, 0) == []
    assert kinds(topo, r, 1) == ["NVLINK", "NVLINK"]  # via the NVSwitch
    # GPU 0 -> GPU 8: same rail 0, same leaf: no spine.
    assert kinds(topo, r, 2) == ["PCIE", "NIC_LEAF", "LEAF_NIC", "PCIE"]
    # GPU 0 -> GPU 9: rail 0 -> rail 1 without PXN crosses a spine.
    assert kinds(topo, r, 3) == ["PCIE", "NIC_LEAF", "LEAF_SPINE", "SPINE_LEAF", "LEAF_NIC", "PCIE"]
    # Each scale-out hop carries nic_latency_s = 2 us: 4 hops -> 8 us.
    assert r.latency_s[3] == pytest.approx(4 * 2e-6)


def test_path_shape_three_tier_across_pods():
    topo = build("3tier")
    r = route(topo, [0], [63])  # host 0 in pod 0, host 63 in pod 3
    assert kinds(topo, r, 0) == ["PCIE", "NIC_LEAF", "LEAF_SPINE", "SPINE_CORE", "CORE_SPINE", "SPINE_LEAF",
                                 "LEAF_NIC", "PCIE"]


def test_pxn_goes_over_nvlink_to_the_destination_rail():
    topo = build("dgx-2tier")
    r = route(topo, [0], [9], pxn=True)
    p = r.path(0)
    # 0 -> NVSwitch -> GPU 1 (whose NIC is on rail 1, the destination's rail) -> NIC 1 -> leaf 1 -> NIC 9 -> 9.
    assert kinds(topo, r, 0) == ["NVLINK", "NVLINK", "PCIE", "NIC_LEAF", "LEAF_NIC", "PCIE"]
    assert topo.link_dst[p[1]] == 1


def test_rail_only_forces_pxn_across_rails():
    topo = build("rail_only")
    r = route(topo, [0], [9])
    assert kinds(topo, r, 0)[:3] == ["NVLINK", "NVLINK", "PCIE"]
    assert topo.nic_rail[topo.gpu_nic[1, 0]] == topo.nic_rail[topo.gpu_nic[9, 0]]


def test_ecmp_is_deterministic_and_spreads():
    topo = build("dgx-2tier")
    ids = np.arange(256)
    a = route(topo, np.zeros(256, dtype=int), np.full(256, 9), ids)
    b = route(topo, np.zeros(256, dtype=int), np.full(256, 9), ids)
    assert np.array_equal(a.links, b.links) and np.array_equal(a.ptr, b.ptr)
    spines = {int(a.path(f)[2]) for f in range(256)}
    assert len(spines) > 16  # 256 flows hashed over 32 spines use most of them


def test_nvlink_bridge_pairs_and_pcie():
    topo = build("bridge-2nics")
    r = route(topo, [0, 0], [1, 2])
    assert kinds(topo, r, 0) == ["NVLINK"]
    assert kinds(topo, r, 1) == ["PCIE", "PCIE"]


@pytest.mark.parametrize("args, msg", [
    (([0], [99]), r"dst_gpu: GPU ids must be in \[0, 16\) \(got 99\)"),
    (([-1], [0]), r"src_gpu: GPU ids must be in \[0, 16\) \(got -1\)"),
    (([0, 1], [0]), r"dst_gpu: must have one entry per flow, 2 \(got 1\)"),
    (([0.5], [0]), r"src_gpu: must be a one-dimensional integer array"),
])
def test_bad_input(args, msg):
    with pytest.raises(ValueError, match=msg):
        route(build("dgx-2tier"), *args)
