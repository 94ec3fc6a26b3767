"""Fit global efficiency parameters to measured step times: robust least squares with leave-one-source-out checks.

Rules (docs/DEVELOPERS.md, calibration): a parameter is global (one value per GPU generation x software family,
never per row, model or source), lies inside its physical range, is fitted only when at least
:data:`MIN_ROWS` rows inform it, and stays in the result only if it lowers the leave-one-source-out error.

Model. Each row ``i`` informs at most one parameter (its key, e.g. ``gemm_fraction:hopper:megatron-core-2024``;
``""`` for none) and the caller's ``predict(values) -> seconds`` gives every row's step time when row ``i``'s
parameter takes ``values[i]`` (1 = uncalibrated). The fit minimises ``sum rho(log(predict_i / measured_i))``
over the training rows with scipy.optimize.least_squares (trust-region reflective, bounds = the ranges) and the
soft-L1 loss (each parameter separately: its rows depend on it alone) ``rho(z) = 2 f^2 (sqrt(1 + (z/f)^2) - 1)`` with ``f`` = :data:`LOSS_SCALE`: residuals beyond about
10 % count linearly, so rows the model misses for other reasons do not drag a parameter.

Errors are ``|predicted / measured - 1|`` in percent, summarised by the median: in-sample (fitted on every row),
and leave-one-source-out (each source's rows predicted by a fit on the other sources' rows; a parameter that the
other sources inform with fewer than :data:`MIN_ROWS` rows stays at 1 there). A parameter is kept only if its
rows' leave-one-source-out median |error| is lower than their uncalibrated one by more than
:data:`CV_TOLERANCE_PCT` (parameters are independent: each row depends on one, so each is judged on its rows). Uncertainty: one standard error from the Jacobian at the optimum, ``sqrt(diag(s^2 (J^T J)^-1))`` with
``s^2 = sum r^2 / (n - p)``.

Fallback. A job whose (GPU generation, software family) no kept parameter covers (a pair the runs never
informed, or informed by fewer than :data:`MIN_ROWS`) is priced by a profile's *fallback*: the mean of the kept
parameters' values. Every fraction fitted so far lies below 1 (the model leaves out costs all frameworks pay), so
with no runs of a pair their mean is a better estimate than 1, if the runs say so: leave-one-cluster-out, each
cluster's rows (a cluster = the rows of one key) predicted at the mean of the other clusters' kept values, against
uncalibrated. The fallback is kept only if it lowers that median |error| by more than
:data:`CV_TOLERANCE_PCT`. Keys fitted and dropped are not covered by it: their runs said uncalibrated is better.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from flowsim.errors import ConfigError

MIN_ROWS = 3
"""Fewest rows that must inform a parameter before it is fitted (calibration rules)."""
LOSS_SCALE = 0.1
"""Soft-L1 scale on log step time: residuals beyond about 10 % count linearly (a choice, not a fitted value)."""
CV_TOLERANCE_PCT = 0.01
"""A parameter must lower the leave-one-source-out median |error| by more than this (percentage points) to stay:
below it the difference is the optimiser's tolerance, not the parameter."""


@dataclass(frozen=True)
class Observations:
    """Measured rows to fit: ``measured_s`` (float64[n], seconds, > 0), ``source`` and ``key`` (str[n]).

    ``key`` names the parameter each row informs (``""`` for none); ``source`` groups rows for the
    leave-one-source-out check.
    """

    measured_s: np.ndarray
    source: np.ndarray
    key: np.ndarray

    def __post_init__(self):
        for name in ("measured_s", "source", "key"):
            object.__setattr__(self, name, np.asarray(getattr(self, name)))
        n = len(self.measured_s)
        if len(self.source) != n or len(self.key) != n:
            raise ConfigError("runs", "measured_s, source and key must have one entry per row",
                              f"{n}, {len(self.source)}, {len(self.key)}")
        if not (np.isfinite(self.measured_s).all() and (self.measured_s > 0).all()):
            raise ConfigError("measured_step_time_s", "must be a finite number > 0 on every row to fit")


@dataclass(frozen=True)
class FittedParameter:
    """One parameter of a fit: ``key``, ``value``, ``uncertainty`` (one standard error), ``rows`` informing it,
    ``sources`` of those rows and ``cv_error_pct`` (leave-one-source-out median |error| of its rows, %)."""

    key: str
    value: float
    uncertainty: float
    rows: int
    sources: tuple
    cv_error_pct: float


