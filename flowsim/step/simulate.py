"""The public entry point: ``flowsim.simulate(config) -> Result``.

One call builds the workload (:mod:`flowsim.model.workload`), prices every compute op with the kernel model
(:mod:`flowsim.kernels`) and every collective with NCCL's model for where its ranks sit
(:class:`flowsim.step.pricer.CollectivePricer`), turns the blocks into per-stage pass times
(:mod:`flowsim.step.blocks`), runs the pipeline in the step core (:mod:`flowsim.step.core`), overlaps the
data-parallel traffic with the backward pass (:mod:`flowsim.step.data_parallel`), adds the optimizer step
(:mod:`flowsim.step.optimizer`) and accounts memory (:mod:`flowsim.step.memory`).

Ranks are numbered as Megatron-LM orders its groups (``tp`` fastest, then ``cp``, ``dp``, ``pp``;
:func:`flowsim.config.layout.group_spans`), so a tensor-parallel group occupies consecutive GPUs, a
data-parallel group strides by ``tp * cp`` and the pipeline neighbours stride by ``tp * cp * dp``. Gradients
are reduced over the data- and context-parallel ranks together, as Megatron-LM does.
"""
from __future__ import annotations

import copy
import dataclasses
import warnings
from pathlib import Path
from typing import Mapping, NamedTuple

import numpy as np

from flowsim.config import SimConfig, build_config
from flowsim.config.layout import end_chunks, group_spans, microbatches_per_chunk
from flowsim.errors import ConfigError
from flowsim.gpu_specs import get_gpu
from flowsim.kernels import op_times
from flowsim.kernels.calibration import job_stack
from flowsim.model.host_costs import block_host_s
from flowsim.model.memo import BoundedCache
from flowsim.model.workload import block_key, build_workload, model_flops_per_token
from flowsim.step.blocks import (PHASES, block_runs, block_times, compute_parts, counted_calls, op_columns,
                                 paired_comm, pass_s)
from flowsim.step.core import PipelineProgram, run_pipeline, step_end_s
from flowsim.step.data_parallel import dp_exposed_stages, fsdp_exposed, zero_level
from flowsim.step.flows import FLOW_GROUPS, flow_time_s
from flowsim.step.host import PassHost, pass_host, segment_terms
from flowsim.step.invariants import check_result
from flowsim.step.memory import stage_memories as _stage_memories
from flowsim.step.optimizer import optimizer_s
from flowsim.step.pricer import CollectivePricer
from flowsim.step.result import CollectiveChoice, Result, StageBreakdown, StepTimeline
from flowsim.step.schedule import SPLIT_BACKWARD


@dataclasses.dataclass(frozen=True)
class _Passes:
    """A parametric step's program and what its breakdown needs: the block times (``kinds``: per layer kind,
    (block times, layers per chunk, recomputed layers per chunk); ``emb``, ``head``), ZeRO-3's per-layer extra
    seconds, micro-batches per chunk and the (stage, chunk) pairs of the embedding and the LM head."""

    program: PipelineProgram
    kinds: list
    emb: dict
    head: dict
    fsdp_f: float
    fsdp_b: float
    first_gather: float
    runs: np.ndarray
    first: tuple
    last: tuple


def _pricer(cfg: SimConfig, gpu) -> CollectivePricer:
    """The step's collective pricer: Megatron's groups, the flow engine where it prices them."""
    t = cfg.training

    def flow(group, op, size_bytes):
        return flow_time_s(cfg, gpu, group, op, size_bytes) if group in FLOW_GROUPS else None

    return CollectivePricer(cfg.cluster, gpu, group_spans(t), override=flow if t.comm_engine == "flow" else None,
                            comm_sms=t.overlap_comm_sms)


def _kernel_stack(cfg: SimConfig, gpu):
    """The software release, power limit and calibrated GEMM multiplier the job's kernels are priced with."""
    t = cfg.training
    return job_stack(gpu, t.software_release, cfg.cluster.power_limit_w, t.calibration, t.framework_version)


