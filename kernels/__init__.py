"""Compute-time model: seconds for one kernel launch on one GPU, from a roofline calibrated on measured kernels.

Public API: :func:`op_times` prices a whole op table (schema ``OP_COLUMNS``, see :mod:`flowsim.kernels.ops`);
:func:`gemm_time`, :func:`attention_time` and :func:`memory_time` price one op; :func:`kernel_references`
reports which measured GPU stands in for a GPU without its own measurements.
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

__all__ = [
    "DTYPES",
    "KERNEL_MIN_TIME_S",
    "KINDS",
    "OP_COLUMNS",
    "Reference",
    "attention_time",
    "gemm_time",
    "kernel_references",
    "memory_time",
    "op_breakdown",
    "op_times",
]
