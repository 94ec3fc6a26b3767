"""The NVLink hybrid cube-mesh (``nvlink_mesh``: DGX-1 with V100 or P100): the board's links, routing through a relay
GPU, NCCL's ring search on the mesh, group layouts, both engines, and a V100 job end to end."""
import dataclasses
import json

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

from flowsim.cli import main
from flowsim.config.cluster import ClusterConfig
from flowsim.errors import ConfigError
from flowsim.gpu_specs import get_gpu
from flowsim.nccl_models import CommLayout, predict
from flowsim.nccl_models.graph import graphs_of, mesh_relays
from flowsim.nccl_models.constants import Hw
from flowsim.network.collective_flows import run_collective
from flowsim.network.comm_layout import group_layout, preset_cluster
from flowsim.network.routing import route
from flowsim.network.topology import LinkKind, build_topology, nvlink_mesh_links
from flowsim.units import GB

V100 = get_gpu("v100-sxm2-32gb")
# The DGX-1V's doubled pairs (NV2 in `nvidia-smi topo -m`); the other 8 linked pairs have one NVLink.
NV2 = {(0, 3), (0, 4), (1, 2), (1, 5), (2, 3), (4, 7), (5, 6), (6, 7)}
NV1 = {(0, 1), (0, 2), (1, 3), (2, 6), (3, 7), (4, 5), (4, 6), (5, 7)}


def dgx1v(nodes: int = 1) -> ClusterConfig:
    cfg, _ = preset_cluster("dgx-1v", nodes)
    return cfg


def test_dgx1v_link_counts_per_pair():
    links = nvlink_mesh_links(8, 6)
    for i in range(8):
        for j in range(8):
            pair = (min(i, j), max(i, j))
            assert links[i, j] == (2 if pair in NV2 else 1 if pair in NV1 else 0), pair
    assert links.sum(axis=1).tolist() == [6] * 8 and links.sum() // 2 == 24  # 6 NVLink2 links per GPU
    # the doubled pairs form one Hamiltonian cycle, the single ones another
    assert all(links[a, b] == 2 for a, b in zip([0, 3, 2, 1, 5, 6, 7, 4], [3, 2, 1, 5, 6, 7, 4, 0]))
    assert all(links[a, b] == 1 for a, b in zip([0, 1, 3, 7, 5, 4, 6, 2], [1, 3, 7, 5, 4, 6, 2, 0]))
    p100 = nvlink_mesh_links(8, 4)  # DGX-1 with P100: one NVLink1 on each of the 16 pairs, 4 per GPU
    assert p100.sum(axis=1).tolist() == [4] * 8 and set(np.unique(p100)) == {0, 1}
    assert nvlink_mesh_links(4, 6).tolist() == links[:4, :4].tolist()  # a p3.8xlarge: the first quad


def test_topology_wires_the_mesh_and_relays_unlinked_pairs():
    topo = build_topology(dgx1v(2), V100)
    nvl = topo.link_kind == LinkKind.NVLINK
    assert nvl.sum() == 2 * 32  # 16 linked pairs per host, both directions
    assert sorted(set(topo.capacity_Bps[nvl] / GB)) == [25.0, 50.0]  # 1 or 2 NVLinks of 25 GB/s
    assert topo.capacity_Bps[topo.peer_link[8 + 0, 3]] == 50 * GB and topo.peer_link[8 + 0, 5] == -1
    relays = mesh_relays(nvlink_mesh_links(8, 6))
    assert relays[0, 5] == 1 and relays[3, 4] == 0  # ties (0 -> 1 -> 5 and 0 -> 4 -> 5) go to the lower GPU
    r = route(topo, np.array([0, 3, 8 + 0, 2]), np.array([5, 4, 8 + 5, 3]))
    hops = [[(int(topo.link_src[k]), int(topo.link_dst[k])) for k in r.path(f)] for f in range(4)]
    assert hops == [[(0, 1), (1, 5)], [(3, 0), (0, 4)], [(8, 9), (9, 13)], [(2, 3)]]
    assert all(topo.link_kind[r.links] == LinkKind.NVLINK)