class _Priced(NamedTuple):
    """A workload's op table priced on one GPU and kernel stack: seconds of one launch of each op (read-only),
    each block's compute seconds by phase (:func:`flowsim.step.blocks.compute_parts`), the pricing's warnings and
    its key in the cache of priced tables."""

    t_ops: np.ndarray
    parts: dict
    warnings: tuple
    key: tuple


# Priced op tables, by (the workload's block key, GPU, kernel stack): the kernel model is a pure function of the
# table and the last two (its measurement tables are read once per process), and the block key determines the
# table (flowsim.model.workload.block_key), so the configs that share them (a repeated estimate, the same job on
# another fabric, a tune's layouts that differ in pipeline, schedule or ZeRO stage) are priced once; the warnings
# the pricing raised are re-issued at every reuse (1,024 kept: the 504 block keys of a tune of gpt3-175b on 1,024
# GPUs, a few KB each). Stage memory, by (model, training config): it reads nothing else.
_OP_TIMES = BoundedCache(1024)
_STAGE_MEMORY = BoundedCache(256)
# Block times (flowsim.step.blocks.block_times), by (priced table, block, what it reads of the pricer,
# tp_comm_overlap) without the flow engine. Of the pricer a block reads the tensor-parallel size, comm_sms, the GPU
# (in the priced table's key) and the estimates of its collectives, functions of each group's layout as NCCL's model
# reads it (CollectivePricer.layout_key: without the NIC fields for a group inside one scale-up domain). So configs
# that agree on these (a tune's layouts that differ in pipeline, batch or ZeRO stage; a runs file's or a NIC study's
# jobs that differ in NIC rate or node count, whose TP, CP and EP groups stay inside a domain) price a block's
# collectives once; the calls each block counts are counted again at every reuse (CollectivePricer.recount). 4,096
# kept, a few KB each.
_BLOCK_TIMES = BoundedCache(4096)
# Host terms of a step's passes (flowsim.step.host.pass_host), by everything _pass_host reads: the priced table's key
# (block key, GPU, kernel stack: the op rows and their GPU seconds), the host model's training fields and CPU family,
# each block's pass seconds (their float64 bits) and layer counts, the end chunks and whether the backward is split.
# Configs whose passes agree (a runs file's rows that differ in their NIC rate, whose fabric only the data-parallel
# and pipeline traffic crosses) build them once. 4,096 kept, a few KB each.
_PASS_HOST = BoundedCache(4096)
# The optimizer step's seconds per stage (flowsim.step.optimizer.optimizer_s), by (model, training config, GPU, host
# CPU family): it reads the workload (built from the first two), the GPU's bandwidth and the CPU's host costs.
_OPTIMIZER = BoundedCache(256)
# Hardware FLOPs of a step (_step_flops), by (model, training config): it reads the workload built from them, the
# layout and the micro-batches (a runs file's rows that differ only in their cluster count them once).
_HARDWARE_FLOPS = BoundedCache(256)


def stage_memories(cfg: SimConfig, wl) -> tuple:
    """The :func:`flowsim.step.memory.stage_memories` of ``cfg`` (workload ``wl``), built
    once per (model, training config) and shared by :func:`simulate` and the explorers' memory check."""
    return _STAGE_MEMORY.get((cfg.model, cfg.training), lambda: _stage_memories(cfg, wl))


def _optimizer_s(cfg: SimConfig, wl, gpu) -> np.ndarray:
    """:func:`flowsim.step.optimizer.optimizer_s` of ``cfg`` (workload ``wl``), built once per :data:`_OPTIMIZER` key
    (read-only: the value is shared)."""
    def build():
        out = optimizer_s(cfg, wl, gpu)
        out.flags.writeable = False
        return out

    return _OPTIMIZER.get((cfg.model, cfg.training, gpu, cfg.cluster.cpu), build)


def _priced(wl, t_ops: np.ndarray, caught, key: tuple) -> _Priced:
    """The :class:`_Priced` of ``wl``'s op table from its seconds ``t_ops``, the warnings ``caught`` and its cache
    ``key``."""
    t_ops.flags.writeable = False
    parts = {name: compute_parts(getattr(wl, name), t_ops[sl]) for name, sl in wl.op_table[1].items()}
    return _Priced(t_ops, parts, tuple(w.message for w in caught), key)


