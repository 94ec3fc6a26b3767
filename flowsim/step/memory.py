"""Device memory per GPU per pipeline stage: weights, gradients, optimizer states and activations.

Model states follow Megatron-LM's mixed-precision accounting (docs/source/api-guide/dist_optimizer.md,
"bf16 param, fp32 grads"): 2 bytes of 16-bit weights, 4 bytes of fp32 gradient buffer and 12 bytes of
fp32 master weight plus Adam moments per parameter (18 bytes). The gradient buffer holds the reduce dtype
(``grad_reduce_dtype``): Megatron-core's ``ParamAndGradBuffer`` allocates ``main_grad`` in fp32 only with
``grad_reduce_in_fp32``, else in the parameters' 16-bit dtype (megatron/core/distributed/
distributed_data_parallel.py), so a bf16 reduction holds 2 bytes per parameter. The distributed optimizer /
ZeRO-1 shards the 12 optimizer bytes over the data-parallel group, ZeRO-2 also the gradients and ZeRO-3 / FSDP
the weights too (Rajbhandari et al. 2020, arXiv 1910.02054, Fig. 1). The parameters are those of the stage's
layers (:func:`flowsim.model.stage_split.chunk_layer_counts`): DualPipe's stages hold two model stages each, twice
1F1B's parameters (DeepSeek-V3 report, arXiv 2412.19437, Table 2).

Activations follow Korthikanti et al. 2022 (arXiv 2205.05198, sec. 4): per layer and micro-batch
``s*b*h*(34/t)`` bytes with sequence parallelism when the attention scores are not stored. FlashAttention
never stores the ``5*a*s^2*b`` score terms, so flowsim counts the stored tensors of each layer explicitly
(the table below reproduces 34 s*b*h for GPT-3 shapes: 4h MLP, multi-head attention, dropout). A stage
holds them for the micro-batches its pipeline schedule keeps in flight at its peak
(:func:`flowsim.step.schedule.held_microbatches`).

What the caching allocator holds beside them, and what lies outside it:

* FSDP2 (``fsdp_version`` 2) keeps no 16-bit shard: the sharded parameter stays in its fp32 dtype (it is the
  optimizer's master weight) and ``MixedPrecisionPolicy.param_dtype`` applies only to the gathered, unsharded
  weights (torch 2.13.0 ``distributed/fsdp/_fully_shard/_fsdp_param.py`` ``init_all_gather_outputs``), so a
  fully sharded parameter holds 16 bytes (4 fp32 weight, 4 fp32 gradient, 8 Adam moments) over the shard group.
  ZeRO-3 gathers two layers at a time (the one running and the one prefetched) and the root unit (the
  embedding and the output layer, gathered through the head's forward and backward: torchtitan
  ``apply_fsdp`` ``fully_shard(model)``). FSDP2 that reduces the gradients once per step (torchtitan with
  pipeline parallelism: ``set_requires_gradient_sync(False)`` until the last micro-batch,
  torch ``distributed/pipelining/stage.py``) accumulates the unsharded gradients in the reduce dtype
  (``FSDPParam.to_accumulated_grad_if_needed``: fp32 when it differs from the 16-bit parameters).
* The loss's buffers (:func:`loss_bytes_per_logit`): ``F.cross_entropy(logits.float())`` holds three fp32
  copies of the logits at the start of backward (four on vocab-sharded DTensor logits); Megatron's and the fused
  cross-entropies one fp32 softmax beside the 16-bit logits; torchtitan's compiled loss the 16-bit logits and
  their 16-bit gradient.
* Outside the allocator: the CUDA context and the kernels loaded into it (:data:`CUDA_CONTEXT_BYTES`).
  :attr:`StageMemory.allocated_bytes` is what PyTorch's allocator hands out; ``torch.cuda.max_memory_reserved``
  (torchtitan's ``memory: X GiB``) is at least that, by the caching allocator's unused cached blocks, which
  are not modelled.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flowsim._jit import njit
from flowsim.config import SimConfig
from flowsim.config.layout import chunks_per_stage, end_chunks, group_spans
from flowsim.model import recompute
from flowsim.model.fusion import ACT_BYTES
from flowsim.model.loss import cross_entropy_impl
from flowsim.model.moe import expert_tokens
from flowsim.model.workload import Workload, layer_params, padded_vocab
from flowsim.step.data_parallel import grad_reduce_bytes, layer_gather_bytes
from flowsim.step.schedule import held_microbatches
from flowsim.units import DTYPE_BYTES, MiB

WEIGHT_BYTES = 2       # 16-bit model weights
OPTIMIZER_BYTES = 12   # fp32 master weights + Adam first and second moments
FP8_WEIGHT_BYTES = 1   # Transformer Engine keeps an FP8 copy of each FP8 GEMM weight
# Bytes per parameter of the low-precision weight copy the GEMMs read, as Transformer Engine keeps it for FP8
# (above) and for FP4: 4-bit elements plus their block scales (flowsim.units.DTYPE_BYTES: NVFP4 one FP8 scale per
# 16 elements, MXFP4 one E8M0 scale per 32, OCP MX spec v1.0 / NVIDIA NVFP4)
LOW_PRECISION_WEIGHT_BYTES = {"fp8": FP8_WEIGHT_BYTES, "nvfp4": DTYPE_BYTES["nvfp4"], "mxfp4": DTYPE_BYTES["mxfp4"]}
# Frameworks whose low-precision linears cast the weights at every call and keep no copy: torchtitan's torchao
# Float8Linear (torchao float8/float8_linear.py: the weight is cast to float8 in each forward, per GEMM)
CAST_PER_CALL_FRAMEWORKS = frozenset({"torchtitan"})

# Bytes per logit the loss holds at its peak (the start of backward), by cross_entropy_impl (flowsim.model.loss):
# fp32_upcast: F.cross_entropy(logits.float()) saves log_softmax's fp32 output (4); its backward allocates
# nll_loss_backward's fp32 gradient (4, at::zeros_like of the input, aten/src/ATen/native/LossNLL.cpp) and then
# _log_softmax_backward_data's fp32 result (4) before autograd releases the saved output (12; the forward peak,
# 2-byte logits + fp32 copy + fp32 output, is 10). megatron / fused: the 16-bit logits (2) and the fp32 softmax
# kept for backward (4), whose backward scales it in place (megatron-core 0.8.0 tensor_parallel/cross_entropy.py,
# fusions/fused_cross_entropy.py).
LOSS_BYTES_PER_LOGIT = {"fp32_upcast": 12.0, "megatron": 6.0, "fused": 6.0}
# F.cross_entropy(logits.float()) on vocab-sharded DTensor logits (PyTorch's loss_parallel, torchtitan with TP; torch
# 2.13.0 distributed/tensor/parallel/loss.py): _log_softmax holds the fp32 input, x - max, exp(x - max) and the
# result beside the 16-bit logits (14); _nll_loss_and_log_softmax_backward the saved fp32 output, zeros_like(x),
# grad_input + exp(x) and its product with the loss gradient at once (16)
LOSS_PARALLEL_BYTES_PER_LOGIT = 16.0
# torchtitan compiles its loss with the model (torchtitan 0.1.0 components/loss.py build_cross_entropy_loss:
# torch.compile(loss_fn) with training.compile): Inductor's fused kernels keep the 16-bit logits and per-token
# max and log-sum-exp, and write the 16-bit gradient (2 + 2)
COMPILED_LOSS_BYTES_PER_LOGIT = 4.0
COMPILED_LOSS_FRAMEWORKS = frozenset({"torchtitan"})
# The CUDA context and the kernels loaded into it, outside PyTorch's caching allocator: a 1x1 tensor on the GPU
# occupies 1343 MiB by nvidia-smi (Hugging Face transformers docs, "Model training anatomy", model_memory_anatomy.md)
CUDA_CONTEXT_BYTES = 1343 * MiB


@dataclass(frozen=True)
class StageMemory:
    """Peak bytes on one GPU of one pipeline stage, by component."""

    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    runtime_bytes: float = 0.0  # outside the caching allocator: the CUDA context

    @property
    def allocated_bytes(self) -> float:
        """Bytes PyTorch's caching allocator hands out at the peak (``torch.cuda.max_memory_allocated``)."""
        return self.weights_bytes + self.gradients_bytes + self.optimizer_bytes + self.activations_bytes

    @property
    def total_bytes(self) -> float:
        """Bytes of the GPU's memory in use at the peak: :attr:`allocated_bytes` plus :attr:`runtime_bytes`."""
        return self.allocated_bytes + self.runtime_bytes


