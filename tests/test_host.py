"""The host-side timeline (flowsim.step.host): known answers and the closed form of repeated blocks."""
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from flowsim.model.host_costs import graphed_host_s
from flowsim.step.host import (PassHost, block_terms, issue_timeline, pass_host, repeated_block_end_s,
                               segment_terms)
from flowsim.step.schedule import simulate_pipeline

US = 1e-6


def test_short_kernels_run_at_the_cpus_pace():
    # 100 kernels of 2 us, each issued in 10 us: the GPU waits for every one
    h, g = np.full(100, 10 * US), np.full(100, 2 * US)
    run = issue_timeline(h, g)
    assert run.gpu_end_s[-1] == pytest.approx(h.sum() + g[-1])  # sum of host costs + the tail
    assert run.gpu_idle_s == pytest.approx(99 * 8 * US)


def test_long_kernels_are_unchanged():
    h, g = np.full(50, 10 * US), np.full(50, 300 * US)
    run = issue_timeline(h, g)
    assert run.gpu_end_s[-1] == pytest.approx(h[0] + g.sum())  # only the first issue is not hidden
    assert run.gpu_idle_s == 0.0
    assert np.allclose(np.diff(run.gpu_end_s), 300 * US)


def test_cpu_never_runs_ahead_past_a_sync_point():
    h, g = np.full(6, 5 * US), np.array([100, 100, 100, 1, 1, 1]) * US
    sync = np.array([False, False, True, False, False, False])
    run = issue_timeline(h, g, sync)
    # after op 2 the CPU waits for the GPU (310 us), then issues op 3 in 5 us: GPU idle 5 us per short op
    assert run.gpu_end_s[2] == pytest.approx(305 * US)
    assert run.gpu_end_s[3] == pytest.approx(305 * US + 5 * US + 1 * US)
    assert run.gpu_end_s[-1] == pytest.approx(305 * US + 3 * 5 * US + 1 * US)
    free = issue_timeline(h, g)  # without the sync the short ops were issued long before
    assert free.gpu_end_s[-1] == pytest.approx(305 * US + 3 * US)
    for i in range(3, 6):  # no op after the sync starts before the CPU issued it after the sync
        assert run.gpu_end_s[i] - g[i] >= run.gpu_end_s[2] + (i - 2) * h[i] - 1e-15


def test_cuda_graphs_collapse_host_time_to_the_launches():
    n_layers, per_layer = 4, 25
    h = np.full(n_layers * per_layer, 10 * US)
    g = np.full(h.size, 1 * US)
    gid = np.repeat(np.arange(n_layers), per_layer)  # one graph per layer
    hg = graphed_host_s(h, gid, launch_s=15 * US, per_node_s=0.5 * US)
    assert hg.sum() == pytest.approx(n_layers * (15 * US + per_layer * 0.5 * US))
    assert issue_timeline(hg, g).gpu_end_s[-1] < issue_timeline(h, g).gpu_end_s[-1] / 5
    full = graphed_host_s(h, np.zeros(h.size, dtype=int), 15 * US, 0.0)  # one full-iteration graph
    assert full.sum() == pytest.approx(15 * US)
    part = graphed_host_s(h, np.where(np.arange(h.size) < 50, 0, -1), 15 * US, 0.0)  # eager after the graph
    assert part[50:].sum() == pytest.approx(50 * 10 * US)


def _loop_end(h, g, n, c0=0.0, g0=0.0):
    return issue_timeline(np.tile(h, n), np.tile(g, n), None, c0, g0).gpu_end_s[-1]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 50), st.floats(0, 50)), min_size=1, max_size=12),
       st.integers(1, 9), st.floats(0, 100), st.floats(0, 100))
def test_repeated_block_closed_form_matches_the_op_by_op_run(ops, n, c0, g0):
    h = np.array([o[0] for o in ops]) * US
    g = np.array([o[1] for o in ops]) * US
    terms = block_terms(h, g, [0, h.size])
    end = repeated_block_end_s(terms, n, c0 * US, g0 * US)[0]
    assert end == pytest.approx(_loop_end(h, g, n, c0 * US, g0 * US), rel=1e-9, abs=1e-15)
    # the host model never makes a block faster than its kernels
    assert end >= g0 * US + n * terms.gpu_s[0] - 1e-15


