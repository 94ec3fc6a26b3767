"""Parallel layout and training-step settings (Megatron-LM argument names)."""
from __future__ import annotations

from dataclasses import dataclass

from flowsim.config.layout import PIPELINE_SCHEDULES
from flowsim.config import bounds
from flowsim.errors import ConfigError, check_ints
from flowsim.kernels.calibration import calibration_on, load_profile
from flowsim.kernels.stack import release as kernel_release

RECOMPUTE = ("none", "selective", "full")
MEGATRON_MODULES = {
    "core_attn": "the attention kernel (FlashAttention forward, or scores/softmax/context without it) and its "
                 "context-parallel exchange",
    "layernorm": "the two norms (their outputs are dropped after the next GEMM reads them)",
    "mlp": "the dense MLP: fc1, activation, fc2 and their tensor-parallel collectives",
    "moe_act": "the routed experts' activation function",
    "moe": "the whole MoE MLP: router, permutation, token all-to-alls, experts, shared experts",
    "shared_experts": "the shared experts of an MoE layer",
}
"""Megatron-core ``recompute_modules`` names flowsim models, and what each re-runs (:mod:`flowsim.model.recompute`)."""
PRECISIONS = ("bf16", "fp16", "fp8", "nvfp4", "mxfp4")
LOW_PRECISION_GEMMS = ("fp8", "nvfp4", "mxfp4")
"""Precisions whose recipe runs the transformer blocks' linear layers in that dtype (the rest stays 16-bit)."""
SCHEDULES = ("auto",) + PIPELINE_SCHEDULES
LAYER_SPLITS = ("even", "balanced")
CP_COMM_TYPES = ("p2p", "all_gather", "torch")
TP_OVERLAP_IMPLS = ("userbuffers", "symm_mem")
COMM_ENGINES = ("analytic", "flow")
KERNEL_FUSIONS = ("fused", "eager")
TOKEN_DISPATCHERS = ("alltoall", "allgather", "flex")
ROUTER_DTYPES = ("", "fp32")
FLEX_BACKENDS = ("deepep", "hybridep")
DEEPEP_MAX_NVL_PEERS = 8
"""GPUs DeepEP's NVLink stage reaches (``NUM_MAX_NVL_PEERS``, deepseek-ai/DeepEP csrc/kernels/configs.cuh): its
internode kernels treat larger NVLink domains as groups of 8 joined by RDMA."""
GRAD_REDUCE_DTYPES = ("fp32", "bf16", "fp16")
CUDA_GRAPH_SCOPES = ("none", "layer", "module", "full_iteration")
HOST_MODES = ("none", "eager", "megatron", "te", "compiled")
FSDP_VERSIONS = (1, 2)
FP8_RECIPES = ("delayed", "tensorwise", "rowwise", "blockwise", "mxfp8")
PIPELINE_ENGINES = ("megatron", "deepspeed", "deepspeed-0.6")
CROSS_ENTROPY_IMPLS = ("fused", "megatron", "fp32_upcast")
"""Cross-entropy implementations (:mod:`flowsim.model.loss`)."""
P2P_SYNC_MODES = ("off", "on", "batched")
OPTIMIZER_IMPLS = ("fused", "foreach", "for_loop")
"""Optimizer step implementations (:mod:`flowsim.step.optimizer`)."""
"""When the CPU waits at pipeline transfers (``TrainingConfig.p2p_sync``)."""
"""What runs the pipeline schedule (:mod:`flowsim.step.schedule`): Megatron's schedules, DeepSpeed's
``PipelineEngine`` as of 0.18 and as of 0.6 (its steps send and receive in the other order)."""


