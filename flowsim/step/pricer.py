"""The one collective pricer of the step core.

Every collective a step runs (a parametric workload's, a captured workload's, a SimAI/AICB workload's, a
profiler trace's) is priced here: NCCL's model (:func:`flowsim.nccl_models.predict`) on the communicator its
ranks form on the cluster (:func:`flowsim.network.comm_layout.group_layout`), or, where the caller passes an
``override`` (the flow engine of :mod:`flowsim.step.flows`), the time that override gives with NCCL's algorithm
choice kept for the report. Identical calls are priced once: per pricer, and across pricers through the
module's layout and estimate caches (their inputs are frozen dataclasses), so a sweep over many configurations
reuses them. The pricer also tallies the calls of a step per label, for the report of which NCCL algorithm and
protocol ran how often.

A communicator is named by its *span* ``(n_ranks, stride, first_rank)``: the global ranks
``first_rank + k * stride``, ``k < n_ranks``. Parametric jobs name their groups (``tp``, ``dp``, ...; Megatron
rank order, :func:`flowsim.config.layout.group_spans`) and use :meth:`CollectivePricer.time`; the others give
spans directly to :meth:`CollectivePricer.price`.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Hashable, Mapping

from flowsim.nccl_models import CollectiveEstimate, CommLayout, predict
from flowsim.network.comm_layout import group_layout

Span = tuple
"""``(n_ranks, stride, first_rank)`` of a communicator (module docstring)."""

_LAYOUT_FIELDS = tuple(f.name for f in dataclasses.fields(CommLayout))
_NIC_FIELDS = frozenset(("nics_per_node", "nic_Bps"))


class LayoutKey:
    """A communicator's layout as NCCL's model reads it: the key of the caches of its estimates, equal for two
    layouts whose estimates are equal.

    NCCL's model reads the NIC fields of a layout (``nic_Bps``, ``nics_per_node``) only for a communicator over
    several nodes (scale-up domains): each read sits behind an ``n_nodes`` test (``nccl_models/graph.py``
    ``_ring_search`` and the NVLS graph of ``graphs_of``, ``execution.py`` ``network_bound``, ``rank_orders.py``,
    ``p2p.py``; tests/test_block_cache.py checks every op on one-domain layouts). So a one-domain layout's key
    leaves them out, and the configs that differ only in their NIC rate (a runs file's copies of a job, a NIC
    study) share the estimates of their groups inside a domain. The layout itself is kept whole: it is what is
    priced."""

    __slots__ = ("layout", "_read", "_hash")

    def __init__(self, layout: CommLayout):
        self.layout = layout
        skip = _NIC_FIELDS if layout.n_nodes == 1 else ()
        self._read = tuple(None if f in skip else getattr(layout, f) for f in _LAYOUT_FIELDS)
        self._hash = hash(self._read)

    def __eq__(self, other) -> bool:
        return type(other) is LayoutKey and self._read == other._read

    def __hash__(self) -> int:
        return self._hash


@functools.lru_cache(maxsize=4096)
def _layout_key(cluster, gpu, n_ranks: int, stride: int, first_rank: int) -> LayoutKey:
    """The :class:`LayoutKey` of the communicator ``first_rank + k * stride`` on ``cluster``."""
    return LayoutKey(group_layout(cluster, gpu, n_ranks, stride, first_rank=first_rank))


@functools.lru_cache(maxsize=65536)
def _predict(op: str, size_bytes: float, key: LayoutKey) -> CollectiveEstimate:
    """NCCL's estimate of one call on the layout of ``key`` (one per op, size and key)."""
    return predict(op, size_bytes, key.layout)