@dataclass(frozen=True)
class Fallback:
    """The value for pairs no kept parameter covers (module docstring): ``value`` (the mean of the kept values),
    ``loco_pct`` and ``loco_uncalibrated_pct`` (leave-one-cluster-out median |error| of every keyed row, %, at the
    other clusters' mean and uncalibrated) and ``kept`` (whether it lowers that error)."""

    value: float
    loco_pct: float
    loco_uncalibrated_pct: float
    kept: bool


@dataclass(frozen=True)
class FitResult:
    """Outcome of :func:`fit`.

    Attributes
    ----------
    parameters : tuple[FittedParameter, ...]
        The kept parameters.
    refused : tuple[tuple[str, int], ...]
        Keys informed by fewer than :data:`MIN_ROWS` rows, with their row count (not fitted).
    dropped : tuple[str, ...]
        Keys fitted but removed because they did not lower the leave-one-source-out error.
    uncalibrated_pct, in_sample_pct, loso_pct : float
        Median |error| (%) of every row without calibration, with the kept parameters fitted on every row, and
        leave-one-source-out with them.
    predicted_s : float64[n]
        In-sample prediction of every row with the kept parameters, seconds.
    loso_predicted_s : float64[n]
        Each row predicted by the fit without its source, seconds.
    fallback : Fallback or None
        The fallback for uncovered pairs and its leave-one-cluster-out check; None with fewer than two kept
        parameters (no cluster would have another to take a mean of).
    """

    parameters: tuple
    refused: tuple
    dropped: tuple
    uncalibrated_pct: float
    in_sample_pct: float
    loso_pct: float
    predicted_s: np.ndarray
    loso_predicted_s: np.ndarray
    fallback: Fallback | None = None

    def value(self, key: str) -> float:
        """Fitted value of ``key`` (1.0 when it is not kept)."""
        return next((p.value for p in self.parameters if p.key == key), 1.0)


def median_abs_error_pct(predicted_s, measured_s) -> float:
    """Median of ``|predicted / measured - 1|`` in percent (NaN for no rows)."""
    predicted_s, measured_s = np.asarray(predicted_s, float), np.asarray(measured_s, float)
    return float(np.median(np.abs(predicted_s / measured_s - 1.0)) * 100.0) if len(measured_s) else float("nan")


def fit(obs: Observations, predict: Callable[[np.ndarray], np.ndarray], ranges: dict,
        candidates: list | None = None) -> FitResult:
    """Fit the parameters the rows inform, keep those that lower the leave-one-source-out error.

    Parameters
    ----------
    obs : Observations
        The measured rows.
    predict : callable
        ``predict(values: float64[n]) -> float64[n]``: every row's step time (s) when row i's parameter is
        ``values[i]``.
    ranges : dict
        ``key -> (low, high)`` physical range of every key that appears in ``obs.key``.
    candidates : list of str, optional
        Keys that may be fitted (default: every key of the rows).

    Returns
    -------
    FitResult

    Raises
    ------
    ConfigError
        ``runs: too few rows to fit ...`` when no parameter is informed by :data:`MIN_ROWS` rows; a key
        without a range.
    """
    keys = sorted(set(obs.key) - {""}) if candidates is None else list(candidates)
    missing = [k for k in keys if k not in ranges]
    if missing:
        raise ConfigError("calibration", "parameter has no physical range", missing[0])
    counts = {k: int((obs.key == k).sum()) for k in keys}
    refused = tuple((k, n) for k, n in counts.items() if n < MIN_ROWS)
    active = [k for k in keys if counts[k] >= MIN_ROWS]
    if not active:
        most = max(counts.values(), default=0)
        raise ConfigError("runs", f"too few rows to fit: every parameter needs at least {MIN_ROWS} rows that "
                          f"inform it", f"at most {most} row(s) per parameter, {len(obs.measured_s)} rows")
    solver = _Solver(obs, predict, ranges)
    uncalibrated = solver.predict_with([], [])
    loso_pred = uncalibrated.copy()
    kept, dropped = [], []
    for k in active:
        rows = obs.key == k
        pred = solver.loso_one(k)
        with_k = median_abs_error_pct(pred[rows], obs.measured_s[rows])
        without = median_abs_error_pct(uncalibrated[rows], obs.measured_s[rows])
        if with_k < without - CV_TOLERANCE_PCT:
            kept.append(k)
            loso_pred[rows] = pred[rows]
        else:
            dropped.append(k)
    values, unc = solver.fit(kept, np.ones(len(obs.measured_s), bool))
    predicted = solver.predict_with(kept, values)
    params = []
    for k, v, u in zip(kept, values, unc):
        rows = obs.key == k
        params.append(FittedParameter(k, float(v), float(u), int(rows.sum()), tuple(sorted(set(obs.source[rows]))),
                                      median_abs_error_pct(loso_pred[rows], obs.measured_s[rows])))
    return FitResult(
        parameters=tuple(params), refused=refused, dropped=tuple(dropped),
        uncalibrated_pct=median_abs_error_pct(uncalibrated, obs.measured_s),
        in_sample_pct=median_abs_error_pct(predicted, obs.measured_s),
        loso_pct=median_abs_error_pct(loso_pred, obs.measured_s),
        predicted_s=predicted, loso_predicted_s=loso_pred,
        fallback=_fallback(solver, dict(zip(kept, values)), uncalibrated))


