"""Op-row builders shared by the dense layer (:mod:`flowsim.model.workload`) and routed experts
(:mod:`flowsim.model.moe`): compute rows in the :mod:`flowsim.kernels` op-table schema and
:class:`CommOp` collectives, gathered into an :class:`OpSet` per block.

A compute row is a dict with ``name``, ``kind`` (``gemm``, ``memory``, ``attn_fwd``, ``attn_bwd``), ``dtype``,
shapes, ``flops`` (FLOP), ``bytes`` (bytes moved to and from device memory), ``phase`` (``fwd``, ``bwd``,
``recompute``) and ``count`` (instances per micro-batch); :func:`finish` turns a list of them into the op
table of an :class:`OpSet`.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import numpy as np

from flowsim.model.fusion import ACT_BYTES, input_grad_sum_bytes, traffic
from flowsim.units import DTYPE_BYTES

# Transformer Engine FP8 recipe (TE docs, "Using FP8 with Transformer Engine"): the input of every FP8
# GEMM is cast (read 2-byte, write 1-byte) and, for the weight-gradient GEMM on Hopper, transposed (read
# and write 1-byte); the output gradient likewise in backward. Weights are cast once per optimizer step.
FP8_CAST_BYTES_PER_ELEM = ACT_BYTES + 1
FP8_TRANSPOSE_BYTES_PER_ELEM = 2
# Block-scaled FP4 recipe (NVIDIA, "Pretraining Large Language Models with NVFP4", arXiv 2509.25149, sec. 4;
# TE NVFP4BlockScaling): the input and the output gradient of every FP4 GEMM are quantised (read 2-byte, write the
# FP4 element with its share of the block scales, flowsim.units.DTYPE_BYTES); the weight-gradient GEMM's operands
# are quantised again along the other dimension from the 16-bit tensors (random Hadamard transform, stochastic
# rounding), so they cost the same per element instead of an FP8-style transpose.
FP4_DTYPES = ("nvfp4", "mxfp4")
# Megatron-core gradient_accumulation_fusion (Transformer Engine ``fuse_wgrad_accumulation``, megatron-core 0.15.0
# extensions/transformer_engine.py; on by default in Megatron-LM and in Megatron-Bridge's GPTModelProvider,
# v0.4.1 models/gpt_provider.py:197): the weight-gradient GEMM accumulates into the fp32 main gradient (beta = 1;
# TE 2.8 pytorch/module/grouped_linear.py general_grouped_gemm(..., accumulate=accumulate_wgrad_into_param_main_grad)),
# reading and writing 4 bytes per weight element instead of writing a 16-bit result.
MAIN_GRAD_ACCUM_BYTES_PER_ELEM = 4 + 4
# Bytes per element of a GEMM operand's two quantised copies under each FP8 recipe: (the copy of the forward and
# input-gradient GEMMs, the copy of the weight-gradient GEMM). :func:`quantize` builds Transformer Engine's delayed
# scaling (DelayedScaling: the cast reads 2 bytes and writes 1 with the amax recorded in the same kernel, from the
# previous steps' history; the weight-gradient copy is an FP8 transpose, read 1 write 1). Current tensorwise scaling
# (torchao Float8Linear's dynamic scaling, TE Float8CurrentScaling) reads the tensor once more for its amax before the
# cast (2 + 3); rowwise scaling (torchao Float8LinearRecipeName.ROWWISE) fuses each row's amax into its cast (3) but
# scales the weight-gradient operand along the other dimension, so that copy is a second amax + cast from the 16-bit
# tensor (2 + 3); block scaling (TE Float8BlockScaling 1x128 tiles; MXFP8BlockScaling's 32-element blocks with a
# 1-byte E8M0 scale each) quantises both copies from the 16-bit tensor with the block amax in the kernel (3 each,
# plus the scales).
FP8_RECIPE_BYTES = {"delayed": (FP8_CAST_BYTES_PER_ELEM, FP8_TRANSPOSE_BYTES_PER_ELEM),
                    "tensorwise": (ACT_BYTES + FP8_CAST_BYTES_PER_ELEM, FP8_TRANSPOSE_BYTES_PER_ELEM),
                    "rowwise": (FP8_CAST_BYTES_PER_ELEM, ACT_BYTES + FP8_CAST_BYTES_PER_ELEM),
                    "blockwise": (FP8_CAST_BYTES_PER_ELEM + 4 / 128, FP8_CAST_BYTES_PER_ELEM + 4 / 128),
                    "mxfp8": (FP8_CAST_BYTES_PER_ELEM + 1 / 32, FP8_CAST_BYTES_PER_ELEM + 1 / 32)}


class CommOp(NamedTuple):
    """One collective of a block: group, op, size in the nccl-tests convention (bytes), phase, overlap, count."""

    group: str
    op: str
    size_bytes: float
    phase: str
    overlap: str
    count: int


@dataclass(frozen=True)
class OpSet:
    """Compute ops and communication (CommOp tuples) of one block, one micro-batch, one GPU: ``columns``, the op
    table's columns (:data:`COMPUTE_COLUMNS`, read-only numpy arrays, :func:`finish`), and its :attr:`compute`
    view as a DataFrame."""

    columns: dict
    comms: tuple

    @cached_property
    def compute(self):
        """The op table (:mod:`flowsim.kernels.ops` schema), a pandas DataFrame built on first use (a copy: the
        step reads :attr:`columns` and :attr:`arrays`, and imports no pandas)."""
        import pandas as pd

        return pd.DataFrame(self.columns)

    @cached_property
    def arrays(self) -> dict:
        """What the step reads of the op table every call, converted once per block (read-only): columns
        ``name``, ``kind``, ``phase`` (str), ``count`` (int64), ``flops`` (float64), and boolean row classes
        ``wgrad`` / ``dgrad`` (names ending ``.wgrad`` / ``.dgrad``), ``gemm``, ``attn`` (attention kernels) and
        ``shared`` (shared-expert ops, names starting ``shared_``)."""
        c = self.columns
        name, kind = c["name"].astype(str), c["kind"].astype(str)
        out = {"name": name, "kind": kind, "phase": c["phase"].astype(str),
               "count": c["count"].astype(np.int64), "flops": c["flops"].astype(np.float64),
               "wgrad": np.char.endswith(name, ".wgrad"), "dgrad": np.char.endswith(name, ".dgrad"),
               "gemm": kind == "gemm", "attn": (kind == "attn_fwd") | (kind == "attn_bwd"),
               "shared": np.char.startswith(name, "shared_")}
        for a in out.values():
            a.flags.writeable = False
        return out


def gemm(name, m, n, k, dtype, phase, count=1):
    """Row of ``C[m, n] = A[m, k] B[k, n]``: ``2mnk`` FLOP; reads A and B in ``dtype``, writes C in 16-bit."""
    flops = 2.0 * m * n * k
    eb = DTYPE_BYTES[dtype]
    return dict(name=name, kind="gemm", dtype=dtype, m=m, n=n, k=k, batch=1, flops=flops,
                bytes=eb * (m * k + k * n) + ACT_BYTES * m * n, phase=phase, count=count)


def wgrad_gemm(name, n_in, n_out, tokens, dtype, count=1):
    """Row of the weight-gradient GEMM ``dW[n_in, n_out] = X^T[n_in, tokens] dY[tokens, n_out]`` accumulated into
    the fp32 main gradient (:data:`MAIN_GRAD_ACCUM_BYTES_PER_ELEM` per weight element instead of a 16-bit
    write): memory-bound when ``tokens`` is small (few tokens per expert)."""
    row = gemm(name, n_in, n_out, tokens, dtype, "bwd", count)
    row["bytes"] += (MAIN_GRAD_ACCUM_BYTES_PER_ELEM - ACT_BYTES) * n_in * n_out
    return row


def linear(rows, name, tokens, n_out, k_in, dtype, recompute, cast_input=True):
    """Forward, input-gradient and weight-gradient GEMMs of ``Y[tokens, n_out] = X[tokens, k_in] W`` and their
    quantisation kernels (:func:`quantize`; ``cast_input`` False: ``X`` arrives quantised already)."""
    rows.append(gemm(f"{name}", tokens, n_out, k_in, dtype, "fwd"))
    rows.append(gemm(f"{name}.dgrad", tokens, k_in, n_out, dtype, "bwd"))
    rows.append(gemm(f"{name}.wgrad", k_in, n_out, tokens, dtype, "bwd"))
    if recompute:
        rows.append(gemm(f"{name}", tokens, n_out, k_in, dtype, "recompute"))
    quantize(rows, name, tokens, n_out, k_in if cast_input else 0, dtype, recompute)


def split_linears(rows, names, n_outs, tokens, k_in, dtype, recompute, fusion) -> None:
    """Separate linear layers ``Y_i[tokens, n_outs[i]] = X[tokens, k_in] W_i`` reading one input (``fused_qkv`` /
    ``fused_gate_up`` off: torchtitan's ``wq``/``wk``/``wv`` and ``w1``/``w3``, torchtitan 0.1.0
    models/llama3/model/model.py:140-144,232-234): each its own forward, input- and weight-gradient GEMMs
    (:func:`linear`, each tiled and wave-quantised on its own shape), then autograd's sum of their input gradients
    (``<first name>.dgrad_sum``, :func:`flowsim.model.fusion.input_grad_sum_bytes`). Under low precision each
    eager layer quantises ``X`` itself (torchao ``Float8Linear`` casts its input per call); a compiled graph
    (``fusion`` ``fused``) keeps one of the identical casts (AOTAutograd's common-subexpression pass,
    ``torch._functorch.config.cse``), so only the first layer's input cast and transpose are priced."""
    for i, (name, n_out) in enumerate(zip(names, n_outs)):
        linear(rows, name, tokens, n_out, k_in, dtype, recompute, cast_input=i == 0 or fusion == "eager")
    rows.append(memory(f"{names[0]}.dgrad_sum", tokens * k_in * input_grad_sum_bytes(len(names), fusion), "bwd"))