def _activation_parts(cfg: SimConfig, moe: bool) -> list[tuple[float, tuple[str, ...]]]:
    """Tensors one layer keeps for backward without recompute, per micro-batch and GPU: (bytes, the
    Megatron-core submodules whose recompute frees them; empty = kept under every selective policy)."""
    m, t = cfg.model, cfg.training
    tp = t.tp
    s = cfg.seq_length // t.cp
    sb = cfg.microbatch_tokens
    sbh = sb * m.hidden_size
    spf = tp if t.sequence_parallel else 1       # norms, dropout masks and residual-path tensors
    d, a, g, f = m.kv_channels, m.num_attention_heads, m.num_query_groups, m.ffn_hidden_size
    drop = 1 if m.hidden_dropout > 0 else 0
    # a linear layer's saved input: quantised under a low-precision recipe (Transformer Engine 1.11 Linear /
    # LayerNormLinear / LayerNormMLP save the FP8 cast of their input, or of the norm output the fused norm writes
    # in FP8, for the weight gradient; torchao's Float8Linear its float8 input), else 16-bit
    q = DTYPE_BYTES[t.linear_dtype] if t.linear_dtype in LOW_PRECISION_WEIGHT_BYTES else ACT_BYTES
    parts = [
        (2 * ACT_BYTES * sbh / spf, ()),                     # inputs of the two norms
        (q * sbh / spf, ("layernorm",)),                      # input norm output = QKV input (SP keeps shards)
        (ACT_BYTES * sb * (a + 2 * g) * d / tp, ()),          # q, k, v kept by the attention kernel
        (ACT_BYTES * sb * a * d / tp, ()),                    # attention output, kept by the attention kernel
        ((q if q != ACT_BYTES else 0) * sb * a * d / tp, ()),  # ... and its quantised copy, attn_out's input
        (2 * drop * sbh / spf, ()),                           # two 1-byte dropout masks
    ]
    if moe:
        _, per_expert = expert_tokens(cfg, sb)
        routed = per_expert * m.num_moe_experts / t.ep  # tokens through this GPU's experts
        etp, fe = t.expert_tensor_parallel_size, m.moe_ffn_hidden_size
        parts += [(q * routed * m.hidden_size, ("moe",)),                                 # permuted tokens
                  (ACT_BYTES * routed * fe * (2 if m.gated else 1) / etp, ("moe",)),      # expert fc1 output
                  (q * routed * fe / etp, ("moe", "moe_act"))]                            # expert activation
        fs = m.moe_shared_expert_intermediate_size
        if fs:
            shared = ("moe", "shared_experts")
            parts += [(q * sbh / spf, ("layernorm",)),                                    # shared fc1 input
                      (ACT_BYTES * sb * fs * (2 if m.gated else 1) / tp, shared),
                      (q * sb * fs / tp, shared)]
    else:
        parts += [(q * sbh / spf, ("layernorm",)),                      # MLP norm output = fc1 input
                  (ACT_BYTES * sb * f * (2 if m.gated else 1) / tp, ("mlp",)),  # fc1 output
                  (q * sb * f / tp, ("mlp",))]                          # activation output = fc2 input
    if not t.use_flash_attn:
        # stored scores: softmax output (2 bytes), and with attention dropout its mask (1) and output (2): up to
        # 5 a s^2 b / t (Korthikanti et al. 2022, arXiv 2205.05198, sec. 4.1)
        attn_drop = 1 if m.attention_dropout > 0 else 0
        parts.append(((2 + 3 * attn_drop) * a * s * s * t.micro_batch_size / tp, ("core_attn",)))
    return parts


