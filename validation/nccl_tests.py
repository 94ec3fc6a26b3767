"""Reader of nccl-tests / rccl-tests output logs.

Two row layouts are understood:

* the nccl-tests table: ``size count type [redop] [root] time algbw busbw #wrong time algbw busbw [#wrong]``
  (out-of-place first, then in-place; time in microseconds, bandwidths in GB/s = 1e9 bytes/s;
  ``#wrong`` may read ``N/A``);
* the "size busbw" layout of published summaries (Azure AI-benchmarking-guide):
  ``size busbw [time_us algbw]`` where only busbw is measured; the time is derived from it.

A file may hold several sections (runs): a run of comment lines after result rows starts a new section.
The collective of a section comes from its comment lines (``alltoall_perf``, ``all_reduce`` ...), else
from the file header, else from the ``op`` argument, else from the row's own columns where they tell it
(``redop`` set, ``root -1`` and ``count x type size = size``: nccl-tests' all_reduce_perf).
The NCCL environment a section states (``NCCL_ALGO=ring``, ``NCCL_NVLS_ENABLE=0`` ... in its comment lines; the
file header's for every section, a section's own on top) is applied by :func:`compare_nccl_tests`
(:class:`flowsim.nccl_models.NcclEnv`). Rows that cannot be read are skipped and listed with
their line numbers. The NCCL release that ran is taken from the log when it states one (see
:func:`nccl_version_of`), and so is each section's launch setup, the GPUs one host thread drives (see
:func:`launch_statement_of`; the benchmark's time floor it sets is :mod:`flowsim.nccl_models.launch`).
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from flowsim.errors import ConfigError
from flowsim.nccl_models import OPS, P2P_OPS, CommLayout, NcclEnv, busbw_factor, predict
from flowsim.nccl_models.launch import check_gpus_per_process, launch_floor_s
from flowsim.nccl_models.versions import version_from_code
from flowsim.units import GB, US, MiB

# Order matters: the longer names first ("reduce_scatter" before "reduce").
_OP_PATTERNS = (
    ("allreduce", re.compile(r"all_?reduce", re.I)),
    ("allgather", re.compile(r"all_?gather", re.I)),
    ("reducescatter", re.compile(r"reduce_?scatter", re.I)),
    ("alltoall", re.compile(r"all_?to_?all", re.I)),
    ("sendrecv", re.compile(r"send_?recv", re.I)),
    ("broadcast", re.compile(r"broadcast", re.I)),
    ("reduce", re.compile(r"\breduce_perf", re.I)),
)
_DTYPES = {"int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double", "bfloat16",
           "fp8_e4m3", "fp8_e5m2", "f8e4m3", "f8e5m2", "char", "int", "float16", "float32", "float64"}
_COLUMN_HEADER = re.compile(r"\bsize\b.*\b(count|busbw)|^\(B\)", re.I)
# NCCL release statements, most reliable first: the library nccl-tests linked (``nccl-library=21903``),
# NCCL's own or a header's "NCCL [version][:] 2.19.3" (case-sensitive: RCCL and nccl-tests versions are
# not NCCL's), then the headers nccl-tests was built with (``nccl-headers=21903``).
_VERSION_CODE_LIB = re.compile(r"nccl-library=(\d{5,})")
_VERSION_TEXT = re.compile(r"\bNCCL\b(?:\s+version)?\s*:?\s*v?(\d+\.\d+(?:\.\d+)?(?:[+-][\w.+-]*)?)")
_VERSION_CODE_HEADERS = re.compile(r"nccl-headers=(\d{5,})")
# Launch-setup statements (GPUs one host thread drives), most reliable first, each with the count it
# implies (None: the captured number): nccl-tests' banner "nThread 1 nGpus 8" (GPUs per thread); the
# command line "-g 8", with a "single process ... (-g 8)" phrase around it when there is one; "1 proc/GPU" /
# "one process per GPU" (MPI launch, one GPU each).
_LAUNCH_PATTERNS = (
    (re.compile(r"\bnThreads?\s+\d+\s+nGpus\s+(\d+)"), None),
    (re.compile(r"(?:single process[^#(]*(\()?\s*)?(?<![\w-])-g\s*(\d+)\b(?(1)\))", re.I), None),
    (re.compile(r"\b(?:1|one)\s+proc(?:ess)?\s*(?:/|\s+per\s+)\s*GPU\b", re.I), 1),
)
# NCCL environment statements: lines that begin with "ENV" / "export" / "env" (headers, scripts) hold
# NCCL_X=value tokens; NCCL's own INFO line reads "NCCL_X set by environment to value". Prose elsewhere
# ("use NCCL_ALGO=RING on 2 nodes") is not a setting of the run.
_ENV_LINE = re.compile(r"^\s*(?:ENV\b|export\b|env\b)", re.I)
_ENV = re.compile(r"\b(NCCL_[A-Z0-9_]+)=(\S+)")
_ENV_INFO = re.compile(r"\b(NCCL_[A-Z0-9_]+) set by environment to ([^\s,;)]+)")
_TYPE_BYTES = {"int8": 1, "uint8": 1, "char": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "f8e4m3": 1, "f8e5m2": 1,
               "half": 2, "bfloat16": 2, "float16": 2, "int32": 4, "uint32": 4, "int": 4, "float": 4, "float32": 4,
               "int64": 8, "uint64": 8, "double": 8, "float64": 8}
"""Bytes per element of nccl-tests' types (``src/common.cu`` ``wordSize``)."""
COLUMNS = ["section", "section_title", "line", "op", "size_bytes", "count", "dtype", "time_s", "algbw_Bps",
           "busbw_Bps", "time_inplace_s", "algbw_inplace_Bps", "busbw_inplace_Bps", "time_derived"]