def quantize(rows, name, tokens, n_out, k_in, dtype, recompute):
    """Quantisation kernels of the low-precision GEMMs of ``Y[tokens, n_out] = X[tokens, k_in] W`` (none for
    16-bit): the input cast in forward (again with ``recompute``), the output-gradient cast and the transposes
    (FP8) or quantised copies (FP4) the gradient GEMMs read in backward. ``k_in`` 0: the input's kernels are
    another layer's (:func:`split_linears`)."""
    if dtype == "fp8":
        if k_in:
            rows.append(memory(f"{name}.cast_in", tokens * k_in * FP8_CAST_BYTES_PER_ELEM, "fwd"))
        rows.append(memory(f"{name}.cast_grad", tokens * n_out * FP8_CAST_BYTES_PER_ELEM, "bwd"))
        rows.append(memory(f"{name}.transpose", (tokens * k_in + tokens * n_out) * FP8_TRANSPOSE_BYTES_PER_ELEM,
                           "bwd"))
        if recompute and k_in:
            rows.append(memory(f"{name}.cast_in", tokens * k_in * FP8_CAST_BYTES_PER_ELEM, "recompute"))
    elif dtype in FP4_DTYPES:
        quant = ACT_BYTES + DTYPE_BYTES[dtype]
        if k_in:
            rows.append(memory(f"{name}.quant_in", tokens * k_in * quant, "fwd"))
        rows.append(memory(f"{name}.quant_grad", tokens * n_out * quant, "bwd"))
        rows.append(memory(f"{name}.quant_wgrad", (tokens * k_in + tokens * n_out) * quant, "bwd"))
        if recompute and k_in:
            rows.append(memory(f"{name}.quant_in", tokens * k_in * quant, "recompute"))


