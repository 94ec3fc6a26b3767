"""Chakra execution traces of a simulated step: one protobuf ``.et`` file per rank, as ASTRA-sim reads them.

Every rank of a pipeline stage runs its stage's graph (:func:`stage_graphs`); ranks differ in their
communicators and pipeline peers. Per rank, in issue order (each node's ``data_deps`` is the node before it):

* per forward or backward pass of a micro-batch and model chunk: the receive of its input from the previous
  stage (``COMM_RECV_NODE``), per transformer layer a ``COMP_NODE`` (duration and FLOPs from flowsim's kernel
  model; a recomputed layer's backward re-runs its forward first) followed by that layer's collectives
  (``COMM_COLL_NODE``: all-reduce, all-gather, reduce-scatter, all-to-all), then the send of its output
  (``COMM_SEND_NODE``);
* after the last backward: the data-parallel gradient reduction in its buckets (reduce-scatter with ZeRO >= 1 /
  the distributed optimizer, else all-reduce; hybrid sharding adds the replicas' all-reduce; routed experts over
  their expert-data-parallel group; sizes as :mod:`flowsim.step.data_parallel` prices them), the optimizer step
  (``COMP_NODE``), and with ZeRO >= 1 the parameter all-gather buckets.

Collectives carry ``pg_name`` (their communicator, ``<kind>_<lowest rank>``; the members are listed in
``comm_groups.json`` beside the traces, the comm-group file ASTRA-sim takes), ``comm_type`` (Chakra's
``CollectiveCommType``) and ``comm_size`` (bytes per rank); sends and receives carry ``comm_src``, ``comm_dst``,
``comm_tag`` (the micro-batch) and ``comm_size``; compute nodes ``num_ops`` (FLOPs) and ``is_cpu_op`` false.
Attribute names and value kinds are those ASTRA-sim's ``ETFeederNode`` reads. Not exported: ZeRO-3 / FSDP's
per-layer gathers, context-parallel ring-attention transfers, the zero-bubble schedules' separate
weight-gradient passes (their GEMMs are in the backward nodes).

Schema: :mod:`flowsim.export.chakra_pb` (Chakra's ``et_def.proto``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flowsim.config import ClusterConfig, ModelConfig, SimConfig, TrainingConfig
from flowsim.config.layout import group_spans
from flowsim.export import chakra_pb as pb
from flowsim.export.trace import layer_ops, timeline_of
from flowsim.step.result import Result
from flowsim.step.schedule import FWD, SCHEDULE_IDS, path_links

ET_VERSION = "0.0.4"  # Chakra release whose et_def.proto chakra_pb reproduces
COLL_TYPE = {"allreduce": "ALL_REDUCE", "allgather": "ALL_GATHER", "alltoall": "ALL_TO_ALL",
             "reducescatter": "REDUCE_SCATTER"}


@dataclass(frozen=True)
class Op:
    """One node of a stage's graph, before it is given to a rank.

    Attributes
    ----------
    kind : str
        ``comp``, ``coll``, ``send`` or ``recv``.
    name : str
        Node name.
    duration_us : int
        Compute time in microseconds (``comp``).
    flops : int
        FLOPs of a ``comp`` node.
    op : str
        Collective (``allreduce``, ``allgather``, ``reducescatter``, ``alltoall``) of a ``coll`` node.
    group : str
        Communicator kind of a ``coll`` node (:func:`flowsim.config.layout.group_spans` keys).
    size_bytes : int
        Bytes per rank of a ``coll``, ``send`` or ``recv`` node.
    peer_stage : int
        Pipeline stage of the other end of a ``send`` / ``recv``.
    tag : int
        Micro-batch of a ``send`` / ``recv``.
    """

    kind: str
    name: str
    duration_us: int = 0
    flops: int = 0
    op: str = ""
    group: str = ""
    size_bytes: int = 0
    peer_stage: int = -1
    tag: int = 0


def sim_config(result: Result) -> SimConfig:
    """The resolved :class:`~flowsim.config.SimConfig` of ``result``."""
    c = result.config
    return SimConfig(ModelConfig(**c["model"]), ClusterConfig(**c["cluster"]), TrainingConfig(**c["training"]))


def _dp_ops(cfg: SimConfig, stage: int, optimizer_s: float) -> list[Op]:
    """The gradient reduction buckets, optimizer step and parameter gathers of ``stage``."""
    from flowsim.model.workload import build_workload
    from flowsim.step.data_parallel import (grad_bucket_bytes, grad_reduce_bytes, part_gather_bytes,
                                            reduction_parts, zero_level)

    t = cfg.training
    ops = []
    gathers = []
    if zero_level(t) < 3:
        wl = build_workload(cfg)
        for g, op, n, factor in reduction_parts(t, wl, group_spans(t), stage):
            nb = max(1, int(np.ceil(n * grad_reduce_bytes(t) / grad_bucket_bytes(cfg, wl, stage))))
            size = int(round(n * grad_reduce_bytes(t) * factor / nb))
            ops += [Op("coll", f"dp {op} bucket{b}", op=op, group=g, size_bytes=size) for b in range(nb)]
            if op == "reducescatter":
                gsize = int(round(part_gather_bytes(cfg, wl, stage, g, n) / nb))
                gathers += [Op("coll", f"param allgather bucket{b}", op="allgather", group=g, size_bytes=gsize)
                            for b in range(nb)]
    ops.append(Op("comp", "optimizer", duration_us=int(round(optimizer_s * 1e6))))
    return ops + gathers


def stage_graphs(result: Result) -> list[list[Op]]:
    """The graph of each pipeline stage's ranks, in issue order (module docstring).

    Raises
    ------
    ValueError
        When ``result`` carries no timeline (it did not come from :func:`flowsim.simulate`).
    """
    tl = timeline_of(result)
    pl = tl.pipeline
    p, n_ops = pl.start_s.shape
    cfg = sim_config(result)
    blocks = [b for b in ("layer", "moe_layer") if b in tl.spans]
    seqs = {(b, kind): layer_ops(tl, b, kind) for b in blocks for kind in ("fwd", "bwd", "recompute")}
    # the (stage, chunk) before and after each virtual stage on a micro-batch's path (-1 at the ends)
    up, down = path_links(SCHEDULE_IDS[cfg.training.schedule], p, tl.chunk_layers.shape[1])
    p2p = int(round(tl.p2p_bytes))
    graphs = []
    for s in range(p):
        ops: list[Op] = []
        for i in range(n_ops):
            kind_id, mb, chunk = (int(x) for x in pl.order[s, i])
            if kind_id not in (0, 1):
                continue  # zb-h1 weight-gradient passes: their GEMMs are in the backward layers' nodes
            kind = "fwd" if kind_id == FWD else "bwd"
            src = int((up if kind == "fwd" else down)[s, chunk, 0])
            if src >= 0 and src != s:
                ops.append(Op("recv", f"recv {kind} mb{mb} c{chunk}", size_bytes=p2p, peer_stage=src, tag=mb))
            n_moe = int(tl.chunk_moe_layers[s, chunk])
            kinds = ["layer"] * (int(tl.chunk_layers[s, chunk]) - n_moe) + ["moe_layer"] * n_moe
            # recomputed layers (the first of each kind, Megatron's block method) re-run their ops first
            n_rec = {"layer": int(tl.chunk_recompute_layers[s, chunk] - tl.chunk_recompute_moe_layers[s, chunk]),
                     "moe_layer": int(tl.chunk_recompute_moe_layers[s, chunk])}
            seen = {"layer": 0, "moe_layer": 0}
            for li, block in enumerate(kinds):
                seq = seqs[(block, kind)]
                if kind == "bwd" and seen[block] < n_rec[block]:
                    seq = seqs[(block, "recompute")] + seq
                seen[block] += 1
                comp = [(dt, a) for _, dt, a in seq if "kind" in a]
                ops.append(Op("comp", f"{kind} mb{mb} c{chunk} layer{li}",
                              duration_us=int(round(sum(dt for dt, _ in comp) * 1e6)),
                              flops=int(sum(a["flops"] for _, a in comp))))
                for name, _, a in seq:
                    group, _, op = name.partition(":")
                    if "kind" in a or op not in COLL_TYPE:
                        continue
                    ops.append(Op("coll", f"{name} mb{mb} layer{li}", op=op, group=group,
                                  size_bytes=int(round(a["bytes"]))))
            dst = int((down if kind == "fwd" else up)[s, chunk, 0])
            if dst >= 0 and dst != s:
                ops.append(Op("send", f"send {kind} mb{mb} c{chunk}", size_bytes=p2p, peer_stage=dst, tag=mb))
        graphs.append(ops + _dp_ops(cfg, s, float(tl.optimizer_s[s])))
    return graphs


def group_members(spans: dict, kind: str, rank: int) -> list[int]:
    """Global ranks of ``rank``'s communicator of ``kind`` (``spans``: :func:`flowsim.config.layout.group_spans`):
    ``n`` members ``stride`` apart inside a block of ``n * stride`` consecutive ranks."""
    n, stride = spans[kind]
    base = rank // (n * stride) * n * stride + rank % stride
    return [base + k * stride for k in range(n)]


def _attr(node, name: str, field: str, value) -> None:
    a = node.attr.add(name=name)
    setattr(a, field, value)


def _template(i: int, o: Op) -> bytes:
    """Serialised node ``i`` without its rank-dependent attributes."""
    node = pb.Node(id=i, name=o.name, data_deps=[i - 1] if i else [])
    if o.kind == "comp":
        node.type = pb.NodeType["COMP_NODE"]
        node.duration_micros = o.duration_us
        _attr(node, "is_cpu_op", "bool_val", False)
        _attr(node, "num_ops", "int64_val", o.flops)
    elif o.kind == "coll":
        node.type = pb.NodeType["COMM_COLL_NODE"]
        _attr(node, "is_cpu_op", "bool_val", False)
        _attr(node, "comm_type", "int64_val", pb.CollectiveCommType[COLL_TYPE[o.op]])
        _attr(node, "comm_size", "int64_val", o.size_bytes)
    else:
        node.type = pb.NodeType["COMM_SEND_NODE" if o.kind == "send" else "COMM_RECV_NODE"]
        _attr(node, "is_cpu_op", "bool_val", False)
        _attr(node, "comm_size", "int64_val", o.size_bytes)
        _attr(node, "comm_tag", "int32_val", o.tag)
    return node.SerializeToString()


def _parse_ranks(ranks, world: int) -> list[int]:
    from flowsim.errors import ConfigError

    if ranks is None:
        return list(range(world))
    if isinstance(ranks, str):
        out = []
        for part in filter(None, (x.strip() for x in ranks.split(","))):
            lo, _, hi = part.partition("-")
            if not (lo.isdigit() and (not hi or hi.isdigit())):
                raise ConfigError("--chakra-ranks", "must be ranks and ranges like 0,8,16-31", ranks)
            out += list(range(int(lo), int(hi or lo) + 1))
        ranks = out
    ranks = sorted(set(int(r) for r in ranks))
    if not ranks or ranks[0] < 0 or ranks[-1] >= world:
        raise ConfigError("--chakra-ranks", f"must be ranks in [0, {world})", ranks[-1] if ranks else "none")
    return ranks


def write_chakra(result: Result, directory, ranks=None, prefix: str = "flowsim") -> list[Path]:
    """Write ``<directory>/<prefix>.<rank>.et`` for each rank (all by default) and ``comm_groups.json``.

    Parameters
    ----------
    result : Result
        A step from :func:`flowsim.simulate`.
    directory : str or Path
        Created if absent.
    ranks : iterable of int or str, optional
        The ranks to write (``"0,8,16-31"`` accepted); default every rank of the job.
    prefix : str
        File name prefix (ASTRA-sim's ``--workload-configuration`` takes ``<directory>/<prefix>``).

    Returns
    -------
    list of Path
        The ``.et`` files written, in rank order.

    Raises
    ------
    ConfigError
        A rank outside the job.
    """
    cfg = sim_config(result)
    t = cfg.training
    world = cfg.cluster.num_gpus
    stride = t.tp * t.cp * t.dp  # ranks per pipeline stage (Megatron-LM order: pp slowest)
    spans = group_spans(t)
    graphs = stage_graphs(result)
    templates = [[_template(i, o) for i, o in enumerate(g)] for g in graphs]
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    groups: dict = {}
    suffix_cache: dict = {}

    def suffix(key, build) -> bytes:
        if key not in suffix_cache:
            node = pb.Node()
            build(node)
            suffix_cache[key] = node.SerializeToString()
        return suffix_cache[key]

    paths = []
    for rank in _parse_ranks(ranks, world):
        s = rank // stride
        pg = {}
        for kind in {o.group for o in graphs[s] if o.kind == "coll"}:
            members = group_members(spans, kind, rank)
            pg[kind] = f"{kind}_{members[0]}"
            groups[pg[kind]] = members
        meta = pb.GlobalMetadata(version=ET_VERSION)
        for name, field, value in (("generator", "string_val", "flowsim"), ("rank", "int64_val", rank),
                                   ("pipeline_stage", "int64_val", s), ("world_size", "int64_val", world)):
            _attr(meta, name, field, value)
        out = [pb.delimited(meta.SerializeToString())]
        for o, base in zip(graphs[s], templates[s]):
            if o.kind == "coll":
                extra = suffix(("pg", pg[o.group]), lambda n, v=pg[o.group]: _attr(n, "pg_name", "string_val", v))
            elif o.kind in ("send", "recv"):
                peer = rank + (o.peer_stage - s) * stride
                src, dst = (rank, peer) if o.kind == "send" else (peer, rank)
                extra = suffix(("p2p", src, dst), lambda n, a=src, b=dst: (_attr(n, "comm_src", "int32_val", a),
                                                                           _attr(n, "comm_dst", "int32_val", b)))
            else:
                extra = b""
            out.append(pb.delimited(base + extra))  # concatenated messages merge: repeated attrs append
        path = d / f"{prefix}.{rank}.et"
        path.write_bytes(b"".join(out))
        paths.append(path)
    (d / "comm_groups.json").write_text(json.dumps(dict(sorted(groups.items())), indent=0))
    return paths
