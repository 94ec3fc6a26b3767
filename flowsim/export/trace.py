"""Chrome / Perfetto trace export of a simulated step (Trace Event Format, JSON object form).

One process per pipeline stage; thread 1 is the compute stream (every forward, backward and, for the
split-backward schedules, weight-gradient pass of every micro-batch and model chunk, and the optimizer
step), thread 2 the data-parallel communication left after the last backward, thread 3 the pipeline
sends (to the stage the schedule routes each output to). Passes of the first micro-batch are expanded
into the ops of one layer of their chunk (a MoE layer where most of the chunk's layers are MoE; a backward
starts with the ops its layer recomputes): GEMM shapes, attention shapes, bytes of memory-bound kernels,
and collectives (size, ranks, NCCL algorithm/protocol). Timestamps are microseconds, as the format requires.
"""
from __future__ import annotations

import json

from flowsim.step.result import Result
from flowsim.step.schedule import BWD, FWD, WGRAD

PASS_NAMES = {FWD: "fwd", BWD: "bwd", WGRAD: "wgrad"}
COMPUTE_TID, DP_TID, PP_TID = 1, 2, 3
_US = 1e6


def layer_ops(tl, block: str, phase: str) -> list[tuple[str, float, dict]]:
    """(name, seconds, args) of one layer's kernels and collectives in one phase (``fwd``, ``bwd`` or
    ``recompute``), in order."""
    sl = tl.spans[block]
    c = tl.ops.iloc[sl]
    out = []
    for (_, r), dt in zip(c.iterrows(), tl.op_time_s[sl]):
        if r["phase"] != phase:
            continue
        if phase == "recompute":
            r = r.copy()
            r["name"] = f"{r['name']} (recompute)"
        if r["kind"] == "gemm":
            shape = f"{r['m']}x{r['n']}x{r['k']}" + (f" x{r['batch']}" if r["batch"] > 1 else "")
        elif r["kind"].startswith("attn"):
            shape = f"b{r['batch']} h{r['heads']}/{r['kv_heads']} s{r['seq_q']}x{r['seq_k']} d{r['head_dim']}"
        else:
            shape = f"{r['bytes'] / 1e6:.2f} MB"
        out.append((r["name"], float(dt) * int(r["count"]),
                    {"kind": r["kind"], "shape": shape, "dtype": r["dtype"], "flops": float(r["flops"])}))
    for cm, est in tl.comms.get(block, ()):
        if cm.phase == phase and est is not None:
            out.append((f"{cm.group}:{cm.op}", est.time_s * cm.count,
                        {"bytes": cm.size_bytes, "ranks": tl.group_sizes[cm.group], "algo": est.algo,
                         "proto": est.proto, "overlap": cm.overlap}))
    return out


def timeline_of(result: Result):
    """The result's :class:`flowsim.step.simulate.StepTimeline`; ValueError when it has none."""
    if result.timeline is None:
        raise ValueError("result has no timeline; produce it with flowsim.simulate")
    return result.timeline


def chrome_trace(result: Result) -> dict:
    """The step as a Trace Event Format object (``{"traceEvents": [...], "displayTimeUnit": "ms"}``).

    Raises
    ------
    ValueError
        When ``result`` carries no timeline (it did not come from :func:`flowsim.simulate`).
    """
    tl = timeline_of(result)
    pl = tl.pipeline
    events = []
    p, n_ops = pl.start_s.shape
    blocks = [b for b in ("layer", "moe_layer") if b in tl.spans]
    seqs = {(b, ph): layer_ops(tl, b, ph) for b in blocks for ph in ("fwd", "bwd", "recompute")}

    def first_layer(s, chunk, kind):
        """The ops of one layer of the chunk: a MoE layer if most of its layers are; a recomputed backward
        starts with the re-run forward ops."""
        moe = "moe_layer" in tl.spans and 2 * tl.chunk_moe_layers[s, chunk] > tl.chunk_layers[s, chunk]
        moe_rec = tl.chunk_recompute_moe_layers[s, chunk]
        block, rec = ("moe_layer", moe_rec) if moe else ("layer", tl.chunk_recompute_layers[s, chunk] - moe_rec)
        ops = seqs[(block, kind)]
        return seqs[(block, "recompute")] + ops if kind == "bwd" and rec > 0 else ops

    for s in range(p):
        events.append({"ph": "M", "name": "process_name", "pid": s, "args": {"name": f"stage {s}"}})
        for tid, name in ((COMPUTE_TID, "compute"), (DP_TID, "dp comm"), (PP_TID, "pp send")):
            events.append({"ph": "M", "name": "thread_name", "pid": s, "tid": tid, "args": {"name": name}})
        for i in range(n_ops):
            kind_id, mb, chunk = (int(x) for x in pl.order[s, i])
            t0, t1 = pl.start_s[s, i], pl.end_op_s[s, i]
            kind = PASS_NAMES[kind_id]
            events.append({"ph": "X", "name": f"{kind} mb{mb} c{chunk}", "cat": kind, "pid": s, "tid": COMPUTE_TID,
                           "ts": t0 * _US, "dur": (t1 - t0) * _US, "args": {"microbatch": mb, "chunk": chunk}})
            if mb == 0 and kind in ("fwd", "bwd"):  # expand the first micro-batch into one layer's ops
                t = t0
                for name, dt, args in first_layer(s, chunk, kind):
                    events.append({"ph": "X", "name": name, "cat": args.get("kind", "comm"), "pid": s,
                                   "tid": COMPUTE_TID, "ts": t * _US, "dur": dt * _US, "args": args})
                    t += dt
            dst = int(pl.send_to[s, i])
            if tl.p2p_s > 0 and dst >= 0:
                events.append({"ph": "X", "name": "send " + ("activation" if kind_id == FWD else "gradient"),
                               "cat": "pp", "pid": s, "tid": PP_TID, "ts": pl.send_s[s, i] * _US,
                               "dur": tl.p2p_s * _US, "args": {"to_stage": dst, "microbatch": mb}})
        end = pl.end_s[s]
        if tl.dp_exposed_s[s] > 0:
            events.append({"ph": "X", "name": "dp reduction (exposed)", "cat": "dp", "pid": s, "tid": DP_TID,
                           "ts": end * _US, "dur": tl.dp_exposed_s[s] * _US})
        events.append({"ph": "X", "name": "optimizer", "cat": "optimizer", "pid": s, "tid": COMPUTE_TID,
                       "ts": (end + tl.dp_exposed_s[s]) * _US, "dur": tl.optimizer_s[s] * _US})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(result: Result, path) -> None:
    """Write :func:`chrome_trace` as JSON to ``path`` (``-`` for stdout is handled by the CLI)."""
    with open(path, "w") as f:
        json.dump(chrome_trace(result), f)