def test_block_terms_over_several_blocks():
    h = np.array([1, 1, 5, 5, 5]) * US
    g = np.array([4, 4, 1, 1, 1]) * US
    t = block_terms(h, g, [0, 2, 5])
    assert t.host_s == pytest.approx([2 * US, 15 * US])
    assert t.gpu_s == pytest.approx([8 * US, 3 * US])
    assert t.span_s == pytest.approx([9 * US, 16 * US])
    assert repeated_block_end_s(t, [0, 3]) == pytest.approx([0.0, 16 * US + 2 * 15 * US])
    with pytest.raises(ValueError, match="offsets"):
        block_terms(h, g, [0, 2, 4])


def test_host_cost_table_has_every_mode_and_cpu_with_a_source():
    import csv
    from importlib import resources

    from flowsim.model.host_costs import CPU_FAMILIES, HOST_MODES, host_costs

    text = resources.files("flowsim.model").joinpath("data/host_costs.csv").read_text(encoding="utf-8")
    assert all(r["source"] and float(r["value_us"]) > 0 for r in csv.DictReader(text.splitlines()))
    for mode in HOST_MODES[1:]:
        for cpu in CPU_FAMILIES:
            c = host_costs(mode, cpu)
            assert all(x > 0 for x in c)
    # Grace costs 2.5-3x an x86 host per op (host-overhead.md sec. 5)
    assert 2.4 < host_costs("eager", "arm").kernel_fwd_s / host_costs("eager", "intel").kernel_fwd_s < 3.0


def test_bad_host_mode_names_the_key():
    from flowsim.errors import ConfigError
    from flowsim.model.host_costs import host_costs

    with pytest.raises(ConfigError, match="host_overhead: must be one of none, eager"):
        host_costs("fast", "intel")


def test_op_host_costs_and_graph_scopes():
    from flowsim.model.host_costs import host_costs, op_host_s

    c = host_costs("te", "intel")
    name = ["qkv", "attn_scores", "softmax", "qkv.dgrad", "softmax.bwd"]
    kind = ["gemm", "gemm", "memory", "gemm", "memory"]
    phase = ["fwd", "fwd", "fwd", "bwd", "bwd"]
    count = [1, 1, 2, 1, 1]
    h = op_host_s(name, kind, phase, count, c)
    assert h == pytest.approx([c.linear_fwd_s, c.kernel_fwd_s, 2 * c.kernel_fwd_s, c.kernel_bwd_s, c.kernel_bwd_s])
    layer = op_host_s(name, kind, phase, count, c, "layer")  # one forward and one backward replay
    assert layer.sum() == pytest.approx(2 * c.graph_launch_s + 6 * c.graph_node_s)
    full = op_host_s(name, kind, phase, count, c, "full_iteration")
    assert full.sum() == pytest.approx(6 * c.graph_node_s)


def _layer(**kw):
    """A small Llama-style layer on one H100, its op times and its pricer (what the step core gives block_times)."""
    from flowsim.config import build_config
    from flowsim.config.layout import group_spans
    from flowsim.gpu_specs import get_gpu
    from flowsim.kernels import op_times
    from flowsim.model.workload import build_workload
    from flowsim.step.blocks import op_columns
    from flowsim.step.pricer import CollectivePricer

    cfg = build_config(dict(num_layers=2, hidden_size=256, num_attention_heads=4, seq_length=256, vocab_size=32000,
                            activation="swiglu", normalization="rmsnorm", position_embedding="rope",
                            add_bias_linear=False, cluster="dgx-h100", gpus=1, gbs=1, **kw))
    gpu = get_gpu(cfg.cluster.gpu)
    wl = build_workload(cfg)
    ops, spans = op_columns(wl)
    return cfg, wl, ops, spans, op_times(ops, gpu, trusted=True)[spans["layer"]], CollectivePricer(cfg.cluster, gpu,
                                                                                     group_spans(cfg.training))


def test_block_times_are_gpu_side_only():
    # the block times hold no CPU time: the step core runs each stage's CPU through the schedule
    cfg, wl, ops, spans, t, comms = _layer(framework="torchtitan")
    from flowsim.step.blocks import block_times

    assert "host_s" not in block_times.__code__.co_varnames


