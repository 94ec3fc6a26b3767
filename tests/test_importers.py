"""Config importers: Megatron-LM arguments, Megatron-Bridge / NeMo 2 recipes and HF config.json give the presets'
configs, and no architecture field is defaulted without being reported."""
import dataclasses
import json

import pytest

import flowsim
from flowsim.config.importers import ARCHITECTURE_KEYS, from_hf_config, from_megatron_args, from_nemo
from flowsim.errors import ConfigError

# Megatron-LM examples/llama/train_llama3_8b_h100_fp8.sh (MODEL_ARGS, TRAINING_ARGS, MODEL_PARALLEL_ARGS, DTYPE_ARGS,
# DATA_ARGS), with --vocab-size added (the script takes it from the tokenizer).
LLAMA3_8B_ARGS = r"""
torchrun --nproc_per_node 8 --nnodes 1 pretrain_gpt.py \
    --use-mcore-models --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 \
    --group-query-attention --num-query-groups 8 --kv-channels 128 --seq-length 8192 \
    --max-position-embeddings 8192 --position-embedding-type rope --rotary-base 1000000 --rotary-percent 1.0 \
    --attention-dropout 0.0 --hidden-dropout 0.0 --swiglu --init-method-std 0.0134 --attention-backend fused \
    --apply-layernorm-1p --untie-embeddings-and-output-weights --disable-bias-linear --normalization RMSNorm \
    --micro-batch-size 1 --global-batch-size 128 --train-samples 1953125000 --lr-decay-samples 1949218748 \
    --lr-warmup-samples 3906252 --lr 0.00015 --min-lr 0.00001 --lr-decay-style cosine --clip-grad 1.0 \
    --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --bf16 --grad-reduce-in-bf16 \
    --cross-entropy-loss-fusion --calculate-per-token-loss --manual-gc --empty-unused-memory-level 1 \
    --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --context-parallel-size 2 \
    --sequence-parallel --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather \
    --fp8-format hybrid --fp8-amax-history-len 1024 --fp8-amax-compute-algo max --fp8-param-gather \
    --tokenizer-type HuggingFaceTokenizer --tokenizer-model meta-llama/Meta-Llama-3-8B --vocab-size 128256 \
    --data-path /data/llama_mock --split 99,1,0 --log-interval 1 --save-interval 10000 --eval-interval 100
"""
LLAMA3_8B_LAYOUT = dict(model="llama3-8b", cluster="dgx-h100", gpus=8, tp=1, pp=1, cp=2, mbs=1, gbs=128, seq=8192,
                        precision="fp8", distributed_optimizer=True, overlap_grad_reduce=True,
                        overlap_param_gather=True, tp_comm_overlap=False)

# Megatron-Bridge recipes/llama/llama3.py llama3_70b_pretrain_config() dumped by ConfigContainer.to_yaml()
# (the fields that shape a step; Llama3ModelProvider70B's architecture as the provider defines it).
LLAMA3_70B_BRIDGE = """
model:
  _target_: megatron.bridge.models.llama.llama_provider.Llama3ModelProvider70B
  num_layers: 80
  hidden_size: 8192
  ffn_hidden_size: 28672
  num_attention_heads: 64
  num_query_groups: 8
  kv_channels: null
  seq_length: 8192
  vocab_size: 128256
  make_vocab_size_divisible_by: 128
  normalization: RMSNorm
  position_embedding_type: rope
  rotary_base: 500000
  gated_linear_unit: true
  activation_func: {_target_: torch.nn.functional.silu, _call_: false}
  add_bias_linear: false
  share_embeddings_and_output_weights: false
  hidden_dropout: 0.0
  attention_dropout: 0.0
  tensor_model_parallel_size: 4
  pipeline_model_parallel_size: 4
  virtual_pipeline_model_parallel_size: 5
  context_parallel_size: 2
  sequence_parallel: true
  expert_model_parallel_size: 1
  bf16: true
train:
  train_iters: 1168251
  global_batch_size: 512
  micro_batch_size: 1
optimizer:
  optimizer: adam
  lr: 0.0003
  bf16: true
  use_distributed_optimizer: true
ddp:
  use_distributed_optimizer: true
  overlap_grad_reduce: true
  overlap_param_gather: true
  grad_reduce_in_fp32: true
dataset:
  sequence_length: 8192
comm_overlap:
  tp_comm_overlap: true
mixed_precision: bf16_mixed
"""
LLAMA3_70B_LAYOUT = dict(model="llama3-70b", cluster="dgx-h100", gpus=256, tp=4, pp=4, vpp=5, cp=2, sp=True, mbs=1,
                         gbs=512, seq=8192, precision="bf16", distributed_optimizer=True, tp_comm_overlap=True)

