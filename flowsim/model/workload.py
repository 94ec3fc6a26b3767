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

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pandas as pd

from flowsim.model import recompute
from flowsim.config import SimConfig
from flowsim.model.fusion import ACT_BYTES, FP32_BYTES, activation_step, traffic
from flowsim.step.schedule import end_chunks
from flowsim.units import DTYPE_BYTES

# Transformer Engine FP8 recipe (TE docs, "Using FP8 with Transformer Engine"): the input of every FP8
# GEMM is cast (read 2-byte, write 1-byte) and, for the weight-gradient GEMM on Hopper, transposed (read
# and write 1-byte); the output gradient likewise in backward. Weights are cast once per optimizer step.
FP8_CAST_BYTES_PER_ELEM = ACT_BYTES + 1
FP8_TRANSPOSE_BYTES_PER_ELEM = 2

# Adam step with fp32 master weights (Megatron-LM mixed precision): per parameter read fp32 grad (4),
# read+write fp32 master (8), m (8) and v (8), write the 16-bit copy (2) = 30 bytes; zeroing the fp32
# gradient buffer writes 4 more.
ADAM_BYTES_PER_PARAM = 4 + 8 + 8 + 8 + 2 + 4


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
    """Compute (an op table) and communication (CommOp tuples) of one block, one micro-batch, one GPU."""

    compute: pd.DataFrame
    comms: tuple


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
        Transformer layers of model chunk ``c`` on pipeline stage ``s`` (see :func:`chunk_layer_counts`).
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
        Dtype of the GEMMs (``fp8`` runs the linear layers in FP8, everything else in 16-bit).
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


def _gemm(name, m, n, k, dtype, phase, count=1):
    flops = 2.0 * m * n * k
    eb = DTYPE_BYTES[dtype]
    return dict(name=name, kind="gemm", dtype=dtype, m=m, n=n, k=k, batch=1, flops=flops,
                bytes=eb * (m * k + k * n) + ACT_BYTES * m * n, phase=phase, count=count)


def _linear(rows, name, tokens, n_out, k_in, dtype, recompute):
    """Forward, input-gradient and weight-gradient GEMMs of ``Y[tokens, n_out] = X[tokens, k_in] W``."""
    rows.append(_gemm(f"{name}", tokens, n_out, k_in, dtype, "fwd"))
    rows.append(_gemm(f"{name}.dgrad", tokens, k_in, n_out, dtype, "bwd"))
    rows.append(_gemm(f"{name}.wgrad", k_in, n_out, tokens, dtype, "bwd"))
    if recompute:
        rows.append(_gemm(f"{name}", tokens, n_out, k_in, dtype, "recompute"))
    if dtype == "fp8":
        rows.append(_memory(f"{name}.cast_in", tokens * k_in * FP8_CAST_BYTES_PER_ELEM, "fwd"))
        rows.append(_memory(f"{name}.cast_grad", tokens * n_out * FP8_CAST_BYTES_PER_ELEM, "bwd"))
        rows.append(_memory(f"{name}.transpose", (tokens * k_in + tokens * n_out) * FP8_TRANSPOSE_BYTES_PER_ELEM,
                            "bwd"))
        if recompute:
            rows.append(_memory(f"{name}.cast_in", tokens * k_in * FP8_CAST_BYTES_PER_ELEM, "recompute"))


def _memory(name, nbytes, phase, count=1, flops=0.0):
    return dict(name=name, kind="memory", dtype="bf16", flops=flops, bytes=float(nbytes), phase=phase, count=count)


def _elementwise(rows, name, step, fusion, elems, recompute):
    """Rows of a memory-bound layer step (see :mod:`flowsim.model.fusion`) over ``elems`` tensor elements:
    forward, backward and, with ``recompute``, the forward again. Steps that move nothing add no row."""
    tr = traffic(step, fusion)
    for phase, per in (("fwd", tr.fwd), ("bwd", tr.bwd)) + ((("recompute", tr.fwd),) if recompute else ()):
        if per:
            rows.append(_memory(name + (".bwd" if phase == "bwd" else ""), elems * per, phase))


def _attention(name, batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, phase):
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


