"""Calibration profiles: global efficiency parameters fitted to whole-step runs, and how a job applies them.

Kernel constants come from kernel measurements. What those do not pin down (the sustained GEMM rate of a
software family on a GPU generation inside a training loop; the host CPU time per issued kernel of a software
family on a host CPU family) may be fitted to measured steps by ``flowsim calibrate`` (:mod:`flowsim.calibrate`),
globally per GPU generation (or host CPU family) and software family, each parameter inside a stated physical
range. The fit writes a profile file; a job names it with the config key
``calibration`` (a path, or ``default`` for the shipped profile) and the kernel pricing applies it through
:func:`job_stack`.

Profile file (YAML)::

    schema: flowsim-calibration-profile/1
    fitted_on: <runs file and rows>
    command: <the command that produced it>
    errors: {uncalibrated_median_pct: .., in_sample_median_pct: .., loso_median_pct: ..}
    parameters:
      - name: gemm_fraction          # one of PARAMETERS
        arch: hopper                 # GPU generation (GPUSpec.arch); host CPU family for host_multiplier
        family: megatron-core-2024   # software family (flowsim.kernels.stack)
        value: 0.91
        range: [0.6, 1.15]           # must be PARAMETERS[name].range
        uncertainty: 0.01            # one standard error
        rows: 40                     # rows that informed it
        fitted_on: <sources>
        cv_error_pct: 9.8            # leave-one-source-out median |error| with the parameter in the profile
    dropped: [gemm_fraction:hopper:megatron-bridge-2025]   # fitted, but uncalibrated did better: value 1
    fallbacks:                       # for pairs no parameter covers (optional)
      - name: gemm_fraction
        value: 0.83                  # the mean of the profile's gemm_fraction values
        cv_error_pct: 9.4            # leave-one-cluster-out median |error| at the other clusters' mean
        uncalibrated_cv_pct: 11.9    # the same rows uncalibrated

A job's value of a parameter (:meth:`Profile.value`): the parameter fitted for its (generation, family); 1 for a
dropped key; else the fallback of that parameter (``flowsim calibrate`` writes one only when it lowers the
leave-one-cluster-out error, :mod:`flowsim.calibrate.fit`), with a :class:`~flowsim.errors.FlowsimWarning`
naming it; else 1. A job that names a framework release the release table does not list (its family unknown)
takes the fallback too (:meth:`Profile.unlisted_value`); a job that names no release stays uncalibrated.
"""
from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import yaml

from flowsim.errors import ConfigError, FlowsimWarning
from flowsim.gpu_specs import GPUSpec
from flowsim.kernels.stack import KernelStack, attention_kernel, release, releases

SCHEMA = "flowsim-calibration-profile/1"
DEFAULT_PROFILE = Path(__file__).resolve().parent / "data" / "calibration_default.yaml"
"""The shipped profile (config ``calibration: default``), fitted by the command in docs/ACCURACY.md."""
ARCHS = ("volta", "ampere", "ada", "hopper", "blackwell", "cdna3", "cdna4")
HOST_CPUS = ("intel", "amd", "arm")
"""Host CPU families, the values of config ``cluster.cpu`` (``flowsim.config.cluster.CPUS``; kernels sits below
config, tests/test_calibrate.py checks they agree)."""


@dataclass(frozen=True)
class ParameterSpec:
    """A calibratable parameter: its physical ``range`` (low, high), unit, where the range comes from, and the
    values its profile field ``arch`` takes (``scopes``: GPU generations, or host CPU families)."""

    name: str
    range: tuple
    unit: str
    meaning: str
    source: str
    scopes: tuple = ARCHS


PARAMETERS = {
    "gemm_fraction": ParameterSpec(
        "gemm_fraction", (0.6, 1.15), "dimensionless",
        "sustained GEMM rate in training over the kernel-benchmark ceiling, per GPU generation x software family",
        "high: +15 %, what non-random (zeros) inputs buy over random ones at a power limit (Horace He, A100, "
        "shared/data/kernel_measurements_additions.md s3), so a sustained rate cannot beat a random-data "
        "benchmark by more; low: 0.6, as far below the benchmark as the worst large-GEMM measurement in the shared "
        "data falls below its datasheet peak (Azure GB200 FP8, random data: 2,907 / 5,000 = 0.58)"),
    "host_multiplier": ParameterSpec(
        "host_multiplier", (0.5, 2.5), "dimensionless",
        "host CPU time per issued kernel over the host-cost table's figure (flowsim/model/data/host_costs.csv), "
        "per host CPU family x software family",
        "shared/research/host-overhead.md: low 0.5, a C++-only issue path (raw cuLaunchKernel 1.3-3.3 us, "
        "tritonbench #1017, against the table's 4 us per op); high 2.5, Transformer Engine modules on Grace "
        "(TE Linear forward 99.7 us against torch's 37.1 us on GB200, TransformerEngine#2053, 2.7x)",
        HOST_CPUS),
}
"""Parameters ``flowsim calibrate`` may fit, by name."""


