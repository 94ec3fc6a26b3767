"""Attention variants of the MoE models: Qwen3's per-head QK norm (``qk_layernorm``) and the normalised latents of
DeepSeek's multi-head latent attention."""
import pytest

import flowsim
from flowsim.config import build_config
from flowsim.model.workload import build_layer

QWEN = dict(model="qwen3-235b-a22b", cluster="dgx-h100", gpus=16, tp=4, sp=True, ep=4, gbs=16, mbs=1, seq=4096)


def _row(ops, name, phase="fwd"):
    c = ops.compute
    return c[(c["name"] == name) & (c["phase"] == phase)].iloc[0]


@pytest.mark.parametrize("phase", ["fwd", "bwd"])
def test_qk_norm_is_one_norm_over_the_query_and_key_heads(phase):
    cfg = build_config(**QWEN)
    assert cfg.model.qk_layernorm  # the preset: Qwen3's q_norm / k_norm
    ops = build_layer(cfg, moe=True)
    tokens, tok_sp = 4096, 4096 // 4
    heads, groups, d, h = 64 // 4, 1, 128, 4096  # 4 KV heads over TP 4: one per GPU
    qk, norm = _row(ops, "qk_norm" + (".bwd" if phase == "bwd" else ""), phase), \
        _row(ops, "input_norm" + (".bwd" if phase == "bwd" else ""), phase)
    # the same RMSNorm kernel, per element, over the TP rank's query and key heads of every token
    assert qk["bytes"] / (tokens * (heads + groups) * d) == pytest.approx(norm["bytes"] / (tok_sp * h))
    plain = build_layer(build_config(**QWEN, qk_layernorm=False), moe=True).compute
    assert not plain["name"].str.startswith("qk_norm").any()


def test_qk_norm_costs_time_not_model_flops():
    with_norm, without = (flowsim.simulate(build_config(**QWEN, qk_layernorm=q)) for q in (True, False))
    assert with_norm.step_time_s > without.step_time_s
    assert with_norm.model_flops == without.model_flops


def test_mla_normalises_its_query_and_key_value_latents():
    cfg = build_config(model="deepseek-v3", cluster="dgx-h100", gpus=64, pp=8, ep=8, gbs=64, seq=4096,
                       pipeline_layer_split="balanced")
    ops = build_layer(cfg, moe=True)
    latent, norm = _row(ops, "latent_norm"), _row(ops, "input_norm")
    assert latent["bytes"] / (4096 * (1536 + 512)) == pytest.approx(norm["bytes"] / (4096 * 7168))


def test_qk_layernorm_from_the_importers():
    from flowsim.config.importers import from_hf_config, from_megatron_args

    args = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --bf16 --seq-length 1024 --vocab-size 32000 "
            "--qk-layernorm").split()
    assert from_megatron_args(args).config["model"]["qk_layernorm"] is True
    hf = from_hf_config({"model_type": "qwen3", "hidden_size": 1024, "num_attention_heads": 8, "num_hidden_layers": 4,
                         "intermediate_size": 3072, "vocab_size": 32000, "max_position_embeddings": 4096})
    assert hf.config["model"]["qk_layernorm"] is True
    assert ("qk_layernorm", True, "Qwen3 family (transformers qwen3)") in hf.defaults
