"""MoE layers: token counts under the capacity rule, the two token dispatchers, their collectives."""
import pytest

import flowsim
from flowsim.config import build_config
from flowsim.errors import ConfigError
from flowsim.model.moe import expert_tokens
from flowsim.model.workload import build_workload

# Mixtral 8x7B: 8 experts, top-2, h 4096, expert width 14336; 8 GPUs in EP 8, seq 4096, one sequence each;
# perfectly even routing (imbalance factor 1)
MIX = dict(model="mixtral-8x7b", cluster="dgx-h100", gpus=8, ep=8, gbs=8, mbs=1, moe_imbalance_factor=1.0)
TOK, H, E, K = 4096, 4096, 8, 2


def _gemm_m(cfg, name="expert_fc1"):
    c = build_workload(cfg).moe_layer.compute
    return int(c[(c["name"] == name) & (c["phase"] == "fwd")]["m"].iloc[0])


def _comms(cfg, phase="fwd"):
    return [(c.group, c.op, c.size_bytes) for c in build_workload(cfg).moe_layer.comms if c.phase == phase]


def test_balanced_dropless_routing():
    cfg = build_config(**MIX)
    # every rank sends each expert TOK * K / E tokens; an expert gets that from each of the 8 ranks
    assert expert_tokens(cfg, TOK) == (TOK * K, TOK * K // E * 8)
    assert _gemm_m(cfg) == TOK * K // E * 8
    a2a = TOK * K * H * 2
    counts = ("tpep", "allgather", 8 * E * 8)  # the 8 ranks' int64 token counts per expert
    assert _comms(cfg) == [counts, ("ep", "alltoall", a2a), ("ep", "alltoall", a2a)]
    assert _comms(cfg, "bwd") == [("ep", "alltoall", a2a), ("ep", "alltoall", a2a)]  # backward reuses them


@pytest.mark.parametrize("extra, exchanged", [
    (dict(), True),
    (dict(recompute_granularity="selective", recompute_modules="moe"), True),
    (dict(moe_expert_capacity_factor=1.0), True),  # dropping without padding: the counts still vary
    (dict(moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True), False),  # fixed sizes
    (dict(moe_token_dispatcher_type="allgather"), False),
    (dict(moe_token_dispatcher_type="flex"), False),  # DeepEP / HybridEP count inside their own kernels
])
def test_alltoall_dispatcher_gathers_the_token_counts_each_forward(extra, exchanged):
    cfg = build_config(**MIX, **extra)
    phases = ("fwd", "recompute") if extra.get("recompute_modules") else ("fwd",)
    for ph in phases + ("bwd",):
        got = [c for c in _comms(cfg, ph) if c[:2] == ("tpep", "allgather") and c[2] == 8 * E * 8]
        assert len(got) == int(exchanged and ph != "bwd"), (ph, _comms(cfg, ph))
    assert not [c for c in _comms(build_config(**dict(MIX, ep=1, gpus=8)), "fwd") if c[0] == "tpep"]


def test_capacity_factor_drops_and_padding_fixes_the_counts():
    load = TOK * K / E  # 1024 tokens per expert per rank
    dropped = build_config(**MIX, moe_expert_capacity_factor=0.5)
    assert expert_tokens(dropped, TOK) == (E * load / 2, int(load / 2) * 8)
    roomy = build_config(**MIX, moe_expert_capacity_factor=1.25)
    assert expert_tokens(roomy, TOK) == expert_tokens(build_config(**MIX), TOK)  # capacity only caps
    padded = build_config(**MIX, moe_expert_capacity_factor=1.25, moe_pad_expert_input_to_capacity=True)
    cap = 1280  # ceil(1024 * 1.25), Megatron-LM get_capacity
    assert _gemm_m(padded) == cap * 8
    assert _comms(padded)[0] == ("ep", "alltoall", E * cap * H * 2)
    slow, fast = flowsim.simulate(padded), flowsim.simulate(dropped)
    assert slow.step_time_s > flowsim.simulate(build_config(**MIX)).step_time_s > fast.step_time_s


def test_allgather_dispatcher_gathers_the_group_tokens():
    ag = build_config(**MIX, moe_token_dispatcher_type="allgather")
    size = 8 * TOK * H * 2  # [tokens of the 8 ranks, h]
    assert _comms(ag) == [("tpep", "allgather", size), ("tpep", "reducescatter", size)]
    assert _comms(ag, "bwd") == [("tpep", "allgather", size), ("tpep", "reducescatter", size)]
    # the experts see the same tokens as with the all-to-all dispatcher
    assert _gemm_m(ag) == _gemm_m(build_config(**MIX))
    c = build_workload(ag).moe_layer.compute
    permute = float(c[(c["name"] == "permute") & (c["phase"] == "fwd")]["bytes"].iloc[0])
    assert permute == 2 * (E // 8) * (TOK * K // E * 8) * H * 2  # only the tokens of the local expert
    r = flowsim.simulate(ag)
    assert any(x.group == "tpep" and x.op == "allgather" and x.n_ranks == 8 for x in r.collectives)


def test_allgather_dispatcher_with_expert_tensor_parallelism():
    cfg = build_config(model="mixtral-8x7b", cluster="dgx-h100", gpus=16, ep=8, etp=2, gbs=16,
                       moe_token_dispatcher_type="allgather", moe_imbalance_factor=1.0)
    # the group is etp x ep = 16 ranks; each expert runs on the tokens of all 16 with half its width
    assert _comms(cfg)[0] == ("tpep", "allgather", 16 * TOK * H * 2)
    assert _gemm_m(cfg) == TOK * K // E * 16
    c = build_workload(cfg).moe_layer.compute
    assert int(c[(c["name"] == "expert_fc2") & (c["phase"] == "fwd")]["k"].iloc[0]) == 14336 // 2


@pytest.mark.parametrize("kw, message", [
    (dict(moe_expert_capacity_factor=-1), "moe_expert_capacity_factor: must be a "),
    (dict(moe_pad_expert_input_to_capacity=True), "moe_pad_expert_input_to_capacity: needs moe_expert_capacity"),
    (dict(moe_token_dispatcher_type="deepep"), "moe_token_dispatcher_type: must be one of alltoall, allgather, flex"),
    (dict(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="nccl"),
     "moe_flex_dispatcher_backend: must be one of deepep, hybridep"),
    (dict(moe_imbalance_factor=0.5), "moe_imbalance_factor: must be 0 (modelled) or a finite number >= 1"),
    (dict(moe_imbalance_factor="high"), "moe_imbalance_factor: must be a"),
])
def test_moe_rules(kw, message):
    with pytest.raises(ConfigError) as e:
        build_config(**{**MIX, **kw})
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_ep_overlap_pairs_each_forward_with_the_previous_backward():
    # one stage, m micro-batches: F0, then (F_k, B_{k-1}) as one call lasting max(compute, all-to-all) when the
    # all-to-all holds no SMs, then B_{m-1}
    import numpy as np

    from flowsim.step.schedule import held_microbatches, simulate_pipeline

    f, b, cf, cb, m = 3.0, 5.0, 1.0, 2.0, 6
    one = (np.array([[f]]), np.array([[b]]))
    plain = simulate_pipeline("1f1b", m, *one, 0.0)
    assert plain.end_s[0] == pytest.approx(m * (f + b))
    paired = simulate_pipeline("1f1b", m, *one, 0.0, overlap_comm=(np.array([[cf]]), np.array([[cb]]), 0.0),
                               paired=True)
    call = max(f + b - cf - cb, cf + cb)
    assert paired.end_s[0] == pytest.approx(f + (m - 1) * call + b)
    assert held_microbatches("1f1b", 1, 1, m, True) == (2.0,) and held_microbatches("1f1b", 1, 1, m) == (1.0,)


def test_ep_overlap_in_a_step():
    kw = dict(model="mixtral-8x7b", cluster="dgx-h100", gpus=16, ep=8, gbs=32, nics_per_node=1)
    base, over = flowsim.simulate(kw), flowsim.simulate({**kw, "overlap_moe_expert_parallel_comm": True})
    assert over.step_time_s < base.step_time_s
    assert over.stages[0].ep_comm_s < base.stages[0].ep_comm_s
    assert over.memory_bytes_per_gpu > base.memory_bytes_per_gpu  # one more micro-batch in flight
    for extra, message in [(dict(pp=2), "overlap_moe_expert_parallel_comm: with pipeline parallelism needs"),
                           (dict(ep=1), "overlap_moe_expert_parallel_comm: needs a MoE model"),
                           (dict(moe_token_dispatcher_type="allgather"), "overlap_moe_expert_parallel_comm: needs")]:
        with pytest.raises(ConfigError) as e:
            build_config({**kw, "overlap_moe_expert_parallel_comm": True, **extra})
        assert str(e.value).startswith(message)


def _expert_flops(cfg):
    c = build_workload(cfg).moe_layer.compute
    return float((c[c["name"].str.startswith("expert_fc")]["flops"] * c["count"]).sum())


@pytest.mark.parametrize("etp", [2, 4])
def test_expert_tensor_parallelism_keeps_expert_flops(etp):
    # 16 GPUs, EP 4: with ETP k each expert runs on the tokens of k times as many ranks at 1/k of its width
    kw = dict(model="mixtral-8x7b", cluster="dgx-h100", gpus=16, ep=4, tp=4, sp=True, gbs=16, moe_imbalance_factor=1.0)
    one, split = build_config(**kw), build_config(**kw, etp=etp)
    assert _expert_flops(split) == _expert_flops(one)
    tok = TOK // 4  # the sequence shard of one TP rank routes its tokens
    per_expert = tok * K // E * 4 * etp
    assert _gemm_m(split) == per_expert
    a2a = tok * K * H * 2
    gathered = (E // 4) * per_expert * H * 2  # two local experts' tokens from the ETP group
    for phase in ("fwd", "bwd"):  # backward: the gradients take the same collectives the other way
        expert = [c for c in _comms(split, phase) if c[0] in ("ep", "etp")]
        assert expert == [("ep", "alltoall", a2a), ("ep", "alltoall", a2a),
                          ("etp", "allgather", gathered), ("etp", "reducescatter", gathered)]
    r = flowsim.simulate(split)
    assert any(x.group == "etp" and x.op == "allgather" and x.n_ranks == etp for x in r.collectives)


@pytest.mark.parametrize("kw, message", [
    (dict(gpus=8, ep=8, etp=2), "expert_model_parallel_size: expert_model_parallel_size * expert_tensor_parallel"),
    (dict(gpus=16, ep=4, etp=3), "expert_model_parallel_size: expert_model_parallel_size * expert_tensor_parallel"),
])
def test_expert_tensor_parallel_layout_rules(kw, message):
    with pytest.raises(ConfigError) as e:
        build_config(**{**MIX, "gbs": 16, **kw})
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


@pytest.mark.parametrize("extra, message", [
    (dict(recompute="full"), "does not run with full recompute"),
    (dict(moe_shared_expert_overlap=True), "replaces moe_shared_expert_overlap"),
    (dict(mtp_num_layers=2), "supports at most one multi-token prediction layer"),
])
def test_ep_overlap_rules_of_megatron_core(extra, message):
    """megatron-core 0.15.0 TransformerConfig refuses these beside overlap_moe_expert_parallel_comm."""
    kw = dict(model="deepseek-v3", cluster="hgx-h800", gpus=64, ep=16, pp=2, vpp=2, gbs=64,
              pipeline_layer_split="balanced", overlap_moe_expert_parallel_comm=True)
    build_config(**kw, mtp_num_layers=1)  # one MTP layer is accepted
    with pytest.raises(ConfigError) as e:
        build_config(**kw, **extra)
    assert str(e.value).startswith("overlap_moe_expert_parallel_comm: " + message)