@dataclass(frozen=True)
class Parameter:
    """One fitted parameter of a profile (fields as in the module docstring)."""

    name: str
    arch: str
    family: str
    value: float
    range: tuple
    uncertainty: float
    rows: int
    fitted_on: str
    cv_error_pct: float

    @property
    def key(self) -> str:
        """``name:arch:family``, e.g. ``gemm_fraction:hopper:megatron-core-2024``."""
        return f"{self.name}:{self.arch}:{self.family}"

    def to_dict(self) -> dict:
        """The YAML mapping of this parameter."""
        return {"name": self.name, "arch": self.arch, "family": self.family, "value": round(self.value, 6),
                "range": list(self.range), "uncertainty": round(self.uncertainty, 6), "rows": self.rows,
                "fitted_on": self.fitted_on, "cv_error_pct": round(self.cv_error_pct, 3)}


@dataclass(frozen=True)
class Fallback:
    """A profile's value of ``name`` for the pairs none of its parameters covers (module docstring), with its
    leave-one-cluster-out check: ``cv_error_pct`` at the fallback, ``uncalibrated_cv_pct`` without it (%)."""

    name: str
    value: float
    cv_error_pct: float
    uncalibrated_cv_pct: float

    def to_dict(self) -> dict:
        """The YAML mapping of this fallback."""
        return {"name": self.name, "value": round(self.value, 6), "cv_error_pct": round(self.cv_error_pct, 3),
                "uncalibrated_cv_pct": round(self.uncalibrated_cv_pct, 3)}


@dataclass(frozen=True)
class Profile:
    """A calibration profile: ``parameters`` (tuple of :class:`Parameter`), the keys fitted and ``dropped``, the
    ``fallbacks`` (tuple of :class:`Fallback`) and the fit's provenance."""

    parameters: tuple
    fitted_on: str = ""
    command: str = ""
    errors: tuple = ()
    dropped: tuple = ()
    fallbacks: tuple = ()

    def value(self, name: str, arch: str, family: str) -> float:
        """The value of ``name`` for (arch, family): fitted; 1.0 for a dropped key; else the fallback of ``name``
        (with a FlowsimWarning); else 1.0 (uncalibrated)."""
        for p in self.parameters:
            if (p.name, p.arch, p.family) == (name, arch, family):
                return p.value
        if f"{name}:{arch}:{family}" in self.dropped:
            return 1.0
        return self._fallback(name, f"no {name} fitted for {arch} x {family}; the profile's fallback {{value}} "
                                    "applies (the mean of its fitted values, docs/CALIBRATION.md)")

    def unlisted_value(self, name: str, framework_version: str) -> float:
        """The value of ``name`` for a job that names a framework release the release table does not list (its
        software family unknown): the fallback of ``name``, with a FlowsimWarning; else 1.0."""
        return self._fallback(name, f"framework_version {framework_version} is not a listed software release (its "
                                    f"software family is unknown); the profile's {name} fallback {{value}} applies "
                                    "(docs/CALIBRATION.md)")

    def _fallback(self, name: str, why: str) -> float:
        """The fallback of ``name``, with a FlowsimWarning ``why`` (``{value}`` filled in); 1.0 without one."""
        for f in self.fallbacks:
            if f.name == name:
                warnings.warn("calibration: " + why.replace("{value}", f"{f.value:.3f}"), FlowsimWarning,
                              stacklevel=4)
                return f.value
        return 1.0

    def to_dict(self) -> dict:
        """The YAML mapping of the profile."""
        out = {"schema": SCHEMA, "fitted_on": self.fitted_on, "command": self.command,
               "errors": {k: round(v, 3) for k, v in self.errors},
               "parameters": [p.to_dict() for p in self.parameters]}
        if self.dropped:
            out["dropped"] = list(self.dropped)
        if self.fallbacks:
            out["fallbacks"] = [f.to_dict() for f in self.fallbacks]
        return out


def write_profile(profile: Profile, path) -> None:
    """Write ``profile`` as YAML to ``path`` (``-`` is not handled here; the CLI prints instead)."""
    Path(path).write_text(yaml.safe_dump(profile.to_dict(), sort_keys=False, width=118))


