"""Chakra execution traces: protobuf .et files per rank, read back with protobuf and checked against the step."""
import collections
import json
import math

import pytest
from click.testing import CliRunner

import flowsim
from flowsim.cli import main
from flowsim.config.layout import group_spans
from flowsim.export import chakra_pb as pb
from flowsim.export.chakra import group_members, sim_config, stage_graphs, write_chakra
from flowsim.model.workload import build_workload

CFG = dict(model="llama3-8b", cluster="dgx-h100", gpus=16, tp=2, pp=2, gbs=32, sp=True)
BIG = dict(model="llama3-8b", cluster="dgx-h100", gpus=1024, tp=8, pp=4, gbs=128, sp=True,
           distributed_optimizer=True)


def attrs(node):
    return {a.name: getattr(a, a.WhichOneof("value")) for a in node.attr}


def test_stage_graph_follows_schedule_and_layers():
    r = flowsim.simulate(**CFG)
    graphs = stage_graphs(r)
    wl = build_workload(sim_config(r))
    m, layers = 32 // 4, 32 // 2  # dp = 16 / (tp 2 * pp 2) = 4; 32 layers over 2 stages
    for g in graphs:
        kinds = collections.Counter(o.kind for o in g)
        assert kinds["comp"] == 2 * m * layers + 1  # forward and backward of every layer, and the optimizer
        # with sequence parallelism a layer issues AG+RS per block forward and AG+RS+AG per block backward; the
        # gradients are all-reduced (no distributed optimizer) in Megatron-core's 40M-parameter buckets of fp32
        tp = [o for o in g if o.kind == "coll" and o.group == "tp"]
        assert len(tp) == m * layers * (4 + 6)
        dp = [(o.group, o.op) for o in g if o.name.startswith("dp ")]
        assert dp == [("dp", "allreduce")] * math.ceil(wl.stage_params[graphs.index(g)] * 4 / (40e6 * 4))
        assert kinds["send"] == kinds["recv"] == m
    ag = next(o for o in graphs[0] if o.kind == "coll")
    assert (ag.op, ag.group, ag.size_bytes) == ("allgather", "tp", 8192 * 4096 * 2)  # [tokens, hidden] bf16