@pytest.mark.parametrize("gpn, links, msg", [
    (16, 6, r"gpus_per_node: an nvlink_mesh host is a DGX-1 hybrid cube-mesh: 8 GPUs \(or its first 4 or 2\) "
            r"\(got 16\)"),
    (8, 12, r"scaleup_links: an nvlink_mesh \(DGX-1 hybrid cube-mesh\) GPU has 6 \(V100\) or 4 \(P100\) NVLinks "
            r"\(got 12\)"),
])
def test_unmodelled_mesh_boards_are_refused(gpn, links, msg):
    gpu = dataclasses.replace(V100, scaleup_links=links)
    with pytest.raises(ConfigError, match=msg):
        build_topology(ClusterConfig(gpu="v100-sxm2-32gb", num_gpus=16, gpus_per_node=gpn, nics_per_node=4), gpu)


def _ring_edges(ring):
    return list(zip(ring, ring[1:] + ring[:1]))


def _reverse(cycle):
    """The same cycle the other way round, from rank 0."""
    return (0, *cycle[:0:-1])


def test_ring_search_on_eight_gpus():
    layout = group_layout(dgx1v(), V100, 8, 1)
    g = graphs_of(layout)
    # 6 channels of NCCL's 20 GB/s per SM70 NVLink (topo.h): every NVLink carries one ring each way; no duplication
    # below 25 GB/s (search.cc ncclTopoDupChannels), then twice the channels to run on (connect.cc).
    assert (g.ring.n_channels, g.ring.bw_intra_Bps, g.exec_channels) == (6, 20 * GB, 12)
    assert g.intra_hw == Hw.NVLINK and g.intra_Bps == 120 * GB
    links = nvlink_mesh_links(8, 6)
    use = np.zeros((8, 8), dtype=int)
    for ring in g.mesh_rings:
        assert sorted(ring) == list(range(8))
        for a, b in _ring_edges(list(ring)):
            assert links[a, b] > 0
            use[a, b] += 1
    assert (use == links).all()  # each directed link of k NVLinks carries k rings of 20 GB/s
    # NCCL repeats the widest cycle: the doubled one twice each way, then the single one each way
    doubled, single = (0, 3, 2, 1, 5, 6, 7, 4), (0, 1, 3, 7, 5, 4, 6, 2)
    assert g.mesh_rings == (doubled, doubled, _reverse(doubled), _reverse(doubled), single, _reverse(single))
    est = predict("allreduce", 8 * 2**30, layout)
    assert (est.algo, est.proto) == ("Ring", "Simple")
    assert est.busbw_Bps == pytest.approx(120 * GB, rel=0.01)  # 6 x 20 GB/s, 80 % of the 150 GB/s wire


@pytest.mark.parametrize("n, stride, channels, intra_GBps", [
    (2, 1, 1, 20),   # TP=2: pairs 0-1 / 4-5 have one NVLink (2-3, 6-7 two): priced on the slowest
    (4, 1, 4, 80),   # TP=4: a quad, 4 NVLinks per GPU inside it
    (4, 2, 2, 40),   # stride 2 (0, 2, 4, 6): the cycle 0-2-6-4, one ring each way
    (2, 4, 1, 20),   # stride 4: 0-4, 1-5 have two NVLinks, 2-6, 3-7 one
])
def test_groups_inside_a_host(n, stride, channels, intra_GBps):
    cfg = dgx1v()
    layouts = {group_layout(cfg, V100, n, stride, first_rank=f) for f in range(8) if
               f % (n * stride) < stride}
    assert len(layouts) == 1  # every group of the shape gets one layout (the flow engine runs them on one plan)
    g = graphs_of(layouts.pop())
    assert g.ring.n_channels * g.ring.bw_intra_Bps == intra_GBps * GB and g.intra_hw == Hw.NVLINK
    assert g.ring.n_channels in (channels, 2 * channels)  # 2 GPUs on two NVLinks: 1 x 40 duplicated to 2 x 20


