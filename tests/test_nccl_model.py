"""Known answers of the NCCL 2.30.7 model: graphs, closed-form times, selection, overrides, errors."""
import math

import pandas as pd
import pytest

from flowsim.errors import ConfigError
from flowsim.nccl_models import CommLayout, busbw_factor, cost_table, parse_override, predict
from flowsim.nccl_models.constants import Algo, Coll, Proto
from flowsim.nccl_models.execution import NVLS_CHUNK_OVERHEAD_S, NVLS_FILL_CHUNKS, NET_BW_EFFICIENCY
from flowsim.nccl_models.graph import graphs_of
from flowsim.nccl_models.tuning import cost_model

GB = 1e9
MiB = 2**20
US = 1e-6

# Datasheet figures (per GPU, per direction): H100/H200 SXM 18 NVLink4 links, 450 GB/s; A100 SXM 12 NVLink3
# links, 300 GB/s; B200 18 NVLink5 links, 900 GB/s. NICs: ConnectX-7 400 Gb/s = 50 GB/s, HDR 200 Gb/s = 25 GB/s.
H100 = dict(compute_capability=90, scaleup_Bps=450e9, scaleup_links=18, nvls=True)
A100 = dict(compute_capability=80, scaleup_Bps=300e9, scaleup_links=12, pcie_Bps=32e9)
B200 = dict(compute_capability=100, scaleup_Bps=900e9, scaleup_links=18, nvls=True)


def h100(n_nodes=1, **kw):
    return CommLayout(8 * n_nodes, n_nodes, nics_per_node=8, nic_Bps=50e9, **{**H100, **kw})


# --- graphs (research notes section 1.8) ------------------------------------------------------------

@pytest.mark.parametrize("layout, channels, bw_GBps", [
    (CommLayout(8, 1, **A100), 12, 20.0),          # 240 GB/s: 6 x 40 -> dup 12 x 20
    (h100(), 12, 30.0),                              # 18 x 20.6 = 370.8: 6 x 60 -> dup 12 x 30
    (CommLayout(8, 1, **B200), 16, 45.0),           # 18 x 40.1 = 721.8: 8 x 90 -> dup 16 x 45
    (h100(2), 8, 48.0),                              # 1 channel per 400G NIC at 48 (PCIe Gen5 48), no dup
    (CommLayout(16, 2, nics_per_node=8, nic_Bps=25e9, **A100), 8, 24.0),  # HDR: 8 x 24, bwIntra < 25: no dup
])
def test_ring_graph_matches_nccl_logs(layout, channels, bw_GBps):
    g = graphs_of(layout).ring
    assert (g.n_channels, g.bw_intra_Bps / GB) == (channels, bw_GBps)


def test_h100_nvls_graph_and_channels():
    g = graphs_of(h100())
    assert (g.nvls.n_channels, g.nvls.bw_intra_Bps / GB) == (8, 60.0)  # 8 heads x 60
    assert g.exec_channels == 24 and g.nvls_exec_channels == 16
    assert graphs_of(h100(2)).exec_channels == 16


# --- closed forms -----------------------------------------------------------------------------------

def test_ring_allreduce_closed_form_one_node():
    n, S = 8, 2**30
    est = predict("allreduce", S, h100(), algo="ring", proto="simple")
    lat = (8.4 + 2 * (n - 1) * 3.4) * US           # baseLat Ring/Simple + 14 NVLink hops of 3.4 us = 56 us
    bus = 12 * 30 * GB                              # 12 channels x 30 GB/s = 360 GB/s
    assert est.nccl_model_time_s == pytest.approx(2 * (n - 1) / n * S / bus + lat, rel=1e-12)
    # Pipeline fill: one 1 MiB slice (2 MiB chunk / 2) at the per-channel bus rate 360 GB/s / 24 channels.
    fill = MiB / (bus / 24)
    assert est.time_s == pytest.approx(2 * (n - 1) / n * S / bus + lat + fill, rel=1e-12)
    assert est.busbw_Bps == pytest.approx(S / est.time_s * 2 * (n - 1) / n)


