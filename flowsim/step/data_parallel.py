"""Data-parallel communication of a step: the gradient reduction, the parameter gather, ZeRO-3/FSDP per layer.

Gradients are reduced in buckets of :func:`grad_bucket_bytes` (Megatron-LM DDP / PyTorch DDP). A chunk's
gradients become final during the last micro-batch's backward through it; buckets are taken to be ready evenly
over that window and are reduced one after another on the communication stream. What runs past the end of the
stage's last backward is exposed; the part that ran beside the backward pass slowed it by the SMs it held
(:mod:`flowsim.step.overlap`). The distributed optimizer's parameter all-gather overlaps the next step's
forward (``overlap_param_gather``) except for its first bucket. With ``comm_engine: flow`` the reduction and the
gather share the network with the pipeline sends and expert all-to-alls of their windows
(:func:`flowsim.step.flows.cross_kind_extra_s`).

ZeRO-3 / FSDP instead gathers each layer's weights (forward and backward) and reduce-scatters its gradients
per layer, prefetched one layer ahead (:func:`fsdp_exposed`); the first layer's gather and the last layer's
reduce-scatter of each micro-batch have no compute beside them, and neither have the root unit's (the weights
outside the layers: embedding, final norm, LM head; :func:`root_params`, PyTorch FSDP), gathered before the
embedding and reduce-scattered after the whole backward.
"""
from __future__ import annotations

import numpy as np
from flowsim._jit import njit

from flowsim.model.workload import layer_params
from flowsim.network.parallel import map_ordered
from flowsim.step.flows import cross_kind_extra_s, layer_cross_kind_extra_s
from flowsim.step.overlap import overlapped_s
from flowsim.step.sums import pairwise_sum
from flowsim.units import DTYPE_BYTES

# Megatron-core DDP's default bucket (megatron/core/distributed/distributed_data_parallel.py, the
# DistributedDataParallelConfig.bucket_size docstring): max(40M, 1M x data-parallel size) parameters
MEGATRON_BUCKET_PARAMS = 40_000_000
MEGATRON_BUCKET_PARAMS_PER_DP_RANK = 1_000_000
TORCH_DDP_BUCKET_BYTES = 25 * 2**20  # torch.nn.parallel.DistributedDataParallel bucket_cap_mb=25 (MiB)
PARAM_GATHER_BYTES = 2  # the distributed optimizer / FSDP gathers 16-bit weights


def grad_reduce_bytes(t) -> float:
    """Bytes of one gradient in the data-parallel reduction: ``grad_reduce_dtype`` (default fp32, as Megatron-LM's
    ``accumulate_allreduce_grads_in_fp32`` with bf16; a release's profile or the runs' v2 column may say bf16)."""
    return float(DTYPE_BYTES[t.grad_reduce_dtype])


def zero_level(t) -> int:
    """Degree of state sharding: ``zero_stage``, at least 1 with the distributed optimizer."""
    return max(t.zero_stage, 1 if t.use_distributed_optimizer else 0)


def shard_group(t) -> str:
    """Group of the ZeRO/FSDP gathers and reduce-scatters: ``dps`` with hybrid sharding, else all of ``dp``."""
    return "dps" if t.dp_shard < t.dp * t.cp else "dp"


def grad_bucket_bytes(cfg, wl, stage: int) -> float:
    """Bytes of gradient per bucket of the overlapped data-parallel reduction of ``stage``:
    ``bucket_size_bytes`` when set; with ZeRO-2 (FSDP ``SHARD_GRAD_OP``, which reduce-scatters each wrapped
    block's gradients) one layer's parameters; PyTorch DDP's 25 MiB for eager PyTorch without ZeRO; else
    Megatron-core's default of ``max(40e6, 1e6 * dp * cp)`` parameters (bigger buckets for bigger groups
    keep the collectives from being latency-bound, as its docstring says); :func:`grad_reduce_bytes` each."""
    t = cfg.training
    if t.bucket_size_bytes:
        return float(t.bucket_size_bytes)
    if t.zero_stage >= 2:
        return wl.stage_params[stage] / max(int(wl.chunk_layers[stage].sum()), 1) * grad_reduce_bytes(t)
    if t.kernel_fusion == "eager" and t.zero_stage == 0 and not t.use_distributed_optimizer:
        return float(TORCH_DDP_BUCKET_BYTES)
    return float(max(MEGATRON_BUCKET_PARAMS, MEGATRON_BUCKET_PARAMS_PER_DP_RANK * t.dp * t.cp) * grad_reduce_bytes(t))


