"""Chakra execution-trace export of a simulated step (JSON form), for ASTRA-sim users.

One trace per pipeline stage (the representative rank of that stage; every TP/CP/DP rank of the stage
runs the same graph). Each forward or backward pass becomes, per transformer layer, a compute node
(duration and FLOPs from flowsim's kernel model) followed by that layer's collective nodes (type and
size), then the pipeline send of the pass's output; every node depends on the one before it, and a
stage's first node of a pass also waits for the matching receive. Data-parallel gradient reduction and the
optimizer are not exported yet. Node and collective type codes are
Chakra's (``schema/protobuf/et_def.proto``, Chakra v0.0.4: ``COMP_NODE = 4``, ``COMM_SEND_NODE = 5``,
``COMM_RECV_NODE = 6``, ``COMM_COLL_NODE = 7``; ``ALL_REDUCE = 0``, ``ALL_GATHER = 2``, ``ALL_TO_ALL = 6``,
``REDUCE_SCATTER = 7``); attribute names follow its JSON rendering (``attr`` with ``name`` and
``int64_val``).
"""
from __future__ import annotations

import json
from pathlib import Path

from flowsim.step.result import Result
from flowsim.config.training import TrainingConfig
from flowsim.step.schedule import FWD, SCHEDULE_IDS, path_links
from flowsim.export.trace import layer_ops, timeline_of

COMP_NODE, COMM_SEND_NODE, COMM_RECV_NODE, COMM_COLL_NODE = 4, 5, 6, 7
COLL_TYPE = {"allreduce": 0, "allgather": 2, "alltoall": 6, "reducescatter": 7}
SCHEMA = "chakra-json 0.0.4 (flowsim export)"


def _attr(name, value):
    return {"name": name, "int64_val": int(value)}


def chakra_traces(result: Result) -> list[dict]:
    """One Chakra-style JSON object per pipeline stage: ``{"schema", "rank", "stage", "nodes": [...]}``.

    Raises
    ------
    ValueError
        When ``result`` carries no timeline (it did not come from :func:`flowsim.simulate`).
    """
    tl = timeline_of(result)
    pl = tl.pipeline
    p, n_ops = pl.start_s.shape
    t = result.config["training"]
    stride = t["tensor_model_parallel_size"] * t["context_parallel_size"] * t["data_parallel_size"]
    blocks = [b for b in ("layer", "moe_layer") if b in tl.spans]
    seqs = {(b, kind): layer_ops(tl, b, kind) for b in blocks for kind in ("fwd", "bwd", "recompute")}
    # the (stage, chunk) before and after each virtual stage on a micro-batch's path (-1 at the ends)
    up, down = path_links(SCHEDULE_IDS[TrainingConfig(**t).schedule], p, tl.chunk_layers.shape[1])
    out = []
    for s in range(p):
        nodes = []

        def add(node):
            node["id"] = len(nodes)
            node["data_deps"] = [len(nodes) - 1] if nodes else []
            nodes.append(node)

        for i in range(n_ops):
            kind_id, mb, chunk = (int(x) for x in pl.order[s, i])
            if kind_id not in (0, 1):
                continue  # zb-h1 weight-gradient passes: their GEMMs are in the backward layers' nodes
            kind = "fwd" if kind_id == FWD else "bwd"
            src = int((up if kind == "fwd" else down)[s, chunk, 0])
            if src >= 0 and src != s:
                add({"name": f"recv {kind} mb{mb} c{chunk}", "type": COMM_RECV_NODE,
                     "attr": [_attr("comm_src", src * stride), _attr("comm_dst", s * stride),
                              _attr("comm_size", tl.p2p_bytes), _attr("comm_tag", mb)]})
            n_moe = int(tl.chunk_moe_layers[s, chunk])
            kinds = ["layer"] * (int(tl.chunk_layers[s, chunk]) - n_moe) + ["moe_layer"] * n_moe
            # recomputed layers (the first of each kind, Megatron's block method) re-run their ops first
            n_rec = {"layer": int(tl.chunk_recompute_layers[s, chunk] - tl.chunk_recompute_moe_layers[s, chunk]),
                     "moe_layer": int(tl.chunk_recompute_moe_layers[s, chunk])}
            seen = {"layer": 0, "moe_layer": 0}
            for li, block in enumerate(kinds):
                ops = seqs[(block, kind)]
                if kind == "bwd" and seen[block] < n_rec[block]:
                    ops = seqs[(block, "recompute")] + ops
                seen[block] += 1
                comp = [(n, dt, a) for n, dt, a in ops if "kind" in a]
                add({"name": f"{kind} mb{mb} c{chunk} layer{li}", "type": COMP_NODE,
                     "duration_micros": int(round(sum(dt for _, dt, _ in comp) * 1e6)),
                     "attr": [_attr("num_ops", sum(a["flops"] for _, _, a in comp))]})
                for name, dt, a in ops:
                    if "kind" in a:
                        continue
                    op = name.split(":", 1)[1]
                    if op not in COLL_TYPE:
                        continue
                    add({"name": f"{name} mb{mb} layer{li}", "type": COMM_COLL_NODE,
                         "attr": [_attr("comm_type", COLL_TYPE[op]), _attr("comm_size", a["bytes"]),
                                  _attr("comm_group_size", a["ranks"])]})
            dst = int((down if kind == "fwd" else up)[s, chunk, 0])
            if dst >= 0 and dst != s:
                add({"name": f"send {kind} mb{mb} c{chunk}", "type": COMM_SEND_NODE,
                     "attr": [_attr("comm_src", s * stride), _attr("comm_dst", dst * stride),
                              _attr("comm_size", tl.p2p_bytes), _attr("comm_tag", mb)]})
        out.append({"schema": SCHEMA, "rank": s * stride, "stage": s, "nodes": nodes})
    return out


def write_chakra(result: Result, directory) -> list[Path]:
    """Write :func:`chakra_traces` as ``<directory>/chakra.<rank>.json`` files; returns their paths."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    for tr in chakra_traces(result):
        path = d / f"chakra.{tr['rank']}.json"
        path.write_text(json.dumps(tr))
        paths.append(path)
    return paths
