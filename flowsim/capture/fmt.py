"""Save and load a :class:`~flowsim.capture.CapturedWorkload` as versioned JSON (docs/CAPTURE.md).

Version 2 (written) holds one op list per pipeline stage (``stages``); version 1 (still read) held the ops
of one rank at the top level (``rank``, ``ops``) and reads as one stage.
"""
from __future__ import annotations

import json
from pathlib import Path

from flowsim.errors import ConfigError

FORMAT = "flowsim-workload"
VERSION = 2
READ_VERSIONS = (1, 2)
_TOP = {1: ("format", "version", "world_size", "rank", "groups", "ops"),
        2: ("format", "version", "world_size", "groups", "stages")}
_COMPUTE_KINDS = ("gemm", "attn_fwd", "attn_bwd", "memory")
_COMM_OPS = ("allreduce", "allgather", "reducescatter", "broadcast", "alltoall", "sendrecv")
_SHAPE_FIELDS = {"gemm": ("m", "n", "k", "batch"), "attn_fwd": ("batch", "heads", "seq_q", "seq_k", "head_dim"),
                 "attn_bwd": ("batch", "heads", "seq_q", "seq_k", "head_dim"), "memory": ()}


def save(workload, path) -> None:
    """Write ``workload`` to ``path`` as JSON (``format: flowsim-workload``, ``version: 2``)."""
    doc = {"format": FORMAT, "version": VERSION, "label": workload.label, "world_size": workload.world_size,
           "groups": workload.groups, "unknown_ops": list(workload.unknown_ops),
           "stages": [{"rank": st.rank, "ops": st.ops} for st in workload.stages]}
    Path(path).write_text(json.dumps(doc, separators=(",", ":")))


def load(path):
    """Read and validate a workload file (version 1 or 2).

    Raises
    ------
    ConfigError
        Unreadable JSON, wrong format or version, or a missing / bad field (named, with the op index).
    """
    from flowsim.capture.data import CapturedWorkload, Stage

    from flowsim.io_text import read_json

    doc = read_json(path, "workload")
    validate(doc)
    stages = doc["stages"] if doc["version"] == 2 else [{"rank": doc["rank"], "ops": doc["ops"]}]
    return CapturedWorkload(world_size=doc["world_size"],
                            stages=[Stage(rank=st["rank"], ops=st["ops"]) for st in stages],
                            groups={k: list(v) for k, v in doc["groups"].items()},
                            unknown_ops=list(doc.get("unknown_ops", [])), label=doc.get("label", ""))


def _need(row, key, where):
    if key not in row:
        raise ConfigError(f"{where}.{key}", "is required", "missing")
    return row[key]


def _non_negative(row, key, where):
    v = _need(row, key, where)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
        raise ConfigError(f"{where}.{key}", "must be a non-negative number", v)


def validate(doc) -> None:
    """Check a parsed workload document; raise ConfigError naming the first bad field."""
    if not isinstance(doc, dict):
        raise ConfigError("workload", "must be a JSON object", type(doc).__name__)
    for key in ("format", "version"):
        _need(doc, key, "workload")
    if doc["format"] != FORMAT:
        raise ConfigError("workload.format", f"must be {FORMAT!r}", doc["format"])
    if doc["version"] not in READ_VERSIONS:
        raise ConfigError("workload.version", f"must be one of {', '.join(map(str, READ_VERSIONS))} (the versions "
                                              "this flowsim reads)", doc["version"])
    for key in _TOP[doc["version"]]:
        _need(doc, key, "workload")
    ws = doc["world_size"]
    if not isinstance(ws, int) or isinstance(ws, bool) or ws < 1:
        raise ConfigError("workload.world_size", "must be a positive integer", ws)
    groups = doc["groups"]
    if not isinstance(groups, dict):
        raise ConfigError("workload.groups", "must map group names to rank lists", type(groups).__name__)
    for name, ranks in groups.items():
        if not isinstance(ranks, list) or not ranks or not all(_is_rank(r, ws) for r in ranks):
            raise ConfigError(f"workload.groups.{name}", f"must be a non-empty list of ranks in [0, {ws})",
                              ranks if not isinstance(ranks, list) else f"{len(ranks)} entries")
    if doc["version"] == 1:
        _validate_stage(doc, "workload", "", ws, groups)
        return
    stages = doc["stages"]
    if not isinstance(stages, list) or not stages:
        raise ConfigError("workload.stages", "must be a non-empty list", stages)
    ranks = []
    for s, stage in enumerate(stages):
        where = f"stages[{s}]"
        if not isinstance(stage, dict):
            raise ConfigError(where, "must be an object", stage)
        for key in ("rank", "ops"):
            _need(stage, key, where)
        _validate_stage(stage, where, f"{where}.", ws, groups)
        if stage["rank"] in ranks:
            raise ConfigError(f"{where}.rank", "must differ from the other stages' ranks", stage["rank"])
        ranks.append(stage["rank"])