def test_ring_allreduce_closed_form_two_nodes():
    n, S = 16, 2**30
    est = predict("allreduce", S, h100(2), algo="ring", proto="simple")
    # 28 NVLink steps of 3.4 us + 2 network steps of 14 us + 8.4 base = 131.6 us, x1.4 ring plateau (SM >= 80)
    lat = (8.4 + 28 * 3.4 + 2 * 14.0) * 1.4 * US
    bus = 8 * 48 * GB                                # 8 channels x 48 GB/s = 384 GB/s
    assert est.nccl_model_time_s == pytest.approx(2 * (n - 1) / n * S / bus + lat, rel=1e-12)
    fill = MiB / (bus * NET_BW_EFFICIENCY / 16)     # 1 MiB slice, 16 channels, network efficiency
    assert est.time_s == pytest.approx(2 * (n - 1) / n * S / (bus * NET_BW_EFFICIENCY) + lat + fill, rel=1e-12)


def test_nvls_allreduce_closed_form():
    n, S = 8, 2**30
    est = predict("allreduce", S, h100(), algo="nvls")
    # busBw = 8 heads x min(60 * 0.85 * 7/8 * 2, 60) = 480 GB/s; algbw = 480 * n / (2(n-1)); latency 25 us
    algbw = 480 * GB * n / (2 * (n - 1))
    assert est.nccl_model_time_s == pytest.approx(25 * US + S / algbw, rel=1e-12)
    # 1 GiB >= 64 x 16 channels x 8 heads x 128 KiB: default 128 KiB chunk, no chunk overhead; fill 11 chunks
    fill = NVLS_FILL_CHUNKS * 128 * 1024 / (algbw / 16)
    assert est.time_s == pytest.approx(25 * US + S / algbw + fill, rel=1e-12)
    small = predict("allreduce", 4 * MiB, h100(), algo="nvls")
    chunk = 16 * 1024  # 4 MiB < 2 x 128 x 32 KiB: 16 KiB chunks
    extra = 4 * MiB / 16 * (1 / chunk - 1 / (128 * 1024)) * NVLS_CHUNK_OVERHEAD_S
    assert small.time_s == pytest.approx(25 * US + 4 * MiB / algbw + NVLS_FILL_CHUNKS * chunk / (algbw / 16) + extra)


def test_allgather_ring_uses_total_buffer():
    n, S = 8, 2**30  # nccl-tests size: total gathered bytes
    est = predict("allgather", S, h100(), algo="ring", proto="simple")
    lat = (8.4 + (n - 1) * 3.4) * US
    assert est.nccl_model_time_s == pytest.approx((n - 1) / n * S / (360 * GB) + lat, rel=1e-12)


@pytest.mark.parametrize("op, factor", [
    ("allreduce", 2 * 7 / 8), ("allgather", 7 / 8), ("reducescatter", 7 / 8), ("alltoall", 7 / 8),
    ("broadcast", 1.0), ("reduce", 1.0), ("sendrecv", 1.0)])
def test_busbw_factors(op, factor):
    assert busbw_factor(op, 8) == pytest.approx(factor)
    est = predict(op, 64 * MiB, h100())
    assert est.busbw_Bps == pytest.approx(est.algbw_Bps * factor)
    assert est.algbw_Bps == pytest.approx(64 * MiB / est.time_s)


def test_alltoall_closed_form_two_nodes():
    S = 2**30
    from flowsim.nccl_models.execution import ALLTOALL_NET_EFFICIENCY
    est = predict("alltoall", S, h100(2))
    # half of each rank's buffer goes to the other node; 8 ranks share 8 x 50 GB/s NICs
    t_net = 8 / 16 * S / (8 * 50e9 * ALLTOALL_NET_EFFICIENCY / 8)
    assert est.time_s == pytest.approx((8.4 + 14.0) * US + t_net, rel=1e-12)
    assert (est.algo, est.runner_up_algo) == ("P2P", None) and est.runner_up_reason


# --- selection ----------------------------------------------------------------------------------------

