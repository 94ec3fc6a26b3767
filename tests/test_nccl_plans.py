"""Plans of point-to-point transfers (flowsim.nccl_models.plans): bytes, structure, merging, bad input."""
from __future__ import annotations

import numpy as np
import pytest

from flowsim.errors import ConfigError
from flowsim.nccl_models import CommLayout
from flowsim.nccl_models.constants import Algo, Coll, Proto
from flowsim.nccl_models.execution import nvls_chunk_overhead_s, pipeline_fill_s
from flowsim.nccl_models.tuning import cost_model
from flowsim.nccl_models.plans import build_plan
from flowsim.nccl_models.rank_orders import btree_parent, dtree_parent
from flowsim.nccl_models.switch_plans import SWITCH, nvls_heads

ONE_NODE = CommLayout(n_ranks=8, n_nodes=1, compute_capability=90, scaleup_Bps=450e9, scaleup_links=18, nvls=True)
TWO_NODES = CommLayout(n_ranks=16, n_nodes=2, compute_capability=90, scaleup_Bps=450e9, scaleup_links=18,
                       nvls=True, nics_per_node=8, nic_Bps=50e9)
FOUR_NODES_DP = CommLayout(n_ranks=4, n_nodes=4, compute_capability=90, scaleup_Bps=450e9, scaleup_links=18,
                           nics_per_node=1, nic_Bps=50e9)
FOUR_NODES_4_NICS = CommLayout(n_ranks=32, n_nodes=4, compute_capability=90, scaleup_Bps=450e9, scaleup_links=18,
                               nvls=True, nics_per_node=4, nic_Bps=50e9)
LAYOUTS = [ONE_NODE, TWO_NODES, FOUR_NODES_DP]
S = 256 * 2**20


def _longest_chain(plan) -> int:
    """Transfers on the longest dependency chain (Kahn's order; also proves the plan is acyclic)."""
    n = plan.n_transfers
    deps = [plan.dep_idx[plan.dep_ptr[t]:plan.dep_ptr[t + 1]] for t in range(n)]
    depth = np.zeros(n, dtype=np.int64)
    left = np.diff(plan.dep_ptr).copy()
    users = [[] for _ in range(n)]
    for t, d in enumerate(deps):
        for x in d:
            users[x].append(t)
    todo = list(np.flatnonzero(left == 0))
    seen = 0
    while todo:
        t = todo.pop()
        seen += 1
        depth[t] = 1 + max((depth[x] for x in deps[t]), default=0)
        for u in users[t]:
            left[u] -= 1
            if left[u] == 0:
                todo.append(u)
    assert seen == n, "dependency cycle"
    return int(depth.max())


@pytest.mark.parametrize("layout", LAYOUTS, ids=["1x8", "2x8", "4x1"])
@pytest.mark.parametrize("proto", ["LL", "LL128", "Simple"])
def test_ring_bytes_match_nccl_tests_bus_factors(layout, proto):
    n = layout.n_ranks
    ar = build_plan("allreduce", S, layout, "Ring", proto)
    ag = build_plan("allgather", S, layout, "Ring", proto)
    rs = build_plan("reducescatter", S, layout, "Ring", proto)
    # every rank sends (and receives) 2(n-1)/n x S in AllReduce, (n-1)/n x S in AllGather/ReduceScatter
    np.testing.assert_allclose(ar.sent_bytes(), 2 * (n - 1) / n * S)
    np.testing.assert_allclose(ar.received_bytes(), 2 * (n - 1) / n * S)
    np.testing.assert_allclose(ag.sent_bytes(), (n - 1) / n * S)
    np.testing.assert_allclose(rs.sent_bytes(), (n - 1) / n * S)
    assert ar.wire_factor == {"LL": 2.0, "LL128": 128 / 120, "Simple": 1.0}[proto]


@pytest.mark.parametrize("layout", LAYOUTS, ids=["1x8", "2x8", "4x1"])
def test_chain_tree_p2p_bytes(layout):
    n = layout.n_ranks
    bc = build_plan("broadcast", S, layout, "Ring", "Simple")
    rd = build_plan("reduce", S, layout, "Ring", "Simple")
    # chain: every rank but the last forwards S (busbw factor 1); root 0 sends S, receives nothing
    assert bc.sent_bytes().sum() == pytest.approx((n - 1) * S)
    assert bc.sent_bytes()[0] == pytest.approx(S) and bc.received_bytes()[0] == 0
    np.testing.assert_allclose(np.delete(rd.sent_bytes(), 0), S)  # every rank but the root sends S once
    assert rd.sent_bytes()[0] == 0
    tree = build_plan("allreduce", S, layout, "Tree", "Simple")
    # n - 1 tree edges per tree, each carrying S up (reduce) and S down (broadcast)
    assert tree.sent_bytes().sum() == pytest.approx(2 * (n - 1) * S)
    assert tree.received_bytes().sum() == pytest.approx(tree.sent_bytes().sum())
    a2a = build_plan("alltoall", S, layout, "P2P", "Simple")
    np.testing.assert_allclose(a2a.sent_bytes(), (n - 1) / n * S)  # S/n to each of n - 1 peers
    sr = build_plan("sendrecv", S, layout, "P2P", "Simple")
    np.testing.assert_allclose(sr.sent_bytes(), S)


