"""The optimizer step of one GPU of every pipeline stage, per optimizer implementation.

The step follows a synchronisation point (the gradient norm's or the loss scale's ``.item()``), so its kernels
are issued from an idle CPU (the host-side timeline, :mod:`flowsim.step.host`). Implementations
(``TrainingConfig.optimizer_impl``), AdamW with fp32 state, bytes per parameter of the local shard and kernels:

* ``fused`` (default): one multi-tensor kernel per chunk of parameters (Apex / Transformer Engine ``FusedAdam``
  in Megatron-LM, DeepSpeed's ``FusedAdam``, ``torch.optim.AdamW(fused=True)``): ``ADAM_BYTES_PER_PARAM``.
* ``foreach``: ``torch.optim.AdamW(foreach=True)``, PyTorch's default on CUDA (torch 2.13 ``torch/optim/adam.py``
  ``_multi_tensor_adam``, not capturable): eight multi-tensor ops, each its own pass over memory
  (:data:`FOREACH_BYTES_PER_PARAM`).
* ``for_loop``: one tensor at a time (composer's ``DecoupledAdamW.adamw``, llm-foundry; ``torch.optim.AdamW(
  foreach=False)``): nine kernels per parameter tensor (:data:`LOOP_BYTES_PER_PARAM`).

A multi-tensor op launches one kernel per ``MULTI_TENSOR_BLOCKS`` chunks of ``MULTI_TENSOR_CHUNK`` elements.
"""
from __future__ import annotations

import numpy as np

from flowsim.kernels import KERNEL_MIN_TIME_S
from flowsim.kernels.memory import memory_reference, stream_efficiency
from flowsim.model.fusion import eager_grad_bytes_per_param
from flowsim.model.host_costs import ATTENTION_GEMMS, host_costs
from flowsim.model.workload import ADAM_BYTES_PER_PARAM
from flowsim.step.data_parallel import grad_reduce_bytes, pytorch_wrapper, zero_level
from flowsim.step.host import optimizer_end_s

# torch 2.13 torch/optim/adam.py _multi_tensor_adam (capturable False): weight decay _foreach_mul_ of the
# parameters (read, write fp32: 8), _foreach_lerp_ of m toward the gradient (read m and g, write m: 12),
# _foreach_mul_ (8) and _foreach_addcmul_ (read v and the gradient twice, write v: 16) of v, _foreach_sqrt of v
# into a new list (8), _foreach_div_ (8) and _foreach_add_ (8) of it, _foreach_addcdiv_ into the parameters
# (read p, m and the denominator, write p: 16)
FOREACH_BYTES_PER_PARAM = 8 + 12 + 8 + 16 + 8 + 8 + 8 + 16
FOREACH_OPS = 8
# composer optim/decoupled_weight_decay.py DecoupledAdamW.adamw, per parameter: param.mul_ (8), exp_avg.mul_ (8)
# .add_ (12), exp_avg_sq.mul_ (8) .addcmul_ (16), sqrt() (8), / bias correction (8), add_ eps (8), addcdiv_ (16)
LOOP_BYTES_PER_PARAM = 8 + 8 + 12 + 8 + 16 + 8 + 8 + 8 + 16
LOOP_KERNELS_PER_TENSOR = 9
# multi_tensor_apply (apex csrc/multi_tensor_apply.cuh, ATen native/cuda/MultiTensorApply.cuh): chunks of
# 65,536 elements, at most 320 blocks per launch
MULTI_TENSOR_CHUNK = 65536
MULTI_TENSOR_BLOCKS = 320
BYTES_PER_PARAM = {"fused": ADAM_BYTES_PER_PARAM, "foreach": FOREACH_BYTES_PER_PARAM,
                   "for_loop": LOOP_BYTES_PER_PARAM}


def weight_tensors(opset, add_bias: bool, norm_bias: bool) -> int:
    """Parameter tensors of one block, from its forward op rows: a weight per linear layer (plus a bias with
    ``add_bias``) and per norm (plus a bias with ``norm_bias``, LayerNorm); grouped experts count as one tensor
    per GEMM."""
    c = opset.columns
    rows = [(n, k) for n, k, ph in zip(c["name"], c["kind"], c["phase"]) if ph == "fwd"]
    linear = sum(k == "gemm" and not n.startswith(ATTENTION_GEMMS) for n, k in rows)
    norms = sum(n.endswith("norm") for n, _ in rows)
    return linear * (2 if add_bias else 1) + norms * (2 if norm_bias else 1)


def _kernels(impl: str, params: np.ndarray, tensors: np.ndarray) -> np.ndarray:
    """Kernels of one optimizer step per stage: multi-tensor launches, or kernels per tensor."""
    if impl == "for_loop":
        return LOOP_KERNELS_PER_TENSOR * tensors
    launches = np.maximum(1.0, np.ceil(params / (MULTI_TENSOR_CHUNK * MULTI_TENSOR_BLOCKS)))
    return launches * (FOREACH_OPS if impl == "foreach" else 1)


def optimizer_s(cfg, wl, gpu) -> np.ndarray:
    """Optimizer step of one GPU of every stage, float64[p] seconds: memory-bound over the local parameter shard
    (bytes per parameter of the implementation, module docstring, at the GPU's measured streaming bandwidth),
    plus, under PyTorch's own data-parallel wrappers (:func:`pytorch_wrapper`), their per-parameter gradient work
    (:mod:`flowsim.model.fusion`);
    at least one kernel's floor; with a host model, its kernels issued from an idle CPU."""
    t = cfg.training
    impl = t.optimizer_impl or "fused"
    zero = zero_level(t)
    edp = t.tp * t.cp * t.dp // (t.ep * t.expert_tensor_parallel_size)
    params, experts = np.asarray(wl.stage_params), np.asarray(wl.stage_expert_params)
    n = params / (t.dp_shard if zero >= 1 else 1) + experts / (edp if zero >= 1 else 1)
    nbytes = BYTES_PER_PARAM[impl] * n
    if pytorch_wrapper(t) and t.dp * t.cp > 1:
        nbytes = nbytes + eager_grad_bytes_per_param(zero, cfg.num_microbatches, t.fsdp_version,
                                                     grad_reduce_bytes(t)) * (params + experts)
    eff = stream_efficiency(memory_reference(gpu).measured)
    gpu_s = np.maximum(nbytes / (gpu.hbm_Bps * eff), KERNEL_MIN_TIME_S)
    if t.host_overhead == "none":
        return gpu_s
    bias, norm_bias = cfg.model.add_bias_linear, cfg.model.normalization == "layernorm"
    dense = wl.chunk_layers.sum(axis=1) - wl.chunk_moe_layers.sum(axis=1)
    tensors = dense * weight_tensors(wl.layer, bias, norm_bias)
    if wl.moe_layer is not None:
        tensors = tensors + wl.chunk_moe_layers.sum(axis=1) * weight_tensors(wl.moe_layer, bias, norm_bias)
    tensors = tensors.astype(np.float64)
    tensors[0] += 1  # the word embedding
    tensors[-1] += weight_tensors(wl.head, bias, norm_bias)
    kernels = _kernels(impl, n, tensors)
    per_kernel_s = host_costs(t.host_overhead, cfg.cluster.cpu).kernel_fwd_s
    return optimizer_end_s(gpu_s, kernels, per_kernel_s)