def layer_activation_bytes(cfg: SimConfig, moe: bool = False, recomputed: bool = True) -> float:
    """Bytes one transformer layer keeps for backward, per micro-batch, per GPU.

    ``moe`` counts a routed-expert MLP instead of the dense one: the permuted tokens, the experts' inputs
    and intermediates for ``topk`` copies of each of the GPU's routed tokens, and the shared experts.
    ``recomputed`` applies a selective recompute policy (:mod:`flowsim.model.recompute`): Megatron's
    ``recompute_modules`` drop the tensors their submodules rebuild; torchtitan's op policy keeps the layer
    input, the outputs of the projections it saves and the attention output. Full recompute is counted by
    :func:`stage_memory` (it keeps only the layer inputs).

    With FlashAttention there are no s^2 terms; unfused attention adds Korthikanti et al.'s 5 a s^2 b / t
    unless the core attention is recomputed. For GPT-3 shapes (f = 4h, g = a, dropout), 16-bit linears and
    sequence parallelism this equals Korthikanti et al.'s ``34 * s * b * h / t``; low-precision linears save their
    inputs quantised (``29 * s * b * h / t`` under FP8).
    """
    t = cfg.training
    parts = _activation_parts(cfg, moe)
    pol = recompute.policy(t) if recomputed else "none"
    if pol == "op":
        return _op_sac_bytes(cfg)
    if pol == "modules":
        return sum(b for b, owners in parts if not any(o in t.recompute_modules for o in owners))
    return sum(b for b, _ in parts)


