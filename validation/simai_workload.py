"""Reader of SimAI / AICB workload files (the ``.txt`` files SimAI's engines run).

Format (SimAI 1.7, commit cef83f9, ``astra-sim-alibabacloud/astra-sim/workload/Workload.cc``
``initialize_workload``; see ../shared/research/simai-notes.md section 1.4):

* line 1, header: ``<POLICY> model_parallel_NPU_group: <TP> ep: <EP> pp: <PP> vpp: <VPP> ga: <GA>
  all_gpus: <N> checkpoints: <k> <ids..> checkpoint_initiates: <k> <ids..> pp_comm[:] <bytes>``; keys other
  than the TP group may be absent (EP, PP, VPP, GA default to 1, ``pp_comm`` to 0);
* line 2, the number of layer lines;
* then one line per layer with 12 whitespace-separated fields: name, dependency (unused), forward compute
  (ns), forward comm type and bytes, input-gradient compute (ns), comm type and bytes, weight-gradient
  compute (ns), comm type and bytes, weight-update delay (ns).

A comm type is a collective name with an optional group suffix: no suffix is the TP group for forward and
input-gradient comm and the DP group for weight-gradient comm; ``_EP`` the expert group; ``_DP_EP`` the
data-parallel group of one expert. Byte counts follow the nccl-tests convention (total buffer for
AllGather/ReduceScatter/AllToAll, message size for AllReduce), as AICB writes them.

Partial files: a file with fewer layer lines than line 2 declares, or whose last line is cut off (no
final newline and too few fields), is read as far as it goes; the lines not read are counted in
:attr:`SimaiWorkload.skipped_lines`. Any other malformed line is an error naming the line and field.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from flowsim.errors import ConfigError

N_FIELDS = 12
"""Fields per layer line (Workload.cc reads 12 tokens per layer)."""
COLLECTIVES = ("ALLREDUCE", "ALLGATHER", "REDUCESCATTER", "ALLTOALL", "ALLREDUCEALLTOALL")
"""Collective names SimAI 1.7 accepts (Workload.cc), besides ``NONE``."""
GROUP_SUFFIXES = (("_DP_EP", "DP_EP"), ("_EP", "EP"))
"""Comm-type suffixes and the group they name, longest first (Workload.cc)."""
PHASES = ("fwd", "ig", "wg")
_HEADER_INT_KEYS = {"model_parallel_NPU_group": "tp", "ep": "ep", "pp": "pp", "vpp": "vpp", "ga": "ga",
                    "all_gpus": "all_gpus", "pp_comm": "pp_comm_bytes"}
_HEADER_LIST_KEYS = ("checkpoints", "checkpoint_initiates")
_FIELD_NAMES = ("name", "dependency", "fwd_compute_ns", "fwd_comm_type", "fwd_comm_bytes", "ig_compute_ns",
                "ig_comm_type", "ig_comm_bytes", "wg_compute_ns", "wg_comm_type", "wg_comm_bytes",
                "wg_update_ns")


@dataclass(frozen=True)
class SimaiComm:
    """One collective of a layer line.

    Attributes
    ----------
    op : str
        Lower-case collective name (``allreduce``, ``allgather``, ``reducescatter``, ``alltoall``,
        ``allreducealltoall``).
    group : str
        ``TP``, ``DP``, ``EP`` or ``DP_EP``.
    size_bytes : int
        Bytes in the nccl-tests convention (module docstring).
    """

    op: str
    group: str
    size_bytes: int


@dataclass(frozen=True)
class SimaiLayer:
    """One layer line; times stay integer nanoseconds as in the file (SimAI's ``Tick``).

    Attributes
    ----------
    line_no : int
        1-based line number in the file.
    name : str
        Layer name (``embedding_layer``, ``attention_column``, ...).
    fwd_compute_ns, ig_compute_ns, wg_compute_ns : int
        Forward, input-gradient and weight-gradient compute, ns.
    fwd_comm, ig_comm, wg_comm : SimaiComm or None
        The phase's collective; None for ``NONE``.
    wg_update_ns : int
        Delay after the weight-gradient comm, ns.
    """

    line_no: int
    name: str
    fwd_compute_ns: int
    fwd_comm: SimaiComm | None
    ig_compute_ns: int
    ig_comm: SimaiComm | None
    wg_compute_ns: int
    wg_comm: SimaiComm | None
    wg_update_ns: int

    def comms(self):
        """(phase, SimaiComm) pairs of the line's collectives, phases in ``fwd, ig, wg`` order."""
        return [(ph, c) for ph, c in zip(PHASES, (self.fwd_comm, self.ig_comm, self.wg_comm)) if c is not None]


@dataclass(frozen=True)
class SimaiWorkload:
    """A parsed SimAI workload file: one pipeline stage, all GA micro-batches unrolled (as AICB writes it).

    Attributes
    ----------
    policy : str
        Parallelism policy of the header (normally ``HYBRID_TRANSFORMER_FWD_IN_BCKWD``).
    tp, ep, pp, vpp, ga : int
        TP group size, expert-parallel size, pipeline stages, ``vpp`` as written (AICB writes the layers
        per stage) and gradient-accumulation steps (micro-batches per step).
    all_gpus : int
        GPUs of the job as the header states.
    pp_comm_bytes : int
        Bytes sent between neighbouring pipeline stages per micro-batch.
    layers : tuple of SimaiLayer
        The layer lines read.
    declared_lines : int
        Layer lines the file declares (line 2).
    skipped_lines : int
        Declared lines not read because the file ends early or its last line is cut off.
    """

    policy: str
    tp: int
    ep: int
    pp: int
    vpp: int
    ga: int
    all_gpus: int
    pp_comm_bytes: int
    layers: tuple
    declared_lines: int
    skipped_lines: int

    def to_dict(self) -> dict:
        """Header fields and line counts (the layers themselves are left out)."""
        return {k: getattr(self, k) for k in ("policy", "tp", "ep", "pp", "vpp", "ga", "all_gpus", "pp_comm_bytes",
                                              "declared_lines", "skipped_lines")} | {"lines_read": len(self.layers)}


def _int(text: str, where: str, field: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{where} {field}", "must be an integer", text) from None
    if value < 0 and field != "dependency":
        raise ConfigError(f"{where} {field}", "must be >= 0", text)
    return value


def parse_header(text: str) -> dict:
    """Fields of the header line (line 1).

    Parameters
    ----------
    text : str
        The line.

    Returns
    -------
    dict
        ``policy``, ``tp``, ``ep``, ``pp``, ``vpp``, ``ga``, ``all_gpus``, ``pp_comm_bytes``.

    Raises
    ------
    ConfigError
        An unknown key, a missing or non-integer value, or no TP group size.
    """
    tokens = text.split()
    if not tokens:
        raise ConfigError("line 1", "the header is empty")
    out = {"policy": tokens[0], "ep": 1, "pp": 1, "vpp": 1, "ga": 1, "all_gpus": 0, "pp_comm_bytes": 0}
    i = 1
    while i < len(tokens):
        key = tokens[i].rstrip(":")
        if key in _HEADER_LIST_KEYS:
            count = _int(tokens[i + 1] if i + 1 < len(tokens) else "", "line 1", key)
            i += 2 + count
        elif key in _HEADER_INT_KEYS:
            value = tokens[i + 1] if i + 1 < len(tokens) else ""
            out[_HEADER_INT_KEYS[key]] = _int(value, "line 1", key)
            i += 2
        else:
            known = ", ".join([*_HEADER_INT_KEYS, *_HEADER_LIST_KEYS])
            raise ConfigError("line 1", f"unknown header key; known: {known}", tokens[i])
    if "tp" not in out:
        raise ConfigError("line 1", "the header must give model_parallel_NPU_group (the TP size)", text.strip())
    for key in ("tp", "ep", "pp", "vpp", "ga"):
        if out[key] < 1:
            raise ConfigError(f"line 1 {key}", "must be >= 1", out[key])
    return out


def _comm(type_text: str, size_text: str, where: str, phase: str) -> SimaiComm | None:
    size = _int(size_text, where, f"{phase}_comm_bytes")
    if type_text == "NONE":
        return None
    base, group = type_text, ("DP" if phase == "wg" else "TP")
    for suffix, name in GROUP_SUFFIXES:
        if type_text.endswith(suffix):
            base, group = type_text[: -len(suffix)], name
            break
    if base not in COLLECTIVES:
        raise ConfigError(f"{where} {phase}_comm_type",
                          f"unknown collective; known: NONE, {', '.join(COLLECTIVES)} with optional suffix _EP or "
                          "_DP_EP", type_text)
    return SimaiComm(op=base.lower(), group=group, size_bytes=size)


def parse_layer_line(fields: list[str], line_no: int) -> SimaiLayer:
    """One layer line from its 12 fields.

    Parameters
    ----------
    fields : list of str
        The whitespace-separated fields.
    line_no : int
        1-based line number, for messages.

    Returns
    -------
    SimaiLayer

    Raises
    ------
    ConfigError
        A wrong field count, a non-integer or negative number, or an unknown comm type; the message names
        the line and the field.
    """
    where = f"line {line_no}"
    if len(fields) != N_FIELDS:
        raise ConfigError(where, f"a layer line has {N_FIELDS} fields ({' '.join(_FIELD_NAMES)})",
                          f"{len(fields)} fields")
    _int(fields[1], where, "dependency")
    return SimaiLayer(
        line_no=line_no,
        name=fields[0],
        fwd_compute_ns=_int(fields[2], where, "fwd_compute_ns"),
        fwd_comm=_comm(fields[3], fields[4], where, "fwd"),
        ig_compute_ns=_int(fields[5], where, "ig_compute_ns"),
        ig_comm=_comm(fields[6], fields[7], where, "ig"),
        wg_compute_ns=_int(fields[8], where, "wg_compute_ns"),
        wg_comm=_comm(fields[9], fields[10], where, "wg"),
        wg_update_ns=_int(fields[11], where, "wg_update_ns"),
    )


def parse_workload(text: str) -> SimaiWorkload:
    """Parse the text of a SimAI workload file (module docstring for the format and partial files).

    Parameters
    ----------
    text : str
        The whole file.

    Returns
    -------
    SimaiWorkload

    Raises
    ------
    ConfigError
        A bad header or layer-count line, or a malformed layer line other than a cut-off last line.
    """
    lines = text.split("\n")
    truncated_tail = not text.endswith("\n")
    header = parse_header(lines[0])
    if len(lines) < 2 or not lines[1].strip():
        raise ConfigError("line 2", "must give the number of layer lines", "end of file")
    declared = _int(lines[1].strip(), "line 2", "layer count")
    layers = []
    body = lines[2:]
    for i, line in enumerate(body):
        fields = line.split()
        if not fields:
            continue
        is_last = i == len(body) - 1
        if is_last and truncated_tail and len(fields) < N_FIELDS:
            break  # the file was cut off in this line: counted as skipped below
        if len(layers) == declared:
            raise ConfigError(f"line {i + 3}", f"more layer lines than the {declared} declared on line 2",
                              line.strip()[:40])
        layers.append(parse_layer_line(fields, i + 3))
    if not layers:
        raise ConfigError("line 3", "a workload needs at least one layer line (this file holds only its header)",
                          f"{declared} declared")
    return SimaiWorkload(**header, layers=tuple(layers), declared_lines=declared,
                         skipped_lines=declared - len(layers))


def read_workload(path: str | Path) -> SimaiWorkload:
    """Read a SimAI workload file.

    Parameters
    ----------
    path : str or Path
        The ``.txt`` file.

    Returns
    -------
    SimaiWorkload

    Raises
    ------
    ConfigError
        The file cannot be read, or :func:`parse_workload` rejects it (the message names the file).
    """
    from flowsim.io_text import read_text

    p = Path(path)
    text = read_text(p, "workload")
    try:
        return parse_workload(text)
    except ConfigError as e:
        raise ConfigError(f"{p.name} {e.field}", e.rule, e.got) from None