def pytorch_wrapper(t) -> bool:
    """Whether PyTorch's own data-parallel wrapper (DDP, FSDP1, FSDP2) holds the gradients and weights: eager
    kernels, or a model compiled by ``torch.compile`` (Inductor compiles the model's forward and backward; the
    wrapper's hooks, gradient packing and casts still run as eager kernels around them: ``host_overhead:
    compiled``). Megatron-core (its DDP and Megatron-FSDP) and DeepSpeed run fused kernels and their own buffers."""
    return t.kernel_fusion == "eager" or t.host_overhead == "compiled"


def root_params(cfg, wl, stage: int) -> float:
    """Parameters of one GPU of ``stage`` in PyTorch FSDP's root unit (TP-sharded): what its transformer layers do
    not hold (the embedding, the final norm and the LM head, its own copy when untied, and MTP modules); 0 outside
    PyTorch's FSDP (:func:`pytorch_wrapper`), where those weights count with the layers' collectives.

    FSDP wraps each transformer block and then the whole model, whose own unit holds what no block does (torchtitan
    ``apply_fsdp``: ``fully_shard`` per block, then ``fully_shard(model)``; llm-foundry / composer and fms-fsdp: an
    auto-wrap policy over the blocks). The root is gathered in its pre-forward, before the embedding, and kept
    gathered until the backward (FSDP1 torch/distributed/fsdp/_runtime_utils.py ``_post_forward_reshard``: "Do not
    free the root's parameters in the post-forward"; FSDP2 ``fully_shard`` docstring: ``reshard_after_forward``
    is False for the root); its inputs (token ids) need no gradient, so its reduce-scatter runs in the final
    backward callback, after the embedding's gradient (FSDP2 ``_root_post_backward_final_callback``, FSDP1
    ``_post_backward_final_callback``), and the step waits for it."""
    return _outside_layers(cfg, wl, stage) if pytorch_wrapper(cfg.training) else 0.0


def _outside_layers(cfg, wl, stage: int) -> float:
    """Dense parameters of one GPU of ``stage`` that its transformer layers do not hold (embedding, final norm,
    LM head, MTP modules)."""
    dense, moe = layer_params(cfg), layer_params(cfg, moe=True)
    n_moe = int(wl.chunk_moe_layers[stage].sum())
    in_layers = (int(wl.chunk_layers[stage].sum()) - n_moe) * dense + n_moe * moe
    return max(0.0, float(wl.stage_params[stage]) - in_layers)


def layer_gather_bytes(t) -> float:
    """Bytes per parameter of a transformer layer's weight all-gather: 1 with ``fp8_param_gather`` (the linear
    weights travel as FP8; the layer's norm weights, under 0.1 % of it, are counted with them), else 2."""
    return 1.0 if t.fp8_param_gather else float(PARAM_GATHER_BYTES)


def part_gather_bytes(cfg, wl, stage: int, group: str, params: float) -> float:
    """Bytes of the weight all-gather of ``params`` parameters of one :func:`reduction_parts` part: routed experts
    (``edp``) all transformer-layer weights; a dense part keeps the weights outside the layers (embedding, LM head)
    16-bit under ``fp8_param_gather`` (Megatron-core gathers only Transformer Engine's FP8 modules' weights in FP8,
    ``--fp8-param-gather``; torchao's float8 all-gather covers the Float8Linear modules)."""
    per_layer = layer_gather_bytes(cfg.training)
    if per_layer == PARAM_GATHER_BYTES:
        return params * PARAM_GATHER_BYTES
    outside = 0.0 if group == "edp" else min(_outside_layers(cfg, wl, stage), params)
    return (params - outside) * per_layer + outside * PARAM_GATHER_BYTES