def _ops(rng, n):
    return rng.uniform(0, 20, n) * US, rng.uniform(0, 20, n) * US


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 6), st.integers(0, 4), st.integers(0, 3))
def test_one_stage_pipeline_equals_the_op_by_op_tandem(seed, m, n_layers, n_rec):
    """One stage: the schedule with pass_host's terms ends exactly where the op-by-op tandem queue over the
    step's ops (embedding, layers, head forward; head, layers with recompute, embedding backward) ends."""
    rng = np.random.default_rng(seed)
    n_rec = min(n_rec, n_layers)
    blocks = {}
    for name in ("layer", "embedding", "head"):
        phase = np.array(["fwd"] * 3 + ["recompute"] * 2 + ["bwd"] * 4)
        wg = np.array([False] * 8 + [True])
        g, h = _ops(rng, phase.size)
        blocks[name] = (phase, wg, g, h)
    terms = {k: segment_terms(ph, wg, g, h, {}) for k, (ph, wg, g, h) in blocks.items()}
    L, R = np.full((1, 1), float(n_layers)), np.full((1, 1), float(n_rec))
    ph = pass_host([(terms["layer"], L, R)], terms["embedding"], terms["head"], [(0, 0)], [(0, 0)], False)

    def seg(name, sel):
        phase, wg, g, h = blocks[name]
        idx = np.flatnonzero(sel(phase))
        return h[idx], g[idx]

    fwd = [seg("embedding", lambda p: p == "fwd")] + [seg("layer", lambda p: p == "fwd")] * n_layers \
        + [seg("head", lambda p: p == "fwd")]
    rec = [seg("layer", lambda p: p == "recompute"), seg("layer", lambda p: p == "bwd")]
    bwd = [seg("head", lambda p: p == "bwd")] + rec * n_rec + [seg("layer", lambda p: p == "bwd")] * (
        n_layers - n_rec) + [seg("embedding", lambda p: p == "bwd")]
    f_h, f_g = (np.concatenate([x[k] for x in fwd]) for k in (0, 1))
    b_h, b_g = (np.concatenate([x[k] for x in bwd]) for k in (0, 1))
    f_s, b_s = np.full((1, 1), f_g.sum()), np.full((1, 1), b_g.sum())
    for schedule in ("gpipe", "1f1b"):
        tl = simulate_pipeline(schedule, m, f_s, b_s, 0.0, host=ph)
        kinds = tl.order[0, :, 0]
        h = np.concatenate([f_h if k == 0 else b_h for k in kinds])
        g = np.concatenate([f_g if k == 0 else b_g for k in kinds])
        assert tl.end_s[0] == pytest.approx(issue_timeline(h, g).gpu_end_s[-1], rel=1e-9, abs=1e-15)
    # zb-h1 runs the layers' weight-gradient GEMMs as W passes of their own: B leaves them out
    split = pass_host([(terms["layer"], L, R)], terms["embedding"], terms["head"], [(0, 0)], [(0, 0)], True)
    dgrad = lambda p: p == "bwd"  # noqa: E731
    no_w = [seg("layer", lambda p: p == "recompute")]
    lay_b = seg("layer", dgrad)
    lay_b = (lay_b[0][:-1], lay_b[1][:-1])  # the layer's last bwd row is its wgrad GEMM
    b2 = [seg("head", dgrad)] + (no_w + [lay_b]) * n_rec + [lay_b] * (n_layers - n_rec) + [seg("embedding", dgrad)]
    w2 = [(seg("layer", dgrad)[0][-1:], seg("layer", dgrad)[1][-1:])] * n_layers
    passes = {0: (f_h, f_g)}
    for k, ops in ((1, b2), (2, w2)):
        passes[k] = tuple(np.concatenate([x[j] for x in ops] or [np.zeros(0)]) for j in (0, 1))
    tl = simulate_pipeline("zb-h1", m, f_s, np.full((1, 1), passes[1][1].sum() + passes[2][1].sum()), 0.0,
                           wgrad_s=np.full((1, 1), passes[2][1].sum()), host=split)
    h = np.concatenate([passes[k][0] for k in tl.order[0, :, 0]])
    g = np.concatenate([passes[k][1] for k in tl.order[0, :, 0]])
    assert tl.end_s[0] == pytest.approx(issue_timeline(h, g).gpu_end_s[-1], rel=1e-9, abs=1e-15)


