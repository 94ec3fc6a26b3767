"""Import a NeMo 2 or Megatron-Bridge recipe YAML.

Two layouts are read, both built on Megatron-core's ``TransformerConfig`` field names for the model:

* NeMo 2 (``nemo llm pretrain ... --to-yaml``): ``trainer:`` (``devices``, ``num_nodes``, ``strategy:`` with the
  parallel sizes and ``ddp:``, ``plugins: {precision: bf16-mixed}``), ``model: {config: {...}}``,
  ``data:`` (``seq_length``, ``micro_batch_size``, ``global_batch_size``), ``optim: {config: {...}}``;
* Megatron-Bridge ``ConfigContainer`` (``config.to_yaml()``): ``model:`` (a model provider: architecture and
  parallel sizes), ``train:`` (batch sizes), ``ddp:``, ``optimizer:``, ``dataset:`` (``sequence_length``),
  ``mixed_precision:`` (a recipe name such as ``bf16_mixed`` or a mapping) and ``comm_overlap:``.

A model field the file does not give takes the value of the model class its ``_target_`` names (e.g.
``Llama3ModelProvider70B`` -> the ``llama3-70b`` preset, which holds the provider's sizes) or, for a class not
in :data:`TARGETS`, Megatron-core ``TransformerConfig``/``GPTModelProvider`` defaults (learned absolute
positions, LayerNorm, GELU, biases, tied embeddings, hidden dropout 0.1; megatron/core/transformer/
transformer_config.py, core_r0.16). Every such value is reported (:attr:`Imported.defaults`).
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path


from flowsim import io_text
from flowsim.config.importers.common import ARCHITECTURE_KEYS, Imported
from flowsim.config.importers.megatron import apply_moe_layer_freq, window_left
from flowsim.config.loader import load_preset
from flowsim.config.model import ModelConfig
from flowsim.errors import ConfigError

TARGETS = (  # regex on the model class name (lower case) -> preset holding that class's architecture
    (r"llama31.*405b|llama3_?1.*405b", "llama3.1-405b"), (r"llama3.*70b", "llama3-70b"), (r"llama3.*8b", "llama3-8b"),
    (r"llama2.*70b", "llama2-70b"), (r"llama2.*7b", "llama2-7b"), (r"mixtral.*8x22b", "mixtral-8x22b"),
    (r"mixtral.*8x7b", "mixtral-8x7b"), (r"deepseekv3|deepseek_v3", "deepseek-v3"),
    (r"qwen3.*235b", "qwen3-235b-a22b"), (r"gpt.*175b", "gpt3-175b"),
)
CORE_DEFAULTS = {"activation": "gelu", "normalization": "layernorm", "position_embedding": "learned",
                 "add_bias_linear": True, "untie_embeddings_and_output_weights": False, "hidden_dropout": 0.1}
"""Megatron-core TransformerConfig / GPTModelProvider defaults (transformer_config.py, core_r0.16)."""

_MODEL_SAME = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
               "kv_channels", "vocab_size", "hidden_dropout", "add_bias_linear", "num_moe_experts", "moe_router_topk",
               "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "moe_router_num_groups",
               "moe_router_group_topk", "moe_expert_capacity_factor", "qk_layernorm",
               "moe_pad_expert_input_to_capacity", "multi_latent_attention", "q_lora_rank", "kv_lora_rank",
               "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
_PARALLEL_SAME = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
                  "context_parallel_size", "sequence_parallel", "expert_model_parallel_size",
                  "expert_tensor_parallel_size", "account_for_embedding_in_pipeline_split",
                  "account_for_loss_in_pipeline_split", "overlap_moe_expert_parallel_comm", "tp_comm_overlap",
                  "moe_token_dispatcher_type", "moe_router_dtype", "recompute_granularity", "recompute_modules")
_DDP = ("use_distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather")
_POSITIONS = {"learned_absolute": "learned", "rope": "rope", "yarn": "rope", "none": "none"}
_NORMS = {"layernorm": "layernorm", "rmsnorm": "rmsnorm"}


LAYOUT_LAYERS = {"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L"}
"""Layer names of a list-form ``pipeline_model_parallel_layout`` (megatron-core 0.14.0
``PipelineParallelLayerLayout``: one list of layer names per virtual stage) -> the string form's symbols."""