def fsdp_exposed(cfg, wl, comms, layer_fwd_s: float, layer_bwd_s: float) -> tuple[float, float, float]:
    """ZeRO-3 / FSDP: per layer weight all-gathers (forward and backward) and gradient reduce-scatters over
    the shard group, prefetched one layer ahead so that each runs beside the neighbouring layer's compute
    (which it slows). With hybrid sharding the reduced shard is then all-reduced across the replicas on a stream
    of its own (FSDP2's ``all_reduce_stream``), so a layer's backward communication lasts the longer of the shard
    group's gather + reduce-scatter and the replicas' all-reduce. With ``comm_engine: flow`` these collectives
    run in one simulation with the stage's expert all-to-alls and pipeline sends of the layer's window
    (:func:`flowsim.step.flows.layer_cross_kind_extra_s`): each takes longer by its extra, and so do the
    all-to-alls, which lengthen the layer. Returns the extra forward and backward seconds per layer and the gathers
    nothing hides: the root unit's (:func:`root_params`) and the first layer's."""
    t = cfg.training
    ag, rs, ar, ag_bytes, rs_bytes = _fsdp_layer_comms(cfg, wl, comms)
    g = shard_group(t)
    sms = max(comms.ctas(g, "allgather", ag_bytes), comms.ctas(g, "reducescatter", rs_bytes),
              comms.ctas("dpr", "allreduce", rs_bytes / t.dp_shard))
    sm = comms.gpu.sm_count
    # seconds of communication beside a layer's forward and backward, and of its all-to-alls' extra
    comm_f, comm_b, ep_f, ep_b = ag, max(ag + rs, ar), 0.0, 0.0
    if t.comm_engine == "flow":  # the layer's all-to-alls and the stage's sends share the network with them
        gather, scatter = (g, 0, "allgather", ag_bytes), (g, 0, "reducescatter", rs_bytes)
        replicas = (("dpr", 0, "allreduce", rs_bytes / t.dp_shard),) if ar > 0 else ()
        (x_f, ep_f), (x_b, ep_b) = map_ordered(lambda w: layer_cross_kind_extra_s(cfg, comms.gpu, wl, *w),
                                               [("fwd", (gather,), 1), ("bwd", (gather, scatter) + replicas, 2)])
        comm_f, comm_b = ag + x_f[0], max(ag + rs + x_b[0] + x_b[1], ar + sum(x_b[2:]))
    # the root unit is gathered once per micro-batch: it stays gathered from its forward to its backward
    root_ag = comms.time(g, "allgather", root_params(cfg, wl, 0) * PARAM_GATHER_BYTES, cfg.num_microbatches)
    return (overlapped_s(layer_fwd_s, comm_f, sms, sm) - layer_fwd_s + ep_f,
            overlapped_s(layer_bwd_s, comm_b, sms, sm) - layer_bwd_s + ep_b, ag + root_ag)


def _fsdp_layer_comms(cfg, wl, comms) -> tuple:
    """Seconds of one layer's ZeRO-3 / FSDP weight all-gather, gradient reduce-scatter (shard group) and, with
    hybrid sharding, the shard's all-reduce across the replicas; and the gather's and reduce-scatter's bytes."""
    t, m = cfg.training, cfg.num_microbatches
    per_layer_params = (wl.stage_params[0] - root_params(cfg, wl, 0)) / max(int(wl.chunk_layers[0].sum()), 1)
    ag_bytes, rs_bytes = per_layer_params * layer_gather_bytes(t), per_layer_params * grad_reduce_bytes(t)
    g = shard_group(t)
    return (comms.time(g, "allgather", ag_bytes, 2 * m), comms.time(g, "reducescatter", rs_bytes, m),
            comms.time("dpr", "allreduce", rs_bytes / t.dp_shard, m), ag_bytes, rs_bytes)


def reduction_parts(t, wl, groups: dict, stage: int) -> list:
    """(group, op, parameters, bytes factor) of a stage's gradient reduction: dense weights over the data- and
    context-parallel ranks (with hybrid sharding reduce-scattered in the shard group, then the shard all-reduced
    across the replicas), routed experts over the expert-data-parallel ranks; parts on one rank (``groups``:
    name -> (ranks, stride), :func:`flowsim.config.layout.group_spans`) left out."""
    zero = zero_level(t)
    op = "reducescatter" if zero >= 1 else "allreduce"
    n_dense, n_expert = wl.stage_params[stage], wl.stage_expert_params[stage]
    parts = ((shard_group(t) if zero >= 1 else "dp", op, n_dense, 1.0),
             ("dpr", "allreduce", n_dense if zero >= 1 else 0.0, 1.0 / t.dp_shard),
             ("edp", op, n_expert, 1.0))
    return [p for p in parts if p[2] > 0 and groups[p[0]][0] > 1]


