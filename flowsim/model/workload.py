"""Model + parallel layout -> the operations one GPU runs per micro-batch, as op tables.

Rank symmetry (DESIGN.md): every TP/CP/DP rank of a pipeline stage runs the same sequence, so one table
per kind of block describes them all. Identical transformer layers are built once and repeated by count:

* ``layer``: one transformer layer for one micro-batch on one GPU (forward, backward, recompute);
* ``embedding``: the input embedding (first pipeline stage);
* ``head``: final norm, LM head and cross-entropy (last pipeline stage).

Compute rows follow the :mod:`flowsim.kernels` op-table schema (``kind``, ``dtype``, shapes, ``flops``,
``bytes``) plus ``name``, ``phase`` (``fwd``, ``bwd``, ``recompute``) and ``count`` (instances per
micro-batch). Communication rows carry ``group`` (``tp``, ``cp``), ``op``, ``size_bytes`` in the
nccl-tests convention, ``phase``, ``count`` and ``overlap`` (``none`` = on the critical path,
``dgrad`` = issued asynchronously beside the input-gradient GEMMs, as Megatron-LM does for the
sequence-parallel all-gather of saved inputs).

Shapes follow Megatron-LM's tensor parallelism (Shoeybi et al. 2019): QKV and MLP-in GEMMs are
column-parallel, attention-out and MLP-out row-parallel; with sequence parallelism (Korthikanti et al.
2022, arXiv 2205.05198) norms, dropout and residuals run on ``tokens / tp`` and the all-reduces become
all-gather + reduce-scatter pairs.
"""
from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from flowsim._moved import module_getattr
from flowsim.config import SimConfig, TrainingConfig
from flowsim.model import recompute
from flowsim.model.fusion import ACT_BYTES, FP32_BYTES, activation_step, torch_cp_bytes
from flowsim.model.loss import cross_entropy_impl, cross_entropy_rows
from flowsim.model.memo import BoundedCache
from flowsim.model.moe import moe_mlp_ops
from flowsim.model.ops import (COMPUTE_COLUMNS, FP8_GATHER_BYTES_PER_ELEM, FP8_GATHER_RECIPES, OpSet, apply_fp8_recipe,
                               attention, comm, elementwise, finish, float8_tp_casts, gemm, linear, memory,
                               split_linears, split_pipelined_gemms, symm_mem_tp, unfused_attention, unpad_rows)
from flowsim.model.stage_split import chunk_layer_counts  # noqa: F401 -- kept importable from here
from flowsim.model.stage_split import layer_params, padded_vocab, stage_split

# Adam step with fp32 master weights (Megatron-LM mixed precision): per parameter read fp32 grad (4),
# read+write fp32 master (8), m (8) and v (8), write the 16-bit copy (2) = 30 bytes; zeroing the fp32
# gradient buffer writes 4 more.
ADAM_BYTES_PER_PARAM = 4 + 8 + 8 + 8 + 2 + 4

__getattr__ = module_getattr(__name__)  # CommOp and the FP8 constants moved to flowsim.model.ops