def _uniform_host(p, host, lag):
    return PassHost(np.full((3, p, 1), host), np.full((3, p, 1), lag))


def test_a_pipeline_of_short_kernels_runs_at_the_cpus_pace():
    # every pass issues in 100 us and runs in 10 us: each stage's GPU waits for its CPU, pass after pass
    p, m, f, h = 1, 8, 10 * US, 100 * US
    tl = simulate_pipeline("1f1b", m, np.full((p, 1), f), np.full((p, 1), f), 0.0, host=_uniform_host(p, h, 0.0))
    assert tl.end_s[0] == pytest.approx(2 * m * h)  # the sum of the host costs (the last pass's tail inside h)
    # long passes (1 ms) issued in 100 us: only the first pass's issue lag is not hidden
    g, lag = 1e-3, 5 * US
    free = simulate_pipeline("1f1b", m, np.full((4, 1), g), np.full((4, 1), g), 20 * US)
    timed = simulate_pipeline("1f1b", m, np.full((4, 1), g), np.full((4, 1), g), 20 * US,
                              host=_uniform_host(4, h, lag))
    assert np.allclose(timed.end_s, free.end_s + lag)


def test_a_sync_at_every_transfer_costs_the_issue_lag_once_per_microbatch():
    p, m, g, h, lag = 2, 6, 1e-3, 50 * US, 30 * US
    fb = np.full((p, 1), g)
    run = dict(host=_uniform_host(p, h, lag))
    free = simulate_pipeline("gpipe", m, fb, fb, 0.0, **run)
    synced = simulate_pipeline("gpipe", m, fb, fb, 0.0, p2p_sync=True, **run)
    # stage 0 sends every forward's output: its CPU waits for each, then the next pass pays its lag again
    assert free.end_op_s[0, m - 1] == pytest.approx(m * g + lag)
    assert synced.end_op_s[0, m - 1] == pytest.approx(m * (g + lag))
    assert np.all(synced.end_s >= free.end_s)
    # without host costs and with free transfers a sync changes nothing; with transfers it waits for each send,
    # so the sends no longer overlap the next pass
    assert np.allclose(simulate_pipeline("1f1b", m, fb, fb, 0.0, p2p_sync=True).end_s,
                       simulate_pipeline("1f1b", m, fb, fb, 0.0).end_s)
    assert np.all(simulate_pipeline("1f1b", m, fb, fb, 1e-4, p2p_sync=True).end_s
                  > simulate_pipeline("1f1b", m, fb, fb, 1e-4).end_s)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from(["gpipe", "1f1b", "interleaved"]))
def test_the_cpu_never_runs_ahead_past_a_sync_point(seed, schedule):
    rng = np.random.default_rng(seed)
    p, v, m = 4, 2 if schedule == "interleaved" else 1, 8
    f, b = rng.uniform(1, 5, (p, v)) * 1e-4, rng.uniform(1, 5, (p, v)) * 1e-4
    host = PassHost(rng.uniform(0, 5, (3, p, v)) * 1e-4, rng.uniform(0, 1, (3, p, v)) * 1e-4)
    x = float(rng.uniform(0, 1e-4))
    tl = simulate_pipeline(schedule, m, f, b, x, host=host, p2p_sync=True)
    free = simulate_pipeline(schedule, m, f, b, x, host=host)
    assert np.all(tl.end_s >= free.end_s - 1e-15)
    for s in range(p):
        for i in range(1, tl.order.shape[1]):
            kind, c = tl.order[s, i, 0], tl.order[s, i, 2]
            dur = tl.end_op_s[s, i] - tl.start_s[s, i]
            sent = tl.send_to[s, i - 1] >= 0
            if sent:  # the CPU issued the pass only after the previous one and its send ended
                assert tl.end_op_s[s, i] >= tl.end_op_s[s, i - 1] + x + max(host.host_s[kind, s, c],
                                                                            dur + host.lag_s[kind, s, c]) - 1e-12


