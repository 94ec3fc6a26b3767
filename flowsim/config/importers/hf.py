"""Import the model of a Hugging Face ``config.json`` (Llama, Mistral, Mixtral, Qwen3, DeepSeek-V2/V3, GPT-2).

A ``config.json`` holds only what differs from its ``transformers`` config class's defaults; the rest is
fixed by the model's code (``modeling_<type>.py``). Both come from the family table below, and every value
taken from it rather than from the file is reported (:attr:`Imported.defaults`). Sources:
transformers v4.57 ``models/<type>/configuration_<type>.py`` (defaults: ``tie_word_embeddings`` False for
all but GPT-2, ``hidden_act`` silu, ``attention_bias``/``mlp_bias`` False, ``num_key_value_heads`` = heads,
``head_dim`` = hidden / heads) and ``modeling_<type>.py`` (RMSNorm, rotary embeddings and a gated
gate/up/down MLP in every family but GPT-2, which has LayerNorm, learned positions, biases and GELU).
"""
from __future__ import annotations

from pathlib import Path

from flowsim import io_text
from flowsim.config.importers.common import Imported
from flowsim.errors import ConfigError

_LLAMA_LIKE = {"normalization": "rmsnorm", "position_embedding": "rope", "untie_embeddings_and_output_weights": True,
               "add_bias_linear": False, "hidden_dropout": 0.0}
_QWEN3 = {**_LLAMA_LIKE, "qk_layernorm": True}  # per-head q_norm / k_norm (transformers modeling_qwen3{,_moe})
FAMILIES = {  # model_type -> (family name, values the model code fixes or the config class defaults)
    "llama": ("Llama", _LLAMA_LIKE), "mistral": ("Mistral", _LLAMA_LIKE), "mixtral": ("Mixtral", _LLAMA_LIKE),
    "qwen3": ("Qwen3", _QWEN3),
    "qwen3_moe": ("Qwen3-MoE", _QWEN3), "deepseek_v2": ("DeepSeek-V2", _LLAMA_LIKE),
    "deepseek_v3": ("DeepSeek-V3", _LLAMA_LIKE),
    "gpt2": ("GPT-2", {"normalization": "layernorm", "position_embedding": "learned", "activation": "gelu",
                       "untie_embeddings_and_output_weights": False, "add_bias_linear": True, "hidden_dropout": 0.1}),
}
ACTIVATIONS = {"silu": "swiglu", "swish": "swiglu", "gelu": "geglu", "gelu_pytorch_tanh": "geglu"}  # gated MLPs
GPT2_ACTIVATIONS = ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh")
_USED = {"model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
         "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings", "hidden_act",
         "tie_word_embeddings", "attention_bias", "mlp_bias", "num_local_experts", "num_experts",
         "n_routed_experts", "num_experts_per_tok", "n_group", "topk_group", "moe_intermediate_size",
         "shared_expert_intermediate_size",
         "n_shared_experts", "first_k_dense_replace", "moe_layer_freq", "decoder_sparse_step", "mlp_only_layers",
         "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
         "n_embd", "n_layer", "n_head", "n_positions", "n_inner", "activation_function", "resid_pdrop",
         "_name_or_path", "sliding_window", "use_sliding_window"}


def read_json(path) -> dict:
    """The mapping in a JSON file, read under :mod:`flowsim.io_text`'s policy; errors name the file."""
    data = io_text.loads_json(io_text.read_text(path, "hf_config"), "hf_config", path)
    if not isinstance(data, dict):
        raise ConfigError("hf_config", "top level must be a JSON object", str(path))
    return data


def _need(cfg: dict, key: str):
    if key not in cfg or cfg[key] is None:
        raise ConfigError(key, f"required in a {cfg.get('model_type')} config.json")
    return cfg[key]