def test_nvls_each_gpu_moves_about_s_through_the_switch():
    plan = build_plan("allreduce", S, ONE_NODE, "NVLS", "Simple")
    up = plan.dst == SWITCH
    down = plan.src == SWITCH
    barrier = up & down
    assert np.all(plan.payload_bytes[barrier] == 0)
    np.testing.assert_allclose(np.bincount(plan.src[up & ~barrier], plan.payload_bytes[up & ~barrier]), S)
    np.testing.assert_allclose(np.bincount(plan.dst[down & ~barrier], plan.payload_bytes[down & ~barrier]), S)


def _through_switch(plan):
    """(bytes each rank sends up to its switch, bytes each rank receives from it, bytes each rank sends to a GPU)."""
    n = plan.n_ranks
    up = (plan.dst == SWITCH) & (plan.src >= 0)
    down = (plan.src == SWITCH) & (plan.dst >= 0)
    net = (plan.src >= 0) & (plan.dst >= 0)
    return (np.bincount(plan.src[up], plan.payload_bytes[up], minlength=n),
            np.bincount(plan.dst[down], plan.payload_bytes[down], minlength=n),
            np.bincount(plan.src[net], plan.payload_bytes[net], minlength=n))


@pytest.mark.parametrize("max_transfers", [8192, 300], ids=["pipelined", "streamed"])
def test_nvlstree_bytes_per_gpu(max_transfers):
    # 2 nodes x 8 GPUs, 8 NICs -> 8 heads (every GPU heads 1/8 of the data). Known answer (research notes 1.7):
    # each GPU sends its S up to the switch and S/8 (its reduced share) up again; gets its share S/8 and the
    # result S down; over the network it sends S/8 to its peer head (2 nodes: the two trees exchange S/16 each way)
    plan = build_plan("allreduce", S, TWO_NODES, "NVLSTree", "Simple", max_transfers=max_transfers)
    up, down, net = _through_switch(plan)
    np.testing.assert_allclose(up, S + S / 8)
    np.testing.assert_allclose(down, S + S / 8)
    np.testing.assert_allclose(net, S / 8)
    np.testing.assert_allclose(plan.received_bytes() - down, S / 8)
    if max_transfers == 300:  # 100 transfers per chunk group -> 3 groups < 4 per hop: a stream
        assert plan.dep_idx.size == 0 and plan.critical_path == 1
    else:
        assert plan.critical_path == _longest_chain(plan)


def test_nvlstree_heads_one_per_nic():
    # 4 nodes x 8 GPUs, 4 NICs: heads are local ranks 0, 2, 4, 6, each reducing S/4; the others only send S up and
    # get S down. Across nodes each head index runs the double binary tree over 4 nodes: an edge carries S/8 per
    # direction (half the share per tree); a head sends S/8 x (1 up in one tree + its children down) in total,
    # and the 4 heads of an index send 2 trees x 3 edges x 2 directions x S/8 = 3/2 S together
    plan = build_plan("allreduce", S, FOUR_NODES_4_NICS, "NVLSTree", "Simple")
    heads = nvls_heads(FOUR_NODES_4_NICS, 4)
    assert heads[1].tolist() == [8, 10, 12, 14]
    up, down, net = _through_switch(plan)
    is_head = np.isin(np.arange(32), heads)
    np.testing.assert_allclose(up, np.where(is_head, S + S / 4, S))
    np.testing.assert_allclose(down, np.where(is_head, S + S / 4, S))
    assert np.all(net[~is_head] == 0)
    np.testing.assert_allclose(net[heads[:, 0]].sum(), 1.5 * S)
    assert plan.critical_path == _longest_chain(plan)


