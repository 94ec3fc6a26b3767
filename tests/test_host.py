"""The host-side timeline (flowsim.step.host): known answers and the closed form of repeated blocks."""
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from flowsim.model.host_costs import graphed_host_s
from flowsim.step.host import block_terms, issue_timeline, repeated_block_end_s, steady_run_s

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
    assert steady_run_s(t.gpu_s, t.host_s) == pytest.approx([8 * US, 15 * US])
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
    from flowsim.step.blocks import ops_frame
    from flowsim.step.pricer import CollectivePricer

    cfg = build_config(dict(num_layers=2, hidden_size=256, num_attention_heads=4, seq_length=256, vocab_size=32000,
                            activation="swiglu", normalization="rmsnorm", position_embedding="rope",
                            add_bias_linear=False, cluster="dgx-h100", gpus=1, gbs=1, **kw))
    gpu = get_gpu(cfg.cluster.gpu)
    wl = build_workload(cfg)
    ops, spans = ops_frame(wl)
    return cfg, wl, ops, spans, op_times(ops, gpu)[spans["layer"]], CollectivePricer(cfg.cluster, gpu,
                                                                                     group_spans(cfg.training))


def test_block_times_with_host_costs():
    from flowsim.model.host_costs import block_host_s
    from flowsim.step.blocks import block_times, pass_s

    cfg, wl, ops, spans, t, comms = _layer(framework="torchtitan")  # eager PyTorch, x86 host
    plain = block_times(wl.layer, t, comms, False, 1)
    host = block_host_s(wl.layer.compute, cfg.training, cfg.cluster.cpu)
    assert block_times(wl.layer, t, comms, False, 1, np.zeros_like(host)) == plain  # no CPU time: unchanged
    timed = block_times(wl.layer, t, comms, False, 1, host)
    phase = wl.layer.compute["phase"].to_numpy()
    for ph in ("fwd", "bwd"):  # each run takes the longer of the stream's and the CPU's seconds
        assert pass_s(timed, ph) == pytest.approx(max(pass_s(plain, ph), host[phase == ph].sum()))
    # a small layer's forward kernels are shorter than their issue from Python: the CPU sets the pace
    assert pass_s(timed, "fwd") == pytest.approx(host[phase == "fwd"].sum())
    assert pass_s(timed, "fwd") > pass_s(plain, "fwd")
    # kernels longer than their issue: the host model changes nothing
    assert block_times(wl.layer, t, comms, False, 1, host * 1e-3) == plain
    # no framework profile, no host model
    cfg0, *_ = _layer()
    assert block_host_s(wl.layer.compute, cfg0.training, "intel") is None


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
