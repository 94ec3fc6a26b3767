"""Routed-expert (mixture-of-experts) MLP blocks: router, token dispatch, grouped expert GEMMs, combine.

Follows Megatron-LM's MoE layer (``core/transformer/moe``) with its all-to-all or all-gather token dispatcher
(``moe_token_dispatcher_type``): each GPU routes its own tokens (the sequence shard with sequence
parallelism), the dispatcher brings every token to the GPUs holding its experts, each GPU runs its
``E / ep`` local experts as one grouped GEMM per projection, and the outputs go back the same way, which
the backward pass mirrors. Routing is taken as balanced (every expert receives ``tokens * topk / E`` of each
rank's tokens); a capacity factor caps these counts, and padding to capacity fixes them
(:func:`expert_tokens`).

Expert tensor parallelism (``etp`` > 1) splits each expert's width over ``etp`` GPUs. With the all-to-all
dispatcher each GPU first exchanges its routed tokens inside the expert-parallel group, then all-gathers the
received tokens over the expert tensor-parallel group (every ETP rank runs its slice of the expert on all of
them) and reduce-scatters the partial outputs back before the return all-to-all (Megatron-LM
``MoEAlltoAllTokenDispatcher``: ``gather_from_sequence_parallel_region`` / ``reduce_scatter_to_sequence_
parallel_region`` on the expert tensor-parallel group). An expert thus sees ``ep * etp`` ranks' tokens at
``1 / etp`` of its width: the expert FLOPs per GPU do not depend on ``etp``.

Expert-parallel ranks follow Megatron-LM's expert rank generator (order ``tp-ep-dp-pp`` with the expert
tensor-parallel size as ``tp``): an expert-parallel group is ``ep`` consecutive GPUs when
``expert_tensor_parallel_size`` is 1.
"""
from __future__ import annotations

import math

from flowsim.config import SimConfig
from flowsim.model.fusion import ACT_BYTES, activation_step
from flowsim.model.ops import comm, elementwise, gemm, linear, memory

ROUTER_BYTES_PER_SCORE = 4 + 4  # fp32 logits written, then read by the softmax / top-k


def _ep_tokens(cfg: SimConfig, tokens: int) -> int:
    """Tokens one GPU routes: its sequence shard with sequence parallelism, else all its tokens."""
    t = cfg.training
    return tokens // t.tp if t.sequence_parallel else tokens


def dispatch_group_size(cfg: SimConfig) -> int:
    """Ranks whose tokens meet at one GPU's experts: the expert-tensor x expert-parallel group (Megatron-LM
    ``tp_ep_group``), gathered at once by ``allgather``, by the all-to-all over ``ep`` and then the
    all-gather over ``etp`` otherwise."""
    t = cfg.training
    return t.ep * t.expert_tensor_parallel_size


def expert_tokens(cfg: SimConfig, tokens: int) -> tuple[float, int]:
    """(token, expert) pairs one GPU routes out of ``tokens`` (its share of the micro-batch), and the tokens
    each of its local experts processes, under balanced routing and the capacity rule.

    Balanced routing sends each expert ``tokens * topk / E`` of a rank's tokens. With a capacity factor
    ``c`` an expert takes at most ``ceil(tokens * topk / E * c)`` of them (Megatron-LM
    ``moe_utils.get_capacity`` on ``num_tokens * topk``), exactly that many when padded to capacity. An
    expert receives from every rank of the dispatch group (:func:`dispatch_group_size`).
    """
    m = cfg.model
    tok = _ep_tokens(cfg, tokens)
    load = tok * m.moe_router_topk / m.num_moe_experts
    cf = m.moe_expert_capacity_factor
    if cf:
        cap = math.ceil(load * cf)
        load = float(cap) if m.moe_pad_expert_input_to_capacity else min(load, cap)
    return load * m.num_moe_experts, max(int(load * dispatch_group_size(cfg)), 1)