# torchao's float8 tensor parallelism (torchao 0.7.0 and 0.11.0 float8/float8_tensor_parallel.py; torchtitan 0.1.0
# models/llama3/infra/parallelize.py:56-65,151-166 applies it with tensorwise scaling only, plain TP with rowwise):
# ``PrepareFloat8ModuleInput`` casts a block's sequence-sharded input to FP8 (``hp_tensor_to_float8_dynamic``)
# before ``redistribute`` gathers it, so the gather moves 1 byte per element and the column-parallel layers get the
# gathered FP8 tensor (``tensor_already_casted_to_fp8``: no cast of their own); ``Float8RowwiseParallel``'s output
# hook (``NoopFwToFloat8E5M2BwDynamic`` after the reduce-scatter) casts the output gradient on its sequence shard,
# before the backward's all-gather, again 1 byte per element. The reduce-scatters move the 16-bit partial sums and
# the column-parallel input gradients. Transformer Engine 1.11 does the same under delayed scaling: LayerNormLinear
# writes its norm output in FP8 and gathers that (pytorch/module/layernorm_linear.py:125,164; again in backward,
# :457) and a row-parallel layer's output gradient is cast before its gather (module/base.py:775-797).
# ``FP8_GATHER_RECIPES``: the recipes whose sequence-parallel gathers these sources show moving FP8 (torchao's
# rowwise scaling runs plain TP; block-scaled recipes are not checked).
FP8_GATHER_BYTES_PER_ELEM = DTYPE_BYTES["fp8"]
FP8_GATHER_RECIPES = ("delayed", "tensorwise")