def _batched_gemm(name, batch, m, n, k, phase):
    row = _gemm(name, m, n, k, "bf16", phase)
    row.update(batch=batch, flops=row["flops"] * batch, bytes=row["bytes"] * batch)
    return row


def _unfused_attention(bh, s, d, dropout, phase):
    """Megatron-LM's core attention without FlashAttention, for ``bh`` (batch x local heads) heads.

    Forward: scores = Q K^T (batched GEMM, the full square), fused scale-mask-softmax (read and write the
    2-byte scores), optional dropout (read, write, 1-byte mask), context = P V. Backward: the two GEMMs'
    input gradients (four batched GEMMs), dropout and softmax backward (read probabilities and gradient,
    write gradient).
    """
    sq = float(bh) * s * s  # score elements
    drop_fwd = sq * (2 * ACT_BYTES + 1) if dropout else 0.0
    if phase == "bwd":
        rows = [_batched_gemm("attn_scores.dgrad_q", bh, s, d, s, phase),
                _batched_gemm("attn_scores.dgrad_k", bh, s, d, s, phase),
                _batched_gemm("attn_context.dgrad_p", bh, s, s, d, phase),
                _batched_gemm("attn_context.dgrad_v", bh, s, d, s, phase),
                _memory("softmax.bwd", sq * 3 * ACT_BYTES, phase)]
        if dropout:
            rows.append(_memory("attn_dropout.bwd", sq * (2 * ACT_BYTES + 1), phase))
        return rows
    rows = [_batched_gemm("attn_scores", bh, s, s, d, phase),
            _memory("softmax", sq * 2 * ACT_BYTES, phase),
            _batched_gemm("attn_context", bh, s, d, s, phase)]
    if dropout:
        rows.append(_memory("attn_dropout", drop_fwd, phase))
    return rows


def _comm(group, op, size_bytes, phase, overlap="none", count=1):
    return CommOp(group, op, float(size_bytes), phase, overlap, count)


_COMPUTE_COLUMNS = ["name", "kind", "dtype", "m", "n", "k", "batch", "heads", "kv_heads", "seq_q", "seq_k",
                    "head_dim", "causal", "flops", "bytes", "phase", "count"]
_INT_COLUMNS = ("m", "n", "k", "batch", "heads", "kv_heads", "seq_q", "seq_k", "head_dim", "count")


def _finish(rows, comms) -> OpSet:
    cols = {}
    for c in _COMPUTE_COLUMNS:
        if c in _INT_COLUMNS:
            cols[c] = np.array([r.get(c, 0) for r in rows], dtype=np.int64)
        elif c == "causal":
            cols[c] = np.array([bool(r.get(c, False)) for r in rows])
        elif c in ("flops", "bytes"):
            cols[c] = np.array([r[c] for r in rows], dtype=np.float64)
        else:
            cols[c] = [r[c] for r in rows]
    return OpSet(compute=pd.DataFrame(cols), comms=tuple(comms))


