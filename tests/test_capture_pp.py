"""Pipeline parallelism: one captured rank per stage, merged, simulated with the 1F1B schedule.

examples/capture_gpt_pp.py with pp = 4 stages x dp = 16 (world 64, stage-major ranks: stage s holds ranks
16 s .. 16 s + 15), m = 8 micro-batches of 1 x 2048 tokens, h = 2048, 16 heads, 8 blocks (2 per stage),
vocab 1024, bf16. Captured ranks 0, 16, 32, 48 (pipeline neighbours).

Parameters: a block 12 h^2 + 13 h = 50,358,272 (LNs 4h, QKV 3h^2+3h, proj h^2+h, fc1 4h^2+4h, fc2 4h^2+h);
embedding and head h V = 2,097,152 each; final LayerNorm 2h = 4096.
"""
import copy
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from flowsim.capture import CapturedWorkload, Stage, capture, load  # noqa: E402
from flowsim.capture.program import simulate_workload  # noqa: E402
from flowsim.cli import main  # noqa: E402
from flowsim.errors import ConfigError  # noqa: E402

P, DP, M, H, S, V = 4, 16, 8, 2048, 2048, 1024
BLOCK = 12 * H**2 + 13 * H
ACT = S * H * 2  # one micro-batch's activation (or its gradient), bf16 bytes
RANKS = [0, 16, 32, 48]
EXAMPLE = str(Path(__file__).resolve().parents[1] / "examples" / "capture_gpt_pp.py")


