"""Tabulated step-time responses: each row simulated at a few parameter values, interpolated in between.

A full simulation per least-squares evaluation would cost seconds per call; each row's step time depends on
one parameter (its GPU generation x software family GEMM fraction), so the rows are simulated once at every
value of a grid spanning the parameter's range and the fit interpolates ``log(time)`` linearly in
``log(value)`` between grid points (exact at the grid points; step time is a smooth, monotone function of the
GEMM rate).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flowsim.errors import ConfigError


def grid(low: float, high: float, points: int) -> np.ndarray:
    """``points`` values geometrically spaced over [low, high] with 1.0 included (the uncalibrated point).

    Raises
    ------
    ConfigError
        ``grid``: fewer than 3 points, or a range that does not hold 1.
    """
    if points < 3:
        raise ConfigError("grid", "needs at least 3 points", points)
    if not low < 1.0 < high:
        raise ConfigError("grid", "the range must hold 1 (the uncalibrated value)", f"[{low}, {high}]")
    g = np.unique(np.concatenate([np.geomspace(low, high, points - 1), [1.0]]))
    return g


@dataclass(frozen=True)
class ResponseTable:
    """Step time of every row at every grid value: ``values`` float64[g] (ascending), ``times_s`` float64[n, g].

    Calling it with per-row parameter values returns per-row seconds (interpolation in the module docstring;
    values outside the grid take the nearest end).
    """

    values: np.ndarray
    times_s: np.ndarray

    def __post_init__(self):
        v, t = np.asarray(self.values, float), np.asarray(self.times_s, float)
        if v.ndim != 1 or t.ndim != 2 or t.shape[1] != v.size or np.any(np.diff(v) <= 0):
            raise ConfigError("responses", "need ascending values[g] and times_s[n, g]", f"{v.shape}, {t.shape}")
        if not (np.isfinite(t).all() and (t > 0).all()):
            raise ConfigError("responses", "every tabulated step time must be a finite number > 0")
        object.__setattr__(self, "values", v)
        object.__setattr__(self, "times_s", t)
        object.__setattr__(self, "_log_v", np.log(v))
        object.__setattr__(self, "_log_t", np.log(t))

    def __call__(self, values) -> np.ndarray:
        x = np.clip(np.log(np.asarray(values, float)), self._log_v[0], self._log_v[-1])
        hi = np.clip(np.searchsorted(self._log_v, x), 1, self._log_v.size - 1)
        lo = hi - 1
        w = (x - self._log_v[lo]) / (self._log_v[hi] - self._log_v[lo])
        rows = np.arange(self._log_t.shape[0])
        return np.exp(self._log_t[rows, lo] * (1 - w) + self._log_t[rows, hi] * w)
