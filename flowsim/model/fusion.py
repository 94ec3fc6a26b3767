"""Memory-bound kernels of a transformer layer: bytes moved per tensor element, fused or eager.

Each value is the bytes read plus written by the kernel(s) of one step of a layer, per element of the
``[tokens, width]`` tensor the step works on (2-byte activations, fp32 where the code upcasts). Two
kernel sets (``TrainingConfig.kernel_fusion``):

* ``fused``: Megatron-LM with Transformer Engine / Apex kernels, one kernel per step: a norm reads x and
  writes y (backward reads x and dy, writes dx), bias-activation and bias-dropout-add are single kernels,
  the bias gradient comes out of the weight-gradient GEMM's epilogue, rotary embedding is one kernel
  (``apply_rotary_pos_emb`` fused), the vocab-parallel cross-entropy upcasts once.
* ``eager``: plain PyTorch modules run without ``torch.compile``: every elementwise op is its own kernel.
  The figures are the aten kernels PyTorch 2.13 runs for the reference implementations below, read off
  :mod:`flowsim.capture` recordings of each module (``tests/test_fusion.py`` re-derives them):

  - RMSNorm as transformers' ``LlamaRMSNorm``: ``to(fp32)`` 6, ``pow`` 8, ``mean`` 4, ``mul`` by the rsqrt
    8, ``to(bf16)`` 6, ``mul`` by the weight 4 = 36 forward; autograd's backward of those ops 96.
  - LayerNorm (``nn.LayerNorm``): ``native_layer_norm`` 4 / ``native_layer_norm_backward`` 6, as fused.
  - GELU: ``gelu`` 4 / ``gelu_backward`` 6 per element of the fc1 output, as fused.
  - SwiGLU ``silu(a) * b``: ``silu`` 4 + ``mul`` 6 = 10 forward, two ``mul`` and ``silu_backward`` = 18
    backward, per element of the activation output.
  - Rotary embedding as the Meta Llama reference / torchtitan ``apply_rotary_emb`` (complex multiply in
    fp32): ``to(fp32)`` 6, complex ``mul`` 8, ``to(bf16)`` 6 = 20 each way, per element of q and k
    (``view_as_complex``/``view_as_real`` are views and move nothing).
  - Cross-entropy on logits upcast to fp32 (torchtitan, transformers): ``to(fp32)`` 6, ``_log_softmax`` 8
    (``nll_loss_forward`` reads one logit per token) = 14; backward ``nll_loss_backward`` fills the fp32
    gradient 4, ``_log_softmax_backward_data`` 12, ``to(bf16)`` 6 = 22, per logit.
  - Bias gradient of an ``nn.Linear`` with bias: ``sum`` over tokens of the output gradient, 2 per output
    element; fused QKV gradients packed back into one ``[tokens, q + k + v]`` tensor (``stack`` after the
    attention backward), 4 per element.

In both sets the residual connection costs an ``add`` (6) forward and, in backward, another ``add`` (6)
summing the gradients of the skip and the branch (autograd accumulates a tensor used twice).
"""
from __future__ import annotations

from typing import NamedTuple

from flowsim.units import DTYPE_BYTES

ACT_BYTES = DTYPE_BYTES["bf16"]
FP32_BYTES = DTYPE_BYTES["fp32"]
FUSIONS = ("fused", "eager")


class Traffic(NamedTuple):
    """Bytes per element moved by one layer step: forward and backward (the recompute repeats forward)."""

    fwd: float
    bwd: float


CROSS_ENTROPY_KERNELS = {
    "fused": ((ACT_BYTES + FP32_BYTES,), (FP32_BYTES + ACT_BYTES,)),
    "megatron": ((6.0, 4.0, 8.0, 8.0, 4.0, 8.0), (8.0, 6.0)),
    "fp32_upcast": ((6.0, 8.0), (4.0, 12.0, 6.0)),
}
"""Cross-entropy implementations (:mod:`flowsim.model.loss`): bytes per logit of each forward kernel and of each
backward kernel."""


def cross_entropy_bytes(impl: str) -> Traffic:
    """Bytes per logit of cross-entropy implementation ``impl``, forward and backward (all its kernels)."""
    fwd, bwd = CROSS_ENTROPY_KERNELS[impl]
    return Traffic(sum(fwd), sum(bwd))


_FUSED = {
    "layernorm": Traffic(2 * ACT_BYTES, 3 * ACT_BYTES),
    "rmsnorm": Traffic(2 * ACT_BYTES, 3 * ACT_BYTES),
    # per element of the activation output: read the pre-activation (2 of them if gated), write it;
    # backward reads the pre-activation(s) and the gradient, writes the pre-activation gradient(s)
    "gelu": Traffic(2 * ACT_BYTES, 3 * ACT_BYTES),
    "swiglu": Traffic(3 * ACT_BYTES, 5 * ACT_BYTES),
    "residual": Traffic(3 * ACT_BYTES, 3 * ACT_BYTES),
    # fused bias-dropout-add also writes a 1-byte mask; backward reads gradient and mask, writes gradient,
    # and adds it to the skip gradient
    "dropout_residual": Traffic(3 * ACT_BYTES + 1, 2 * ACT_BYTES + 1 + 3 * ACT_BYTES),
    "rope": Traffic(2 * ACT_BYTES, 2 * ACT_BYTES),
    # one fused cross-entropy kernel each way (flowsim.model.loss)
    "cross_entropy": cross_entropy_bytes("fused"),
    "bias_grad": Traffic(0.0, 0.0),
    "qkv_grad_pack": Traffic(0.0, 0.0),
}

