"""Multi-token prediction (DeepSeek-V3's MTP, Megatron-LM ``--mtp-num-layers``): layers, head, FLOPs, errors."""
import pytest

import flowsim
from flowsim.config import build_config
from flowsim.errors import ConfigError
from flowsim.model.workload import build_workload, chunk_layer_counts, model_flops_per_token

# DeepSeek-V3 (61 layers, first 3 dense, MoE from layer 3) on 64 H800: PP 4 with 2 chunks, EP 16
DSV3 = dict(model="deepseek-v3", cluster="hgx-h800", gpus=64, pp=4, vpp=2, ep=16, gbs=64, mbs=1, seq=4096,
            distributed_optimizer=True, pipeline_layer_split="balanced", moe_imbalance_factor=1.0)


def test_mtp_layer_joins_the_last_virtual_stage_as_a_moe_layer():
    base, mtp = build_config(**DSV3), build_config(**DSV3, mtp_num_layers=1)
    (c0, m0), (c1, m1) = chunk_layer_counts(base, with_moe=True), chunk_layer_counts(mtp, with_moe=True)
    added = c1 - c0
    assert added[3, 1] == 1 and added.sum() == 1  # last stage, last chunk
    assert (m1 - m0)[3, 1] == 1  # DeepSeek-V3's last layer is an MoE layer, so is its MTP layer
    assert c1.sum() == 61 + 1


def test_mtp_head_runs_the_projection_and_the_output_head_again():
    cfg = build_config(**DSV3, mtp_num_layers=1)
    head = build_workload(cfg).head.compute
    rows = {(r["name"], r["phase"]): r for r in head.to_dict("records")}
    tokens, h = 4096, 7168
    proj = rows[("mtp0_eh_proj", "fwd")]
    assert (proj["m"], proj["n"], proj["k"]) == (tokens, h, 2 * h)  # [next embedding; hidden] -> h
    lm, mtp_lm = rows[("lm_head", "fwd")], rows[("mtp0_lm_head", "fwd")]
    assert (mtp_lm["m"], mtp_lm["n"], mtp_lm["k"]) == (lm["m"], lm["n"], lm["k"])  # the shared output layer
    assert ("mtp0_cross_entropy", "fwd") in rows and ("mtp0_enorm", "fwd") in rows
    assert not any(name.startswith("mtp") for name, _ in
                   {(r["name"], r["phase"]) for r in build_workload(build_config(**DSV3)).head.compute.to_dict(
                       "records")})


def test_mtp_model_flops_known_answer():
    """One MTP module adds a MoE layer's FLOPs (attention weights, routed top-k and shared experts, router, the
    causal score terms), the 2h x h projection and a second pass through the output head."""
    base, mtp = build_config(**DSV3), build_config(**DSV3, mtp_num_layers=1)
    m = base.model
    h, v, s = m.hidden_size, m.vocab_size, 4096
    per_moe = (m.moe_router_topk * m.mlp_weights(m.moe_ffn_hidden_size)
               + m.mlp_weights(m.moe_shared_expert_intermediate_size) + h * m.num_moe_experts)
    weights = m.attention_weights() + per_moe + 2 * h * h + h * v
    attn = 2.0 * s * m.num_attention_heads * (m.qk_head_dim + m.qk_pos_emb_head_dim + m.v_head_dim) / 2 * 0.5
    assert model_flops_per_token(mtp) - model_flops_per_token(base) == pytest.approx(6 * weights + 6 * attn)


def test_mtp_slows_the_last_stage_and_keeps_the_invariants():
    base = flowsim.simulate(build_config(**DSV3))
    mtp = flowsim.simulate(build_config(**DSV3, mtp_num_layers=1))  # simulate checks HFU >= MFU and the rest
    assert mtp.step_time_s > base.step_time_s
    last = lambda r: r.stages[-1].compute_s  # noqa: E731
    assert last(mtp) > last(base)
    assert mtp.stages[0].compute_s == pytest.approx(base.stages[0].compute_s)
    assert mtp.memory_gb_per_gpu >= base.memory_gb_per_gpu


def test_mtp_from_megatron_arguments():
    from flowsim.config.importers import from_megatron_args

    imported = from_megatron_args("--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --bf16 "
                                  "--mtp-num-layers 1 --seq-length 1024 --vocab-size 32000".split())
    assert imported.config["model"]["mtp_num_layers"] == 1


@pytest.mark.parametrize("value", [-1, 1.5, "one"])
def test_mtp_num_layers_rule(value):
    with pytest.raises(ConfigError, match="mtp_num_layers"):
        build_config(**DSV3, mtp_num_layers=value)