def test_h100_one_node_switches_ring_ll_to_nvls_simple_between_1_and_2_MiB():
    # NVIDIA's public observation: "8B~1MB Ring LL, 2MB~16GB NVLS Simple" on one H100 node.
    for size in (8, 64 * 1024, MiB):
        assert (predict("allreduce", size, h100()).algo, predict("allreduce", size, h100()).proto) == ("Ring", "LL")
    for size in (2 * MiB, 64 * MiB, 2**34):
        assert (predict("allreduce", size, h100()).algo, predict("allreduce", size, h100()).proto) == ("NVLS", "Simple")


def test_runner_up_is_second_in_ncclmodel_ranking():
    est = predict("allreduce", MiB, h100())
    table = cost_table("allreduce", MiB, h100())
    second = table[table["rank"] == 2].iloc[0]
    assert (est.runner_up_algo, est.runner_up_proto) == (second["algo"], second["proto"])
    assert est.runner_up_time_s == pytest.approx(second["time_s"])


def test_cost_table_lists_every_entry_with_reason():
    table = cost_table("allreduce", MiB, CommLayout(8, 1, **A100))
    assert len(table) == 7 * 3
    nvls = table[(table["algo"] == "NVLS") & (table["proto"] == "Simple")].iloc[0]
    assert math.isnan(nvls["time_s"]) and "NVSwitch" in nvls["unavailable_reason"]
    ring = table[(table["algo"] == "Ring") & (table["proto"] == "LL")].iloc[0]
    assert pd.isna(ring["unavailable_reason"]) and ring["rank"] == 1


def test_availability_rules():
    m = cost_model(Coll.ALLREDUCE, h100())
    assert m.reason[Algo.NVLS_TREE][Proto.SIMPLE] == "NVLSTree needs several nodes"
    assert m.reason[Algo.PAT][Proto.SIMPLE] == "PAT runs AllGather/ReduceScatter only"
    m2 = cost_model(Coll.ALLREDUCE, h100(2))
    assert "CollNet" in m2.reason[Algo.NVLS][Proto.SIMPLE] and m2.reason[Algo.NVLS_TREE][Proto.SIMPLE] is None
    pcie = CommLayout(4, 1, compute_capability=89, scaleup_Bps=0.0, scaleup_links=0, scaleup_kind="pcie")
    assert "LL128" in cost_model(Coll.ALLREDUCE, pcie).reason[Algo.RING][Proto.LL128]
    assert cost_model(Coll.BROADCAST, h100()).reason[Algo.TREE][Proto.SIMPLE] == "Broadcast and Reduce run Ring only"


def test_pat_runs_with_one_rank_per_node():
    layout = CommLayout(4, 4, nics_per_node=1, nic_Bps=50e9, **H100)
    est = predict("allgather", 64 * MiB, layout, algo="pat")
    # PAT latency: 8 + log2(4) * 14 / 3.5 + 4 * 2.8 = 27.2 us (NET Tree/Simple hop: one rank per node)
    assert cost_model(Coll.ALLGATHER, layout).latency_s[Algo.PAT, Proto.SIMPLE] == pytest.approx(27.2 * US)
    assert est.algo == "PAT"


def test_single_rank_moves_nothing():
    est = predict("allreduce", MiB, CommLayout(1, 1, **H100))
    assert (est.time_s, est.algo, est.runner_up_reason) == (0.0, "none", "a single rank moves no data")


# --- overrides --------------------------------------------------------------------------------------

def test_override_syntax():
    assert parse_override("ring,tree", "allreduce", "algo") == {Algo.RING, Algo.TREE}
    assert Algo.NVLS not in parse_override("^nvls", "allreduce", "algo")
    assert parse_override("allreduce:tree;allgather:^pat", "allreduce", "algo") == {Algo.TREE}
    assert Algo.PAT not in parse_override("allreduce:tree;allgather:^pat", "allgather", "algo")
    assert parse_override("LL128", "allreduce", "proto") == {Proto.LL128}
    assert parse_override("collnet", "allreduce", "algo") == {Algo.COLLNET_DIRECT, Algo.COLLNET_CHAIN}


def test_override_forces_protocol():
    assert predict("allreduce", 2**30, h100(), proto="ll").proto == "LL"