@dataclass(frozen=True)
class NcclTestsLog:
    """A parsed log.

    Attributes
    ----------
    nccl_version : str or None
        The NCCL release the log states (:func:`nccl_version_of`), None when it states none.
    frame : pandas.DataFrame
        One row per result line, columns :data:`COLUMNS`: ``time_s`` (seconds), ``algbw_Bps`` and
        ``busbw_Bps`` (bytes/s) of the out-of-place run, the same for the in-place run (NaN when absent),
        ``size_bytes`` in nccl-tests' convention (total buffer for AllGather/ReduceScatter/AllToAll),
        ``time_derived`` true when the log published busbw only and the time is computed from it.
    skipped : tuple[tuple[int, str], ...]
        (line number, reason) of every non-comment line that could not be read.
    path : str
        The file read.
    launch : dict[int, LaunchStatement]
        Per section, the launch setup its comment lines state (:func:`launch_statement_of`; the first
        section's are the file header); a later section that states none is not given the header's.
    env : dict[int, NcclEnv]
        Per section, the NCCL environment stated (:func:`env_of`): the file header's, with the section's own
        comment lines on top.
    """

    frame: pd.DataFrame
    skipped: tuple
    path: str
    nccl_version: str | None = None
    launch: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)


@dataclass(frozen=True)
class LaunchStatement:
    """What a log section says about how its benchmark was launched.

    Attributes
    ----------
    gpus_per_process : int or None
        GPUs one host thread/process drove; None when the section does not say.
    evidence : str or None
        The text it was read from (``"single process -g 8"``, ``"nThread 1 nGpus 8"``, ``"1 proc/GPU"``).
    """

    gpus_per_process: int | None = None
    evidence: str | None = None


def nccl_version_of(lines) -> str | None:
    """The NCCL release a log states, as text (``"2.19.3"``, ``"2.18.5+cuda12.2"``), or None.

    Parameters
    ----------
    lines : iterable of str
        The lines of the log.

    Returns
    -------
    str or None
        From, in this order: ``nccl-library=NNNNN`` (nccl-tests' banner: the library that ran), a statement
        ``NCCL 2.19.3`` / ``NCCL: 2.26.2`` / ``NCCL version 2.18.5+cuda12.2`` (headers, NCCL's INFO line),
        ``nccl-headers=NNNNN`` (the headers nccl-tests was built with). RCCL versions are not read: RCCL
        numbers its releases after the NCCL API it follows, not after NCCL's tuning.
    """
    lines = list(lines)
    for pattern in (_VERSION_CODE_LIB, _VERSION_TEXT, _VERSION_CODE_HEADERS):
        for line in lines:
            m = pattern.search(line)
            if m:
                text = m.group(1)
                return version_from_code(int(text)) if pattern is not _VERSION_TEXT else text
    return None


