"""The one reader of PyTorch-profiler (Kineto) Chrome traces: whole, cut-off or partly malformed files.

Used by the kernel ingest (:mod:`flowsim.kernels.ingest`) and by trace validation (:mod:`flowsim.validation`).

Layout (../shared/research/maxmin-and-traces.md part B): a JSON object with ``deviceProperties``,
``distributedInfo`` and ``traceEvents``; ``ts``/``dur`` in microseconds. The file may be gzip-compressed
(detected by its magic bytes, not its name).

Damage is handled as follows:

* a file that is not JSON (or not a JSON object with ``traceEvents``) is an error that says where parsing
  stopped (line and column);
* a cut-off file (truncated gzip stream or JSON that ends early) yields every event complete before the
  cut; :attr:`TraceEvents.truncated` is set;
* an event that is not an object, or a complete event (``ph`` "X") without a name or a numeric ``ts`` and
  ``dur`` >= 0, is skipped and counted, and the first few skipped event numbers (0-based index in
  ``traceEvents``) are kept for the message.
"""
from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass
from pathlib import Path

from flowsim.errors import ConfigError

GZIP_MAGIC = b"\x1f\x8b"
"""First two bytes of a gzip stream (RFC 1952 section 2.3.1)."""
_KEEP_SKIPPED = 5


@dataclass(frozen=True)
class TraceEvents:
    """Events and metadata of one Kineto trace.

    Attributes
    ----------
    path : str
        The file.
    meta : dict
        Top-level fields other than ``traceEvents`` (``deviceProperties``, ``distributedInfo``, ...); those
        after the events are missing when the file is cut off.
    events : list of dict
        Well-formed events, in file order.
    skipped : int
        Malformed events left out.
    skipped_examples : tuple of int
        Indices of the first skipped events.
    truncated : bool
        True when the file ends before the event list does.
    """

    path: str
    meta: dict
    events: list
    skipped: int
    skipped_examples: tuple
    truncated: bool

    def to_dict(self) -> dict:
        """Counts and flags (the events are left out)."""
        return {"path": self.path, "events": len(self.events), "skipped_events": self.skipped,
                "skipped_event_examples": list(self.skipped_examples), "truncated": self.truncated}


def _text(path: Path) -> tuple[str, bool]:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError("trace", f"cannot read {path}: {e.strerror}") from None
    truncated = False
    if raw[:2] == GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error):
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            try:
                raw = d.decompress(raw)
            except zlib.error as e:
                raise ConfigError("trace", f"{path.name} is a damaged gzip file ({e})") from None
            truncated = True
    return raw.decode("utf-8", errors="replace"), truncated


def _valid(e) -> bool:
    if not isinstance(e, dict):
        return False
    if e.get("ph") != "X":
        return True
    ts, dur = e.get("ts"), e.get("dur")
    return (isinstance(e.get("name"), str) and isinstance(ts, (int, float)) and isinstance(dur, (int, float))
            and dur >= 0)


def _partial(text: str, path: Path, err: json.JSONDecodeError) -> tuple[dict, list, bool]:
    """Events decoded one by one up to the cut (meta fields before the list are kept)."""
    key = text.find('"traceEvents"')
    start = text.find("[", key) if key >= 0 else -1
    if not text.lstrip().startswith("{") or start < 0:
        raise ConfigError("trace", f"{path.name} is not a Kineto JSON trace: {err.msg} at line {err.lineno} "
                                   f"column {err.colno}") from None
    meta = {}
    try:  # the fields before "traceEvents", re-closed as an object
        meta = json.loads(text[:key].rstrip().rstrip(",") + "}")
    except json.JSONDecodeError:
        pass
    decoder, events, i = json.JSONDecoder(), [], start + 1
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] == "]":
            break
        try:
            event, i = decoder.raw_decode(text, i)
        except (json.JSONDecodeError, RecursionError):
            return meta, events, True
        events.append(event)
    return meta, events, True  # the list closed: the damage is after it, in the metadata


def read_events(path: str | Path) -> TraceEvents:
    """Read a Kineto trace (module docstring for damaged files).

    Parameters
    ----------
    path : str or Path
        ``.json`` or ``.json.gz`` file.

    Returns
    -------
    TraceEvents

    Raises
    ------
    ConfigError
        Unreadable, not JSON, or not a trace; the message gives the position where parsing stopped.
    """
    path = Path(path)
    text, truncated = _text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        meta, raw_events, truncated = _partial(text, path, err)
    except RecursionError:
        raise ConfigError("trace", f"{path.name} is not a Kineto trace (JSON nested too deeply)") from None
    else:
        if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
            raise ConfigError("trace", f"{path.name} is not a Kineto trace (no traceEvents list)")
        raw_events = data.pop("traceEvents")
        meta = data
    events, bad = [], []
    for i, e in enumerate(raw_events):
        (events if _valid(e) else bad).append(e if _valid(e) else i)
    return TraceEvents(path=str(path), meta=meta, events=events, skipped=len(bad),
                       skipped_examples=tuple(bad[:_KEEP_SKIPPED]), truncated=truncated)
