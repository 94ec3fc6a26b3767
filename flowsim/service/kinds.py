"""What each job kind takes, what it computes and how its result reads as a table.

A job body is ``{"kind": K, "config": {...}, ...}``; ``config`` is the same schema as the CLI's (Megatron
names, aliases, presets):

========== ============================================================ =========================================
kind       body                                                         runs
========== ============================================================ =========================================
estimate   ``config``: a config mapping                                 :func:`flowsim.simulate`
tune       ``config``: a job without layout keys; ``space``: tune's     :func:`flowsim.explore.tune.tune`
           restrictions (``tp: [8]``, ``max_pp: 16``...); ``top``
sweep      ``config``: a study mapping (``flowsim sweep``'s file)       :func:`flowsim.explore.sweep.run_study`
validate   ``measurement``: id of an uploaded runs CSV                  :func:`flowsim.validation.runs.validate_runs`
collective ``config``: op, sizes (``MIN:MAX``), cluster, nodes, ...     :func:`flowsim.nccl_models.predict`
calibrate  ``measurement``: id of an uploaded runs CSV; ``grid``      ``flowsim calibrate`` (when installed)
========== ============================================================ =========================================

:func:`prepare` checks a body once, when it is submitted (a ConfigError is the 422 of the API), and
returns the normalised parameters with the job's key: the SHA-256 of what is computed (for an estimate the
results store's :func:`~flowsim.explore.point.config_key`) and flowsim's version, so identical requests share
one result. :func:`run` computes a result (a JSON-ready dict); :func:`result_frame` is its table (CSV).
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import tempfile
from pathlib import Path
from typing import Callable, Mapping

import pandas as pd

import flowsim
from flowsim._version import __version__
from flowsim.errors import ConfigError

KINDS = ("estimate", "tune", "sweep", "validate", "collective", "calibrate")
COLLECTIVE_KEYS = ("op", "sizes", "cluster", "nodes", "gpus_per_node", "nics_per_node", "nic_gbps", "gpu", "cpu",
                   "algo", "proto", "nccl_version")
TUNE_TOP = 10  # configs listed in a tune result's "top" (flowsim tune's --top default)
TUNE_SPACE_KEYS = ("tp", "pp", "vpp", "cp", "ep", "mbs", "sp", "recompute", "zero", "schedules",
                   "max_tp", "max_pp", "max_vpp", "max_cp", "max_ep", "max_mbs")


def jsonable(obj):
    """``obj`` with numpy scalars as Python numbers and non-finite floats as None (JSON has no NaN)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):
        return jsonable(obj.item())
    return obj