def _op_seconds(cfg: SimConfig, wl, gpu) -> _Priced:
    """``wl.op_table`` priced by :func:`flowsim.kernels.op_times` (flowsim's own table: ``trusted``)."""
    stack = _kernel_stack(cfg, gpu)
    key = (wl.block_key, gpu, stack)

    def price():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t_ops = op_times(wl.op_table[0], gpu, stack=stack, trusted=True)
        return _priced(wl, t_ops, caught, key)

    priced = _OP_TIMES.get(key, price)
    for message in priced.warnings:
        warnings.warn(message, stacklevel=3)
    return priced


def price_op_tables(configs) -> int:
    """Price the op tables of ``configs`` (SimConfigs) that :func:`simulate` has not priced yet in one kernel call
    per (GPU, kernel stack), and keep them for :func:`simulate`: a sweep's hundreds of distinct tables (one per
    block key) priced together instead of one call each. The kernel model prices row by row, so each table's
    seconds are those of its own call (tests/test_block_key.py compares). A group whose call warns or raises is
    left to :func:`simulate`, which prices each of its tables alone (the warnings and errors belong to each);
    so is a config whose GPU or workload cannot be had, and every table past the cache's size (the first ones
    in ``configs`` order are kept). Returns the number of tables priced."""
    todo: dict = {}
    stacks: dict = {}  # (GPU, kernel stack) by what they are built from; ids of clusters alive in ``configs``
    for cfg in configs:
        t = cfg.training
        try:
            where = (id(cfg.cluster), t.software_release, t.calibration, t.framework_version)
            gpu_stack = stacks.get(where)
            if gpu_stack is None:
                gpu = get_gpu(cfg.cluster.gpu)
                gpu_stack = stacks[where] = (gpu, _kernel_stack(cfg, gpu))
            key = (block_key(cfg),) + gpu_stack
            if key not in todo and key not in _OP_TIMES:
                if len(todo) == _OP_TIMES.size:
                    break
                todo[key] = build_workload(cfg)
        except Exception:  # noqa: BLE001 -- an optimisation pass: simulate raises it for that config
            continue
    groups: dict = {}
    for key, wl in todo.items():
        groups.setdefault(key[1:], []).append((key, wl))
    priced = 0
    for (gpu, stack), items in groups.items():
        tables = [wl.op_table[0] for _, wl in items]
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                t_all = op_times({c: np.concatenate([t[c] for t in tables]) for c in tables[0]}, gpu, stack=stack,
                                 trusted=True)
        except Exception:  # noqa: BLE001 -- as above
            continue
        if caught:
            continue
        sizes = [len(t["kind"]) for t in tables]
        for (key, wl), stop, size in zip(items, np.cumsum(sizes), sizes):
            _OP_TIMES.get(key, lambda: _priced(wl, t_all[stop - size:stop].copy(), (), key))
            priced += 1
    return priced


def _block_kinds(cfg, wl, comms, priced: _Priced, spans, runs) -> tuple:
    """Times of every block: (dense, MoE) layer kinds with their layer counts, the embedding, the head."""
    t, m = cfg.training, cfg.num_microbatches
    L, R, M, RM = wl.chunk_layers, wl.chunk_recompute_layers, wl.chunk_moe_layers, wl.chunk_recompute_moe_layers

    where = None if t.comm_engine == "flow" else (comms.groups["tp"], t.overlap_comm_sms)

    def times(name, count):
        opset, fresh = getattr(wl, name), []

        def build():
            fresh.append(True)
            return (block_times(opset, priced.t_ops[spans[name]], comms, t.tp_comm_overlap, count,
                                parts=priced.parts[name]), counted_calls(opset, comms))

        if where is None:
            return build()[0]
        layouts = tuple(sorted({(r.group, comms.layout_key(r.group) if r.group in comms.groups else None)
                                for r in opset.comms}))  # what its collectives read (an unknown group: build raises)
        blk, calls = _BLOCK_TIMES.get((priced.key, name, where, layouts, t.tp_comm_overlap), build)
        if not fresh:
            comms.recount(calls, count)
        return blk

    kinds = [(times("layer", int((L @ runs).max())), L - M, R - RM)]
    if wl.moe_layer is not None:
        kinds.append((times("moe_layer", int((M @ runs).max())), M, RM))
    return kinds, times("embedding", m), times("head", m)


