"""The space of parallel layouts of one job, enumerated and pruned by the config rules.

A *layout* is everything :func:`flowsim.build_config` takes about how a job is split and stepped:
tensor, pipeline, virtual-pipeline, context and (derived) data parallelism, sequence parallelism,
micro-batch size, activation recompute, optimizer-state sharding (ZeRO stage; stage 1 is Megatron-LM's
distributed optimizer) and pipeline schedule. :func:`enumerate_layouts` walks the Cartesian product of
the :class:`LayoutSpace` dimensions and splits it into configs that pass every rule and the candidates
that break one, counted by the rule (the ``field`` of the :class:`~flowsim.ConfigError` the config
loader raises).

Pruning is hierarchical. Each *skeleton* (tp, pp, vpp, cp, ep, sp) is built by
:func:`flowsim.build_config` itself; each micro-batch size and schedule is then checked with
:meth:`SimConfig.validate` (the rules ``build_config`` applies); the remaining dimensions (recompute,
ZeRO stage), which no rule ties to other fields, are filled in with :func:`dataclasses.replace`. A
skeleton that breaks a rule breaks it for every micro-batch size, schedule, recompute and ZeRO stage (the
rules on those are monotone: ``gbs % (mbs * dp)`` fails for every multiple of a failing ``dp``), so its
whole subtree is counted under that rule without building it; ``tests/test_tune.py`` checks the counts
against building every candidate. Memory is checked later, per config, by
:func:`flowsim.explore.point.peak_memory_bytes`.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from dataclasses import dataclass
from typing import Iterator, Mapping

from flowsim.config import SimConfig, build_config
from flowsim.config.training import RECOMPUTE
from flowsim.errors import ConfigError

ZERO_STAGES = (0, 1, 2, 3)
REDUNDANT = "redundant"
"""Pruning reason: zero_stage >= 1 with dp * cp = 1 shards nothing and equals zero_stage 0."""
MEMORY = "memory"
"""Pruning reason: the most loaded GPU needs more memory than it has."""


def layout_overrides(tp: int, pp: int, vpp: int, cp: int, ep: int, dp: int, sp: bool, mbs: int, recompute: str,
                     zero: int, schedule: str) -> dict:
    """The :func:`flowsim.build_config` keys of a layout (the :class:`Layout` fields; ``dp`` 0 = derive it).

    ZeRO stage 1 is expressed as Megatron-LM's ``use_distributed_optimizer``, other stages as ``zero_stage``.
    """
    return dict(tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, dp=dp, sp=sp, mbs=mbs, recompute=recompute,
                use_distributed_optimizer=zero == 1, zero_stage=zero if zero != 1 else 0, schedule=schedule)


@dataclass(frozen=True)
class Layout:
    """One parallel layout (the tunable part of a config).

    Attributes
    ----------
    tp, pp, vpp, cp, ep, dp : int
        Tensor, pipeline, virtual-pipeline (chunks per rank), context, expert and data parallel sizes.
    sp : bool
        Sequence parallelism.
    mbs : int
        Micro-batch size, sequences.
    recompute : str
        ``none``, ``selective`` or ``full``.
    zero : int
        Optimizer-state sharding: 0 none, 1 distributed optimizer (ZeRO-1), 2 also gradients, 3 FSDP.
    schedule : str
        Resolved pipeline schedule (``1f1b``, ``gpipe``, ``interleaved``).
    """

    tp: int
    pp: int
    vpp: int
    cp: int
    ep: int
    dp: int
    sp: bool
    mbs: int
    recompute: str
    zero: int
    schedule: str

    @classmethod
    def of(cls, cfg: SimConfig) -> "Layout":
        """The layout of the built config ``cfg``."""
        t = cfg.training
        zero = max(t.zero_stage, 1 if t.use_distributed_optimizer else 0)
        return cls(tp=t.tp, pp=t.pp, vpp=t.vpp, cp=t.cp, ep=t.ep, dp=t.dp, sp=t.sequence_parallel,
                   mbs=t.micro_batch_size, recompute=t.recompute_granularity, zero=zero, schedule=t.schedule)

    def to_dict(self) -> dict:
        """Plain mapping of the fields (atoms: ``dataclasses.asdict`` without its deep copy)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def overrides(self) -> dict:
        """Config keys (aliases accepted by :func:`flowsim.build_config`) that select this layout."""
        return layout_overrides(**self.to_dict())

    def label(self) -> str:
        """Compact one-line description, e.g. ``tp8 pp8 vpp1 cp1 dp16 sp mbs1 none z1 1f1b``."""
        return (f"tp{self.tp} pp{self.pp} vpp{self.vpp} cp{self.cp} {f'ep{self.ep} ' if self.ep > 1 else ''}"
                f"dp{self.dp} {'sp' if self.sp else 'nosp'} "
                f"mbs{self.mbs} {self.recompute} z{self.zero} {self.schedule}")


