"""Import a Megatron-LM ``pretrain_gpt.py`` argument list.

Every architecture and parallelism argument of Megatron-LM's ``megatron/training/arguments.py`` that changes
a training step is mapped to its flowsim field; an argument missing from the list takes Megatron-LM's own
default (the value ``pretrain_gpt.py`` would run), and the architecture ones among them are reported
(:attr:`Imported.defaults`). Arguments that cannot change the step time (learning rate, data, logging,
checkpointing, initialisation...) are listed once in :attr:`Imported.ignored`. Arguments flowsim cannot model
are errors that name them.

Sources of the defaults: Megatron-LM ``megatron/training/arguments.py`` (core_r0.16): ``--hidden-dropout``
0.1, ``--position-embedding-type`` learned_absolute, ``--normalization`` LayerNorm, biases on unless
``--disable-bias-linear``, tied embeddings unless ``--untie-embeddings-and-output-weights``, GELU unless
``--swiglu``/``--squared-relu``, ``--ffn-hidden-size`` 4h (``int(4h * 2/3 / 64) * 64`` with ``--swiglu``),
``--kv-channels`` h / heads, ``--make-vocab-size-divisible-by`` 128 (the vocabulary is padded to a multiple of
it times the tensor-parallel size, ``_vocab_size_with_padding``), ``--moe-router-topk`` 2,
``--moe-token-dispatcher-type`` allgather, ``--expert-tensor-parallel-size`` = tensor-parallel size,
``--kv-lora-rank`` 32, ``--recompute-modules`` core_attn, and overlap/distributed-optimizer options off.
"""
from __future__ import annotations

import ast
import shlex
from pathlib import Path

from flowsim.config.importers.common import Imported
from flowsim.errors import ConfigError

WHOSE = "Megatron-LM arguments.py defaults"
DEFAULTS = {  # Megatron-LM megatron/training/arguments.py (core_r0.16) defaults, in flowsim's names
    "activation": "gelu", "normalization": "layernorm", "position_embedding": "learned", "add_bias_linear": True,
    "untie_embeddings_and_output_weights": False, "hidden_dropout": 0.1,
}
MAKE_VOCAB_DIVISIBLE_BY = 128  # --make-vocab-size-divisible-by default, arguments.py
KV_LORA_RANK = 32  # --kv-lora-rank default, arguments.py
TOKEN_DISPATCHER = "allgather"  # --moe-token-dispatcher-type default, arguments.py

POSITIONS = {"learned_absolute": "learned", "rope": "rope", "yarn": "rope", "mrope": "rope", "none": "none"}
NORMS = {"layernorm": "layernorm", "rmsnorm": "rmsnorm"}
ATTENTION_BACKENDS = {"auto": True, "flash": True, "fused": True, "unfused": False, "local": False}