def _op_sac_bytes(cfg: SimConfig) -> float:
    """Bytes a dense layer keeps under torchtitan's op policy: its input, the outputs of the projections
    the policy saves (:func:`flowsim.model.recompute.op_sac_projections`) and the attention output."""
    m, t = cfg.model, cfg.training
    tp = t.tp
    sb = cfg.microbatch_tokens
    spf = tp if t.sequence_parallel else 1
    d, a, g, f = m.kv_channels, m.num_attention_heads, m.num_query_groups, m.ffn_hidden_size
    width = {"q": a * d / tp, "k": g * d / tp, "v": g * d / tp, "o": m.hidden_size,
             "gate": f / tp, "up": f / tp, "down": m.hidden_size}
    recomputed = recompute.op_sac_projections(m.gated, m.add_bias_linear)
    saved = sum(w for name, w in width.items() if name not in recomputed and (m.gated or name != "gate"))
    return ACT_BYTES * sb * (m.hidden_size / spf + saved + a * d / tp)


def loss_bytes_per_logit(t) -> float:
    """Bytes per logit (of the GPU's vocabulary shard) the loss holds at its peak: by ``cross_entropy_impl``
    (:data:`LOSS_BYTES_PER_LOGIT`), PyTorch's loss_parallel for ``fp32_upcast`` with tensor parallelism, and the
    compiled loss of the frameworks that compile it with fused kernels."""
    impl = cross_entropy_impl(t)
    if impl == "fp32_upcast" and t.tp > 1:
        return LOSS_PARALLEL_BYTES_PER_LOGIT
    if impl == "fused" and t.framework in COMPILED_LOSS_FRAMEWORKS:
        return COMPILED_LOSS_BYTES_PER_LOGIT
    return LOSS_BYTES_PER_LOGIT[impl]


def in_flight_microbatches(cfg: SimConfig, stage: int) -> float:
    """Micro-batches (through all of the stage's chunks) whose activations one GPU of ``stage`` holds at
    the peak, counted along its schedule's execution order (:func:`flowsim.step.schedule.held_microbatches`).

    GPipe holds all m; 1F1B ``min(p - stage, m)``; interleaved 1F1B ``p + (p - 1) / v`` on the first stage
    (Korthikanti et al. 2022 sec. 4.2.3); ZB-H1 up to ``p`` on every stage; DualPipe ``p + 1`` chunks, i.e.
    ``(p + 1) / 2`` of its two-chunk stages (DeepSeek-V3 Table 2).
    """
    t = cfg.training
    return held_microbatches(t.schedule, t.pp, chunks_per_stage(t.schedule, t.vpp), cfg.num_microbatches,
                             t.paired_1f1b)[stage]