def layout_text(layout) -> str:
    """A ``pipeline_model_parallel_layout`` as flowsim's string: strings pass, a list of per-stage lists of layer
    names (``[["embedding", "decoder"], ["decoder", "loss"]]``) becomes ``"Et|tL"``; ConfigError names the field
    for an unknown layer name."""
    if isinstance(layout, str):
        return layout
    if not isinstance(layout, (list, tuple)) or not all(isinstance(st, (list, tuple)) for st in layout):
        raise ConfigError("pipeline_model_parallel_layout", "must be a string or a list of per-stage lists of layer "
                          "names", layout)
    bad = sorted({str(x) for st in layout for x in st} - set(LAYOUT_LAYERS))
    if bad:
        raise ConfigError("pipeline_model_parallel_layout", f"layer names must be {', '.join(LAYOUT_LAYERS)}",
                          ", ".join(bad))
    return "|".join("".join(LAYOUT_LAYERS[x] for x in st) for st in layout)


def read_yaml(path) -> dict:
    """The mapping in a YAML file, read under :mod:`flowsim.io_text`'s policy; errors name the file."""
    data = io_text.loads_yaml(io_text.read_text(path, "nemo"), "nemo", path)
    if not isinstance(data, dict):
        raise ConfigError("nemo", "top level must be a mapping", str(path))
    return data


def _target_name(section: dict) -> str:
    return str(section.get("_target_", "")).rsplit(".", 1)[-1]


def family_of(target: str) -> str | None:
    """The preset holding the architecture of the model class ``target``, or None for a generic GPT."""
    low = target.lower()
    return next((preset for pattern, preset in TARGETS if re.search(pattern, low)), None)


def _activation(model_src: dict) -> str | None:
    func = model_src.get("activation_func")
    if isinstance(func, dict):
        func = func.get("_target_", "")
    gated = model_src.get("gated_linear_unit")
    if func is None and gated is None:
        return None
    text = str(func or "").lower()
    if "squared_relu" in text:
        return "squared_relu"
    if "silu" in text or "swish" in text:
        if gated is False:
            raise ConfigError("activation_func", "an ungated SiLU MLP is not modelled", func)
        return "swiglu"
    if "gelu" in text or not text:
        return "geglu" if gated else "gelu"
    raise ConfigError("activation_func", "must be silu (with gated_linear_unit), gelu or squared_relu", func)


def _precision(*sources) -> str | None:
    for src in sources:
        if isinstance(src, str):
            low = src.lower()
            if "fp8" in low:
                return "fp8"
            if "bf16" in low:
                return "bf16"
            if "16" in low:
                return "fp16"
        elif isinstance(src, dict):
            if src.get("fp8"):
                return "fp8"
            if src.get("bf16"):
                return "bf16"
            if src.get("fp16"):
                return "fp16"
            if src.get("precision"):
                return _precision(str(src["precision"]))
    return None