class CollectivePricer:
    """Seconds of the collectives of one step on one cluster, each distinct call priced once.

    Parameters
    ----------
    cluster : ClusterConfig
        The cluster the ranks run on.
    gpu : GPUSpec
        Its GPU.
    groups : mapping of str to (int, int), optional
        Named communicators of a parametric job: ``name -> (n_ranks, stride)``, first rank 0.
    override : callable, optional
        ``override(group, op, size_bytes) -> seconds or None``: a time that replaces NCCL's model for a named
        group (the flow engine); None keeps the model's.
    comm_sms : int, optional
        SMs a collective holds while it runs, when the user fixed it (``overlap_comm_sms``); 0 = NCCL's CTAs.

    Attributes
    ----------
    groups : dict
        The named communicators.
    calls : dict
        ``(label, op, size_bytes) -> (CollectiveEstimate, calls per step)`` of everything priced with a count.
    """

    def __init__(self, cluster, gpu, groups: Mapping[str, tuple] | None = None, *,
                 override: Callable[[str, str, float], float | None] | None = None, comm_sms: int = 0):
        self.cluster, self.gpu = cluster, gpu
        self.groups = dict(groups or {})
        self.calls: dict = {}
        self._override, self._comm_sms = override, comm_sms
        self._ests: dict = {}

    def span(self, group: str) -> Span:
        """The span of a named group."""
        n, stride = self.groups[group]
        return (n, stride, 0)

    def layout_key(self, group: str) -> LayoutKey | None:
        """What the estimates of calls on a named group read of the cluster and GPU (:class:`LayoutKey`); None
        for a single rank, on which nothing is priced."""
        n, stride, first = self.span(group)
        return _layout_key(self.cluster, self.gpu, n, stride, first) if n > 1 else None

    def estimate(self, op: str, size_bytes: float, span: Span, group: str | None = None
                 ) -> CollectiveEstimate | None:
        """NCCL's estimate of one call (None when nothing moves: one rank or no bytes); ``group`` names the
        communicator for the override."""
        n, stride, first = span
        if n <= 1 or size_bytes <= 0:
            return None
        key = (op, float(size_bytes), span, group if self._override else None)
        est = self._ests.get(key)
        if est is None:
            est = _predict(op, float(size_bytes), _layout_key(self.cluster, self.gpu, n, stride, first))
            replaced = self._override(group, op, size_bytes) if self._override and group else None
            if replaced is not None:
                est = dataclasses.replace(est, time_s=replaced)
            self._ests[key] = est
        return est

    def price(self, op: str, size_bytes: float, span: Span, label: Hashable, calls: int = 1,
              group: str | None = None) -> CollectiveEstimate | None:
        """Estimate one call and count ``calls`` of it per step under ``label``."""
        est = self.estimate(op, size_bytes, span, group)
        if est is not None:
            key = (label, op, float(size_bytes))
            prev = self.calls.get(key)
            self.calls[key] = (est, (prev[1] if prev else 0) + calls)
        return est

    def recount(self, calls, times: int) -> None:
        """Count calls on named groups already estimated, as :meth:`time` counts them: ``calls`` of ``((group, op,
        size_bytes), estimate, calls)``, each counted ``calls * times`` times per step (a cached block's
        collectives); their estimates are kept as :meth:`estimate` keeps its own."""
        for key, est, n in calls:
            prev = self.calls.get(key)
            self.calls[key] = (est, (prev[1] if prev else 0) + n * times)
            group, op, size = key
            self._ests.setdefault((op, size, self.span(group), group if self._override else None), est)

    def time(self, group: str, op: str, size_bytes: float, count_per_step: int = 0) -> float:
        """Seconds of one call on a named group, counted ``count_per_step`` times for the report."""
        if group not in self.groups:
            raise KeyError(f"unknown communicator {group!r}")
        est = self.price(op, size_bytes, self.span(group), group, count_per_step, group)
        return 0.0 if est is None else est.time_s

    def estimate_of(self, group: str, op: str, size_bytes: float) -> CollectiveEstimate | None:
        """The estimate of a call on a named group (None for a single rank or no bytes), without counting it."""
        return self.estimate(op, size_bytes, self.span(group), group)

    def ctas(self, group: str, op: str, size_bytes: float) -> int:
        """SMs a call on a named group holds while it runs: ``comm_sms`` when set (at most the GPU's), else one
        CTA per NCCL channel (0 when nothing moves)."""
        if self._comm_sms:
            return min(self._comm_sms, self.gpu.sm_count)
        est = self.estimate_of(group, op, size_bytes)
        return est.n_ctas if est is not None else 0