def _is_rank(r, world_size: int) -> bool:
    return isinstance(r, int) and not isinstance(r, bool) and 0 <= r < world_size


def _validate_stage(stage: dict, where: str, prefix: str, ws: int, groups: dict) -> None:
    """Check the ``rank`` and ``ops`` of one stage (fields named ``<where>.rank`` and ``<prefix>ops[i]``)."""
    if not _is_rank(stage["rank"], ws):
        raise ConfigError(f"{where}.rank", f"must be an integer in [0, {ws})", stage["rank"])
    ops = stage["ops"]
    if not isinstance(ops, list):
        raise ConfigError(f"{prefix or where + '.'}ops", "must be a list", type(ops).__name__)
    for i, row in enumerate(ops):
        _validate_op(row, f"{prefix}ops[{i}]", i, len(ops), ws, groups)


def _validate_op(row, where: str, i: int, n: int, ws: int, groups: dict) -> None:
    """Check op ``i`` of a stage of ``n`` ops."""
    if not isinstance(row, dict):
        raise ConfigError(where, "must be an object", row)
    kind = _need(row, "type", where)
    if not isinstance(row.get("backward", False), bool):
        raise ConfigError(f"{where}.backward", "must be true or false", row["backward"])
    if kind == "compute":
        if _need(row, "kind", where) not in _COMPUTE_KINDS:
            raise ConfigError(f"{where}.kind", f"must be one of {', '.join(_COMPUTE_KINDS)}", row["kind"])
        _need(row, "dtype", where)
        for key in ("flops", "bytes") + _SHAPE_FIELDS[row["kind"]]:
            _non_negative(row, key, where)
    elif kind == "comm":
        if _need(row, "op", where) not in _COMM_OPS:
            raise ConfigError(f"{where}.op", f"must be one of {', '.join(_COMM_OPS)}", row["op"])
        _non_negative(row, "size_bytes", where)
        if _need(row, "group", where) not in groups:
            raise ConfigError(f"{where}.group", "must name an entry of groups", row["group"])
        if not isinstance(_need(row, "blocking", where), bool):
            raise ConfigError(f"{where}.blocking", "must be true or false", row["blocking"])
        issue = row.get("issue", i)
        if not isinstance(issue, int) or isinstance(issue, bool) or not 0 <= issue <= i:
            raise ConfigError(f"{where}.issue", f"must be an op index in [0, {i}]", issue)
        wait = _need(row, "wait", where)
        if wait is not None and (not isinstance(wait, int) or not i < wait <= n):
            raise ConfigError(f"{where}.wait", f"must be null or an op index in ({i}, {n}]", wait)
        if "peer" in row and (row["op"] != "sendrecv" or not _is_rank(row["peer"], ws)):
            raise ConfigError(f"{where}.peer", f"must be a rank in [0, {ws}) of a sendrecv row", row["peer"])
    else:
        raise ConfigError(f"{where}.type", "must be 'compute' or 'comm'", kind)