def _pass_host(cfg, wl, priced_key, t_ops, spans, kinds, emb, head, first, last) -> PassHost | None:
    """Each pass's CPU issue time and lag (:func:`flowsim.step.host.pass_host`) from every op's host cost
    (:func:`flowsim.model.host_costs.block_host_s`), built once per :data:`_PASS_HOST` key (``priced_key``: the
    key of the priced table ``t_ops``); None without a host model."""
    t = cfg.training
    if t.host_overhead == "none":
        return None
    split = t.schedule in SPLIT_BACKWARD
    passes = np.array([[pass_s(blk, ph) for ph in PHASES] for blk in [k[0] for k in kinds] + [emb, head]])
    key = (priced_key, t.host_overhead, t.calibration, t.software_release, t.framework_version, t.cuda_graphs,
           cfg.cluster.cpu, passes.tobytes(), tuple((n_l.shape, n_l.dtype.str, n_l.tobytes(), n_r.dtype.str,
                                                     n_r.tobytes()) for _, n_l, n_r in kinds), first, last, split)
    return _PASS_HOST.get(key, lambda: _build_pass_host(cfg, wl, t_ops, spans, kinds, emb, head, first, last, split))


def _build_pass_host(cfg, wl, t_ops, spans, kinds, emb, head, first, last, split: bool) -> PassHost:
    """The :func:`_pass_host` of a step, built (its arrays read-only: the value is shared)."""
    t = cfg.training
    a = wl.op_table[2]
    cols = {k: a[k] for k in ("name", "kind", "phase", "count")}
    wgrad = a["wgrad"]
    gpu_s = t_ops * cols["count"]

    def terms(block, blk):
        sl = spans[block]
        host = block_host_s({k: v[sl] for k, v in cols.items()}, t, cfg.cluster.cpu)
        return segment_terms(cols["phase"][sl], wgrad[sl], gpu_s[sl], host, {ph: pass_s(blk, ph) for ph in PHASES})

    names = ["layer"] + (["moe_layer"] if wl.moe_layer is not None else [])
    layers = [(terms(b, blk), n_l, n_r) for b, (blk, n_l, n_r) in zip(names, kinds)]
    out = pass_host(layers, terms("embedding", emb), terms("head", head), first, last, split)
    for x in out:
        x.flags.writeable = False
    return out


def _passes(cfg: SimConfig, wl, comms: CollectivePricer, ops, priced: _Priced, spans: dict) -> _Passes:
    """Per-stage, per-chunk pass times of one micro-batch (the step program) from the workload's blocks."""
    t, p, m = cfg.training, cfg.training.pp, cfg.num_microbatches
    v = wl.chunk_layers.shape[1]  # model chunks per stage (dualpipe: 2 with vpp 1)
    runs = microbatches_per_chunk(t.schedule, m, v)  # micro-batches through each chunk per step
    first, last = end_chunks(t.schedule, p, v)  # (stage, chunk) running the embedding, the LM head
    kinds, emb, head = _block_kinds(cfg, wl, comms, priced, spans, runs)
    L = wl.chunk_layers
    fsdp_f = fsdp_b = first_gather = 0.0
    if zero_level(t) >= 3 and t.dp * t.cp > 1:
        layer = kinds[0][0]
        fsdp_f, fsdp_b, first_gather = fsdp_exposed(cfg, wl, comms, pass_s(layer, "fwd"), pass_s(layer, "bwd"))
    fwd_s, bwd_s = L * fsdp_f, L * fsdp_b
    wgrad_s = np.zeros_like(fwd_s)  # weight-gradient GEMMs, a pass of their own in zb-h1 and dualpipe
    for blk, n_l, n_r in kinds:
        fwd_s = fwd_s + n_l * pass_s(blk, "fwd")
        bwd_s = bwd_s + n_l * pass_s(blk, "bwd") + n_r * pass_s(blk, "recompute")
        wgrad_s = wgrad_s + n_l * blk["wgrad_bwd"]
    for s, c in first:
        fwd_s[s, c] += pass_s(emb, "fwd") + first_gather  # the first layer's weights cannot be prefetched
        bwd_s[s, c] += pass_s(emb, "bwd")
    for s, c in last:
        fwd_s[s, c] += pass_s(head, "fwd")
        bwd_s[s, c] += pass_s(head, "bwd")
    p2p = comms.time("pp", "sendrecv", wl.p2p_bytes, 2 * int(runs.sum())) if p > 1 else 0.0
    hidden = paired_comm(wl, comms, kinds) if t.schedule == "dualpipe" or t.paired_1f1b else None
    program = PipelineProgram(schedule=t.schedule, microbatches=m, fwd_s=fwd_s, bwd_s=bwd_s, p2p_s=p2p,
                              wgrad_s=wgrad_s, hidden=hidden, paired=t.paired_1f1b,
                              host=_pass_host(cfg, wl, priced.key, priced.t_ops, spans, kinds, emb, head, first, last),
                              p2p_sync=t.syncs_p2p, engine=t.pipeline_engine)
    return _Passes(program, kinds, emb, head, fsdp_f, fsdp_b, first_gather, runs, first, last)


