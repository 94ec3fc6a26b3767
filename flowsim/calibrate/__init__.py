"""Calibration: fit the efficiency parameters kernel measurements do not pin down to measured whole steps.

:func:`fit` (robust least squares on log step time, leave-one-source-out errors, parameters kept only when
they lower them), :class:`ResponseTable` (tabulated simulations), :func:`calibrate_on` (fit k runs of a
cluster, predict the rest) and, for runs given as configs, :func:`tabulate`, :func:`calibrate_runs` and
:func:`profile_of`; the host-cost multiplier is a second stage on the runs it informs
(:mod:`flowsim.calibrate.host`). Profiles are read and applied by :mod:`flowsim.kernels.calibration`.
"""
from flowsim.calibrate.fit import MIN_ROWS, FitResult, FittedParameter, Observations, fit, median_abs_error_pct
from flowsim.calibrate.response import ResponseTable, grid
from flowsim.calibrate.runs import Run, calibrate_runs, parameter_key, profile_of, tabulate
from flowsim.calibrate.transfer import TransferError, calibrate_on

__all__ = [
    "MIN_ROWS", "FitResult", "FittedParameter", "Observations", "ResponseTable", "Run", "TransferError",
    "calibrate_on", "calibrate_runs", "fit", "grid", "median_abs_error_pct", "parameter_key", "profile_of",
    "tabulate",
]
