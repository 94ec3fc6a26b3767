"""The transfer use case: fit on k measured runs of one cluster, predict that cluster's other runs.

A cluster is a (source, parameter key) group: one publisher's runs on one GPU generation and software family.
For each group with more than ``k`` runs, ``k`` runs spread over its step-time range (every ``n / k``-th in order
of measured step time) are fitted, with the rules of :mod:`flowsim.calibrate.fit` (fewer than 3 runs refit
nothing), and the others are predicted; ``k = 0`` is the uncalibrated model. Errors are per source, over the
predicted runs of its groups.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flowsim.calibrate.fit import MIN_ROWS, Observations, _Solver, median_abs_error_pct


@dataclass(frozen=True)
class TransferError:
    """Median |error| (%) of a source's predicted runs after fitting ``k`` runs per cluster: ``source``, ``k``,
    ``fitted`` and ``predicted`` run counts, ``median_abs_error_pct``."""

    source: str
    k: int
    fitted: int
    predicted: int
    median_abs_error_pct: float


def pick(measured_s: np.ndarray, k: int) -> np.ndarray:
    """Indices of ``k`` of the runs, spread evenly in order of measured step time (first and last included)."""
    order = np.argsort(measured_s, kind="stable")
    if k <= 0:
        return np.zeros(0, dtype=int)
    if k == 1:
        return order[[len(order) // 2]]
    return order[np.unique(np.round(np.linspace(0, len(order) - 1, k)).astype(int))]


def calibrate_on(obs: Observations, predict, ranges: dict, k: int) -> list[TransferError]:
    """Per source, the error of the runs not fitted when ``k`` runs of each of its clusters are.

    Parameters
    ----------
    obs : Observations
    predict : callable
        As in :func:`flowsim.calibrate.fit.fit`.
    ranges : dict
        ``key -> (low, high)``.
    k : int
        Runs fitted per cluster, >= 0.

    Returns
    -------
    list of TransferError
        One per source with at least one predicted run, in source order.
    """
    solver = _Solver(obs, predict, ranges)
    uncal = solver.predict_with([], [])
    out = []
    for src in sorted(set(obs.source)):
        fitted = predicted = 0
        pred, meas = [], []
        for key in sorted(set(obs.key[obs.source == src])):
            idx = np.flatnonzero((obs.source == src) & (obs.key == key))
            if len(idx) <= k:
                continue
            chosen = idx[pick(obs.measured_s[idx], k)]
            rest = np.setdiff1d(idx, chosen)
            train = np.zeros(len(obs.key), bool)
            train[chosen] = True
            p = uncal
            if key and len(chosen) >= MIN_ROWS:
                x, _ = solver.fit([key], train)
                p = solver.predict_with([key], x)
            fitted += len(chosen)
            predicted += len(rest)
            pred.extend(p[rest])
            meas.extend(obs.measured_s[rest])
        if predicted:
            out.append(TransferError(src, k, fitted, predicted, median_abs_error_pct(pred, meas)))
    return out
