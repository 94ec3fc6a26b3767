"""Routed-expert (mixture-of-experts) MLP blocks: router, token dispatch, grouped expert GEMMs, combine.

Follows Megatron-LM's MoE layer (``core/transformer/moe``) with its all-to-all, all-gather or flex (DeepEP,
HybridEP) token dispatcher (``moe_token_dispatcher_type``): each GPU routes its own tokens (the sequence shard
with sequence parallelism), the dispatcher brings every token to the GPUs holding its experts, each GPU runs
its ``E / ep`` local experts as one grouped GEMM per projection, and the outputs go back the same way, which
the backward pass mirrors.

A grouped GEMM is one GEMM launch per local expert, each tiled and wave-quantised on its own: Megatron-core's
``TEGroupedMLP`` (megatron-core 0.15.0 ``transformer/moe/experts.py``) runs Transformer Engine's
``GroupedLinear``, whose ``general_grouped_gemm`` has only the multi-stream cuBLAS backend (one cuBLAS GEMM per
expert, spread over TE's compute streams; TE 2.8 ``csrc/extensions/gemm.cpp`` ``te_general_grouped_gemm``: "For
now, we only have multi-stream cublas backend"). Few tokens per expert thus give each launch few output tiles
and a poorly filled last wave, and every expert pays its own launch latency and host issue time. Launches of
different streams running side by side (which can fill part of a launch's last wave with the next one's tiles)
are not modelled: an upper bound of at most one wave per launch.

Every expert receives ``tokens * topk / E`` of each rank's tokens on average; the
busiest expert-parallel rank, which sets the pace, gets :func:`imbalance_factor` times that; a capacity factor
caps these counts, and padding to capacity fixes them (:func:`expert_tokens`).

Expert tensor parallelism (``etp`` > 1) splits each expert's width over ``etp`` GPUs. With the all-to-all
dispatcher each GPU first exchanges its routed tokens inside the expert-parallel group, then all-gathers the
received tokens over the expert tensor-parallel group (every ETP rank runs its slice of the expert on all of
them) and reduce-scatters the partial outputs back before the return all-to-all (Megatron-LM
``MoEAlltoAllTokenDispatcher``: ``gather_from_sequence_parallel_region`` / ``reduce_scatter_to_sequence_
parallel_region`` on the expert tensor-parallel group). An expert thus sees ``ep * etp`` ranks' tokens at
``1 / etp`` of its width: the expert FLOPs per GPU do not depend on ``etp``.

Where the expert-parallel ranks sit depends on the Megatron-core release (:func:`flowsim.config.layout.group_spans`,
``expert_rank_order``): since 0.10 an expert-parallel group is ``ep`` consecutive GPUs when
``expert_tensor_parallel_size`` is 1; up to 0.9 its members are ``tp * cp`` ranks apart.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from flowsim.config import SimConfig
from flowsim.config.layout import group_spans
from flowsim.model.fusion import ACT_BYTES, FP32_BYTES, activation_step
from flowsim.model.ops import comm, elementwise, gemm, linear, memory, quantize, wgrad_gemm

ROUTER_BYTES_PER_SCORE = 4 + 4  # fp32 logits written, then read by the softmax / top-k
COUNT_BYTES = 8  # one routed-token count per expert, int64 (Megatron-LM ``routing_map.sum(dim=0).long()``)

# Clamped gated activation (``activation_func_clamp_value``), bytes per element of the activation's output
# (``tokens x width``: each half of the fc1 output has that many), 16-bit tensors. megatron-core 0.15.0
# ``fusions/fused_bias_geglu.py:424-431`` (``weighted_bias_quick_geglu_impl``, the routed experts' fused path,
# ``transformer/moe/experts.py:903-911``) clamps both halves and concatenates them before the fused kernel: two
# clamps (read 2, write 2 each) and a ``torch.cat`` (read and write both halves: 8); the unfused ``glu``
# (``experts.py:924-933``) clamps the chunks only. Backward, autograd's ``clamp_backward`` (torch
# ``FunctionsManual.cpp``: ``where(self <= max, grad, 0)`` for the gate half, ``where((self >= min).logical_and_(
# self <= max), grad, 0)`` for the linear half: comparisons read 2 and write a 1-byte mask, ``logical_and_`` reads
# and writes masks, ``where`` reads the mask and the gradient and writes 2) is 2 + 4 kernels of 8 + 14 bytes, and
# the two chunks' gradients are concatenated into the fc1 output's gradient (``chunk`` backward: 8).
CLAMP_FWD_BYTES = 2 * (2 + 2)
CLAMP_CAT_BYTES = 2 * (2 + 2)
CLAMP_BWD_KERNELS, CLAMP_BWD_BYTES = 2 + 4, (3 + 5) + (3 + 3 + 3 + 5)


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


@functools.lru_cache(maxsize=256)
def expected_max_normal(n: int) -> float:
    """Expected largest of ``n`` independent standard normal draws (0 for one draw; 0.5642 for two, 1/sqrt(pi)).

    ``E[max] = integral of x n phi(x) Phi(x)^(n-1) dx``, by the trapezoidal rule on [-12, 12] (step 1e-3).
    """
    if n <= 1:
        return 0.0
    x = np.linspace(-12.0, 12.0, 24001)
    cdf = 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    return float(np.trapezoid(x * n * pdf * cdf ** (n - 1), x))


def routing_imbalance(n_tokens: float, experts: int, topk: int, ep: int) -> float:
    """Expected load of the busiest of ``ep`` expert-parallel ranks over the mean when ``n_tokens`` tokens each
    pick ``topk`` distinct experts of ``experts`` (``experts / ep`` on each rank) with equal probability.

    A rank's load has mean ``mu = n topk / ep`` and variance ``n topk (1/ep) (1 - 1/ep) (E - topk) / (E - 1)``
    (each token's picks are drawn without replacement: hypergeometric); the busiest of the ``ep`` ranks
    carries ``mu + sigma * E[max of ep normals]`` (:func:`expected_max_normal`). 1 with one rank or with
    ``topk = experts`` (every token reaches every expert: perfectly uniform), larger with fewer tokens.
    """
    if ep <= 1 or topk >= experts or n_tokens <= 0:
        return 1.0
    mu = n_tokens * topk / ep
    var = n_tokens * topk * (1.0 / ep) * (1.0 - 1.0 / ep) * (experts - topk) / (experts - 1)
    return 1.0 + expected_max_normal(ep) * math.sqrt(var) / mu


def imbalance_factor(cfg: SimConfig, tokens: int) -> float:
    """Tokens of the busiest expert-parallel rank over the mean, for one micro-batch of ``tokens`` per GPU.

    ``moe_imbalance_factor`` when the user gives it (>= 1). Otherwise the sampling spread of a router that
    balances the experts' expected loads (:func:`routing_imbalance`) over the tokens the dispatch group
    routes together (each GPU's share times ``ep * etp``). A router's systematic skew (aux-loss balancing
    leaves more than DeepSeek-V3's aux-loss-free bias) is not in the model: give it as ``moe_imbalance_factor``.
    """
    m, t = cfg.model, cfg.training
    if m.moe_imbalance_factor:
        return float(m.moe_imbalance_factor)
    n = _ep_tokens(cfg, tokens) * dispatch_group_size(cfg)
    return routing_imbalance(n, m.num_moe_experts, m.moe_router_topk, t.ep)


def expert_tokens(cfg: SimConfig, tokens: int) -> tuple[float, int]:
    """(token, expert) pairs one GPU routes out of ``tokens`` (its share of the micro-batch), and the tokens
    each local expert of the busiest rank processes, under the routing imbalance and the capacity rule.

    Balanced routing sends each expert ``tokens * topk / E`` of a rank's tokens; the busiest rank's experts get
    :func:`imbalance_factor` times that. With a capacity factor ``c`` an expert takes at most
    ``ceil(tokens * topk / E * c)`` of them (Megatron-LM ``moe_utils.get_capacity`` on ``num_tokens * topk``),
    exactly that many when padded to capacity (the imbalance then changes nothing). An expert receives from
    every rank of the dispatch group (:func:`dispatch_group_size`).
    """
    m = cfg.model
    tok = _ep_tokens(cfg, tokens)
    load = tok * m.moe_router_topk / m.num_moe_experts
    busiest = load * imbalance_factor(cfg, tokens)
    cf = m.moe_expert_capacity_factor
    if cf:
        cap = math.ceil(load * cf)
        load, busiest = (float(cap),) * 2 if m.moe_pad_expert_input_to_capacity else (min(load, cap), min(busiest, cap))
    # whole tokens, rounded up: rounding down let the busiest expert's work (hardware FLOPs) fall below the
    # routed load the model FLOPs count when a micro-batch routes fewer tokens than there are experts; the
    # 1e-9 keeps an exact float product (4.000000001) from taking one more token
    return load * m.num_moe_experts, max(math.ceil(busiest * dispatch_group_size(cfg) - 1e-9), 1)


def _distinct(experts: int, k: int, groups: int) -> float:
    """Expected number of the ``groups`` equal expert groups that ``k`` distinct experts, drawn evenly out of
    ``experts``, fall into: ``groups * (1 - C(experts - experts / groups, k) / C(experts, k))``."""
    return groups * (1.0 - math.comb(experts - experts // groups, k) / math.comb(experts, k))


def _distinct_limited(experts: int, k: int, units: int, groups: int, group_topk: int) -> float:
    """:func:`_distinct` over ``units`` equal blocks of consecutive experts (GPUs, NVLink stages) when routing is
    group-limited: a token picks ``group_topk`` of ``groups`` equal groups evenly, then its ``k`` experts evenly
    among theirs. ``groups`` 0 (or units that neither hold whole groups nor fit in one): taken as unlimited.

    A unit inside a group is hit when its group is picked and one of the ``k`` experts lands in it; a unit
    holding ``G / U`` whole groups is hit unless none of the ``k`` lands in its picked groups (hypergeometric
    number of them)."""
    if not groups or (units % groups and groups % units):
        return _distinct(experts, k, units)  # no limit, or units that cut across groups: taken as unlimited
    pool = group_topk * (experts // groups)  # experts a token chooses among
    if units >= groups:
        return units * group_topk / groups * (1.0 - math.comb(pool - experts // units, k) / math.comb(pool, k))
    per = groups // units  # groups in one unit
    miss = sum(math.comb(per, g) * math.comb(groups - per, group_topk - g) / math.comb(groups, group_topk)
               * math.comb(pool - g * (experts // groups), k) / math.comb(pool, k)
               for g in range(0, min(per, group_topk) + 1))
    return units * (1.0 - miss)


def flex_stage_bytes(cfg: SimConfig, tokens: int) -> tuple[float, float, int]:
    """(NVLink-stage bytes, network-stage bytes, NVLink stages an EP group spans) of the flex dispatcher: what
    one GPU sends to dispatch its tokens (nccl-tests all-to-all convention: all bytes one rank sends, the share
    that stays on itself included), the busiest rank's :func:`imbalance_factor` applied.

    DeepEP's design (DeepSeek-V3 report, arXiv 2412.19437 sec. 3.2.2; deepseek-ai/DeepEP "normal kernels"),
    which HybridEP shares: a token goes once over the network to each scale-up domain holding one of its
    ``k`` experts, to the GPU at its own place there (the rail), and is then forwarded over NVLink once to
    each GPU of that domain holding one of its experts. With ``E`` experts evenly on ``ep`` GPUs in ``n``
    domains a token reaches on average ``_distinct(E, k, n)`` domains and ``_distinct(E, k, ep)`` GPUs
    (:func:`_distinct`), instead of the all-to-all's ``k`` copies; group-limited routing (DeepSeek-V3's 4 of 8
    node groups) lowers both (:func:`_distinct_limited`). Hidden states move in 16-bit.
    """
    m, t = cfg.model, cfg.training
    e, k, h = m.num_moe_experts, m.moe_router_topk, m.hidden_size
    vectors = _ep_tokens(cfg, tokens) * imbalance_factor(cfg, tokens) * h * ACT_BYTES
    domains = group_spans(t)["epx"][0]  # NVLink stages (``moe_flex_nvlink_ranks`` GPUs each) an EP group spans
    g, gk = m.moe_router_num_groups, m.moe_router_group_topk
    rdma = vectors * _distinct_limited(e, k, domains, g, gk) if domains > 1 else 0.0
    return vectors * _distinct_limited(e, k, t.ep, g, gk), rdma, domains


def _dispatch_comms(cfg: SimConfig, tokens: int, routed: float, received: float) -> list:
    """(group, op, size) of the collectives of one pass of the token dispatcher, dispatch then combine:
    ``routed`` (token, expert) pairs sent by this GPU, ``received`` tokens its local experts take (the
    busiest rank's). The backward pass runs the same collectives the other way.

    ``alltoall``: an all-to-all over ``ep`` each way, sized by the larger of what a rank sends and what the
    busiest rank receives; with ETP the received tokens are all-gathered over ``etp`` and the outputs
    reduce-scattered back. ``allgather``: all-gather and reduce-scatter over ``tpep``. ``flex``: the two stages
    of :func:`flex_stage_bytes`, the network one over ``epx`` (one GPU per domain) and the NVLink one over
    ``epn`` (the EP ranks of one domain; ``ep`` when the group fits in one domain).
    """
    m, t = cfg.model, cfg.training
    h, kind = m.hidden_size, t.moe_token_dispatcher_type
    ep, etp = t.ep, t.expert_tensor_parallel_size
    if kind == "allgather":
        group = dispatch_group_size(cfg)
        size = group * _ep_tokens(cfg, tokens) * h * ACT_BYTES  # the gathered [tokens of the group, h] tensor
        return [("tpep", "allgather", size), ("tpep", "reducescatter", size)] if group > 1 else []
    if kind == "flex":
        if ep == 1:
            return []
        nvl, rdma, domains = flex_stage_bytes(cfg, tokens)
        if domains == 1:
            return [("ep", "alltoall", nvl), ("ep", "alltoall", nvl)]
        return [("epx", "alltoall", rdma), ("epn", "alltoall", nvl), ("epn", "alltoall", nvl),
                ("epx", "alltoall", rdma)]
    out = []
    if ep > 1:
        a2a = max(routed, received / etp) * h * ACT_BYTES  # nccl-tests size: all bytes one rank sends
        out += [("ep", "alltoall", a2a), ("ep", "alltoall", a2a)]  # dispatch, combine
    if etp > 1:
        size = received * h * ACT_BYTES  # the gathered [tokens of the ETP group, h] tensor
        out += [("etp", "allgather", size), ("etp", "reducescatter", size)]
    return out


def count_exchange(cfg: SimConfig) -> list:
    """(group, op, size) of the token counts the ``alltoall`` dispatcher exchanges before its forward all-to-all.

    Each GPU counts its tokens per expert and all-gathers the ``E`` counts of every rank of the expert-tensor x
    expert-parallel group (megatron-core 0.15.0 ``transformer/moe/token_dispatcher.py``
    ``MoEAlltoAllTokenDispatcher.preprocess``: ``gather_from_sequence_parallel_region(num_local_tokens_per_expert,
    group=self.tp_ep_group)``; AICB's Megatron core_v0.13 workload lists it as each MoE layer's EP all-gather,
    ../shared/research/simai-notes.md), from which it takes the all-to-all's split sizes and the received tokens
    per local expert; the backward pass reuses them. A small, latency-bound collective in every forward, on the
    critical path (the CPU then waits for the counts: ``cuda_sync_point``). None with padding to capacity, whose
    sizes are fixed (``drop_and_pad``), nor with one rank in the group.
    """
    group = dispatch_group_size(cfg)
    if cfg.model.moe_pad_expert_input_to_capacity or group == 1:
        return []
    return [("tpep", "allgather", group * cfg.model.num_moe_experts * COUNT_BYTES)]


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
    states (``tokens x E`` entries) are left out. ``flex`` (DeepEP / HybridEP): the deduplicated two-stage
    exchange of :func:`flex_stage_bytes`. The collectives are listed by :func:`_dispatch_comms`.
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
    moved = local * per_expert if gather else routed  # hidden vectors this GPU permutes and unpermutes

    linear(rows, "router", tok, e, h, t.moe_router_dtype or t.half_dtype, full)
    if t.moe_router_dtype == "fp32":  # the 16-bit hidden states cast up for the gating GEMM, its input gradient down
        for ph in ("fwd", "bwd") + (("recompute",) if full else ()):
            rows.append(memory("router.cast" + (".bwd" if ph == "bwd" else ""), tok * h * (ACT_BYTES + FP32_BYTES), ph))
    dispatch = _dispatch_comms(cfg, tokens, routed, local * per_expert)
    counts = count_exchange(cfg) if t.moe_token_dispatcher_type == "alltoall" else []
    for ph in phases:
        rows.append(memory("router_topk" + (".bwd" if ph == "bwd" else ""), tok * e * ROUTER_BYTES_PER_SCORE, ph))
        # permute before dispatch and unpermute after combine: read and write every routed hidden vector
        rows.append(memory("permute" + (".bwd" if ph == "bwd" else ""), 2 * moved * h * ACT_BYTES, ph))
        rows.append(memory("unpermute" + (".bwd" if ph == "bwd" else ""), 2 * moved * h * ACT_BYTES, ph))
        if t.moe_token_dispatcher_type == "alltoall" and ep > 1 and local > 1:
            # the received tokens arrive grouped by source rank: sorted into per-expert order after the
            # dispatch and back before the combine (Megatron-LM MoEAlltoAllTokenDispatcher sort_chunks_by_idxs)
            rows.append(memory("sort_chunks" + (".bwd" if ph == "bwd" else ""),
                               2 * 2 * local * per_expert * h * ACT_BYTES, ph))
        overlap = "shared_expert" if t.moe_shared_expert_overlap else "none"  # beside the shared experts
        if ph != "bwd":
            comms.extend(comm(group, op, size, ph) for group, op, size in counts)
        comms.extend(comm(group, op, size, ph, overlap) for group, op, size in dispatch)

    def grouped(name, mm, nn, kk, phase):
        rows.append(gemm(name, mm, nn, kk, dt, phase, count=local))  # one GEMM launch per local expert

    for ph in ("fwd",) + (("recompute",) if full else ()):
        grouped("expert_fc1", per_expert, fc1_out, h, ph)
        grouped("expert_fc2", per_expert, h, width, ph)
    grouped("expert_fc1.dgrad", per_expert, h, fc1_out, "bwd")
    grouped("expert_fc2.dgrad", per_expert, width, h, "bwd")
    # each expert's weight gradient accumulates into its fp32 main gradient: with few tokens per expert these
    # GEMMs move more bytes (the expert's weights, 8 bytes each) than their FLOPs take
    rows.append(wgrad_gemm("expert_fc1.wgrad", h, fc1_out, per_expert, dt, count=local))
    rows.append(wgrad_gemm("expert_fc2.wgrad", width, h, per_expert, dt, count=local))
    # low-precision recipes quantise the grouped GEMMs' inputs and gradients as for any linear layer
    quantize(rows, "expert_fc1", local * per_expert, fc1_out, h, dt, full)
    quantize(rows, "expert_fc2", local * per_expert, h, width, dt, full)
    act_recompute = full or recomputes("moe_act")
    clamp_rows(rows, cfg, local * per_expert * width, act_recompute)
    elementwise(rows, "expert_activation", activation_step(m.activation), t.kernel_fusion,
                local * per_expert * width, act_recompute)
    if m.add_bias_linear:
        expert_bias_rows(rows, cfg, per_expert, local, full)


def clamp_rows(rows: list, cfg: SimConfig, elems: float, recompute: bool) -> None:
    """Append the kernels of a clamped gated activation (``activation_func_clamp_value``; none without one) over
    ``elems`` output elements of the routed experts (tokens x local width, all local experts).

    Megatron-core's fused path (``kernel_fusion: fused``, ``bias_activation_fusion``) clamps the two halves of the
    fc1 output and concatenates them before its fused kernel (3 kernels, :data:`CLAMP_FWD_BYTES` +
    :data:`CLAMP_CAT_BYTES` bytes per element); the unfused one clamps the two chunks (2 kernels). Backward: the
    clamps' gradients and the chunks' concatenation (7 kernels, :data:`CLAMP_BWD_BYTES` + 8 bytes per element).
    The forward re-runs with ``recompute``. The dense MLP's clamp (GPT-OSS has no dense MLP) is not priced.
    """
    if not cfg.model.activation_func_clamp_value:
        return
    for ph in ("fwd",) + (("recompute",) if recompute else ()):
        rows.append(memory("expert_clamp", elems * CLAMP_FWD_BYTES / 2, ph, count=2))
        if cfg.training.kernel_fusion == "fused":
            rows.append(memory("expert_clamp_cat", elems * CLAMP_CAT_BYTES, ph))
    rows.append(memory("expert_clamp.bwd", elems * CLAMP_BWD_BYTES / CLAMP_BWD_KERNELS, "bwd",
                       count=CLAMP_BWD_KERNELS))
    rows.append(memory("expert_clamp_cat.bwd", elems * CLAMP_CAT_BYTES, "bwd"))


def expert_bias_rows(rows: list, cfg: SimConfig, per_expert: int, local: int, recompute: bool) -> None:
    """Append the kernels of the routed experts' fc2 bias, weighted by each token's routing probability.

    Megatron-core's ``TEGroupedMLP`` returns the fc2 bias unapplied (``skip_bias_add=True``) and adds it per
    expert in Python (megatron-core 0.15.0 ``transformer/moe/experts.py:823-840`` ``_apply_bias``:
    ``torch.cat([t + b * p for ...]).to(dtype)`` over ``torch.split`` of the output by expert): per expert a
    ``b * p`` of ``[tokens, h]`` in the probabilities' dtype ``e`` (fp32 with ``moe_router_dtype: fp32``, else
    16-bit: write ``e`` bytes per element) and the add (read 2 + ``e``, write ``e``); then the concatenation
    (read and write ``e``) and, with fp32 probabilities, the cast back (read 4, write 2). Backward, autograd:
    per expert the two products of the gradient with ``p`` and ``b`` and their reductions to the bias and
    probability gradients (``6 e``; with fp32 first the cast of the output gradient up, 6, and of each expert's
    share back, 6), then the split's backward concatenates the experts' input gradients (read and write 2).
    The fc1 bias is TE ``GroupedLinear``'s own (cuBLAS epilogue forward, bias gradient in the weight-gradient
    GEMM: TE 2.9 ``module/grouped_linear.py:300-330,419-432``): no kernel of its own.
    """
    e = FP32_BYTES if cfg.training.moe_router_dtype == "fp32" else ACT_BYTES
    h = cfg.model.hidden_size
    per = per_expert * h  # elements of one expert's output
    cast = e != ACT_BYTES
    for ph in ("fwd",) + (("recompute",) if recompute else ()):
        rows.append(memory("expert_bias", per * (e + 2 + 2 * e) / 2, ph, count=2 * local))  # b * p, t + b * p
        rows.append(memory("expert_bias_cat", local * per * 2 * e, ph))
        if cast:
            rows.append(memory("expert_bias_cast", local * per * (FP32_BYTES + ACT_BYTES), ph))
    if cast:
        rows.append(memory("expert_bias_cast.bwd", local * per * (ACT_BYTES + FP32_BYTES), "bwd"))
    kernels = 4 + (1 if cast else 0)  # per expert: grad * p, its sum, grad * b, its sum (and the cast down)
    per_kernel = per * (6 * e + (FP32_BYTES + ACT_BYTES if cast else 0)) / kernels
    rows.append(memory("expert_bias.bwd", per_kernel, "bwd", count=kernels * local))
    rows.append(memory("expert_bias_cat.bwd", local * per * 2 * ACT_BYTES, "bwd"))


def expert_params_per_gpu(cfg: SimConfig) -> float:
    """Routed-expert parameters of one MoE layer held by one GPU (its ``E / ep`` experts, ETP-sharded)."""
    m, t = cfg.model, cfg.training
    return (m.num_moe_experts // t.ep) * m.mlp_weights(m.moe_ffn_hidden_size) / t.expert_tensor_parallel_size