def launch_statement_of(lines) -> LaunchStatement:
    """The launch setup comment lines state: GPUs driven by one host thread/process, and the text saying so.

    Parameters
    ----------
    lines : iterable of str
        Comment lines of one log section (the file header for the first).

    Returns
    -------
    LaunchStatement
        From, in this order: nccl-tests' banner ``nThread T nGpus N`` (N GPUs per thread), the command line
        ``-g N`` (also inside "single process of all_reduce_perf over all local GPUs (-g 8)"), and
        ``1 proc/GPU`` / ``one process per GPU`` (1). Empty when none is stated: the setup is then unknown,
        not guessed (a header naming only "single host" or "n=4 GPUs" does not say how they were launched).
    """
    lines = list(lines)
    for pattern, implied in _LAUNCH_PATTERNS:
        for line in lines:
            m = pattern.search(line)
            if m:
                count = implied if implied is not None else int(m.groups()[-1])
                return LaunchStatement(count, m.group(0).strip())
    return LaunchStatement()


def env_of(lines) -> dict:
    """``{"NCCL_ALGO": "COLLNETCHAIN", ...}``: the NCCL environment the lines state (the last one wins).

    Parameters
    ----------
    lines : iterable of str
        Comment lines, without the ``#``. Read: every ``NCCL_*=value`` on a line that begins with ``ENV``,
        ``export`` or ``env`` (``ENV: NCCL_NVLS_ENABLE=0 NCCL_COLLNET_ENABLE=0 ...``), and NCCL's INFO line
        ``NCCL_ALGO set by environment to ring``. Elsewhere (prose) ``NCCL_X=value`` is not taken.
    """
    env = {}
    for line in lines:
        text = line.lstrip("#").strip()
        found = _ENV.finditer(text) if _ENV_LINE.match(text) else _ENV_INFO.finditer(text)
        env.update((m.group(1), m.group(2).rstrip(",;.)")) for m in found)
    return env


def _op_from_columns(toks: list[str]) -> str | None:
    """all_reduce_perf's row (redop set, root -1, count x type size = size), else None: the other tests'
    columns do not tell them apart."""
    if len(toks) < 5 or toks[2].lower() not in _TYPE_BYTES or toks[3].lower() == "none" or toks[4] != "-1":
        return None
    size, count = _num(toks[0]), _num(toks[1])
    return "allreduce" if size and count and count * _TYPE_BYTES[toks[2].lower()] == size else None


def _detect_op(texts) -> str | None:
    for text in texts:
        for op, pat in _OP_PATTERNS:
            if pat.search(text):
                return op
    return None


def _num(tok: str) -> float | None:
    """The finite number ``tok`` spells, else None (``inf``/``nan`` cells are not measurements)."""
    try:
        v = float(tok)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _parse_table_row(toks: list[str]):
    """nccl-tests row -> (size, count, dtype, oop (t, algbw, busbw), ip (t, algbw, busbw)) or a reason."""
    if len(toks) < 9:
        return "too few columns for an nccl-tests row"
    size, count = _num(toks[0]), _num(toks[1])
    if size is None or count is None or toks[2].lower() not in _DTYPES:
        return "expected 'size count type ...'"
    rest = toks[3:]
    if _num(rest[0]) is None and rest[0].upper() != "N/A":
        rest = rest[1:]  # redop
    if len(rest) in (8, 9):  # root present
        rest = rest[1:]
    if len(rest) not in (7, 8):
        return f"expected 7 or 8 result columns after the type, found {len(rest)}"
    vals = [_num(t) for t in (rest[0], rest[1], rest[2], rest[4], rest[5], rest[6])]
    if any(v is None for v in vals):
        return "non-numeric time or bandwidth"
    t0, a0, b0, t1, a1, b1 = vals
    return int(size), int(count), toks[2], (t0 * US, a0 * GB, b0 * GB), (t1 * US, a1 * GB, b1 * GB)


