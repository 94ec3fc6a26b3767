"""Compute-time model: seconds for one kernel launch on one GPU, from a roofline calibrated on measured kernels.

Public API: :func:`op_times` prices a whole op table (schema ``OP_COLUMNS``, see :mod:`flowsim.kernels.ops`);
:func:`gemm_time`, :func:`attention_time` and :func:`memory_time` price one op; :func:`kernel_references`
reports which measured GPU stands in for a GPU without its own measurements; :class:`KernelStack` names the
software release, power limit and calibrated GEMM multiplier a job's ops are priced on.
"""
from flowsim.kernels.model import (
    KERNEL_MIN_TIME_S,
    attention_time,
    gemm_time,
    kernel_references,
    memory_time,
    op_breakdown,
    op_times,
)
from flowsim.kernels.ops import DTYPES, KINDS, OP_COLUMNS
from flowsim.kernels.reference import Reference
from flowsim.kernels.stack import DEFAULT_STACK, KernelStack

__all__ = [
    "DEFAULT_STACK",
    "DTYPES",
    "KERNEL_MIN_TIME_S",
    "KINDS",
    "KernelStack",
    "OP_COLUMNS",
    "Reference",
    "attention_time",
    "gemm_time",
    "kernel_references",
    "memory_time",
    "op_breakdown",
    "op_times",
]