def from_nemo(source) -> Imported:
    """Read a NeMo 2 or Megatron-Bridge recipe YAML (a path or a parsed mapping) into a flowsim config.

    Raises
    ------
    ConfigError
        No ``model:`` section, a value flowsim cannot model, or an fp32 recipe.
    """
    data = dict(source) if isinstance(source, dict) else read_yaml(source)
    name = "<recipe>" if isinstance(source, dict) else Path(source).name
    if not isinstance(data.get("model"), dict):
        raise ConfigError("model", "a NeMo 2 / Megatron-Bridge recipe needs a model: section", name)
    nemo2 = isinstance(data.get("trainer"), dict)
    msrc = data["model"].get("config", data["model"]) if nemo2 else data["model"]
    target = _target_name(msrc) or _target_name(data["model"])
    preset = family_of(target)
    model: dict = {"name": preset or target or Path(name).stem}
    training: dict = {}
    cluster: dict = {}

    for key in _MODEL_SAME:
        if msrc.get(key) is not None:
            model[key] = msrc[key]
    if msrc.get("position_embedding_type") is not None:
        pos = str(msrc["position_embedding_type"]).lower()
        if pos not in _POSITIONS:
            raise ConfigError("position_embedding_type", f"must be one of {', '.join(_POSITIONS)}", pos)
        model["position_embedding"] = _POSITIONS[pos]
    if msrc.get("normalization") is not None:
        norm = str(msrc["normalization"]).lower()
        if norm not in _NORMS:
            raise ConfigError("normalization", "must be LayerNorm or RMSNorm", msrc["normalization"])
        model["normalization"] = _NORMS[norm]
    act = _activation(msrc)
    if act:
        model["activation"] = act
    if msrc.get("share_embeddings_and_output_weights") is not None:
        model["untie_embeddings_and_output_weights"] = not msrc["share_embeddings_and_output_weights"]
    if msrc.get("window_size") is not None:
        model["window_size"] = window_left(msrc["window_size"], "window_size")
    if msrc.get("window_attn_skip_freq") is not None:
        model["window_attn_skip_freq"] = msrc["window_attn_skip_freq"]
    freq = msrc.get("moe_layer_freq")
    if isinstance(freq, list):
        apply_moe_layer_freq(str(freq), model)
    elif freq is not None:
        model["moe_layer_freq"] = freq

    whose = f"{target or 'model'} (preset {preset})" if preset else "Megatron-core TransformerConfig defaults"
    family = dict(CORE_DEFAULTS)
    if preset:  # the preset's fields, and flowsim's defaults for what it leaves out (hidden_dropout 0)
        family = {f.name: f.default for f in dataclasses.fields(ModelConfig)
                  if f.name in ARCHITECTURE_KEYS and f.name not in ("num_query_groups", "kv_channels")}
        family.update(load_preset("models", preset))
    defaults = []
    keys = [k for k in family if k not in ("name", "seq_length")] if preset else list(CORE_DEFAULTS)
    for key in keys:
        if key not in model:
            model[key] = family[key]
            if key in ARCHITECTURE_KEYS or preset:
                defaults.append((key, family[key], whose))
    if model.get("should_pad_vocab") or msrc.get("should_pad_vocab"):
        multiple = (msrc.get("make_vocab_size_divisible_by") or 128) * (msrc.get("tensor_model_parallel_size") or 1)
        model["vocab_size"] = -(-model["vocab_size"] // multiple) * multiple

    strategy = data["trainer"].get("strategy") or {} if nemo2 else {}
    for src in (msrc, strategy):
        for key in _PARALLEL_SAME:
            if isinstance(src, dict) and src.get(key) is not None:
                training[key] = src[key]
    if isinstance(training.get("recompute_modules"), list):
        training["recompute_modules"] = tuple(training["recompute_modules"])
    layout = next((src["pipeline_model_parallel_layout"] for src in (strategy, msrc) if isinstance(src, dict)
                   and src.get("pipeline_model_parallel_layout")), None)
    if layout:
        training["pipeline_model_parallel_layout"] = layout_text(layout)
    _recompute(msrc, training)
    ddp = (strategy.get("ddp") if isinstance(strategy.get("ddp"), dict) else {}) if nemo2 else data.get("ddp") or {}
    optim = data.get("optim", {}).get("config", {}) if nemo2 else data.get("optimizer") or {}
    for src in (optim, ddp):
        for key in _DDP:
            if isinstance(src, dict) and src.get(key) is not None:
                training[key] = bool(src[key])
    for key in _DDP:
        training.setdefault(key, False)  # DistributedDataParallelConfig / OptimizerConfig defaults
    if isinstance(ddp, dict) and ddp.get("bucket_size"):
        training["bucket_size_bytes"] = float(ddp["bucket_size"]) * (4 if ddp.get("grad_reduce_in_fp32", True) else 2)
    if isinstance(data.get("comm_overlap"), dict) and data["comm_overlap"].get("tp_comm_overlap") is not None:
        training["tp_comm_overlap"] = bool(data["comm_overlap"]["tp_comm_overlap"])

    if nemo2:
        trainer, batch = data["trainer"], data.get("data") or {}
        if trainer.get("devices") and isinstance(trainer["devices"], int):
            cluster["num_gpus"] = trainer["devices"] * int(trainer.get("num_nodes") or 1)
        precision = _precision(msrc, trainer.get("plugins"), optim)
        seq = batch.get("seq_length")
    else:
        batch = data.get("train") or {}
        ds = data.get("dataset") or {}
        precision = _precision(data.get("mixed_precision"), msrc, optim)
        seq = ds.get("sequence_length") or ds.get("seq_length")
    seq = seq or msrc.get("seq_length")
    if seq is None and preset:
        seq = family["seq_length"]
        defaults.append(("seq_length", seq, whose))
    if seq is None:
        raise ConfigError("seq_length", "required: the recipe gives no sequence length", name)
    training["seq_length"] = seq
    for key in ("micro_batch_size", "global_batch_size"):
        if batch.get(key) is not None:
            training[key] = batch[key]
    if precision is None:
        raise ConfigError("mixed_precision", "no bf16/fp16/fp8 setting found; flowsim models 16-bit and fp8 training",
                          name)
    training["precision"] = precision
    config = {"model": model, "training": training}
    if cluster:
        config["cluster"] = cluster
    return Imported(config=config, source=name, defaults=tuple(defaults))


def _recompute(msrc: dict, training: dict) -> None:
    gran = training.get("recompute_granularity")
    if gran is None:
        return
    if gran == "selective":
        return
    if gran != "full":
        raise ConfigError("recompute_granularity", "must be full or selective", gran)
    method = msrc.get("recompute_method")
    n = msrc.get("recompute_num_layers") or 1
    if method == "uniform":
        training["recompute_num_layers"] = 0
    elif method == "block":
        training["recompute_num_layers"] = n
    else:
        raise ConfigError("recompute_method", "full recompute needs uniform or block", method)
