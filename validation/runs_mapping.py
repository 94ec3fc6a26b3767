"""One runs-CSV row -> the :class:`flowsim.config.SimConfig` flowsim simulates for it, with the assumptions made.

Mapping rules (row -> config)
-----------------------------
* Model: the dimension columns map to the Megatron-LM names of the same name. ``gated_mlp = 1`` gives a
  Llama-style model (SwiGLU, RMSNorm, rotary positions, no biases, untied embeddings); ``gated_mlp = 0``
  gives a GPT-style model (GeLU, LayerNorm, learned positions, biases, tied embeddings). Non-gated rows are
  all priced as GeLU (squared-ReLU, ReLU and ALiBi variants cost the same GEMMs).
* Cluster: ``nics_per_node = gpus_per_node`` and ``nic_gbps = nic_gbps_per_gpu`` (one NIC per GPU). For
  GB200/GB300 rows the CSV's ``gpus_per_node`` is the NVLink domain (72 for NVL72): the row maps to
  ``nvlink_domain = gpus_per_node`` with 4 GPUs and 4 NICs per host (a compute tray) and an Arm host CPU
  (Grace).
* Training: tp, pp, vpp, dp, cp, sp, micro/global batch, recompute and precision map one to one;
  ``distributed_optimizer = 1`` sets ``use_distributed_optimizer`` and a ZeRO stage of at least 1;
  ``zero_stage`` is taken as given (FSDP rows carry 2 or 3).

Empty cells that have a clear default are filled and recorded in the row's ``assumptions``:
``micro_batch_size`` -> 1 (torchtitan with pp > 1: one micro-batch per stage, its default); ``recompute``
-> none; ``vpp`` -> 1 (with pp > 1 the source ran an interleaved
schedule of unknown degree; 1F1B is simulated, which has the largest bubble); ``sp`` -> on when tp > 1;
``precision`` -> bf16; ``zero_stage`` -> 0 (1 with the distributed optimizer); ``distributed_optimizer``
-> off; ``moe_num_experts`` -> 0 (dense); ``ffn_hidden_size`` -> 4h, ``num_query_groups`` -> heads,
``kv_channels`` -> h / heads; ``nic_gbps_per_gpu`` -> unused for a single-node job, else the NIC rate of
the built-in cluster preset with the same GPU (the job is skipped when there is none). A row whose
layout (tp, pp, dp, cp), GPU count, batch or model size is empty is skipped.

Runs schema v2 (optional framework-setting columns): a ``framework_version`` that flowsim has a profile of
(:mod:`flowsim.config.profiles`) selects that release's defaults; every filled :data:`V2_SETTINGS` cell sets its
config key and overrides the profile (an empty cell leaves the profile's default, or flowsim's without a
profile). Each row's assumptions say which settings came from the row and which from the profile. A cell with a
wrong value (``overlap_grad_reduce: 2``, ``attention_impl: fast``) skips its row with a one-line reason naming
the column and the allowed values. A filled ``power_limit_w`` sets the cluster's ``power_limit_w`` (compute ceilings
derated, :mod:`flowsim.kernels.power`); ``framework_version`` also names the software release the kernels are
priced on (:mod:`flowsim.kernels.stack`). v1 files (no such columns) map as before.
"""
from __future__ import annotations

import functools
import math
import re
from typing import Mapping

from flowsim.config import build_config, list_presets, load_preset
from flowsim.errors import ConfigError
from flowsim.validation.runs_read import _int_or_value, _known
from flowsim.validation.runs_v2 import _expert_layout, _v2_settings

NVL_HOST_GPUS = {"gb200": 4, "gb300": 4}
"""GPUs per host (compute tray) of the rack-scale NVLink systems whose CSV rows give the NVLink domain
as ``gpus_per_node``. Source: NVIDIA GB200 NVL72 / GB300 NVL72 spec pages (18 compute trays of 4 GPUs
and 2 Grace CPUs; one ConnectX NIC per GPU)."""