_INT = {  # Megatron dest -> (section, flowsim key)
    "num_layers": ("model", "num_layers"), "hidden_size": ("model", "hidden_size"),
    "num_attention_heads": ("model", "num_attention_heads"), "kv_channels": ("model", "kv_channels"),
    "num_experts": ("model", "num_moe_experts"), "moe_router_topk": ("model", "moe_router_topk"),
    "moe_ffn_hidden_size": ("model", "moe_ffn_hidden_size"),
    "moe_router_num_groups": ("model", "moe_router_num_groups"),
    "moe_router_group_topk": ("model", "moe_router_group_topk"),
    "mtp_num_layers": ("model", "mtp_num_layers"),
    "moe_shared_expert_intermediate_size": ("model", "moe_shared_expert_intermediate_size"),
    "q_lora_rank": ("model", "q_lora_rank"), "kv_lora_rank": ("model", "kv_lora_rank"),
    "qk_head_dim": ("model", "qk_head_dim"), "qk_pos_emb_head_dim": ("model", "qk_pos_emb_head_dim"),
    "v_head_dim": ("model", "v_head_dim"),
    "tensor_model_parallel_size": ("training", "tensor_model_parallel_size"),
    "pipeline_model_parallel_size": ("training", "pipeline_model_parallel_size"),
    "context_parallel_size": ("training", "context_parallel_size"),
    "expert_model_parallel_size": ("training", "expert_model_parallel_size"),
    "expert_tensor_parallel_size": ("training", "expert_tensor_parallel_size"),
    "moe_deepep_num_sms": ("training", "moe_deepep_num_sms"),
    "micro_batch_size": ("training", "micro_batch_size"), "global_batch_size": ("training", "global_batch_size"),
}
_FLAG = {  # Megatron store_true dest -> (section, flowsim key, value when given)
    "untie_embeddings_and_output_weights": ("model", "untie_embeddings_and_output_weights", True),
    "disable_bias_linear": ("model", "add_bias_linear", False),
    "multi_latent_attention": ("model", "multi_latent_attention", True),
    "qk_layernorm": ("model", "qk_layernorm", True),
    "moe_pad_expert_input_to_capacity": ("model", "moe_pad_expert_input_to_capacity", True),
    "sequence_parallel": ("training", "sequence_parallel", True),
    "use_distributed_optimizer": ("training", "use_distributed_optimizer", True),
    "overlap_grad_reduce": ("training", "overlap_grad_reduce", True),
    "overlap_param_gather": ("training", "overlap_param_gather", True),
    "tp_comm_overlap": ("training", "tp_comm_overlap", True),
    "account_for_embedding_in_pipeline_split": ("training", "account_for_embedding_in_pipeline_split", True),
    "account_for_loss_in_pipeline_split": ("training", "account_for_loss_in_pipeline_split", True),
    "overlap_moe_expert_parallel_comm": ("training", "overlap_moe_expert_parallel_comm", True),
    "moe_shared_expert_overlap": ("training", "moe_shared_expert_overlap", True),
    "use_flash_attn": ("training", "use_flash_attn", True),
}
_TRAINING_OFF = ("sequence_parallel", "use_distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather",
                 "tp_comm_overlap")  # store_true options: off in Megatron-LM unless given
# Read below by hand (they combine with others).
_SPECIAL = {"ffn_hidden_size", "group_query_attention", "num_query_groups", "seq_length", "max_position_embeddings",
            "position_embedding_type", "use_rotary_position_embeddings", "normalization", "swiglu", "squared_relu",
            "hidden_dropout", "vocab_size", "make_vocab_size_divisible_by", "moe_layer_freq",
            "moe_expert_capacity_factor", "moe_token_dispatcher_type", "moe_flex_dispatcher_backend",
            "moe_enable_deepep", "num_layers_per_virtual_pipeline_stage",
            "num_virtual_stages_per_pipeline_rank", "recompute_granularity", "recompute_method",
            "recompute_num_layers", "recompute_modules", "recompute_activations", "bf16", "fp16", "fp8_format",
            "attention_backend", "cp_comm_type", "ddp_bucket_size", "grad_reduce_in_bf16",
            "num_distributed_optimizer_instances", "pipeline_model_parallel_layout", "moe_router_dtype", "window_size",
            "window_attn_skip_freq"}
UNSUPPORTED = {  # arguments that change the step in ways flowsim does not model
    "decoder_first_pipeline_num_layers": "uneven first/last pipeline stages are not modelled "
                                         "(use account_for_embedding_in_pipeline_split)",
    "decoder_last_pipeline_num_layers": "uneven first/last pipeline stages are not modelled "
                                        "(use account_for_loss_in_pipeline_split)",
    "hybrid_override_pattern": "hybrid Mamba models are not modelled",
    "heterogeneous_layers_config_path": "heterogeneous layers are not modelled",
    "fp4": "fp4 training is not modelled",
    "moe_token_drop_policy": None,  # checked below: only the default "probs" is accepted
}


def parse_args(tokens: list[str]) -> tuple[dict, list, int]:
    """Split a command line into ``{dest: [values]}`` (last occurrence wins), positional tokens and GPUs.

    Tokens up to a ``*.py`` script are the launcher's (``torchrun --nproc-per-node 8 --nnodes 4``): its GPU
    count (``nproc_per_node * nnodes``, 0 when not stated) is returned; the rest are Megatron-LM arguments.
    """
    script = next((i for i, t in enumerate(tokens) if t.endswith(".py")), None)
    gpus = 0
    if script is not None:
        launcher, _, _ = _split(tokens[:script])
        try:
            per_node = int(_last(launcher, "nproc_per_node") or 0)
            nodes = int(_last(launcher, "nnodes") or 1)
            gpus = per_node * nodes
        except ValueError:
            gpus = 0
        tokens = tokens[script + 1:]
    args, positional, _ = _split(tokens)
    return args, positional, gpus