def stage_memory(cfg: SimConfig, wl: Workload, stage: int) -> StageMemory:
    """Peak memory of one GPU of ``stage`` by component (see module docstring; :func:`stage_memories`)."""
    return stage_memories(cfg, wl)[stage]


def stage_memories(cfg: SimConfig, wl: Workload) -> tuple[StageMemory, ...]:
    """Peak memory of one GPU of every pipeline stage by component (see module docstring), bytes: the
    per-config terms once, the stages' sums in one compiled pass over the stage axis (:func:`_stage_bytes`)."""
    m, t = cfg.model, cfg.training
    zero = max(t.zero_stage, 1 if t.use_distributed_optimizer else 0)
    low = LOW_PRECISION_WEIGHT_BYTES.get(wl.gemm_dtype, 0.0) if t.framework not in CAST_PER_CALL_FRAMEWORKS else 0.0
    fsdp2 = t.fsdp_version == 2 and zero >= 2
    pol = recompute.policy(t)
    last = sorted({s for s, _ in end_chunks(t.schedule, t.pp, wl.chunk_layers.shape[1])[1]})
    out = _stage_bytes(
        np.asarray(wl.stage_params, dtype=np.float64), np.asarray(wl.stage_expert_params, dtype=np.float64),
        wl.chunk_layers, wl.chunk_moe_layers, wl.chunk_recompute_layers,
        np.array(held_microbatches(t.schedule, t.pp, chunks_per_stage(t.schedule, t.vpp), cfg.num_microbatches,
                                   t.paired_1f1b)),
        layer_params(cfg), layer_params(cfg, moe=True),
        t.dp_shard,  # dense state is sharded over the data- and context-parallel ranks (or a shard group)
        group_spans(t)["edp"][0],  # expert state is sharded over the expert-data-parallel ranks
        zero, float(low), fsdp2, t.fp8_param_gather, layer_gather_bytes(t), grad_reduce_bytes(t),
        fsdp2 and not t.overlap_grad_reduce,
        float(layer_activation_bytes(cfg)),
        float(layer_activation_bytes(cfg, moe=True)) if m.is_moe else 0.0,  # only MoE models have MoE layers
        _POLICY_CODES[pol],
        ACT_BYTES * cfg.microbatch_tokens * m.hidden_size / (t.tp if t.sequence_parallel else 1),
        float(layer_activation_bytes(cfg, recomputed=False)) if pol == "op" else 0.0,
        cfg.microbatch_tokens * padded_vocab(cfg) / t.tp * loss_bytes_per_logit(t), last[0], last[-1])
    return tuple(map(StageMemory, *out.tolist(), [CUDA_CONTEXT_BYTES] * len(wl.stage_params)))


# recompute.policy -> what _stage_bytes keeps of a layer: all of it (per micro-batch in flight), all of it plus one
# layer rebuilt at a time (torchtitan's op policy), or the inputs of the recomputed layers (full, every_n)
_KEEP_ALL, _KEEP_ALL_REBUILD_ONE, _KEEP_INPUTS = 0, 1, 2
_POLICY_CODES = {"none": _KEEP_ALL, "modules": _KEEP_ALL, "op": _KEEP_ALL_REBUILD_ONE, "full": _KEEP_INPUTS,
                 "every_n": _KEEP_INPUTS}