# Hugging Face config.json files as published (meta-llama/Llama-3.1-8B, mistralai/Mixtral-8x7B-v0.1,
# Qwen/Qwen3-235B-A22B, deepseek-ai/DeepSeek-V3), with their architecture fields.
HF = {
    "llama3-8b": {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
                  "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
                  "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
                  "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
                  "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
                  "rope_scaling": {"factor": 8.0, "rope_type": "llama3"}, "rope_theta": 500000.0,
                  "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 128256},
    "mixtral-8x7b": {"architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "hidden_act": "silu",
                     "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 32768,
                     "model_type": "mixtral", "num_attention_heads": 32, "num_experts_per_tok": 2,
                     "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
                     "rms_norm_eps": 1e-05, "rope_theta": 1e6, "router_aux_loss_coef": 0.02, "sliding_window": None,
                     "tie_word_embeddings": False, "vocab_size": 32000},
    "qwen3-235b-a22b": {"architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "decoder_sparse_step": 1,
                        "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 12288,
                        "max_position_embeddings": 40960, "mlp_only_layers": [], "model_type": "qwen3_moe",
                        "moe_intermediate_size": 1536, "norm_topk_prob": True, "num_attention_heads": 64,
                        "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 94,
                        "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1e6,
                        "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": 151936},
    "deepseek-v3": {"architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "first_k_dense_replace": 3,
                    "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432, "kv_lora_rank": 512,
                    "max_position_embeddings": 163840, "model_type": "deepseek_v3", "moe_intermediate_size": 2048,
                    "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1,
                    "norm_topk_prob": True, "num_attention_heads": 128, "num_experts_per_tok": 8,
                    "num_hidden_layers": 61, "num_key_value_heads": 128, "num_nextn_predict_layers": 1,
                    "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
                    "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": False,
                    "topk_group": 4, "topk_method": "noaux_tc", "v_head_dim": 128, "vocab_size": 129280},
}
HF_LAYOUT = {"llama3-8b": dict(gpus=8, tp=2, seq=8192, gbs=16),
             "mixtral-8x7b": dict(gpus=16, tp=2, sp=True, ep=8, seq=4096, gbs=32),
             "qwen3-235b-a22b": dict(gpus=64, tp=4, sp=True, pp=2, ep=4, seq=4096, gbs=64),
             "deepseek-v3": dict(gpus=256, pp=8, ep=32, seq=4096, gbs=256, pipeline_layer_split="balanced")}


def same_config(a, b):
    """Configs equal but for the model's display name and default sequence length (which sizes only a learned
    position table; these models use rotary embeddings, and the training sequence length is compared)."""
    assert a.model.position_embedding == "rope"
    assert dataclasses.replace(a.model, name="x", seq_length=1) == dataclasses.replace(b.model, name="x", seq_length=1)
    assert a.cluster == b.cluster and a.training == b.training


def _megatron(tmp_path, text=LLAMA3_8B_ARGS):
    path = tmp_path / "llama3_8b.sh"
    path.write_text(text)
    return from_megatron_args(path)


def test_megatron_llama3_8b_matches_preset(tmp_path):
    imp = _megatron(tmp_path)
    cfg = flowsim.build_config(imp.config, cluster="dgx-h100", precision="fp8")
    assert cfg.cluster.num_gpus == 8  # from torchrun --nproc_per_node 8 --nnodes 1
    ref = flowsim.build_config(**LLAMA3_8B_LAYOUT)
    same_config(cfg, ref)
    assert flowsim.simulate(cfg).step_time_s == flowsim.simulate(ref).step_time_s
    assert imp.defaults == ()  # every architecture field is in the argument list
    assert "--lr" in imp.ignored and "--train-samples" in imp.ignored and "--num-layers" not in imp.ignored
    assert len(imp.notes()) == 1 and imp.notes()[0].startswith("ignored (no effect on the step estimate): ")


@pytest.mark.parametrize("flag, key, megatron_default", [
    ("--position-embedding-type rope", "position_embedding", "learned"),
    ("--disable-bias-linear", "add_bias_linear", True),
    ("--normalization RMSNorm", "normalization", "layernorm"),
    ("--swiglu", "activation", "gelu"),
    ("--untie-embeddings-and-output-weights", "untie_embeddings_and_output_weights", False),
    ("--hidden-dropout 0.0", "hidden_dropout", 0.1),
])
def test_megatron_removed_architecture_flag_is_reported(tmp_path, flag, key, megatron_default):
    imp = _megatron(tmp_path, LLAMA3_8B_ARGS.replace(" " + flag + " ", " "))
    assert imp.config["model"][key] == megatron_default  # what pretrain_gpt.py itself would run
    assert imp.defaulted()[key] == megatron_default
    assert f"{key}=" in imp.notes()[0] and "Megatron-LM arguments.py defaults" in imp.notes()[0]


def test_megatron_gqa_flag_and_swiglu_ffn_rule(tmp_path):
    imp = _megatron(tmp_path, LLAMA3_8B_ARGS.replace("--group-query-attention ", "")
                    .replace("--ffn-hidden-size 14336 ", ""))
    m = imp.config["model"]
    assert m["num_query_groups"] == 32  # without --group-query-attention every head has its own K/V
    assert m["ffn_hidden_size"] == int(4 * 4096 * 2 / 3 / 64) * 64  # arguments.py's --swiglu default
    assert ("ffn_hidden_size", m["ffn_hidden_size"], "Megatron-LM arguments.py defaults") in imp.defaults


def test_megatron_vocab_padding_recompute_and_errors(tmp_path):
    imp = _megatron(tmp_path, LLAMA3_8B_ARGS.replace("--tensor-model-parallel-size 1", "--tensor-model-parallel-size 8")
                    + " --recompute-granularity full --recompute-method block --recompute-num-layers 2"
                      " --moe-layer-freq ([0]*3+[1]*29) --num-experts 8")
    assert imp.config["model"]["vocab_size"] == 129024  # 128256 padded to a multiple of 128 * tp 8
    assert imp.config["model"]["moe_first_k_dense"] == 3 and imp.config["model"]["moe_layer_freq"] == 1
    t = imp.config["training"]
    assert t["recompute_num_layers"] == 2 and t["sequence_parallel"] is True
    assert t["moe_token_dispatcher_type"] == "allgather" and t["expert_tensor_parallel_size"] == 8
    with pytest.raises(ConfigError, match=r"^--bf16: Megatron-LM trains in fp32"):
        _megatron(tmp_path, LLAMA3_8B_ARGS.replace("--bf16", "").replace("--fp8-format hybrid", ""))
    with pytest.raises(ConfigError, match=r"^--decoder-first-pipeline-num-layers: uneven"):
        _megatron(tmp_path, LLAMA3_8B_ARGS + " --decoder-first-pipeline-num-layers 3")
    with pytest.raises(ConfigError, match=r"^--num-layers: must be an integer \(got x\)"):
        _megatron(tmp_path, LLAMA3_8B_ARGS.replace("--num-layers 32", "--num-layers x"))


def _bridge(tmp_path, text=LLAMA3_70B_BRIDGE):
    path = tmp_path / "llama3_70b.yaml"
    path.write_text(text)
    return from_nemo(path)


def test_bridge_llama3_70b_matches_preset(tmp_path):
    imp = _bridge(tmp_path)
    cfg = flowsim.build_config(imp.config, cluster="dgx-h100", gpus=256)
    ref = flowsim.build_config(**LLAMA3_70B_LAYOUT)
    same_config(cfg, ref)
    assert flowsim.simulate(cfg).step_time_s == flowsim.simulate(ref).step_time_s


@pytest.mark.parametrize("line", ["  normalization: RMSNorm\n", "  position_embedding_type: rope\n",
                                  "  add_bias_linear: false\n", "  share_embeddings_and_output_weights: false\n",
                                  "  hidden_dropout: 0.0\n", "  num_query_groups: 8\n", "  vocab_size: 128256\n",
                                  "  gated_linear_unit: true\n"
                                  "  activation_func: {_target_: torch.nn.functional.silu, _call_: false}\n"])
def test_bridge_removed_key_takes_the_provider_value_and_says_so(tmp_path, line):
    assert line in LLAMA3_70B_BRIDGE
    imp = _bridge(tmp_path, LLAMA3_70B_BRIDGE.replace(line, ""))
    ref = _bridge(tmp_path)
    assert imp.config == ref.config  # the Llama3ModelProvider70B value: the answer is unchanged
    assert imp.defaults and all(w == "Llama3ModelProvider70B (preset llama3-70b)" for _, _, w in imp.defaults)
    assert "Llama3ModelProvider70B" in imp.notes()[0]


def test_nemo2_layout_and_generic_provider_defaults(tmp_path):
    nemo2 = {"trainer": {"devices": 8, "num_nodes": 32, "strategy": {
                 "tensor_model_parallel_size": 4, "pipeline_model_parallel_size": 4,
                 "virtual_pipeline_model_parallel_size": 5, "context_parallel_size": 2, "sequence_parallel": True,
                 "ddp": {"overlap_grad_reduce": True, "overlap_param_gather": True}},
                 "plugins": {"precision": "bf16-mixed"}},
             "model": {"config": {"_target_": "nemo.collections.llm.gpt.model.llama.Llama3Config70B"}},
             "data": {"seq_length": 8192, "micro_batch_size": 1, "global_batch_size": 512},
             "optim": {"config": {"use_distributed_optimizer": True}}}
    imp = from_nemo(nemo2)
    cfg = flowsim.build_config(imp.config, cluster="dgx-h100")
    same_config(cfg, flowsim.build_config(**{**LLAMA3_70B_LAYOUT, "tp_comm_overlap": False}))
    generic = from_nemo({"model": {"num_layers": 4, "hidden_size": 512, "num_attention_heads": 8},
                         "train": {"global_batch_size": 8}, "dataset": {"sequence_length": 1024},
                         "mixed_precision": "bf16_mixed"})
    assert generic.defaulted() == {"activation": "gelu", "normalization": "layernorm", "position_embedding": "learned",
                                   "add_bias_linear": True, "untie_embeddings_and_output_weights": False,
                                   "hidden_dropout": 0.1}
    assert "Megatron-core TransformerConfig defaults" in generic.notes()[0]


@pytest.mark.parametrize("preset", sorted(HF))
def test_hf_config_matches_preset(tmp_path, preset):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(HF[preset]))
    imp = from_hf_config(path)
    layout = dict(cluster="dgx-h100", **HF_LAYOUT[preset])
    cfg = flowsim.build_config(imp.config, **layout)
    ref = flowsim.build_config(model=preset, **layout)
    same_config(cfg, ref)
    # fixed by the model code, not in config.json: reported
    assert {"normalization", "position_embedding", "hidden_dropout", "seq_length"} <= set(imp.defaulted())
    assert "architectures" in imp.ignored