def row_to_config(row: Mapping) -> tuple[dict, tuple[str, ...]]:
    """Config mapping (for :func:`flowsim.config.build_config`) of one runs-CSV row, and its assumptions.

    Parameters
    ----------
    row : Mapping
        One row of :func:`read_runs` (a pandas Series or a dict with the :data:`REQUIRED_COLUMNS`).

    Returns
    -------
    config : dict
        Nested ``model`` / ``cluster`` / ``training`` mapping of Megatron-LM argument names.
    assumptions : tuple[str, ...]
        One ``"<column>: <what was assumed>"`` entry per empty cell that was filled with a default.

    Raises
    ------
    ConfigError
        When a cell needed to simulate the row is empty and has no clear default (model size, layout,
        GPU count, global batch), or the NIC rate is empty for a multi-node job on a GPU that no
        built-in cluster preset uses.

    Notes
    -----
    The rules are in the module docstring. Values are not range-checked here; build_config does that.
    """
    assumptions: list[str] = []

    def need(name):
        value = row[name]
        if not _known(value) or (isinstance(value, str) and not value):
            raise ConfigError(name, "empty in the runs CSV; needed to simulate the row")
        return _int_or_value(value)

    def default(name, value, text):
        if _known(row[name]) and row[name] != "":
            return _int_or_value(row[name])
        assumptions.append(f"{name}: empty, {text}")
        return value

    gated = bool(need("gated_mlp"))
    model = {
        "name": row["model"],
        "num_layers": need("num_layers"),
        "hidden_size": need("hidden_size"),
        "num_attention_heads": need("num_attention_heads"),
        "vocab_size": need("vocab_size"),
        "activation": "swiglu" if gated else "gelu",
        "normalization": "rmsnorm" if gated else "layernorm",
        "position_embedding": "rope" if gated else "learned",
        "add_bias_linear": not gated,
        "untie_embeddings_and_output_weights": gated,
    }
    for name, text in (("ffn_hidden_size", "assumed 4 * hidden_size"),
                       ("num_query_groups", "assumed num_attention_heads (no GQA)"),
                       ("kv_channels", "assumed hidden_size / num_attention_heads")):
        value = default(name, 0, text)
        if value:
            model[name] = value

    model.update(_moe_fields(row, assumptions))

    gpu = need("gpu")
    num_gpus, gpus_per_node = need("num_gpus"), need("gpus_per_node")
    cluster = {"gpu": gpu, "num_gpus": num_gpus}
    if gpu in NVL_HOST_GPUS:
        host = NVL_HOST_GPUS[gpu]
        cluster.update(gpus_per_node=host, nvlink_domain=gpus_per_node, nics_per_node=host, cpu="arm")
    else:
        cluster.update(gpus_per_node=gpus_per_node, nics_per_node=gpus_per_node)
    if _known(row.get("power_limit_w", math.nan)):
        cluster["power_limit_w"] = row["power_limit_w"]  # a non-default board power limit (schema v2)
    if _known(row["nic_gbps_per_gpu"]):
        cluster["nic_gbps"] = row["nic_gbps_per_gpu"]
    elif isinstance(num_gpus, int) and num_gpus <= cluster["gpus_per_node"]:
        assumptions.append("nic_gbps_per_gpu: empty, unused (single-node job)")
    else:
        preset = _preset_with_gpu(gpu)
        if preset is None and gpu in SYSTEM_NIC_GBPS:
            preset = {"nic_gbps": SYSTEM_NIC_GBPS[gpu][0], "name": SYSTEM_NIC_GBPS[gpu][1]}
        if preset is None:
            raise ConfigError("nic_gbps_per_gpu", "empty in the runs CSV and no built-in cluster preset uses "
                              "this GPU to assume it from", gpu)
        cluster["nic_gbps"] = preset["nic_gbps"]
        assumptions.append(f"nic_gbps_per_gpu: empty, assumed {preset['nic_gbps']:g} "
                           f"(cluster preset {preset['name']})")

    tp, pp = need("tp"), need("pp")
    distributed_optimizer = default("distributed_optimizer", 0, "assumed 0 (no distributed optimizer)")
    zero_stage = default("zero_stage", int(distributed_optimizer == 1), f"assumed {int(distributed_optimizer == 1)}")
    if distributed_optimizer == 1 and isinstance(zero_stage, int):
        zero_stage = max(zero_stage, 1)
    pp_text = f"with pp={pp} the source ran an interleaved schedule of unknown degree; simulated as 1F1B (vpp=1)"
    training = {
        "tensor_model_parallel_size": tp,
        "pipeline_model_parallel_size": pp,
        "data_parallel_size": need("dp"),
        "context_parallel_size": need("cp"),
        "expert_model_parallel_size": default("ep", 1, "assumed 1"),
        "virtual_pipeline_model_parallel_size": default(
            "vpp", 1, pp_text if isinstance(pp, int) and pp > 1 else "assumed 1"),
        "sequence_parallel": default("sp", int(isinstance(tp, int) and tp > 1),
                                     "assumed on with tp > 1 (Megatron-style recipes)"),
        "micro_batch_size": default("micro_batch_size", *_default_micro_batch(row, pp)),
        "global_batch_size": need("global_batch_size"),
        "seq_length": need("seq_length"),
        "recompute_granularity": default("recompute", "none", "assumed none"),
        "precision": default("precision", "bf16", "assumed bf16"),
        "use_distributed_optimizer": distributed_optimizer,
        "zero_stage": zero_stage,
    }
    training.update(_v2_settings(row, assumptions))
    training.update(_software_facts(row, model["num_layers"], training, assumptions))
    if model.get("num_moe_experts"):
        training.update(_expert_layout(row, assumptions))
        training.update(_router_dtype(row, assumptions))
    return {"model": model, "cluster": cluster, "training": training}, tuple(assumptions)


