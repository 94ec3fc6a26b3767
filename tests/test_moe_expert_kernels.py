"""Kernels Megatron-core's routed experts add around their grouped GEMMs: the clamped gated activation
(``activation_func_clamp_value``, GPT-OSS) and the fc2 bias weighted by the routing probabilities
(``add_bias_linear``): known byte counts from megatron-core 0.15.0 and autograd."""
import pytest

import flowsim
from flowsim.config import build_config
from flowsim.errors import ConfigError
from flowsim.model.moe import expert_tokens
from flowsim.model.workload import build_layer
from flowsim.validation.runs import row_to_config
from test_validate_runs import BASE_ROW

# Mixtral 8x7B on EP 8, perfectly even routing: each GPU runs one expert on 8192 tokens (4096 x top-2 / 8 x 8)
MIX = dict(model="mixtral-8x7b", cluster="dgx-h100", gpus=8, ep=8, gbs=8, mbs=1, moe_imbalance_factor=1.0)
H, WIDTH = 4096, 14336


def _bytes(cfg, name, phase):
    """Total bytes (all instances) of the MoE layer's rows called ``name`` in ``phase``, and their kernels."""
    c = build_layer(cfg, moe=True).compute
    sel = c[(c["name"] == name) & (c["phase"] == phase)]
    return float((sel["bytes"] * sel["count"]).sum()), int(sel["count"].sum())


def _tokens(cfg):
    return expert_tokens(cfg, 4096)[1]  # tokens through the GPU's one local expert


@pytest.mark.parametrize("fusion, fwd_kernels, fwd_bytes", [("fused", 3, 16), ("eager", 2, 8)])
def test_clamp_kernels_known_answer(fusion, fwd_kernels, fwd_bytes):
    cfg = build_config(**MIX, activation_func_clamp_value=7.0, kernel_fusion=fusion)
    elems = _tokens(cfg) * WIDTH  # the activation's output: tokens x expert width
    fwd = [_bytes(cfg, n, "fwd") for n in ("expert_clamp", "expert_clamp_cat")]
    assert sum(b for b, _ in fwd) == elems * fwd_bytes  # clamps 2 x (2 + 2), the fused path's cat 2 x (2 + 2)
    assert sum(k for _, k in fwd) == fwd_kernels
    bwd = [_bytes(cfg, n, "bwd") for n in ("expert_clamp.bwd", "expert_clamp_cat.bwd")]
    # clamp_backward: gate half 3 + 5, linear half 3 + 3 + 3 + 5; the chunks' gradients concatenated: 8
    assert sum(b for b, _ in bwd) == pytest.approx(elems * (22 + 8))
    assert sum(k for _, k in bwd) == 7
    plain = build_layer(build_config(**MIX, kernel_fusion=fusion), moe=True).compute
    assert not plain["name"].str.startswith("expert_clamp").any()


def test_clamp_reruns_with_the_recomputed_activation():
    cfg = build_config(**MIX, activation_func_clamp_value=7.0, recompute_granularity="selective",
                       recompute_modules="moe_act")
    assert _bytes(cfg, "expert_clamp", "recompute") == _bytes(cfg, "expert_clamp", "fwd")


@pytest.mark.parametrize("router_dtype, fwd_bytes, bwd_bytes", [
    ("", 5 * 2 + 2, 6 * 2 + 4),  # 16-bit probabilities: b * p 2, t + b * p 2 + 2 + 2, cat 2 + 2; grads 6 x 2, cat 4
    ("fp32", 5 * 4 + 2 + 6, 6 * 4 + 6 + 6 + 4),  # fp32: the same with e = 4, the cast down 6 and the grads' casts
])
def test_weighted_expert_bias_known_answer(router_dtype, fwd_bytes, bwd_bytes):
    cfg = build_config(**MIX, add_bias_linear=True, moe_router_dtype=router_dtype)
    out = _tokens(cfg) * H  # fc2 output elements of the local expert
    names = ("expert_bias", "expert_bias_cat", "expert_bias_cast")
    fwd = [_bytes(cfg, n, "fwd") for n in names]
    assert sum(b for b, _ in fwd) == pytest.approx(out * fwd_bytes)
    assert sum(k for _, k in fwd) == 2 + 1 + (1 if router_dtype else 0)  # per expert b * p and the add
    bwd = [_bytes(cfg, n + ".bwd", "bwd") for n in names]
    assert sum(b for b, _ in bwd) == pytest.approx(out * bwd_bytes)
    plain = build_layer(build_config(**MIX, add_bias_linear=False), moe=True).compute
    assert not plain["name"].str.startswith("expert_bias").any()


def test_bias_and_clamp_cost_time_not_model_flops():
    base = flowsim.simulate(build_config(**MIX, add_bias_linear=False))
    more = flowsim.simulate(build_config(**MIX, add_bias_linear=False, activation_func_clamp_value=7.0))
    assert more.step_time_s > base.step_time_s and more.model_flops == base.model_flops


@pytest.mark.parametrize("extra", [dict(activation_func_clamp_value=-1.0),
                                   dict(activation_func_clamp_value=float("inf")),
                                   dict(activation_func_clamp_value=True),
                                   dict(model="gpt3-175b", activation_func_clamp_value=7.0)])  # GeLU: no gate
def test_bad_clamp_is_a_one_line_error(extra):
    with pytest.raises(ConfigError, match="activation_func_clamp_value"):
        build_config(**{**MIX, **extra})


def test_gpt_oss_rows_get_the_clamp_and_the_biases():
    row = {**BASE_ROW, "gated_mlp": 1, "moe_num_experts": 128, "moe_topk": 4, "moe_ffn_hidden_size": 512, "ep": 8,
           "notes": "GPT-OSS-120B: every layer MoE; attention sinks; clamped SwiGLU."}
    mapping, assumptions = row_to_config(row)
    m = flowsim.build_config(mapping).model
    assert m.activation_func_clamp_value == 7.0 and m.add_bias_linear
    assert "add_bias_linear: on (GPT-OSS's linear layers carry biases)" in assumptions
    mapping, _ = row_to_config({**row, "notes": "token-dropless"})
    m = flowsim.build_config(mapping).model
    assert m.activation_func_clamp_value == 0 and not m.add_bias_linear


def test_megatron_bridge_deepseek_rows_gate_in_fp32():
    """Megatron-Bridge's DeepSeek provider sets moe_router_dtype fp32: its rows price the router GEMM in fp32 (on
    the GPU's fp32 peak), other frameworks' DeepSeek rows keep the 16-bit router."""
    row = {**BASE_ROW, "gated_mlp": 1, "moe_num_experts": 256, "moe_topk": 8, "moe_ffn_hidden_size": 2048, "ep": 8,
           "notes": "DeepSeek-V3: first 3 layers dense.", "framework_version": "megatron-bridge-25.11"}
    mapping, assumptions = row_to_config(row)
    assert flowsim.build_config(mapping).training.moe_router_dtype == "fp32"
    assert "moe_router_dtype: fp32 (Megatron-Bridge's DeepSeek provider)" in assumptions
    for other in ({**row, "framework_version": ""}, {**row, "notes": "Qwen3-235B-A22B: every layer MoE."}):
        mapping, _ = row_to_config(other)
        assert flowsim.build_config(mapping).training.moe_router_dtype == ""
