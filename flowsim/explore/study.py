"""Study files: hardware / network variants x workloads x a grid, with tuning and cost settings.

A study (YAML or JSON) has these top-level keys::

    name: nic-study                 # label stored with every result (default: the file name)
    token_budget: 300e9             # tokens to train, for time-to-train and cost (required)
    job: {model: gpt3-175b, gbs: 1536}             # keys shared by every point (optional)
    hardware:                       # variants; each a mapping of cluster keys, with an optional name
      - {name: 8x200G, cluster: dgx-h100, gpus: 1024, nics_per_node: 8, nic_gbps: 200}
    workloads:                      # optional; each a mapping of model / batch keys, optional name
      - {name: gpt3, model: gpt3-175b, gbs: 1536}
    grid: {oversubscription: [1, 2]}                # optional: Cartesian product over these keys
    tune: {tp: [4, 8], recompute: [selective]}      # true, or the layout dimensions to search
    layout: {tp: 8, pp: 8, sp: true}                # instead of tune: one fixed layout for every point
    cost: {electricity_usd_per_kwh: 0.12}           # overrides of flowsim.explore.pricing.CostInputs

``tune: true`` searches the whole default space of each point (GPT-3 175B on 1,024 GPUs: ~24,000
simulations, about 4 minutes per point on 2 cores; see docs/PERFORMANCE.md); list the dimensions to
narrow it. Points are every (hardware, workload, grid combination). A key set by two of ``job``, a hardware
variant, a workload and the grid with different values is a contradiction and an error, as are an empty
study, ``tune`` together with ``layout``, and neither of them.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from flowsim.config import read_config_file
from flowsim.explore.pricing import CostInputs
from flowsim.errors import ConfigError
from flowsim.explore.space import LayoutSpace

_TOP_KEYS = ("name", "token_budget", "job", "hardware", "workloads", "grid", "tune", "layout", "cost")
_TUNE_LIMITS = ("max_tp", "max_pp", "max_vpp", "max_cp", "max_ep", "max_mbs")


@dataclass(frozen=True)
class StudyPoint:
    """One point of a study.

    Attributes
    ----------
    hardware, workload : str
        Names of its hardware variant and workload.
    grid : dict
        Its grid values.
    job : dict
        The build_config mapping of the job (without layout keys when tuned).
    """

    hardware: str
    workload: str
    grid: dict
    job: dict

    @property
    def label(self) -> str:
        grid = " ".join(f"{k}={v}" for k, v in self.grid.items())
        return " ".join(x for x in (self.hardware, self.workload, grid) if x)


@dataclass(frozen=True)
class Study:
    """A parsed, checked study (see the module docstring).

    Attributes
    ----------
    name : str
        Label stored with every result.
    token_budget : float
        Tokens to train.
    points : tuple[StudyPoint, ...]
        Every point.
    tune : dict or None
        Layout space settings (dimension lists and ``max_*`` limits) when points are tuned, else None.
    layout : dict or None
        The fixed layout when points are not tuned.
    cost : CostInputs
        Cost model inputs.
    grid_keys : tuple[str, ...]
        The grid's keys, in order (the axes of a heatmap).
    """

    name: str
    token_budget: float
    points: tuple
    tune: dict | None
    layout: dict | None
    cost: CostInputs
    grid_keys: tuple

    def space_for(self, base) -> LayoutSpace:
        """The layout space of a tuned point whose simplest-layout config is ``base``."""
        limits = {k: v for k, v in self.tune.items() if k in _TUNE_LIMITS}
        dims = {k: v for k, v in self.tune.items() if k not in _TUNE_LIMITS}
        return LayoutSpace.default(base, **limits, **dims)


def _named(entries, section: str) -> list:
    if entries is None:
        return [("", {})]
    if not isinstance(entries, list) or not entries:
        raise ConfigError(section, "must be a non-empty list of mappings", entries)
    out, names = [], set()
    for i, e in enumerate(entries):
        if not isinstance(e, Mapping):
            raise ConfigError(f"{section}[{i}]", "must be a mapping of config keys", e)
        e = dict(e)
        name = str(e.pop("name", "") or f"{section}{i + 1}")
        if name in names:
            raise ConfigError(f"{section}[{i}].name", "must be unique", name)
        names.add(name)
        out.append((name, e))
    return out


def _merge(parts: list) -> dict:
    """Merge (source label, mapping) parts; a key set twice to different values is a contradiction."""
    merged, origin = {}, {}
    for label, part in parts:
        for k, v in part.items():
            key = str(k).replace("-", "_")
            if key in merged and merged[key] != v:
                raise ConfigError(key, f"contradictory study: {origin[key]} sets {merged[key]!r} but {label} "
                                  f"sets {v!r}")
            merged[key], origin[key] = v, label
    return merged


def _grid(grid) -> list:
    if grid is None:
        return [{}]
    if not isinstance(grid, Mapping) or not grid:
        raise ConfigError("grid", "must be a non-empty mapping of key: [values]", grid)
    for k, v in grid.items():
        if not isinstance(v, list) or not v:
            raise ConfigError(f"grid.{k}", "must be a non-empty list of values", v)
        if len(set(map(repr, v))) != len(v):
            raise ConfigError(f"grid.{k}", "has repeated values", v)
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def parse_study(data: Mapping, default_name: str = "study") -> Study:
    """Check the study mapping ``data`` and expand its points (raises ConfigError naming the bad key);
    ``default_name`` names a study without ``name``."""
    if not isinstance(data, Mapping) or not data:
        raise ConfigError("study", "is empty: it needs hardware variants and/or workloads")
    unknown = [k for k in data if k not in _TOP_KEYS]
    if unknown:
        raise ConfigError(unknown[0], f"unknown study key; known: {', '.join(_TOP_KEYS)}")
    if not any(data.get(k) for k in ("hardware", "workloads", "grid")):
        raise ConfigError("study", "has no points: give hardware, workloads or grid")
    budget = data.get("token_budget")
    if isinstance(budget, str):
        try:
            budget = float(budget)
        except ValueError:
            pass
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0:
        raise ConfigError("token_budget", "must be a number of tokens > 0", budget)
    job = data.get("job") or {}
    if not isinstance(job, Mapping):
        raise ConfigError("job", "must be a mapping of config keys", job)
    tune, layout = data.get("tune"), data.get("layout")
    if tune and layout:
        raise ConfigError("layout", "contradictory study: a fixed layout and tune are both given; "
                          "restrict the tune space instead")
    if not tune and not layout:
        raise ConfigError("tune", "the study needs tune (true or a layout space) or a fixed layout")
    if tune is True:
        tune = {}
    if tune is not None and tune is not False and not isinstance(tune, Mapping):
        raise ConfigError("tune", "must be true or a mapping of layout dimensions", tune)
    if layout is not None and not isinstance(layout, Mapping):
        raise ConfigError("layout", "must be a mapping of layout keys", layout)
    points = []
    for (hw, hw_map), (wl, wl_map), grid in itertools.product(_named(data.get("hardware"), "hardware"),
                                                              _named(data.get("workloads"), "workloads"),
                                                              _grid(data.get("grid"))):
        merged = _merge([("job", job), (f"hardware {hw!r}", hw_map), (f"workload {wl!r}", wl_map),
                         ("grid", grid), ("layout", layout or {})])
        points.append(StudyPoint(hardware=hw, workload=wl, grid=grid, job=merged))
    return Study(name=str(data.get("name") or default_name), token_budget=float(budget), points=tuple(points),
                 tune=dict(tune) if tune else None, layout=dict(layout) if layout else None,
                 cost=CostInputs.from_mapping(data.get("cost")), grid_keys=tuple((data.get("grid") or {}).keys()))


def load_study(path: str | Path) -> Study:
    """Read and check the study file at ``path`` (YAML or JSON); its stem is the default name."""
    return parse_study(read_config_file(path), default_name=Path(path).stem)
