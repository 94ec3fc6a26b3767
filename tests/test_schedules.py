"""Pipeline schedules against their papers: ZB-H1 (Qi et al. 2024, arXiv 2401.10241, sec. 3.1) and
DualPipe (DeepSeek-V3 technical report, arXiv 2412.19437, sec. 3.2.1 and Table 2): closed-form bubbles with
equal pass costs, ordering and dependency invariants, memory, configuration rules and the CLI."""
import json

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

import flowsim
from flowsim.cli import main
from flowsim.errors import ConfigError
from flowsim.step.memory import in_flight_microbatches
from flowsim.step.schedule import BWD, FWD, WGRAD, held_microbatches, simulate_pipeline
from flowsim.model.workload import build_workload, chunk_layer_counts


def run(schedule, p, m, f, b, w, v=1, p2p=0.0):
    """Equal costs on every stage: forward ``f``, input-gradient ``b`` and weight-gradient ``w`` seconds."""
    full = np.full((p, v), 1.0)
    return simulate_pipeline(schedule, m, f * full, (b + w) * full, p2p, wgrad_s=w * full)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 13), (8, 32), (16, 64)])
def test_zb_h1_bubble_matches_paper(p, m):
    # Qi et al. 2024 sec. 3.1: ZB-H1's bubble is (p - 1)(T_F + T_B - T_W), a third of 1F1B's when equal
    f = b = w = 0.5
    tl = run("zb-h1", p, m, f, b, w)
    ideal = m * (f + b + w)
    assert np.allclose(tl.busy_s, ideal)
    assert tl.end_s.max() - ideal == pytest.approx((p - 1) * (f + b - w), rel=1e-9)
    one = run("1f1b", p, m, f, b, w)
    assert one.end_s.max() - ideal == pytest.approx(3 * (tl.end_s.max() - ideal))
    # at most p micro-batches between F and W on every stage: 1F1B's peak (the paper's memory bound)
    assert held_microbatches("zb-h1", p, 1, m) == tuple([float(min(p, m))] * p)


@settings(max_examples=150, deadline=None)
@given(p=st.integers(1, 9), m=st.integers(1, 40), f=st.floats(0.01, 3.0), b=st.floats(0.01, 3.0),
       w_share=st.floats(0.0, 1.0), p2p=st.sampled_from([0.0, 0.05, 0.7]),
       scale=st.lists(st.floats(0.5, 1.5), min_size=9, max_size=9))
def test_zb_h1_never_slower_than_1f1b(p, m, f, b, w_share, p2p, scale):
    # with W no longer than the input-gradient pass B (the paper's setting); a longer W deferred into the
    # cool-down can end the step later than 1F1B: p=3, m=5, f=3.0, b=0.03125, w=0.5, stages scaled 1.5/1/1.375
    # end 33.324 s against 1F1B's 33.277 s (hypothesis found it; no counterexample with W <= B in 4,000 draws)
    w = w_share * b
    s = np.array(scale[:p])[:, None]
    args = (m, f * s, (b + w) * s, p2p, w * s)
    assert simulate_pipeline("zb-h1", *args).end_s.max() <= simulate_pipeline("1f1b", *args).end_s.max() * (1 + 1e-12)


def test_zb_h1_with_a_weight_pass_longer_than_b_can_end_later():
    s = np.array([[1.5], [1.0], [1.375]])
    args = (5, 3.0 * s, 0.53125 * s, 0.0, 0.5 * s)  # F 3.0, B 0.03125, W 0.5 (times the stage's scale)
    assert simulate_pipeline("zb-h1", *args).end_s.max() == 33.32421875
    assert simulate_pipeline("1f1b", *args).end_s.max() == 33.27734375


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 20), (8, 16), (8, 20), (16, 32), (16, 64)])
def test_dualpipe_bubble_matches_deepseek_table(p, m):
    # DeepSeek-V3 Table 2: bubble (PP/2 - 1)(F&B + B - 3W), B the whole backward, F&B a forward plus a
    # whole backward; p + 1 chunk activations at the peak. Every rank runs m chunk passes of F, B and W.
    f = b = w = 1.0
    tl = run("dualpipe", p, m, f, b, w, v=2)
    ideal = m * (f + b + w)
    assert np.allclose(tl.busy_s, ideal)
    fb, full_b = f + b + w, b + w
    assert np.allclose(tl.end_s.max() - tl.busy_s, (p / 2 - 1) * (fb + full_b - 3 * w), rtol=1e-9)
    assert max(held_microbatches("dualpipe", p, 2, m)) * 2 == p + 1