@dataclass(frozen=True)
class Workload:
    """Everything one GPU of each pipeline stage does in one optimizer step.

    Attributes
    ----------
    layer, embedding, head : OpSet
        Per-micro-batch blocks (see module docstring); ``layer`` has a dense MLP.
    moe_layer : OpSet or None
        A layer whose MLP is routed experts (MoE models only).
    chunk_layers : int64[p, v]
        Transformer layers of model chunk ``c`` on pipeline stage ``s``
        (:func:`flowsim.model.stage_split.chunk_layer_counts`).
    chunk_recompute_layers : int64[p, v]
        Layers of each chunk that re-run their ``recompute`` rows in backward (:mod:`flowsim.model.recompute`).
    chunk_moe_layers, chunk_recompute_moe_layers : int64[p, v]
        How many of those are MoE layers.
    p2p_bytes : float
        Bytes of the activation (or its gradient) one GPU sends to the next stage per micro-batch.
    stage_params : tuple[float, ...]
        Parameters held by one GPU of each stage before any ZeRO sharding (TP-sharded), routed experts
        excluded, count.
    stage_expert_params : tuple[float, ...]
        Routed-expert parameters held by one GPU of each stage (sharded over the expert-parallel group).
    gemm_dtype : str
        Dtype of the linear-layer GEMMs (``fp8``, ``nvfp4``, ``mxfp4`` run the blocks' linear layers in that
        dtype, everything else in 16-bit; :attr:`flowsim.config.TrainingConfig.linear_dtype`).
    block_key : tuple
        What the blocks are built from (:func:`block_key`): workloads with equal keys share their blocks, op table
        and priced op times.
    expert_comm_sms : int
        SMs the token dispatcher's kernels hold while they run beside compute: ``moe_deepep_num_sms`` for the
        ``flex`` dispatcher, 0 for NCCL's collectives (one SM per channel, priced with them).
    """

    layer: OpSet
    moe_layer: OpSet | None
    embedding: OpSet
    head: OpSet
    chunk_layers: np.ndarray
    chunk_recompute_layers: np.ndarray
    chunk_moe_layers: np.ndarray
    chunk_recompute_moe_layers: np.ndarray
    p2p_bytes: float
    stage_params: tuple
    stage_expert_params: tuple
    gemm_dtype: str
    block_key: tuple = dataclasses.field(repr=False, compare=False)
    expert_comm_sms: int = 0

    @cached_property
    def op_table(self) -> tuple:
        """All compute ops of the blocks in one table, built once per :attr:`block_key`: (its columns, a dict
        :data:`~flowsim.model.ops.COMPUTE_COLUMNS` -> read-only numpy array, which
        :func:`flowsim.kernels.op_times` prices; the row span (slice) of each block; its columns as
        :attr:`OpSet.arrays`). Blocks in order layer, embedding, head, moe_layer."""
        return _OP_TABLES.get(self.block_key, self._op_table)

    def _op_table(self) -> tuple:
        blocks = {"layer": self.layer, "embedding": self.embedding, "head": self.head}
        if self.moe_layer is not None:
            blocks["moe_layer"] = self.moe_layer
        spans, start = {}, 0
        for name, ops in blocks.items():
            spans[name] = slice(start, start + len(ops.columns["name"]))
            start += len(ops.columns["name"])
        columns = {k: np.concatenate([ops.columns[k] for ops in blocks.values()]) for k in COMPUTE_COLUMNS}
        arrays = {k: np.concatenate([ops.arrays[k] for ops in blocks.values()]) for k in self.layer.arrays}
        for a in (*columns.values(), *arrays.values()):
            a.flags.writeable = False
        return columns, spans, arrays


def _tp_comms(comms, tp, sp, act_bytes, phase, col, row, gather_bytes=None):
    """Collectives around one column-parallel -> row-parallel pair (attention or MLP), one direction.

    ``col`` / ``row``: names of the pair's column- and row-parallel GEMMs (``+``-joined when several read one
    gathered input). Each sequence-parallel collective names the GEMM it feeds or drains in ``overlap``
    (``gemm:<name>``, blocking unless ``tp_comm_overlap`` pipelines the two: :mod:`flowsim.step.blocks`): forward,
    the all-gather before the column-parallel GEMM and the reduce-scatter after the row-parallel one; backward,
    the all-gather of the output gradient before the row-parallel input-gradient GEMM and the reduce-scatter of
    the column-parallel input gradient beside the column-parallel weight-gradient GEMM (Transformer Engine's
    ``bulk`` overlap of ``qkv_dgrad`` / ``fc1_dgrad`` in transformer_engine/pytorch/module/base.py
    ``initialize_ub``; PyTorch's async TP pipelines it with the input-gradient GEMM, of the same size, whose time
    the saved input's all-gather already overlaps). ``gather_bytes``: the all-gathers' size when they move FP8
    (``fp8_tp_gather``: torchao's float8 TP, :data:`flowsim.model.ops.FP8_GATHER_BYTES_PER_ELEM`), else
    ``act_bytes``.
    """
    if tp == 1:
        return
    gather = act_bytes if gather_bytes is None else gather_bytes
    if sp:
        def of(names, suffix):
            return "+".join(f"{n}.{suffix}" for n in names.split("+"))

        if phase in ("fwd", "recompute"):
            comms.append(comm("tp", "allgather", gather, phase, overlap=f"gemm:{col}"))      # gather the shards
            comms.append(comm("tp", "reducescatter", act_bytes, phase, overlap=f"gemm:{row}"))  # row-parallel out
        else:
            comms.append(comm("tp", "allgather", gather, "bwd", overlap=f"gemm:{of(row, 'dgrad')}"))  # grad of out
            comms.append(comm("tp", "reducescatter", act_bytes, "bwd", overlap=f"gemm:{of(col, 'wgrad')}"))
            comms.append(comm("tp", "allgather", gather, "bwd", overlap="dgrad"))  # saved input for wgrad
    else:
        comms.append(comm("tp", "allreduce", act_bytes, phase))