def _powers_of_two(limit: int) -> tuple:
    return tuple(2 ** i for i in range(limit.bit_length()) if 2 ** i <= limit)


def _divisors(n: int, limit: int) -> tuple:
    return tuple(d for d in range(1, min(n, limit) + 1) if n % d == 0)


def _check_dim(name: str, values, allowed=None) -> tuple:
    values = tuple(values)
    if not values:
        raise ConfigError(name, "needs at least one value", "[]")
    for v in values:
        if allowed is not None:
            if v not in allowed:
                raise ConfigError(name, f"values must be among {', '.join(map(str, allowed))}", v)
        elif not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(name, "values must be positive integers", v)
    return tuple(sorted(set(values), key=values.index))


@dataclass(frozen=True)
class LayoutSpace:
    """The values each layout dimension may take (the Cartesian product is searched).

    Attributes
    ----------
    tp, pp, vpp, cp, ep, mbs : tuple[int, ...]
        Candidate sizes. ``dp`` follows from the GPU count.
    sp : tuple[bool, ...]
        Sequence parallelism off / on (only ``False`` is tried with tp = 1).
    recompute : tuple[str, ...]
        Recompute granularities.
    zero : tuple[int, ...]
        ZeRO stages (1 = distributed optimizer).
    schedules : tuple[str, ...]
        Schedules tried with vpp = 1 and pp > 1 (``1f1b``, ``gpipe``); vpp > 1 always runs ``interleaved``
        and pp = 1 has no schedule to choose.
    """

    tp: tuple
    pp: tuple
    vpp: tuple
    cp: tuple
    mbs: tuple
    ep: tuple = (1,)
    sp: tuple = (False, True)
    recompute: tuple = RECOMPUTE
    zero: tuple = ZERO_STAGES
    schedules: tuple = ("1f1b", "gpipe")

    @classmethod
    def default(cls, base: SimConfig, *, max_tp: int = 0, max_pp: int = 0, max_vpp: int = 8, max_cp: int = 8,
                max_ep: int = 0, max_mbs: int = 8, **fixed) -> "LayoutSpace":
        """The space ``flowsim tune`` searches for ``base``'s model and cluster.

        tp: powers of two up to ``max_tp`` (default: the NVLink domain); pp: divisors of the GPU count up
        to ``max_pp`` (default: the layer count); vpp 1..``max_vpp``; cp: powers of two up to ``max_cp``;
        ep: 1 for dense models, else powers of two up to ``max_ep`` (default: the expert count);
        mbs 1..``max_mbs``. ``fixed`` replaces any dimension by the given values (e.g. ``tp=(8,)``).
        """
        c, m = base.cluster, base.model
        for name, v in (("max_tp", max_tp), ("max_pp", max_pp), ("max_vpp", max_vpp), ("max_cp", max_cp),
                        ("max_ep", max_ep), ("max_mbs", max_mbs)):
            if not isinstance(v, int) or v < 0:
                raise ConfigError(name, "must be a non-negative integer", v)
        space = dict(tp=_powers_of_two(max_tp or c.nvlink_domain),
                     pp=_divisors(c.num_gpus, max_pp or m.num_layers),
                     vpp=tuple(range(1, max(max_vpp, 1) + 1)),
                     cp=_powers_of_two(max(max_cp, 1)),
                     ep=_powers_of_two(max_ep or m.num_moe_experts) if m.num_moe_experts else (1,),
                     mbs=tuple(range(1, max(max_mbs, 1) + 1)))
        unknown = set(fixed) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ConfigError(sorted(unknown)[0], "is not a layout dimension (tp, pp, vpp, cp, ep, mbs, sp, "
                              "recompute, zero, schedules)")
        space.update({k: tuple(v) if isinstance(v, (list, tuple)) else (v,) for k, v in fixed.items()})
        return cls(**space).checked()

    def checked(self) -> "LayoutSpace":
        """Return self after checking every dimension (raises ConfigError naming the first bad one)."""
        for name in ("tp", "pp", "vpp", "cp", "ep", "mbs"):
            _check_dim(name, getattr(self, name))
        _check_dim("sp", self.sp, (False, True))
        _check_dim("recompute", self.recompute, RECOMPUTE)
        _check_dim("zero", self.zero, ZERO_STAGES)
        _check_dim("schedules", self.schedules, ("1f1b", "gpipe"))
        return self

    def to_dict(self) -> dict:
        """Plain mapping of the dimensions (lists)."""
        return {k: list(v) for k, v in dataclasses.asdict(self).items()}


