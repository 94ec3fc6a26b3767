"""Parse NCCL_ALGO / NCCL_PROTO style overrides.

Syntax (NCCL 2.30.7 ``src/graph/tuning.cc`` ``parseList`` and the NCCL environment documentation):
a comma-separated list of names (``ring,tree``), optionally negated with a leading ``^`` (``^nvls``),
optionally restricted to collectives with ``coll:list`` parts separated by ``;``
(``allreduce:ring,tree;allgather:^pat``). Names are case-insensitive; ``collnet`` means both CollNet
algorithms.
"""
from __future__ import annotations

from flowsim.errors import ConfigError
from flowsim.nccl_models.constants import ALGO_NAMES, PROTO_NAMES, Algo, Proto

_ALGOS = {name.lower(): (a,) for a, name in ALGO_NAMES.items()}
_ALGOS["collnet"] = (Algo.COLLNET_DIRECT, Algo.COLLNET_CHAIN)
_PROTOS = {name.lower(): (p,) for p, name in PROTO_NAMES.items()}
COLL_NAMES = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce")


def parse_override(text: str, op: str, kind: str) -> frozenset:
    """Algorithms (``kind="algo"``) or protocols (``kind="proto"``) that ``text`` allows for ``op``.

    Parameters
    ----------
    text : str
        Override in NCCL_ALGO / NCCL_PROTO syntax.
    op : str
        Collective being priced (one of ``allreduce``, ``allgather``, ``reducescatter``, ``broadcast``,
        ``reduce``).
    kind : str
        ``"algo"`` or ``"proto"``.

    Returns
    -------
    frozenset of Algo or Proto
        The allowed members (all members when no part of ``text`` applies to ``op``).

    Raises
    ------
    ConfigError
        An unknown name or collective; the message names the bad token.
    """
    table, enum, field = (_ALGOS, Algo, "algo") if kind == "algo" else (_PROTOS, Proto, "proto")
    everything = frozenset(enum)
    allowed = everything
    for part in (s.strip() for s in text.split(";")):
        if not part:
            continue
        colls = None
        if ":" in part:
            coll_text, part = part.split(":", 1)
            colls = {c.strip().lower() for c in coll_text.split(",")}
            for c in colls:
                if c not in COLL_NAMES:
                    raise ConfigError(field, f"unknown collective '{c}' (known: {', '.join(COLL_NAMES)})", text)
        negate = part.startswith("^")
        names = [n.strip().lower() for n in part.lstrip("^").split(",") if n.strip()]
        if not names:
            raise ConfigError(field, "empty list", text)
        members = set()
        for name in names:
            if name not in table:
                raise ConfigError(field, f"unknown {'algorithm' if kind == 'algo' else 'protocol'} '{name}' "
                                         f"(known: {', '.join(table)})", text)
            members.update(table[name])
        if colls is None or op in colls:
            allowed = everything - members if negate else frozenset(members)
    return allowed