@pytest.fixture(scope="module")
def pp_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("pp") / "pp.json"
    args = ["capture", "--world-size", "64", *sum((["--rank", str(r)] for r in RANKS), []), "--out", str(out),
            "--", "python", EXAMPLE, "--pp", str(P), "--microbatches", str(M),
            "--layers", "8", "--hidden", str(H), "--heads", "16", "--seq", str(S), "--mbs", "1", "--vocab", str(V)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert res.output.count("stage ") == P
    return out


@pytest.fixture(scope="module")
def pp(pp_file):
    return load(pp_file)


def test_stages_and_file_version(pp, pp_file):
    doc = json.loads(pp_file.read_text())
    assert doc["version"] == 2 and [st["rank"] for st in doc["stages"]] == RANKS
    assert [st.rank for st in pp.stages] == RANKS


def test_p2p_rows_per_stage(pp):
    # GPipe order in the script: m forwards (receive from the previous stage, send to the next), then m
    # backwards (receive the gradient from the next stage, send the input gradient to the previous)
    for s, rank in enumerate(RANKS):
        prev, nxt = rank - DP, rank + DP
        fwd = ([("recv", prev)] if s > 0 else []) + ([("send", nxt)] if s < P - 1 else [])
        bwd = ([("recv", nxt)] if s < P - 1 else []) + ([("send", prev)] if s > 0 else [])
        p2p = [c for c in pp.comms(s) if "peer" in c]
        got = [("send" if c["name"] == "c10d.send.default" else "recv", c["peer"]) for c in p2p]
        assert got == fwd * M + bwd * M, s
        assert {(c["op"], c["size_bytes"], c["blocking"]) for c in p2p} == {("sendrecv", ACT, True)}
        # the backward half of the stage's point-to-point traffic follows the autograd engine's ops
        assert all(not c.get("backward") for c in p2p)


def test_data_parallel_gradient_all_reduce_per_stage(pp):
    # one blocking all-reduce of the stage's flattened bf16 gradients over its 16 data-parallel ranks
    params = [2 * BLOCK + H * V, 2 * BLOCK, 2 * BLOCK, 2 * BLOCK + 2 * H + H * V]
    for s, rank in enumerate(RANKS):
        reduces = [c for c in pp.comms(s) if c["op"] == "allreduce"]
        assert [(c["size_bytes"], c["blocking"]) for c in reduces] == [(2 * params[s], True)]
        assert pp.groups[reduces[0]["group"]] == list(range(rank, rank + DP))


def _alone(stage, groups):
    """The stage as a single-stage workload whose point-to-point rows move nothing (wait indices stay valid)."""
    ops = [dict(o, size_bytes=0) if "peer" in o else o for o in stage.ops]
    return CapturedWorkload(world_size=64, stages=[Stage(stage.rank, ops)], groups=groups)


def test_pipeline_bubble_follows_1f1b(pp):
    """On an NVL72 rack the 16-apart stage ranks share NVLink, so transfers are small next to a micro-batch's
    compute and the step exceeds a stage run alone by the 1F1B bubble (p - 1) / m of its busy time."""
    r = simulate_workload(pp, "gb200-nvl72")
    pipe = r.pipeline
    assert (pipe.microbatches, pipe.schedule, pipe.p2p_bytes) == (M, "1f1b", ACT)
    assert pipe.p2p_s < 0.02 * (pipe.fwd_s + pipe.bwd_s).min()
    # stages with the same two blocks and the embedding / head (vocab 1024) cost within 10% of each other
    # (the last stage's loss adds ~120 small memory-bound launches, each paying the launch latency)
    assert (pipe.fwd_s + pipe.bwd_s).max() < 1.10 * (pipe.fwd_s + pipe.bwd_s).min()
    assert pipe.bwd_s == pytest.approx(2 * pipe.fwd_s, rel=0.35)
    alone = max(simulate_workload(_alone(st, pp.groups), "gb200-nvl72").step_time_s for st in pp.stages)
    c = pipe.critical_stage
    busy = M * (pipe.fwd_s[c] + pipe.bwd_s[c])
    assert (r.step_time_s - alone) / busy == pytest.approx((P - 1) / M, rel=0.10)
    # precisely: the first micro-batch crosses every stage and back (p - 1 transfers each way), the other
    # m - 1 follow at the pace of the slowest stage
    fb = pipe.fwd_s + pipe.bwd_s
    assert pipe.end_s[c] == pytest.approx(fb.sum() + (M - 1) * fb.max() + 2 * (P - 1) * pipe.p2p_s, rel=0.02)
    assert r.bubble_s == pytest.approx(pipe.end_s[c] - busy)
    assert r.step_time_s == pytest.approx(r.compute_s + r.exposed_comm_s + r.bubble_s)


def test_cli_estimate_reports_the_pipeline(pp_file):
    res = CliRunner().invoke(main, ["estimate", "--workload", str(pp_file), "--cluster", "dgx-h100", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["pipeline"]["stages"] == P and out["pipeline"]["microbatches"] == M
    # inter-node transfers (16 ranks apart on 8-GPU hosts) lengthen the step beyond the NVL72 bubble
    assert out["bubble_s"] > (P - 1) * (out["pipeline"]["fwd_s"][0] + out["pipeline"]["bwd_s"][0])
    text = CliRunner().invoke(main, ["estimate", "--workload", str(pp_file), "--cluster", "dgx-h100"]).output
    assert f"({P} stages, {M} micro-batches, 1f1b; critical stage" in text


def test_stages_that_are_not_neighbours_are_rejected(pp):
    swapped = CapturedWorkload(64, [pp.stages[i] for i in (0, 2, 1, 3)], pp.groups)
    with pytest.raises(ConfigError, match=r"^stages\[0\]\.ops\[\d+\]\.peer: must be the captured rank of a "
                                          r"neighbouring stage \(32\) \(got 16\)"):
        simulate_workload(swapped, "dgx-h100")
    short = copy.deepcopy(pp)  # the last stage loses its last gradient send
    ops = short.stages[3].ops
    last = max(i for i, o in enumerate(ops) if "peer" in o)
    ops[last] = {k: v for k, v in ops[last].items() if k != "peer"}
    with pytest.raises(ConfigError, match=r"^stages\[3\]: must exchange 2 messages per micro-batch"):
        simulate_workload(short, "dgx-h100")


def test_isend_irecv_and_batched_p2p_rows():
    """isend / irecv and batch_isend_irecv (what Megatron-core's pipeline uses) are recorded like send / recv:
    blocking sendrecv rows whose peer is the global rank, also in a subgroup."""
    dist = torch.distributed

    def step():
        x, y = torch.ones(4, 8), torch.empty(4, 8)
        dist.isend(x, dst=3).wait()
        dist.irecv(y, src=1).wait()
        pair = dist.new_group([2, 6])
        for req in dist.batch_isend_irecv([dist.P2POp(dist.isend, x, 6, pair), dist.P2POp(dist.irecv, y, 6, pair)]):
            req.wait()

    w = capture(step, world_size=8, rank=2, warmup_steps=0)
    assert [(c["name"], c["peer"], c["op"], c["size_bytes"], c["blocking"], w.groups[c["group"]])
            for c in w.comms()] == [("c10d.send.default", 3, "sendrecv", 128, True, list(range(8))),
                                    ("c10d.recv_.default", 1, "sendrecv", 128, True, list(range(8))),
                                    ("c10d.send.default", 6, "sendrecv", 128, True, [2, 6]),
                                    ("c10d.recv_.default", 6, "sendrecv", 128, True, [2, 6])]