@njit(cache=True)
def _stage_bytes(params, experts, layers2, moe2, rec2, mb, layer_p, moe_layer_p, dp, edp, zero, low, fsdp2,
                 fp8_param_gather, gather, grad, unsharded_grads, per_layer, per_moe_layer, keep, layer_input,
                 one_layer, loss, last_a, last_b):
    """float64[4, p]: weights, gradients, optimizer states and activations of one GPU of each stage, bytes.

    ``params``, ``experts``: the stage's parameters (routed experts excluded) and routed-expert parameters;
    ``layers2``, ``moe2``, ``rec2``: int64[p, v] layers, MoE layers and recomputed layers per chunk; ``mb``: the
    micro-batches in flight at the stage's peak; ``layer_p``, ``moe_layer_p``: parameters of a dense and a MoE layer;
    ``dp``, ``edp``: the dense and expert state's shard group; ``zero``: the ZeRO level; ``low``: bytes per
    parameter of the low-precision weight copy; ``fsdp2``: FSDP2 sharding gradients; ``gather``: bytes per gathered
    layer parameter (ZeRO-3); ``grad``: bytes of a gradient; ``unsharded_grads``: FSDP2 accumulating unsharded
    gradients; ``per_layer``, ``per_moe_layer``: activation bytes of a dense and a MoE layer; ``keep`` a
    ``_POLICY_CODES`` value; ``layer_input``: bytes of a layer's input; ``one_layer``: bytes of one layer rebuilt;
    ``loss``: the loss's bytes, on stages ``last_a`` and ``last_b``. Each element is computed with the float
    operations, in the order, of the stage-by-stage accounting (tests/test_memory_stages.py).
    """
    p = params.shape[0]
    out = np.empty((4, p))
    d3, e3 = (dp, edp) if zero >= 3 else (1, 1)
    d2, e2 = (dp, edp) if zero >= 2 else (1, 1)
    d1, e1 = (dp, edp) if zero >= 1 else (1, 1)
    for s in range(p):
        layers, n_moe, rec = 0, 0, 0
        for c in range(layers2.shape[1]):
            layers += layers2[s, c]
            n_moe += moe2[s, c]
            rec += rec2[s, c]
        in_layers = (layers - n_moe) * layer_p + n_moe * moe_layer_p
        outside = params[s] - in_layers  # the embedding, the output layer and the final norm: always 16-bit
        if fsdp2 and zero >= 3:  # no 16-bit shard: the fp32 shard is the master weight, counted with the optimizer
            w = 0.0
        elif fp8_param_gather:  # the layers' weights held in FP8 only (Transformer Engine fp8_model_init)
            w = (FP8_WEIGHT_BYTES * in_layers + WEIGHT_BYTES * outside) / d3 + FP8_WEIGHT_BYTES * experts[s] / e3
        else:  # 16-bit weights, and the quantised copy of the layers' weights the low-precision GEMMs read
            w = (WEIGHT_BYTES * params[s] + low * in_layers) / d3 + (WEIGHT_BYTES + low) * experts[s] / e3
        if zero >= 3:
            # the gathered weights: two layers (running and prefetched) and the root unit (embedding, head)
            running = min(2, layers) * (in_layers + experts[s]) / max(layers, 1)
            w = w + gather * running + WEIGHT_BYTES * outside
        if unsharded_grads:  # unsharded gradients accumulated in the reduce dtype
            g = grad * (params[s] + experts[s])
        else:
            g = grad * params[s] / d2 + grad * experts[s] / e2
        o = OPTIMIZER_BYTES * params[s] / d1 + OPTIMIZER_BYTES * experts[s] / e1
        # a stage with MoE layers: the average over its dense and MoE layers
        pl = ((layers - n_moe) * per_layer + n_moe * per_moe_layer) / max(layers, 1) if n_moe > 0 else per_layer
        if keep == _KEEP_ALL_REBUILD_ONE:
            act = mb[s] * layers * pl + one_layer
        elif keep == _KEEP_INPUTS and rec > 0:  # one layer's activations are rebuilt at a time in backward
            act = mb[s] * (rec * layer_input + (layers - rec) * pl) + pl
        else:
            act = mb[s] * layers * pl
        if s == last_a or s == last_b:
            act += loss
        out[0, s], out[1, s], out[2, s], out[3, s] = w, g, o, act
    return out