@dataclass(frozen=True)
class TrainingConfig:
    """How the model is split and stepped.

    Attributes
    ----------
    tensor_model_parallel_size, pipeline_model_parallel_size, data_parallel_size,
    context_parallel_size, expert_model_parallel_size : int
        Parallel degrees (aliases tp, pp, dp, cp, ep). ``data_parallel_size`` 0 means "derive it from the
        GPU count".
    virtual_pipeline_model_parallel_size : int
        Model chunks per pipeline rank (alias vpp); 1 = not interleaved.
    sequence_parallel : bool
        Megatron sequence parallelism with TP (all-gather / reduce-scatter instead of all-reduce).
    micro_batch_size, global_batch_size : int
        Sequences per micro-batch per model replica, and per optimizer step in the whole job.
    seq_length : int
        Tokens per sequence; 0 takes the model's default.
    recompute_granularity : str
        ``none``, ``selective`` (parts of every layer recomputed: ``recompute_modules``, or torchtitan's
        ``selective_ac_option``) or ``full`` (whole layers recomputed; ``recompute_num_layers`` per stage
        chunk, 0 = all). See :mod:`flowsim.model.recompute`.
    recompute_modules : tuple[str, ...]
        Megatron-core submodules a ``selective`` layer recomputes (Megatron-LM ``--recompute-modules``;
        default ``core_attn``): any of ``core_attn``, ``layernorm``, ``mlp``, ``moe_act``, ``moe``,
        ``shared_experts``. A comma-separated string is accepted.
    selective_ac_option : str
        torchtitan's selective activation checkpointing (``activation_checkpoint.selective_ac_option``):
        ``op`` (op-level policy) or an integer N (every N-th block fully recomputed); empty (default) means
        Megatron-LM's ``recompute_modules``.
    use_distributed_optimizer : bool
        Megatron distributed optimizer (ZeRO-1): gradients reduce-scattered, parameters all-gathered.
    zero_stage : int
        0-3, degree of state sharding across the data-parallel group (3 = FSDP full shard).
    data_parallel_shard_size : int
        Hybrid sharding (alias dp_shard): ZeRO/FSDP state is sharded over groups of this many consecutive
        data-parallel ranks and replicated across the ``dp * cp / dp_shard`` groups, whose gradient shards
        are then all-reduced (PyTorch FSDP ``HYBRID_SHARD`` / FSDP2 HSDP, torchtitan
        ``data_parallel_shard_degree``, Megatron-LM ``--num-distributed-optimizer-instances``). 0 shards over
        all ``dp * cp`` ranks.
    precision : str
        Compute dtype of the GEMMs: ``bf16``, ``fp16``, ``fp8``, ``nvfp4`` or ``mxfp4``. The low-precision
        recipes (Transformer Engine FP8; MLPerf-style block-scaled FP4, arXiv 2509.25149) run the linear layers
        of every transformer block in that dtype with their quantisation kernels; attention, the embedding and
        the output layer stay 16-bit (:attr:`linear_dtype`).
    fp8_recipe : str
        How ``fp8`` GEMM operands are scaled, which sets their quantisation kernels' bytes
        (:func:`flowsim.model.ops.apply_fp8_recipe`): ``delayed`` (default; Transformer Engine DelayedScaling),
        ``tensorwise`` (a scale per tensor from its current amax: torchao Float8Linear, TE Float8CurrentScaling),
        ``rowwise`` (torchao rowwise), ``blockwise`` (TE Float8BlockScaling, DeepSeek-V3's 1x128 / 128x128
        blocks) or ``mxfp8`` (TE MXFP8BlockScaling, 32-element blocks).
    pipeline_schedule : str
        ``auto`` (1F1B, interleaved when vpp > 1), ``gpipe``, ``1f1b``, ``interleaved``, ``zb-h1``
        (zero-bubble H1: weight gradients deferred into the cool-down bubble) or ``dualpipe`` (DeepSeek-V3's
        bidirectional schedule: even pp, vpp 1, each stage holds two model stages; see
        :mod:`flowsim.step.schedule`).
    overlap_grad_reduce : bool
        Data-parallel gradient reduction overlaps the backward pass (bucketed).
    overlap_param_gather : bool
        Distributed-optimizer / FSDP parameter all-gather overlaps the forward pass.
    fp8_param_gather : bool
        The distributed optimizer / FSDP all-gathers the transformer layers' linear weights in FP8, 1 byte each
        (Megatron-core ``--fp8-param-gather``; torchtitan ``enable_fsdp_float8_all_gather``); the embedding, the
        output layer and the norms stay 16-bit (:func:`flowsim.step.data_parallel.gather_bytes`). Needs
        ``precision: fp8``. Default off.
    tp_comm_overlap : bool
        Tensor-parallel communication overlapped with GEMMs (Megatron/TE userbuffers).
    tp_overlap_impl : str
        What pipelines the sequence-parallel collectives with their GEMMs under ``tp_comm_overlap``:
        ``userbuffers`` (default; Transformer Engine) or ``symm_mem`` (PyTorch's async TP, torchtitan: the fused
        symmetric-memory ops with their staging copies and reduction kernels, :func:`flowsim.model.ops.symm_mem_tp`).
    bucket_size_bytes : float
        Gradient bucket size for the overlapped reduction, in bytes. 0 (default): the framework's default,
        Megatron-core DDP's ``max(40e6, 1e6 * dp * cp)`` parameters per bucket (``DistributedDataParallelConfig
        .bucket_size``) of 4-byte gradients, one layer with ZeRO-2 (FSDP reduces per wrapped block), or
        PyTorch DDP's 25 MiB (``bucket_cap_mb``) with eager kernels and no ZeRO
        (:func:`flowsim.step.data_parallel.grad_bucket_bytes`).
    account_for_embedding_in_pipeline_split, account_for_loss_in_pipeline_split : bool
        Megatron-LM's uneven split: the embedding (loss) counts as one layer of the first (last) virtual
        pipeline stage, which then holds one transformer layer fewer.
    pipeline_layer_split : str
        ``even`` (every virtual stage holds ``num_layers / (pp * vpp)`` layers; anything else is an error) or
        ``balanced`` (the remainder layers go one each to the virtual stages after the first, as the
        uniform partitioners of DeepSpeed and torchtitan do).
    pipeline_model_parallel_layout : str
        Megatron-core's explicit split (``--pipeline-model-parallel-layout``, e.g. ``"Et*4|(t*4|)*14tL"``): the
        embedding (``E``), transformer layers (``t``), multi-token prediction layers (``m``) and loss (``L``) of
        each virtual pipeline stage, stages separated by ``|`` (:func:`flowsim.config.layout.parse_pipeline_layout`).
        Empty (default): the split above.
    comm_engine : str
        ``analytic`` (NCCL's cost model per communicator) or ``flow`` (data-parallel, expert, context and
        pipeline collectives run as flows on the cluster topology with every group of the stage at once;
        :mod:`flowsim.step.flows`). ``flow`` sees NIC, rail and spine contention and costs more time.
    cp_comm_type : str
        Context-parallel attention: ``p2p`` (ring attention, K/V chunks passed around the ring beside the
        attention kernels) or ``all_gather`` (K/V all-gathered before attention, their gradients
        reduce-scattered after it; Megatron-LM ``--cp-comm-type``), or ``torch`` (PyTorch's ``context_parallel``,
        torchtitan: K/V all-gathered beside the attention, fp32 gradients passed around the ring, one SDPA call per
        round merged in fp32 by eager kernels; :func:`flowsim.model.fusion.torch_cp_bytes`).
    expert_tensor_parallel_size : int
        Tensor parallelism inside each expert (Megatron-LM ``--expert-tensor-parallel-size``; 1 = experts are
        not split).
    overlap_moe_expert_parallel_comm : bool
        Hide the expert all-to-alls of one micro-batch behind the compute of another (Megatron-LM
        ``--overlap-moe-expert-parallel-comm``): in 1F1B (one stage) and interleaved 1F1B each steady-state
        forward runs in one call with the backward after it (:mod:`flowsim.step.schedule`); DualPipe always
        pairs its passes. Needs ``pp`` 1, the ``interleaved`` or the ``dualpipe`` schedule, and ``alltoall``
        or ``flex`` dispatch.
    moe_token_dispatcher_type : str
        How routed tokens reach their experts (Megatron-LM ``--moe-token-dispatcher-type``): ``alltoall``
        (default; tokens exchanged inside the expert-parallel group) or ``allgather`` (every rank gathers the
        tokens of its expert-tensor x expert-parallel group, runs its experts on those routed to them, and
        reduce-scatters the outputs back). See :mod:`flowsim.model.moe`.
    moe_router_dtype : str
        Dtype of the router's gating GEMM (Megatron-LM ``--moe-router-dtype``): empty (default) the job's 16-bit
        type, or ``fp32``: the hidden states are cast to fp32 and the gating GEMM and its gradients run in fp32
        (megatron-core ``moe_utils.RouterGatingLinearFunction``), on CUDA cores (PyTorch leaves TF32 off for
        fp32 matmuls by default). ``fp64`` is not modelled.
    moe_shared_expert_overlap : bool
        Run the shared experts beside the token dispatcher's collectives (Megatron-LM
        ``--moe-shared-expert-overlap``): they hide behind each other, the shared experts' kernels slowed by the
        SMs the collectives hold (:mod:`flowsim.step.blocks`). Needs shared experts and ``alltoall`` or ``flex``.
    moe_flex_dispatcher_backend : str
        Backend of the ``flex`` dispatcher (Megatron-LM ``--moe-flex-dispatcher-backend``): ``deepep`` (DeepEP,
        arXiv 2412.19437 sec. 3.2.2) or ``hybridep`` (NVIDIA HybridEP); both send each token once per remote
        domain over the network, then once per target GPU over NVLink (:func:`flowsim.model.moe.flex_stage_bytes`).
    moe_deepep_num_sms : int
        SMs the flex dispatcher's kernels hold while they run beside compute (Megatron-LM
        ``--moe-deepep-num-sms``, default 20; DeepSeek-V3 dedicates 20 of the H800's 132 SMs to communication,
        arXiv 2412.19437 sec. 3.2.2), in place of NCCL's one SM per channel.
    moe_flex_nvlink_ranks : int
        GPUs one NVLink stage of the flex dispatcher spans (its "node"). 0 (default): the job's scale-up domain
        for HybridEP, at most :data:`DEEPEP_MAX_NVL_PEERS` (8) for DeepEP, also on NVL72 racks (filled in by
        :meth:`flowsim.config.SimConfig.resolved`).
    expert_rank_order : str
        Megatron-core's rank order of the expert layers (:data:`flowsim.config.layout.EXPERT_RANK_ORDERS`):
        ``tp-ep-dp-pp`` (Megatron-core >= 0.10) or ``tp-cp-ep-dp-pp`` (<= 0.9: experts split by TP, EP groups
        ``tp * cp`` ranks apart). Empty (default): the one ``framework_version`` runs, else ``tp-ep-dp-pp``.
    use_flash_attn : bool
        Fused FlashAttention kernels (Dao et al. 2022). False runs Megatron-LM's unfused core attention:
        batched QK^T and AV GEMMs around a fused scale-mask-softmax, with the ``s x s`` scores in memory.
    flash_attn_unpad : bool
        FlashAttention called through its variable-length API on unpadded tokens (llm-foundry's ``flash_attn_fn``):
        q, k and v gathered into unpadded copies and the output scattered back, each way
        (:func:`flowsim.model.ops.unpad_rows`); no effect on unfused attention.
    fused_qkv, fused_gate_up : bool
        The query, key and value projections run as one GEMM (Megatron-LM's ``linear_qkv``; default), and a gated
        MLP's gate and up projections as one (``linear_fc1`` of twice the width; default). False: separate
        ``nn.Linear`` modules reading the same input (torchtitan's ``wq``/``wk``/``wv`` and ``w1``/``w3``), each
        with its own forward, input- and weight-gradient GEMMs, and autograd summing their input gradients
        (:func:`flowsim.model.ops.split_linears`).
    fp8_tp_gather : bool
        torchao's float8 tensor parallelism (``Float8ColwiseParallel`` / ``Float8RowwiseParallel`` /
        ``PrepareFloat8ModuleInput``, torchtitan with ``precision: fp8``, ``fp8_recipe: tensorwise`` and sequence
        parallelism): the block inputs are cast to FP8 on their sequence shard and all-gathered in FP8, and the
        output gradients cast to FP8 before their all-gather (1 byte per element); the reduce-scatters stay 16-bit.
        Applies to the ``delayed`` and ``tensorwise`` recipes (Transformer Engine 1.11 gathers FP8 the same way under
        delayed scaling; torchtitan runs plain TP with rowwise scaling). Default off.
    overlap_comm_sms : int
        SMs a collective holds while it runs beside compute, slowing that compute to ``1 - sms / SM count`` of
        its speed (:func:`flowsim.step.overlap.overlapped_s`). 0 (default): one SM per NCCL channel NCCL runs for
        that size (NCCL launches one CTA per channel). Set it where a framework caps communication SMs
        (e.g. DeepSeek-V3 dedicates 20 of 132 SMs to communication, arXiv 2412.19437 sec. 3.2.2).
    kernel_fusion : str
        ``fused`` (Megatron-LM / Transformer Engine kernels: fused norms, bias-activation, bias-dropout-add,
        rotary, cross-entropy) or ``eager`` (plain PyTorch modules without torch.compile: every elementwise
        op of a norm, activation, rotary embedding, residual and loss is a kernel of its own that reads and
        writes its tensors; :mod:`flowsim.eager_ops`).
    framework, framework_version : str
        The training framework and its release (:mod:`flowsim.config.profiles`; ``nemo`` and ``megatron-bridge``
        are ``megatron-core``): the release's documented defaults fill every key the config does not set.
        Empty (default): no profile.
    software_release : str
        Software release the kernels are priced on (:mod:`flowsim.kernels.stack`, table ``software_releases``;
        e.g. ``nemo-24.07``); empty (default) takes ``framework_version`` where that is a listed release, else
        the newest kernel measurements. A release without its own GEMM measurement uses the nearest older one,
        with a warning.
    calibration : str
        Calibration profile applied to the kernel pricing (:mod:`flowsim.kernels.calibration`): ``default``
        (default: the shipped profile, fitted on the public runs by ``flowsim calibrate``, docs/CALIBRATION.md; it
        only acts on jobs whose software release is known, through ``software_release`` or ``framework_version``),
        a YAML file written by ``flowsim calibrate``, or ``none`` (or empty) for none.
    grad_reduce_dtype : str
        Dtype of the data-parallel gradient reduction: ``fp32`` (default; Megatron-LM with bf16), ``bf16``,
        ``fp16``.
    fsdp_version : int
        How ZeRO-3 / FSDP holds a layer's gathered weights: ``1`` (default: one flat buffer whose views are the
        weights: FSDP1's FlatParameter, DeepSpeed ZeRO-3) or ``2`` (FSDP2 ``fully_shard``: per-parameter shards,
        all-gathered into one buffer and copied out into each weight, torchtitan).
    cuda_graphs : str
        CUDA graphs: ``none`` (default), ``layer`` (a forward and a backward graph per layer and micro-batch,
        Transformer Engine ``make_graphed_callables``), ``module`` (one per module of a layer, its attention and its
        MLP: Megatron-core's ``cuda_graph_scope`` attn / mlp) or ``full_iteration`` (Megatron-core
        ``FullCudaGraphWrapper``); they replace the per-kernel host costs by graph launches.
    host_overhead : str
        CPU cost of issuing kernels (:mod:`flowsim.model.host_costs`, priced on the cluster's ``cpu``):
        ``none`` (default: the GPU never waits for the CPU), ``eager``, ``megatron``, ``te`` or ``compiled``.
    p2p_sync : str
        Whether the CPU waits for the GPU at every pipeline send and receive (megatron-core's
        ``torch.cuda.synchronize()`` after ``batch_isend_irecv`` with ``batch_p2p_sync``), each pass then starting
        its issue from an idle CPU: ``off`` (default), ``on``, or ``batched``: when the transfers are batched,
        which NeMo 2 and Megatron-Bridge do exactly without virtual pipelining (``vpp`` 1; with ``vpp > 1`` they
        overlap them unbatched).
    pipeline_engine : str
        What runs the pipeline schedule: ``megatron`` (default: sends run beside the compute), ``deepspeed`` or
        ``deepspeed-0.6`` (DeepSpeed's ``PipelineEngine``: a stage's stream waits for each send of its output;
        1f1b only).
    cross_entropy_impl : str
        The loss's kernels (:mod:`flowsim.model.loss`): ``fused`` (one kernel each way), ``megatron``
        (Megatron-LM's vocab-parallel cross-entropy on fp32 logits, separate PyTorch ops) or ``fp32_upcast``
        (``F.cross_entropy`` on ``logits.float()``); empty (default): ``fused`` with fused kernels, else
        ``fp32_upcast``.
    optimizer_impl : str
        The optimizer step's kernels (:mod:`flowsim.step.optimizer`): ``fused`` (multi-tensor FusedAdam),
        ``foreach`` (PyTorch's ``_foreach`` ops, a pass over memory each) or ``for_loop`` (one parameter tensor
        at a time); empty (default): ``fused``.
    """

    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    data_parallel_size: int = 0
    context_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    virtual_pipeline_model_parallel_size: int = 1
    sequence_parallel: bool = False
    micro_batch_size: int = 1
    global_batch_size: int = 0
    seq_length: int = 0
    recompute_granularity: str = "none"
    recompute_num_layers: int = 0
    recompute_modules: tuple = ("core_attn",)
    selective_ac_option: str = ""
    use_distributed_optimizer: bool = False
    zero_stage: int = 0
    data_parallel_shard_size: int = 0
    precision: str = "bf16"
    pipeline_schedule: str = "auto"
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    fp8_param_gather: bool = False
    tp_comm_overlap: bool = False
    tp_overlap_impl: str = "userbuffers"
    bucket_size_bytes: float = 0.0
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    pipeline_layer_split: str = "even"
    pipeline_model_parallel_layout: str = ""
    comm_engine: str = "analytic"
    cp_comm_type: str = "p2p"
    expert_tensor_parallel_size: int = 1
    moe_token_dispatcher_type: str = "alltoall"
    moe_router_dtype: str = ""
    moe_shared_expert_overlap: bool = False
    moe_flex_dispatcher_backend: str = "deepep"
    moe_deepep_num_sms: int = 20
    moe_flex_nvlink_ranks: int = 0
    expert_rank_order: str = ""
    overlap_moe_expert_parallel_comm: bool = False
    use_flash_attn: bool = True
    flash_attn_unpad: bool = False
    fused_qkv: bool = True
    fused_gate_up: bool = True
    fp8_tp_gather: bool = False
    kernel_fusion: str = "fused"
    overlap_comm_sms: int = 0
    framework: str = ""
    framework_version: str = ""
    grad_reduce_dtype: str = "fp32"
    fsdp_version: int = 1
    fp8_recipe: str = "delayed"
    cuda_graphs: str = "none"
    host_overhead: str = "none"
    p2p_sync: str = "off"
    pipeline_engine: str = "megatron"
    cross_entropy_impl: str = ""
    optimizer_impl: str = ""
    software_release: str = ""
    calibration: str = "default"

    @property
    def tp(self) -> int:
        return self.tensor_model_parallel_size

    @property
    def pp(self) -> int:
        return self.pipeline_model_parallel_size

    @property
    def dp(self) -> int:
        return self.data_parallel_size

    @property
    def cp(self) -> int:
        return self.context_parallel_size

    @property
    def ep(self) -> int:
        return self.expert_model_parallel_size

    @property
    def dp_shard(self) -> int:
        """Data-parallel ranks the ZeRO/FSDP state is sharded over (``dp * cp`` unless hybrid sharding)."""
        return self.data_parallel_shard_size or self.dp * self.cp

    @property
    def vpp(self) -> int:
        return self.virtual_pipeline_model_parallel_size

    @property
    def schedule(self) -> str:
        """The resolved pipeline schedule name."""
        if self.pipeline_schedule != "auto":
            return self.pipeline_schedule
        return "interleaved" if self.vpp > 1 else "1f1b"

    @property
    def syncs_p2p(self) -> bool:
        """The CPU waits for the GPU at every pipeline transfer (``p2p_sync``)."""
        return self.p2p_sync == "on" or (self.p2p_sync == "batched" and self.vpp == 1)

    @property
    def linear_dtype(self) -> str:
        """Dtype of the transformer blocks' linear-layer GEMMs: the precision for ``fp8``, ``nvfp4``, ``mxfp4``,
        else the 16-bit type (:attr:`half_dtype`)."""
        return self.precision if self.precision in LOW_PRECISION_GEMMS else self.half_dtype

    @property
    def half_dtype(self) -> str:
        """The job's 16-bit type, of the GEMMs that stay 16-bit under low precision (output layer, router,
        attention's batched GEMMs): ``fp16`` for ``precision: fp16`` (V100 has no bf16), else ``bf16``."""
        return "fp16" if self.precision == "fp16" else "bf16"

    @property
    def paired_1f1b(self) -> bool:
        """1F1B or interleaved 1F1B with each steady-state forward and backward in one call (EP all-to-all
        overlap)."""
        return self.overlap_moe_expert_parallel_comm and self.schedule in ("1f1b", "interleaved")

    def _validate_recompute(self) -> None:
        for name in self.recompute_modules:
            if name not in MEGATRON_MODULES:
                raise ConfigError("recompute_modules", f"unknown module; known: {', '.join(MEGATRON_MODULES)}", name)
        if tuple(self.recompute_modules) != ("core_attn",) and self.recompute_granularity != "selective":
            raise ConfigError("recompute_modules", "needs recompute_granularity selective", self.recompute_granularity)
        opt = self.selective_ac_option
        if opt:
            if opt != "op" and not (opt.isdigit() and int(opt) >= 1):
                raise ConfigError("selective_ac_option", "must be 'op' or a positive integer (every N-th layer)", opt)
            if self.recompute_granularity != "selective":
                raise ConfigError("selective_ac_option", "needs recompute_granularity selective",
                                  self.recompute_granularity)
            if tuple(self.recompute_modules) != ("core_attn",):
                raise ConfigError("selective_ac_option", "is torchtitan's policy; it cannot be combined with "
                                  "Megatron's recompute_modules", ",".join(self.recompute_modules))
        if self.recompute_num_layers and self.recompute_granularity != "full":
            raise ConfigError("recompute_num_layers", "needs recompute_granularity full", self.recompute_granularity)

    def validate(self) -> None:
        """Raise ConfigError for a field that breaks a rule on its own (cross-checks live in SimConfig)."""
        check_ints(self, ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                     "expert_model_parallel_size", "virtual_pipeline_model_parallel_size", "expert_tensor_parallel_size",
                     "micro_batch_size", "moe_deepep_num_sms"), 1)
        check_ints(self, ("data_parallel_size", "global_batch_size", "seq_length", "recompute_num_layers",
                          "data_parallel_shard_size", "overlap_comm_sms", "moe_flex_nvlink_ranks"), 0)
        b = bounds
        b.check_int_max(self, ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                               "expert_model_parallel_size", "expert_tensor_parallel_size", "data_parallel_size",
                               "data_parallel_shard_size"), b.MAX_GPUS, "the most GPUs in a job")
        b.check_int_max(self, ("virtual_pipeline_model_parallel_size", "recompute_num_layers"), b.MAX_LAYERS,
                        "the most layers")
        b.check_int_max(self, ("micro_batch_size", "global_batch_size"), b.MAX_BATCH,
                        "1,000x the largest published global batch")
        b.check_int_max(self, ("seq_length",), b.MAX_SEQ, "16x the longest published training context")
        b.check_int_max(self, ("overlap_comm_sms",), b.MAX_COMM_SMS, "no GPU has more SMs")
        if self.recompute_granularity not in RECOMPUTE:
            raise ConfigError("recompute_granularity", f"must be one of {', '.join(RECOMPUTE)}",
                              self.recompute_granularity)
        self._validate_recompute()
        if self.precision not in PRECISIONS:
            raise ConfigError("precision", f"must be one of {', '.join(PRECISIONS)}", self.precision)
        if self.fp8_param_gather and self.precision != "fp8":
            raise ConfigError("fp8_param_gather", "needs precision: fp8", self.precision)
        if self.pipeline_schedule not in SCHEDULES:
            raise ConfigError("pipeline_schedule", f"must be one of {', '.join(SCHEDULES)}",
                              self.pipeline_schedule)
        if self.zero_stage not in (0, 1, 2, 3):
            raise ConfigError("zero_stage", "must be 0, 1, 2 or 3", self.zero_stage)
        if self.sequence_parallel and self.tp == 1:
            raise ConfigError("sequence_parallel", "needs tensor_model_parallel_size > 1", "tp=1")
        if self.vpp > 1 and self.pp == 1:
            raise ConfigError("virtual_pipeline_model_parallel_size", "needs pipeline_model_parallel_size > 1",
                              self.vpp)
        if self.pipeline_schedule in ("gpipe", "1f1b", "zb-h1") and self.vpp > 1:
            raise ConfigError("pipeline_schedule", f"{self.pipeline_schedule} runs one model chunk per stage "
                              "(use interleaved with virtual_pipeline_model_parallel_size > 1)", f"vpp={self.vpp}")
        if self.pipeline_schedule == "dualpipe" and self.vpp > 1:
            raise ConfigError("pipeline_schedule", "dualpipe places its two model chunks per stage itself; "
                              "set virtual_pipeline_model_parallel_size to 1", f"vpp={self.vpp}")
        if self.pipeline_schedule == "dualpipe" and self.pp % 2:
            raise ConfigError("pipeline_schedule", "dualpipe needs an even pipeline_model_parallel_size >= 2",
                              f"pp={self.pp}")
        if self.pipeline_schedule == "interleaved" and self.vpp == 1:
            raise ConfigError("pipeline_schedule", "interleaved needs virtual_pipeline_model_parallel_size > 1",
                              "vpp=1")
        if self.pipeline_layer_split not in LAYER_SPLITS:
            raise ConfigError("pipeline_layer_split", f"must be one of {', '.join(LAYER_SPLITS)}",
                              self.pipeline_layer_split)
        if self.comm_engine not in COMM_ENGINES:
            raise ConfigError("comm_engine", f"must be one of {', '.join(COMM_ENGINES)}", self.comm_engine)
        if self.kernel_fusion not in KERNEL_FUSIONS:
            raise ConfigError("kernel_fusion", f"must be one of {', '.join(KERNEL_FUSIONS)}", self.kernel_fusion)
        if self.software_release:
            kernel_release(self.software_release)  # ConfigError naming software_release if unknown
        if calibration_on(self.calibration):
            load_profile(self.calibration)  # ConfigError naming the profile field that is wrong
        if self.moe_token_dispatcher_type not in TOKEN_DISPATCHERS:
            raise ConfigError("moe_token_dispatcher_type", f"must be one of {', '.join(TOKEN_DISPATCHERS)}",
                              self.moe_token_dispatcher_type)
        if self.moe_router_dtype not in ROUTER_DTYPES:
            raise ConfigError("moe_router_dtype", "must be empty (the 16-bit type) or fp32 (fp64 is not modelled)",
                              self.moe_router_dtype)
        if self.moe_flex_dispatcher_backend not in FLEX_BACKENDS:
            raise ConfigError("moe_flex_dispatcher_backend", f"must be one of {', '.join(FLEX_BACKENDS)}",
                              self.moe_flex_dispatcher_backend)
        if self.cp_comm_type not in CP_COMM_TYPES:
            raise ConfigError("cp_comm_type", f"must be one of {', '.join(CP_COMM_TYPES)}", self.cp_comm_type)
        if self.tp_overlap_impl not in TP_OVERLAP_IMPLS:
            raise ConfigError("tp_overlap_impl", f"must be one of {', '.join(TP_OVERLAP_IMPLS)}", self.tp_overlap_impl)
        if self.cp > 1 and not self.use_flash_attn:
            raise ConfigError("use_flash_attn", "context parallelism needs fused (flash) attention", "false")
        if self.grad_reduce_dtype not in GRAD_REDUCE_DTYPES:
            raise ConfigError("grad_reduce_dtype", f"must be one of {', '.join(GRAD_REDUCE_DTYPES)}",
                              self.grad_reduce_dtype)
        if self.fsdp_version not in FSDP_VERSIONS:
            raise ConfigError("fsdp_version", "must be 1 or 2", self.fsdp_version)
        if self.fp8_recipe not in FP8_RECIPES:
            raise ConfigError("fp8_recipe", f"must be one of {', '.join(FP8_RECIPES)}", self.fp8_recipe)
        if self.cuda_graphs not in CUDA_GRAPH_SCOPES:
            raise ConfigError("cuda_graphs", f"must be one of {', '.join(CUDA_GRAPH_SCOPES)}", self.cuda_graphs)
        if self.host_overhead not in HOST_MODES:
            raise ConfigError("host_overhead", f"must be one of {', '.join(HOST_MODES)}", self.host_overhead)
        if self.pipeline_engine not in PIPELINE_ENGINES:
            raise ConfigError("pipeline_engine", f"must be one of {', '.join(PIPELINE_ENGINES)}", self.pipeline_engine)
        if self.p2p_sync not in P2P_SYNC_MODES:
            raise ConfigError("p2p_sync", f"must be one of {', '.join(P2P_SYNC_MODES)}", self.p2p_sync)
        if self.optimizer_impl and self.optimizer_impl not in OPTIMIZER_IMPLS:
            raise ConfigError("optimizer_impl", f"must be one of {', '.join(OPTIMIZER_IMPLS)} (or empty)",
                              self.optimizer_impl)
        if self.cross_entropy_impl and self.cross_entropy_impl not in CROSS_ENTROPY_IMPLS:
            raise ConfigError("cross_entropy_impl", f"must be one of {', '.join(CROSS_ENTROPY_IMPLS)} (or empty)",
                              self.cross_entropy_impl)
        if self.framework:
            from flowsim.config.profiles import profile

            profile(self.framework, self.framework_version)  # an unknown framework or release raises
        elif self.framework_version:
            raise ConfigError("framework_version", "needs framework", self.framework_version)
        bounds.check_float("bucket_size_bytes", self.bucket_size_bytes, 0.0, float("inf"),
                           "must be a finite number >= 0 (0 = the framework's default)")