def _bucket_prices(cfg, wl, comms, stage: int, parts: list, stages: int = 1) -> tuple[list, list]:
    """Per part: (buckets, seconds of each, SMs held) of the reduction; per reduce-scattered part: the same of the
    parameter gather. Each bucket's calls are counted ``stages`` times for the report (stages that reduce the
    same parameters)."""
    reduce, gather = [], []
    grad = grad_reduce_bytes(cfg.training)
    for g, g_op, n, factor in parts:
        nb = max(1, int(np.ceil(n * grad / grad_bucket_bytes(cfg, wl, stage))))
        size = n * grad * factor / nb
        reduce.append((nb, comms.time(g, g_op, size, nb * stages), comms.ctas(g, g_op, size)))
        if g_op == "reducescatter":
            gsize = part_gather_bytes(cfg, wl, stage, g, n) / nb
            gather.append((nb, comms.time(g, "allgather", gsize, nb * stages), comms.ctas(g, "allgather", gsize)))
    return reduce, gather


def _buckets(cfg, wl, comms, stage: int, parts: list) -> tuple:
    """Per part: seconds of each reduction bucket and SMs held; per reduce-scattered part: seconds of each
    parameter-gather bucket and SMs held."""
    reduce, gather = _bucket_prices(cfg, wl, comms, stage, parts)
    return ([np.full(nb, x) for nb, x, _ in reduce], [c for _, _, c in reduce],
            [np.full(nb, x) for nb, x, _ in gather], [c for _, _, c in gather])


def _windows(cfg, wl, timeline, stage, parts, times, g_times) -> list:
    """The cross-kind windows of a stage under the flow engine (``[]`` without it), as the arguments after
    ``timeline`` of :func:`flowsim.step.flows.cross_kind_extra_s`: the gradient reduction's parts from its first
    bucket's ready time to the end of its stream alone, then (``overlap_param_gather``, reduce-scattered parts)
    the parameter gather's from the stage's first forward to the end of its gather alone."""
    t = cfg.training
    if t.comm_engine != "flow":
        return []
    bucket_s = np.concatenate(times)
    ready = _ready(timeline, stage, bucket_s.size, t.overlap_grad_reduce)
    out = [(tuple((g, stage, g_op, n * grad_reduce_bytes(t) * factor) for g, g_op, n, factor in parts),
            float(ready.min()), stream_end_s(bucket_s, ready))]
    if g_times and t.overlap_param_gather:
        t0 = float(timeline.start_s[stage].min())
        out.append((tuple((g, stage, "allgather", part_gather_bytes(cfg, wl, stage, g, n)) for g, g_op, n, _ in parts
                          if g_op == "reducescatter"), t0, t0 + float(sum(a.sum() for a in g_times))))
    return out


def _ready(timeline, stage, nb, overlap_grad_reduce: bool) -> np.ndarray:
    """When each of ``nb`` gradient buckets of a stage can be reduced, seconds: :func:`bucket_ready` under
    ``overlap_grad_reduce``, else the end of the stage's backward."""
    return bucket_ready(timeline, stage, nb) if overlap_grad_reduce else np.full(nb, timeline.end_s[stage])


def _grad_exposed(cfg, comms, timeline, stage, times, sms, extra) -> float:
    """Exposed seconds of the gradient reduction, each part's buckets longer by its share of ``extra`` (seconds
    per part, its cross-kind slow-down; ``None`` without the flow engine)."""
    t = cfg.training
    if extra is not None:
        times = [a + x / a.size for a, x in zip(times, extra)]
    bucket_s = np.concatenate(times)  # in the order the reduction issues them
    ready = _ready(timeline, stage, bucket_s.size, t.overlap_grad_reduce)
    total = float(bucket_s.sum())
    exposed = max(0.0, stream_end_s(bucket_s, ready) - timeline.end_s[stage])
    # the part of the reduction that ran beside the backward pass slowed it (see overlapped_s)
    return exposed + (total - exposed) * max(sms) / comms.gpu.sm_count


def _gather_exposed(cfg, comms, g_times, g_sms, extra) -> float:
    """Exposed seconds of the parameter all-gather, each part's buckets longer by its share of ``extra`` (as in
    :func:`_grad_exposed`)."""
    if extra is not None:
        g_times = [a + x / a.size for a, x in zip(g_times, extra)]
    gather_s = np.concatenate(g_times)
    if cfg.training.overlap_param_gather:
        return float(gather_s[0] + gather_s[1:].sum() * max(g_sms) / comms.gpu.sm_count)
    return float(gather_s.sum())


