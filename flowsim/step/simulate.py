"""The public entry point: ``flowsim.simulate(config) -> Result``.

One call builds the workload (:mod:`flowsim.model.workload`), prices every compute op with the kernel model
(:mod:`flowsim.kernels`) and every collective with NCCL's model for where its ranks sit
(:mod:`flowsim.nccl_models` via :mod:`flowsim.network.comm_layout`), runs the pipeline schedule
(:mod:`flowsim.step.schedule`), overlaps the data-parallel traffic with the backward pass, adds the optimizer
step, and accounts memory (:mod:`flowsim.step.memory`).

Ranks are numbered as Megatron-LM orders its groups (``tp`` fastest, then ``cp``, ``dp``, ``pp``), so a
tensor-parallel group occupies consecutive GPUs, a data-parallel group strides by ``tp * cp`` and the
pipeline neighbours stride by ``tp * cp * dp``. Gradients are reduced over the data- and
context-parallel ranks together, as Megatron-LM does.
"""
from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd

from flowsim.network.comm_layout import group_layout
from flowsim.config import SimConfig, build_config
from flowsim.gpu_specs import get_gpu
from flowsim.kernels import KERNEL_MIN_TIME_S, op_times
from flowsim.kernels.memory import memory_reference, stream_efficiency
from flowsim.step.memory import stage_memory
from flowsim.nccl_models import predict
from flowsim.step.result import CollectiveChoice, Result, StageBreakdown
from flowsim.step.flows import FLOW_GROUPS, cross_kind_extra_s, flow_time_s, layer_cross_kind_extra_s
from flowsim.step.schedule import PipelineTimeline, end_chunks, microbatches_per_chunk, shared_sm_time_s, simulate_pipeline
from flowsim.model.fusion import eager_grad_bytes_per_param
from flowsim.model.workload import ADAM_BYTES_PER_PARAM, OpSet, build_workload, \
    model_flops_per_token

# Transformer Engine userbuffers (TP comm overlap) run their pipelined reduce-scatter kernels on 16 SMs
# (``num_sm=16`` default of ``add_ub`` in transformer_engine/pytorch/module/base.py ``initialize_ub``).
TP_OVERLAP_SMS = 16
GRAD_REDUCE_BYTES = 4   # Megatron-LM reduces fp32 gradients (accumulate_allreduce_grads_in_fp32 with bf16)
# Megatron-core DDP's default bucket (megatron/core/distributed/distributed_data_parallel.py, the
# DistributedDataParallelConfig.bucket_size docstring): max(40M, 1M x data-parallel size) parameters
MEGATRON_BUCKET_PARAMS = 40_000_000
MEGATRON_BUCKET_PARAMS_PER_DP_RANK = 1_000_000
TORCH_DDP_BUCKET_BYTES = 25 * 2**20  # torch.nn.parallel.DistributedDataParallel bucket_cap_mb=25 (MiB)
PARAM_GATHER_BYTES = 2  # the distributed optimizer / FSDP gathers 16-bit weights


# Layouts and collective estimates depend only on their (hashable, frozen) inputs: sweeps over many
# configurations reuse them.
_group_layout = functools.lru_cache(maxsize=4096)(group_layout)
_predict = functools.lru_cache(maxsize=65536)(predict)


@dataclasses.dataclass(frozen=True)
class StepTimeline:
    """What a trace needs (see :mod:`flowsim.export.trace`, :mod:`flowsim.export.chakra`): the pipeline schedule (seconds),
    the p2p time and bytes, the layers (and MoE layers) of each chunk and how many of each re-run their
    ``recompute`` ops, the op table with each op's seconds
    and the row span of each block, each layer block's collectives with their estimates, the group sizes,
    each stage's exposed data-parallel and optimizer seconds, and ``block_runs``: per block name, int64[p, 3],
    how many times one GPU of each stage runs the block's ``fwd``, ``bwd`` and ``recompute`` ops per step."""

    pipeline: PipelineTimeline
    p2p_s: float
    p2p_bytes: float
    chunk_layers: np.ndarray
    chunk_moe_layers: np.ndarray
    chunk_recompute_layers: np.ndarray
    chunk_recompute_moe_layers: np.ndarray
    ops: pd.DataFrame
    op_time_s: np.ndarray
    spans: dict
    comms: dict
    group_sizes: dict
    dp_exposed_s: tuple
    optimizer_s: tuple
    block_runs: dict