def _previous(schedule, p, v, s, c):
    """(stage, chunk) before (s, c) on a micro-batch's path, or None: written from the papers, not the code."""
    if schedule == "dualpipe":
        prev = s - 1 if c == 0 else s + 1
        return (prev, c) if 0 <= prev < p else None
    k = c * p + s
    return ((k - 1) % p, (k - 1) // p) if k else None


@pytest.mark.parametrize("schedule,p,v,m", [("gpipe", 4, 1, 6), ("1f1b", 4, 1, 3), ("1f1b", 5, 1, 9),
                                            ("interleaved", 4, 2, 8), ("interleaved", 3, 3, 6),
                                            ("zb-h1", 4, 1, 3), ("zb-h1", 6, 1, 10), ("dualpipe", 2, 2, 4),
                                            ("dualpipe", 6, 2, 14), ("dualpipe", 8, 2, 16)])
def test_orders_run_every_pass_once_and_respect_dependencies(schedule, p, v, m):
    rng = np.random.default_rng(p * 100 + m)
    fwd, bwd = rng.uniform(0.5, 1.5, (p, v)), rng.uniform(1.0, 3.0, (p, v))
    p2p = 0.3
    tl = simulate_pipeline(schedule, m, fwd, bwd, p2p, wgrad_s=bwd / 3)
    kinds = (FWD, BWD, WGRAD) if schedule in ("zb-h1", "dualpipe") else (FWD, BWD)
    where = {}
    for s in range(p):
        assert np.all(tl.start_s[s, 1:] >= tl.end_op_s[s, :-1] - 1e-12)  # one compute stream
        assert np.all(tl.send_s[s] >= tl.end_op_s[s] - 1e-12)
        for i, (kind, mb, c) in enumerate(tl.order[s].tolist()):
            assert (s, kind, mb, c) not in where
            where[(s, kind, mb, c)] = i
    # DualPipe: micro-batches 0..m/2-1 flow through chunk 0, the others through chunk 1
    mbs_of = (lambda c: range(c * m // 2, (c + 1) * m // 2)) if schedule == "dualpipe" else (lambda c: range(m))
    expected = {(s, k, mb, c) for s in range(p) for c in range(v) for mb in mbs_of(c) for k in kinds}
    assert set(where) == expected
    for (s, kind, mb, c), i in where.items():
        if kind == FWD and (prev := _previous(schedule, p, v, s, c)):
            j = where[(prev[0], FWD, mb, prev[1])]
            assert tl.start_s[s, i] >= tl.send_s[prev[0], j] + (p2p if prev[0] != s else 0.0) - 1e-9
            assert tl.send_to[prev[0], j] == (s if prev[0] != s else -1)
        if kind == BWD:
            nxt = [(s2, c2) for s2 in range(p) for c2 in range(v) if _previous(schedule, p, v, s2, c2) == (s, c)]
            src = (nxt[0][0], BWD, mb, nxt[0][1]) if nxt else (s, FWD, mb, c)
            hop = p2p if nxt and nxt[0][0] != s else 0.0
            done = tl.send_s if nxt else tl.end_op_s
            assert tl.start_s[s, i] >= done[src[0], where[src]] + hop - 1e-9
        if kind == WGRAD:
            assert i > where[(s, BWD, mb, c)]


@pytest.mark.parametrize("p,m,p2p", [(4, 8, 0.0), (8, 32, 0.0), (8, 32, 0.2), (16, 48, 0.1)])
def test_dualpipe_beats_1f1b_with_symmetric_costs(p, m, p2p):
    # same job: DualPipe's chunks are whole model stages, so each rank does the work of one 1F1B stage
    f, b, w = 1.0, 1.4, 0.6
    one = run("1f1b", p, m, f, b, w, p2p=p2p)
    dual = run("dualpipe", p, m, f, b, w, v=2, p2p=p2p)
    assert np.allclose(dual.busy_s, one.busy_s)
    assert dual.end_s.max() < one.end_s.max()


def _fb_calls(tl):
    """Per stage, how many DualPipe calls pair a forward with the backward right after it."""
    o = tl.order
    return [sum(1 for i in range(1, o.shape[1]) if o[s, i, 0] == BWD and o[s, i - 1, 0] == FWD
                and tl.send_s[s, i - 1] == tl.send_s[s, i]) for s in range(o.shape[0])]


@pytest.mark.parametrize("share, paired", [(0.0, 1.2), (0.5, 1.6), (0.9, 1.92)])
def test_dualpipe_pairing_hides_the_all_to_all(share, paired):
    # F = B = 1 s of which 0.4 s is all-to-all, no W: a paired call has 1.2 s of compute and 0.8 s of
    # communication. Run side by side, compute slowed to r = 1 - share while NCCL holds its SMs:
    # share 0 -> 1.2 s; 0.5 -> 1.2 + 0.8 * 0.5 = 1.6 s; 0.9 -> the all-to-all outlasts the slowed compute
    # (0.8 >= 1.2 / 0.1 fails, so 1.2 + 0.8 * 0.9 = 1.92 s)
    p, m = 4, 8
    f, b = np.full((p, 2), 1.0), np.full((p, 2), 1.0)
    comm = np.full((p, 2), 0.4)
    plain = simulate_pipeline("dualpipe", m, f, b, 0.0, np.zeros((p, 2)))
    hid = simulate_pipeline("dualpipe", m, f, b, 0.0, np.zeros((p, 2)), (comm, comm, share))
    calls = _fb_calls(hid)
    assert min(calls) > 0
    assert np.allclose(plain.busy_s - hid.busy_s, np.array(calls) * (2.0 - paired))
    assert hid.end_s.max() < plain.end_s.max()
    # the other schedules ignore it
    one = simulate_pipeline("1f1b", m, f[:, :1], b[:, :1], 0.0)
    assert np.allclose(simulate_pipeline("1f1b", m, f[:, :1], b[:, :1], 0.0, None, (comm, comm, share)).end_s,
                       one.end_s)


def test_dualpipe_hides_expert_all_to_all_in_a_step():
    moe = dict(model="mixtral-8x7b", cluster="dgx-h100", gpus=64, pp=4, ep=8, gbs=128)
    one, dual = flowsim.simulate(**moe), flowsim.simulate(**moe, schedule="dualpipe")
    assert dual.step_time_s < one.step_time_s
    # every rank runs the same layers in both (DualPipe's two chunks are two 1F1B stages' worth), so the
    # expert all-to-all it still exposes is below 1F1B's
    assert sum(s.ep_comm_s for s in dual.stages) < sum(s.ep_comm_s for s in one.stages)
    assert all(s.ep_comm_s >= 0 for s in dual.stages)


DENSE = dict(model="llama3-8b", cluster="dgx-h100", gpus=32, tp=2, pp=4, gbs=64, sp=True)


def test_dualpipe_in_a_step():
    one = flowsim.simulate(**DENSE)
    dual = flowsim.simulate(**DENSE, schedule="dualpipe")
    assert dual.step_time_s < one.step_time_s
    assert dual.hardware_flops == pytest.approx(one.hardware_flops)
    # the end ranks run the embedding for one direction and the LM head for the other
    assert dual.stages[0].compute_s == pytest.approx(dual.stages[-1].compute_s)
    assert dual.stages[1].compute_s == pytest.approx(one.stages[1].compute_s)


def test_dualpipe_layout_and_memory():
    cfg = flowsim.build_config(**DENSE, schedule="dualpipe")
    ref = flowsim.build_config(**DENSE)
    layers = chunk_layer_counts(cfg)
    # V shape: stage s holds model stages s and p - 1 - s
    assert layers.shape == (4, 2) and np.array_equal(layers[:, 1], layers[::-1, 0])
    assert np.array_equal(layers[:, 0], chunk_layer_counts(ref)[:, 0])
    wl, wl_ref = build_workload(cfg), build_workload(ref)
    # parameters 2x per rank (DeepSeek-V3 Table 2), on a middle rank that holds no embedding or head
    assert wl.stage_params[1] == pytest.approx(2 * wl_ref.stage_params[1])
    # activations: p + 1 chunks, i.e. (p + 1) / 2 micro-batches of the two-chunk stage
    assert in_flight_microbatches(cfg, 1) == pytest.approx(5 / 2)


@pytest.mark.parametrize("over,field,words", [
    (dict(pp=3, gpus=24), "pipeline_schedule", "even pipeline_model_parallel_size"),
    (dict(vpp=2), "pipeline_schedule", "set virtual_pipeline_model_parallel_size to 1"),
    (dict(gbs=24), "global_batch_size", "at least 2 * pipeline_model_parallel_size"),
    (dict(gbs=36), "global_batch_size", "even number of micro-batches"),
])
def test_dualpipe_layout_errors(over, field, words):
    with pytest.raises(ConfigError) as e:
        flowsim.build_config(**{**DENSE, "layers": 36, **over}, schedule="dualpipe")
    assert e.value.field == field and words in str(e.value)


def test_dualpipe_bad_layout_is_one_cli_line():
    res = CliRunner().invoke(main, ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "24",
                                    "--tp", "2", "--pp", "3", "--gbs", "48", "--set", "num_layers=36",
                                    "--schedule", "dualpipe"])
    assert res.exit_code == 2
    assert len(res.output.strip().splitlines()) == 1 and "pipeline_schedule" in res.output


def test_deepseek_v3_dualpipe_estimate_writes_a_valid_trace(tmp_path):
    # DeepSeek-V3's layout (report sec. 3.2): 2048 H800, PP 16 with DualPipe, EP 64, ZeRO-1 data parallelism
    out = tmp_path / "step.json"
    res = CliRunner().invoke(main, ["estimate", "--model", "deepseek-v3", "--cluster", "hgx-h800", "--gpus", "2048",
                                    "--tp", "1", "--pp", "16", "--ep", "64", "--gbs", "15360",
                                    "--distributed-optimizer", "--schedule", "dualpipe",
                                    "--set", "pipeline_layer_split=balanced", "--trace", str(out), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["config"]["training"]["pipeline_schedule"] == "dualpipe"
    events = json.loads(out.read_text())["traceEvents"]
    for e in events:  # Trace Event Format: complete events with non-negative times, or metadata
        assert {"ph", "name", "pid"} <= set(e)
        if e["ph"] == "X":
            assert e["dur"] >= 0 and e["ts"] >= 0 and "tid" in e
        else:
            assert e["ph"] == "M" and e["name"] in ("process_name", "thread_name")
    p, m = 16, 15360 // 128
    passes = [e for e in events if e.get("cat") in ("fwd", "bwd", "wgrad")]
    assert len(passes) == p * 3 * m
    sends = [e for e in events if e.get("cat") == "pp"]
    assert sends and all(abs(e["args"]["to_stage"] - e["pid"]) == 1 for e in sends)
    # both directions: rank 0 sends activations of chunk 0 forward and gradients of chunk 1 backward
    assert {e["name"] for e in sends if e["pid"] == 0} == {"send activation", "send gradient"}


def test_plan_cache_is_bounded_in_bytes(monkeypatch):
    # least recently used plans go first once the kept plans pass PLAN_CACHE_BYTES; a kept plan is the same object
    from flowsim.step import pipeline_orders as po

    monkeypatch.setattr(po, "_PLANS", type(po._PLANS)())
    monkeypatch.setattr(po, "_plans_bytes", 0)
    layouts = [("1f1b", 4, 1, m) for m in (8, 16, 32, 64)]
    size = sum(po._build(*k, False).nbytes for k in layouts[1:])
    monkeypatch.setattr(po, "PLAN_CACHE_BYTES", size)
    first = po.schedule_plan(*layouts[0])
    assert po.schedule_plan(*layouts[0]) is first and first.order.dtype == np.int32
    for k in layouts[1:]:
        po.schedule_plan(*k)
    assert list(po._PLANS) == [k + (False,) for k in layouts[1:]] and po._plans_bytes == size
    po.schedule_plan(*layouts[1])  # used again: the newest, so the next miss drops layouts[2]
    po.schedule_plan(*layouts[0])
    assert list(po._PLANS) == [k + (False,) for k in (layouts[3], layouts[1], layouts[0])]
    assert po._plans_bytes == sum(p.nbytes for p in po._PLANS.values()) <= size


def test_interleaved_plan_needs_microbatches_a_multiple_of_pp():
    # the order numbers micro-batches past m otherwise (SimConfig refuses such a config with the same rule)
    with pytest.raises(ConfigError, match="global_batch_size"):
        simulate_pipeline("interleaved", 6, np.ones((4, 2)), np.ones((4, 2)), 0.0)