def dp_exposed(cfg, wl, comms, timeline, stage: int) -> tuple[float, float, float]:
    """Exposed gradient reduction, parameter gathering and cross-kind slow-down of one stage, seconds per step
    (module docstring). With ZeRO-3 (:func:`fsdp_exposed` prices the per-layer collectives beside the layers) the
    exposed reduction is the last layer's and the root unit's (:func:`root_params`) reduce-scatters (and their
    shards' all-reduces across hybrid-sharding replicas) of every micro-batch, which run after that micro-batch's
    backward: the end of each backward waits for them (FSDP2 ``_root_post_backward_final_callback`` waits for the
    reduce-scatter's event, FSDP1 ``_post_backward_final_callback`` for the post-backward stream, DeepSpeed ZeRO-3
    for its reduction stream)."""
    t = cfg.training
    if zero_level(t) >= 3:
        if t.dp * t.cp == 1:
            return 0.0, 0.0, 0.0
        _, rs, ar, _, _ = _fsdp_layer_comms(cfg, wl, comms)
        m, root_bytes = cfg.num_microbatches, root_params(cfg, wl, stage) * grad_reduce_bytes(t)
        root_rs = comms.time(shard_group(t), "reducescatter", root_bytes, m)
        root_ar = comms.time("dpr", "allreduce", root_bytes / t.dp_shard, m)
        return (rs + ar + root_rs + root_ar) * m, 0.0, 0.0
    return _dp_exposed_each(cfg, wl, comms, timeline, [stage])[0]


def _dp_exposed_each(cfg, wl, comms, timeline, stages) -> list:
    """:func:`dp_exposed` of each of ``stages`` (not under ZeRO-3): every stage's buckets priced in turn, then
    the cross-kind windows of all of them simulated at once (:func:`flowsim.network.parallel.map_ordered`:
    independent simulations, spread over the flow engine's threads), then each stage's exposed seconds."""
    plans = []
    for s in stages:
        parts = reduction_parts(cfg.training, wl, comms.groups, s)
        priced = _buckets(cfg, wl, comms, s, parts) if parts else None
        plans.append((s, priced, _windows(cfg, wl, timeline, s, parts, priced[0], priced[2]) if parts else []))
    windows = [w for _, _, ws in plans for w in ws]
    if windows:
        done = iter(map_ordered(lambda w: cross_kind_extra_s(cfg, comms.gpu, wl, timeline, *w), windows))
    out = []
    for s, priced, ws in plans:
        if priced is None:
            out.append((0.0, 0.0, 0.0))
            continue
        times, sms, g_times, g_sms = priced
        # the reduction's window, then the gather's; (None, 0.0) for one not simulated (analytic engine, no gather)
        (extra, ep_extra), (g_extra, g_ep) = [next(done) for _ in ws] + [(None, 0.0)] * (2 - len(ws))
        grad = _grad_exposed(cfg, comms, timeline, s, times, sms, extra)
        gather = _gather_exposed(cfg, comms, g_times, g_sms, g_extra) if g_times else 0.0
        out.append((grad, gather, ep_extra + g_ep))
    return out


def dp_exposed_stages(cfg, wl, comms, timeline) -> list:
    """The exposed data-parallel seconds of every stage (the sum of :func:`dp_exposed`'s three), per step. Without
    the flow engine and ZeRO-3, the buckets are priced once per set of stages that reduce the same parameters (a
    stage enters the pricing only through its dense and expert parameters and its dense and MoE layers) and the
    bucket streams of all stages run in one numba call, equal bit for bit to :func:`dp_exposed` stage by stage
    (tests/test_fast_path.py)."""
    t, p = cfg.training, cfg.training.pp
    if zero_level(t) >= 3:
        return [sum(dp_exposed(cfg, wl, comms, timeline, s)) for s in range(p)]
    if t.comm_engine == "flow":
        return [sum(x) for x in _dp_exposed_each(cfg, wl, comms, timeline, range(p))]
    same: dict = {}
    for s in range(p):
        key = (wl.stage_params[s], wl.stage_expert_params[s], wl.chunk_layers[s].sum(), wl.chunk_moe_layers[s].sum())
        same.setdefault(key, []).append(s)
    nb, secs, sms = np.zeros((2, p, 3), dtype=np.int64), np.zeros((2, p, 3)), np.zeros((2, p), dtype=np.int64)
    for stages in same.values():
        parts = reduction_parts(t, wl, comms.groups, stages[0])
        for i, priced in enumerate(_bucket_prices(cfg, wl, comms, stages[0], parts, len(stages)) if parts else ()):
            for j, (n, x, c) in enumerate(priced):
                nb[i, stages, j], secs[i, stages, j] = n, x
            sms[i, stages] = max((c for _, _, c in priced), default=0)
    return _stages_exposed(nb, secs, sms, timeline.last_bwd_start_s, timeline.last_bwd_end_s, timeline.end_s,
                           t.overlap_grad_reduce, t.overlap_param_gather, comms.gpu.sm_count).tolist()


