"""Save and load a :class:`~flowsim.capture.CapturedWorkload` as versioned JSON (docs/CAPTURE.md)."""
from __future__ import annotations

import json
from pathlib import Path

from flowsim.errors import ConfigError

FORMAT = "flowsim-workload"
VERSION = 1
_TOP = ("format", "version", "world_size", "rank", "groups", "ops")
_COMPUTE_KINDS = ("gemm", "attn_fwd", "attn_bwd", "memory")
_COMM_OPS = ("allreduce", "allgather", "reducescatter", "broadcast", "alltoall", "sendrecv")


def save(workload, path) -> None:
    """Write ``workload`` to ``path`` as JSON (``format: flowsim-workload``, ``version: 1``)."""
    doc = {"format": FORMAT, "version": VERSION, "label": workload.label, "world_size": workload.world_size,
           "rank": workload.rank, "groups": workload.groups, "unknown_ops": list(workload.unknown_ops),
           "ops": workload.ops}
    Path(path).write_text(json.dumps(doc, separators=(",", ":")))


def load(path):
    """Read and validate a workload file.

    Raises
    ------
    ConfigError
        Unreadable JSON, wrong format or version, or a missing / bad field (named, with the op index).
    """
    from flowsim.capture.recorder import CapturedWorkload

    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError("workload", f"cannot read {path}: {e}") from None
    validate(doc)
    return CapturedWorkload(world_size=doc["world_size"], rank=doc["rank"], ops=doc["ops"],
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
    for key in _TOP:
        _need(doc, key, "workload")
    if doc["format"] != FORMAT:
        raise ConfigError("workload.format", f"must be {FORMAT!r}", doc["format"])
    if doc["version"] != VERSION:
        raise ConfigError("workload.version", f"must be {VERSION} (this flowsim reads version {VERSION})",
                          doc["version"])
    ws = doc["world_size"]
    if not isinstance(ws, int) or isinstance(ws, bool) or ws < 1:
        raise ConfigError("workload.world_size", "must be a positive integer", ws)
    if not isinstance(doc["rank"], int) or not 0 <= doc["rank"] < ws:
        raise ConfigError("workload.rank", f"must be an integer in [0, {ws})", doc["rank"])
    groups = doc["groups"]
    if not isinstance(groups, dict):
        raise ConfigError("workload.groups", "must map group names to rank lists", type(groups).__name__)
    for name, ranks in groups.items():
        if not isinstance(ranks, list) or not ranks or not all(isinstance(r, int) and 0 <= r < ws for r in ranks):
            raise ConfigError(f"workload.groups.{name}", f"must be a non-empty list of ranks in [0, {ws})",
                              ranks if not isinstance(ranks, list) else f"{len(ranks)} entries")
    if not isinstance(doc["ops"], list):
        raise ConfigError("workload.ops", "must be a list", type(doc["ops"]).__name__)
    n = len(doc["ops"])
    for i, row in enumerate(doc["ops"]):
        where = f"ops[{i}]"
        if not isinstance(row, dict):
            raise ConfigError(where, "must be an object", row)
        kind = _need(row, "type", where)
        if kind == "compute":
            if _need(row, "kind", where) not in _COMPUTE_KINDS:
                raise ConfigError(f"{where}.kind", f"must be one of {', '.join(_COMPUTE_KINDS)}", row["kind"])
            _need(row, "dtype", where)
            for key in ("flops", "bytes"):
                _non_negative(row, key, where)
            required = {"gemm": ("m", "n", "k", "batch"),
                        "attn_fwd": ("batch", "heads", "seq_q", "seq_k", "head_dim"),
                        "attn_bwd": ("batch", "heads", "seq_q", "seq_k", "head_dim"), "memory": ()}
            for key in required[row["kind"]]:
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
        else:
            raise ConfigError(f"{where}.type", "must be 'compute' or 'comm'", kind)