def build_layer(cfg: SimConfig, moe: bool = False) -> OpSet:
    """One transformer layer, one micro-batch, one GPU (see module docstring).

    ``moe`` replaces the dense MLP by routed experts (:func:`flowsim.model.moe.moe_mlp_ops`). The rows of phase
    ``recompute`` are what a recomputed layer re-runs in backward under the training config's policy
    (:mod:`flowsim.model.recompute`).
    """
    m, t = cfg.model, cfg.training
    tp, cp, sp = t.tp, t.cp, t.sequence_parallel
    b, s = t.micro_batch_size, cfg.seq_length
    s_local = s // cp
    tokens = cfg.microbatch_tokens           # tokens entering this GPU's layer per micro-batch
    tok_sp = tokens // tp if sp else tokens  # tokens for norms/dropout/residual
    h, d, f = m.hidden_size, m.kv_channels, m.ffn_hidden_size
    heads, groups = m.num_attention_heads // tp, max(m.num_query_groups // tp, 1)
    dt = t.linear_dtype
    full = recompute.policy(t) in ("full", "every_n")

    def rc(module):
        return recompute.recomputes(t, module)

    rows: list[dict] = []
    comms: list[dict] = []
    act = tokens * h * ACT_BYTES  # the full [tokens, h] activation of the TP group, bytes

    def passes(recomputed):
        return ("fwd", "bwd") + (("recompute",) if recomputed else ())

    dropout = m.hidden_dropout > 0

    fusion = t.kernel_fusion
    bias_grad = m.add_bias_linear and fusion == "eager"

    def norm(name):
        elementwise(rows, name, m.normalization, fusion, tok_sp * h, rc("layernorm"))

    def residual(name):
        elementwise(rows, name, "dropout_residual" if dropout else "residual", fusion, tok_sp * h, full)

    def bias(name, width):
        if bias_grad:
            elementwise(rows, f"{name}.bias_grad", "bias_grad", fusion, tokens * width, False)

    # attention block
    norm("input_norm")
    if m.multi_latent_attention:
        d = _mla_projections(rows, m, tokens, heads, dt, full, fusion)
        groups = heads
        col = "q_down+kv_down" if m.q_lora_rank else "q_proj+kv_down"
    elif t.fused_qkv:
        qkv_out = (heads + 2 * groups) * d
        linear(rows, "qkv", tokens, qkv_out, h, dt, full)
        bias("qkv", qkv_out)
        elementwise(rows, "qkv_grad_pack", "qkv_grad_pack", fusion, tokens * qkv_out, False)
        col = "qkv"
    else:  # separate q, k and v projections: no packed gradient, their input gradients summed
        outs = {"q_proj": heads * d, "k_proj": groups * d, "v_proj": groups * d}
        split_linears(rows, tuple(outs), tuple(outs.values()), tokens, h, dt, full, fusion)
        for name, width in outs.items():
            bias(name, width)
        col = "+".join(outs)
    if not m.multi_latent_attention and m.qk_layernorm:  # each query and key head normalised before rotary, attention
        elementwise(rows, "qk_norm", m.normalization, fusion, tokens * (heads + groups) * d, full)
    rope_heads = (heads + groups) * d if not m.multi_latent_attention else (heads + 1) * m.qk_pos_emb_head_dim
    if m.position_embedding == "rope":
        elementwise(rows, "rope", "rope", fusion, tokens * rope_heads, full)
    # Context parallelism: this GPU's s/cp queries attend to all s keys (ring attention, KV chunks
    # exchanged between CP ranks); causal masking with Megatron's load balancing keeps half of the work.
    # FlashAttention applies attention dropout inside its kernels and regenerates the mask from the saved RNG
    # state in backward (Dao et al. 2022, arXiv 2205.14135, Algorithm 2): no kernel or bytes of its own.
    for ph in passes(rc("core_attn")):
        if t.use_flash_attn:
            rows.extend(_attention_rows(m, ph, b, heads, groups, s_local, s, d))
            if t.flash_attn_unpad:  # llm-foundry's flash_attn_fn: q, k, v unpadded and the output padded back
                rows.extend(unpad_rows(tokens, heads * d, groups * d, ph))
        else:
            rows.extend(unfused_attention(b * heads, s, d, m.attention_dropout > 0, ph, t.half_dtype,
                                             fusion == "fused"))
    v_dim = m.v_head_dim if m.multi_latent_attention else d
    linear(rows, "attn_out", tokens, h, heads * v_dim, dt, full)
    bias("attn_out", h)
    residual("attn_residual")
    # torchao's float8 TP: the gathers move FP8, cast on the sequence shard (flowsim.model.ops.float8_tp_casts)
    fp8_tp = t.fp8_tp_gather and dt == "fp8" and t.fp8_recipe in FP8_GATHER_RECIPES and sp and tp > 1
    gather = tokens * h * FP8_GATHER_BYTES_PER_ELEM if fp8_tp else None
    for ph in passes(full):
        _tp_comms(comms, tp, sp, act, ph, col, "attn_out", gather)

    # MLP block
    norm("post_attn_norm")
    mlp_col, mlp_row = "", ""
    if moe:
        moe_mlp_ops(cfg, rows, comms, tokens, dt, rc)
        if m.moe_shared_expert_intermediate_size:
            mlp_col = mlp_ops(rows, m, tokens, m.moe_shared_expert_intermediate_size // tp, dt,
                              rc("moe") or rc("shared_experts"), "shared_", fusion, t.fused_gate_up)
    else:
        mlp_col = mlp_ops(rows, m, tokens, f // tp, dt, rc("mlp"), fusion=fusion, fused_gate_up=t.fused_gate_up)
    if mlp_col:
        mlp_rc = rc("mlp") if not moe else rc("moe") or rc("shared_experts")
        mlp_row = "shared_fc2" if moe else "fc2"
        for ph in passes(mlp_rc):
            _tp_comms(comms, tp, sp, act, ph, mlp_col, mlp_row, gather)
    if fp8_tp:
        float8_tp_casts(rows, [c for c in (col, mlp_col) if c], [r for r in ("attn_out", mlp_row) if r], tp)
    residual("mlp_residual")

    if cp > 1:
        kv_chunk = 2 * b * s_local * groups * d * ACT_BYTES  # this GPU's K and V
        rec = ("recompute",) if rc("core_attn") else ()
        if t.cp_comm_type == "p2p":
            # Ring attention: each CP rank passes its K and V chunk around the ring (cp - 1 steps) in
            # forward, and K, V and their gradients in backward (Megatron-LM context parallelism, TE
            # AttnFuncWithCPAndKVP2P), beside the attention kernels of the previous step.
            for ph, size in (("fwd", kv_chunk), ("bwd", 2 * kv_chunk)) + tuple((r, kv_chunk) for r in rec):
                comms.append(comm("cp", "sendrecv", size, ph, overlap="attention", count=cp - 1))
        elif t.cp_comm_type == "torch":
            # PyTorch context parallelism (torch.distributed.tensor.experimental context_parallel, torchtitan; torch
            # 2.13 _context_parallel/_attention.py): K and V all-gathered once per pass (rotate_method ALL_GATHER,
            # waited for after the first round's SDPA, so beside the attention kernels); in backward gathered again
            # and the fp32 K/V gradients passed to the next rank every round (ALL_TO_ALL rotater: permute_tensor);
            # each round's output merged and each round's gradients accumulated in fp32 by eager kernels
            # (flowsim.model.fusion.torch_cp_bytes).
            for ph in ("fwd", "bwd") + rec:
                comms.append(comm("cp", "allgather", kv_chunk * cp, ph, overlap="attention"))
            comms.append(comm("cp", "sendrecv", kv_chunk * FP32_BYTES / ACT_BYTES, "bwd", overlap="attention",
                              count=cp))
            merge = torch_cp_bytes(cp, b * heads * s_local * d, b * groups * s_local * d)
            rows.extend(memory("cp_merge", merge.fwd, ph) for ph in ("fwd",) + rec)
            rows.append(memory("cp_merge.bwd", merge.bwd, "bwd"))
        else:
            # All-gather variant (TE AttnFuncWithCPAndKVAllGather): K and V of all CP ranks gathered before
            # attention; backward reduce-scatters their gradients.
            for ph in ("fwd",) + rec:
                comms.append(comm("cp", "allgather", kv_chunk * cp, ph))
            comms.append(comm("cp", "allgather", kv_chunk * cp, "bwd"))
            comms.append(comm("cp", "reducescatter", kv_chunk * cp, "bwd"))
    if recompute.policy(t) == "op":
        _op_sac_rows(rows, comms, m, tokens, heads, groups, d, f // tp, dt, tp, sp, act)
    if fsdp_copies_out(t):
        # FSDP2 copies each gathered layer out of the all-gather buffer into its weights on the compute stream,
        # after the forward's and the backward's gather (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py
        # foreach_all_gather_copy_out: torch.split_with_sizes_copy): read and write the 16-bit weights
        # (MixedPrecisionPolicy param_dtype bf16). The gradients' copy into the reduce-scatter buffer
        # (foreach_reduce: torch._chunk_cat) runs on the reduce-scatter stream, beside the compute.
        copy = 2 * ACT_BYTES * layer_params(cfg, moe)
        rows.extend((memory("fsdp_copy_out", copy, "fwd"), memory("fsdp_copy_out.bwd", copy, "bwd")))
    if t.tp_comm_overlap and sp and tp > 1:
        if t.tp_overlap_impl == "symm_mem":
            comms = symm_mem_tp(rows, comms, tp)
        split_pipelined_gemms(rows, comms, tp)
    return finish(rows, comms)


def fsdp_copies_out(t) -> bool:
    """Whether FSDP2 copies each layer's gathered weights out of its all-gather buffer on the compute stream
    (ZeRO-3 with FSDP2, sharded over more than one rank; :func:`build_layer`)."""
    return t.zero_stage >= 3 and t.fsdp_version == 2 and t.dp_shard > 1


def _op_sac_rows(rows, comms, m, tokens, heads, groups, d, width, dt, tp, sp, act) -> None:
    """Recompute rows of torchtitan's op-level policy (:mod:`flowsim.model.recompute`) for a dense layer: the
    recomputed projections as GEMMs of their own (their FP8 input casts too), every memory-bound forward op,
    and, with sequence-parallel tensor parallelism, the all-gathers of the layer's two inputs (torchtitan
    saves the outputs of reduce-scatters, not of all-gathers)."""
    h = m.hidden_size
    shapes = {"q": (heads * d, h), "k": (groups * d, h), "v": (groups * d, h), "o": (h, heads * d),
              "gate": (width, h), "up": (width, h), "down": (h, width)}
    for memory_row in [r for r in rows if r["phase"] == "fwd" and r["kind"] == "memory"]:
        rows.append(dict(memory_row, phase="recompute"))
    for name in recompute.op_sac_projections(m.gated, m.add_bias_linear):
        n_out, k_in = shapes[name]
        rows.append(gemm(f"{name}_proj", tokens, n_out, k_in, dt, "recompute"))
    if tp > 1 and sp:
        comms.append(comm("tp", "allgather", act, "recompute", count=2))


def mlp_ops(rows, m, tokens, width, dt, rerun, prefix="", fusion="fused", fused_gate_up=True) -> str:
    """GEMMs and activation of one MLP of local intermediate ``width`` over ``tokens`` tokens, with their
    forward again when ``rerun`` (``fusion``: the memory-bound kernel set, :mod:`flowsim.model.fusion`); a gated
    MLP's gate and up projections as one ``fc1`` GEMM of twice the width, or (``fused_gate_up`` False) as separate
    ``gate_proj`` and ``up_proj`` layers (:func:`flowsim.model.ops.split_linears`). Returns the name(s) of the
    column-parallel GEMM(s) (``+``-joined), which the sequence-parallel all-gather feeds."""
    fc1_out = (2 if m.gated else 1) * width
    if m.gated and not fused_gate_up:
        names = (f"{prefix}gate_proj", f"{prefix}up_proj")
        split_linears(rows, names, (width, width), tokens, m.hidden_size, dt, rerun, fusion)
        col = "+".join(names)
    else:
        linear(rows, f"{prefix}fc1", tokens, fc1_out, m.hidden_size, dt, rerun)
        col = f"{prefix}fc1"
    elementwise(rows, f"{prefix}activation", activation_step(m.activation), fusion, tokens * width, rerun)
    linear(rows, f"{prefix}fc2", tokens, m.hidden_size, width, dt, rerun)
    if m.add_bias_linear and fusion == "eager":
        elementwise(rows, f"{prefix}fc1.bias_grad", "bias_grad", fusion, tokens * fc1_out, False)
        elementwise(rows, f"{prefix}fc2.bias_grad", "bias_grad", fusion, tokens * m.hidden_size, False)
    return col


def _attention_rows(m, phase, b, heads, groups, s_q, s_k, d) -> list:
    """FlashAttention rows of one layer's attention, forward or backward (``phase``).

    Full causal attention over the sequence, or with a sliding window (``window_size`` ``w`` below the sequence)
    the layers' mix of full and windowed attention (:meth:`flowsim.config.ModelConfig.full_attention_share`) priced
    head by head, exact over the layers: that share of the heads runs full causal attention, the rest windowed
    attention as FlashAttention's block skipping runs it, the sequence cut into chunks of ``w`` queries each against
    the ``2 w`` keys of its own and the previous chunk (its masked corners computed too: FlashAttention's tile
    count when ``w`` is its 128-token block, an upper bound otherwise).
    """
    suffix = ".bwd" if phase == "bwd" else ""
    w = m.window_size
    share = m.full_attention_share() if w and w < s_k else 1.0
    full = round(heads * share)
    kv_full = max(round(groups * share), 1) if full else 0
    rows = [attention("attention" + suffix, b, full, kv_full, s_q, s_k, d, True, phase)] if full else []
    if heads > full:
        rows.append(attention("attention_window" + suffix, b * -(-s_q // w), heads - full, max(groups - kv_full, 1),
                              w, 2 * w, d, False, phase))
    return rows


def _mla_projections(rows, m, tokens, heads, dt, full, fusion) -> int:
    """DeepSeek-V2/V3 multi-head latent attention projections (local ``heads``); returns the head dim the
    attention kernel sees (mean of the QK and V head dims: same FLOPs as QK^T at qk dim plus PV at v dim).
    """
    h = m.hidden_size
    qk = m.qk_head_dim + m.qk_pos_emb_head_dim
    if m.q_lora_rank:
        linear(rows, "q_down", tokens, m.q_lora_rank, h, dt, full)
        linear(rows, "q_up", tokens, heads * qk, m.q_lora_rank, dt, full)
    else:
        linear(rows, "q_proj", tokens, heads * qk, h, dt, full)
    linear(rows, "kv_down", tokens, m.kv_lora_rank + m.qk_pos_emb_head_dim, h, dt, full)
    # the query and key-value latents are normalised before their up-projections (q_a_layernorm, kv_a_layernorm)
    elementwise(rows, "latent_norm", m.normalization, fusion, tokens * (m.q_lora_rank + m.kv_lora_rank), full)
    linear(rows, "kv_up", tokens, heads * (m.qk_head_dim + m.v_head_dim), m.kv_lora_rank, dt, full)
    return (qk + m.v_head_dim) // 2


def build_embedding(cfg: SimConfig) -> OpSet:
    """Word (and learned position) embedding lookup on the first stage, one micro-batch."""
    m, t = cfg.model, cfg.training
    tokens = cfg.microbatch_tokens
    tok_sp = tokens // t.tp if t.sequence_parallel else tokens
    h = m.hidden_size
    rows = [memory("embedding", tokens * h * ACT_BYTES * (2 if m.position_embedding == "learned" else 1), "fwd"),
            memory("embedding.bwd", tokens * h * ACT_BYTES * 2, "bwd")]
    comms = []
    if t.tp > 1:
        # Vocab-parallel embedding: partial lookups summed across TP (reduce-scatter with SP).
        op = "reducescatter" if t.sequence_parallel else "allreduce"
        comms.append(comm("tp", op, tokens * h * ACT_BYTES, "fwd"))
        if t.sequence_parallel:
            comms.append(comm("tp", "allgather", tokens * h * ACT_BYTES, "bwd"))
    if m.hidden_dropout > 0:
        rows.append(memory("embedding.dropout", tok_sp * h * (2 * ACT_BYTES + 1), "fwd"))
    return finish(rows, comms)


def build_head(cfg: SimConfig) -> OpSet:
    """Final norm, LM head GEMMs and vocab-parallel cross-entropy on the last stage, one micro-batch."""
    m, t = cfg.model, cfg.training
    tokens = cfg.microbatch_tokens
    tok_sp = tokens // t.tp if t.sequence_parallel else tokens
    h = m.hidden_size
    v_local = padded_vocab(cfg) // t.tp
    rows, comms = [], []
    for prefix in [""] + [f"mtp{j}_" for j in range(m.mtp_num_layers)]:
        if prefix:
            # multi-token prediction module (Megatron-LM MultiTokenPredictionLayer; its transformer layer is
            # one of the last stage's layers): the next tokens' embedding and the hidden states normalised,
            # their concatenation projected 2h -> h (column-parallel), then the shared output head below
            rows.append(memory(f"{prefix}embedding", tokens * h * ACT_BYTES, "fwd"))
            rows.append(memory(f"{prefix}embedding.bwd", tokens * h * ACT_BYTES * 2, "bwd"))
            for norm in ("enorm", "hnorm"):
                elementwise(rows, f"{prefix}{norm}", m.normalization, t.kernel_fusion, tok_sp * h, False)
            linear(rows, f"{prefix}eh_proj", tokens, h // t.tp, 2 * h, t.half_dtype, False)
            _head_tp_comms(comms, cfg, tokens, 2 * h, logits=False)
            if t.tp > 1:  # the projection's output gathered over TP (gather_from_tensor_model_parallel_region)
                comms.append(comm("tp", "allgather", tokens * h * ACT_BYTES, "fwd"))
        elementwise(rows, f"{prefix}final_norm", m.normalization, t.kernel_fusion, tok_sp * h, False)
        # The output layer runs in 16-bit even in FP8 and FP4 recipes (TE keeps the first and last layers in BF16).
        linear(rows, f"{prefix}lm_head", tokens, v_local, h, t.half_dtype, False)
        cross_entropy_rows(rows, f"{prefix}cross_entropy", cross_entropy_impl(t), tokens * v_local)
        _head_tp_comms(comms, cfg, tokens, h, logits=True)
    return finish(rows, comms)


def _head_tp_comms(comms, cfg, tokens, width, logits: bool) -> None:
    """Tensor-parallel collectives of a column-parallel projection of ``tokens`` inputs of ``width`` on the last
    stage: the sequence-parallel all-gather of its input (reduce-scatter of its gradient), else the
    all-reduce of the input gradient; ``logits``: the output head's three small fp32 all-reduces of the
    logits' max and sum-exp across the vocab shards."""
    t = cfg.training
    if t.tp == 1:
        return
    if t.sequence_parallel:
        comms.append(comm("tp", "allgather", tokens * width * ACT_BYTES, "fwd"))
        comms.append(comm("tp", "reducescatter", tokens * width * ACT_BYTES, "bwd"))
    else:
        comms.append(comm("tp", "allreduce", tokens * width * ACT_BYTES, "bwd"))
    if logits:
        comms.append(comm("tp", "allreduce", tokens * FP32_BYTES, "fwd", count=3))


# Workloads built, by (model, training) config: the blocks read nothing else (the cluster does not change them),
# and a Workload is immutable (frozen, read-only arrays), so configs that share both share one; 256 kept (a few MB).
_WORKLOADS = BoundedCache(256)

# Training fields that no block builder reads (build_layer, build_embedding, build_head and what they call): the
# pipeline split and schedule, the data-parallel size and batch, the gradient and optimizer sharding. Configs that
# differ only in these share their blocks and op table (a tune's layouts: 49,548 configs of gpt3-175b on 1,024
# GPUs, a few hundred distinct tables). What the ZeRO stage and the data-parallel size change in a layer is
# fsdp_copies_out, which the key holds. tests/test_block_key.py builds blocks both ways.
_BLOCK_FREE = frozenset({
    "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size", "data_parallel_size",
    "global_batch_size", "pipeline_schedule", "use_distributed_optimizer", "zero_stage", "overlap_grad_reduce",
    "overlap_param_gather", "bucket_size_bytes", "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split", "pipeline_layer_split", "comm_engine", "p2p_sync", "pipeline_engine",
    "optimizer_impl", "grad_reduce_dtype", "pipeline_model_parallel_layout"})
_BLOCK_VALUES = operator.attrgetter(*(f.name for f in dataclasses.fields(TrainingConfig) if f.name not in _BLOCK_FREE))
# Blocks (layer, MoE layer, embedding, head) and their op tables, by block_key; 1,024 kept (~30 KB each with the
# table's DataFrame; a tune of gpt3-175b on 1,024 GPUs has 504 keys).
_BLOCKS = BoundedCache(1024)
_OP_TABLES = BoundedCache(1024)


def block_key(cfg: SimConfig) -> tuple:
    """What a config's blocks are built from: the model, the training fields they read (all but
    ``_BLOCK_FREE``) and whether FSDP2 copies the gathered weights out (:func:`fsdp_copies_out`)."""
    t = cfg.training
    return (cfg.model, fsdp_copies_out(t)) + _BLOCK_VALUES(t)


def build_workload(cfg: SimConfig) -> Workload:
    """All per-micro-batch op tables and per-stage sizes for ``cfg`` (a validated SimConfig), built once per
    (model, training) pair and shared (treat it as read-only)."""
    return _WORKLOADS.get((cfg.model, cfg.training), lambda: _build_workload(cfg))


def _build_workload(cfg: SimConfig) -> Workload:
    t = cfg.training
    split = stage_split(cfg)
    tokens = cfg.microbatch_tokens
    p2p = tokens * cfg.model.hidden_size * ACT_BYTES / (t.tp if t.sequence_parallel else 1)
    is_moe = cfg.model.is_moe
    key = block_key(cfg)
    layer, moe_layer, embedding, head = _BLOCKS.get(key, lambda: build_blocks(cfg))
    return Workload(
        layer=layer,
        moe_layer=moe_layer,
        embedding=embedding,
        head=head,
        chunk_layers=split.chunk_layers,
        chunk_recompute_layers=split.chunk_recompute_layers,
        chunk_moe_layers=split.chunk_moe_layers,
        chunk_recompute_moe_layers=split.chunk_recompute_moe_layers,
        p2p_bytes=float(p2p),
        stage_params=split.stage_params,
        stage_expert_params=split.stage_expert_params,
        gemm_dtype=t.linear_dtype,
        block_key=key,
        expert_comm_sms=t.moe_deepep_num_sms if is_moe and t.moe_token_dispatcher_type == "flex" else 0,
    )


def build_blocks(cfg: SimConfig) -> tuple:
    """(layer, MoE layer or None, embedding, head) of ``cfg``, built from scratch (:func:`build_workload` shares
    them by :func:`block_key`)."""
    t = cfg.training

    def layer(moe=False):  # the FP8 recipe's quantisation kernels (quantize builds delayed scaling's)
        ops = build_layer(cfg, moe)
        return apply_fp8_recipe(ops, t.fp8_recipe) if t.linear_dtype == "fp8" and t.fp8_recipe != "delayed" else ops

    return layer(), layer(moe=True) if cfg.model.is_moe else None, build_embedding(cfg), build_head(cfg)


def model_flops_per_token(cfg: SimConfig) -> float:
    """Useful training FLOPs per token (forward + backward, no recompute), causal attention.

    ``6 * N`` for the GEMMs, where N counts every transformer weight matrix (for MoE layers the router, the
    shared experts and the ``topk`` routed experts a token visits) and the LM head (not the embedding
    lookup), each multi-token prediction module's layer, projection and output head too, plus
    ``6 * 2 * layers * seq * heads * head_dim / 2`` for the attention scores and their product with V (causal:
    half of the square is computed; MLA uses the mean of its QK and V head dims; MTP layers count as layers;
    sliding-window layers count the ``w + 1`` keys each query meets, fewer at the start of the sequence).
    """
    m = cfg.model
    mtp = m.mtp_num_layers
    layers = m.num_layers + mtp
    n_moe = m.moe_layer_count() + mtp * m.mtp_moe()
    dense_layers = layers - n_moe
    per_moe = (m.moe_router_topk * m.mlp_weights(m.moe_ffn_hidden_size)
               + m.mlp_weights(m.moe_shared_expert_intermediate_size) + m.hidden_size * m.num_moe_experts)
    weights = (layers * m.attention_weights() + dense_layers * m.mlp_weights(m.ffn_hidden_size)
               + n_moe * per_moe + (1 + mtp) * m.hidden_size * m.vocab_size + mtp * 2 * m.hidden_size ** 2)
    head_dim = (m.qk_head_dim + m.qk_pos_emb_head_dim + m.v_head_dim) / 2 if m.multi_latent_attention \
        else m.kv_channels
    s, w = cfg.seq_length, m.window_size
    pairs = s * 0.5  # key positions a token's query meets, causal
    if w and w < s:  # windowed layers: query i meets min(i + 1, w + 1) keys, averaged over the sequence
        windowed = (w + 1) * (s - w / 2.0) / s
        pairs = windowed + m.full_attention_share() * (pairs - windowed)  # the layers' mix of full and windowed
    attn = 2.0 * layers * pairs * m.num_attention_heads * head_dim
    return 6.0 * weights + 6.0 * attn