def float8_tp_casts(rows, col_groups, row_names, tp) -> None:
    """Re-price, in place, the FP8 casts around the tensor-parallel linears as torchao's float8 TP runs them (comment
    above): per column-parallel group (``+``-joined names reading one gathered input) one input cast, of the
    ``1 / tp`` sequence shard, instead of each layer's cast of the whole gathered input; each row-parallel layer's
    output-gradient cast (``row_names``) on its shard."""
    names = [g.split("+") for g in col_groups]
    sharded = {f"{n[0]}.cast_in" for n in names} | {f"{n}.cast_grad" for n in row_names}
    dropped = {f"{m}.cast_in" for n in names for m in n[1:]}
    rows[:] = [dict(r, bytes=r["bytes"] / tp) if r["kind"] == "memory" and r["name"] in sharded else r
               for r in rows if r["kind"] != "memory" or r["name"] not in dropped]


def apply_fp8_recipe(opset: OpSet, recipe: str) -> OpSet:
    """``opset`` with its FP8 quantisation kernels (the ``.cast_in``, ``.cast_grad`` and ``.transpose`` rows
    :func:`quantize` builds for delayed scaling) re-priced for ``recipe`` (:data:`FP8_RECIPE_BYTES`)."""
    cast, wgrad_copy = FP8_RECIPE_BYTES[recipe]
    c = opset.columns
    nbytes = c["bytes"].copy()
    for suffixes, per, base in (((".cast_in", ".cast_grad"), cast, FP8_CAST_BYTES_PER_ELEM),
                                ((".transpose",), wgrad_copy, FP8_TRANSPOSE_BYTES_PER_ELEM)):
        sel = (c["kind"] == "memory") & np.array([n.endswith(suffixes) for n in c["name"]], dtype=bool)
        nbytes[sel] = nbytes[sel] * (per / base)
    nbytes.flags.writeable = False
    return OpSet(columns={**c, "bytes": nbytes}, comms=opset.comms)


