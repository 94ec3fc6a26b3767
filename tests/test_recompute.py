"""Activation recompute policies: what each re-runs (FLOPs, collectives), on which layers, and what it keeps."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import flowsim
from flowsim.config import build_config
from flowsim.errors import ConfigError
from flowsim.step.memory import layer_activation_bytes
from flowsim.model.recompute import op_sac_projections, recompute_layer_counts
from flowsim.model.workload import build_workload

LLAMA = dict(model="llama3-8b", cluster="dgx-h100", gpus=8, dp=8, gbs=16, mbs=2)


def _rec_flops(opset, kind=None):
    c = opset.compute
    sel = c["phase"] == "recompute"
    if kind:
        sel &= c["kind"] == kind
    return float((c["flops"] * c["count"])[sel].sum())


def _fwd_flops(opset, names):
    c = opset.compute
    sel = (c["phase"] == "fwd") & c["name"].isin(names)
    return float((c["flops"] * c["count"])[sel].sum())


def test_megatron_selective_recomputes_core_attention_on_every_layer():
    cfg = build_config(**LLAMA, recompute="selective")
    wl = build_workload(cfg)
    assert _rec_flops(wl.layer) == pytest.approx(_fwd_flops(wl.layer, ["attention"]), rel=1e-12)
    assert (wl.chunk_recompute_layers == wl.chunk_layers).all()
    # the step's hardware FLOPs grow by one attention forward per layer, micro-batch and GPU
    base, sel = flowsim.simulate(build_config(**LLAMA)), flowsim.simulate(cfg)
    m = cfg.num_microbatches
    extra = 32 * m * 8 * _fwd_flops(wl.layer, ["attention"])
    assert sel.hardware_flops - base.hardware_flops == pytest.approx(extra, rel=1e-9)
    assert sel.step_time_s > base.step_time_s


def test_megatron_recompute_modules_mlp_and_layernorm():
    cfg = build_config(**LLAMA, recompute="selective", recompute_modules="mlp,layernorm")
    wl = build_workload(cfg)
    assert _rec_flops(wl.layer, "gemm") == pytest.approx(_fwd_flops(wl.layer, ["fc1", "fc2"]), rel=1e-12)
    c = wl.layer.compute
    assert set(c[c["phase"] == "recompute"]["name"]) == {"fc1", "fc2", "activation", "input_norm", "post_attn_norm"}
    # memory: fc1 output (2f for SwiGLU) and activation output (f), and the two norm outputs, are dropped
    s, b, h, f = 8192, 2, 4096, 14336
    full = layer_activation_bytes(build_config(**LLAMA))
    assert full - layer_activation_bytes(cfg) == pytest.approx(2 * s * b * (3 * f + 2 * h), rel=1e-12)


def test_recompute_modules_mlp_reruns_its_tensor_parallel_collectives():
    cfg = build_config(model="llama3-8b", cluster="dgx-h100", gpus=8, tp=8, sp=True, gbs=4,
                       recompute="selective", recompute_modules=["mlp"])
    rec = [c for c in build_workload(cfg).layer.comms if c.phase == "recompute"]
    assert sorted(c.op for c in rec) == ["allgather", "reducescatter"]


def test_torchtitan_op_policy_recomputes_every_second_matmul():
    # Llama block: wq wk wv wo w1 w3 w2; mm 2, 4, 6 (wk, wo, w3) are recomputed, and no attention kernel
    assert op_sac_projections(gated=True, bias=False) == ("k", "o", "up")
    assert op_sac_projections(gated=False, bias=False) == ("k", "o", "down")
    assert op_sac_projections(gated=True, bias=True) == ("q", "k", "v", "o", "gate", "up", "down")
    cfg = build_config(**LLAMA, recompute="selective", selective_ac_option="op")
    wl = build_workload(cfg)
    tokens, h, kv, f = 2 * 8192, 4096, 8 * 128, 14336
    assert _rec_flops(wl.layer, "gemm") == pytest.approx(2 * tokens * h * (kv + h + f), rel=1e-12)
    assert _rec_flops(wl.layer, "attn_fwd") == 0
    c = wl.layer.compute
    fwd_memory = c[(c["phase"] == "fwd") & (c["kind"] == "memory")]
    rec_memory = c[(c["phase"] == "recompute") & (c["kind"] == "memory")]
    assert float(rec_memory["bytes"].sum()) == pytest.approx(float(fwd_memory["bytes"].sum()))
    # kept: layer input h, q (a d), v (g d), w1 output f, w2 output h, attention output (a d)
    assert layer_activation_bytes(cfg) == pytest.approx(2 * tokens * (h + 4096 + kv + f + h + 4096), rel=1e-12)


def test_torchtitan_op_policy_with_tensor_parallelism_regathers_inputs():
    cfg = build_config(model="llama3-8b", cluster="dgx-h100", gpus=8, tp=8, sp=True, gbs=4,
                       recompute="selective", selective_ac_option="op")
    rec = [c for c in build_workload(cfg).layer.comms if c.phase == "recompute"]
    assert [(c.op, c.count) for c in rec] == [("allgather", 2)]


def test_every_nth_layer_counts_along_each_rank():
    class T:
        recompute_granularity, selective_ac_option, recompute_num_layers = "selective", "3", 0

    layers = np.array([[4, 4], [5, 3]])
    # rank 0: blocks 1-4 | 5-8 -> 3 | 6 ; rank 1: blocks 1-5 | 6-8 -> 3 | 6
    assert recompute_layer_counts(T, layers).tolist() == [[1, 1], [1, 1]]
    cfg = build_config(**LLAMA, recompute="selective", selective_ac_option=2)
    wl = build_workload(cfg)
    assert wl.chunk_recompute_layers.tolist() == [[16]]
    full = build_workload(build_config(**LLAMA, recompute="full"))
    assert _rec_flops(wl.layer) == pytest.approx(_rec_flops(full.layer), rel=1e-12)


def test_every_nth_layer_costs_half_of_full_recompute():
    none = flowsim.simulate(build_config(**LLAMA))
    half = flowsim.simulate(build_config(**LLAMA, recompute="selective", selective_ac_option="2"))
    full = flowsim.simulate(build_config(**LLAMA, recompute="full"))
    assert half.hardware_flops - none.hardware_flops == pytest.approx(
        (full.hardware_flops - none.hardware_flops) / 2, rel=1e-9)


@pytest.mark.parametrize("kw, message", [
    (dict(recompute="selective", recompute_modules="core_attn,attn"), "recompute_modules: unknown module"),
    (dict(recompute_modules="mlp"), "recompute_modules: needs recompute_granularity selective"),
    (dict(recompute="selective", selective_ac_option="sometimes"), "selective_ac_option: must be 'op' or a positive"),
    (dict(recompute="full", selective_ac_option="op"), "selective_ac_option: needs recompute_granularity selective"),
    (dict(recompute="selective", selective_ac_option="op", recompute_modules="mlp"),
     "selective_ac_option: is torchtitan's policy"),
    (dict(recompute="selective", recompute_num_layers=2), "recompute_num_layers: needs recompute_granularity full"),
    (dict(model="mixtral-8x7b", recompute="selective", selective_ac_option="op"),
     "selective_ac_option: op is modelled for dense models"),
])
def test_recompute_rules(kw, message):
    base = dict(model="llama3-8b", cluster="dgx-h100", gpus=8)
    base.update(kw)
    with pytest.raises(ConfigError) as e:
        build_config(**base)
    assert str(e.value).startswith(message)


@settings(max_examples=25, deadline=None)
@given(tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2, 4]), mbs=st.sampled_from([1, 2]),
       modules=st.lists(st.sampled_from(["core_attn", "layernorm", "mlp"]), min_size=1, unique=True),
       option=st.sampled_from(["op", "1", "2", "3"]))
def test_recompute_costs_time_and_saves_memory(tp, pp, mbs, modules, option):
    # any policy re-runs work (never a faster step) and keeps fewer activations (never more memory);
    # checking every N-th block fully costs at most full recompute
    base = dict(model="llama3-8b", cluster="dgx-h100", gpus=16, tp=tp, pp=pp, mbs=mbs, gbs=16 * mbs,
                sp=tp > 1, seq=4096)
    none = flowsim.simulate(base)
    full = flowsim.simulate({**base, "recompute": "full"})
    for kw in (dict(recompute="selective", recompute_modules=modules),
               dict(recompute="selective", selective_ac_option=option)):
        r = flowsim.simulate({**base, **kw})
        assert none.step_time_s <= r.step_time_s * (1 + 1e-12)
        assert r.hardware_flops >= none.hardware_flops
        assert r.memory_bytes_per_gpu <= none.memory_bytes_per_gpu * (1 + 1e-12)
    every = flowsim.simulate({**base, "recompute": "selective", "selective_ac_option": option}) \
        if option != "op" else None
    if every is not None:
        assert every.hardware_flops <= full.hardware_flops * (1 + 1e-12)