def _tp_comms(comms, tp, sp, act_bytes, phase):
    """Collectives around one column-parallel -> row-parallel pair (attention or MLP), one direction."""
    if tp == 1:
        return
    if sp:
        if phase in ("fwd", "recompute"):
            comms.append(_comm("tp", "allgather", act_bytes, phase))      # gather the sequence shards
            comms.append(_comm("tp", "reducescatter", act_bytes, phase))  # row-parallel output
        else:
            comms.append(_comm("tp", "allgather", act_bytes, "bwd"))       # grad of row-parallel output
            comms.append(_comm("tp", "reducescatter", act_bytes, "bwd"))   # grad of column-parallel input
            comms.append(_comm("tp", "allgather", act_bytes, "bwd", overlap="dgrad"))  # saved input for wgrad
    else:
        comms.append(_comm("tp", "allreduce", act_bytes, phase))


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
    tokens = b * s_local                     # tokens entering this GPU's layer per micro-batch
    tok_sp = tokens // tp if sp else tokens  # tokens for norms/dropout/residual
    h, d, f = m.hidden_size, m.kv_channels, m.ffn_hidden_size
    heads, groups = m.num_attention_heads // tp, max(m.num_query_groups // tp, 1)
    dt = "fp8" if t.precision == "fp8" else "bf16"
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
        _elementwise(rows, name, m.normalization, fusion, tok_sp * h, rc("layernorm"))

    def residual(name):
        _elementwise(rows, name, "dropout_residual" if dropout else "residual", fusion, tok_sp * h, full)

    def bias(name, width):
        if bias_grad:
            _elementwise(rows, f"{name}.bias_grad", "bias_grad", fusion, tokens * width, False)

    # attention block
    norm("input_norm")
    if m.multi_latent_attention:
        d = _mla_projections(rows, m, tokens, heads, dt, full)
        groups = heads
    else:
        qkv_out = (heads + 2 * groups) * d
        _linear(rows, "qkv", tokens, qkv_out, h, dt, full)
        bias("qkv", qkv_out)
        _elementwise(rows, "qkv_grad_pack", "qkv_grad_pack", fusion, tokens * qkv_out, False)
    rope_heads = (heads + groups) * d if not m.multi_latent_attention else (heads + 1) * m.qk_pos_emb_head_dim
    if m.position_embedding == "rope":
        _elementwise(rows, "rope", "rope", fusion, tokens * rope_heads, full)
    # Context parallelism: this GPU's s/cp queries attend to all s keys (ring attention, KV chunks
    # exchanged between CP ranks); causal masking with Megatron's load balancing keeps half of the work.
    for ph in passes(rc("core_attn")):
        if t.use_flash_attn:
            rows.append(_attention("attention" + (".bwd" if ph == "bwd" else ""), b, heads, groups, s_local, s, d,
                                   True, ph))
        else:
            rows.extend(_unfused_attention(b * heads, s, d, m.hidden_dropout > 0, ph))
    v_dim = m.v_head_dim if m.multi_latent_attention else d
    _linear(rows, "attn_out", tokens, h, heads * v_dim, dt, full)
    bias("attn_out", h)
    residual("attn_residual")
    for ph in passes(full):
        _tp_comms(comms, tp, sp, act, ph)

    # MLP block
    norm("post_attn_norm")
    if moe:
        from flowsim.model.moe import moe_mlp_ops

        moe_mlp_ops(cfg, rows, comms, tokens, dt, rc)
        if m.moe_shared_expert_intermediate_size:
            mlp_ops(rows, m, tokens, m.moe_shared_expert_intermediate_size // tp, dt,
                    rc("moe") or rc("shared_experts"), "shared_", fusion)
    else:
        mlp_ops(rows, m, tokens, f // tp, dt, rc("mlp"), fusion=fusion)
    if not moe or m.moe_shared_expert_intermediate_size:
        mlp_rc = rc("mlp") if not moe else rc("moe") or rc("shared_experts")
        for ph in passes(mlp_rc):
            _tp_comms(comms, tp, sp, act, ph)
    residual("mlp_residual")

    if cp > 1:
        kv_chunk = 2 * b * s_local * groups * d * ACT_BYTES  # this GPU's K and V
        rec = ("recompute",) if rc("core_attn") else ()
        if t.cp_comm_type == "p2p":
            # Ring attention: each CP rank passes its K and V chunk around the ring (cp - 1 steps) in
            # forward, and K, V and their gradients in backward (Megatron-LM context parallelism, TE
            # AttnFuncWithCPAndKVP2P), beside the attention kernels of the previous step.
            for ph, size in (("fwd", kv_chunk), ("bwd", 2 * kv_chunk)) + tuple((r, kv_chunk) for r in rec):
                comms.append(_comm("cp", "sendrecv", size, ph, overlap="attention", count=cp - 1))
        else:
            # All-gather variant (TE AttnFuncWithCPAndKVAllGather): K and V of all CP ranks gathered before
            # attention; backward reduce-scatters their gradients.
            for ph in ("fwd",) + rec:
                comms.append(_comm("cp", "allgather", kv_chunk * cp, ph))
            comms.append(_comm("cp", "allgather", kv_chunk * cp, "bwd"))
            comms.append(_comm("cp", "reducescatter", kv_chunk * cp, "bwd"))
    if recompute.policy(t) == "op":
        _op_sac_rows(rows, comms, m, tokens, heads, groups, d, f // tp, dt, tp, sp, act)
    return _finish(rows, comms)


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
        rows.append(_gemm(f"{name}_proj", tokens, n_out, k_in, dt, "recompute"))
    if tp > 1 and sp:
        comms.append(_comm("tp", "allgather", act, "recompute", count=2))


def mlp_ops(rows, m, tokens, width, dt, rerun, prefix="", fusion="fused"):
    """GEMMs and activation of one MLP of local intermediate ``width`` over ``tokens`` tokens, with their
    forward again when ``rerun`` (``fusion``: the memory-bound kernel set, :mod:`flowsim.model.fusion`)."""
    fc1_out = (2 if m.gated else 1) * width
    _linear(rows, f"{prefix}fc1", tokens, fc1_out, m.hidden_size, dt, rerun)
    _elementwise(rows, f"{prefix}activation", activation_step(m.activation), fusion, tokens * width, rerun)
    _linear(rows, f"{prefix}fc2", tokens, m.hidden_size, width, dt, rerun)
    if m.add_bias_linear and fusion == "eager":
        _elementwise(rows, f"{prefix}fc1.bias_grad", "bias_grad", fusion, tokens * fc1_out, False)
        _elementwise(rows, f"{prefix}fc2.bias_grad", "bias_grad", fusion, tokens * m.hidden_size, False)


def _mla_projections(rows, m, tokens, heads, dt, full) -> int:
    """DeepSeek-V2/V3 multi-head latent attention projections (local ``heads``); returns the head dim the
    attention kernel sees (mean of the QK and V head dims: same FLOPs as QK^T at qk dim plus PV at v dim).
    """
    h = m.hidden_size
    qk = m.qk_head_dim + m.qk_pos_emb_head_dim
    if m.q_lora_rank:
        _linear(rows, "q_down", tokens, m.q_lora_rank, h, dt, full)
        _linear(rows, "q_up", tokens, heads * qk, m.q_lora_rank, dt, full)
    else:
        _linear(rows, "q_proj", tokens, heads * qk, h, dt, full)
    _linear(rows, "kv_down", tokens, m.kv_lora_rank + m.qk_pos_emb_head_dim, h, dt, full)
    _linear(rows, "kv_up", tokens, heads * (m.qk_head_dim + m.v_head_dim), m.kv_lora_rank, dt, full)
    return (qk + m.v_head_dim) // 2


def build_embedding(cfg: SimConfig) -> OpSet:
    """Word (and learned position) embedding lookup on the first stage, one micro-batch."""
    m, t = cfg.model, cfg.training
    tokens = t.micro_batch_size * cfg.seq_length // t.cp
    tok_sp = tokens // t.tp if t.sequence_parallel else tokens
    h = m.hidden_size
    rows = [_memory("embedding", tokens * h * ACT_BYTES * (2 if m.position_embedding == "learned" else 1), "fwd"),
            _memory("embedding.bwd", tokens * h * ACT_BYTES * 2, "bwd")]
    comms = []
    if t.tp > 1:
        # Vocab-parallel embedding: partial lookups summed across TP (reduce-scatter with SP).
        op = "reducescatter" if t.sequence_parallel else "allreduce"
        comms.append(_comm("tp", op, tokens * h * ACT_BYTES, "fwd"))
        if t.sequence_parallel:
            comms.append(_comm("tp", "allgather", tokens * h * ACT_BYTES, "bwd"))
    if m.hidden_dropout > 0:
        rows.append(_memory("embedding.dropout", tok_sp * h * (2 * ACT_BYTES + 1), "fwd"))
    return _finish(rows, comms)


def padded_vocab(cfg: SimConfig) -> int:
    """Vocabulary padded to a multiple of 128 x tp, as Megatron-LM's ``make_vocab_size_divisible_by``."""
    mult = 128 * cfg.training.tp
    return -(-cfg.model.vocab_size // mult) * mult


def build_head(cfg: SimConfig) -> OpSet:
    """Final norm, LM head GEMMs and vocab-parallel cross-entropy on the last stage, one micro-batch."""
    m, t = cfg.model, cfg.training
    tokens = t.micro_batch_size * cfg.seq_length // t.cp
    tok_sp = tokens // t.tp if t.sequence_parallel else tokens
    h = m.hidden_size
    v_local = padded_vocab(cfg) // t.tp
    rows = []
    _elementwise(rows, "final_norm", m.normalization, t.kernel_fusion, tok_sp * h, False)
    # The output layer runs in 16-bit even in FP8 recipes (TE keeps the first and last layers in BF16).
    _linear(rows, "lm_head", tokens, v_local, h, "bf16", False)
    _elementwise(rows, "cross_entropy", "cross_entropy", t.kernel_fusion, tokens * v_local, False)
    comms = []
    if t.tp > 1:
        if t.sequence_parallel:
            comms.append(_comm("tp", "allgather", tokens * h * ACT_BYTES, "fwd"))
            comms.append(_comm("tp", "reducescatter", tokens * h * ACT_BYTES, "bwd"))
        else:
            comms.append(_comm("tp", "allreduce", tokens * h * ACT_BYTES, "bwd"))
        # max and sum-exp of the logits across the vocab shards: three small fp32 all-reduces
        comms.append(_comm("tp", "allreduce", tokens * FP32_BYTES, "fwd", count=3))
    return _finish(rows, comms)


def layer_params(cfg: SimConfig, moe: bool = False) -> float:
    """Parameters of one transformer layer held by one GPU, routed experts excluded (see
    :func:`flowsim.model.moe.expert_params_per_gpu`): TP-sharded weights plus replicated norms and router."""
    m, tp = cfg.model, cfg.training.tp
    h, d, f = m.hidden_size, m.kv_channels, m.ffn_hidden_size
    a, g = m.num_attention_heads, m.num_query_groups
    if moe:
        sharded = m.attention_weights() + m.mlp_weights(m.moe_shared_expert_intermediate_size)
        replicated = h * m.num_moe_experts  # router
    else:
        sharded = m.attention_weights() + m.mlp_weights(f)
        replicated = 0
    if m.add_bias_linear:
        sharded += d * (a + 2 * g) + f * (2 if m.gated else 1)
    replicated += 2 * h * (2 if m.normalization == "layernorm" else 1) + (2 * h if m.add_bias_linear else 0)
    return sharded / tp + replicated


def chunk_layer_counts(cfg: SimConfig, with_moe: bool = False):
    """Transformer layers per (pipeline stage, model chunk), int64[p, v] (and, ``with_moe``, how many of
    them are MoE layers, same shape).

    Virtual stage ``k = c * p + s`` (Megatron-LM's interleaved assignment) holds layers in order. With
    ``account_for_embedding_in_pipeline_split`` (``..._loss_...``) the embedding (loss) counts as one
    layer of virtual stage 0 (the last). ``balanced`` gives the remainder layers one each to the virtual
    stages after the first. DualPipe (DeepSeek-V3 report sec. 3.2.1) splits the model into ``p`` stages
    and gives stage ``s`` two chunks: model stage ``s`` (chunk 0, the pipeline fed at stage 0) and model
    stage ``p - 1 - s`` (chunk 1, the pipeline fed at stage ``p - 1``), so each GPU holds two stages'
    layers.
    """
    t = cfg.training
    p, v = t.pp, t.vpp
    k = p * v
    e = int(t.account_for_embedding_in_pipeline_split)
    lo = int(t.account_for_loss_in_pipeline_split)
    total = cfg.model.num_layers + e + lo
    per = np.full(k, total // k, dtype=np.int64)
    rem = total % k
    per[1:1 + rem] += 1
    if rem > k - 1:  # only with one virtual stage
        per[0] += rem - (k - 1)
    per[0] -= e
    per[-1] -= lo
    counts = np.zeros((p, v), dtype=np.int64)
    moe = np.zeros((p, v), dtype=np.int64)
    start = 0
    for idx in range(k):
        counts[idx % p, idx // p] = per[idx]
        moe[idx % p, idx // p] = sum(cfg.model.moe_layer(i) for i in range(start, start + per[idx]))
        start += per[idx]
    if t.schedule == "dualpipe":
        counts, moe = np.hstack([counts, counts[::-1]]), np.hstack([moe, moe[::-1]])
    return (counts, moe) if with_moe else counts


def stage_params(cfg: SimConfig, chunk_layers: np.ndarray, moe_layers: np.ndarray | None = None) -> tuple:
    """Parameters held by one GPU of each pipeline stage, routed experts excluded (TP-sharded, before ZeRO
    sharding)."""
    m, t = cfg.model, cfg.training
    h, v = m.hidden_size, padded_vocab(cfg)
    moe_layers = np.zeros_like(chunk_layers) if moe_layers is None else moe_layers
    # stages holding the embedding and the LM head (DualPipe's two paths put both on each end rank)
    first, last = ({sc for sc, _ in ends} for ends in end_chunks(t.schedule, t.pp, t.vpp))
    out = []
    for s in range(t.pp):
        n_moe = int(moe_layers[s].sum())
        n = (int(chunk_layers[s].sum()) - n_moe) * layer_params(cfg) + n_moe * layer_params(cfg, moe=True)
        if s in first:
            n += v * h / t.tp + (cfg.seq_length * h if m.position_embedding == "learned" else 0)
        if s in last:
            n += h * (2 if m.normalization == "layernorm" else 1)
            if m.untie_embeddings_and_output_weights or t.pp > 1:
                # a tied head on another stage keeps its own copy of the word embedding (Megatron-LM)
                n += v * h / t.tp
        out.append(float(n))
    return tuple(out)


def build_workload(cfg: SimConfig) -> Workload:
    """All per-micro-batch op tables and per-stage sizes for ``cfg`` (a validated SimConfig)."""
    from flowsim.model.moe import expert_params_per_gpu

    t = cfg.training
    layers, moe = chunk_layer_counts(cfg, with_moe=True)
    rec = recompute.recompute_layer_counts(t, layers)
    # recomputed layers split between the kinds in proportion (layers of a chunk are recomputed in order)
    rec_moe = np.where(layers > 0, np.rint(rec * moe / np.maximum(layers, 1)), 0).astype(np.int64)
    tokens = t.micro_batch_size * cfg.seq_length // t.cp
    p2p = tokens * cfg.model.hidden_size * ACT_BYTES / (t.tp if t.sequence_parallel else 1)
    is_moe = cfg.model.is_moe
    return Workload(
        layer=build_layer(cfg),
        moe_layer=build_layer(cfg, moe=True) if is_moe else None,
        embedding=build_embedding(cfg),
        head=build_head(cfg),
        chunk_layers=layers,
        chunk_recompute_layers=rec,
        chunk_moe_layers=moe,
        chunk_recompute_moe_layers=rec_moe,
        p2p_bytes=float(p2p),
        stage_params=stage_params(cfg, layers, moe),
        stage_expert_params=tuple(float(moe[s].sum()) * (expert_params_per_gpu(cfg) if is_moe else 0.0)
                                  for s in range(t.pp)),
        gemm_dtype="fp8" if t.precision == "fp8" else "bf16",
    )


def model_flops_per_token(cfg: SimConfig) -> float:
    """Useful training FLOPs per token (forward + backward, no recompute), causal attention.

    ``6 * N`` for the GEMMs, where N counts every transformer weight matrix (for MoE layers the router, the
    shared experts and the ``topk`` routed experts a token visits) and the LM head (not the embedding
    lookup), plus ``6 * 2 * layers * seq * heads * head_dim / 2`` for the attention scores and their
    product with V (causal: half of the square is computed; MLA uses the mean of its QK and V head dims).
    """
    m = cfg.model
    n_moe = m.moe_layer_count()
    dense_layers = m.num_layers - n_moe
    per_moe = (m.moe_router_topk * m.mlp_weights(m.moe_ffn_hidden_size)
               + m.mlp_weights(m.moe_shared_expert_intermediate_size) + m.hidden_size * m.num_moe_experts)
    weights = (m.num_layers * m.attention_weights() + dense_layers * m.mlp_weights(m.ffn_hidden_size)
               + n_moe * per_moe + m.hidden_size * m.vocab_size)
    head_dim = (m.qk_head_dim + m.qk_pos_emb_head_dim + m.v_head_dim) / 2 if m.multi_latent_attention \
        else m.kv_channels
    attention = 2.0 * m.num_layers * cfg.seq_length * m.num_attention_heads * head_dim * 0.5
    return 6.0 * weights + 6.0 * attention