def _router_dtype(row: Mapping, assumptions: list) -> dict:
    """``moe_router_dtype`` where the framework fixes it for the model: Megatron-Bridge's DeepSeek provider gates in
    fp32 (``moe_router_dtype = "fp32"``, NVIDIA-NeMo/Megatron-Bridge v0.1.0rc3 and v0.3.0
    ``src/megatron/bridge/models/deepseek/deepseek_provider.py``), whatever the recipe."""
    if (str(row.get("framework_version", "")).startswith("megatron-bridge")
            and re.search(r"DeepSeek-V3:", str(row.get("notes", "")))):
        assumptions.append("moe_router_dtype: fp32 (Megatron-Bridge's DeepSeek provider)")
        return {"moe_router_dtype": "fp32"}
    return {}


def _moe_fields(row: Mapping, assumptions: list) -> dict:
    """MoE model fields of a row: experts, top-k, expert width, shared experts (as one shared MLP of
    ``moe_shared_experts * moe_ffn_hidden_size``), and from the notes the facts the schema has no column for:
    token-drop routing, leading dense layers ("first N layers dense"), DeepSeek MLA ranks ("q_lora_rank
    1536, kv_lora_rank 512, qk head dim 128 nope + 64 rope, v head dim 128") and DeepSeek-V3's group-limited
    routing, QK-norm, and alternating sliding-window layers ("alternating 128-token sliding-window / full
    attention layers")."""
    experts = row["moe_num_experts"]
    if not _known(experts) or experts <= 0:
        return {}
    if not _known(row["moe_topk"]):
        raise ConfigError("moe_topk", "empty in the runs CSV; needed to simulate the row")
    out = {"num_moe_experts": int(experts), "moe_router_topk": int(row["moe_topk"])}
    if _known(row["moe_ffn_hidden_size"]) and row["moe_ffn_hidden_size"] > 0:
        out["moe_ffn_hidden_size"] = int(row["moe_ffn_hidden_size"])
    shared = row["moe_shared_experts"]
    if _known(shared) and shared > 0:
        out["moe_shared_expert_intermediate_size"] = int(shared) * out.get("moe_ffn_hidden_size", 0)
    notes = str(row.get("notes", ""))
    if re.search(r"token-drop routing", notes):
        # NeMo's MegatronTokenDropCallback defaults (nemo/lightning/pytorch/callbacks/moe_token_drop.py)
        out.update(moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True)
        assumptions.append("moe: token drop = capacity factor 1.0, padded to capacity (NeMo's token-drop defaults)")
    if re.search(r"force-balanced", notes):
        # Megatron-LM --moe-router-force-load-balancing: the benchmark router spreads tokens evenly
        out["moe_imbalance_factor"] = 1.0
        assumptions.append("moe: force-balanced routing (from the notes), imbalance factor 1")
    dense = re.search(r"first (\d+) layers dense", notes)
    if dense:
        out["moe_first_k_dense"] = int(dense.group(1))
        assumptions.append(f"moe_first_k_dense: {dense.group(1)} (from the notes)")
    mla = re.search(r"q_lora_rank (\d+), kv_lora_rank (\d+), qk head dim (\d+) nope \+ (\d+) rope, "
                    r"v head dim (\d+)", notes)
    if mla:
        q, kv, qk, rope, v = (int(x) for x in mla.groups())
        out.update(multi_latent_attention=True, q_lora_rank=q, kv_lora_rank=kv, qk_head_dim=qk,
                   qk_pos_emb_head_dim=rope, v_head_dim=v)
        assumptions.append("attention: MLA (ranks from the notes)")
    if re.search(r"DeepSeek-V3:", notes) and out["num_moe_experts"] == 256 and out["moe_router_topk"] == 8:
        # The architecture's node-limited routing (deepseek-ai/DeepSeek-V3 config.json n_group 8, topk_group 4;
        # arXiv 2412.19437 sec. 2.1.2), which Megatron's router applies (--moe-router-num-groups/-group-topk)
        out.update(moe_router_num_groups=8, moe_router_group_topk=4)
        assumptions.append("moe: DeepSeek-V3's group-limited routing, 4 of 8 expert groups per token "
                           "(the model's config.json)")
    if re.search(r"QK-norm", notes):
        out["qk_layernorm"] = True
        assumptions.append("qk_layernorm: on (QK-norm in the notes)")
    if re.search(r"clamped SwiGLU", notes) and re.search(r"GPT-OSS", notes):
        # GPT-OSS's gated activation clamped at 7 (Megatron-Bridge 0.3.0 models/gpt_oss/gpt_oss_provider.py
        # GPTOSSProvider activation_func_clamp_value 7.0; openai/gpt-oss config.json swiglu_limit 7.0)
        out["activation_func_clamp_value"] = 7.0
        assumptions.append("activation: GPT-OSS's SwiGLU clamped at 7 (clamped SwiGLU in the notes)")
    if re.search(r"GPT-OSS", notes):
        # the architecture's linear biases, the routed experts' too (GPTOSSProvider add_bias_linear=True)
        out["add_bias_linear"] = True
        assumptions.append("add_bias_linear: on (GPT-OSS's linear layers carry biases)")
    window = re.search(r"alternating (\d+)-token sliding-window / full attention layers", notes)
    if window:
        out.update(window_size=int(window.group(1)), window_attn_skip_freq=2)
        assumptions.append(f"attention: {window.group(1)}-token sliding window on every other layer (from the notes)")
    return out


