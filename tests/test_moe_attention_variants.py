"""Attention variants of the MoE models: Qwen3's per-head QK norm (``qk_layernorm``), the normalised latents of
DeepSeek's multi-head latent attention, GPT-OSS's sliding-window layers (``window_size``, ``window_attn_skip_freq``)."""
import pytest

import flowsim
from flowsim.config import build_config
from flowsim.errors import ConfigError
from flowsim.model.workload import build_layer, model_flops_per_token

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


# GPT-OSS-120B's shape (Megatron-Bridge GPTOSSProvider: 36 layers, h 2880, 64 heads of 64, 8 KV heads, 128 experts,
# top-4), on 8 B200 with EP 8; its attention alternates a 128-token window with full attention
OSS = dict(num_layers=36, hidden_size=2880, num_attention_heads=64, num_query_groups=8, kv_channels=64,
           ffn_hidden_size=2880, num_moe_experts=128, moe_router_topk=4, vocab_size=201088, activation="swiglu",
           normalization="rmsnorm", position_embedding="rope", add_bias_linear=False,
           untie_embeddings_and_output_weights=True, gpu="b200", num_gpus=8, ep=8, global_batch_size=8,
           micro_batch_size=1, seq_length=4096, moe_imbalance_factor=1.0)


def _attention(cfg):
    c = build_layer(cfg, moe=True).compute
    return c[c["kind"] == "attn_fwd"].set_index("name")


def test_alternating_window_splits_the_heads_between_full_and_windowed_attention():
    rows = _attention(build_config(OSS, window_size=128, window_attn_skip_freq=2))
    full, win = rows.loc["attention"], rows.loc["attention_window"]
    assert (full["heads"], full["kv_heads"], full["seq_q"], full["seq_k"], bool(full["causal"])) == (32, 4, 4096, 4096,
                                                                                                       True)
    # 32 chunks of 128 queries, each against the 256 keys of its own and the previous chunk
    assert (win["batch"], win["heads"], win["kv_heads"], win["seq_q"], win["seq_k"], bool(win["causal"])) == \
        (32, 32, 4, 128, 256, False)
    assert win["flops"] == 4.0 * 32 * 128 * 256 * 32 * 64
    every = _attention(build_config(OSS, window_size=128))
    assert list(every.index) == ["attention_window"] and every.loc["attention_window", "heads"] == 64
    wide = _attention(build_config(OSS, window_size=4096, window_attn_skip_freq=2))  # no narrower than the sequence
    assert list(wide.index) == ["attention"] and wide.loc["attention", "heads"] == 64


def test_window_model_flops_known_answer():
    s, w, heads, d, layers = 4096, 128, 64, 64, 36
    full = model_flops_per_token(build_config(OSS))
    half = model_flops_per_token(build_config(OSS, window_size=w, window_attn_skip_freq=2))
    windowed_pairs = (w + 1) * (s - w / 2) / s  # query i meets min(i + 1, w + 1) keys
    assert full - half == pytest.approx(6 * 2 * layers * heads * d * 0.5 * (s / 2 - windowed_pairs), rel=1e-12)


@pytest.mark.parametrize("window", [256, 1024])
def test_a_narrower_window_never_costs_more(window):
    steps = [flowsim.simulate(build_config(OSS, **kw)) for kw in
             (dict(window_size=window // 2), dict(window_size=window), dict())]
    assert steps[0].step_time_s <= steps[1].step_time_s <= steps[2].step_time_s
    assert all(r.hardware_flops >= r.model_flops for r in steps)


@pytest.mark.parametrize("extra, field", [
    (dict(window_size=-1), "window_size"),
    (dict(window_size=128, window_attn_skip_freq=1), "window_attn_skip_freq"),
    (dict(window_attn_skip_freq=2), "window_attn_skip_freq"),
    (dict(window_size=128, window_attn_skip_freq=3), "window_attn_skip_freq"),  # 64 heads are not split 1:2
    (dict(window_size=128, context_parallel_size=2, num_gpus=16), "window_size"),
    (dict(window_size=128, use_flash_attn=False), "window_size"),
])
def test_window_rules_name_the_field(extra, field):
    with pytest.raises(ConfigError, match=f"^{field}:"):
        build_config(OSS, **extra)


def test_window_from_the_importers(tmp_path):
    from flowsim.config.importers import from_megatron_args

    base = "--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --bf16 --seq-length 1024 --vocab-size 32000"
    imp = from_megatron_args((base + " --window-size 128,0 --window-attn-skip-freq 2").split())
    assert (imp.config["model"]["window_size"], imp.config["model"]["window_attn_skip_freq"]) == (128, 2)
    with pytest.raises(ConfigError, match="^--window-size: only causal windows"):
        from_megatron_args((base + " --window-size 128,16").split())
    from flowsim.config.importers import from_nemo

    path = tmp_path / "gpt_oss.yaml"
    path.write_text("model:\n  _target_: megatron.bridge.models.gpt_provider.GPTModelProvider\n  num_layers: 4\n"
                    "  hidden_size: 1024\n  num_attention_heads: 8\n  seq_length: 1024\n  vocab_size: 32000\n"
                    "  bf16: true\n  window_size: [128, 0]\n  window_attn_skip_freq: 2\n"
                    "train:\n  global_batch_size: 8\n  micro_batch_size: 1\n")
    model = from_nemo(path).config["model"]
    assert (model["window_size"], model["window_attn_skip_freq"]) == (128, 2)