@pytest.mark.parametrize("key", ["tie_word_embeddings", "hidden_act", "num_key_value_heads", "mlp_bias"])
def test_hf_removed_key_is_reported(key):
    cfg = {k: v for k, v in HF["llama3-8b"].items() if k != key}
    imp = from_hf_config(cfg)
    full = from_hf_config(HF["llama3-8b"])
    changed = {k for k in ARCHITECTURE_KEYS if imp.config["model"].get(k) != full.config["model"].get(k)}
    reported = set(imp.defaulted())
    assert changed <= reported  # anything that changed is reported
    assert reported - set(full.defaulted())  # and the removed key's field is among the reported


def test_hf_gpt2_and_errors():
    imp = from_hf_config({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024,
                          "vocab_size": 50257, "activation_function": "gelu_new"})
    m = imp.config["model"]
    assert (m["position_embedding"], m["normalization"], m["add_bias_linear"], m["ffn_hidden_size"]) == \
        ("learned", "layernorm", True, 3072)
    assert m["untie_embeddings_and_output_weights"] is False  # GPT2Config ties by default, reported
    assert imp.defaulted()["untie_embeddings_and_output_weights"] is False
    with pytest.raises(ConfigError, match=r"^model_type: unsupported; supported: llama, .* \(got bert\)"):
        from_hf_config({"model_type": "bert"})
    with pytest.raises(ConfigError, match=r"^mlp_only_layers: only MoE in every layer"):
        from_hf_config({**HF["qwen3-235b-a22b"], "mlp_only_layers": [0, 5]})