class _Comms:
    """Prices collectives of one configuration, caching identical (group, op, size) calls."""

    def __init__(self, cfg: SimConfig, gpu):
        t = cfg.training
        self.cfg, self.gpu = cfg, gpu
        etp, ep = t.expert_tensor_parallel_size, t.ep
        self.groups = {
            "tp": (t.tp, 1),
            "cp": (t.cp, t.tp),
            "dp": (t.dp * t.cp, t.tp),
            # hybrid sharding: shard groups of dp_shard consecutive DP ranks, replicas across them
            "dps": (t.dp_shard, t.tp),
            "dpr": (t.dp * t.cp // t.dp_shard, t.tp * t.dp_shard),
            "pp": (2, t.tp * t.cp * t.dp),
            # expert layers (Megatron-LM expert rank generator, order tp-ep-dp-pp with tp = etp)
            "etp": (etp, 1),
            "ep": (ep, etp),
            "edp": (t.tp * t.cp * t.dp // (ep * etp), ep * etp),
            "tpep": (etp * ep, 1),  # the all-gather token dispatcher's group (Megatron-LM tp_ep_group)
        }
        self._layouts = {}
        self._cache = {}
        self.choices = {}

    def time(self, group: str, op: str, size_bytes: float, count_per_step: int = 0) -> float:
        """Seconds of one call; records the choice for the report."""
        n, stride = self.groups[group]
        if n == 1 or size_bytes <= 0:
            return 0.0
        key = (group, op, float(size_bytes))
        if key not in self._cache:
            if group not in self._layouts:
                self._layouts[group] = _group_layout(self.cfg.cluster, self.gpu, n, stride)
            est = _predict(op, float(size_bytes), self._layouts[group])
            if self.cfg.training.comm_engine == "flow" and group in FLOW_GROUPS:
                est = dataclasses.replace(est, time_s=flow_time_s(self.cfg, self.gpu, group, op, size_bytes))
            self._cache[key] = est
        est = self._cache[key]
        prev = self.choices.get(key)
        self.choices[key] = (est, (prev[1] if prev else 0) + count_per_step)
        return est.time_s

    def estimate(self, c):
        """The cached estimate of a CommOp (None for a single-rank group)."""
        return self._cache.get((c.group, c.op, float(c.size_bytes)))

    def ctas(self, group: str, op: str, size_bytes: float) -> int:
        """SMs the collective occupies while it runs (one CTA per NCCL channel, or ``overlap_comm_sms`` when
        set); call after ``time``."""
        if self.cfg.training.overlap_comm_sms:
            return min(self.cfg.training.overlap_comm_sms, self.gpu.sm_count)
        est = self._cache.get((group, op, float(size_bytes)))
        return est.n_ctas if est is not None else 0


def overlapped_s(compute_s: float, comm_s: float, comm_sms: int, sm_count: int) -> float:
    """Wall time of compute and a communication kernel that start together on one GPU, seconds.

    While the communication runs it holds ``comm_sms`` of the ``sm_count`` SMs, so compute progresses at
    ``r = 1 - comm_sms / sm_count`` of its speed: if the communication outlasts the slowed compute the pair
    takes ``comm_s``, else ``compute_s + comm_s * (1 - r)``. Memory-bandwidth sharing is not modelled.
    """
    return float(shared_sm_time_s(compute_s, comm_s, comm_sms / sm_count))


def _block_times(opset: OpSet, t_ops: np.ndarray, comms: _Comms, cfg: SimConfig, count: int) -> dict:
    """Per-phase compute and exposed-communication seconds of one block for one micro-batch."""
    c = opset.compute
    sm = comms.gpu.sm_count
    per = t_ops * c["count"].to_numpy()
    phase = c["phase"].to_numpy()
    kind = c["kind"].to_numpy()
    is_gemm = kind == "gemm"
    is_attn = (kind == "attn_fwd") | (kind == "attn_bwd")
    is_dgrad = np.array([n.endswith(".dgrad") for n in c["name"]], dtype=bool)
    is_wgrad = np.array([n.endswith(".wgrad") for n in c["name"]], dtype=bool)
    out = {}
    for ph in ("fwd", "bwd", "recompute"):
        sel = phase == ph
        out[f"compute_{ph}"] = float(per[sel].sum())
        out[f"wgrad_{ph}"] = float(per[sel & is_wgrad].sum())
        gemm = float(per[sel & is_gemm].sum())
        dgrad = float(per[sel & is_dgrad].sum())
        attn = float(per[sel & is_attn].sum())
        tp_blocking = tp_dgrad = cp_total = cp_blocking = ep_total = 0.0
        dgrad_sms = cp_sms = 0
        for r in opset.comms:
            if r.phase != ph:
                continue
            dt = comms.time(r.group, r.op, r.size_bytes, r.count * count) * r.count
            if r.group == "cp" and r.overlap == "none":
                cp_blocking += dt
            elif r.group == "cp":
                cp_total += dt
                cp_sms = max(cp_sms, comms.ctas(r.group, r.op, r.size_bytes))
            elif r.group in ("ep", "etp", "tpep"):
                ep_total += dt  # token dispatch/combine sits between the router and the experts
            elif r.overlap == "dgrad":
                tp_dgrad += dt
                dgrad_sms = max(dgrad_sms, comms.ctas(r.group, r.op, r.size_bytes))
            else:
                tp_blocking += dt
        if cfg.training.tp_comm_overlap:
            tp_exposed = overlapped_s(gemm, tp_blocking + tp_dgrad, TP_OVERLAP_SMS, sm) - gemm
        else:
            tp_exposed = tp_blocking + overlapped_s(dgrad, tp_dgrad, dgrad_sms, sm) - dgrad
        out[f"tp_{ph}"] = tp_exposed
        out[f"cp_{ph}"] = cp_blocking + overlapped_s(attn, cp_total, cp_sms, sm) - attn
        out[f"ep_{ph}"] = ep_total
    return out


def _paired_comm(wl, comms: _Comms, kinds) -> tuple:
    """What DualPipe's F&B pairing can hide (see :func:`flowsim.step.schedule.simulate_pipeline`): the expert
    all-to-all seconds per micro-batch in each (stage, chunk)'s forward and backward, and the share of the
    SMs the all-to-all holds."""
    ep_f = sum(n_l * blk["ep_fwd"] for blk, n_l, _ in kinds)
    ep_b = sum(n_l * blk["ep_bwd"] + n_r * blk["ep_recompute"] for blk, n_l, n_r in kinds)
    sms = max((comms.ctas(c.group, c.op, c.size_bytes) for c in (wl.moe_layer.comms if wl.moe_layer else ())
               if c.group == "ep"), default=0)
    return ep_f, ep_b, sms / comms.gpu.sm_count


def _block_runs(wl, runs, first, last) -> dict:
    """Per block, int64[p, 3]: runs of its fwd, bwd and recompute ops by one GPU of each stage per step
    (``runs``: micro-batches through each chunk; ``first``/``last``: (stage, chunk) of the embedding/head)."""
    L, R = wl.chunk_layers, wl.chunk_recompute_layers
    M, RM = wl.chunk_moe_layers, wl.chunk_recompute_moe_layers
    p = L.shape[0]

    def layers(n, n_rec):
        per = n @ runs
        return np.stack([per, per, n_rec @ runs], axis=1).astype(np.int64)

    def ends(chunks):
        out = np.zeros((p, 3), dtype=np.int64)
        for s, c in chunks:
            out[s, :2] += runs[c]
        return out

    out = {"layer": layers(L - M, R - RM), "embedding": ends(first), "head": ends(last)}
    if wl.moe_layer is not None:
        out["moe_layer"] = layers(M, RM)
    return out


def _ops_frame(wl) -> tuple[pd.DataFrame, dict]:
    blocks = {"layer": wl.layer, "embedding": wl.embedding, "head": wl.head}
    if wl.moe_layer is not None:
        blocks["moe_layer"] = wl.moe_layer
    frames, spans, start = [], {}, 0
    for name, ops in blocks.items():
        frames.append(ops.compute)
        spans[name] = slice(start, start + len(ops.compute))
        start += len(ops.compute)
    return pd.concat(frames, ignore_index=True), spans


def _shard_group(t) -> str:
    """Group of the ZeRO/FSDP gathers and reduce-scatters: ``dps`` with hybrid sharding, else all of ``dp``."""
    return "dps" if t.dp_shard < t.dp * t.cp else "dp"


def _fsdp_exposed(cfg, wl, comms, layer_fwd_s, layer_bwd_s):
    """ZeRO-3 / FSDP: per layer weight all-gathers (forward and backward) and gradient reduce-scatters over
    the shard group, prefetched one layer ahead so that each runs beside the neighbouring layer's compute
    (which it slows, see :func:`overlapped_s`). With hybrid sharding the reduced shard is then all-reduced
    across the replicas on a stream of its own (FSDP2's ``all_reduce_stream``), so a layer's backward
    communication lasts the longer of the shard group's gather + reduce-scatter and the replicas'
    all-reduce. With ``comm_engine: flow`` these collectives run in one simulation with the stage's expert
    all-to-alls and pipeline sends of the layer's window (:func:`flowsim.step.flows.layer_cross_kind_extra_s`):
    each takes longer by its extra, and so do the all-to-alls, which lengthen the layer. Returns the extra
    forward and backward seconds per layer and the first layer's gather, which nothing hides."""
    t = cfg.training
    per_layer_params = wl.stage_params[0] / max(int(wl.chunk_layers[0].sum()), 1)
    m = cfg.num_microbatches
    ag_bytes, rs_bytes = per_layer_params * PARAM_GATHER_BYTES, per_layer_params * GRAD_REDUCE_BYTES
    g = _shard_group(t)
    ag = comms.time(g, "allgather", ag_bytes, 2 * m)
    rs = comms.time(g, "reducescatter", rs_bytes, m)
    ar = comms.time("dpr", "allreduce", rs_bytes / t.dp_shard, m)
    sms = max(comms.ctas(g, "allgather", ag_bytes), comms.ctas(g, "reducescatter", rs_bytes),
              comms.ctas("dpr", "allreduce", rs_bytes / t.dp_shard))
    sm = comms.gpu.sm_count
    # seconds of communication beside a layer's forward and backward, and of its all-to-alls' extra
    comm_f, comm_b, ep_f, ep_b = ag, max(ag + rs, ar), 0.0, 0.0
    if t.comm_engine == "flow":  # the layer's all-to-alls and the stage's sends share the network with them
        gather, scatter = (g, 0, "allgather", ag_bytes), (g, 0, "reducescatter", rs_bytes)
        replicas = (("dpr", 0, "allreduce", rs_bytes / t.dp_shard),) if ar > 0 else ()
        x_f, ep_f = layer_cross_kind_extra_s(cfg, comms.gpu, wl, "fwd", (gather,), 1)
        x_b, ep_b = layer_cross_kind_extra_s(cfg, comms.gpu, wl, "bwd", (gather, scatter) + replicas, 2)
        comm_f, comm_b = ag + x_f[0], max(ag + rs + x_b[0] + x_b[1], ar + sum(x_b[2:]))
    return (overlapped_s(layer_fwd_s, comm_f, sms, sm) - layer_fwd_s + ep_f,
            overlapped_s(layer_bwd_s, comm_b, sms, sm) - layer_bwd_s + ep_b, ag)


def grad_bucket_bytes(cfg: SimConfig, wl, stage: int) -> float:
    """Bytes of gradient per bucket of the overlapped data-parallel reduction of ``stage``:
    ``bucket_size_bytes`` when set; with ZeRO-2 (FSDP ``SHARD_GRAD_OP``, which reduce-scatters each wrapped
    block's gradients) one layer's parameters; PyTorch DDP's 25 MiB for eager PyTorch without ZeRO; else
    Megatron-core's default of ``max(40e6, 1e6 * dp * cp)`` parameters (bigger buckets for bigger groups
    keep the collectives from being latency-bound, as its docstring says); ``GRAD_REDUCE_BYTES`` each."""
    t = cfg.training
    if t.bucket_size_bytes:
        return float(t.bucket_size_bytes)
    if t.zero_stage >= 2:
        return wl.stage_params[stage] / max(int(wl.chunk_layers[stage].sum()), 1) * GRAD_REDUCE_BYTES
    if t.kernel_fusion == "eager" and t.zero_stage == 0 and not t.use_distributed_optimizer:
        return float(TORCH_DDP_BUCKET_BYTES)
    return float(max(MEGATRON_BUCKET_PARAMS, MEGATRON_BUCKET_PARAMS_PER_DP_RANK * t.dp * t.cp) * GRAD_REDUCE_BYTES)


def _dp_exposed(cfg, wl, comms, timeline, stage) -> tuple[float, float, float]:
    """Exposed gradient reduction, parameter gathering and cross-kind slow-down of one stage, seconds per step.

    Gradients are reduced in buckets of :func:`grad_bucket_bytes` (Megatron-LM DDP / PyTorch DDP). A chunk's
    gradients become final during the last micro-batch's backward through it; buckets are taken to be
    ready evenly over that window and are reduced one after another on the communication stream. What
    runs past the end of the stage's last backward is exposed. The distributed optimizer's parameter
    all-gather overlaps the next step's forward (``overlap_param_gather``) except for its first bucket.
    With ``comm_engine: flow`` the reduction shares the network with the pipeline sends and expert
    all-to-alls of its window (:func:`flowsim.step.flows.cross_kind_extra_s`): its buckets take longer, and
    so do the stage's own all-to-alls in the window, which lengthen its last backward passes (the third
    value, counted as exposed since the stage ends that much later). The overlapped gather likewise shares
    the network with those of the next step's first forward passes (its window starts with the stage's first
    forward): its buckets take longer and the stage's all-to-alls' extra is added to the third value.
    """
    t = cfg.training
    zero = max(t.zero_stage, 1 if t.use_distributed_optimizer else 0)
    if zero >= 3:
        return 0.0, 0.0, 0.0
    op = "reducescatter" if zero >= 1 else "allreduce"
    n_dense, n_expert = wl.stage_params[stage], wl.stage_expert_params[stage]
    # (group, op, parameters, bytes factor): dense weights over the data- and context-parallel ranks (with
    # hybrid sharding reduce-scattered in the shard group, then the shard all-reduced across the replicas),
    # routed experts over the expert-data-parallel ranks
    parts = [p for p in ((_shard_group(t) if zero >= 1 else "dp", op, n_dense, 1.0),
                         ("dpr", "allreduce", n_dense if zero >= 1 else 0.0, 1.0 / t.dp_shard),
                         ("edp", op, n_expert, 1.0))
             if p[2] > 0 and comms.groups[p[0]][0] > 1]
    times, sms, g_times, g_sms = [], [], [], []  # per part: seconds of each bucket, SMs held
    for g, g_op, n, factor in parts:
        nb = max(1, int(np.ceil(n * GRAD_REDUCE_BYTES / grad_bucket_bytes(cfg, wl, stage))))
        size = n * GRAD_REDUCE_BYTES * factor / nb
        times.append(np.full(nb, comms.time(g, g_op, size, nb)))
        sms.append(comms.ctas(g, g_op, size))
        if g_op == "reducescatter":
            gsize = n * PARAM_GATHER_BYTES / nb
            g_times.append(np.full(nb, comms.time(g, "allgather", gsize, nb)))
            g_sms.append(comms.ctas(g, "allgather", gsize))
    if not times:
        return 0.0, 0.0, 0.0
    bucket_s = np.concatenate(times)  # in the order the reduction issues them
    end = timeline.end_s[stage]
    ready = _bucket_ready(timeline, stage, bucket_s.size) if t.overlap_grad_reduce else np.full(bucket_s.size, end)
    ep_extra = 0.0
    if t.comm_engine == "flow":  # the other kinds' traffic in the reduction's window slows both sides
        reduction = tuple((g, stage, g_op, n * GRAD_REDUCE_BYTES * factor) for g, g_op, n, factor in parts)
        extra, ep_extra = cross_kind_extra_s(cfg, comms.gpu, wl, timeline, reduction, float(ready.min()),
                                             _stream_end_s(bucket_s, ready))
        bucket_s = np.concatenate([a + x / a.size for a, x in zip(times, extra)])
    total = float(bucket_s.sum())
    grad_exposed = max(0.0, _stream_end_s(bucket_s, ready) - end)
    # the part of the reduction that ran beside the backward pass slowed it (see overlapped_s)
    share = max(sms) / comms.gpu.sm_count
    grad_exposed += (total - grad_exposed) * share
    gather_exposed = 0.0
    if g_times:
        if t.overlap_param_gather and t.comm_engine == "flow":  # beside the next step's first forward passes
            gather = tuple((g, stage, "allgather", n * PARAM_GATHER_BYTES) for g, g_op, n, _ in parts
                           if g_op == "reducescatter")
            t0 = float(timeline.start_s[stage].min())
            extra, g_ep = cross_kind_extra_s(cfg, comms.gpu, wl, timeline, gather, t0,
                                             t0 + float(sum(a.sum() for a in g_times)))
            g_times = [a + x / a.size for a, x in zip(g_times, extra)]
            ep_extra += g_ep
        gather_s = np.concatenate(g_times)
        if t.overlap_param_gather:
            gather_exposed = float(gather_s[0] + gather_s[1:].sum() * max(g_sms) / comms.gpu.sm_count)
        else:
            gather_exposed = float(gather_s.sum())
    return grad_exposed, gather_exposed, ep_extra


def _bucket_ready(timeline, stage, nb) -> np.ndarray:
    """When each of ``nb`` gradient buckets of a stage is ready, seconds: evenly over the last backward of its
    chunk (chunks in order of completion)."""
    starts, ends = timeline.last_bwd_start_s[stage], timeline.last_bwd_end_s[stage]
    order = np.argsort(ends)
    per_chunk = nb // order.size + (np.arange(order.size) < nb % order.size)
    chunk = np.repeat(order, per_chunk)
    j = np.concatenate([np.arange(1, k + 1) for k in per_chunk])
    return starts[chunk] + (ends[chunk] - starts[chunk]) * j / np.repeat(per_chunk, per_chunk)


def _stream_end_s(bucket_s, ready) -> float:
    """End of buckets reduced one after another on one stream, seconds: ``finish_k = max(finish_{k-1},
    ready_k) + t_k``, i.e. ``S_n + max_k (ready_k - S_{k-1})`` with ``S_k`` the cumulative bucket seconds."""
    before = np.concatenate([[0.0], np.cumsum(bucket_s)[:-1]])
    return float(bucket_s.sum() + np.max(ready - before))


def _optimizer_s(cfg, wl, gpu) -> np.ndarray:
    """Adam step of one GPU of every stage (memory-bound over the local parameter shard), plus, with
    eager kernels, PyTorch's per-parameter data-parallel gradient work (:mod:`flowsim.model.fusion`), seconds."""
    t = cfg.training
    zero = max(t.zero_stage, 1 if t.use_distributed_optimizer else 0)
    edp = t.tp * t.cp * t.dp // (t.ep * t.expert_tensor_parallel_size)
    held = np.asarray(wl.stage_params) + np.asarray(wl.stage_expert_params)
    n = (np.asarray(wl.stage_params) / (t.dp_shard if zero >= 1 else 1)
         + np.asarray(wl.stage_expert_params) / (edp if zero >= 1 else 1))
    nbytes = ADAM_BYTES_PER_PARAM * n
    if t.kernel_fusion == "eager" and t.dp * t.cp > 1:
        nbytes = nbytes + eager_grad_bytes_per_param(zero, cfg.num_microbatches) * held
    eff = stream_efficiency(memory_reference(gpu).measured)
    return np.maximum(nbytes / (gpu.hbm_Bps * eff), KERNEL_MIN_TIME_S)


def _coerce_config(config, overrides) -> SimConfig:
    if isinstance(config, SimConfig):
        if overrides:
            raise TypeError("pass overrides with a mapping or file config, not with a SimConfig")
        return config
    if isinstance(config, (str, Path, Mapping)) or config is None:
        return build_config(config, **overrides)
    raise TypeError(f"config must be a SimConfig, a mapping or a file path, not {type(config).__name__}")


def simulate(config=None, **overrides) -> Result:
    """Predict one optimizer step of a training job.

    Parameters
    ----------
    config : SimConfig, mapping or path, optional
        A built config, a mapping of Megatron-LM argument names / aliases (``model`` and ``cluster`` may be
        preset names), or a YAML/JSON file.
    **overrides
        Extra keys applied on top of ``config`` (e.g. ``tp=8``).

    Returns
    -------
    Result
        Step time, throughput, MFU, memory and per-stage breakdown (see :class:`flowsim.Result`).

    Raises
    ------
    ConfigError
        For an unknown key, preset or GPU, or a broken rule (the message names the field).
    """
    cfg = _coerce_config(config, overrides)
    gpu = get_gpu(cfg.cluster.gpu)
    t, p, m = cfg.training, cfg.training.pp, cfg.num_microbatches
    wl = build_workload(cfg)
    v = wl.chunk_layers.shape[1]  # model chunks per stage (dualpipe: 2 with vpp 1)
    runs = microbatches_per_chunk(t.schedule, m, v)  # micro-batches through each chunk per step
    first, last = end_chunks(t.schedule, p, v)  # (stage, chunk) running the embedding, the LM head
    comms = _Comms(cfg, gpu)

    ops, spans = _ops_frame(wl)
    t_ops = op_times(ops, gpu)
    L, R = wl.chunk_layers, wl.chunk_recompute_layers
    M, RM = wl.chunk_moe_layers, wl.chunk_recompute_moe_layers
    per_gpu_layers = int((L @ runs).max())
    layer = _block_times(wl.layer, t_ops[spans["layer"]], comms, cfg, per_gpu_layers)
    moe = (_block_times(wl.moe_layer, t_ops[spans["moe_layer"]], comms, cfg, int((M @ runs).max()))
           if wl.moe_layer is not None else None)
    emb = _block_times(wl.embedding, t_ops[spans["embedding"]], comms, cfg, m)
    head = _block_times(wl.head, t_ops[spans["head"]], comms, cfg, m)
    # (block, layers per chunk, recomputed layers per chunk) for the dense and the MoE layers
    kinds = [(layer, L - M, R - RM)] + ([(moe, M, RM)] if moe is not None else [])

    def part(b, kind):
        """Per-micro-batch seconds of one block: kind 'fwd', 'bwd' or 'recompute'."""
        return b[f"compute_{kind}"] + b[f"tp_{kind}"] + b[f"cp_{kind}"] + b[f"ep_{kind}"]

    zero = max(t.zero_stage, 1 if t.use_distributed_optimizer else 0)
    fsdp_f = fsdp_b = first_gather = 0.0
    if zero >= 3 and t.dp * t.cp > 1:
        fsdp_f, fsdp_b, first_gather = _fsdp_exposed(cfg, wl, comms, part(layer, "fwd"), part(layer, "bwd"))
    fwd_s = L * fsdp_f
    bwd_s = L * fsdp_b
    wgrad_s = np.zeros_like(fwd_s)  # weight-gradient GEMMs, a pass of their own in zb-h1 and dualpipe
    for blk, n_l, n_r in kinds:
        fwd_s = fwd_s + n_l * part(blk, "fwd")
        bwd_s = bwd_s + n_l * part(blk, "bwd") + n_r * part(blk, "recompute")
        wgrad_s = wgrad_s + n_l * blk["wgrad_bwd"]
    for s, c in first:
        fwd_s[s, c] += part(emb, "fwd") + first_gather  # the first layer's weights cannot be prefetched
        bwd_s[s, c] += part(emb, "bwd")
    for s, c in last:
        fwd_s[s, c] += part(head, "fwd")
        bwd_s[s, c] += part(head, "bwd")

    p2p = comms.time("pp", "sendrecv", wl.p2p_bytes, 2 * int(runs.sum())) if p > 1 else 0.0
    paired = t.paired_1f1b
    hidden = _paired_comm(wl, comms, kinds) if t.schedule == "dualpipe" or paired else None
    tl = simulate_pipeline(t.schedule, m, fwd_s, bwd_s, p2p, wgrad_s, hidden, paired=paired)
    tl0 = simulate_pipeline(t.schedule, m, fwd_s, bwd_s, 0.0, wgrad_s, hidden, paired=paired) if p > 1 else tl
    pp_exposed = max(0.0, float(tl.end_s.max() - tl0.end_s.max()))

    dp_x = [sum(_dp_exposed(cfg, wl, comms, tl, s)) for s in range(p)]
    opt_s = _optimizer_s(cfg, wl, gpu)
    mems = [stage_memory(cfg, wl, s) for s in range(p)]
    step = float(max(tl.end_s[s] + dp_x[s] + opt_s[s] for s in range(p)))

    # expert all-to-all time that DualPipe's pairing hid: the passes' full times less what the stages ran
    hid = (fwd_s + bwd_s) @ runs - tl.busy_s if hidden is not None else np.zeros(p)
    stages = []
    for s in range(p):
        tot = dict.fromkeys(("compute", "tp", "cp", "ep"), 0.0)
        for blk, n_l, n_r in kinds:
            nl, nr = int(n_l[s] @ runs), int(n_r[s] @ runs)
            for key in tot:
                tot[key] += nl * (blk[f"{key}_fwd"] + blk[f"{key}_bwd"]) + nr * blk[f"{key}_recompute"]
        n_emb, n_head = (sum(int(runs[c]) for sc, c in ends if sc == s) for ends in (first, last))
        for blk, n in ((emb, n_emb), (head, n_head)):
            tot["compute"] += n * (blk["compute_fwd"] + blk["compute_bwd"])
            tot["tp"] += n * (blk["tp_fwd"] + blk["tp_bwd"])
        tot["ep"] -= max(0.0, float(hid[s]))
        dp_c = int(L[s] @ runs) * (fsdp_f + fsdp_b) + dp_x[s] + n_emb * first_gather
        busy = sum(tot.values()) + dp_c + opt_s[s] + pp_exposed
        stages.append(StageBreakdown(stage=s, compute_s=tot["compute"], tp_comm_s=tot["tp"], cp_comm_s=tot["cp"],
                                     ep_comm_s=tot["ep"], pp_comm_s=pp_exposed, dp_comm_s=dp_c,
                                     bubble_s=max(0.0, step - busy), optimizer_s=float(opt_s[s]),
                                     memory_bytes=mems[s].total_bytes))

    tokens = cfg.tokens_per_step
    model_flops = model_flops_per_token(cfg) * tokens
    flops_ops = ops["flops"].to_numpy() * ops["count"].to_numpy()
    is_rec = ops["phase"].to_numpy() == "recompute"
    fb = {name: float(flops_ops[sl][~is_rec[sl]].sum()) for name, sl in spans.items()}
    rec = {k: float(flops_ops[spans[k]][is_rec[spans[k]]].sum()) for k in spans}
    # every GPU of a stage runs the same ops: sum one GPU per stage, times the GPUs per stage
    per_stage_gpu = (((L - M) @ runs).sum() * fb["layer"] + ((R - RM) @ runs).sum() * rec["layer"]
                     + m * (fb["embedding"] + fb["head"]))
    if "moe_layer" in spans:
        per_stage_gpu += (M @ runs).sum() * fb["moe_layer"] + (RM @ runs).sum() * rec["moe_layer"]
    hardware_flops = float(per_stage_gpu) * t.tp * t.cp * t.dp
    n_gpus = cfg.cluster.num_gpus
    peak = gpu.peak("fp16" if t.precision == "fp16" else "bf16")
    mem_peak = max(x.total_bytes for x in mems)
    worst = mems[int(np.argmax([x.total_bytes for x in mems]))]

    choices = tuple(
        CollectiveChoice(group=g, op=op, size_bytes=size, n_ranks=comms.groups[g][0], algo=est.algo,
                         proto=est.proto, time_s=est.time_s, count_per_step=int(cnt))
        for (g, op, size), (est, cnt) in sorted(comms.choices.items()))
    return Result(
        step_time_s=step,
        tokens_per_s=tokens / step,
        model_flops=model_flops,
        hardware_flops=hardware_flops,
        tflops_per_gpu=model_flops / step / n_gpus / 1e12,
        mfu=model_flops / (step * n_gpus * peak),
        hfu=hardware_flops / (step * n_gpus * peak),
        peak_flop_per_s=peak,
        memory_bytes_per_gpu=mem_peak,
        memory_capacity_bytes=gpu.hbm_bytes,
        fits_memory=bool(mem_peak <= gpu.hbm_bytes),
        stages=tuple(stages),
        collectives=choices,
        config=_config_dict(cfg),
        memory_detail={"weights": worst.weights_bytes, "gradients": worst.gradients_bytes,
                       "optimizer": worst.optimizer_bytes, "activations": worst.activations_bytes},
        timeline=StepTimeline(pipeline=tl, p2p_s=p2p, p2p_bytes=wl.p2p_bytes, chunk_layers=L, chunk_moe_layers=M,
                              chunk_recompute_layers=R, chunk_recompute_moe_layers=RM, ops=ops, op_time_s=t_ops,
                              spans=spans,
                              comms={b: tuple((c, comms.estimate(c)) for c in getattr(wl, b).comms)
                                     for b in ("layer", "moe_layer") if getattr(wl, b) is not None},
                              group_sizes={g: n for g, (n, _) in comms.groups.items()},
                              dp_exposed_s=tuple(dp_x), optimizer_s=tuple(float(x) for x in opt_s),
                              block_runs=_block_runs(wl, runs, first, last)),
    )


def _config_dict(cfg: SimConfig) -> dict:
    return {"model": dataclasses.asdict(cfg.model), "cluster": dataclasses.asdict(cfg.cluster),
            "training": dataclasses.asdict(cfg.training)}
