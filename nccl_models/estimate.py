"""Public front-end: predict one collective, or show NCCL's whole cost table for it.

Byte-count convention (nccl-tests ``size`` column, doc/PERFORMANCE.md): for AllGather, ReduceScatter and
AllToAll ``size_bytes`` is the total buffer (per-rank count x ranks x element size); for AllReduce,
Broadcast, Reduce and Send/Recv it is the message size. ``algbw = size / time``; ``busbw = algbw x factor``
with the factors of :func:`busbw_factor`.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from flowsim.errors import ConfigError
from flowsim.nccl_models.constants import ALGO_NAMES, PROTO_NAMES, Algo, Coll, Proto
from flowsim.nccl_models.execution import exec_time_s, run_channels
from flowsim.nccl_models.graph import graphs_of
from flowsim.nccl_models.layout import CommLayout
from flowsim.nccl_models.overrides import parse_override
from flowsim.nccl_models.p2p import alltoall_time_s, sendrecv_time_s
from flowsim.nccl_models.tuning import cost_model, nccl_time_s

OPS = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall", "sendrecv")
"""Collectives :func:`predict` knows, in nccl-tests order."""
P2P_OPS = ("alltoall", "sendrecv")
COLL_OF_OP = {"allreduce": Coll.ALLREDUCE, "allgather": Coll.ALLGATHER, "reducescatter": Coll.REDUCESCATTER,
         "broadcast": Coll.BROADCAST, "reduce": Coll.REDUCE}


def busbw_factor(op: str, n_ranks: int) -> float:
    """nccl-tests bus-bandwidth factor, ``busbw = algbw * factor`` (nccl-tests doc/PERFORMANCE.md).

    Parameters
    ----------
    op : str
        One of :data:`OPS`.
    n_ranks : int
        Ranks of the communicator, >= 1.

    Returns
    -------
    float
        AllReduce ``2(n-1)/n``; AllGather, ReduceScatter, AllToAll ``(n-1)/n``; Broadcast, Reduce, SendRecv 1.
    """
    _check_op(op)
    if op == "allreduce":
        return 2.0 * (n_ranks - 1) / n_ranks
    if op in ("allgather", "reducescatter", "alltoall"):
        return (n_ranks - 1) / n_ranks
    return 1.0


@dataclass(frozen=True)
class CollectiveEstimate:
    """Predicted time of one collective, with NCCL's choice and the runner-up.

    Attributes
    ----------
    op : str
        Collective (one of :data:`OPS`).
    size_bytes : float
        Size in the nccl-tests convention (module docstring), bytes.
    n_ranks : int
        Ranks of the communicator.
    time_s : float
        Predicted time, seconds (NCCL's latency + size / calibrated bandwidth + pipeline fill).
    algo, proto : str
        NCCL's names of the algorithm and protocol that run (``P2P``/``Simple`` for AllToAll and
        Send/Recv; ``none``/``none`` for a single rank, which moves no data).
    algbw_Bps, busbw_Bps : float
        ``size_bytes / time_s`` and its nccl-tests bus bandwidth, bytes/s (infinite for a single rank,
        whose time is 0).
    nccl_model_time_s : float
        NCCL's own estimate for the chosen entry, the figure it ranks by, seconds.
    runner_up_algo, runner_up_proto : str or None
        Second entry of NCCL's ranking; None when nothing else was allowed (see ``runner_up_reason``).
    runner_up_time_s : float or None
        Predicted time of the runner-up, seconds.
    runner_up_reason : str or None
        Why there is no runner-up, when there is none.
    n_ctas : int
        Thread blocks the collective kernel launches, one per channel it runs on (NCCL ``src/enqueue.cc``:
        the grid has one CTA per channel; small Ring/Tree messages run on fewer channels,
        :func:`~flowsim.nccl_models.execution.run_channels`); each holds one SM for the collective's
        duration, which compute kernels running at the same time cannot use. Point-to-point ops use the
        communicator's channels (``p2pnChannels`` = ``nChannels`` with the default NCCL_MAX_P2P_NCHANNELS,
        ``src/init.cc``).
    """

    op: str
    size_bytes: float
    n_ranks: int
    time_s: float
    algo: str
    proto: str
    algbw_Bps: float
    busbw_Bps: float
    nccl_model_time_s: float
    runner_up_algo: str | None
    runner_up_proto: str | None
    runner_up_time_s: float | None
    runner_up_reason: str | None = None
    n_ctas: int = 0

    def to_dict(self) -> dict:
        """Field mapping with units in the key names (what ``--json`` prints)."""
        return asdict(self)

    def __repr__(self) -> str:
        return (f"CollectiveEstimate({self.op} {self.size_bytes:.0f} B on {self.n_ranks} ranks: "
                f"{self.time_s * 1e6:.1f} us {self.algo}/{self.proto}, busbw {self.busbw_Bps / 1e9:.1f} GB/s)")


def _check_op(op: str) -> None:
    if op not in OPS:
        raise ConfigError("op", f"must be one of {', '.join(OPS)}", op)


def check_size(size_bytes) -> float:
    """``size_bytes`` as a float, or ConfigError naming ``size_bytes`` (not a number, not finite and > 0)."""
    try:
        size = float(size_bytes)
    except (TypeError, ValueError):
        raise ConfigError("size_bytes", "must be a number of bytes", size_bytes) from None
    if not (size > 0 and math.isfinite(size)):
        raise ConfigError("size_bytes", "must be > 0", size_bytes)
    return size


def _candidates(op: str, layout: CommLayout, algo: str | None, proto: str | None):
    """Available (Algo, Proto) entries after overrides; raises when an override leaves none."""
    model = cost_model(COLL_OF_OP[op], layout)
    algos = parse_override(algo, op, "algo") if algo else frozenset(Algo)
    protos = parse_override(proto, op, "proto") if proto else frozenset(Proto)
    entries = [(a, p) for a in Algo for p in Proto
               if a in algos and p in protos and model.reason[a][p] is None]
    if not entries:
        why = []
        for a in sorted(algos):
            allowed = [p for p in (Proto.SIMPLE, Proto.LL128, Proto.LL) if p in protos]
            if allowed:
                why.append(f"{ALGO_NAMES[a]}: {model.reason[a][allowed[0]]}")
        field = "algo" if algo else "proto"
        raise ConfigError(field, f"cannot run {op} on {layout.n_ranks} ranks over {layout.n_nodes} node(s) "
                                 f"with this override ({'; '.join(why)})", algo if algo else proto)
    return model, entries


def predict(op: str, size_bytes: float, layout: CommLayout, *, algo: str | None = None,
            proto: str | None = None) -> CollectiveEstimate:
    """Predict the time of one collective and the algorithm/protocol NCCL picks for it.

    Parameters
    ----------
    op : str
        One of :data:`OPS`.
    size_bytes : float
        Bytes, nccl-tests convention: total buffer for AllGather/ReduceScatter/AllToAll, message size
        otherwise; > 0.
    layout : CommLayout
        The communicator.
    algo, proto : str, optional
        Overrides in NCCL_ALGO / NCCL_PROTO syntax (``"ring"``, ``"^nvls"``, ``"allreduce:tree"``,
        ``"LL128"``). Not accepted for AllToAll and Send/Recv (no algorithm choice in NCCL).

    Returns
    -------
    CollectiveEstimate

    Raises
    ------
    ConfigError
        Unknown op, non-positive size, a bad override token, or an override that leaves no algorithm
        able to run on this communicator (e.g. NVLS without NVSwitch, PAT with several ranks per node).

    Notes
    -----
    Selection is NCCL's: the argmin of NCCL 2.30.7's own time estimate over the allowed entries
    (``src/enqueue.cc`` ``topoGetAlgoInfo``). The reported time is the execution model of
    :mod:`flowsim.nccl_models.execution` for the chosen entry.
    """
    _check_op(op)
    size = check_size(size_bytes)
    n = layout.n_ranks
    factor = busbw_factor(op, n)
    if op in P2P_OPS:
        if algo or proto:
            raise ConfigError("algo" if algo else "proto",
                              f"{op} is point-to-point in NCCL; NCCL_ALGO/NCCL_PROTO do not apply", algo or proto)
        if n == 1:
            return _single_rank(op, size)
        t = alltoall_time_s(layout, size) if op == "alltoall" else sendrecv_time_s(layout, size)
        return CollectiveEstimate(op, size, n, t, "P2P", "Simple", size / t, size / t * factor, t,
                                  None, None, None, "point-to-point: NCCL has no algorithm choice",
                                  graphs_of(layout).exec_channels)
    if n == 1:
        return _single_rank(op, size)
    model, entries = _candidates(op, layout, algo, proto)
    ranked = sorted(entries, key=lambda e: nccl_time_s(model, layout, e[0], e[1], size))
    a, p = ranked[0]
    t = exec_time_s(model.coll, layout, a, p, size)
    if len(ranked) > 1:
        ra, rp = ranked[1]
        runner = (ALGO_NAMES[ra], PROTO_NAMES[rp], exec_time_s(model.coll, layout, ra, rp, size), None)
    else:
        runner = (None, None, None, "no other algorithm/protocol is allowed and available")
    return CollectiveEstimate(op, size, n, t, ALGO_NAMES[a], PROTO_NAMES[p], size / t, size / t * factor,
                              nccl_time_s(model, layout, a, p, size), *runner,
                              n_ctas=run_channels(model, layout, a, p, size))


def _single_rank(op: str, size: float) -> CollectiveEstimate:
    return CollectiveEstimate(op, size, 1, 0.0, "none", "none", math.inf, math.inf, 0.0, None, None, None,
                              "a single rank moves no data")


def cost_table(op: str, size_bytes: float, layout: CommLayout):
    """Every (algorithm, protocol) NCCL knows for ``op``, with its figures or why it is unavailable.

    Parameters
    ----------
    op : str
        One of the collectives in NCCL's table (``allreduce``, ``allgather``, ``reducescatter``,
        ``broadcast``, ``reduce``).
    size_bytes : float
        Bytes, nccl-tests convention; > 0.
    layout : CommLayout
        The communicator, >= 2 ranks.

    Returns
    -------
    pandas.DataFrame
        One row per (algo, proto): ``algo``, ``proto``, ``latency_s``, ``algbw_Bps`` (NCCL's table),
        ``nccl_time_s`` (NCCL's estimate), ``time_s`` (predicted), ``rank`` (1 = NCCL's choice; NaN if
        unavailable) and ``unavailable_reason`` (missing, NA, when available). NCCL's TUNING log shows the same
        matrix.
    """
    _check_op(op)
    size = check_size(size_bytes)
    if op in P2P_OPS:
        raise ConfigError("op", "the cost table covers NCCL's tuned collectives; "
                                f"{op} is point-to-point", op)
    if layout.n_ranks == 1:
        raise ConfigError("n_ranks", "the cost table needs >= 2 ranks", layout.n_ranks)
    model = cost_model(COLL_OF_OP[op], layout)
    rows = []
    for a in Algo:
        for p in Proto:
            why = model.reason[a][p]
            if why is None:
                rows.append((ALGO_NAMES[a], PROTO_NAMES[p], model.latency_s[a, p], model.algbw_Bps[a, p],
                             nccl_time_s(model, layout, a, p, size), exec_time_s(model.coll, layout, a, p, size), None))
            else:
                rows.append((ALGO_NAMES[a], PROTO_NAMES[p], math.nan, math.nan, math.nan, math.nan, why))
    import pandas as pd  # a view: predict() and the engine import no pandas

    df = pd.DataFrame(rows, columns=["algo", "proto", "latency_s", "algbw_Bps", "nccl_time_s", "time_s",
                                     "unavailable_reason"])
    df["rank"] = df["nccl_time_s"].rank(method="first")
    return df