def moe_mlp_ops(cfg: SimConfig, rows: list, comms: list, tokens: int, dt: str, recomputes) -> None:
    """Append the compute rows and collectives of one MoE MLP for one micro-batch on one GPU.

    Parameters
    ----------
    cfg : SimConfig
        The job (model MoE fields, ``ep``, ``expert_tensor_parallel_size``, the token dispatcher).
    rows, comms : list
        Op rows and :class:`flowsim.model.ops.CommOp` tuples to extend.
    tokens : int
        Tokens entering the layer on this GPU (micro-batch x sequence / cp).
    dt : str
        GEMM dtype.
    recomputes : callable
        ``recomputes(module) -> bool`` for Megatron-core submodule names (:func:`flowsim.model.recompute.recomputes`
        bound to the config): ``moe`` re-runs the whole block in backward, ``moe_act`` the expert activation.

    Notes
    -----
    ``alltoall``: the GPU permutes its routed tokens by expert, sends them with an all-to-all over the
    expert-parallel group and gets its experts' outputs back with a second one. ``allgather``
    (``MoEAllGatherTokenDispatcher``): an all-gather of the hidden states over the dispatch group before the
    experts and a reduce-scatter of their outputs after (swapped in backward); the GPU permutes only the
    gathered tokens routed to its own experts. The routing map and probabilities gathered beside the hidden
    states (``tokens x E`` entries) are left out.
    """
    m, t = cfg.model, cfg.training
    h, e = m.hidden_size, m.num_moe_experts
    ep, etp = t.ep, t.expert_tensor_parallel_size
    tok = _ep_tokens(cfg, tokens)
    routed, per_expert = expert_tokens(cfg, tokens)  # pairs this GPU routes; tokens per local expert
    local = e // ep                        # experts on this GPU
    width = m.moe_ffn_hidden_size // etp
    fc1_out = (2 if m.gated else 1) * width
    full = recomputes("moe")
    phases = ("fwd", "bwd") + (("recompute",) if full else ())
    gather = t.moe_token_dispatcher_type == "allgather"
    group = dispatch_group_size(cfg)
    moved = local * per_expert if gather else routed  # hidden vectors this GPU permutes and unpermutes

    linear(rows, "router", tok, e, h, "bf16", full)
    for ph in phases:
        rows.append(memory("router_topk" + (".bwd" if ph == "bwd" else ""), tok * e * ROUTER_BYTES_PER_SCORE, ph))
        # permute before dispatch and unpermute after combine: read and write every routed hidden vector
        rows.append(memory("permute" + (".bwd" if ph == "bwd" else ""), 2 * moved * h * ACT_BYTES, ph))
        rows.append(memory("unpermute" + (".bwd" if ph == "bwd" else ""), 2 * moved * h * ACT_BYTES, ph))
        if gather and group > 1:
            size = group * tok * h * ACT_BYTES  # the gathered [tokens of the group, h] tensor
            comms.append(comm("tpep", "allgather", size, ph))      # dispatch (forward) / combine gradient
            comms.append(comm("tpep", "reducescatter", size, ph))  # combine (forward) / dispatch gradient
        elif not gather:
            a2a = routed * h * ACT_BYTES  # nccl-tests size: all bytes one rank sends (itself included)
            if ep > 1:
                comms.append(comm("ep", "alltoall", a2a, ph))  # dispatch (forward) / combine gradient
                comms.append(comm("ep", "alltoall", a2a, ph))  # combine (forward) / dispatch gradient
            if etp > 1:
                # the received tokens gathered over ETP before the experts, their outputs reduce-scattered back
                size = local * per_expert * h * ACT_BYTES  # the gathered [tokens of the ETP group, h] tensor
                comms.append(comm("etp", "allgather", size, ph))
                comms.append(comm("etp", "reducescatter", size, ph))

    def grouped(name, mm, nn, kk, phase):
        row = gemm(name, mm, nn, kk, dt, phase)
        row.update(batch=local, flops=row["flops"] * local, bytes=row["bytes"] * local)
        rows.append(row)

    for ph in ("fwd",) + (("recompute",) if full else ()):
        grouped("expert_fc1", per_expert, fc1_out, h, ph)
        grouped("expert_fc2", per_expert, h, width, ph)
    grouped("expert_fc1.dgrad", per_expert, h, fc1_out, "bwd")
    grouped("expert_fc1.wgrad", h, fc1_out, per_expert, "bwd")
    grouped("expert_fc2.dgrad", per_expert, width, h, "bwd")
    grouped("expert_fc2.wgrad", width, h, per_expert, "bwd")
    elementwise(rows, "expert_activation", activation_step(m.activation), t.kernel_fusion,
                local * per_expert * width, full or recomputes("moe_act"))


def expert_params_per_gpu(cfg: SimConfig) -> float:
    """Routed-expert parameters of one MoE layer held by one GPU (its ``E / ep`` experts, ETP-sharded)."""
    m, t = cfg.model, cfg.training
    return (m.num_moe_experts // t.ep) * m.mlp_weights(m.moe_ffn_hidden_size) / t.expert_tensor_parallel_size