def read_nccl_tests(path: str | Path, op: str | None = None, n_ranks: int | None = None) -> NcclTestsLog:
    """Parse an nccl-tests or rccl-tests output file.

    Parameters
    ----------
    path : str or Path
        The log file.
    op : str, optional
        Collective to assume where the log does not name one (one of :data:`OPS`).
    n_ranks : int, optional
        Ranks of the run; needed only to derive the time of "size busbw" rows of logs without a
        derived-time column (time = size * busbw factor / busbw).

    Returns
    -------
    NcclTestsLog
        The rows as a DataFrame, the skipped lines and the NCCL release the log states.

    Raises
    ------
    ConfigError
        Unknown ``op``, a file that cannot be read, no result rows, or a section whose collective
        cannot be told (``op`` not given).
    """
    if op is not None and op not in OPS:
        raise ConfigError("op", f"must be one of {', '.join(OPS)}", op)
    from flowsim.io_text import read_text

    lines = read_text(path, "log").splitlines()
    header = []
    for line in lines:
        if line.strip() and not line.lstrip().startswith("#"):
            break
        header.append(line)
    file_op = _detect_op(header) or op
    header_env = env_of(header)
    rows, skipped, launch, env = [], [], {}, {}
    section, title, sec_op, comments, seen_data = 0, "", None, [], False
    size_busbw_layout = any(re.search(r"size\S*\s+busbw", h) for h in header)
    for no, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            if seen_data:
                section += 1
                seen_data = False
                comments = []
            comments.append(line.lstrip("#").strip())
            continue
        if not seen_data:  # the first row of a section: settle its title and collective
            marked = [c for c in comments if c.startswith(("=====", "----"))]
            plain = [c for c in comments if c and not _COLUMN_HEADER.search(c)]
            title = (marked[0] if marked else (plain[-1] if plain else "")).strip("=- ")
            sec_op = _detect_op(comments if section else [c for c in comments if "_perf" in c]) or file_op
            if size_busbw_layout is False and comments:
                size_busbw_layout = any(re.search(r"size\S*\s+busbw", c) for c in comments)
            launch[section] = launch_statement_of(comments)
            env[section] = NcclEnv.from_mapping({**header_env, **env_of(comments)})
            seen_data = True
        toks = line.split("#", 1)[0].split()  # a trailing comment (flowsim collective's "# Ring/LL") is not data
        if sec_op is None:
            sec_op = _op_from_columns(toks)
        if sec_op is None:
            skipped.append((no, "collective unknown (pass op=)"))
            continue
        if size_busbw_layout and len(toks) in (2, 4) and all(_num(t) is not None for t in toks):
            size, busbw = int(float(toks[0])), float(toks[1]) * GB
            if len(toks) == 4:
                t = float(toks[2]) * US
            elif n_ranks:
                t = size * busbw_factor(sec_op, n_ranks) / busbw if busbw > 0 else np.nan
            else:
                skipped.append((no, "size busbw row without a time column: pass n_ranks"))
                continue
            algbw = size / t if t > 0 else np.nan
            rows.append((section, title, no, sec_op, size, np.nan, "", t, algbw, busbw,
                         np.nan, np.nan, np.nan, True))
            continue
        parsed = _parse_table_row(toks)
        if isinstance(parsed, str):
            skipped.append((no, parsed))
            continue
        size, count, dtype, oop, ip = parsed
        rows.append((section, title, no, sec_op, size, count, dtype, *oop, *ip, False))
    if not rows:
        raise ConfigError("log", "no nccl-tests result rows found", str(path))
    frame = pd.DataFrame(rows, columns=COLUMNS)
    return NcclTestsLog(frame, tuple(skipped), str(path), nccl_version_of(lines), launch, env)


@dataclass(frozen=True)
class AccuracySummary:
    """|busbw error| statistics of one comparison, split at 1 MiB.

    Attributes
    ----------
    n_large, n_small : int
        Rows with ``size_bytes >= 1 MiB`` and below.
    median_abs_error_large, max_abs_error_large : float
        Median and max of |busbw error| (fraction, 0.1 = 10 %) for sizes >= 1 MiB; NaN without rows.
    median_abs_error_small, max_abs_error_small : float
        The same below 1 MiB.
    """

    n_large: int
    median_abs_error_large: float
    max_abs_error_large: float
    n_small: int
    median_abs_error_small: float
    max_abs_error_small: float

    def to_dict(self) -> dict:
        """Field mapping."""
        return asdict(self)


