"""Read GPU datasheet YAML files into :class:`GPUSpec` records, converting units to SI once.

File format (one GPU per file; units as datasheets give them, named in the keys):

``key``, ``name``, ``vendor``, ``arch``, ``compute_capability`` (int), ``peak_TFLOPS`` (mapping dtype ->
dense TFLOP/s), ``hbm_GB`` (1e9 bytes), ``hbm_TBps`` (1e12 bytes/s), ``sm_count`` (int), ``clock_MHz``
(``null`` when not published), ``l2_MiB`` (last-level cache; ``null`` when not published), ``scaleup_kind``,
``scaleup_GBps`` (per GPU per direction), ``scaleup_links`` (int), ``nvls`` (bool), ``pcie_GBps`` (host link
per direction), ``tdp_W``, ``sources`` (non-empty list of strings) and optional ``notes`` and ``power_limit_W`` (a board power
limit below the part's design power, W).
"""
from __future__ import annotations

import math
from pathlib import Path

import yaml

import flowsim.units as units
from flowsim.errors import ConfigError
from flowsim.gpu_specs.spec import GPUSpec

VENDORS = ("nvidia", "amd")
ARCHS = ("volta", "ampere", "ada", "hopper", "blackwell", "cdna3", "cdna4")
DTYPES = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "fp4")
SCALEUP_KINDS = ("nvswitch", "nvlink_mesh", "nvlink_bridge", "xgmi_mesh", "pcie")

_STR_FIELDS = ("key", "name", "vendor", "arch", "scaleup_kind")
_INT_FIELDS = ("compute_capability", "sm_count", "scaleup_links")
_POSITIVE_FIELDS = ("hbm_GB", "hbm_TBps", "tdp_W")
_NONNEGATIVE_FIELDS = ("scaleup_GBps", "pcie_GBps")
_NULLABLE_FIELDS = ("clock_MHz", "l2_MiB")  # null = not published; stored as NaN
_HZ_PER_MHZ = 1e6  # SI prefix mega (flowsim.units has no frequency names)
REQUIRED_FIELDS = (
    _STR_FIELDS + _INT_FIELDS + _POSITIVE_FIELDS + _NONNEGATIVE_FIELDS + _NULLABLE_FIELDS
    + ("peak_TFLOPS", "nvls", "sources")
)
OPTIONAL_FIELDS = ("notes", "power_limit_W")
# PyYAML's safe loader on libyaml's parser where PyYAML was built with it: the same resolver and constructors, so
# the same values, read about 9x faster (the README estimate reads ten GPU files: about 25 ms less).
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_spec_file(path) -> GPUSpec:
    """Load and validate one GPU datasheet YAML file.

    Parameters
    ----------
    path : str or pathlib.Path
        The YAML file (format in this module's docstring).

    Returns
    -------
    GPUSpec
        The record, in SI units (FLOP/s, bytes, bytes/s, Hz, W).

    Raises
    ------
    ConfigError
        When the file is missing or unreadable, a field is missing or has a bad value, or ``sources`` is empty;
        the field is named ``<file>: <field>``.
    """
    path = Path(path)
    try:
        raw = yaml.load(path.read_text(), Loader=_SAFE_LOADER)  # noqa: S506 (a safe loader)
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError("gpu", f"cannot read GPU spec file ({type(e).__name__})", str(path)) from None
    if not isinstance(raw, dict):
        raise ConfigError("gpu", "GPU spec file must hold a mapping of fields", str(path))
    return spec_from_dict(raw, origin=path.name)