def profile_path(name: str) -> Path:
    """Path of a profile named in a config: ``default`` is the shipped one, anything else a file path."""
    return DEFAULT_PROFILE if str(name).strip().lower() == "default" else Path(name)


def calibration_on(name: str) -> bool:
    """Whether the config value ``calibration`` names a profile (``none`` and empty mean no calibration)."""
    return bool(name) and str(name).strip().lower() != "none"


def load_profile(name: str) -> Profile:
    """Read and check a profile file (``default`` = the shipped profile).

    Raises
    ------
    ConfigError
        One line naming the field: unreadable file or bad YAML (``calibration``), a wrong ``schema``, a
        parameter with a missing field, an unknown name, GPU generation or software family, a range that is not
        the parameter's physical range, or a value outside it (``calibration: parameters[i].<field>``).
    """
    path = profile_path(name)
    try:
        stamp = path.stat().st_mtime_ns
    except OSError as e:
        raise ConfigError("calibration", f"cannot read profile file: {e.strerror}", str(name)) from None
    return _load(str(path), stamp)


@functools.lru_cache(maxsize=32)
def _load(path: str, _stamp: int) -> Profile:
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise ConfigError("calibration", f"cannot read profile file: {e.strerror}", path) from None
    except yaml.YAMLError as e:
        raise ConfigError("calibration", f"not valid YAML: {str(e).splitlines()[0]}", path) from None
    if not isinstance(raw, dict):
        raise ConfigError("calibration", "a profile is a YAML mapping", path)
    if raw.get("schema") != SCHEMA:
        raise ConfigError("calibration.schema", f"must be {SCHEMA}", raw.get("schema"))
    items = raw.get("parameters")
    if not isinstance(items, list):
        raise ConfigError("calibration.parameters", "must be a list of parameters", type(items).__name__)
    params = tuple(_parameter(i, p) for i, p in enumerate(items))
    keys = [p.key for p in params]
    dup = [k for k in keys if keys.count(k) > 1]
    if dup:
        raise ConfigError("calibration.parameters", "a parameter is listed twice", dup[0])
    errors = raw.get("errors") or {}
    return Profile(params, str(raw.get("fitted_on", "")), str(raw.get("command", "")),
                   tuple((str(k), float(v)) for k, v in errors.items()), _dropped(raw.get("dropped") or []),
                   tuple(_fallback(i, f) for i, f in enumerate(_listed(raw, "fallbacks"))))


def _listed(raw: dict, field: str) -> list:
    items = raw.get(field) or []
    if not isinstance(items, list):
        raise ConfigError(f"calibration.{field}", "must be a list", type(items).__name__)
    return items


def _dropped(items) -> tuple:
    if not isinstance(items, list):
        raise ConfigError("calibration.dropped", "must be a list of name:arch:family keys", type(items).__name__)
    for i, k in enumerate(items):
        parts = str(k).split(":")
        if len(parts) != 3 or parts[0] not in PARAMETERS:
            raise ConfigError(f"calibration.dropped[{i}]", "must be a name:arch:family key of a known parameter", k)
    return tuple(str(k) for k in items)


def _fallback(i: int, f) -> Fallback:
    where = f"calibration.fallbacks[{i}]"
    if not isinstance(f, dict):
        raise ConfigError(where, "must be a mapping", f)
    spec = PARAMETERS.get(f.get("name"))
    if spec is None:
        raise ConfigError(f"{where}.name", f"unknown parameter; known: {', '.join(PARAMETERS)}", f.get("name"))
    for field in ("value", "cv_error_pct", "uncalibrated_cv_pct"):
        v = f.get(field)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ConfigError(f"{where}.{field}", "must be a finite number", v)
    if not spec.range[0] <= f["value"] <= spec.range[1]:
        raise ConfigError(f"{where}.value", f"must lie inside the range of {spec.name}, {list(spec.range)}",
                          f["value"])
    return Fallback(spec.name, float(f["value"]), float(f["cv_error_pct"]), float(f["uncalibrated_cv_pct"]))


_FIELDS = ("name", "arch", "family", "value", "range", "uncertainty", "rows", "fitted_on", "cv_error_pct")