def test_deepspeed_engine_sends_block_the_stream():
    p, m, g, x = 4, 8, 1e-3, 1e-4
    fb = np.full((p, 1), g)
    mega = simulate_pipeline("1f1b", m, fb, fb, x)
    for engine in ("deepspeed", "deepspeed-0.6"):
        ds = simulate_pipeline("1f1b", m, fb, fb, x, engine=engine)
        assert np.array_equal(ds.order, mega.order)  # TrainSchedule's order is 1F1B's
        assert np.all(ds.end_s > mega.end_s)
        # every send holds its stage's stream: each stage is busy at least its passes plus its sends
        sends = (ds.send_to >= 0).sum(axis=1)
        assert np.all(ds.end_s >= 2 * m * g + sends * x - 1e-12)
    # free transfers: the engines agree
    assert np.allclose(simulate_pipeline("1f1b", m, fb, fb, 0.0, engine="deepspeed").end_s,
                       simulate_pipeline("1f1b", m, fb, fb, 0.0).end_s)
    # one stage: nothing is sent
    one = np.full((1, 1), g)
    assert simulate_pipeline("1f1b", m, one, one, x, engine="deepspeed").end_s[0] == pytest.approx(2 * m * g)
    from flowsim.errors import ConfigError

    with pytest.raises(ConfigError, match="pipeline_engine"):
        simulate_pipeline("interleaved", m, np.full((p, 2), g), np.full((p, 2), g), x, engine="deepspeed")


def test_simulate_with_a_host_model():
    import flowsim

    model = dict(num_layers=2, hidden_size=128, num_attention_heads=4, seq_length=128, vocab_size=1024,
                 activation="swiglu", normalization="rmsnorm", position_embedding="rope", add_bias_linear=False)
    job = dict(model, cluster="dgx-h100", gpus=1, gbs=8)
    gpu_only = flowsim.simulate(job).step_time_s
    eager = flowsim.simulate(job, host_overhead="eager")
    # a small model's kernels are about as short as their issue from Python: the GPU waits for the CPU
    assert eager.step_time_s > 1.3 * gpu_only
    assert eager.stages[0].bubble_s > 0.2 * gpu_only  # the waits show as idle time, not as compute
    # CUDA graphs collapse the host time to the launches (one per step: nothing left to wait for)
    layer = flowsim.simulate(job, host_overhead="eager", cuda_graphs="layer").step_time_s
    full = flowsim.simulate(job, host_overhead="eager", cuda_graphs="full_iteration").step_time_s
    assert gpu_only <= full <= layer < eager.step_time_s
    assert full == pytest.approx(gpu_only, rel=1e-2)
    # a large model's kernels hide the host: the step changes by less than a pass's issue lag
    big = dict(model="llama3-8b", cluster="dgx-h100", gpus=8, tp=8, gbs=8, seq=4096)
    assert flowsim.simulate(big, host_overhead="te").step_time_s == pytest.approx(
        flowsim.simulate(big).step_time_s, rel=1e-3)


def test_cuda_graphs_shrink_the_host_time_of_a_block():
    from flowsim.model.host_costs import block_host_s, host_costs

    cfg, wl, *_ = _layer(framework="megatron-core", framework_version="megatron-bridge-25.11", cuda_graphs="layer")
    layer = wl.layer.compute
    c = host_costs("te", "arm")
    eager = block_host_s(layer, dataclasses.replace(cfg.training, cuda_graphs="none"), "arm")
    # per layer graph: one launch per pass (forward, backward) and a node cost per kernel
    graphed = block_host_s(layer, cfg.training, "arm")
    assert graphed.sum() == pytest.approx(2 * c.graph_launch_s + layer["count"].sum() * c.graph_node_s)
    assert graphed.sum() < eager.sum() / 4
    full = block_host_s(layer, dataclasses.replace(cfg.training, cuda_graphs="full_iteration"), "arm")
    assert full.sum() == pytest.approx(layer["count"].sum() * c.graph_node_s)


def test_module_scope_graphs_launch_once_per_module_and_pass():
    from flowsim.model.host_costs import block_host_s, host_costs

    cfg, wl, *_ = _layer(framework="megatron-core", framework_version="megatron-bridge-25.11", cuda_graphs="module")
    layer = wl.layer.compute
    c = host_costs("te", "arm")
    # attention and MLP modules, forward and backward: four replays
    assert block_host_s(layer, cfg.training, "arm").sum() == \
        pytest.approx(4 * c.graph_launch_s + layer["count"].sum() * c.graph_node_s)