def spec_from_dict(raw: dict, origin: str = "<dict>") -> GPUSpec:
    """Validate a datasheet mapping (units as in the YAML files) and convert it to a :class:`GPUSpec`.

    Parameters
    ----------
    raw : dict
        Fields as in the YAML format of this module.
    origin : str
        Name used in error messages (the file name).

    Returns
    -------
    GPUSpec

    Raises
    ------
    ConfigError
        Field named ``<origin>: <field>``.
    """

    def bad(fld: str, rule: str, got=None):
        return ConfigError(f"{origin}: {fld}", rule, got)

    missing = [f for f in REQUIRED_FIELDS if f not in raw]
    if missing:
        raise bad(missing[0], "required field is missing")
    unknown = sorted(set(raw) - set(REQUIRED_FIELDS) - set(OPTIONAL_FIELDS))
    if unknown:
        raise bad(unknown[0], f"unknown field; allowed: {', '.join(REQUIRED_FIELDS + OPTIONAL_FIELDS)}")
    limit = raw.get("power_limit_W")
    if limit is not None and not (_is_number(limit) and limit > 0):
        raise bad("power_limit_W", "must be a number of watts > 0", limit)
    sources = raw["sources"]
    if isinstance(sources, str):
        sources = [sources]
    if not isinstance(sources, list) or not sources or not all(isinstance(s, str) and s.strip() for s in sources):
        raise bad("sources", "must be a non-empty list of citations", sources)
    for f in _STR_FIELDS:
        if not isinstance(raw[f], str) or not raw[f].strip():
            raise bad(f, "must be a non-empty string", raw[f])
    for f, allowed in (("vendor", VENDORS), ("arch", ARCHS), ("scaleup_kind", SCALEUP_KINDS)):
        if raw[f] not in allowed:
            raise bad(f, f"must be one of {', '.join(allowed)}", raw[f])
    for f in _INT_FIELDS:
        if isinstance(raw[f], bool) or not isinstance(raw[f], int) or raw[f] < 0:
            raise bad(f, "must be a non-negative integer", raw[f])
    if raw["sm_count"] < 1:
        raise bad("sm_count", "must be >= 1", raw["sm_count"])
    for f in _POSITIVE_FIELDS:
        if not _is_number(raw[f]) or raw[f] <= 0:
            raise bad(f, "must be a number > 0", raw[f])
    for f in _NONNEGATIVE_FIELDS:
        if not _is_number(raw[f]) or raw[f] < 0:
            raise bad(f, "must be a number >= 0", raw[f])
    for f in _NULLABLE_FIELDS:
        if raw[f] is not None and (not _is_number(raw[f]) or raw[f] <= 0):
            raise bad(f, "must be a number > 0 or null (not published)", raw[f])
    if not isinstance(raw["nvls"], bool):
        raise bad("nvls", "must be true or false", raw["nvls"])
    peaks = raw["peak_TFLOPS"]
    if not isinstance(peaks, dict) or not peaks:
        raise bad("peak_TFLOPS", "must map dtypes to dense TFLOP/s", peaks)
    for dt, v in peaks.items():
        if dt not in DTYPES:
            raise bad(f"peak_TFLOPS.{dt}", f"unknown dtype; allowed: {', '.join(DTYPES)}", dt)
        if not _is_number(v) or v <= 0:
            raise bad(f"peak_TFLOPS.{dt}", "must be a number > 0", v)
    return GPUSpec(
        key=raw["key"],
        name=raw["name"],
        vendor=raw["vendor"],
        arch=raw["arch"],
        compute_capability=raw["compute_capability"],
        peak_flop_per_s={dt: units.tflops_to_flops(float(v)) for dt, v in peaks.items()},
        hbm_bytes=float(raw["hbm_GB"]) * units.GB,
        hbm_Bps=float(raw["hbm_TBps"]) * units.TB,
        sm_count=raw["sm_count"],
        clock_hz=_nullable(raw["clock_MHz"]) * _HZ_PER_MHZ,
        l2_bytes=_nullable(raw["l2_MiB"]) * units.MiB,
        scaleup_kind=raw["scaleup_kind"],
        scaleup_Bps=units.GBps_to_Bps(float(raw["scaleup_GBps"])),
        scaleup_links=raw["scaleup_links"],
        nvls=raw["nvls"],
        pcie_Bps=units.GBps_to_Bps(float(raw["pcie_GBps"])),
        tdp_w=float(raw["tdp_W"]),
        sources=tuple(s.strip() for s in sources),
        notes=str(raw.get("notes") or ""),
        power_limit_w=math.nan if limit is None else float(limit),
    )


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _nullable(v) -> float:
    return math.nan if v is None else float(v)