@pytest.mark.parametrize("n", [2, 5, 8])
@pytest.mark.parametrize("op", ["allgather", "reducescatter"])
def test_pat_bytes_and_log_steps(op, n):
    # one rank per node; ceil(log2 n) steps of min(2^i, n - 2^i) blocks of S/n: every rank sends and receives
    # (n - 1)/n x S, as in a ring; one transfer per rank and step per loop group
    layout = CommLayout(n_ranks=n, n_nodes=n, compute_capability=90, scaleup_Bps=450e9, scaleup_links=18,
                        nics_per_node=1, nic_Bps=50e9)
    plan = build_plan(op, S, layout, "PAT", "Simple")
    np.testing.assert_allclose(plan.sent_bytes(), (n - 1) / n * S)
    np.testing.assert_allclose(plan.received_bytes(), (n - 1) / n * S)
    steps = int(np.ceil(np.log2(n)))
    groups = plan.n_transfers // (steps * n)
    assert plan.n_transfers == groups * steps * n
    assert plan.critical_path == _longest_chain(plan) == steps + groups - 1


def test_ring_chunking_and_loops_as_nccl():
    # 1 GiB on one H100 node: 24 channels, Simple chunk 2 MiB, loop = 8 ranks x 2 MiB x 24 = 384 MiB -> 3 loops;
    # 1 ring x 3 loops x 14 steps x 8 ranks = 336 transfers; critical path 14 steps + 2 further loops = 16
    plan = build_plan("allreduce", 2**30, ONE_NODE, "Ring", "Simple")
    assert plan.n_transfers == 336
    assert plan.critical_path == _longest_chain(plan) == 16
    # 256 KiB: chunk = 256 KiB / (24 x 8) < 2 MiB -> one loop of 14 steps
    small = build_plan("allreduce", 256 * 2**10, ONE_NODE, "Ring", "Simple")
    assert small.n_transfers == 14 * 8 and small.critical_path == 14


EIGHT_NODES_DP = CommLayout(n_ranks=8, n_nodes=8, compute_capability=90, scaleup_Bps=450e9, scaleup_links=18,
                            nics_per_node=1, nic_Bps=50e9)


@pytest.mark.parametrize("op,algo,layout", [
    ("allreduce", "Tree", TWO_NODES), ("broadcast", "Ring", TWO_NODES), ("reduce", "Ring", TWO_NODES),
    ("allreduce", "Ring", TWO_NODES), ("allreduce", "NVLS", ONE_NODE), ("allreduce", "NVLSTree", TWO_NODES),
    ("allreduce", "NVLSTree", FOUR_NODES_4_NICS), ("allgather", "PAT", EIGHT_NODES_DP),
    ("reducescatter", "PAT", EIGHT_NODES_DP)])
def test_critical_path_carries_nccls_latency_once(op, algo, layout):
    size = 8 * 2**20
    plan = build_plan(op, size, layout, algo, "Simple")
    assert plan.critical_path == _longest_chain(plan)
    coll = {"allreduce": Coll.ALLREDUCE, "broadcast": Coll.BROADCAST, "reduce": Coll.REDUCE,
            "allgather": Coll.ALLGATHER, "reducescatter": Coll.REDUCESCATTER}[op]
    a = {"Tree": Algo.TREE, "Ring": Algo.RING, "NVLS": Algo.NVLS, "NVLSTree": Algo.NVLS_TREE, "PAT": Algo.PAT}[algo]
    model = cost_model(coll, layout)
    expected = model.latency_s[a, Proto.SIMPLE]
    if algo in ("NVLS", "NVLSTree"):  # plus the analytic model's small-chunk cost (0 at 8 MiB: 128 KiB chunks)
        expected += nvls_chunk_overhead_s(model, size)
    if algo == "NVLS":  # and the calibrated single-node NVLS fill
        expected += pipeline_fill_s(model, layout, a, Proto.SIMPLE, size, model.algbw_Bps[a, Proto.SIMPLE])
    # base + (latency per transfer x transfers on the critical path) = NCCL's latency
    assert plan.base_latency_s + plan.latency_s[0] * plan.critical_path == pytest.approx(expected)


def test_streamed_tree_adds_the_fill_of_nccls_chunks():
    # 1 GiB Tree AllReduce on 2 nodes x 8, 16 channels: 1 GiB / 16 / 512 KiB = 128 chunks per channel. A budget of
    # 1,000 transfers allows 1000 // (2 x 16 trees x 15 edges) = 2 chunk groups < 4 per hop -> stream: one
    # transfer per edge and direction (2 x 16 x 15 = 480), no dependencies, fill = (depth - 1) chunks of 512 KiB
    plan = build_plan("allreduce", 2**30, TWO_NODES, "Tree", "Simple", max_transfers=1000)
    assert plan.n_transfers == 480 and plan.dep_idx.size == 0 and plan.critical_path == 1
    model = cost_model(Coll.ALLREDUCE, TWO_NODES)
    depth = 2 * (7 + 1)  # chain of 8 + one tree level, up and down
    assert model.graphs.exec_channels == 16
    per_channel_Bps = model.algbw_Bps[Algo.TREE, Proto.SIMPLE] / 16
    fill = (depth - 1) * 512 * 2**10 / per_channel_Bps
    step_lat = model.latency_s[Algo.TREE, Proto.SIMPLE] - plan.base_latency_s
    assert plan.latency_s[0] == pytest.approx(step_lat + fill)


