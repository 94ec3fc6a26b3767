"""Unit conventions for flowsim, in one place.

Inside flowsim every quantity is in SI base units: seconds, bytes, bytes/s, FLOP and FLOP/s.
Conversions happen only at the edges (data files, CLI display) and only through the names below.

Decimal and binary prefixes are kept apart on purpose: a "GB" is 1e9 bytes and a "GiB" is 2**30 bytes.
Network line rates are quoted in Gb/s (1e9 bits per second); ``gbps_to_Bps`` converts them.
"""

KB = 1e3
MB = 1e6
GB = 1e9
TB = 1e12
KiB = 2**10
MiB = 2**20
GiB = 2**30

US = 1e-6  # one microsecond in seconds
MS = 1e-3  # one millisecond in seconds

TFLOP = 1e12
PFLOP = 1e15

BITS_PER_BYTE = 8


def gbps_to_Bps(gbps: float) -> float:
    """Convert a line rate in Gb/s (1e9 bit/s) to bytes per second."""
    return gbps * 1e9 / BITS_PER_BYTE


def GBps_to_Bps(gbytes_per_s: float) -> float:
    """Convert GB/s (1e9 bytes per second) to bytes per second."""
    return gbytes_per_s * GB


def tflops_to_flops(tflops: float) -> float:
    """Convert TFLOP/s (1e12 FLOP/s) to FLOP/s."""
    return tflops * TFLOP


DTYPE_BYTES = {"fp64": 8, "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "fp4": 0.5,
               # block-scaled FP4 with its scales: NVFP4 = E2M1 + one E4M3 scale per 16 elements (NVIDIA Blackwell
               # docs, "NVFP4"), MXFP4 = E2M1 + one E8M0 scale per 32 (OCP Microscaling Formats spec v1.0)
               "nvfp4": 0.5 + 1 / 16, "mxfp4": 0.5 + 1 / 32}
"""Storage size of one element of each dtype, in bytes (block-scaled formats include their scales)."""