def test_unlinked_pair_rings_over_pcie():
    g = graphs_of(group_layout(dgx1v(), V100, 2, 5))  # 0-5, 1-6, 2-7: no NVLink between them
    assert g.intra_hw == Hw.PCI and g.mesh_rings == () and g.ring.bw_intra_Bps == 12 * GB  # PCIe Gen3, 3/4
    est = predict("allreduce", 2**30, group_layout(dgx1v(), V100, 2, 5))
    assert est.proto != "LL128"


def test_two_node_allreduce():
    layout = group_layout(dgx1v(2), V100, 16, 1)
    assert (layout.n_nodes, layout.nics_per_node) == (2, 4)
    g = graphs_of(layout)
    # one channel per NIC at min(EDR 12.5 GB/s, NCCL's 12 GB/s PCIe Gen3 x16) = 12: 4 x 12, 8 channels to run on
    assert (g.ring.n_channels, g.ring.bw_inter_Bps, g.exec_channels) == (4, 12 * GB, 8)
    ring = predict("allreduce", 8 * 2**30, layout, algo="Ring", proto="Simple")
    assert ring.busbw_Bps == pytest.approx(4 * 12 * GB * 0.9, rel=0.02)  # NET_BW_EFFICIENCY 0.9 on the NICs
    flow = run_collective(dgx1v(2), V100, "allreduce", 2**28, np.arange(16), algo="Ring", proto="Simple")
    analytic = predict("allreduce", 2**28, layout, algo="Ring", proto="Simple")
    assert flow.time_s == pytest.approx(analytic.time_s, rel=0.05)


def test_flow_rings_follow_nvlinks_and_agree_with_the_analytic_model():
    for op in ("allreduce", "allgather", "reducescatter"):
        flow = run_collective(dgx1v(), V100, op, 2**30, np.arange(8))
        analytic = predict(op, 2**30, group_layout(dgx1v(), V100, 8, 1))
        assert flow.algo == analytic.algo == "Ring"
        assert flow.time_s == pytest.approx(analytic.time_s, rel=0.02)
        tiers = {t["tier"]: t for t in flow.link_utilization}
        assert "PCIe (GPU-NIC, GPU-host)" not in tiers  # no ring hop leaves the NVLinks
        assert tiers["scale-up (NVLink/xGMI)"]["links"] == 32  # every directed NVLink pair is used


def test_dgx2_on_nvswitch_from_a_spec():
    # DGX-2: 16 V100 on 12 NVSwitches (v1), 6 NVLink2 links per GPU; a user spec with scaleup_kind nvswitch.
    gpu = dataclasses.replace(V100, key="v100-dgx2", scaleup_kind="nvswitch")
    cfg = ClusterConfig(gpu="v100-dgx2", num_gpus=16, gpus_per_node=16, nics_per_node=8, nic_gbps=100)
    g = graphs_of(group_layout(cfg, gpu, 16, 1))
    assert (g.ring.n_channels, g.ring.bw_intra_Bps, g.exec_channels) == (6, 20 * GB, 12)  # 3 x 40, duplicated


def test_comm_layout_checks_mesh_links():
    base = dict(n_ranks=2, n_nodes=1, compute_capability=70, scaleup_Bps=150e9, scaleup_links=6,
                scaleup_kind="nvlink_mesh")
    ok = CommLayout(**base, mesh_links=([[0, 2], [2, 0]],))
    assert ok.mesh_links == (((0, 2), (2, 0)),)
    for bad in ((), ([[0, 2], [1, 0]],), ([[1, 0], [0, 1]],), ([[0, 7], [7, 0]],), ([[0, 1.5], [1.5, 0]],),
                ([[0, 1, 0], [1, 0, 1], [0, 1, 0]],)):
        with pytest.raises(ConfigError, match="mesh_links: must list one or more 2 x 2 symmetric matrices"):
            CommLayout(**base, mesh_links=bad)
    with pytest.raises(ConfigError, match="mesh_links: applies to nvlink_mesh fabrics"):
        CommLayout(**{**base, "scaleup_kind": "nvswitch"}, mesh_links=([[0, 1], [1, 0]],))


