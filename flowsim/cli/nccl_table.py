"""nccl-tests' text layout for ``flowsim collective``, so that ``flowsim validate-nccl`` reads it back.

Follows nccl-tests ``src/common.cu`` (v2.13): the banner ``# nThread 1 nGpus N minBytes ... maxBytes ...``, the
three column-header comment lines, one row per size ``size count type redop root`` then out-of-place and
in-place ``time algbw busbw #wrong`` (time in us, bandwidths in GB/s = 1e9 B/s), and the closing
``# Out of bounds values`` / ``# Avg bus bandwidth`` lines. Differences, both read by
:func:`flowsim.validation.nccl_tests.read_nccl_tests`: times carry one decimal more than nccl-tests prints (so the
round trip is exact to 0.01 %), and each row ends with a comment naming NCCL's algorithm and protocol
(``# Ring/LL``). The in-place columns repeat the out-of-place ones (the model does not tell them apart).
"""
from __future__ import annotations

from flowsim.units import GB, US

PERF_BINARY = {"allreduce": "all_reduce_perf", "allgather": "all_gather_perf",
               "reducescatter": "reduce_scatter_perf", "alltoall": "alltoall_perf", "sendrecv": "sendrecv_perf",
               "broadcast": "broadcast_perf", "reduce": "reduce_perf"}
"""nccl-tests binary of each collective (nccl-tests ``src/*.cu``)."""
_REDOP = {"allreduce": "sum", "reducescatter": "sum", "reduce": "sum"}  # the others print "none"
_ROOTED = ("broadcast", "reduce")  # root 0; the others print -1
_HEADER = (
    "#                                                              out-of-place                       in-place          ",
    "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong",
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       ",
)


def _time(us: float) -> str:
    """nccl-tests' time field (``%7.0f`` / ``%7.1f`` / ``%7.2f`` above 10 ms / 100 us / below), one decimal more."""
    return f"{us:7.1f}" if us >= 10000 else f"{us:7.2f}" if us >= 100 else f"{us:7.3f}"


def nccl_tests_lines(op: str, rows: list[dict], *, title: str, gpus_per_process: int, nccl_version: str,
                     env: dict) -> list[str]:
    """The lines of an nccl-tests log for ``rows``.

    Parameters
    ----------
    op : str
        The collective.
    rows : list of dict
        Per size: ``size_bytes``, ``count``, ``type``, ``time_s``, ``algbw_Bps``, ``busbw_Bps``, ``algo``,
        ``proto``.
    title : str
        First comment line (what was modelled).
    gpus_per_process : int
        GPUs one benchmark thread drives (the banner's ``nGpus``: validate-nccl reads the launch floor from it).
    nccl_version : str
        NCCL release modelled (printed as NCCL's ``NCCL version`` line).
    env : dict
        ``{"NCCL_ALGO": "ring", ...}`` the run applied; printed on an ``# ENV:`` line when not empty.

    Returns
    -------
    list of str
    """
    sizes = [r["size_bytes"] for r in rows]
    out = [f"# {title} ({PERF_BINARY[op]} layout)",
           f"# nThread 1 nGpus {gpus_per_process} minBytes {min(sizes):.0f} maxBytes {max(sizes):.0f} step: 2(factor) "
           "warmup iters: 0 iters: 1 agg iters: 1 validation: 0 graph: 0",
           f"# NCCL version {nccl_version}"]
    if env:
        out.append("# ENV: " + " ".join(f"{k}={v}" for k, v in env.items()))
    out += ["#", *_HEADER]
    redop, root = _REDOP.get(op, "none"), 0 if op in _ROOTED else -1
    for r in rows:
        res = f"  {_time(r['time_s'] / US)}  {r['algbw_Bps'] / GB:6.2f}  {r['busbw_Bps'] / GB:6.2f}  {0:5d}"
        out.append(f"{r['size_bytes']:12.0f}  {r['count']:12d}  {r['type']:>8s}  {redop:>6s}  {root:6d}{res}{res}"
                   f"  # {r['algo']}/{r['proto']}")
    avg = sum(r["busbw_Bps"] for r in rows) / len(rows) / GB
    return out + ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {avg:.6g} ", "#"]