# How Transformer Engine userbuffers run each pipelined tensor-parallel collective (``tp_comm_overlap``; the defaults
# of transformer_engine/pytorch/module/base.py ``initialize_ub``): the all-gathers before a GEMM (qkv_fprop,
# fc1_fprop, proj_dgrad, fc2_dgrad) as a ``ring_exchange`` in tp-size splits on 1 SM; the reduce-scatters after the
# forward's row-parallel GEMMs (proj_fprop, fc2_fprop) as a ``pipeline`` of 4 splits on 16 SMs; the input
# gradients' reduce-scatters (qkv_dgrad, fc1_dgrad) in ``bulk`` beside the weight-gradient GEMM, on 16 SMs.
# PyTorch's async TP (``symm_mem``, :func:`symm_mem_tp`) splits both kinds in tp-size pieces, one per peer, and
# moves each shard with a copy of the peer's symmetric-memory buffer (``Tensor.copy_`` of two contiguous tensors:
# cudaMemcpyAsync, run by the copy engines, no SM held: torch 2.6.0 and 2.13.0
# torch/distributed/_symmetric_memory/__init__.py _pipelined_multi_all_gather_and_consume,
# _pipelined_produce_and_all2all).
TP_OVERLAP_SMS = {"ring_exchange": 1, "pipeline": 16, "bulk": 16, "symm_mem": 0}
TP_PIPELINE_SPLITS = 4


def tp_overlap_method(op: str, names) -> str:
    """``ring_exchange``, ``pipeline`` or ``bulk``: how Transformer Engine runs a tensor-parallel collective (``op``)
    beside the GEMMs ``names`` it feeds or drains (:data:`TP_OVERLAP_SMS`)."""
    if any(n.endswith(".wgrad") for n in names):
        return "bulk"
    return "ring_exchange" if op == "allgather" else "pipeline"


def tp_pairing(op: str, overlap: str) -> tuple | None:
    """(method, GEMM names) of a collective pipelined with GEMMs, from its ``overlap`` tag: ``gemm:<names>``
    (Transformer Engine's method for ``op`` and the names, :func:`tp_overlap_method`) or ``symm_mem:<names>``
    (PyTorch's async TP, :func:`symm_mem_tp`); None for any other tag."""
    kind, _, names = overlap.partition(":")
    if kind not in ("gemm", "symm_mem") or not names:
        return None
    names = names.split("+")
    return ("symm_mem" if kind == "symm_mem" else tp_overlap_method(op, names)), names


def tp_overlap_pieces(method: str, tp: int) -> int:
    """Pieces a pipelined collective's GEMM runs in under ``method`` (1: a bulk overlap, the GEMM whole)."""
    return {"ring_exchange": tp, "pipeline": TP_PIPELINE_SPLITS, "bulk": 1, "symm_mem": tp}[method]