def _split(tokens):
    args: dict = {}
    positional: list = []
    current = None
    for tok in tokens:
        if tok.startswith("--") and len(tok) > 2:
            name, eq, value = tok[2:].partition("=")
            current = name.replace("-", "_")
            args[current] = [value] if eq else []
        elif current is not None:
            args[current].append(tok)
        else:
            positional.append(tok)
    return args, positional, None


def window_left(value, field: str) -> int:
    """Left width of a sliding window given as Megatron's ``(left, right)`` pair (``"128,0"``, ``[128, 0]``);
    ConfigError naming ``field`` unless it is two integers with ``right`` 0 (a causal window)."""
    parts = value.split(",") if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else []
    try:
        left, right = (int(x) for x in parts)
    except (TypeError, ValueError):
        raise ConfigError(field, "must be two integers LEFT,RIGHT", value) from None
    if right != 0 or left < 0:
        raise ConfigError(field, "only causal windows (LEFT >= 0, RIGHT 0) are modelled", value)
    return left


def _last(args: dict, dest: str):
    vals = args.get(dest)
    return vals[-1] if vals else None


def read_args(source) -> tuple[list[str], str]:
    """The argument tokens of ``source``: a list of tokens, or a file of shell words (``#`` comments and
    backslash line continuations allowed)."""
    if isinstance(source, (list, tuple)):
        return [str(t) for t in source], "<args>"
    path = Path(source)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError("megatron_args", f"cannot read file: {e.strerror}", str(source)) from None
    try:
        return shlex.split(text.replace("\\\n", " "), comments=True), path.name
    except ValueError as e:
        raise ConfigError("megatron_args", f"not a shell argument list: {e}", str(source)) from None


def _int(args: dict, dest: str):
    v = _last(args, dest)
    if v is None:
        return None
    try:
        return int(v)
    except ValueError:
        raise ConfigError(f"--{dest.replace('_', '-')}", "must be an integer", v) from None


def _float(args: dict, dest: str):
    v = _last(args, dest)
    if v is None:
        return None
    try:
        return float(v)
    except ValueError:
        raise ConfigError(f"--{dest.replace('_', '-')}", "must be a number", v) from None


def _choice(args: dict, dest: str, table: dict):
    v = _last(args, dest)
    if v is None:
        return None
    if v.lower() not in table:
        raise ConfigError(f"--{dest.replace('_', '-')}", f"must be one of {', '.join(table)}", v)
    return table[v.lower()]


def layer_pattern(text: str) -> list[int]:
    """Megatron-LM's ``--moe-layer-freq`` list form (``[0,0,1]`` or ``([0]*3+[1]*58)``) as a list of 0/1."""
    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.List):
            return [ev(e) for e in node.elts]
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            a, b = ev(node.left), ev(node.right)
            return a + b if isinstance(node.op, ast.Add) else a * b
        raise ValueError
    try:
        out = ev(ast.parse(text.strip(), mode="eval"))
    except (SyntaxError, ValueError, TypeError):
        out = None
    if not isinstance(out, list) or any(v not in (0, 1) for v in out):
        raise ConfigError("--moe-layer-freq", "must be an integer or a list of 0/1 per layer", text)
    return out


def apply_moe_layer_freq(freq: str, model: dict) -> None:
    """Put ``moe_layer_freq`` / ``moe_first_k_dense`` of Megatron's ``--moe-layer-freq`` text into ``model``."""
    if freq.strip().lstrip("-").isdigit():
        model["moe_layer_freq"] = int(freq)
        return
    pattern = layer_pattern(freq)
    if "num_layers" in model and len(pattern) != model["num_layers"]:
        raise ConfigError("--moe-layer-freq", "the list must have one entry per layer",
                          f"{len(pattern)} entries, {model['num_layers']} layers")
    k = pattern.index(1) if 1 in pattern else len(pattern)
    rest = pattern[k:]
    step = next((i for i, v in enumerate(rest[1:], 1) if v), len(rest)) if rest else 1
    if not rest or rest != [int(i % step == 0) for i in range(len(rest))]:
        raise ConfigError("--moe-layer-freq", "only k leading dense layers then every n-th layer MoE is modelled",
                          freq)
    model["moe_first_k_dense"], model["moe_layer_freq"] = k, step


