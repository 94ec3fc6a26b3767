"""The whole input of one simulation and its cross-field rules."""
from __future__ import annotations

from dataclasses import dataclass, replace

from flowsim.config import bounds
from flowsim.config.cluster import ClusterConfig, job_domain_size
from flowsim.config.layout import (check_expert_layout, check_layout, check_pipeline_layout, chunks_per_stage,
                                   group_spans)
from flowsim.config.model import ModelConfig
from flowsim.config.training import DEEPEP_MAX_NVL_PEERS, TrainingConfig
from flowsim.errors import ConfigError


@dataclass(frozen=True)
class SimConfig:
    """Model, cluster and training settings, checked against each other.

    Build it with :func:`flowsim.config.load_config`; ``resolved()`` fills the derived fields
    (data-parallel size, sequence length, global batch) and ``validate()`` checks every rule.
    ``framework_defaults`` lists the ``(key, value)`` pairs the framework profile filled in
    (:mod:`flowsim.config.profiles`; set by ``build_config``).
    """

    model: ModelConfig
    cluster: ClusterConfig
    training: TrainingConfig
    framework_defaults: tuple = ()

    @property
    def seq_length(self) -> int:
        """Tokens per sequence in this run."""
        return self.training.seq_length or self.model.seq_length

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per pipeline per optimizer step (gradient-accumulation steps)."""
        t = self.training
        return t.global_batch_size // (t.micro_batch_size * t.dp)

    @property
    def microbatch_tokens(self) -> int:
        """Tokens of one micro-batch on one GPU: ``micro_batch_size * seq_length / cp`` (context parallelism
        splits each sequence over ``cp`` GPUs; tensor and sequence parallelism do not divide it)."""
        return self.training.micro_batch_size * self.seq_length // self.training.cp

    @property
    def tokens_per_step(self) -> int:
        """Tokens processed by the whole job in one optimizer step."""
        return self.training.global_batch_size * self.seq_length

    def resolved(self) -> "SimConfig":
        """Return a copy with data_parallel_size, seq_length and global_batch_size filled in."""
        t = self.training
        model_ways = t.tp * t.pp * t.cp
        dp = t.dp
        if dp == 0:
            if self.cluster.num_gpus % model_ways:
                raise ConfigError("num_gpus", "must be divisible by tp*pp*cp",
                                  f"{self.cluster.num_gpus} and {t.tp}*{t.pp}*{t.cp}")
            dp = self.cluster.num_gpus // model_ways
        gbs = t.global_batch_size or t.micro_batch_size * dp
        seq = t.seq_length or self.model.seq_length
        nvl = t.moe_flex_nvlink_ranks
        if t.moe_token_dispatcher_type == "flex" and not nvl:
            nvl = job_domain_size(self.cluster)
            if t.moe_flex_dispatcher_backend == "deepep":
                nvl = min(nvl, DEEPEP_MAX_NVL_PEERS)
        return replace(self, training=replace(t, data_parallel_size=dp, global_batch_size=gbs, seq_length=seq,
                                              moe_flex_nvlink_ranks=nvl))

    def validate(self) -> None:
        """Raise ConfigError naming the first rule broken (call on a resolved config)."""
        self.model.validate()
        self.cluster.validate()
        self.training.validate()
        self.validate_across()

    def validate_across(self) -> None:
        """The rules between the model, cluster and training fields (:meth:`validate` without the sections' own
        rules, for a caller that has checked the sections already)."""
        m, c, t = self.model, self.cluster, self.training
        if t.tp * t.pp * t.dp * t.cp != c.num_gpus:
            raise ConfigError("num_gpus", "must equal tp*pp*dp*cp",
                              f"{c.num_gpus} vs {t.tp}*{t.pp}*{t.dp}*{t.cp}={t.tp * t.pp * t.dp * t.cp}")
        if m.num_attention_heads % t.tp:
            raise ConfigError("num_attention_heads", "must be divisible by tensor_model_parallel_size",
                              f"{m.num_attention_heads} and {t.tp}")
        if m.num_query_groups % t.tp and t.tp % m.num_query_groups:
            raise ConfigError("num_query_groups", "must be divisible by tensor_model_parallel_size (or divide it)",
                              f"{m.num_query_groups} and {t.tp}")
        if m.window_size:
            n = m.window_attn_skip_freq
            if n and (m.num_attention_heads // t.tp) % n:
                raise ConfigError("window_attn_skip_freq", "must divide the attention heads per tensor-parallel rank "
                                  "(flowsim prices the mix of full and windowed layers head by head)",
                                  f"{n} and {m.num_attention_heads}/{t.tp}")
            if t.cp > 1 or not t.use_flash_attn:
                raise ConfigError("window_size", "sliding-window attention is modelled with FlashAttention and no "
                                  "context parallelism", f"cp={t.cp}, use_flash_attn={t.use_flash_attn}")
        if m.ffn_hidden_size % t.tp:
            raise ConfigError("ffn_hidden_size", "must be divisible by tensor_model_parallel_size",
                              f"{m.ffn_hidden_size} and {t.tp}")
        extra = int(t.account_for_embedding_in_pipeline_split) + int(t.account_for_loss_in_pipeline_split)
        if t.pipeline_model_parallel_layout:  # an explicit split: its own rules, empty stages allowed
            check_pipeline_layout(t, m.num_layers, m.mtp_num_layers)
        elif t.pipeline_layer_split == "even" and (m.num_layers + extra) % (t.pp * t.vpp):
            what = "num_layers" + (" + embedding/loss layers" if extra else "")
            raise ConfigError("num_layers", f"{what} must be divisible by pipeline_model_parallel_size * "
                              "virtual_pipeline_model_parallel_size (or set pipeline_layer_split: balanced)",
                              f"{m.num_layers + extra} and {t.pp}*{t.vpp}")
        if m.num_layers + extra < t.pp * t.vpp and not t.pipeline_model_parallel_layout:
            raise ConfigError("num_layers", "every virtual pipeline stage needs at least one layer",
                              f"{m.num_layers} layers for {t.pp}*{t.vpp} stages")
        if t.data_parallel_shard_size and (t.dp * t.cp) % t.data_parallel_shard_size:
            raise ConfigError("data_parallel_shard_size", "must divide data_parallel_size * context_parallel_size",
                              f"{t.data_parallel_shard_size} and {t.dp}*{t.cp}")
        if t.dp_shard < t.dp * t.cp and t.zero_stage == 0 and not t.use_distributed_optimizer:
            raise ConfigError("data_parallel_shard_size", "hybrid sharding needs zero_stage >= 1 or "
                              "use_distributed_optimizer (nothing is sharded without them)", t.data_parallel_shard_size)
        if t.global_batch_size % (t.micro_batch_size * t.dp):
            raise ConfigError("global_batch_size", "must be divisible by micro_batch_size * data_parallel_size",
                              f"{t.global_batch_size} and {t.micro_batch_size}*{t.dp}")
        if self.seq_length % (2 * t.cp if t.cp > 1 else 1):
            raise ConfigError("seq_length", "must be divisible by 2 * context_parallel_size (causal load "
                              "balancing)", f"{self.seq_length} and cp={t.cp}")
        if t.sequence_parallel and self.seq_length % (t.tp * t.cp):
            raise ConfigError("seq_length", "must be divisible by tp * cp with sequence_parallel",
                              f"{self.seq_length} and {t.tp}*{t.cp}")
        if t.expert_tensor_parallel_size > 1 and not m.is_moe:
            raise ConfigError("expert_tensor_parallel_size", "needs a mixture-of-experts model; this model is dense",
                              t.expert_tensor_parallel_size)
        if t.ep > 1 and not m.is_moe:
            raise ConfigError("expert_model_parallel_size", "needs a mixture-of-experts model; "
                              "this model is dense", t.ep)
        if m.is_moe:
            if m.num_moe_experts % t.ep:
                raise ConfigError("expert_model_parallel_size", "must divide num_moe_experts",
                                  f"{t.ep} and {m.num_moe_experts}")
            etp = t.expert_tensor_parallel_size
            check_expert_layout(t)
            if t.moe_token_dispatcher_type == "flex" and etp > 1:
                raise ConfigError("moe_token_dispatcher_type", "flex is modelled with expert_tensor_parallel_size 1",
                                  f"etp={etp}")
            if t.moe_token_dispatcher_type == "flex" and t.ep % group_spans(t)["epn"][0]:
                raise ConfigError("moe_flex_nvlink_ranks", "must hold a whole share of each expert-parallel group "
                                  "(the group's members per NVLink stage must divide expert_model_parallel_size)",
                                  f"{t.moe_flex_nvlink_ranks} GPUs, ep={t.ep}")
            if m.moe_ffn_hidden_size % etp:
                raise ConfigError("moe_ffn_hidden_size", "must be divisible by expert_tensor_parallel_size",
                                  f"{m.moe_ffn_hidden_size} and {etp}")
        if t.moe_shared_expert_overlap and not m.moe_shared_expert_intermediate_size:
            raise ConfigError("moe_shared_expert_overlap", "needs shared experts "
                              "(moe_shared_expert_intermediate_size > 0)", m.moe_shared_expert_intermediate_size)
        if t.moe_shared_expert_overlap and t.moe_token_dispatcher_type == "allgather":
            raise ConfigError("moe_shared_expert_overlap", "needs moe_token_dispatcher_type alltoall or flex",
                              t.moe_token_dispatcher_type)
        if t.selective_ac_option == "op" and (m.is_moe or m.multi_latent_attention):
            raise ConfigError("selective_ac_option", "op is modelled for dense models with standard attention only "
                              "(torchtitan's MoE and MLA blocks run other ops)", "op")
        if t.overlap_moe_expert_parallel_comm:
            if not m.is_moe or t.ep == 1:
                raise ConfigError("overlap_moe_expert_parallel_comm", "needs a MoE model with "
                                  "expert_model_parallel_size > 1 (there is no all-to-all to hide)", f"ep={t.ep}")
            if t.schedule not in ("dualpipe", "interleaved") and t.pp > 1:
                raise ConfigError("overlap_moe_expert_parallel_comm", "with pipeline parallelism needs the "
                                  "interleaved (virtual_pipeline_model_parallel_size > 1) or dualpipe schedule "
                                  "(Megatron-core asserts a virtual pipeline size with pp > 1: merging plain "
                                  "1F1B's passes would hold back the sends between stages)",
                                  f"pp={t.pp}, {t.schedule}")
            if t.moe_token_dispatcher_type == "allgather":
                raise ConfigError("overlap_moe_expert_parallel_comm", "needs moe_token_dispatcher_type alltoall "
                                  "or flex", t.moe_token_dispatcher_type)
            if t.schedule != "dualpipe":  # Megatron-LM's combined 1F1B: megatron-core 0.15.0 TransformerConfig asserts
                if t.recompute_granularity == "full":
                    raise ConfigError("overlap_moe_expert_parallel_comm", "does not run with full recompute "
                                      "(Megatron-core refuses it)", "recompute_granularity=full")
                if t.moe_shared_expert_overlap:
                    raise ConfigError("overlap_moe_expert_parallel_comm", "replaces moe_shared_expert_overlap; "
                                      "disable that (Megatron-core refuses both)", "moe_shared_expert_overlap=true")
                if m.mtp_num_layers > 1:
                    raise ConfigError("overlap_moe_expert_parallel_comm", "supports at most one multi-token "
                                      "prediction layer (Megatron-core)", f"mtp_num_layers={m.mtp_num_layers}")
        if t.schedule == "interleaved" and self.num_microbatches % t.pp:
            raise ConfigError("global_batch_size", "interleaved schedule needs the number of micro-batches to be "
                              "a multiple of pipeline_model_parallel_size",
                              f"{self.num_microbatches} micro-batches, pp={t.pp}")
        check_layout(t.schedule, t.pp, chunks_per_stage(t.schedule, t.vpp), self.num_microbatches)
        self._validate_scale()
        if t.recompute_num_layers > -(-m.num_layers // (t.pp * t.vpp)):
            raise ConfigError("recompute_num_layers", "must not exceed the layers per pipeline chunk",
                              f"{t.recompute_num_layers} > {-(-m.num_layers // (t.pp * t.vpp))}")

    def _validate_scale(self) -> None:
        """Bounds that involve several fields (:mod:`flowsim.config.bounds` states each limit's reason)."""
        m, c, t = self.model, self.cluster, self.training
        b = bounds
        if m.is_moe and t.tp > 1 and not t.sequence_parallel:
            # megatron-core 0.16.1 MoELayer.forward raises ValueError in training when the attention TP group
            # is > 1 without sequence parallelism; without it every TP rank would route the same tokens.
            raise ConfigError("sequence_parallel", "a MoE model with tensor_model_parallel_size > 1 needs "
                              "sequence_parallel (megatron-core's MoE layer requires it)", f"tp={t.tp}, sp=false")
        if t.micro_batch_size * self.seq_length > b.MAX_MICROBATCH_TOKENS:
            raise ConfigError("micro_batch_size", f"micro_batch_size * seq_length must be <= "
                              f"{b.MAX_MICROBATCH_TOKENS:,} tokens (activation sizes stay finite)",
                              f"{t.micro_batch_size}*{self.seq_length}")
        passes = t.pp * t.vpp * self.num_microbatches
        if passes > b.MAX_PIPELINE_PASSES:
            raise ConfigError("global_batch_size", f"pipeline_model_parallel_size * "
                              f"virtual_pipeline_model_parallel_size * micro-batches must be <= "
                              f"{b.MAX_PIPELINE_PASSES:,} (16x a large real job; the schedule's size)",
                              f"{t.pp}*{t.vpp}*{self.num_microbatches}={passes:,}")
        if t.comm_engine == "flow" and c.num_gpus > b.MAX_GPUS_FLOW:
            raise ConfigError("comm_engine", f"flow is bounded to {b.MAX_GPUS_FLOW:,} GPUs (one estimate would "
                              "take minutes); use analytic", f"{c.num_gpus} GPUs")
        if t.bucket_size_bytes:
            grads = 4.0 * m.num_parameters()  # 4-byte gradients of the whole model: an upper bound per stage
            if grads / t.bucket_size_bytes > b.MAX_BUCKETS:
                raise ConfigError("bucket_size_bytes", f"must leave at most {b.MAX_BUCKETS:,} gradient buckets "
                                  f"(>= {grads / b.MAX_BUCKETS:,.0f} bytes for this model)", t.bucket_size_bytes)