_EAGER = dict(_FUSED)
_EAGER.update({
    "rmsnorm": Traffic(36.0, 96.0),
    "swiglu": Traffic(10.0, 18.0),
    # native_dropout (read x, write y and a 1-byte mask) then add; backward: dropout backward and the add
    "dropout_residual": Traffic(2 * ACT_BYTES + 1 + 3 * ACT_BYTES, 2 * ACT_BYTES + 1 + 3 * ACT_BYTES),
    "rope": Traffic(20.0, 20.0),
    "cross_entropy": cross_entropy_bytes("fp32_upcast"),
    "bias_grad": Traffic(0.0, ACT_BYTES),
    "qkv_grad_pack": Traffic(0.0, 2 * ACT_BYTES),
})

_TABLES = {"fused": _FUSED, "eager": _EAGER}


def traffic(step: str, fusion: str) -> Traffic:
    """Bytes per element of ``step`` (a key of the tables above) under ``fusion`` (``fused``/``eager``)."""
    return _TABLES[fusion][step]


# Summing the input gradients of n linear layers that read one tensor (split projections: torchtitan's wq/wk/wv,
# w1/w3; flowsim.model.ops.split_linears), bytes per element of that tensor. Eager: autograd's InputBuffer adds each
# later gradient into the first (torch/csrc/autograd/input_buffer.cpp ``accumulate``: ``add_`` in place, or ``+``),
# n - 1 adds reading two 16-bit tensors and writing one. Compiled (Inductor): the backward graph's sum is one pointwise
# kernel reading the n gradients and writing their sum.
def input_grad_sum_bytes(n: int, fusion: str) -> float:
    """Bytes per input element of summing the input gradients of ``n`` linear layers that share the input
    (comment above), under ``fusion`` (``eager``: autograd's adds; ``fused``: one compiled kernel); 0 for one."""
    if n < 2:
        return 0.0
    return 3 * ACT_BYTES * (n - 1) if fusion == "eager" else ACT_BYTES * (n + 1)


def activation_step(activation: str) -> str:
    """Table key of an MLP activation: gated ones (``swiglu``, ``geglu``) move like ``swiglu``."""
    return "swiglu" if activation in ("swiglu", "geglu") else "gelu"


# Per-parameter gradient work of PyTorch's data-parallel wrappers that Megatron-LM fuses away (its wgrad
# GEMMs accumulate straight into a contiguous fp32 buffer), bytes per parameter held before sharding; ``e_r`` is
# the reduce dtype's element size (``grad_reduce_dtype``), gradients come out of autograd in 16 bits:
# * DDP (torch/nn/parallel/distributed.py, reducer): per micro-batch AccumulateGrad adds the gradient into
#   its bucket view (read gradient, read and write bucket: 6); per step the default all-reduce hook
#   divides the bucket by the world size (read and write: 4).
# * FSDP2 (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py ``foreach_reduce``): per micro-batch the
#   reduce-scatter packs the gradients into its input buffer of the reduce dtype (``chunk_cat``: read 2, write
#   e_r); the division by the world size is NCCL's (``_get_gradient_divide_factors``: ReduceOp.AVG or PREMUL_SUM
#   for fp32 / bf16, "use NCCL's built-in division to avoid separate div kernels"). With zero_stage 2 (parameters
#   kept gathered from the forward to the backward) the forward's all-gather copies the gathered parameters out
#   of the flat buffer (``split_with_sizes_copy``: 4). With zero_stage 3 the copy-outs (forward and backward) are
#   the layer's own kernels, for any kernel set (``fsdp_copy_out`` rows of
#   :func:`flowsim.model.workload.build_layer`, ``fsdp_version: 2``).
# * FSDP1 (torch/distributed/fsdp/_runtime_utils.py ``_post_backward_hook`` and ``_reduce_grad``, the same code
#   path since PyTorch 2.0): the flat gradient is itself the reduce-scatter input (no packing copy), but per
#   micro-batch, on the post-backward stream, it is cast to the reduce dtype when that is not the 16-bit
#   parameter dtype (``flat_param.grad.to(reduce_dtype)``: read 2, write e_r) and divided in place by the
#   pre-divide factor (``_div_if_needed(padded_unsharded_grad, _gradient_predivide_factor)``: read and write
#   e_r), which ``DefaultState._get_gradient_predivide_factor`` makes > 1 for every world size >= 2 (powers of two
#   up to about sqrt(world)). The post-division, accumulation and cast back of the reduced shard move 1 / dp of
#   that and are left out.
DDP_ACCUMULATE_BYTES_PER_PARAM = 3 * ACT_BYTES
DDP_SCALE_BYTES_PER_PARAM = 2 * ACT_BYTES
FSDP_COPY_BYTES_PER_PARAM = 2 * ACT_BYTES