def bucket_ready(timeline, stage, nb) -> np.ndarray:
    """When each of ``nb`` gradient buckets of a stage is ready, seconds: evenly over the last backward of its
    chunk (chunks in order of completion)."""
    ready = np.empty(nb)
    _fill_ready(timeline.last_bwd_start_s[stage], timeline.last_bwd_end_s[stage], ready)
    return ready


def stream_end_s(bucket_s, ready) -> float:
    """End of buckets reduced one after another on one stream, seconds: ``finish_k = max(finish_{k-1},
    ready_k) + t_k``, i.e. ``S_n + max_k (ready_k - S_{k-1})`` with ``S_k`` the cumulative bucket seconds."""
    return float(_stream_end(np.ascontiguousarray(bucket_s, dtype=np.float64), ready))


@njit(cache=True)
def _fill_ready(starts, ends, out):
    """:func:`bucket_ready` into ``out`` from the stage's last-backward windows (float64[v] each)."""
    v, nb = ends.size, out.size
    order = np.arange(v)  # chunks by end, ties in chunk order (a stable insertion sort)
    for i in range(1, v):
        c, j = order[i], i
        while j > 0 and ends[order[j - 1]] > ends[c]:
            order[j] = order[j - 1]
            j -= 1
        order[j] = c
    pos = 0
    for i in range(v):
        c = order[i]
        k = nb // v + (1 if i < nb % v else 0)  # buckets of this chunk
        for b in range(1, k + 1):
            out[pos] = starts[c] + (ends[c] - starts[c]) * b / k
            pos += 1


@njit(cache=True)
def _stream_end(bucket_s, ready):
    """:func:`stream_end_s`: ``S_{k-1}`` summed in order (numpy's ``cumsum``), ``S_n`` pairwise (its ``sum``)."""
    before, late = 0.0, -np.inf
    for k in range(bucket_s.size):
        late = max(late, ready[k] - before)
        before += bucket_s[k]
    return pairwise_sum(bucket_s, 0, bucket_s.size) + late


@njit(cache=True)
def _runs(nb, secs):
    """The buckets of a stream of parts: ``nb[j]`` buckets of ``secs[j]`` seconds each, in part order."""
    out = np.empty(nb.sum())
    pos = 0
    for j in range(nb.size):
        out[pos:pos + nb[j]] = secs[j]
        pos += nb[j]
    return out


@njit(cache=True)
def _stages_exposed(nb, secs, sms, lb_start, lb_end, end, overlap_grad, overlap_gather, sm_count):
    """Per stage: :func:`dp_exposed`'s reduction plus gather, seconds, from the buckets of each stage's parts
    (``nb`` int64[2, p, 3] buckets and ``secs`` seconds each, ``sms`` int64[2, p] the most SMs a part holds;
    [0] the reduction, [1] the gather) and the pipeline timeline's windows."""
    p = end.size
    out = np.zeros(p)
    for s in range(p):
        bucket_s, gather_s = _runs(nb[0, s], secs[0, s]), _runs(nb[1, s], secs[1, s])
        if bucket_s.size == 0:
            continue
        ready = np.full(bucket_s.size, end[s])
        if overlap_grad:
            _fill_ready(lb_start[s], lb_end[s], ready)
        total = pairwise_sum(bucket_s, 0, bucket_s.size)
        exposed = max(0.0, _stream_end(bucket_s, ready) - end[s])
        grad = exposed + (total - exposed) * sms[0, s] / sm_count
        gather = 0.0
        if gather_s.size and overlap_gather:
            gather = gather_s[0] + pairwise_sum(gather_s, 1, gather_s.size - 1) * sms[1, s] / sm_count
        elif gather_s.size:
            gather = pairwise_sum(gather_s, 0, gather_s.size)
        out[s] = 0.0 + grad + gather + 0.0  # Python's sum of dp_exposed's three, the last 0 here
    return out
