"""Pass times of a parametric workload's blocks: one micro-batch through a layer, the embedding, the LM head.

A block (:class:`flowsim.model.ops.OpSet`) holds compute ops, each priced by the kernel model, and the collectives
its parallel dimensions imply, priced by the step's :class:`flowsim.step.pricer.CollectivePricer`. Per phase
(``fwd``, ``bwd``, ``recompute``) a block costs its compute plus the exposed part of its collectives:

* tensor-parallel collectives block the compute stream, except those that overlap the input-gradient GEMMs
  (``overlap == "dgrad"``) and, with ``tp_comm_overlap`` (Transformer Engine userbuffers, PyTorch async TP), the
  sequence-parallel ones, each pipelined with the one GEMM it feeds or drains (``overlap == "gemm:<name>"``, or
  ``"symm_mem:<name>"`` for async TP: :func:`flowsim.model.ops.tp_pairing`, :func:`tp_overlapped_s`): a collective
  longer than its GEMM stays partly exposed;
* context-parallel transfers run beside the attention kernels (ring attention), except blocking ones;
* expert all-to-alls (and the ETP / all-gather dispatcher collectives) sit between the router and the experts
  and are exposed, except those marked ``overlap == "shared_expert"`` (``moe_shared_expert_overlap``), which run
  beside the shared experts' kernels.

Overlapped communication slows the compute beside it by the SM-sharing rule (:mod:`flowsim.step.overlap`).

The CPU time to issue the block's ops is not part of these GPU-side times: the step core runs each stage's CPU
through the pipeline schedule (:mod:`flowsim.step.host`).
"""
from __future__ import annotations

import numpy as np

from flowsim.model.ops import TP_OVERLAP_SMS, tp_overlap_pieces, tp_pairing
from flowsim.step.overlap import overlapped_s
from flowsim.step.pricer import CollectivePricer

PHASES = ("fwd", "bwd", "recompute")
EXPERT_GROUPS = ("ep", "etp", "tpep", "epn", "epx")


def op_columns(wl) -> tuple[dict, dict]:
    """All compute ops of the workload's blocks in one table (column name -> numpy array), and the row span
    (slice) of each block (:attr:`flowsim.model.workload.Workload.op_table`, built once per workload)."""
    columns, spans, _ = wl.op_table
    return columns, spans


def compute_parts(opset, t_ops: np.ndarray) -> dict:
    """Seconds of one micro-batch's compute per phase: all of it, and its weight-gradient GEMMs, GEMMs,
    input-gradient GEMMs, attention kernels and shared-expert kernels (the parts communication can hide
    behind)."""
    a = opset.arrays
    per = t_ops * a["count"]
    out = {}
    for ph in PHASES:
        sel = a["phase"] == ph
        out[ph] = {"all": float(per[sel].sum()),
                   **{k: float(per[sel & a[k]].sum()) for k in ("wgrad", "gemm", "dgrad", "attn", "shared")}}
        gemms = sel & a["gemm"]
        names, idx = np.unique(a["name"][gemms], return_inverse=True)
        sums = np.bincount(idx.ravel(), weights=per[gemms], minlength=len(names))
        out[ph]["by_gemm"] = dict(zip(names.tolist(), sums.tolist()))  # seconds of each named GEMM
    return out


def _comm_parts(opset, comms: CollectivePricer, phase: str, count: int) -> dict:
    """Seconds of one micro-batch's collectives in ``phase`` by how they overlap, and the SMs the overlapped
    ones hold; ``count`` (block runs per step) only feeds the report's calls per step."""
    out = dict.fromkeys(("tp_blocking", "tp_dgrad", "cp_total", "cp_blocking", "ep_total", "ep_shared"), 0.0)
    out["dgrad_sms"] = out["cp_sms"] = out["ep_sms"] = 0
    out["tp_paired"] = []  # (seconds, method, GEMM names) of the blocking TP collectives tp_comm_overlap can pipeline
    for r in opset.comms:
        if r.phase != phase:
            continue
        dt = comms.time(r.group, r.op, r.size_bytes, r.count * count) * r.count
        if r.group == "cp" and r.overlap == "none":
            out["cp_blocking"] += dt
        elif r.group == "cp":
            out["cp_total"] += dt
            out["cp_sms"] = max(out["cp_sms"], comms.ctas(r.group, r.op, r.size_bytes))
        elif r.group in EXPERT_GROUPS and r.overlap == "shared_expert":
            out["ep_shared"] += dt
            out["ep_sms"] = max(out["ep_sms"], comms.ctas(r.group, r.op, r.size_bytes))
        elif r.group in EXPERT_GROUPS:
            out["ep_total"] += dt
        elif r.overlap == "dgrad":
            out["tp_dgrad"] += dt
            out["dgrad_sms"] = max(out["dgrad_sms"], comms.ctas(r.group, r.op, r.size_bytes))
        else:
            out["tp_blocking"] += dt
            pairing = tp_pairing(r.op, r.overlap)
            if pairing is not None:
                out["tp_paired"].append((dt, *pairing))
    return out