_COMPONENTS = ("compute", "tp", "cp", "ep")  # the rows of _stage_breakdowns' per-stage sums, in their summing order
_PASS_KEYS = tuple((f"{k}_fwd", f"{k}_bwd", f"{k}_recompute") for k in _COMPONENTS)


def _stage_breakdowns(wl, ps: _Passes, run, dp_x, opt_s, mems, step: float) -> tuple:
    """Where each stage's step goes (:class:`StageBreakdown`), seconds per step: the components of all stages
    summed at once (a row per component, a column per stage), each element by the same float operations in the
    same order as a loop over the stages."""
    tl, runs, prog = run.timeline, ps.runs, ps.program
    n = len(dp_x)
    tot = np.zeros((len(_COMPONENTS), n))
    for blk, n_l, n_r in ps.kinds:  # per layer kind: layer runs x (fwd + bwd) + recomputed runs x recompute
        fb = np.array([blk[f] + blk[b] for f, b, _ in _PASS_KEYS])
        rc = np.array([blk[r] for _, _, r in _PASS_KEYS])
        tot = tot + ((n_l @ runs) * fb[:, None] + (n_r @ runs) * rc[:, None])
    end_runs = np.zeros((2, n), dtype=np.int64)  # per stage: micro-batches through the embedding, the head
    for i, ends in enumerate((ps.first, ps.last)):
        for sc, c in ends:
            end_runs[i, sc] += int(runs[c])
    for blk, k_runs in ((ps.emb, end_runs[0]), (ps.head, end_runs[1])):  # compute and tp only
        per_run = np.array([[blk["compute_fwd"] + blk["compute_bwd"]], [blk["tp_fwd"] + blk["tp_bwd"]]])
        tot[:2] = tot[:2] + k_runs * per_run
    if prog.hidden is not None:  # expert all-to-all time that DualPipe's pairing hid: full passes less what ran
        hid = (prog.fwd_s + prog.bwd_s) @ runs - tl.busy_s
        tot[3] = tot[3] - np.where(hid > 0.0, hid, 0.0)  # max(0.0, hid), zeros' signs too (else: x - 0.0 is x)
    dp_c = (wl.chunk_layers @ runs) * (ps.fsdp_f + ps.fsdp_b) + np.asarray(dp_x, dtype=np.float64) \
        + end_runs[0] * ps.first_gather
    opt = np.asarray(opt_s, dtype=np.float64)
    pp = run.pp_exposed_s
    idle = step - (0.0 + tot[0] + tot[1] + tot[2] + tot[3] + dp_c + opt + pp)
    bubble = np.where(idle > 0.0, idle, 0.0)  # max(0.0, step - busy)
    return tuple(StageBreakdown(stage, c, tp, cp, pp, dp, b, o, mem.total_bytes, ep)
                 for stage, (c, tp, cp, ep, dp, b, o, mem) in enumerate(zip(
                     *tot.tolist(), dp_c.tolist(), bubble.tolist(), opt.tolist(), mems)))