def _default_micro_batch(row: Mapping, pp) -> tuple[int, str]:
    """Micro-batch size for an empty cell, and the assumption's text: torchtitan splits each data-parallel
    rank's batch into as many micro-batches as there are pipeline stages unless told otherwise
    (``pipeline_parallel_microbatches`` defaults to the stage count); everything else gets 1."""
    local = row["global_batch_size"] / row["dp"] if _known(row["global_batch_size"]) and _known(row["dp"]) else 0
    if row.get("framework") == "torchtitan" and isinstance(pp, int) and pp > 1 and local and \
            float(local / pp).is_integer():
        return int(local // pp), f"assumed {int(local // pp)} (torchtitan's default: {pp} micro-batches, one per stage)"
    return 1, "assumed 1"


def _software_facts(row: Mapping, num_layers, training: dict, assumptions: list) -> dict:
    """Settings the schema has no column for, taken from the row's own source text (recorded as assumptions).

    * A source dated before FlashAttention (Dao et al., May 2022, arXiv 2205.14135) ran unfused attention.
    * ``tp-comm-overlap`` / "TP comm overlap" in the notes: tensor-parallel communication overlapped.
    * The FP8 recipe an ``fp8`` row's notes name (current scaling / FP8-CS / tensorwise, rowwise, MXFP8,
      fine-grained / blockwise, delayed scaling): ``fp8_recipe`` (the runs README keeps the recipe in ``notes``);
      "fp8 all-gather" there: ``fp8_param_gather``.
    * (These two, and eager kernels for torchtitan, only where the row's v2 columns ``attention_impl``,
      ``tp_comm_overlap`` and ``torch_compile`` do not state the setting: ``training`` holds what they state.)
    * Selective recompute outside Megatron-LM / NeMo is the source's own policy (:mod:`flowsim.model.recompute`):
      notes that say every n-th block (or layer-level) is checkpointed give ``selective_ac_option: N``, with
      N = 2 (torchtitan's default option) when the notes do not give it; other torchtitan rows run its
      op-level policy (``op``, the llama3 8B recipe's setting).
    * torchtitan rows whose notes do not say torch.compile ran eager kernels (``training.compile`` is off
      by default in torchtitan's job config): ``kernel_fusion: eager``.
    * torchtitan with FSDP and pipeline parallelism keeps each stage's parameters gathered after the forward
      (``apply_fsdp``: "for PP, do not reshard after forward to avoid per-microbatch all-gathers") and
      reduce-scatters the gradients once, after the last micro-batch's backward
      (``torch.distributed.pipelining`` ``PipelineStage.backward_maybe_with_nosync``): ``zero_stage: 2``
      with ``overlap_grad_reduce: false``.
    * Layers that do not divide into pp * vpp stages: Megatron-LM / NeMo recipes count the embedding and
      the loss as one layer each (``account_for_*_in_pipeline_split``, as in the Llama-3.1-405B recipes)
      when that makes them divide; otherwise the remainder is spread (``balanced``, the uniform
      partitioners of DeepSpeed and torchtitan).
    """
    out = {}
    year = re.search(r"(19|20)\d\d", str(row.get("source", "")))
    if year and int(year.group(0)) < 2022 and "use_flash_attn" not in training:
        out["use_flash_attn"] = False
        assumptions.append(f"attention: unfused (the source, {year.group(0)}, predates FlashAttention)")
    text = f"{row.get('notes', '')} {row.get('source_detail', '')}"
    if row.get("framework") == "torchtitan" and not re.search(r"torch\.compile", text) \
            and "kernel_fusion" not in training:
        out["kernel_fusion"] = "eager"
        why = "stated in the source notes" if re.search(r"\beager\b", text) else \
            "torchtitan without torch.compile, its default"
        assumptions.append(f"kernels: eager PyTorch ({why})")
    if training["recompute_granularity"] == "selective" and row.get("framework") not in ("megatron-lm", "nemo"):
        every = re.search(r"every (\d+|n)-?(?:th)? (?:block|layer)|layer-level selective", text, re.IGNORECASE)
        if every:
            n = every.group(1) if every.group(1) and every.group(1).isdigit() else None
            out["selective_ac_option"] = n or "2"
            if n:
                assumptions.append(f"recompute: every {n}-th block fully recomputed (from the notes)")
            else:
                assumptions.append("recompute: every 2nd block fully recomputed (n not stated; torchtitan's "
                                   "default option 2)")
        elif row.get("framework") == "torchtitan":
            out["selective_ac_option"] = "op"
            stated = re.search(r"per-op|\bop-level", text) and not re.search(r"op- or layer-level not stated", text)
            why = "stated in the notes" if stated else "not stated; the setting of torchtitan's llama3 8B recipe"
            assumptions.append(f"recompute: torchtitan op-level selective policy ({why})")
    if row.get("framework") == "torchtitan" and training["pipeline_model_parallel_size"] != 1 \
            and training["zero_stage"] == 3:
        out.update(zero_stage=2, overlap_grad_reduce=False)
        assumptions.append("fsdp with pp: torchtitan keeps parameters gathered after forward and reduce-scatters "
                           "gradients after the last backward (zero_stage 2, no overlap"
                           + (", whatever overlap_grad_reduce says for FSDP2 alone)"
                              if training.get("overlap_grad_reduce") else ")"))
    recipe = _fp8_recipe(text) if training["precision"] == "fp8" and "fp8_recipe" not in training else None
    if recipe:
        out["fp8_recipe"] = recipe
        assumptions.append(f"fp8_recipe: {recipe} (from the notes)")
    if training["precision"] == "fp8" and re.search(r"fp8 all-gather|float8 all-gather|fp8[-_ ]param[-_ ]gather",
                                                    text, re.IGNORECASE):
        out["fp8_param_gather"] = True
        assumptions.append("fp8_param_gather: on (FP8 weight all-gather in the notes)")
    if re.search(r"tp[-_ ]comm[-_ ]overlap", text, re.IGNORECASE) and "tp_comm_overlap" not in training:
        out["tp_comm_overlap"] = True
        assumptions.append("tp_comm_overlap: on (stated in the source notes)")
    pp, vpp = training["pipeline_model_parallel_size"], training["virtual_pipeline_model_parallel_size"]
    if all(isinstance(x, int) and x > 0 for x in (num_layers, pp, vpp)) and num_layers % (pp * vpp):
        if row.get("framework") in ("megatron-lm", "nemo") and (num_layers + 2) % (pp * vpp) == 0:
            out["account_for_embedding_in_pipeline_split"] = True
            out["account_for_loss_in_pipeline_split"] = True
            assumptions.append("pipeline split: embedding and loss count as layers (Megatron-LM recipe)")
        else:
            out["pipeline_layer_split"] = "balanced"
            assumptions.append("pipeline split: balanced (layers do not divide into pp*vpp stages)")
    return out


_FP8_RECIPE_WORDS = (
    # (pattern in the notes, fp8_recipe): the runs README puts the FP8 recipe in `notes`
    (r"MXFP8", "mxfp8"),
    (r"current scaling|FP8-CS\b|\btensorwise\b", "tensorwise"),
    (r"\browwise\b", "rowwise"),
    (r"fine-grained|blockwise|block-wise|1x128", "blockwise"),
    (r"delayed scaling|amax history", "delayed"),
)


def _fp8_recipe(text: str) -> str | None:
    """The FP8 scaling recipe the notes name (the runs README keeps it there, having no column for it), or
    None: the framework release's profile, or flowsim's default, then decides."""
    for pattern, recipe in _FP8_RECIPE_WORDS:
        if re.search(pattern, text, re.IGNORECASE):
            return recipe
    return None


_PEAK_MEMORY = re.compile(r"\bpeak mem(?:ory)? ([0-9]+(?:\.[0-9]+)?) ?GiB", re.IGNORECASE)


def measured_peak_memory_gib(row: Mapping) -> float:
    """The peak device memory per GPU a row's ``notes`` state, GiB, or NaN when they state none.

    The runs schema has no memory column; its README keeps what a source says beyond the columns in ``notes``,
    and the curated rows quote the source's figure as ``source notes: peak mem X GiB`` (``n/a`` when the source
    gives none). torchtitan's figure is ``torch.cuda.max_memory_reserved`` (the ``memory: X GiB`` of its training
    log: torchtitan 0.1.0 ``components/metrics.py`` ``DeviceMemoryMonitor.get_peak_stats``, reserved_bytes.all.peak),
    i.e. the caching allocator's reserved bytes, not the CUDA context.
    """
    return _peak_memory_in_notes(str(row.get("notes", "")))


@functools.lru_cache(maxsize=1024)
def _peak_memory_in_notes(notes: str) -> float:
    """:func:`measured_peak_memory_gib` of a row with these notes (read once per distinct text: a long file repeats
    its notes)."""
    found = _PEAK_MEMORY.search(notes)
    return float(found.group(1)) if found and float(found.group(1)) > 0 else math.nan


SYSTEM_NIC_GBPS = {
    # curated/README.md "System facts used": Meta Grand Teton (torchtitan, Llama 3) 400 Gb/s per GPU
    "h100-sxm-hbm2e": (400.0, "Meta Grand Teton system facts in the runs README"),
}
"""NIC line rate per GPU for GPUs with no built-in cluster preset, from the runs README's system facts."""


def _preset_with_gpu(gpu: str) -> dict | None:
    """The first built-in cluster preset (by name) whose GPU is ``gpu``, with its name; None if none."""
    for name in list_presets("clusters"):
        preset = load_preset("clusters", name)
        if preset.get("gpu") == gpu:
            return preset
    return None


def _skip_reason(row: Mapping) -> str | None:
    """Why a row is not simulated before a config is built, or None."""
    from flowsim.gpu_specs import get_gpu

    measured = row["measured_step_time_s"]
    if not _known(measured):
        return "no measured step time"
    if not measured > 0:
        return f"measured_step_time_s: must be > 0 (got {measured:g})"
    try:
        get_gpu(row["gpu"])
    except ConfigError:
        return f"no GPU spec for {row['gpu']!r}"
    return None


def config_of_row(row: Mapping, calibration: str = "") -> tuple:
    """The config flowsim simulates for one row of :func:`read_runs`, or why the row is not simulated.

    Parameters
    ----------
    row : Mapping
        One row of :func:`read_runs`.
    calibration : str
        Calibration profile applied to the row (config key ``calibration``; empty = none).

    Returns
    -------
    (SimConfig or None, assumptions, reason or None)
        ``reason`` is a one-line text when the row is skipped (no measured step time, no GPU spec, or the
        ConfigError of a field the mapping or build_config rejects).
    """
    reason = _skip_reason(row)
    if reason is not None:
        return None, (), reason
    try:
        mapping, assumptions = row_to_config(row)
        if calibration:
            mapping["training"]["calibration"] = calibration
        cfg = build_config(mapping)
    except ConfigError as e:
        return None, (), str(e)
    if cfg.training.framework:
        filled = ", ".join(f"{k}={v}" for k, v in cfg.framework_defaults) or "none"
        assumptions += (f"settings from the {cfg.training.framework_version} profile: {filled}",)
    return cfg, assumptions, None
