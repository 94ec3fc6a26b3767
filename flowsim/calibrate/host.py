"""Second stage of ``flowsim calibrate``: the host-cost multiplier per host CPU family x software family.

Most training steps are GPU-bound: the CPU issues kernels ahead of the GPU and its cost is hidden, so most runs
say nothing about it. A run informs ``host_multiplier:<cpu>:<family>`` only when its simulated step moves by
more than :data:`INFORM_PCT` with its host costs at the top of the parameter's range. With the GEMM fractions
of the first stage fixed (in the profile every simulation here reads), the informed runs are tabulated over the
range (:mod:`flowsim.calibrate.response`) and fitted by the rules of :func:`flowsim.calibrate.fit.fit`: at least
:data:`~flowsim.calibrate.fit.MIN_ROWS` informed runs, the physical range, kept only if it lowers the
leave-one-source-out error of its runs. The public runs inform none with 3 runs (docs/CALIBRATION.md): every
key is reported as refused.
"""
from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from flowsim.calibrate.fit import MIN_ROWS, FitResult, Observations, fit
from flowsim.calibrate.response import ResponseTable, grid
from flowsim.calibrate.runs import job_release
from flowsim.config import SimConfig
from flowsim.kernels.calibration import PARAMETERS, Parameter, Profile, write_profile
from flowsim.kernels.stack import release

HOST = PARAMETERS["host_multiplier"]
INFORM_PCT = 0.5
"""A run informs the multiplier when its step time moves by more than this (percent) with the host costs at the
top of the range: below it the change is event-ordering noise of a GPU-bound step, not information."""


@dataclass(frozen=True)
class HostFit:
    """Outcome of :func:`fit_host`: ``result`` (the fit of the keys with enough informed runs, None when no key
    has them), ``informed`` (key -> runs that inform it, every key of the runs), ``ratio_in`` / ``ratio_loso``
    (float64[n]: each run's step time with the fitted multipliers, in-sample and leave-one-source-out, over its
    time without them; 1 for runs no kept parameter informs) and the runs' ``measured_s``."""

    result: FitResult | None
    informed: dict
    ratio_in: np.ndarray
    ratio_loso: np.ndarray
    measured_s: np.ndarray

    @property
    def refused(self) -> tuple:
        """``(key, informed runs)`` of every key informed by fewer than MIN_ROWS runs."""
        return tuple((k, n) for k, n in sorted(self.informed.items()) if n < MIN_ROWS)


def host_key(cfg: SimConfig) -> str:
    """``host_multiplier:<cpu>:<family>`` of a config; ``""`` without a known release or a host model."""
    rel = job_release(cfg)
    return f"{HOST.name}:{cfg.cluster.cpu}:{release(rel).family}" if rel and cfg.training.host_overhead != "none" \
        else ""


def fit_host(runs: Sequence, simulate: Callable, gemm: Profile, points: int) -> HostFit:
    """Fit the host multipliers the runs inform, with the first stage's GEMM fractions ``gemm`` fixed.

    Parameters
    ----------
    runs : sequence of flowsim.calibrate.Run
    simulate : callable
        ``simulate(SimConfig) -> Result``-like with ``step_time_s``.
    gemm : Profile
        The first stage's profile: its kept GEMM fractions, dropped keys and fallback (every simulation here runs
        with them).
    points : int
        Grid size over the multiplier's range (>= 3).
    """
    keys = np.array([host_key(r.config) for r in runs])
    n = len(runs)
    ones = np.ones(n)
    measured_s = np.array([r.measured_s for r in runs])
    with tempfile.TemporaryDirectory(prefix="flowsim-calibrate-host-") as tmp:
        def times(value: float, rows) -> np.ndarray:
            path = Path(tmp) / f"host{value:.6g}.yaml"
            params = gemm.parameters + tuple(Parameter(*k.split(":"), value, HOST.range, 0.0, MIN_ROWS,
                                                       "tabulation grid point", 0.0)
                                             for k in sorted(set(keys) - {""}))
            write_profile(Profile(params, "tabulation grid point", dropped=gemm.dropped, fallbacks=gemm.fallbacks),
                          path)
            out = np.full(n, np.nan)
            for i in rows:
                cfg = runs[i].config
                out[i] = simulate(dataclasses.replace(cfg, training=dataclasses.replace(
                    cfg.training, calibration=str(path)))).step_time_s
            return out

        keyed = np.flatnonzero(keys != "")
        base = times(1.0, keyed)
        top = times(HOST.range[1], keyed)
        informs = np.zeros(n, bool)
        informs[keyed] = np.abs(top[keyed] / base[keyed] - 1.0) * 100.0 > INFORM_PCT
        informed = {k: int((informs & (keys == k)).sum()) for k in sorted(set(keys) - {""})}
        if not any(c >= MIN_ROWS for c in informed.values()):
            return HostFit(None, informed, ones, ones, measured_s)
        values = grid(*HOST.range, points)
        rows = np.flatnonzero(informs)
        table = np.ones((n, values.size))
        for j, v in enumerate(values):
            table[rows, j] = times(float(v), rows)[rows] / base[rows]
    # The fit sees each informed run's step time relative to its time at multiplier 1 (the GEMM stage's); the
    # other runs carry no key and a constant response.
    obs_keys = np.where(informs, keys, "")
    relative = measured_s / np.where(informs, base, 1.0)
    result = fit(Observations(relative, np.array([r.source for r in runs]), obs_keys), ResponseTable(values, table),
                 {k: HOST.range for k in set(obs_keys) - {""}})
    return HostFit(result, informed, result.predicted_s, result.loso_predicted_s, measured_s)
