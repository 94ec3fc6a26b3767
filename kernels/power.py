"""Compute ceilings under a board power limit.

A large GEMM on a modern GPU runs at its power limit, not at its boost clock ("matmuls on the H100 are
primarily not compute or bandwidth limited, they are power limited": Horace He, thonking.ai, quoted in
shared/data/kernel_measurements_additions.md s3). Dynamic CMOS power is ``P = a C V^2 f``, and across the DVFS
range the voltage scales about linearly with the clock, so ``P ~ f^3`` (Hennessy and Patterson, Computer
Architecture: A Quantitative Approach, 6th ed., section 1.5, "Trends in Power and Energy"). A GPU capped at
``P_cap`` below the board power ``P_ref`` its ceiling was measured at therefore sustains

    clock_fraction = (P_cap / P_ref) ** (1 / 3)          (1 when P_cap >= P_ref)

of the measured clock, and every compute-bound rate (GEMM, attention) scales by it. Memory-bound ops keep
their bandwidth (HBM runs on its own clock). Check against the shared data: A100 PCIe (300 W) vs SXM (400 W),
same peak, MAMF 252.9 vs 271.2 TFLOP/s = 0.933 measured, (300 / 400) ** (1/3) = 0.909 by this model.
Static power is ignored (it makes the real derate somewhat deeper).
"""
from __future__ import annotations

import math

from flowsim.errors import ConfigError
from flowsim.gpu_specs import GPUSpec, get_gpu

POWER_EXPONENT = 1.0 / 3.0
"""Clock ~ power^(1/3): P ~ C V^2 f with V ~ f (module docstring)."""


def power_limit_w(gpu: GPUSpec, limit_w: float = 0.0) -> float:
    """The board power limit in force, W: ``limit_w`` when > 0, else the GPU spec's ``power_limit_w`` (NaN when
    the spec sets none: no limit below the board power).

    Raises
    ------
    ConfigError
        ``power_limit_w`` negative or not finite.
    """
    if not (isinstance(limit_w, (int, float)) and math.isfinite(limit_w) and limit_w >= 0):
        raise ConfigError("power_limit_w", "must be a number of watts >= 0 (0 = the GPU's own)", limit_w)
    return float(limit_w) if limit_w > 0 else gpu.power_limit_w


def clock_fraction(gpu: GPUSpec, measured_key: str, limit_w: float = 0.0) -> float:
    """Sustained compute clock of ``gpu`` under its power limit, as a fraction of the measured GPU's.

    Parameters
    ----------
    gpu : GPUSpec
        The GPU being priced.
    measured_key : str
        The measured GPU whose ceiling prices it (its board power ``tdp_w`` is the power the ceiling was
        measured at).
    limit_w : float
        Power limit in W; 0 = ``gpu``'s own (:func:`power_limit_w`).

    Returns
    -------
    float
        ``min(1, (P_cap / P_ref) ** (1/3))`` in (0, 1].
    """
    cap = power_limit_w(gpu, limit_w)
    ref = get_gpu(measured_key).tdp_w
    if not (cap > 0 and ref > 0) or cap >= ref:  # NaN (no limit set) compares False
        return 1.0
    return (cap / ref) ** POWER_EXPONENT