def from_megatron_args(source) -> Imported:
    """Read a ``pretrain_gpt.py`` argument list (a list of tokens or a file) into a flowsim config.

    Raises
    ------
    ConfigError
        A value of the wrong type, an argument flowsim cannot model, or no 16-bit/fp8 precision.
    """
    tokens, name = read_args(source)
    args, positional, gpus = parse_args(tokens)
    model: dict = {}
    training: dict = {}
    defaults: list = []

    for dest, reason in UNSUPPORTED.items():
        if dest in args and reason:
            raise ConfigError(f"--{dest.replace('_', '-')}", reason, " ".join(args[dest]) or "given")
    if (_last(args, "moe_token_drop_policy") or "probs") != "probs":
        raise ConfigError("--moe-token-drop-policy", "only the default probs is modelled",
                          _last(args, "moe_token_drop_policy"))
    if (_int(args, "num_distributed_optimizer_instances") or 1) > 1:
        raise ConfigError("--num-distributed-optimizer-instances", "the importer does not know the world size; "
                          "set data_parallel_shard_size instead", _last(args, "num_distributed_optimizer_instances"))

    for dest, (sec, key) in _INT.items():
        v = _int(args, dest)
        if v is not None:
            (model if sec == "model" else training)[key] = v
    for dest, (sec, key, value) in _FLAG.items():
        if dest in args:
            (model if sec == "model" else training)[key] = value
    for key in _TRAINING_OFF:
        training.setdefault(key, False)

    # Architecture.
    if "swiglu" in args:
        model["activation"] = "swiglu"
    elif "squared_relu" in args:
        model["activation"] = "squared_relu"
    pos = _choice(args, "position_embedding_type", POSITIONS)
    if pos is None and "use_rotary_position_embeddings" in args:
        pos = "rope"
    if pos is not None:
        model["position_embedding"] = pos
    norm = _choice(args, "normalization", NORMS)
    if norm is not None:
        model["normalization"] = norm
    if "hidden_dropout" in args:
        model["hidden_dropout"] = _float(args, "hidden_dropout")
    if _last(args, "pipeline_model_parallel_layout"):
        training["pipeline_model_parallel_layout"] = _last(args, "pipeline_model_parallel_layout")
    if _last(args, "window_size"):  # --window-size LEFT,RIGHT (Megatron-LM arguments.py); causal models: RIGHT 0
        model["window_size"] = window_left(_last(args, "window_size"), "--window-size")
    if _int(args, "window_attn_skip_freq") is not None:
        model["window_attn_skip_freq"] = _int(args, "window_attn_skip_freq")
    if _last(args, "moe_router_dtype"):
        training["moe_router_dtype"] = _last(args, "moe_router_dtype")  # build_config names fp64 as not modelled
    for key, value in DEFAULTS.items():
        if key not in model:
            model[key] = value
            defaults.append((key, value, WHOSE))
    ffn = _int(args, "ffn_hidden_size")
    if ffn is None and "hidden_size" in model:
        h = model["hidden_size"]
        ffn = int(4 * h * 2 / 3 / 64) * 64 if model["activation"] == "swiglu" else 4 * h  # arguments.py
        defaults.append(("ffn_hidden_size", ffn, WHOSE))
    if ffn is not None:
        model["ffn_hidden_size"] = ffn
    if "group_query_attention" in args:
        groups = _int(args, "num_query_groups")
        if groups is None:
            raise ConfigError("--num-query-groups", "is required with --group-query-attention")
        model["num_query_groups"] = groups
    elif "num_attention_heads" in model:
        model["num_query_groups"] = model["num_attention_heads"]  # arguments.py: no GQA, one group per head
    if "kv_channels" not in model and "hidden_size" in model and model.get("num_attention_heads"):
        model["kv_channels"] = model["hidden_size"] // model["num_attention_heads"]
    if model.get("multi_latent_attention") and "kv_lora_rank" not in model:
        model["kv_lora_rank"] = KV_LORA_RANK
    seq = _int(args, "seq_length") or _int(args, "max_position_embeddings")
    if seq is None:
        raise ConfigError("--seq-length", "is required (pretrain_gpt.py needs it)")
    vocab = _int(args, "vocab_size")
    if vocab is None:
        raise ConfigError("--vocab-size", "is required: pretrain_gpt.py takes it from the tokenizer, which the "
                          "argument list only names; add --vocab-size N")
    multiple = (_int(args, "make_vocab_size_divisible_by") or MAKE_VOCAB_DIVISIBLE_BY) * \
        training.get("tensor_model_parallel_size", 1)
    model["vocab_size"] = -(-vocab // multiple) * multiple  # _vocab_size_with_padding
    if _last(args, "moe_layer_freq") is not None:
        apply_moe_layer_freq(_last(args, "moe_layer_freq"), model)
    if "num_experts" in args:
        cap = _float(args, "moe_expert_capacity_factor")
        if cap is not None:
            model["moe_expert_capacity_factor"] = cap
        dispatcher = _last(args, "moe_token_dispatcher_type") or TOKEN_DISPATCHER
        if dispatcher not in ("alltoall", "allgather", "flex"):
            raise ConfigError("--moe-token-dispatcher-type", "must be alltoall, allgather or flex", dispatcher)
        training["moe_token_dispatcher_type"] = dispatcher
        backend = _last(args, "moe_flex_dispatcher_backend") or ("deepep" if "moe_enable_deepep" in args else None)
        if backend is not None:  # --moe-enable-deepep: the older releases' switch for the DeepEP backend
            training["moe_flex_dispatcher_backend"] = backend
        training.setdefault("expert_tensor_parallel_size", training.get("tensor_model_parallel_size", 1))

    # Parallel layout and step.
    if training.get("tensor_model_parallel_size", 1) == 1:
        training["sequence_parallel"] = False  # arguments.py turns it off when tp is 1
    training["seq_length"] = seq
    per_stage = _int(args, "num_layers_per_virtual_pipeline_stage")
    if per_stage:
        split = training.get("pipeline_model_parallel_size", 1) * per_stage
        if model.get("num_layers", 0) % split:
            raise ConfigError("--num-layers-per-virtual-pipeline-stage", "num_layers must be a multiple of it "
                              "times pipeline_model_parallel_size", f"{model.get('num_layers')} and {split}")
        training["virtual_pipeline_model_parallel_size"] = model["num_layers"] // split
    vstages = _int(args, "num_virtual_stages_per_pipeline_rank")
    if vstages:
        training["virtual_pipeline_model_parallel_size"] = vstages
    _recompute(args, training)
    _precision(args, training)
    backend = _choice(args, "attention_backend", ATTENTION_BACKENDS)
    training.setdefault("use_flash_attn", True if backend is None else backend)
    if "cp_comm_type" in args and args["cp_comm_type"]:
        training["cp_comm_type"] = args["cp_comm_type"][0]
    bucket = _int(args, "ddp_bucket_size")
    if bucket:
        training["bucket_size_bytes"] = float(bucket * (2 if "grad_reduce_in_bf16" in args else 4))

    known = set(_INT) | set(_FLAG) | _SPECIAL | set(UNSUPPORTED)
    ignored = sorted(f"--{d.replace('_', '-')}" for d in args if d not in known)
    ignored += [p for p in positional]
    config = {"model": {"name": Path(name).stem if name != "<args>" else "megatron-args", **model},
              "training": training}
    if gpus:
        config["cluster"] = {"num_gpus": gpus}
    return Imported(config=config, source=name, defaults=tuple(defaults), ignored=tuple(ignored))


def _recompute(args: dict, training: dict) -> None:
    gran = _last(args, "recompute_granularity")
    if gran is None and "recompute_activations" in args:
        gran = "selective"  # arguments.py: --recompute-activations means selective
    if gran is None:
        return
    if gran not in ("full", "selective"):
        raise ConfigError("--recompute-granularity", "must be full or selective", gran)
    training["recompute_granularity"] = gran
    if gran == "selective":
        if args.get("recompute_modules"):
            training["recompute_modules"] = tuple(args["recompute_modules"])
        return
    method = _last(args, "recompute_method")
    n = _int(args, "recompute_num_layers") or 1
    if method == "uniform":
        training["recompute_num_layers"] = 0  # every layer recomputed, n at a time
    elif method == "block":
        training["recompute_num_layers"] = n  # the first n layers of each pipeline chunk
    else:
        raise ConfigError("--recompute-method", "full recompute needs uniform or block", method)


def _precision(args: dict, training: dict) -> None:
    if "fp8_format" in args:
        training["precision"] = "fp8"
    elif "bf16" in args:
        training["precision"] = "bf16"
    elif "fp16" in args:
        training["precision"] = "fp16"
    else:
        raise ConfigError("--bf16", "Megatron-LM trains in fp32 without --bf16, --fp16 or --fp8-format; flowsim "
                          "models 16-bit and fp8 training", "none of them given")