@dataclass(frozen=True)
class NcclComparison:
    """Measured against predicted, per row of an nccl-tests log.

    Attributes
    ----------
    rows : pandas.DataFrame
        ``section``, ``line``, ``op``, ``size_bytes``, ``measured_time_s``, ``predicted_time_s``,
        ``measured_busbw_Bps``, ``predicted_busbw_Bps``, ``busbw_error`` (predicted / measured busbw - 1,
        computed from the times so that busbw printed as 0.00 still counts), ``algo``, ``proto``,
        ``launch_floor_s`` (the benchmark's launch floor of the row's section, seconds; 0 for none).
    summary : AccuracySummary
        Median and max |busbw error| above and below 1 MiB.
    skipped : tuple[tuple[int, str], ...]
        Unreadable lines of the log (line number, reason).
    launch : tuple[dict, ...]
        Per section compared, the launch setup used (:func:`section_launch`).
    env : tuple[dict, ...]
        Per section compared, ``section`` and the NCCL environment applied (:meth:`NcclEnv.to_dict`).
    """

    rows: pd.DataFrame
    summary: AccuracySummary
    skipped: tuple
    launch: tuple = ()
    env: tuple = ()

    def to_dict(self) -> dict:
        """JSON-ready mapping: rows (records), summary, skipped, launch, env."""
        return {"rows": self.rows.to_dict(orient="records"), "summary": self.summary.to_dict(),
                "skipped": [{"line": n, "reason": r} for n, r in self.skipped], "launch": list(self.launch),
                "env": list(self.env)}


def summarize(sizes_bytes, busbw_error) -> AccuracySummary:
    """Median / max |busbw error| for sizes >= 1 MiB and below.

    Parameters
    ----------
    sizes_bytes : array-like of float
        Sizes of the rows, bytes.
    busbw_error : array-like of float
        Signed busbw error of each row (fraction).

    Returns
    -------
    AccuracySummary
    """
    sizes = np.asarray(sizes_bytes, dtype=float)
    err = np.abs(np.asarray(busbw_error, dtype=float))
    large, small = err[sizes >= MiB], err[sizes < MiB]

    def stats(x):
        return (int(x.size), float(np.median(x)) if x.size else float("nan"),
                float(x.max()) if x.size else float("nan"))

    return AccuracySummary(*stats(large), *stats(small))


def section_launch(log: NcclTestsLog, section: int, layout: CommLayout, gpus_per_process=None) -> dict:
    """The launch setup one section of ``log`` is compared with.

    Parameters
    ----------
    log : NcclTestsLog
        The parsed log.
    section : int
        The section.
    layout : CommLayout
        The communicator (a process drives GPUs of its own node only).
    gpus_per_process : int or str, optional
        Override of what the log states, for every section.

    Returns
    -------
    dict
        ``section``; ``gpus_per_process`` (None when neither given nor stated: unknown, no floor);
        ``source`` (``"given"``, ``"stated in the log"``, ``"not stated in the log"``); ``evidence`` (the
        log's text, or None); ``floor_s`` (:func:`flowsim.nccl_models.launch.launch_floor_s`, seconds).
    """
    stated = log.launch.get(section, LaunchStatement())
    setup = {"section": section, "gpus_per_process": None, "source": "not stated in the log",
             "evidence": stated.evidence, "floor_s": 0.0}
    if gpus_per_process is not None:
        setup.update(gpus_per_process=gpus_per_process, source="given")
    elif stated.gpus_per_process is not None:
        setup.update(gpus_per_process=stated.gpus_per_process, source="stated in the log")
    else:
        return setup
    count = check_gpus_per_process(setup["gpus_per_process"], layout.ranks_per_node)
    return {**setup, "gpus_per_process": count, "floor_s": launch_floor_s(count)}


