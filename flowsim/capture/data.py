"""The captured workload: one op list per pipeline stage (one captured rank each), and their merge."""
from __future__ import annotations

import dataclasses

from flowsim.errors import ConfigError


@dataclasses.dataclass
class Stage:
    """The ops one captured rank issues in one training step, in issue order.

    Attributes
    ----------
    rank : int
        The captured global rank.
    ops : list of dict
        One dict per op. Compute rows: ``type="compute"``, ``name`` (aten op) and the op-table columns of
        :data:`flowsim.kernels.OP_COLUMNS` that apply (``kind``, ``dtype``, shape, ``flops`` in FLOP,
        ``bytes``). Collective rows: ``type="comm"``, ``name``, ``op`` (nccl-tests name), ``size_bytes``
        (nccl-tests convention), ``dtype``, ``group`` (key of the workload's ``groups``), ``blocking``,
        ``wait`` (index of the op before which an asynchronous collective must have finished; None = end
        of the step), for prefetched collectives ``issue`` (index of the op from whose start it may run),
        and for point-to-point rows ``peer`` (the other global rank). Rows issued by the autograd engine
        (backward pass) carry ``backward: True``.
    """

    rank: int
    ops: list


@dataclasses.dataclass
class CapturedWorkload:
    """A captured training step: one :class:`Stage` per pipeline stage, in stage order.

    Attributes
    ----------
    world_size : int
        Ranks of the captured job.
    stages : list of Stage
        One captured rank per pipeline stage (one entry for a job without pipeline parallelism).
    groups : dict of str to list of int
        Global ranks of every process group used.
    unknown_ops : list of str
        Ops the recorder does not know, kept as memory-bound rows.
    label : str
        Free text (the example or script captured).
    """

    world_size: int
    stages: list
    groups: dict
    unknown_ops: list = dataclasses.field(default_factory=list)
    label: str = ""

    @property
    def rank(self) -> int:
        """The captured rank of the first stage (the only one without pipeline parallelism)."""
        return self.stages[0].rank

    @property
    def ops(self) -> list:
        """The ops of the first stage (the only one without pipeline parallelism)."""
        return self.stages[0].ops

    def comms(self, stage: int = 0) -> list:
        """The collective rows of stage ``stage``, in issue order."""
        return [o for o in self.stages[stage].ops if o["type"] == "comm"]

    def compute(self, stage: int = 0) -> list:
        """The compute rows of stage ``stage``, in issue order."""
        return [o for o in self.stages[stage].ops if o["type"] == "compute"]


def merge_stages(workloads: list, label: str = "") -> CapturedWorkload:
    """One pipeline workload from single-stage captures of the same job, given in stage order.

    Group names are renumbered over the union of the captures' groups (equal rank lists share a name).

    Raises
    ------
    ConfigError
        No captures, captures of different world sizes, a multi-stage capture, or a rank captured twice.
    """
    if not workloads:
        raise ConfigError("stages", "need at least one captured rank", 0)
    ws = workloads[0].world_size
    for i, w in enumerate(workloads):
        if w.world_size != ws:
            raise ConfigError(f"stages[{i}].world_size", f"must equal the first capture's ({ws})", w.world_size)
        if len(w.stages) != 1:
            raise ConfigError(f"stages[{i}]", "must be a single-stage capture", f"{len(w.stages)} stages")
    ranks = [w.rank for w in workloads]
    if len(set(ranks)) != len(ranks):
        raise ConfigError("stages", "must capture distinct ranks", ranks)
    groups, by_ranks, stages = {}, {}, []
    for w in workloads:
        rename = {}
        for key, members in w.groups.items():
            new = by_ranks.setdefault(tuple(members), f"g{len(by_ranks)}")
            groups[new] = list(members)
            rename[key] = new
        ops = [dict(o, group=rename[o["group"]]) if o["type"] == "comm" else o for o in w.ops]
        stages.append(Stage(rank=w.rank, ops=ops))
    unknown = sorted({name for w in workloads for name in w.unknown_ops})
    return CapturedWorkload(world_size=ws, stages=stages, groups=groups, unknown_ops=unknown, label=label)