def test_recomputed_layers_rerun_their_forward_in_backward():
    # full recompute of 4 layers per chunk: those layers' backward nodes carry a forward's FLOPs more, and
    # their re-run TP collectives (AG + RS per block) add 4 collective nodes each
    def bwd_nodes(**kw):
        g = stage_graphs(flowsim.simulate(**CFG, **kw))[0]
        return [o.flops for o in g if o.kind == "comp" and o.name.startswith("bwd mb0 ")], \
            sum(o.kind == "coll" for o in g)

    plain, plain_colls = bwd_nodes()
    rec, rec_colls = bwd_nodes(recompute="full", recompute_num_layers=4)
    fwd = flowsim.simulate(**CFG).timeline
    c = fwd.ops.iloc[fwd.spans["layer"]]
    fwd_flops = float((c["flops"] * c["count"])[c["phase"] == "fwd"].sum())
    assert [r - p for r, p in zip(rec, plain)] == pytest.approx([fwd_flops] * 4 + [0] * 12, abs=2)
    assert rec_colls - plain_colls == (32 // 4) * 4 * 4


def test_group_members_follow_megatron_rank_order():
    t = flowsim.build_config(**BIG).training
    spans = group_spans(t)
    assert group_members(spans, "tp", 300) == list(range(296, 304))
    assert group_members(spans, "dp", 300) == [260 + 8 * k for k in range(32)]  # stage 1 = ranks 256..511


def test_all_ranks_of_a_1024_gpu_job_read_back(tmp_path):
    r = flowsim.simulate(**BIG)
    paths = write_chakra(r, tmp_path)
    assert [p.name for p in paths] == [f"flowsim.{k}.et" for k in range(1024)]
    groups = json.loads((tmp_path / "comm_groups.json").read_text())
    graphs = stage_graphs(r)
    m, layers, stride = 128 // 32, 32 // 4, 256
    sends, recvs, coll_calls = [], [], collections.Counter()
    dp_bytes = collections.Counter()
    for rank, path in enumerate(paths):
        meta, nodes = pb.read_et(path.read_bytes())
        s = rank // stride
        assert meta.version == "0.0.4" and attrs(meta)["rank"] == rank and attrs(meta)["pipeline_stage"] == s
        assert [n.id for n in nodes] == list(range(len(nodes))) == list(range(len(graphs[s])))
        assert all(list(n.data_deps) == ([n.id - 1] if n.id else []) for n in nodes)
        types = collections.Counter(pb.NODE_TYPES[n.type] for n in nodes)
        assert types["COMP_NODE"] == 2 * m * layers + 1
        assert types["COMM_SEND_NODE"] == types["COMM_RECV_NODE"] == (m if s in (0, 3) else 2 * m)
        for n in nodes:
            a = attrs(n)
            if n.type == pb.NodeType["COMM_SEND_NODE"]:
                assert a["comm_src"] == rank and abs(a["comm_dst"] - rank) == stride
                sends.append((a["comm_src"], a["comm_dst"], a["comm_tag"], a["comm_size"]))
            elif n.type == pb.NodeType["COMM_RECV_NODE"]:
                recvs.append((a["comm_src"], a["comm_dst"], a["comm_tag"], a["comm_size"]))
            elif n.type == pb.NodeType["COMM_COLL_NODE"]:
                assert rank in groups[a["pg_name"]]
                coll_calls[(a["pg_name"], n.id, a["comm_type"], a["comm_size"])] += 1
                if n.name.startswith(("dp ", "param ")):
                    dp_bytes[(s, pb.COLLECTIVE_TYPES[a["comm_type"]])] += a["comm_size"]
    # every send has its receive, and every member of a communicator issues each of its collectives
    assert sorted(sends) == sorted(recvs) and len(sends) == 2 * m * 3 * stride
    for (pg, _, _, _), calls in coll_calls.items():
        assert calls == len(groups[pg])
    assert {len(v) for k, v in groups.items() if k.startswith("tp_")} == {8}
    assert {len(v) for k, v in groups.items() if k.startswith("dp_")} == {32}
    # the gradient reduction moves the stage's fp32 gradients, as the step priced them
    wl = build_workload(sim_config(r))
    for s in range(4):
        assert dp_bytes[(s, "REDUCE_SCATTER")] / stride == pytest.approx(4 * wl.stage_params[s], abs=16)
        assert dp_bytes[(s, "ALL_GATHER")] / stride == pytest.approx(2 * wl.stage_params[s], abs=16)
    priced = collections.Counter()
    for g in graphs:
        for o in g:
            if o.name.startswith("dp "):
                priced[(o.op, o.size_bytes)] += 1
    assert {(c.op, round(c.size_bytes)): c.count_per_step for c in r.collectives if c.group == "dp"
            and c.op == "reducescatter"} == {k: v for k, v in priced.items()}


def test_cli_writes_chosen_ranks(tmp_path):
    args = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16", "--tp", "2", "--pp", "2",
            "--gbs", "32", "--sp", "--chakra", str(tmp_path / "et"), "--chakra-ranks", "0,8-9"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    files = sorted(p.name for p in (tmp_path / "et").iterdir())
    assert files == ["comm_groups.json", "flowsim.0.et", "flowsim.8.et", "flowsim.9.et"]
    meta, _ = pb.read_et((tmp_path / "et" / "flowsim.9.et").read_bytes())
    assert attrs(meta)["pipeline_stage"] == 1
    bad = CliRunner().invoke(main, args[:-1] + ["16"])
    assert bad.exit_code == 2 and "Error: --chakra-ranks: must be ranks in [0, 16) (got 16)" in bad.output