def symm_mem_tp(rows, comms, tp) -> list:
    """The block's collectives as PyTorch's async TP runs them (``tp_overlap_impl: symm_mem``), adding to ``rows``
    the kernels its fused ops run on the compute stream beside the GEMM pieces; returns the new collectives.

    Inductor's micro-pipeline TP pass (torch 2.6.0 and 2.13.0 torch/_inductor/fx_passes/micro_pipeline_tp.py) fuses an
    all-gather with the matmuls that read the gathered tensor as their first operand, and a reduce-scatter with
    the one matmul that produces its input (``_find_producer_matmul``: an ``mm``, or a reshape of one), into the
    ops of torch/distributed/_symmetric_memory/__init__.py. Per fused op, on the compute stream and not hidden:

    * all-gather + matmul (``_pipelined_multi_all_gather_and_consume``): the local shard is copied into the
      symmetric-memory buffer before the first piece (read and write ``size / tp`` bytes: ``copy_shard(
      local_p2p_bufs, shard)``, followed by a barrier, "giving up the chance to overlap mv and b with the first
      shard_consumer"); the copy of the local shard into the gathered output runs beside the last piece, on the
      other stream, and is not priced;
    * matmul + reduce-scatter (``_fused_matmul_reduce_scatter_impl``): each piece's partial sum lands in a
      ``[tokens, n]`` buffer (the local piece written by its GEMM, the others copied from the peers' buffers: the
      transfer), then ``torch.sum`` over the tp partials reads all of it and writes this rank's ``1 / tp`` share
      (``size (1 + 1 / tp)`` bytes, 16-bit).

    The input gradient of the column-parallel projections is not fused: the models that run async TP
    (torchtitan's llama3 ``wq``/``wk``/``wv`` and ``w1``/``w3``) have several projections read the gathered input, so
    the reduce-scatter's input is the sum of their input gradients, not one matmul; it stays a blocking
    collective (the comm tagged with the weight-gradient GEMMs Transformer Engine overlaps it with in bulk).
    ``size`` is a collective's size in the nccl-tests convention (the whole gathered tensor); the barriers'
    latency is not priced."""
    out = []
    for c in comms:
        pairing = tp_pairing(c.op, c.overlap) if c.overlap.startswith("gemm:") else None
        if pairing is None:
            out.append(c)
            continue
        method, names = pairing
        if method == "bulk":
            out.append(c._replace(overlap="none"))
            continue
        out.append(c._replace(overlap="symm_mem:" + "+".join(names)))
        if c.op == "reducescatter":
            rows.append(memory(f"{names[0]}.symm_mem_reduce", c.size_bytes * (1 + 1 / tp), c.phase, c.count))
        else:
            rows.append(memory(f"{names[0]}.symm_mem_stage", 2 * c.size_bytes / tp, c.phase, c.count))
    return out


