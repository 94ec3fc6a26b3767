"""The one rule for compute that shares a GPU's SMs with a communication kernel.

A collective kernel holds ``n_ctas`` of the GPU's ``sm_count`` SMs while it runs (one CTA per NCCL channel), so
compute beside it progresses at ``r = 1 - n_ctas / sm_count`` of its full speed; once the communication ends the
compute runs at full speed again. Memory-bandwidth sharing is not modelled. Every place in the step core that
overlaps compute with communication (TP/CP overlap in a block, ZeRO-3/FSDP per-layer collectives, the
data-parallel reduction beside the backward pass, DualPipe's paired passes, the two-stream timeline of captured
workloads) prices it with :func:`slowed_end_s` or its two wrappers here.
"""
from __future__ import annotations

from flowsim._jit import njit


@njit(cache=True)
def slowed_end_s(start_s, work_s, comm_end_s, share):
    """End of a compute kernel of ``work_s`` full-speed seconds started at ``start_s``, seconds, while
    communication holding ``share`` (0..1) of the SMs runs until ``comm_end_s``.

    Notes
    -----
    With ``r = 1 - share``: if the slowed kernel ends before the communication, ``start + work / r``; else it
    ran ``(comm_end - start) * r`` full-speed seconds' worth beside it and finishes the rest alone:
    ``start + work + (comm_end - start) * (1 - r)``. A communication kernel holding every SM (``r = 0``) runs
    first: ``comm_end + work``.
    """
    if comm_end_s <= start_s or share <= 0.0:
        return start_s + work_s
    r = max(1.0 - share, 0.0)
    if r == 0.0:
        return comm_end_s + work_s
    if (comm_end_s - start_s) * r >= work_s:
        return start_s + work_s / r
    return start_s + work_s + (comm_end_s - start_s) * (1.0 - r)


@njit(cache=True)
def shared_sm_time_s(compute_s, comm_s, share):
    """Wall time of compute and a communication kernel that start together on one GPU, seconds: the later of
    the slowed compute's end (:func:`slowed_end_s`) and the communication's end (``comm_s``)."""
    return max(slowed_end_s(0.0, compute_s, comm_s, share), comm_s)


def overlapped_s(compute_s: float, comm_s: float, comm_sms: int, sm_count: int) -> float:
    """Wall time of compute and a communication kernel that start together on one GPU, seconds.

    While the communication runs it holds ``comm_sms`` of the ``sm_count`` SMs, so compute progresses at
    ``r = 1 - comm_sms / sm_count`` of its speed: if the communication outlasts the slowed compute the pair
    takes ``comm_s``, else ``compute_s + comm_s * (1 - r)``. Memory-bandwidth sharing is not modelled.
    """
    return float(shared_sm_time_s(compute_s, comm_s, comm_sms / sm_count))