def _hardware_flops(cfg: SimConfig, wl, spans: dict, runs: np.ndarray) -> float:
    """FLOPs every GPU of the job runs in one step, recompute included (:func:`_step_flops`), counted once per
    :data:`_HARDWARE_FLOPS` key."""
    return _HARDWARE_FLOPS.get((cfg.model, cfg.training), lambda: _step_flops(cfg, wl, spans, runs))


def _step_flops(cfg: SimConfig, wl, spans: dict, runs: np.ndarray) -> float:
    """FLOPs every GPU of the job runs in one step, recompute included: one GPU per stage, times the GPUs per
    stage (they all run the same ops)."""
    t, m = cfg.training, cfg.num_microbatches
    L, R, M, RM = wl.chunk_layers, wl.chunk_recompute_layers, wl.chunk_moe_layers, wl.chunk_recompute_moe_layers
    a = wl.op_table[2]
    flops_ops = a["flops"] * a["count"]
    is_rec = a["phase"] == "recompute"
    fb = {name: float(flops_ops[sl][~is_rec[sl]].sum()) for name, sl in spans.items()}
    rec = {k: float(flops_ops[spans[k]][is_rec[spans[k]]].sum()) for k in spans}
    per_stage_gpu = (((L - M) @ runs).sum() * fb["layer"] + ((R - RM) @ runs).sum() * rec["layer"]
                     + m * (fb["embedding"] + fb["head"]))
    if "moe_layer" in spans:
        per_stage_gpu += (M @ runs).sum() * fb["moe_layer"] + (RM @ runs).sum() * rec["moe_layer"]
    return float(per_stage_gpu) * t.tp * t.cp * t.dp


def _choices(comms: CollectivePricer) -> tuple:
    """Every collective the step ran, with NCCL's choice and its calls per step."""
    return tuple(
        CollectiveChoice(group=g, op=op, size_bytes=size, n_ranks=comms.groups[g][0], algo=est.algo,
                         proto=est.proto, time_s=est.time_s, count_per_step=int(cnt))
        for (g, op, size), (est, cnt) in sorted(comms.calls.items()))


def _timeline(wl, ps: _Passes, run, comms, ops, t_ops, spans, dp_x, opt_s) -> StepTimeline:
    """What traces and Chakra exports need of the step."""
    return StepTimeline(
        pipeline=run.timeline, p2p_s=ps.program.p2p_s, p2p_bytes=wl.p2p_bytes, chunk_layers=wl.chunk_layers,
        chunk_moe_layers=wl.chunk_moe_layers, chunk_recompute_layers=wl.chunk_recompute_layers,
        chunk_recompute_moe_layers=wl.chunk_recompute_moe_layers, op_columns=ops, op_time_s=t_ops, spans=spans,
        comms={b: tuple((c, comms.estimate_of(c.group, c.op, c.size_bytes)) for c in getattr(wl, b).comms)
               for b in ("layer", "moe_layer") if getattr(wl, b) is not None},
        group_sizes={g: n for g, (n, _) in comms.groups.items()}, dp_exposed_s=tuple(dp_x),
        optimizer_s=tuple(float(x) for x in opt_s), block_runs=block_runs(wl, ps.runs, ps.first, ps.last))


def _coerce_config(config, overrides) -> SimConfig:
    if isinstance(config, SimConfig):
        if overrides:
            raise TypeError("pass overrides with a mapping or file config, not with a SimConfig")
        return config
    if isinstance(config, (str, Path, Mapping)) or config is None:
        return build_config(config, **overrides)
    raise TypeError(f"config must be a SimConfig, a mapping or a file path, not {type(config).__name__}")