def _parameter(i: int, p) -> Parameter:
    where = f"calibration.parameters[{i}]"
    if not isinstance(p, dict):
        raise ConfigError(where, "must be a mapping", p)
    for f in _FIELDS:
        if f not in p or p[f] is None:
            raise ConfigError(f"{where}.{f}", "required field is missing")
    spec = PARAMETERS.get(p["name"])
    if spec is None:
        raise ConfigError(f"{where}.name", f"unknown parameter; known: {', '.join(PARAMETERS)}", p["name"])
    if p["arch"] not in spec.scopes:
        raise ConfigError(f"{where}.arch", f"must be one of {', '.join(spec.scopes)} for {spec.name}", p["arch"])
    families = {r.family for r in releases().values()} - {"benchmark"}
    if p["family"] not in families:
        raise ConfigError(f"{where}.family", f"must be one of {', '.join(sorted(families))}", p["family"])
    rng = p["range"]
    if not (isinstance(rng, list) and len(rng) == 2 and tuple(float(x) for x in rng) == spec.range):
        raise ConfigError(f"{where}.range", f"must be the physical range of {spec.name}, {list(spec.range)}", rng)
    for f in ("value", "uncertainty", "cv_error_pct"):
        v = p[f]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ConfigError(f"{where}.{f}", "must be a finite number", v)
    if not spec.range[0] <= p["value"] <= spec.range[1]:
        raise ConfigError(f"{where}.value", f"must lie inside its range {list(spec.range)}", p["value"])
    if isinstance(p["rows"], bool) or not isinstance(p["rows"], int) or p["rows"] < 3:
        raise ConfigError(f"{where}.rows", "must be an integer >= 3 (a parameter needs 3 rows to be fitted)",
                          p["rows"])
    return Parameter(p["name"], p["arch"], p["family"], float(p["value"]), spec.range, float(p["uncertainty"]),
                     p["rows"], str(p["fitted_on"]), float(p["cv_error_pct"]))


def job_stack(gpu: GPUSpec, software_release: str = "", power_limit_w: float = 0.0,
              calibration: str = "", framework_version: str = "") -> KernelStack:
    """The :class:`KernelStack` of a job: its release, power limit and calibrated GEMM multiplier.

    Parameters
    ----------
    gpu : GPUSpec
        The job's GPU (its ``arch`` selects the profile's parameter).
    software_release : str
        Config ``software_release`` (``""`` = ``framework_version`` when that is a listed release, else the
        default stack).
    power_limit_w : float
        Config ``power_limit_w`` in W (0 = the GPU's own).
    calibration : str
        Config ``calibration``: a profile path, ``default``, or ``none`` / ``""`` (none).
    framework_version : str
        Config ``framework_version`` (:mod:`flowsim.config.profiles`).

    Returns
    -------
    KernelStack
        ``gemm_scale`` = the profile's ``gemm_fraction`` for (``gpu.arch``, the release's family)
        (:meth:`Profile.value`: its fallback where the pair has no fitted value); the fallback for a ``framework_version`` that is not a
        listed release; 1 without a profile or any release. ``attention_impl`` = the kernel the release runs
        on ``gpu.arch`` (:func:`flowsim.kernels.stack.attention_kernel`). ``sustained`` = True: a training
        step keeps the GPU at its power limit (:mod:`flowsim.kernels.sustained`).
    """
    if not software_release and framework_version.strip().lower() in releases():
        software_release = framework_version
    scale = 1.0
    if calibration_on(calibration) and software_release:
        scale = load_profile(calibration).value("gemm_fraction", gpu.arch, release(software_release).family)
    elif calibration_on(calibration) and framework_version.strip():
        scale = load_profile(calibration).unlisted_value("gemm_fraction", framework_version)
    return KernelStack(release=software_release, power_limit_w=power_limit_w, gemm_scale=scale,
                       attention_impl=attention_kernel(software_release, gpu.arch), sustained=True)


def host_scale(calibration: str, software_release: str, framework_version: str, cpu: str) -> float:
    """The profile's ``host_multiplier`` for a job's host CPU family and software family (1 without a profile,
    a release, or a fitted value): the host model multiplies every per-kernel CPU cost by it
    (:func:`flowsim.model.host_costs.block_host_s`).

    Parameters
    ----------
    calibration : str
        Config ``calibration`` (a profile path, ``default``, or ``none`` / ``""``).
    software_release, framework_version : str
        Config keys naming the job's release (as :func:`job_stack` reads them).
    cpu : str
        Host CPU family (config ``cluster.cpu``: intel, amd, arm).
    """
    if not software_release and framework_version.strip().lower() in releases():
        software_release = framework_version
    if not (calibration_on(calibration) and software_release):
        return 1.0
    return load_profile(calibration).value("host_multiplier", cpu, release(software_release).family)