def apply_launch_floor(cmp: NcclComparison, launch: tuple) -> NcclComparison:
    """``cmp`` with every predicted time raised to its row's ``launch_floor_s`` (a no-op where it is 0).

    Parameters
    ----------
    cmp : NcclComparison
        A comparison whose rows carry ``launch_floor_s`` (seconds); the flow engine's
        (:func:`flowsim.validation.nccl_flows.flow_comparison`) keeps the column of the analytic rows it redoes.
    launch : tuple of dict
        The setups the floors come from (:func:`section_launch`), kept on the result.

    Returns
    -------
    NcclComparison
        ``predicted_time_s = max(predicted, floor)``, predicted busbw, error and summary recomputed.
    """
    rows = cmp.rows.copy()
    floored = np.maximum(rows["predicted_time_s"], rows["launch_floor_s"])
    rows["predicted_busbw_Bps"] *= rows["predicted_time_s"] / floored
    rows["predicted_time_s"] = floored
    rows["busbw_error"] = rows["measured_time_s"] / floored - 1.0
    return NcclComparison(rows, summarize(rows["size_bytes"], rows["busbw_error"]), cmp.skipped, tuple(launch),
                          cmp.env)


def compare_nccl_tests(log: NcclTestsLog, layout: CommLayout, *, algo: str | None = None,
                       proto: str | None = None, sections=None, gpus_per_process=None) -> NcclComparison:
    """Predict every row of ``log`` on ``layout`` and compare with the measurement.

    Parameters
    ----------
    log : NcclTestsLog
        A parsed log (:func:`read_nccl_tests`).
    layout : CommLayout
        The communicator the log was measured on.
    algo, proto : str, optional
        NCCL_ALGO / NCCL_PROTO overrides the run used (e.g. ``"ring"`` for a Ring-only run); they win over the
        ``NCCL_ALGO`` / ``NCCL_PROTO`` the log states. The rest of the log's NCCL environment (``log.env``:
        NVLS and CollNet enable, CTA bounds) is applied to ``layout`` per section.
    sections : iterable of int, optional
        Sections of the log to compare (default all).
    gpus_per_process : int or str, optional
        GPUs one host thread drove in the benchmark, for every section; default: what each section states
        (``log.launch``), no launch floor where it states nothing. More than one sets the floor
        ``gpus_per_process x HOST_LAUNCH_S`` (:mod:`flowsim.nccl_models.launch`).

    Returns
    -------
    NcclComparison
        Rows with size 0 are left out (nccl-tests prints them with zero time).
    """
    df = log.frame[log.frame["size_bytes"] > 0]
    if sections is not None:
        wanted = set(sections)
        unknown = wanted - set(df["section"])
        if unknown:
            raise ConfigError("section", f"not in the log (sections: {sorted(set(df['section']))})",
                              sorted(unknown))
        df = df[df["section"].isin(wanted)]
    launch = tuple(section_launch(log, s, layout, gpus_per_process) for s in sorted(set(df["section"])))
    floor_of = {d["section"]: d["floor_s"] for d in launch}
    env = {s: log.env.get(s, NcclEnv()) for s in sorted(set(df["section"]))}
    out = []
    for row in df.itertuples(index=False):
        e = env[row.section]
        p2p = row.op in P2P_OPS
        est = predict(row.op, row.size_bytes, e.layout(layout), algo=None if p2p else e.algo_for(row.op, algo),
                      proto=None if p2p else e.proto_for(proto))
        factor = busbw_factor(row.op, layout.n_ranks)
        out.append((row.section, row.line, row.op, row.size_bytes, row.time_s, est.time_s,
                    row.size_bytes * factor / row.time_s, est.busbw_Bps, row.time_s / est.time_s - 1.0,
                    est.algo, est.proto, floor_of[row.section]))
    rows = pd.DataFrame(out, columns=["section", "line", "op", "size_bytes", "measured_time_s", "predicted_time_s",
                                      "measured_busbw_Bps", "predicted_busbw_Bps", "busbw_error", "algo", "proto",
                                      "launch_floor_s"])
    model = NcclComparison(rows, summarize(rows["size_bytes"], rows["busbw_error"]), log.skipped,
                           env=tuple({"section": s, **e.to_dict()} for s, e in env.items()))
    return apply_launch_floor(model, launch)
