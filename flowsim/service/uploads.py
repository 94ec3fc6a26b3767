"""Measurement uploads: a runs CSV, an nccl-tests log or a Kineto trace, checked by flowsim's own readers.

An upload is data, never code: its bytes are written to a file this module names itself (the client's file
name is kept only as a label), read by the parser of its kind and stored in the database by a new id. A
file the parser rejects is a one-line reason (the reader's ConfigError, with the server's temporary path
replaced by the client's file name); nothing of it is stored.
"""
from __future__ import annotations

import gzip
import hashlib
import tempfile
from pathlib import Path

from flowsim.errors import ConfigError

KINDS = ("runs", "nccl-tests", "kineto")
_SUFFIX = {"runs": ".csv", "nccl-tests": ".log", "kineto": ".json"}
FILENAME_MAX = 255  # characters of the label kept (measurements.filename is String(255))


def label(filename: str | None) -> str:
    """The client's file name as a printable label (never used as a path)."""
    name = "".join(ch for ch in (filename or "upload") if ch.isprintable())
    return Path(name.replace("\\", "/")).name[:FILENAME_MAX] or "upload"


def _summary(kind: str, path: Path) -> dict:
    if kind == "runs":
        from flowsim.validation.runs import read_runs

        runs, skipped = read_runs(path)
        if runs.empty:
            raise ConfigError("file", "has no well-formed run row"
                              + (f" ({skipped[0].reason})" if skipped else ""), None)
        return {"rows": int(len(runs)), "skipped_rows": len(skipped),
                "gpus": sorted({str(g) for g in runs["gpu"]})}
    if kind == "nccl-tests":
        from flowsim.validation.nccl_tests import read_nccl_tests

        log = read_nccl_tests(path)
        return {"rows": int(len(log.frame)), "skipped_lines": len(log.skipped), "nccl_version": log.nccl_version}
    from flowsim.kernels.trace_events import read_events

    trace = read_events(path)
    if not trace.events:
        raise ConfigError("file", "has no trace event (not a Kineto trace)", None)
    return {"events": len(trace.events), "skipped_events": trace.skipped, "truncated": trace.truncated}


def parse(kind: str, filename: str, content: bytes) -> dict:
    """Check an upload of ``kind`` and return its summary (rows, events, NCCL release...).

    Raises
    ------
    ConfigError
        Unknown kind, empty or undecodable content, or a file its reader rejects (one line).
    """
    if kind not in KINDS:
        raise ConfigError("kind", f"must be one of {', '.join(KINDS)}", kind)
    if not content:
        raise ConfigError("file", "is empty", label(filename))
    try:
        text_bytes = gzip.decompress(content) if kind == "kineto" and content[:2] == b"\x1f\x8b" else content
        text_bytes.decode("utf-8")
    except (UnicodeDecodeError, EOFError, OSError):
        raise ConfigError("file", f"is not UTF-8 text (a {kind} file is text)", label(filename)) from None
    with tempfile.TemporaryDirectory(prefix="flowsim-upload-") as tmp:
        path = Path(tmp) / ("upload" + _SUFFIX[kind])
        path.write_bytes(text_bytes)
        try:
            return _summary(kind, path)
        except ConfigError as e:  # the reader names our file: name the client's instead
            def named(text: str) -> str:
                return text.replace(str(path), label(filename)).replace(path.name, label(filename))

            raise ConfigError(e.field, named(e.rule), None if e.got is None else named(str(e.got))) from None
        except RecursionError:
            raise ConfigError("file", f"is nested too deeply to be a {kind} file", label(filename)) from None


def sha256(content: bytes) -> str:
    """SHA-256 (hex) of an upload."""
    return hashlib.sha256(content).hexdigest()