FLASH_ATTN_MIN_CC = 75
"""Oldest NVIDIA compute capability (x10) any FlashAttention runs on: FlashAttention 1 supports Turing (7.5) and
Ampere, FlashAttention 2 and cuDNN's fused attention Ampere (8.0) and newer (Dao-AILab/flash-attention README);
Volta (7.0) runs unfused attention."""


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
    InvariantError
        When the result breaks an invariant of :mod:`flowsim.step.invariants` (a flowsim bug; the one-line
        message names the config).
    """
    cfg = _coerce_config(config, overrides)
    gpu = get_gpu(cfg.cluster.gpu)
    if cfg.training.half_dtype not in gpu.peak_flop_per_s:  # e.g. bf16 on a V100: say which precisions it runs
        units = ", ".join(d for d in ("fp16", "bf16") if d in gpu.peak_flop_per_s)
        raise ConfigError("precision", f"{gpu.key} has no {cfg.training.half_dtype} tensor cores; use {units}",
                          cfg.training.precision)
    if cfg.training.use_flash_attn and gpu.vendor == "nvidia" and gpu.compute_capability < FLASH_ATTN_MIN_CC:
        raise ConfigError("use_flash_attn", f"FlashAttention needs compute capability {FLASH_ATTN_MIN_CC / 10:.1f} "
                          f"or newer ({gpu.key} is {gpu.compute_capability / 10:.1f}); set use_flash_attn: false",
                          True)
    wl = build_workload(cfg)
    comms = _pricer(cfg, gpu)
    ops, spans = op_columns(wl)
    priced = _op_seconds(cfg, wl, gpu)
    t_ops = priced.t_ops
    ps = _passes(cfg, wl, comms, ops, priced, spans)
    run = run_pipeline(ps.program, p2p_exposure=True)
    dp_x = dp_exposed_stages(cfg, wl, comms, run.timeline)
    opt_s = _optimizer_s(cfg, wl, gpu)
    mems = stage_memories(cfg, wl)
    step, _ = step_end_s(run.timeline, np.asarray(dp_x), opt_s)
    result = _result(cfg, gpu, wl, comms, ps, run, step, mems,
                     _stage_breakdowns(wl, ps, run, dp_x, opt_s, mems, step),
                     _timeline(wl, ps, run, comms, ops, t_ops, spans, dp_x, opt_s),
                     _hardware_flops(cfg, wl, spans, ps.runs))
    check_result(result)  # a result that breaks an invariant is flowsim's bug: refused, never printed
    return result


def _result(cfg, gpu, wl, comms, ps, run, step, mems, stages, timeline, hardware_flops) -> Result:
    """The Result of a parametric step (MFU convention: :func:`flowsim.model.workload.model_flops_per_token`
    over the dense 16-bit peak)."""
    t, n_gpus = cfg.training, cfg.cluster.num_gpus
    tokens = cfg.tokens_per_step
    model_flops = model_flops_per_token(cfg) * tokens
    peak = gpu.peak("fp16" if t.precision == "fp16" else "bf16")
    mem_peak = max(x.total_bytes for x in mems)
    worst = mems[int(np.argmax([x.total_bytes for x in mems]))]
    return Result(
        step_time_s=step, tokens_per_s=tokens / step, model_flops=model_flops, hardware_flops=hardware_flops,
        tflops_per_gpu=model_flops / step / n_gpus / 1e12, mfu=model_flops / (step * n_gpus * peak),
        hfu=hardware_flops / (step * n_gpus * peak), peak_flop_per_s=peak, memory_bytes_per_gpu=mem_peak,
        memory_capacity_bytes=gpu.hbm_bytes, fits_memory=bool(mem_peak <= gpu.hbm_bytes), stages=stages,
        collectives=_choices(comms), config=_config_dict(cfg),
        memory_detail={"weights": worst.weights_bytes, "gradients": worst.gradients_bytes,
                       "optimizer": worst.optimizer_bytes, "activations": worst.activations_bytes,
                       "runtime": worst.runtime_bytes},
        timeline=timeline)


_ATOMS = frozenset((str, int, float, bool, type(None)))


def _config_dict(cfg: SimConfig) -> dict:
    """``dataclasses.asdict`` of the model, cluster and training configs (flat dataclasses), without its deep copy
    of the immutable atoms that almost every field holds."""
    return {part: {f.name: v if type(v) in _ATOMS else copy.deepcopy(v)
                   for f in dataclasses.fields(obj) for v in (getattr(obj, f.name),)}
            for part, obj in (("model", cfg.model), ("cluster", cfg.cluster), ("training", cfg.training))}