@dataclass(frozen=True)
class Enumeration:
    """The result of :func:`enumerate_layouts`.

    Attributes
    ----------
    configs : tuple[SimConfig, ...]
        Every config that passes all rules, in enumeration order.
    candidates : int
        Size of the Cartesian product searched.
    pruned : dict[str, int]
        Candidates rejected, by the config field whose rule they break (or :data:`REDUNDANT`).
    """

    configs: tuple
    candidates: int
    pruned: dict


def schedules_for(space: LayoutSpace, pp: int, vpp: int) -> tuple:
    """The schedules ``space`` tries for a layout with ``pp`` stages of ``vpp`` chunks."""
    if pp == 1:
        return ("1f1b",)
    return ("interleaved",) if vpp > 1 else space.schedules


def enumerate_layouts(base: Mapping, space: LayoutSpace) -> Enumeration:
    """Every rule-abiding config of ``space`` for the job ``base`` (a build_config mapping).

    ``base`` names the model, cluster, GPU count, global batch and sequence length; its own layout keys
    are replaced by the space's. Returns the configs and the count of candidates pruned per rule.
    """
    pruned: Counter = Counter()
    configs: list = []
    total = 0
    n_leaf = len(space.recompute) * len(space.zero)
    # one model and one cluster object for all configs (by repr: 400 and 400.0 stay apart): the caches keyed by
    # object (the store key's section JSON) hit, and a batch pickles each once
    sections: dict = {}
    for tp, pp, vpp, cp, ep, sp in itertools.product(space.tp, space.pp, space.vpp, space.cp, space.ep, space.sp):
        if sp and tp == 1:
            continue  # sequence parallelism is a TP mode: (tp=1, sp) is not a candidate
        scheds = schedules_for(space, pp, vpp)
        subtree = len(space.mbs) * len(scheds) * n_leaf
        total += subtree
        try:
            skel = build_config(base, **layout_overrides(tp, pp, vpp, cp, ep, dp=0, sp=sp, mbs=1, recompute="none",
                                                         zero=0, schedule=scheds[0]))
        except ConfigError as e:
            pruned[e.field] += subtree
            continue
        skel = dataclasses.replace(skel, model=sections.setdefault(repr(skel.model), skel.model),
                                   cluster=sections.setdefault(repr(skel.cluster), skel.cluster))
        configs.extend(_expand(skel, space, scheds, pruned))
    return Enumeration(configs=tuple(configs), candidates=total, pruned=dict(pruned))


def replaced(obj, **changes):
    """``dataclasses.replace(obj, **changes)`` for a frozen dataclass without ``__post_init__`` or cached
    attributes (SimConfig, TrainingConfig), by copying its instance dict: several times cheaper than ``replace``
    (which reads every field and calls ``__init__``), and the enumeration makes two per config."""
    cls = type(obj)
    if hasattr(cls, "__post_init__") or not changes.keys() <= obj.__dict__.keys():
        return dataclasses.replace(obj, **changes)
    new = object.__new__(cls)
    new.__dict__.update(obj.__dict__)
    new.__dict__.update(changes)
    return new


def _expand(skel: SimConfig, space: LayoutSpace, scheds: tuple, pruned: Counter) -> Iterator[SimConfig]:
    n_leaf = len(space.recompute) * len(space.zero)
    t0 = skel.training
    for mbs, sched in itertools.product(space.mbs, scheds):
        cfg = replaced(skel, training=replaced(t0, micro_batch_size=mbs, pipeline_schedule=sched))
        try:
            cfg.validate()
        except ConfigError as e:
            pruned[e.field] += n_leaf
            continue
        for rec, zero in itertools.product(space.recompute, space.zero):
            if zero and t0.dp * t0.cp == 1:
                pruned[REDUNDANT] += 1
                continue
            t = replaced(cfg.training, recompute_granularity=rec, use_distributed_optimizer=zero == 1,
                         zero_stage=zero if zero != 1 else 0)
            yield replaced(cfg, training=t)