def test_v100_job_runs_on_both_engines():
    args = ["estimate", "--model", "llama2-7b", "--cluster", "dgx-1v", "--gpus", "8", "--tp", "1", "--gbs", "8",
            "--seq", "1024", "--precision", "fp16", "--recompute", "full", "--set", "use_flash_attn=false", "--json"]
    out = {}
    for engine in ("analytic", "flow"):
        res = CliRunner().invoke(main, args + ["--comm-engine", engine])
        assert res.exit_code == 0, res.output
        out[engine] = json.loads(res.output[res.output.index("{"):])
    dp = {e: [c for c in out[e]["collectives"] if c["group"] == "dp"][0] for e in out}
    assert dp["analytic"]["algo"] == dp["flow"]["algo"] == "Ring"
    # the data-parallel all-reduce inside one host: both engines run NCCL's NVLink rings
    assert out["flow"]["step_time_s"] == pytest.approx(out["analytic"]["step_time_s"], rel=0.02)


def test_point_to_point_on_the_mesh():
    # Send/Recv r -> r + 1 on 8 GPUs: 3 -> 4 and 7 -> 0 go through a relay (3-0-4, 7-4-0, on doubled links), so a
    # single NVLink (0 -> 1, 4 -> 5) at NCCL's 20 GB/s decides.
    one = group_layout(dgx1v(), V100, 8, 1)
    assert predict("sendrecv", 8 * 2**30, one).busbw_Bps == pytest.approx(20 * GB, rel=0.01)
    # AllToAll on a quad: every pair linked, S / 4 per pair, the single NVLinks (20 GB/s) decide: algbw 80 GB/s.
    quad = group_layout(dgx1v(), V100, 4, 1)
    assert predict("alltoall", 8 * 2**30, quad).busbw_Bps == pytest.approx(80 * GB * 3 / 4, rel=0.01)
    for op in ("alltoall", "sendrecv"):  # relayed pairs cross the same links in the flow engine
        flow = run_collective(dgx1v(), V100, op, 2**30, np.arange(8))
        assert flow.time_s == pytest.approx(predict(op, 2**30, one).time_s, rel=0.02)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 7), min_size=2, max_size=8, unique=True).map(sorted))
def test_ring_search_on_any_subset_respects_the_links(ranks):
    """Any set of a DGX-1V's GPUs: every ring is a Hamiltonian cycle on NVLinks, no directed link carries more
    channels than its NVLinks allow at the ring speed, and channels x speed never exceeds a GPU's NVLinks."""
    board = nvlink_mesh_links(8, 6)
    links = board[np.ix_(ranks, ranks)]
    n = len(ranks)
    layout = CommLayout(n, 1, compute_capability=70, scaleup_Bps=150e9, scaleup_links=6, scaleup_kind="nvlink_mesh",
                        pcie_Bps=16e9, mesh_links=(links.tolist(),))
    g = graphs_of(layout)
    if not g.mesh_rings:
        assert g.intra_hw == Hw.PCI
        return
    speed = g.intra_Bps / len(g.mesh_rings)
    use = np.zeros((n, n), dtype=int)
    for ring in g.mesh_rings:
        assert sorted(ring) == list(range(n))
        for a, b in _ring_edges(list(ring)):
            use[a, b] += 1
    assert (use * speed <= links * 20 * GB * (1 + 1e-9)).all()
    assert g.intra_Bps <= links.sum(axis=1).min() * 20 * GB * (1 + 1e-9)


def test_flash_attention_on_volta_is_refused():
    result = CliRunner().invoke(main, ["estimate", "--model", "llama3-8b", "--cluster", "dgx-1v", "--gpus", "16",
                                       "--gbs", "64", "--precision", "fp16"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == "Error: use_flash_attn: FlashAttention needs compute capability " \
        "7.5 or newer (v100-sxm2-32gb is 7.0); set use_flash_attn: false (got True)"


def test_a_bf16_job_on_v100_names_the_precision_it_can_run():
    result = CliRunner().invoke(main, ["estimate", "--model", "llama3-8b", "--cluster", "dgx-1v", "--gpus", "16",
                                       "--gbs", "64"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == \
        "Error: precision: v100-sxm2-32gb has no bf16 tensor cores; use fp16 (got bf16)"