def _hash(kind: str, params: Mapping) -> str:
    text = json.dumps({"kind": kind, "params": params, "flowsim": __version__}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


CALIBRATE_GRID = 7  # simulations per run over the parameter range (flowsim calibrate's --grid default)


def calibrate_available() -> bool:
    """True when calibration (``flowsim.calibrate`` and the ``flowsim calibrate`` command) is installed."""
    return all(importlib.util.find_spec(m) is not None for m in ("flowsim.calibrate", "flowsim.cli.calibrate_cmd"))


def _mapping(body: Mapping, name: str) -> dict:
    value = body.get(name)
    if not isinstance(value, Mapping) or not value:
        raise ConfigError(name, "must be a non-empty mapping (the CLI's config schema)", value)
    return dict(value)


def _only(body: Mapping, allowed: tuple) -> None:
    extra = sorted(k for k in body if k not in ("kind", *allowed))
    if extra:
        raise ConfigError(extra[0], f"unknown job field; this kind takes {', '.join(allowed)}")


def estimate_json(config: Mapping) -> dict:
    """What ``flowsim estimate --json`` prints for ``config``: the same keys in the same order (the API test
    compares the two). Raises ConfigError for a bad config, InvariantError for a result that breaks an invariant."""
    from flowsim.cli.estimate import estimate_document

    cfg = flowsim.build_config(dict(config))
    r = flowsim.simulate(cfg)
    return jsonable(estimate_document(cfg, r))


def estimate_key(config: Mapping) -> str:
    """Key of an estimate of ``config`` (checked: raises ConfigError)."""
    from flowsim.explore.point import config_key

    return config_key(flowsim.build_config(dict(config)))


def prepare(body: Mapping, measurement_kind: Callable[[str], str | None]) -> tuple[str, dict, str]:
    """Check a job body and return ``(kind, params, key)``.

    Parameters
    ----------
    body : mapping
        The request body (see the module docstring).
    measurement_kind : callable
        Maps a measurement id to its kind (``runs``, ``nccl-tests``, ``kineto``) when the caller may read it,
        else None.

    Raises
    ------
    ConfigError
        An unknown kind, ``calibrate`` when flowsim.calibrate is not installed, or a bad config (the message
        the CLI prints for it).
    """
    kind = body.get("kind")
    if kind not in KINDS:
        raise ConfigError("kind", f"must be one of {', '.join(KINDS)}", kind)
    if kind == "estimate":
        _only(body, ("config",))
        config = _mapping(body, "config")
        return kind, {"config": config}, estimate_key(config)
    if kind == "tune":
        _only(body, ("config", "space", "top"))
        from flowsim.explore.space import LayoutSpace
        from flowsim.explore.tune import job_config

        job, space = _mapping(body, "config"), body.get("space") or {}
        if not isinstance(space, Mapping):
            raise ConfigError("space", "must be a mapping of layout dimensions", space)
        bad = sorted(k for k in space if k not in TUNE_SPACE_KEYS)
        if bad:
            raise ConfigError(f"space.{bad[0]}", f"unknown; known: {', '.join(TUNE_SPACE_KEYS)}")
        top = body.get("top", TUNE_TOP)
        if not isinstance(top, int) or isinstance(top, bool) or top < 1:
            raise ConfigError("top", "must be a positive integer", top)
        LayoutSpace.default(job_config(job), **space)
        params = {"config": job, "space": dict(space), "top": top}
        return kind, params, _hash(kind, params)
    if kind == "sweep":
        _only(body, ("config",))
        from flowsim.explore.study import parse_study

        study = _mapping(body, "config")
        parse_study(study)
        return kind, {"config": study}, _hash(kind, {"config": study})
    if kind == "validate":
        _only(body, ("measurement",))
        params = {"measurement": _runs_upload(kind, body, measurement_kind)}
        return kind, params, _hash(kind, params)
    if kind == "collective":
        _only(body, ("config",))
        config = _mapping(body, "config")
        bad = sorted(k for k in config if k not in COLLECTIVE_KEYS)
        if bad:
            raise ConfigError(bad[0], f"unknown collective key; known: {', '.join(COLLECTIVE_KEYS)}")
        _collective_setup(config)
        return kind, {"config": config}, _hash(kind, {"config": config})
    if not calibrate_available():
        raise ConfigError("kind", "calibrate is not available in this flowsim (flowsim.calibrate is not "
                          "installed)", kind)
    _only(body, ("measurement", "grid"))
    grid = body.get("grid", CALIBRATE_GRID)
    if not isinstance(grid, int) or isinstance(grid, bool) or not 3 <= grid <= 25:
        raise ConfigError("grid", "must be an integer in 3..25 (flowsim calibrate --grid)", grid)
    params = {"measurement": _runs_upload(kind, body, measurement_kind), "grid": grid}
    return kind, params, _hash(kind, params)


def _runs_upload(kind: str, body: Mapping, measurement_kind) -> str:
    """The id of the runs CSV ``body`` names (ConfigError unless it is one of the caller's uploads)."""
    mid = body.get("measurement")
    mkind = measurement_kind(mid) if isinstance(mid, str) else None
    if mkind is None:
        raise ConfigError("measurement", "no such upload of yours (POST /v1/measurements first)", mid)
    if mkind != "runs":
        raise ConfigError("measurement", f"{kind} needs a runs CSV, this upload is {mkind}", mid)
    return mid


def _collective_setup(config: Mapping):
    """(op, sizes, layout, cluster, GPU spec) of a collective job's config, checked."""
    from flowsim.cli.collective import parse_sizes
    from flowsim.nccl_models import OPS
    from flowsim.network.comm_layout import group_layout, preset_cluster

    op = config.get("op")
    if op not in OPS:
        raise ConfigError("op", f"must be one of {', '.join(OPS)}", op)
    if not isinstance(config.get("cluster"), str):
        raise ConfigError("cluster", "must name a cluster preset", config.get("cluster"))
    nodes = config.get("nodes", 1)
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        raise ConfigError("nodes", "must be a positive integer", nodes)
    sizes = parse_sizes(str(config.get("sizes", "8:8G")))
    cfg, spec = preset_cluster(config["cluster"], nodes, config.get("gpus_per_node"), config.get("nics_per_node"),
                               config.get("nic_gbps"), config.get("gpu"), config.get("cpu"))
    kw = {"nccl_version": config["nccl_version"]} if config.get("nccl_version") else {}
    return op, sizes, group_layout(cfg, spec, cfg.num_gpus, 1, **kw)


class Context:
    """What a running job may use: the points store, a progress callback and the uploaded files.

    Attributes
    ----------
    store : ServiceStore
        Design points of tune and sweep jobs.
    progress : callable
        ``progress(fraction)`` with fraction in [0, 1].
    measurement : callable
        ``measurement(id)`` -> (kind, bytes) of an upload.
    scheduler : str or None
        ``dask://HOST:PORT`` to fan tune and sweep jobs out to, else None (this process).
    """

    def __init__(self, store, progress, measurement, scheduler=None):
        self.store, self.progress, self.measurement, self.scheduler = store, progress, measurement, scheduler


def run(kind: str, params: Mapping, ctx: Context) -> dict:
    """Compute the result of a prepared job (a JSON-ready dict)."""
    if kind == "estimate":
        return estimate_json(params["config"])
    if kind == "tune":
        return jsonable(_run_tune(params, ctx))
    if kind == "sweep":
        from flowsim.explore.study import parse_study
        from flowsim.explore.sweep import run_study

        study = parse_study(params["config"], default_name="sweep")
        _track_progress(ctx, lambda: [c for p in study.points for c in _study_configs(study, p)])
        return jsonable(run_study(study, store=ctx.store, jobs=1, scheduler=ctx.scheduler).to_dict())
    if kind in ("validate", "calibrate"):
        _, content = ctx.measurement(params["measurement"])
        with tempfile.TemporaryDirectory(prefix=f"flowsim-{kind}-") as tmp:
            path = Path(tmp) / "runs.csv"  # our own name: an upload never chooses a path
            path.write_bytes(content)
            if kind == "validate":
                from flowsim.validation.runs import validate_runs

                return jsonable(validate_runs(path).to_dict())
            return jsonable(_calibrate(path, params))
    if kind == "collective":
        from flowsim.nccl_models import predict

        op, sizes, layout = _collective_setup(params["config"])
        c = params["config"]
        rows = [predict(op, s, layout, algo=c.get("algo"), proto=c.get("proto")).to_dict() for s in sizes]
        return jsonable({"layout": layout.to_dict(), "nccl_version": layout.nccl_version, "rows": rows})
    raise ConfigError("kind", f"must be one of {', '.join(KINDS)}", kind)


def _calibrate(path: Path, params: Mapping) -> dict:
    """``flowsim calibrate RUNS --json`` of an uploaded runs CSV, with the profile it would write."""
    from flowsim.calibrate import calibrate_runs, profile_of
    from flowsim.cli.calibrate_cmd import tabulated

    runs, skipped, table, keys = tabulated(str(path), params["grid"])
    result = calibrate_runs(runs, table, keys)
    fitted_on = (f"upload {params['measurement']}: {len(runs)} runs of {len({r.source for r in runs})} sources "
                 f"({len(skipped)} rows skipped)")
    profile = profile_of(result, fitted_on, f"POST /v1/jobs calibrate {params['measurement']}")
    return {"parameters": [p.to_dict() for p in profile.parameters],
            "refused": [{"key": k, "rows": n} for k, n in result.refused], "dropped": list(result.dropped),
            "errors": {"uncalibrated_median_pct": result.uncalibrated_pct, "in_sample_median_pct": result.in_sample_pct,
                       "loso_median_pct": result.loso_pct, "runs": len(runs), "skipped": len(skipped)},
            "profile": profile.to_dict()}


def _study_configs(study, point) -> list:
    from flowsim.explore.sweep import _point_configs

    return _point_configs(study, point)[1]


def _track_progress(ctx: Context, configs: Callable[[], list]) -> None:
    """Report progress to ``ctx`` as the store settles ``configs()`` (those already settled count as done)."""
    from flowsim.explore.point import config_key

    keys = {config_key(c) for c in configs()}
    settled = ctx.store.keys() | frozenset(ctx.store.memory_pruned())
    done = [len(keys & settled)]
    total = max(len(keys), 1)

    def on_batch(n: int) -> None:
        done[0] += n
        ctx.progress(min(done[0] / total, 1.0))

    ctx.store.on_batch = on_batch
    ctx.progress(done[0] / total)


def _run_tune(params: Mapping, ctx: Context) -> dict:
    from flowsim.explore.space import LayoutSpace, enumerate_layouts
    from flowsim.explore.tune import job_config, tune

    job = params["config"]
    space = LayoutSpace.default(job_config(job), **params["space"])
    _track_progress(ctx, lambda: list(enumerate_layouts(job, space).configs))
    res = tune(job, space, store=ctx.store, jobs=1, scheduler=ctx.scheduler)
    return {**res.to_dict(params["top"]), "ranked": [p.to_dict() for p in res.ranked]}


def result_frame(kind: str, result: Mapping) -> pd.DataFrame:
    """The main table of a result: estimate stages, tune's ranked layouts, sweep points, validate rows,
    collective sizes (calibrate: its fitted parameters when it has them)."""
    if kind == "estimate":
        return pd.DataFrame(result.get("stages") or [])
    if kind == "tune":
        return pd.DataFrame(result.get("ranked") or [])
    if kind == "sweep":
        return pd.DataFrame(result.get("points") or [])
    return pd.DataFrame(result.get("rows") or result.get("parameters") or [])