def fsdp1_grad_bytes_per_param(reduce_bytes: float) -> float:
    """Bytes per parameter FSDP1 moves over each unit's unsharded gradient per micro-batch before its reduce-scatter
    (comment above): the cast to the reduce dtype (``reduce_bytes`` per element; none when it is the 16-bit
    gradient's) and the in-place pre-division."""
    cast = ACT_BYTES + reduce_bytes if reduce_bytes != ACT_BYTES else 0.0
    return cast + 2 * reduce_bytes


def eager_grad_bytes_per_param(zero_stage: int, microbatches: int, fsdp_version: int = 2,
                               reduce_bytes: float = FP32_BYTES) -> float:
    """Bytes per parameter of PyTorch's data-parallel gradient work in one optimizer step (``zero_stage`` 0: DDP,
    2-3: FSDP of ``fsdp_version`` 1 or 2; 1 has no PyTorch-native wrapper and counts as DDP; ``reduce_bytes``: the
    reduce dtype's element size)."""
    if zero_stage >= 2 and fsdp_version == 1:
        return microbatches * fsdp1_grad_bytes_per_param(reduce_bytes)
    if zero_stage >= 2:
        gathers = 0 if zero_stage == 3 else 1  # zero_stage 3: the workload's fsdp_copy_out rows
        return microbatches * (gathers * FSDP_COPY_BYTES_PER_PARAM + ACT_BYTES + reduce_bytes)
    return microbatches * DDP_ACCUMULATE_BYTES_PER_PARAM + DDP_SCALE_BYTES_PER_PARAM


# PyTorch context parallelism (torch.distributed.tensor.experimental context_parallel, torchtitan's CP; torch 2.13
# torch/distributed/tensor/experimental/_context_parallel/_attention.py, the same ring code as the torch 2.6-era
# _attention.py): one SDPA call per ring round, merged and accumulated in fp32 by separate eager kernels
# (``_cp_options.convert_to_f32`` True, ``enable_load_balance`` True, ``rotate_method`` ALL_GATHER). Bytes per
# element of the rank-local attention output / query (q) and of each of K and V (kv), on the busiest rank (the last:
# every round after the first takes the whole query and half of the keys, so every merge covers the whole output):
# * forward (``_templated_ring_attention``, ``_SDPAMerger``): the first round's output cast to fp32 (``out.to``: 6);
#   each later round's cast (6), ``out - block_out`` (12), ``sigmoid(...) *`` (8) and ``out - ...`` (12): 38; the
#   result cast back (6). K and V made contiguous (4) and packed for the rotation every round but the last (``cat``:
#   4 each).
# * backward (``_templated_ring_attention_backward``): fp32 zeros for the query gradient (4), every round's
#   ``grad_query += grad_query_`` (read 4 + 2, write 4: 10), the cast back (6); per K and V element fp32 zeros (4),
#   contiguous (4), the K/V pack of every round but the last (4), the first round's accumulation (10) and every
#   later one's into the first half plus ``torch.cat`` (``_partial_update``: 5 + 8), the fp32 gradient pack sent
#   around the ring every round (``cat``: 8) and the final cast (6).
TORCH_CP_FWD_Q = (6.0 + 6.0, 6.0 + 12.0 + 8.0 + 12.0)  # (first cast + result cast, per later round)
TORCH_CP_FWD_KV = (4.0, 4.0)  # (contiguous, pack per round but the last)
TORCH_CP_BWD_Q = (4.0 + 6.0, 10.0)  # (zeros + cast back, per round)
TORCH_CP_BWD_KV = (4.0 + 4.0 + 10.0 + 6.0, 4.0 + 5.0 + 8.0, 8.0)  # (fixed, per later round, per round)


def torch_cp_bytes(cp: int, q_elements: float, kv_elements: float) -> Traffic:
    """HBM bytes of PyTorch context parallelism's merge and accumulation kernels around one layer's ring attention
    (comment above), forward and backward; ``q_elements``: elements of the rank's attention output (batch x heads x
    local sequence x head dim), ``kv_elements``: of its K (the same for V)."""
    fwd = (q_elements * (TORCH_CP_FWD_Q[0] + TORCH_CP_FWD_Q[1] * (cp - 1))
           + 2 * kv_elements * (TORCH_CP_FWD_KV[0] + TORCH_CP_FWD_KV[1] * (cp - 1)))
    fixed, later, every = TORCH_CP_BWD_KV
    bwd = (q_elements * (TORCH_CP_BWD_Q[0] + TORCH_CP_BWD_Q[1] * cp)
           + 2 * kv_elements * (fixed + later * (cp - 1) + every * cp))
    return Traffic(fwd, bwd)
