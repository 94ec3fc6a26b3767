"""Collectives executed as flows (flowsim.network.collective_flows): closed forms, sharing, oversubscription, accuracy."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from flowsim.cli import main
from flowsim.network.collective_flows import run_collective, strided_groups
from flowsim.network.comm_layout import group_layout
from flowsim.config.cluster import ClusterConfig
from flowsim.errors import ConfigError
from flowsim.gpu_specs import get_gpu
from flowsim.nccl_models import predict
from flowsim.nccl_models.constants import Algo, Coll, Proto
from flowsim.nccl_models.execution import NET_BW_EFFICIENCY, nvls_chunk_overhead_s
from flowsim.nccl_models.tuning import cost_model
from flowsim.validation.nccl_flows import flow_comparison
from flowsim.validation.nccl_tests import compare_nccl_tests, read_nccl_tests

H100 = get_gpu("h100-sxm")
GiB = 2**30


def test_uncontended_ring_equals_closed_form():
    # 8 hosts x 1 GPU x one 100 Gb/s NIC: the ring's bottleneck is the NIC at 12.5 GB/s x 0.9 = 11.25 GB/s,
    # below the kernel link (NCCL's ring algbw x 2(n-1)/n = busBw = 12 GB/s here)
    c = ClusterConfig(gpu="h100-sxm", num_gpus=8, gpus_per_node=1, nics_per_node=1, nic_gbps=100)
    model = cost_model(Coll.ALLREDUCE, group_layout(c, H100, 8, 1))
    bus_kernel = model.algbw_Bps[Algo.RING, Proto.SIMPLE] * 2 * 7 / 8
    B = min(12.5e9 * NET_BW_EFFICIENCY, bus_kernel)
    assert B == pytest.approx(11.25e9)
    r = run_collective(c, H100, "allreduce", GiB, list(range(8)), algo="ring", proto="simple")
    # 2(n-1)/n x S / B + NCCL's latency (base + 14 steps x per-step latency) = 0.16722 s
    expected = 2 * 7 / 8 * GiB / B + model.latency_s[Algo.RING, Proto.SIMPLE]
    assert r.time_s == pytest.approx(expected, rel=0.02)
    assert (r.algo, r.proto) == ("Ring", "Simple")


def test_uncontended_nvlstree_equals_closed_form():
    # 2 hosts x 8 H100, 8 x 200 Gb/s NICs (GCP A3 Mega-like). NVLSTree: each GPU heads 1/8 of the data and sends
    # S/8 to its peer head over its own NIC (each way): the network caps the algbw at 8 x 25 GB/s x 0.9 = 180 GB/s,
    # below the kernel link (NCCL's NVLSTree algbw, 204.8 GB/s) and NVLink (each GPU sends 1.25 S at 450 GB/s)
    c = ClusterConfig(gpu="h100-sxm", num_gpus=16, nic_gbps=200)
    layout = group_layout(c, H100, 16, 1)
    model = cost_model(Coll.ALLREDUCE, layout)
    a, p = Algo.NVLS_TREE, Proto.SIMPLE
    B = 8 * 25e9 * NET_BW_EFFICIENCY
    assert B < model.algbw_Bps[a, p]
    r = run_collective(c, H100, "allreduce", GiB, list(range(16)))
    assert (r.algo, r.proto) == ("NVLSTree", "Simple")
    # S / B + NCCL's latency (66.8 us) + small-chunk cost (0 at 128 KiB chunks) = 6.032 ms; the 81 merged chunk
    # groups add ~0.8 % of pipeline fill over the 8-transfer path of a chunk, within the 2 % tolerance
    expected = GiB / B + model.latency_s[a, p] + nvls_chunk_overhead_s(model, GiB)
    assert r.time_s == pytest.approx(expected, rel=0.02)


def test_uncontended_pat_equals_closed_form():
    # 8 hosts x 1 H100 x one 400 Gb/s NIC: NCCL picks PAT for a 1 MiB AllGather/ReduceScatter. Each rank sends
    # 7/8 S over 3 steps (1, 2, 4 blocks); the kernel link (NCCL's PAT algbw x 7/8 = 31.5 GB/s of sends) is below
    # the NIC (45 GB/s), so the time is S / algbw + NCCL's PAT latency (8 + 3 x interLat / 3.5 + 8 x 2.8 us)
    c = ClusterConfig(gpu="h100-sxm", num_gpus=8, gpus_per_node=1, nics_per_node=1)
    layout = group_layout(c, H100, 8, 1)
    for op, coll in (("allgather", Coll.ALLGATHER), ("reducescatter", Coll.REDUCESCATTER)):
        model = cost_model(coll, layout)
        r = run_collective(c, H100, op, 2**20, list(range(8)))
        est = predict(op, 2**20, layout)
        assert (r.algo, r.proto) == (est.algo, est.proto) == ("PAT", "Simple")
        expected = 2**20 / model.algbw_Bps[Algo.PAT, Proto.SIMPLE] + model.latency_s[Algo.PAT, Proto.SIMPLE]
        assert r.time_s == pytest.approx(expected, rel=0.01)


def test_flow_engine_follows_nccl_to_nvlstree():
    # 2 DGX H100 hosts: NCCL runs Tree at small sizes and NVLSTree from ~8 MiB (the analytic model's choice);
    # the flow engine has plans for both and reports the same choice at every size
    c = ClusterConfig(gpu="h100-sxm", num_gpus=16)
    layout = group_layout(c, H100, 16, 1)
    picks = []
    for size in (2**16, 2**20, 2**24, 2**28):
        r = run_collective(c, H100, "allreduce", size, list(range(16)))
        est = predict("allreduce", size, layout)
        assert (r.algo, r.proto) == (est.algo, est.proto)
        picks.append(r.algo)
    assert picks[-1] == "NVLSTree"


def test_two_groups_on_one_nic_each_get_half():
    # 2 hosts x 2 GPUs, one 100 Gb/s NIC per host; groups {0, 2} and {1, 3} both cross the same NICs
    c = ClusterConfig(gpu="h100-sxm", num_gpus=4, gpus_per_node=2, nics_per_node=1, nic_gbps=100)
    alone = run_collective(c, H100, "allreduce", GiB, [0, 2], algo="ring", proto="simple")
    both = run_collective(c, H100, "allreduce", GiB, [0, 2], algo="ring", proto="simple", concurrent_groups=[[1, 3]])
    assert both.group_time_s[0] == pytest.approx(both.group_time_s[1])
    assert both.time_s / alone.time_s == pytest.approx(2.0, rel=0.05)
    assert alone.busbw_Bps == pytest.approx(12.5e9 * NET_BW_EFFICIENCY, rel=0.02)


def test_flow_engine_takes_the_nccl_release_choice():
    # one A100 node, 2 MiB AllReduce: NCCL 2.18 ranks Ring/LL at 1/4 of the bus bandwidth and picks LL128;
    # 2.21+ ranks LL at 1/2 and picks it (docs/NCCL.md, NCCL releases); the flow engine follows the choice
    c = ClusterConfig(gpu="a100-sxm4-80gb", num_gpus=8, gpus_per_node=8)
    a100 = get_gpu("a100-sxm4-80gb")
    picks = {v: run_collective(c, a100, "allreduce", 2**21, list(range(8)), nccl_version=v) for v in ("2.18.5", "2.30.7")}
    assert [(r.algo, r.proto) for r in picks.values()] == [("Ring", "LL128"), ("Ring", "LL")]
    for v, r in picks.items():
        est = predict("allreduce", 2**21, group_layout(c, a100, 8, 1, nccl_version=v))
        assert (r.algo, r.proto) == (est.algo, est.proto)


def test_oversubscription_slows_cross_leaf_ring():
    # radix 4: leaves of 2 hosts with 2 up-ports (bundled, ecmp='ideal'); rings {0, 2} and {1, 3} cross leaves,
    # so each leaf sends 2 NICs' worth up. 1:1 -> up-link = 2 NICs, no slowdown; 2:1 -> 1 NIC, time x 2
    times = []
    for over in (1.0, 2.0):
        c = ClusterConfig(gpu="h100-sxm", num_gpus=4, gpus_per_node=1, nics_per_node=1, nic_gbps=100, switch_radix=4,
                          ecmp="ideal", oversubscription=over)
        times.append(run_collective(c, H100, "allreduce", GiB, [0, 2], algo="ring", proto="simple",
                                    concurrent_groups=[[1, 3]]).time_s)
    assert times[1] / times[0] == pytest.approx(2.0, rel=0.05)


def test_dp_groups_on_disjoint_rails_run_as_one():
    # 4 DGX H100 hosts; the 8 DP groups (stride 8) each use their own NIC rail: no sharing, equal times
    c = ClusterConfig(gpu="h100-sxm", num_gpus=32)
    one = run_collective(c, H100, "allreduce", 256 * 2**20, strided_groups(4, 8)[0])
    all8 = run_collective(c, H100, "allreduce", 256 * 2**20, strided_groups(4, 8)[0], concurrent_groups=8)
    np.testing.assert_allclose(all8.group_time_s, one.time_s, rtol=1e-6)
    assert all8.n_transfers == 8 * one.n_transfers


def test_merged_plan_within_one_percent_of_unmerged():
    c = ClusterConfig(gpu="h100-sxm", num_gpus=16)
    kw = dict(algo="ring", proto="simple")
    full = run_collective(c, H100, "allreduce", GiB, list(range(16)), max_transfers=10**6, **kw)
    merged = run_collective(c, H100, "allreduce", GiB, list(range(16)), max_transfers=500, **kw)
    assert merged.n_transfers < full.n_transfers / 10
    assert merged.time_s == pytest.approx(full.time_s, rel=0.01)


# (file, section, cluster, nodes, gpu, cpu, algo): the H100 single-node ring and MI325X multi-node ring datasets
DATASETS = [
    ("h100_8gpu_allreduce_ring_together.txt", 0, 1, "h100-sxm", "intel", "ring"),
    ("mi300x_mi325x_rccl_allreduce_1to8nodes_hisohara.txt", 3, 2, "mi325x", "amd", "ring"),
    ("mi300x_mi325x_rccl_allreduce_1to8nodes_hisohara.txt", 4, 4, "mi325x", "amd", "ring"),
    ("mi300x_mi325x_rccl_allreduce_1to8nodes_hisohara.txt", 5, 8, "mi325x", "amd", "ring"),
]


@pytest.mark.parametrize("name,section,nodes,gpu,cpu,algo", DATASETS)
def test_flow_engine_agrees_with_analytic_on_large_sizes(shared_data, name, section, nodes, gpu, cpu, algo):
    c = ClusterConfig(gpu=gpu, num_gpus=8 * nodes, cpu=cpu)
    spec = get_gpu(gpu)
    log = read_nccl_tests(shared_data / "nccl-tests" / name, n_ranks=c.num_gpus)
    analytic = compare_nccl_tests(log, group_layout(c, spec, c.num_gpus, 1), algo=algo, sections=[section])
    flow = flow_comparison(analytic, c, spec, algo=algo)
    big = analytic.rows["size_bytes"] >= 64 * 2**20
    assert big.sum() >= 3
    ratio = flow.rows["predicted_time_s"][big] / analytic.rows["predicted_time_s"][big]
    assert np.all(np.abs(ratio - 1) <= 0.15), ratio.tolist()
    assert set(flow.rows["algo"][big]) == {"Ring"}


@pytest.mark.parametrize("kwargs,field", [
    (dict(op="allsum"), "op"),
    (dict(size_bytes=-1), "size_bytes"),
    (dict(algo="nvlstree"), "algo"),  # one node: NCCL has no NVLSTree
    (dict(algo="collnet"), "algo"),  # no plan (in-network reduction)
    (dict(group_ranks=[0, 1, 3]), "group_ranks"),
    (dict(group_ranks=[0, 99]), "group_ranks"),
    (dict(concurrent_groups=[[1, 2]]), "concurrent_groups"),
    (dict(concurrent_groups=0), "concurrent_groups"),
])
def test_bad_input_names_the_field(kwargs, field):
    c = ClusterConfig(gpu="h100-sxm", num_gpus=16)
    args = dict(op="allreduce", size_bytes=GiB, group_ranks=[0, 1])
    args.update(kwargs)
    with pytest.raises(ConfigError) as err:
        run_collective(c, H100, args.pop("op"), args.pop("size_bytes"), args.pop("group_ranks"), **args)
    assert err.value.field == field


def test_cli_engine_flow(shared_data):
    r = CliRunner().invoke(main, ["collective", "--op", "allreduce", "--cluster", "dgx-h100", "--nodes", "2",
                                  "--sizes", "256M", "--algo", "ring", "--engine", "flow", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    row = out["rows"][0]
    assert out["engine"] == "flow" and (row["algo"], row["proto"]) == ("Ring", "Simple")
    # 8 rails x 50 GB/s x NET_BW_EFFICIENCY = 360 GB/s of ring bus bandwidth, less latency: > 340 GB/s
    assert 340e9 < row["busbw_Bps"] <= 360e9
    log = shared_data / "nccl-tests" / "h100_8gpu_allreduce_ring_together.txt"
    r = CliRunner().invoke(main, ["validate-nccl", str(log), "--cluster", "dgx-h100", "--algo", "ring",
                                  "--engine", "flow"])
    assert r.exit_code == 0, r.output
    assert "sizes >= 1 MiB: 14 rows" in r.output
    r = CliRunner().invoke(main, ["collective", "--op", "allreduce", "--cluster", "dgx-h100", "--sizes", "1M",
                                  "--algo", "nvlstree", "--engine", "flow"])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "algo:" in r.output


def test_plans_of_one_structure_share_their_routes():
    """Two sizes whose plans have the same transfers (endpoints, channels) reuse one routing; the times are
    those of routing afresh."""
    from flowsim.network import collective_flows as cf

    cluster, gpu = ClusterConfig(gpu="h100-sxm", num_gpus=32, name="dgx-h100"), get_gpu("h100-sxm")
    groups = np.array([list(range(32))])
    a = cf._prepare(cluster, gpu, "allreduce", 2.0**10, groups, "tree", "ll", True, 8192)
    b = cf._prepare(cluster, gpu, "allreduce", 2.0**11, groups, "tree", "ll", True, 8192)
    assert np.array_equal(a.plan.src, b.plan.src) and a.plan.payload_bytes[0] != b.plan.payload_bytes[0]
    assert b.links is a.links and b.ptr is a.ptr  # one routing
    shared = run_collective(cluster, gpu, "allreduce", 2.0**11, list(range(32)), algo="tree", proto="ll").time_s
    cf._ROUTES.clear()
    cf._PREPARED.clear()
    assert run_collective(cluster, gpu, "allreduce", 2.0**11, list(range(32)), algo="tree", proto="ll").time_s \
        == shared


def _connected_fixed_point(n_links, own, after, focus):
    """The slow reference of ``collective_flows._connected``: grow the kept set until no collective outside it
    shares a link or an ``after`` ordering with one inside."""
    n = len(own)
    keep = np.isin(np.arange(n), list(focus))
    while True:
        used = np.zeros(n_links, dtype=bool)
        for i in np.flatnonzero(keep):
            used[own[i]] = True
        new = keep.copy()
        for i in range(n):
            new[i] |= bool(used[own[i]].any()) or (after[i] is not None and keep[after[i]])
            if after[i] is not None and keep[i]:
                new[after[i]] = True
        if (new == keep).all():
            return keep
        keep = new


def test_connected_collectives_equal_the_fixed_point():
    """``_connected`` (one union-find pass) keeps exactly the collectives the fixed point keeps, on random link sets,
    orderings and focus sets."""
    from types import SimpleNamespace

    from flowsim.network.collective_flows import _connected

    rng = np.random.default_rng(7)
    for _ in range(300):
        n, n_links = int(rng.integers(1, 9)), int(rng.integers(1, 40))
        own = [np.unique(rng.integers(0, n_links, int(rng.integers(0, 4)))) for _ in range(n)]
        after = [int(rng.integers(0, i)) if i and rng.random() < 0.3 else None for i in range(n)]
        focus = sorted(set(rng.integers(0, n, int(rng.integers(0, n + 1))).tolist()))
        got = _connected(SimpleNamespace(n_links=n_links), [SimpleNamespace(net_links=o) for o in own], after, focus)
        assert got.tolist() == _connected_fixed_point(n_links, own, after, focus).tolist()
