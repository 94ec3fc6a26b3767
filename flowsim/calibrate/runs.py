"""Calibration of the engine on measured runs: which parameter each run informs, its tabulated responses, and
the fitted profile.

The runs arrive as built configs with their measured step times (the CLI reads them with
:mod:`flowsim.validation.runs`); nothing here reads files of measured data.
"""
from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from flowsim.calibrate.fit import FitResult, Observations, fit, median_abs_error_pct
from flowsim.calibrate.response import ResponseTable, grid
from flowsim.config import SimConfig
from flowsim.gpu_specs import get_gpu
from flowsim.kernels.calibration import PARAMETERS, Fallback, Parameter, Profile, job_stack, write_profile
from flowsim.kernels.stack import release

GEMM = PARAMETERS["gemm_fraction"]
GRID_POINTS = 7
"""Grid values per row (geometric over the parameter's range, 1.0 included): 8 simulations per row."""


@dataclass(frozen=True)
class Run:
    """One measured run: ``id``, ``source``, ``config`` (SimConfig), ``measured_s`` (seconds per step)."""

    id: int
    source: str
    config: SimConfig
    measured_s: float


def job_release(cfg: SimConfig) -> str:
    """The release a config's kernels run on: ``software_release``, else ``framework_version`` where it is a
    listed release (:func:`flowsim.kernels.calibration.job_stack`); ``""`` when neither is known."""
    t = cfg.training
    return job_stack(get_gpu(cfg.cluster.gpu), t.software_release, 0.0, "", t.framework_version).release


def parameter_key(cfg: SimConfig) -> str:
    """``gemm_fraction:<arch>:<family>`` of a config, or ``""`` when its software release is not known
    (:func:`job_release`)."""
    rel = job_release(cfg)
    return f"{GEMM.name}:{get_gpu(cfg.cluster.gpu).arch}:{release(rel).family}" if rel else ""


def _split(key: str) -> tuple[str, str, str]:
    name, arch, family = key.split(":")
    return name, arch, family


def grid_profile(keys: Sequence[str], value: float) -> Profile:
    """A profile that sets every key to ``value`` (used to tabulate responses; not a fitted profile)."""
    params = tuple(Parameter(*_split(k), value, GEMM.range, 0.0, 3, "tabulation grid point", 0.0) for k in keys)
    return Profile(params, "tabulation grid point")


def tabulate(runs: Sequence[Run], simulate: Callable, points: int = GRID_POINTS) -> tuple[ResponseTable, list]:
    """Simulate every run at every grid value of the GEMM fraction (all parameters at once).

    Parameters
    ----------
    runs : sequence of Run
    simulate : callable
        ``simulate(SimConfig) -> Result``-like with ``step_time_s`` (default engine: :func:`flowsim.simulate`).
    points : int
        Grid size (>= 3).

    Returns
    -------
    (ResponseTable, keys)
        The responses (rows in ``runs`` order) and each run's parameter key.
    """
    keys = [parameter_key(r.config) for r in runs]
    values = grid(*GEMM.range, points)
    times = np.empty((len(runs), values.size))
    with tempfile.TemporaryDirectory(prefix="flowsim-calibrate-") as tmp:
        for j, v in enumerate(values):
            path = Path(tmp) / f"grid{j}.yaml"
            write_profile(grid_profile(sorted(set(keys) - {""}), float(v)), path)
            for i, r in enumerate(runs):
                cfg = r.config
                if keys[i]:
                    cfg = dataclasses.replace(cfg, training=dataclasses.replace(cfg.training, calibration=str(path)))
                times[i, j] = simulate(cfg).step_time_s
    return ResponseTable(values, times), keys


def calibrate_runs(runs: Sequence[Run], table: ResponseTable, keys: Sequence[str]) -> FitResult:
    """Fit the GEMM fractions the runs inform (rules in :mod:`flowsim.calibrate.fit`)."""
    obs = Observations(np.array([r.measured_s for r in runs]), np.array([r.source for r in runs]), np.array(keys))
    return fit(obs, table, {k: GEMM.range for k in set(keys) - {""}})


def profile_of(result: FitResult, fitted_on: str, command: str, host=None) -> Profile:
    """The calibration profile of a fit: its kept parameters with range, uncertainty, rows and CV error, the keys
    it dropped, and each stage's fallback where it lowers the leave-one-cluster-out error.

    ``host`` (:class:`flowsim.calibrate.host.HostFit`, optional) adds the kept host multipliers; the errors are
    then those of the runs with both stages (each run's GEMM-stage prediction times its host-stage ratio).
    """
    stages = [result] + ([host.result] if host is not None and host.result else [])
    params = tuple(
        Parameter(*_split(p.key), p.value, PARAMETERS[_split(p.key)[0]].range, p.uncertainty, p.rows,
                  ", ".join(p.sources), p.cv_error_pct)
        for stage in stages for p in stage.parameters)
    dropped = tuple(str(k) for stage in stages for k in stage.dropped)
    fallbacks = tuple(Fallback(_split(stage.parameters[0].key)[0], f.value, f.loco_pct, f.loco_uncalibrated_pct)
                      for stage in stages for f in [stage.fallback] if f is not None and f.kept)
    return Profile(params, fitted_on, command, errors_of(result, host), dropped, fallbacks)


def errors_of(result: FitResult, host=None) -> tuple:
    """``(name, median |error| %)`` uncalibrated, in-sample and leave-one-source-out, with the host stage's
    ratios applied to every run when ``host`` is given."""
    if host is None:
        return (("uncalibrated_median_pct", result.uncalibrated_pct), ("in_sample_median_pct", result.in_sample_pct),
                ("loso_median_pct", result.loso_pct))
    return (("uncalibrated_median_pct", result.uncalibrated_pct),
            ("in_sample_median_pct", median_abs_error_pct(result.predicted_s * host.ratio_in, host.measured_s)),
            ("loso_median_pct", median_abs_error_pct(result.loso_predicted_s * host.ratio_loso, host.measured_s)))
