"""Chakra execution-trace export: node counts follow the schedule and the layer's collectives."""
import json

import pytest
from click.testing import CliRunner

import flowsim
from flowsim.export.chakra import COLL_TYPE, COMM_COLL_NODE, COMM_RECV_NODE, COMM_SEND_NODE, COMP_NODE, chakra_traces
from flowsim.cli import main

CFG = dict(model="llama3-8b", cluster="dgx-h100", gpus=16, tp=2, pp=2, gbs=32, sp=True)


def test_graph_follows_schedule_and_layers():
    r = flowsim.simulate(**CFG)
    traces = chakra_traces(r)
    assert [t["stage"] for t in traces] == [0, 1]
    m, layers = 32 // 4, 32 // 2  # dp = 16 / (tp 2 * pp 2) = 4; 32 layers over 2 stages
    for tr in traces:
        nodes = tr["nodes"]
        types = [n["type"] for n in nodes]
        assert types.count(COMP_NODE) == 2 * m * layers  # forward and backward of every layer
        # with sequence parallelism a layer issues AG+RS per block forward and AG+RS+AG per block backward
        assert types.count(COMM_COLL_NODE) == m * layers * (4 + 6)
        assert types.count(COMM_SEND_NODE) == types.count(COMM_RECV_NODE) == m
        assert [n["id"] for n in nodes] == list(range(len(nodes)))
        assert all(n["data_deps"] == ([n["id"] - 1] if n["id"] else []) for n in nodes)
    coll = next(n for n in traces[0]["nodes"] if n["type"] == COMM_COLL_NODE)
    attrs = {a["name"]: a["int64_val"] for a in coll["attr"]}
    assert attrs["comm_type"] == COLL_TYPE["allgather"] and attrs["comm_group_size"] == 2
    assert attrs["comm_size"] == 8192 * 4096 * 2  # the [tokens, hidden] bf16 activation


def test_cli_writes_one_file_per_stage(tmp_path):
    args = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16", "--tp", "2", "--pp", "2",
            "--gbs", "32", "--sp", "--chakra", str(tmp_path / "et")]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    files = sorted(p.name for p in (tmp_path / "et").iterdir())
    assert files == ["chakra.0.json", "chakra.8.json"]  # representative ranks of stages 0 and 1 (stride 8)
    assert json.loads((tmp_path / "et" / "chakra.8.json").read_text())["stage"] == 1


def test_recomputed_layers_rerun_their_forward_in_backward():
    # full recompute of 4 layers per chunk: those layers' backward nodes carry a forward's FLOPs more, and
    # their re-run TP collectives (AG + RS per block) add 4 collective nodes each
    def bwd_nodes(**kw):
        nodes = chakra_traces(flowsim.simulate(**CFG, **kw))[0]["nodes"]
        flops = [{a["name"]: a["int64_val"] for a in n["attr"]}["num_ops"] for n in nodes
                 if n["type"] == COMP_NODE and n["name"].startswith("bwd mb0 ")]
        return flops, sum(n["type"] == COMM_COLL_NODE for n in nodes)

    plain, plain_colls = bwd_nodes()
    rec, rec_colls = bwd_nodes(recompute="full", recompute_num_layers=4)
    fwd = flowsim.simulate(**CFG).timeline
    c = fwd.ops.iloc[fwd.spans["layer"]]
    fwd_flops = float((c["flops"] * c["count"])[c["phase"] == "fwd"].sum())
    assert [r - p for r, p in zip(rec, plain)] == pytest.approx([fwd_flops] * 4 + [0] * 12, abs=2)
    assert rec_colls - plain_colls == (32 // 4) * 4 * 4