@pytest.mark.parametrize("text, kind, message", [
    ("ring,foo", "algo", "algo: unknown algorithm 'foo'"),
    ("ll256", "proto", "proto: unknown protocol 'll256'"),
    ("allgathr:ring", "algo", "algo: unknown collective 'allgathr'"),
    ("^", "algo", "algo: empty list"),
])
def test_override_errors_name_the_token(text, kind, message):
    with pytest.raises(ConfigError, match=message):
        parse_override(text, "allreduce", kind)


# --- bad input -----------------------------------------------------------------------------------------

def test_forced_impossible_algorithms():
    with pytest.raises(ConfigError, match="NVLS: NVLS needs NVSwitch with NVLink SHARP and SM >= 90"):
        predict("allreduce", MiB, CommLayout(8, 1, **A100), algo="nvls")
    with pytest.raises(ConfigError, match="PAT: PAT needs one rank per node"):
        predict("allgather", MiB, h100(2), algo="pat")
    with pytest.raises(ConfigError, match="alltoall is point-to-point"):
        predict("alltoall", MiB, h100(), algo="ring")


@pytest.mark.parametrize("size", [0, -8, float("nan"), "big"])
def test_bad_sizes(size):
    with pytest.raises(ConfigError, match="size_bytes: must be"):
        predict("allreduce", size, h100())


def test_unknown_op():
    with pytest.raises(ConfigError, match="op: must be one of allreduce, allgather"):
        predict("allreduce_sum", MiB, h100())


@pytest.mark.parametrize("kwargs, message", [
    (dict(n_ranks=12, n_nodes=5), "n_nodes: must divide n_ranks"),
    (dict(n_ranks=16, n_nodes=2, nics_per_node=0), "nics_per_node: must be >= 1"),
    (dict(n_ranks=8, n_nodes=1, vendor="intel"), "vendor: must be one of nvidia, amd"),
    (dict(n_ranks=0, n_nodes=1), "n_ranks: must be a positive integer"),
])
def test_layout_validation(kwargs, message):
    base = dict(H100, nic_Bps=50e9, nics_per_node=8)
    with pytest.raises(ConfigError, match=message):
        CommLayout(**{**base, **kwargs})


def test_public_functions_document_every_parameter():
    import importlib
    import inspect

    from flowsim.network import comm_layout
    from flowsim.network.comm_layout import closest_nics, group_layout
    from flowsim.nccl_models import execution, graph, p2p, tuning, versions
    from flowsim.validation import nccl_tests
    cli = importlib.import_module("flowsim.cli.collective")  # flowsim.cli.collective is also the command's name
    funcs = [predict, cost_table, busbw_factor, parse_override, group_layout, closest_nics, graph.graphs_of,
             tuning.cost_model, tuning.nccl_time_s, execution.pipeline_fill_s, nccl_tests.read_nccl_tests,
             nccl_tests.compare_nccl_tests, nccl_tests.summarize, cli.parse_size, cli.parse_sizes,
             comm_layout.preset_cluster,
             comm_layout.preset_layout, p2p.alltoall_time_s, p2p.sendrecv_time_s, execution.run_channels,
             execution.exec_time_s, execution.execution_layout, versions.parse_nccl_version,
             versions.version_from_code, nccl_tests.nccl_version_of]
    for f in funcs:
        doc = inspect.getdoc(f) or ""
        for name in inspect.signature(f).parameters:
            assert name in doc, f"{f.__module__}.{f.__name__} does not document {name}"


def test_broadcast_chain_fill_closed_form():
    n, S = 8, 2**30
    est = predict("broadcast", S, h100())
    assert est.n_ranks == n
    assert (est.algo, est.proto) == ("Ring", "Simple")
    # Ring Broadcast on one NVSwitch node (same channels): latency 8.4 + one 3.4 us hop; busBw 360 GB/s = algbw.
    # Chain fill: n - 2 = 6 chunks of one 512 KiB step at 360 GB/s / 24 channels.
    lat = (8.4 + 3.4) * US
    assert est.time_s == pytest.approx(lat + S / (360 * GB) + (n - 2) * 512 * 1024 / (360 * GB / 24), rel=1e-12)