def from_hf_config(source) -> Imported:
    """Read a Hugging Face ``config.json`` (a path or an already parsed mapping) into a flowsim model.

    The model's ``seq_length`` is its ``max_position_embeddings`` (reported as a default): pass the training
    sequence length with ``seq``.

    Raises
    ------
    ConfigError
        Unsupported ``model_type``, a missing size, or a layout of MoE layers flowsim cannot model.
    """
    cfg = dict(source) if isinstance(source, dict) else read_json(source)
    name = "<config>" if isinstance(source, dict) else Path(source).name
    mtype = cfg.get("model_type")
    if mtype not in FAMILIES:
        raise ConfigError("model_type", f"unsupported; supported: {', '.join(FAMILIES)}", mtype)
    family, values = FAMILIES[mtype]
    whose = f"{family} family (transformers {mtype})"
    folder = "" if isinstance(source, dict) else Path(source).resolve().parent.name
    model: dict = {"name": str(cfg.get("_name_or_path") or folder or mtype).rstrip("/").split("/")[-1]}
    defaults: list = []

    def put(key, value, from_file: bool):
        model[key] = value
        if not from_file:
            defaults.append((key, value, whose))

    if mtype == "gpt2":
        h, heads = _need(cfg, "n_embd"), _need(cfg, "n_head")
        model.update(num_layers=_need(cfg, "n_layer"), hidden_size=h, num_attention_heads=heads,
                     vocab_size=_need(cfg, "vocab_size"), kv_channels=h // heads, num_query_groups=heads)
        put("ffn_hidden_size", cfg.get("n_inner") or 4 * h, cfg.get("n_inner") is not None)
        act = cfg.get("activation_function", "gelu_new")
        if act not in GPT2_ACTIVATIONS:
            raise ConfigError("activation_function", f"must be one of {', '.join(GPT2_ACTIVATIONS)}", act)
        put("activation", "gelu", "activation_function" in cfg)
        put("untie_embeddings_and_output_weights", not cfg.get("tie_word_embeddings", True),
            "tie_word_embeddings" in cfg)
        put("hidden_dropout", float(cfg.get("resid_pdrop", 0.1)), "resid_pdrop" in cfg)
        put("seq_length", _need(cfg, "n_positions"), True)
        for key in ("normalization", "position_embedding", "add_bias_linear"):
            put(key, values[key], False)
        return _done(model, name, defaults, cfg)

    h, heads = _need(cfg, "hidden_size"), _need(cfg, "num_attention_heads")
    model.update(num_layers=_need(cfg, "num_hidden_layers"), hidden_size=h, num_attention_heads=heads,
                 ffn_hidden_size=_need(cfg, "intermediate_size"), vocab_size=_need(cfg, "vocab_size"))
    put("num_query_groups", cfg.get("num_key_value_heads") or heads, cfg.get("num_key_value_heads") is not None)
    put("kv_channels", cfg.get("head_dim") or h // heads, cfg.get("head_dim") is not None)
    act = cfg.get("hidden_act", "silu")
    if act not in ACTIVATIONS:
        raise ConfigError("hidden_act", f"must be one of {', '.join(ACTIVATIONS)} (gated MLP)", act)
    put("activation", ACTIVATIONS[act], "hidden_act" in cfg)
    put("untie_embeddings_and_output_weights", not cfg.get("tie_word_embeddings", False), "tie_word_embeddings" in cfg)
    put("add_bias_linear", bool(cfg.get("mlp_bias", False)), "mlp_bias" in cfg)
    for key in ("normalization", "position_embedding", "hidden_dropout"):
        put(key, values[key], False)
    if values.get("qk_layernorm"):
        put("qk_layernorm", True, False)
    model["seq_length"] = _need(cfg, "max_position_embeddings")
    defaults.append(("seq_length", model["seq_length"], "max_position_embeddings (pass seq for the training length)"))
    _moe(cfg, mtype, model)
    _mla(cfg, mtype, model)
    return _done(model, name, defaults, cfg)


def _moe(cfg: dict, mtype: str, model: dict) -> None:
    experts = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts") or 0
    if not experts:
        return
    model["num_moe_experts"] = experts
    model["moe_router_topk"] = _need(cfg, "num_experts_per_tok")
    if mtype != "mixtral":  # Mixtral's experts are intermediate_size wide
        model["moe_ffn_hidden_size"] = _need(cfg, "moe_intermediate_size")
    shared = cfg.get("shared_expert_intermediate_size") or (cfg.get("n_shared_experts") or 0) * cfg.get(
        "moe_intermediate_size", 0)
    if shared:
        model["moe_shared_expert_intermediate_size"] = shared
    if cfg.get("first_k_dense_replace"):
        model["moe_first_k_dense"] = cfg["first_k_dense_replace"]
    if cfg.get("n_group") and cfg.get("topk_group"):  # DeepSeek's group-limited routing
        model["moe_router_num_groups"], model["moe_router_group_topk"] = cfg["n_group"], cfg["topk_group"]
    step = cfg.get("decoder_sparse_step") or cfg.get("moe_layer_freq") or 1
    if step != 1 or cfg.get("mlp_only_layers"):
        key = "mlp_only_layers" if cfg.get("mlp_only_layers") else "decoder_sparse_step"
        raise ConfigError(key, "only MoE in every layer after the first_k_dense_replace dense ones is modelled",
                          cfg.get(key))


def _mla(cfg: dict, mtype: str, model: dict) -> None:
    if not mtype.startswith("deepseek"):
        return
    model["multi_latent_attention"] = True
    model["q_lora_rank"] = cfg.get("q_lora_rank") or 0
    model["kv_lora_rank"] = _need(cfg, "kv_lora_rank")
    model["qk_head_dim"] = _need(cfg, "qk_nope_head_dim")
    model["qk_pos_emb_head_dim"] = _need(cfg, "qk_rope_head_dim")
    model["v_head_dim"] = _need(cfg, "v_head_dim")
    model["kv_channels"] = model["v_head_dim"]  # Megatron-Bridge's DeepSeek providers: kv_channels = v_head_dim


def _done(model: dict, name: str, defaults: list, cfg: dict) -> Imported:
    if cfg.get("attention_bias"):
        raise ConfigError("attention_bias", "biases on the attention projections only are not modelled "
                          "(add_bias_linear puts them on every linear layer)", True)
    if cfg.get("use_sliding_window") or (cfg.get("model_type") == "mistral" and cfg.get("sliding_window")):
        raise ConfigError("sliding_window", "not read from HF configs (its window and layer pattern differ by "
                          "family): set window_size / window_attn_skip_freq", cfg.get("sliding_window"))
    ignored = tuple(sorted(k for k in cfg if k not in _USED))
    seq = model.pop("seq_length")
    return Imported(config={"model": model, "seq_length": seq}, source=name, defaults=tuple(defaults),
                    ignored=ignored)