def split_pipelined_gemms(rows, comms, tp) -> None:
    """Split, in place, each GEMM row a tensor-parallel collective is pipelined with (``tp_comm_overlap``: a comm's
    ``overlap`` tag ``gemm:<names>`` or ``symm_mem:<names>`` in its phase, :func:`tp_pairing`) into the pieces of
    its method (:func:`tp_overlap_pieces`) of ``m / pieces`` rows, each reading the whole weight: the kernel model
    prices the smaller pieces' tile and wave quantisation and launches. Bulk-overlapped GEMMs stay whole."""
    pieces = {}
    for c in comms:
        pairing = tp_pairing(c.op, c.overlap)
        if pairing is not None:
            for n in pairing[1]:
                pieces[(c.phase, n)] = tp_overlap_pieces(pairing[0], tp)
    for i, r in enumerate(rows):
        k = pieces.get((r["phase"], r["name"]), 1)
        if r["kind"] == "gemm" and k > 1:
            rows[i] = gemm(r["name"], -(-r["m"] // k), r["n"], r["k"], r["dtype"], r["phase"], r["count"] * k)


def memory(name, nbytes, phase, count=1, flops=0.0):
    """Row of a memory-bound kernel moving ``nbytes`` bytes (and doing ``flops`` FLOP)."""
    return dict(name=name, kind="memory", dtype="bf16", flops=flops, bytes=float(nbytes), phase=phase, count=count)


def elementwise(rows, name, step, fusion, elems, recompute):
    """Rows of a memory-bound layer step (see :mod:`flowsim.model.fusion`) over ``elems`` tensor elements:
    forward, backward and, with ``recompute``, the forward again. Steps that move nothing add no row."""
    tr = traffic(step, fusion)
    for phase, per in (("fwd", tr.fwd), ("bwd", tr.bwd)) + ((("recompute", tr.fwd),) if recompute else ()):
        if per:
            rows.append(memory(name + (".bwd" if phase == "bwd" else ""), elems * per, phase))


def attention(name, batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, phase):
    """Row of one fused (FlashAttention) attention kernel, forward or (``phase="bwd"``) backward."""
    kind = "attn_bwd" if phase == "bwd" else "attn_fwd"
    # FlashAttention FLOP convention (flash-attention benchmarks/benchmark_flash_attention.py):
    # forward 4*b*s_q*s_k*h*d, halved for causal; backward 2.5x forward (it recomputes the scores).
    fwd = 4.0 * batch * seq_q * seq_k * heads * head_dim / (2.0 if causal else 1.0)
    flops = 2.5 * fwd if kind == "attn_bwd" else fwd
    qo = batch * seq_q * heads * head_dim
    kv = batch * seq_k * kv_heads * head_dim
    nbytes = ACT_BYTES * (2 * qo + 2 * kv) * (2 if kind == "attn_bwd" else 1)
    return dict(name=name, kind=kind, dtype="bf16", batch=batch, heads=heads, kv_heads=kv_heads, seq_q=seq_q,
                seq_k=seq_k, head_dim=head_dim, causal=causal, flops=flops, bytes=float(nbytes), phase=phase,
                count=1)


# flash_attn.bert_padding (flash-attn 2.x; llm-foundry's flash_attn_fn around flash_attn_varlen_func), bytes per element
# of the 16-bit tensors it copies, per direction. Forward: IndexFirstAxis.forward gathers each of q, k, v into an
# unpadded copy (torch.gather: read and write each element; its index is a stride-0 expand of one int64 per token),
# IndexPutFirstAxis.forward (pad_input) writes a zeroed output and puts the attention output into it (torch.zeros,
# then ``output[indices] = values``: write, read and write). Backward: IndexPutFirstAxis.backward gathers the output
# gradient (``grad_output[indices]``: read and write), IndexFirstAxis.backward scatters each of the q, k, v gradients
# into a zeroed tensor (torch.zeros, then ``scatter_``: write, read and write).
UNPAD_GATHER_BYTES = 2 * ACT_BYTES
UNPAD_SCATTER_BYTES = 3 * ACT_BYTES


def unpad_rows(tokens, q_width, kv_width, phase) -> list:
    """Rows of the copies FlashAttention's variable-length path adds around the attention kernels of one layer
    (``flash_attn_unpad``, :data:`UNPAD_GATHER_BYTES`) for ``tokens`` tokens, every one of them real (llm-foundry
    unpads with an all-ones mask when the batch has no padding), ``q_width`` = heads x head dim of the queries and
    the output, ``kv_width`` of the keys and of the values. Forward (and ``recompute``): q, k and v gathered, the
    output scattered back: ``tokens (2 (q + 2 kv) + 3 q) x 2`` bytes, 40 x hidden per token over both directions
    for multi-head attention. Backward: ``tokens (2 q + 3 (q + 2 kv)) x 2`` bytes. Grouped keys and values reach
    the kernel as they are (llm-foundry 0.7.0 attention.py:541 repeats them only without flash-attn 2)."""
    if phase == "bwd":
        nbytes = tokens * (UNPAD_GATHER_BYTES * q_width + UNPAD_SCATTER_BYTES * (q_width + 2 * kv_width))
        return [memory("attention_unpad.bwd", nbytes, phase)]
    nbytes = tokens * (UNPAD_GATHER_BYTES * (q_width + 2 * kv_width) + UNPAD_SCATTER_BYTES * q_width)
    return [memory("attention_unpad", nbytes, phase)]


def batched_gemm(name, batch, m, n, k, dtype, phase):
    """Row of ``batch`` independent GEMMs of one shape and dtype (:func:`gemm`), as one kernel."""
    row = gemm(name, m, n, k, dtype, phase)
    row.update(batch=batch, flops=row["flops"] * batch, bytes=row["bytes"] * batch)
    return row


# Scale, causal mask and softmax as PyTorch's separate kernels (Megatron-LM's FusedScaleMaskSoftmax falls back to
# them without its fused kernel), bytes per score element: forward ``mul`` (read 2, write 2), ``masked_fill``
# (read 2 and the 1-byte boolean mask, write 2), ``_softmax`` (read 2, write 2) = 13; backward
# ``_softmax_backward_data`` (read probabilities and gradient, write 2) 6, the mask's ``where`` 5, ``mul`` 4 = 15.
EAGER_SOFTMAX_BYTES = (4 + 5 + 4, 6 + 5 + 4)


def unfused_attention(bh, s, d, dropout, phase, dtype, fused_softmax=True):
    """Core attention without FlashAttention (Megatron-LM's ``CoreAttention``: ``torch.baddbmm``, softmax,
    dropout, ``torch.bmm``), for ``bh`` (batch x local heads) heads of ``s`` tokens and head dim ``d``, its GEMMs
    in ``dtype`` (the job's 16-bit type).

    Forward: scores = Q K^T (batched GEMM over the full ``s x s`` square: causal masking does not skip work),
    scale-mask-softmax, optional attention dropout (``dropout``: read and write the 2-byte probabilities and
    write a 1-byte mask), context = P V. Backward: the two GEMMs' input gradients (four batched GEMMs), the
    dropout's and the softmax's backward. ``fused_softmax``: Megatron's ``FusedScaleMaskSoftmax`` kernel (read
    and write the scores once; backward reads the probabilities and their gradient and writes the gradient);
    otherwise PyTorch's separate ops (:data:`EAGER_SOFTMAX_BYTES`).
    """
    sq = float(bh) * s * s  # score elements
    soft_fwd, soft_bwd = (2 * ACT_BYTES, 3 * ACT_BYTES) if fused_softmax else EAGER_SOFTMAX_BYTES
    drop = sq * (2 * ACT_BYTES + 1)  # forward: read, write, 1-byte mask; backward: read gradient and mask, write
    if phase == "bwd":
        rows = [batched_gemm("attn_scores.dgrad_q", bh, s, d, s, dtype, phase),
                batched_gemm("attn_scores.dgrad_k", bh, s, d, s, dtype, phase),
                batched_gemm("attn_context.dgrad_p", bh, s, s, d, dtype, phase),
                batched_gemm("attn_context.dgrad_v", bh, s, d, s, dtype, phase),
                memory("softmax.bwd", sq * soft_bwd, phase)]
        if dropout:
            rows.append(memory("attn_dropout.bwd", drop, phase))
        return rows
    rows = [batched_gemm("attn_scores", bh, s, s, d, dtype, phase),
            memory("softmax", sq * soft_fwd, phase),
            batched_gemm("attn_context", bh, s, d, s, dtype, phase)]
    if dropout:
        rows.append(memory("attn_dropout", drop, phase))
    return rows


def comm(group, op, size_bytes, phase, overlap="none", count=1):
    """A :class:`CommOp`; ``size_bytes`` in the nccl-tests convention."""
    return CommOp(group, op, float(size_bytes), phase, overlap, count)


COMPUTE_COLUMNS = ["name", "kind", "dtype", "m", "n", "k", "batch", "heads", "kv_heads", "seq_q", "seq_k",
                   "head_dim", "causal", "flops", "bytes", "phase", "count"]
INT_COLUMNS = ("m", "n", "k", "batch", "heads", "kv_heads", "seq_q", "seq_k", "head_dim", "count")


def finish(rows, comms) -> OpSet:
    """The :class:`OpSet` of a block: compute rows as the columns of one op table (every column of
    COMPUTE_COLUMNS, absent shape fields 0; numpy arrays, strings as objects), collectives as a tuple."""
    cols = {}
    for c in COMPUTE_COLUMNS:
        if c in INT_COLUMNS:
            cols[c] = np.array([r.get(c, 0) for r in rows], dtype=np.int64)
        elif c == "causal":
            cols[c] = np.array([bool(r.get(c, False)) for r in rows])
        elif c in ("flops", "bytes"):
            cols[c] = np.array([r[c] for r in rows], dtype=np.float64)
        else:
            cols[c] = np.array([r[c] for r in rows], dtype=object)
        cols[c].flags.writeable = False
    return OpSet(columns=cols, comms=tuple(comms))