def counted_calls(opset, comms: CollectivePricer) -> tuple:
    """The calls :func:`block_times` counts on ``comms``, in its order: ``((group, op, size_bytes), estimate,
    calls per block run)`` of each of the block's collectives in :data:`PHASES` that moves bytes (for
    :meth:`flowsim.step.pricer.CollectivePricer.recount`)."""
    out = []
    for ph in PHASES:
        for r in opset.comms:
            est = comms.estimate_of(r.group, r.op, r.size_bytes) if r.phase == ph else None
            if est is not None:
                out.append(((r.group, r.op, float(r.size_bytes)), est, r.count))
    return tuple(out)


def tp_overlapped_s(gemm_s: float, comm_s: float, pieces: int, comm_sms: int, sm_count: int) -> float:
    """Wall seconds of a GEMM of ``gemm_s`` seconds and the tensor-parallel collective of ``comm_s`` seconds
    pipelined with it (``tp_comm_overlap``; how each collective runs: :data:`flowsim.model.ops.TP_OVERLAP_SMS`).

    Transformer Engine userbuffers and PyTorch's async TP split the GEMM into ``pieces`` (the workload prices them
    as that many smaller GEMMs, :func:`flowsim.model.ops.split_pipelined_gemms`) and move one shard while the GEMM
    of another runs. The first piece (the local shard's, for a gather; the first partial product, for a
    reduce-scatter, whose local piece runs last to hide the last transfer) has no transfer beside it, so its
    ``gemm_s / pieces`` seconds hide nothing; the rest of the GEMM runs beside the transfers, slowed by the
    ``comm_sms`` SMs they hold (:func:`flowsim.step.overlap.overlapped_s`): ``gemm_s / pieces +
    overlapped_s(gemm_s (pieces - 1) / pieces, comm_s)``. ``pieces`` 1 is a bulk overlap (the collective beside
    the whole GEMM). A collective longer than the GEMM beside it is exposed by the difference.
    """
    first = gemm_s / pieces if pieces > 1 else 0.0
    return first + overlapped_s(gemm_s - first, comm_s, comm_sms, sm_count)


def block_times(opset, t_ops: np.ndarray, comms: CollectivePricer, tp_comm_overlap: bool, count: int,
                parts: dict | None = None) -> dict:
    """Per-phase seconds of one block for one micro-batch: ``compute_<phase>``, ``wgrad_<phase>`` and the
    exposed ``tp_``, ``cp_``, ``ep_<phase>`` communication (module docstring); ``t_ops``: seconds of each of the
    block's compute ops, ``count``: runs of the block per step (for the report), ``parts``:
    :func:`compute_parts` of ``t_ops`` when the caller has them already."""
    sm, tp_size = comms.gpu.sm_count, comms.groups["tp"][0]
    parts = compute_parts(opset, t_ops) if parts is None else parts
    out = {}
    for ph in PHASES:
        c, m = parts[ph], _comm_parts(opset, comms, ph, count)
        out[f"compute_{ph}"], out[f"wgrad_{ph}"] = c["all"], c["wgrad"]
        tp = m["tp_blocking"] + overlapped_s(c["dgrad"], m["tp_dgrad"], m["dgrad_sms"], sm) - c["dgrad"]
        if tp_comm_overlap:  # each sequence-parallel collective pipelined with the GEMM it feeds or drains
            for dt, method, names in m["tp_paired"]:
                g = sum(c["by_gemm"].get(n, 0.0) for n in names)
                tp += tp_overlapped_s(g, dt, tp_overlap_pieces(method, tp_size), TP_OVERLAP_SMS[method], sm) - g - dt
        out[f"tp_{ph}"] = tp
        out[f"cp_{ph}"] = m["cp_blocking"] + overlapped_s(c["attn"], m["cp_total"], m["cp_sms"], sm) - c["attn"]
        out[f"ep_{ph}"] = m["ep_total"] + overlapped_s(c["shared"], m["ep_shared"], m["ep_sms"], sm) - c["shared"]
    return out


def pass_s(block: dict, phase: str) -> float:
    """Per-micro-batch seconds of one block in ``phase`` (``fwd``, ``bwd`` or ``recompute``): compute plus its
    exposed communication."""
    return block[f"compute_{phase}"] + block[f"tp_{phase}"] + block[f"cp_{phase}"] + block[f"ep_{phase}"]


def paired_comm(wl, comms: CollectivePricer, kinds) -> tuple:
    """What DualPipe's F&B pairing can hide (see :func:`flowsim.step.schedule.simulate_pipeline`): the expert
    all-to-all seconds per micro-batch in each (stage, chunk)'s forward and backward, and the share of the
    SMs the all-to-all holds (the flex dispatcher's ``expert_comm_sms``, else NCCL's CTAs; ``kinds``: (block
    times, layers per chunk, recomputed layers per chunk))."""
    ep_f = sum(n_l * blk["ep_fwd"] for blk, n_l, _ in kinds)
    ep_b = sum(n_l * blk["ep_bwd"] + n_r * blk["ep_recompute"] for blk, n_l, n_r in kinds)
    sms = wl.expert_comm_sms or max((comms.ctas(c.group, c.op, c.size_bytes)
                                     for c in (wl.moe_layer.comms if wl.moe_layer else ()) if c.group == "ep"),
                                    default=0)
    return ep_f, ep_b, sms / comms.gpu.sm_count


def block_runs(wl, runs, first, last) -> dict:
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
