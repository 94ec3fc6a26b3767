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

from flowsim.nccl_models import CollectiveEstimate, predict
from flowsim.network.comm_layout import group_layout

Span = tuple
"""``(n_ranks, stride, first_rank)`` of a communicator (module docstring)."""

_group_layout = functools.lru_cache(maxsize=4096)(group_layout)
_predict = functools.lru_cache(maxsize=65536)(predict)


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
            est = _predict(op, float(size_bytes), _group_layout(self.cluster, self.gpu, n, stride, first_rank=first))
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