def test_cli_estimate_imports_and_reports(tmp_path):
    from click.testing import CliRunner

    from flowsim.cli import main

    args = tmp_path / "args.sh"
    args.write_text(LLAMA3_8B_ARGS.replace("--hidden-dropout 0.0 ", ""))
    runner = CliRunner()
    imp = runner.invoke(main, ["estimate", "--megatron-args", str(args), "--cluster", "dgx-h100",
                               "--set", "hidden_dropout=0", "--json"])
    assert imp.exit_code == 0, imp.output
    assert "note: not in args.sh, used Megatron-LM arguments.py defaults: hidden_dropout=0.1" in imp.stderr
    assert "note: ignored (no effect on the step estimate): --adam-beta1" in imp.stderr
    ref = runner.invoke(main, ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--cp", "2",
                               "--gbs", "128", "--seq", "8192", "--precision", "fp8", "--distributed-optimizer",
                               "--json"])
    assert json.loads(imp.stdout)["step_time_s"] == json.loads(ref.stdout)["step_time_s"]
    both = runner.invoke(main, ["estimate", "--megatron-args", str(args), "--hf-config", str(args)])
    assert both.exit_code == 2 and "Error: --hf-config: give only one of" in both.output


FULL_MODEL = {"num_layers": 4, "hidden_size": 1024, "num_attention_heads": 16, "ffn_hidden_size": 4096,
              "activation": "swiglu", "normalization": "rmsnorm", "position_embedding": "rope",
              "add_bias_linear": False, "untie_embeddings_and_output_weights": True, "hidden_dropout": 0.0,
              "vocab_size": 32000}


@pytest.mark.parametrize("key", ["activation", "normalization", "position_embedding", "add_bias_linear",
                                 "untie_embeddings_and_output_weights", "hidden_dropout", "vocab_size"])
def test_hand_written_model_missing_an_architecture_key_is_reported(tmp_path, key):
    from click.testing import CliRunner

    import yaml

    from flowsim.cli import main

    path = tmp_path / "m.yaml"
    args = ["estimate", str(path), "--cluster", "dgx-h100", "--gpus", "8", "--json"]
    path.write_text(yaml.safe_dump({"model": FULL_MODEL}))
    full = CliRunner().invoke(main, args)
    assert full.exit_code == 0, full.output
    assert "note:" not in full.stderr
    path.write_text(yaml.safe_dump({"model": {k: v for k, v in FULL_MODEL.items() if k != key}}))
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    note = next(line for line in res.stderr.splitlines() if line.startswith("note: the model does not set"))
    assert note.startswith(f"note: the model does not set {key}; used flowsim's defaults (GPT-3 style): {key}=")
    preset = CliRunner().invoke(main, ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8"])
    assert "note: the model does not set" not in preset.stderr