def _fallback(solver: _Solver, kept: dict, uncalibrated: np.ndarray) -> Fallback | None:
    """The mean of the kept values, checked leave-one-cluster-out (module docstring)."""
    if len(kept) < 2:
        return None
    obs = solver.obs
    keyed = obs.key != ""
    loco = uncalibrated.copy()
    for k in sorted(set(obs.key[keyed])):
        rows = obs.key == k
        others = [v for key, v in kept.items() if key != k]
        loco[rows] = solver.predict_with([k], [float(np.mean(others))])[rows]
    with_it = median_abs_error_pct(loco[keyed], obs.measured_s[keyed])
    without = median_abs_error_pct(uncalibrated[keyed], obs.measured_s[keyed])
    return Fallback(float(np.mean(list(kept.values()))), with_it, without, with_it < without - CV_TOLERANCE_PCT)


class _Solver:
    """Least-squares fits of subsets of keys on subsets of rows (module docstring)."""

    def __init__(self, obs: Observations, predict, ranges):
        self.obs, self.predict, self.ranges = obs, predict, ranges
        self.log_measured = np.log(obs.measured_s)

    def _values(self, keys, x):
        v = np.ones(len(self.obs.key))
        for k, xv in zip(keys, x):
            v[self.obs.key == k] = xv
        return v

    def predict_with(self, keys, x) -> np.ndarray:
        return np.asarray(self.predict(self._values(keys, x)), dtype=float)

    def fit(self, keys, train):
        """Values and standard errors of ``keys`` fitted on the rows ``train`` (bool mask), one key at a time."""
        values, errors = np.ones(len(keys)), np.zeros(len(keys))
        for j, k in enumerate(keys):
            values[j], errors[j] = self._fit_one(k, train & (self.obs.key == k))
        return values, errors

    def _fit_one(self, key, rows):
        from scipy.optimize import least_squares

        lo, hi = self.ranges[key]

        def residual(x):
            return (np.log(self.predict_with([key], x)) - self.log_measured)[rows]

        res = least_squares(residual, [min(max(1.0, lo), hi)], bounds=([lo], [hi]), loss="soft_l1",
                            f_scale=LOSS_SCALE, diff_step=1e-4)
        r = residual(res.x)
        s2 = float(r @ r) / max(int(rows.sum()) - 1, 1)
        jtj = float(res.jac[:, 0] @ res.jac[:, 0])
        return float(res.x[0]), (s2 / jtj) ** 0.5 if jtj > 0 else float("inf")

    def loso_one(self, key) -> np.ndarray:
        """Predictions of every row of ``key``, each source's rows from a fit on the other sources' rows (1 where
        those inform it with fewer than :data:`MIN_ROWS` rows); other rows uncalibrated."""
        obs = self.obs
        rows = obs.key == key
        pred = self.predict_with([], [])
        for src in np.unique(obs.source[rows]):
            held = rows & (obs.source == src)
            train = rows & ~held
            x = self._fit_one(key, train)[0] if int(train.sum()) >= MIN_ROWS else 1.0
            pred[held] = self.predict_with([key], [x])[held]
        return pred