def test_merging_keeps_bytes_and_caps_transfers():
    full = build_plan("allreduce", 2**30, TWO_NODES, "Ring", "Simple", max_transfers=10**7)
    merged = build_plan("allreduce", 2**30, TWO_NODES, "Ring", "Simple", max_transfers=1000)
    assert merged.n_transfers < full.n_transfers
    # 8 rings x 16 ranks = 128 transfers per (loop group, step group): at most 1000 // 128 = 7 groups
    assert merged.n_transfers <= 7 * 128
    np.testing.assert_allclose(merged.sent_bytes(), full.sent_bytes())
    tree = build_plan("allreduce", 2**30, TWO_NODES, "Tree", "Simple", max_transfers=1000)
    np.testing.assert_allclose(tree.sent_bytes().sum(), 2 * 15 * 2**30)


def test_btree_is_nccls_and_dtree_leaves_alternate():
    # ncclGetBtree on 8 nodes: 0 <- 4 <- {2, 6}; 2 <- {1, 3}; 6 <- {5, 7}
    assert btree_parent(8).tolist() == [-1, 2, 4, 2, 0, 6, 4, 6]
    # even n: tree 1 mirrors tree 0 (r -> n-1-r), so no node is interior (has a child) in both trees
    for n in (2, 8, 16):
        t0, t1 = dtree_parent(n)
        assert t1.tolist() == [-1 if p < 0 else n - 1 - p for p in t0[::-1]]
        assert not np.any(np.isin(np.arange(n), t0) & np.isin(np.arange(n), t1))
    # odd n: tree 1 is tree 0 shifted by one rank; one root each
    t0, t1 = dtree_parent(5)
    assert t1.tolist() == [-1 if t0[(r - 1) % 5] < 0 else (t0[(r - 1) % 5] + 1) % 5 for r in range(5)]
    assert (t0 == -1).sum() == 1 and (t1 == -1).sum() == 1


@pytest.mark.parametrize("args,field", [
    (("allsum", S, ONE_NODE, "Ring", "Simple"), "op"),
    (("allreduce", 0, ONE_NODE, "Ring", "Simple"), "size_bytes"),
    (("allreduce", S, ONE_NODE, "NVLSTree", "Simple"), "algo"),
    (("allreduce", S, TWO_NODES, "NVLS", "Simple"), "algo"),  # NCCL runs it over CollNet (IB SHARP)
    (("allreduce", S, TWO_NODES, "CollNetDirect", "Simple"), "algo"),
    (("allgather", S, TWO_NODES, "PAT", "Simple"), "algo"),  # PAT needs one rank per node
    (("allreduce", S, FOUR_NODES_DP, "PAT", "Simple"), "algo"),
    (("allgather", S, TWO_NODES, "NVLSTree", "Simple"), "algo"),
    (("allgather", S, ONE_NODE, "Tree", "Simple"), "algo"),
    (("alltoall", S, ONE_NODE, "Ring", "Simple"), "algo"),
    (("allreduce", S, ONE_NODE, "Ring", "Fast"), "proto"),
    (("allreduce", S, CommLayout(n_ranks=1, n_nodes=1, compute_capability=90, scaleup_Bps=450e9,
                                 scaleup_links=18), "Ring", "Simple"), "n_ranks"),
])
def test_bad_input_names_the_field(args, field):
    with pytest.raises(ConfigError) as err:
        build_plan(*args)
    assert err.value.field == field


def _slow_depth(parent: np.ndarray) -> int:
    """Reference: walk every rank up to its root."""
    best = 0
    for row in parent:
        for x in range(row.size):
            d = 0
            while row[x] >= 0:
                x, d = row[x], d + 1
            best = max(best, d)
    return best


@pytest.mark.parametrize("seed", range(4))
def test_parent_depth_matches_walking_up(seed):
    from flowsim.nccl_models.rank_orders import parent_depth

    rng = np.random.default_rng(seed)
    for n in (1, 2, 3, 7, 20, 100, 300):
        assert parent_depth(np.stack(dtree_parent(n))) == _slow_depth(np.stack(dtree_parent(n)))
        par = np.array([-1] + [int(rng.integers(0, i)) for i in range(1, n)])  # a random tree, relabelled
        perm = rng.permutation(n)
        tree = np.empty(n, dtype=np.int64)
        tree[perm] = np.where(par >= 0, perm[np.maximum(par, 0)], -1)
        assert parent_depth(tree[None, :]) == _slow_depth(tree[None, :])
    assert parent_depth(np.arange(-1, 99)[None, :]) == 99  # a chain of 100
