"""Read configs from YAML/JSON files, mappings and CLI flags; resolve presets and aliases."""
from __future__ import annotations

import copy
import dataclasses
import functools
from pathlib import Path
from typing import Any, Mapping

import yaml

from flowsim.config.cluster import ClusterConfig
from flowsim.config.model import ModelConfig
from flowsim.config.sim import SimConfig
from flowsim.config.training import TrainingConfig
from flowsim.errors import ConfigError, did_you_mean

ALIASES = {
    "tp": "tensor_model_parallel_size",
    "pp": "pipeline_model_parallel_size",
    "vpp": "virtual_pipeline_model_parallel_size",
    "dp": "data_parallel_size",
    "dp_shard": "data_parallel_shard_size",
    "cp": "context_parallel_size",
    "ep": "expert_model_parallel_size",
    "etp": "expert_tensor_parallel_size",
    "num_experts": "num_moe_experts",
    "topk": "moe_router_topk",
    "sp": "sequence_parallel",
    "mbs": "micro_batch_size",
    "gbs": "global_batch_size",
    "seq": "seq_length",
    "gpus": "num_gpus",
    "recompute": "recompute_granularity",
    "distributed_optimizer": "use_distributed_optimizer",
    "schedule": "pipeline_schedule",
    "layers": "num_layers",
    "heads": "num_attention_heads",
    "nics": "nics_per_node",
}
"""Short names accepted everywhere a full Megatron-LM argument name is."""

_SECTIONS = {
    "model": ModelConfig,
    "cluster": ClusterConfig,
    "training": TrainingConfig,
}
_FIELDS = {sec: {f.name: f for f in dataclasses.fields(cls)} for sec, cls in _SECTIONS.items()}
_PRESET_META = ("source", "description")
# Fields present in two sections: the training value overrides the model default.
_SHARED = {"seq_length": "training", "name": None}


def _canonical(key: str) -> str:
    key = key.strip().replace("-", "_")
    return ALIASES.get(key, key)


# The section of every key but ``name``: the first section (model, cluster, training) that has the field, or the
# section _SHARED gives.
_SECTION_OF = {**{k: sec for sec, fields in reversed(_FIELDS.items()) for k in fields if k != "name"},
               **{k: sec for k, sec in _SHARED.items() if sec}}


def _section_of(key: str) -> str:
    sec = _SECTION_OF.get(key)
    if sec is not None:
        return sec
    known = [*ALIASES, *(name for fields in _FIELDS.values() for name in fields)]
    raise ConfigError(key, f"unknown key{did_you_mean(key, known)} (see `flowsim estimate --help` for the accepted "
                      "names)")


_PRESETS = Path(__file__).resolve().parent.parent / "presets"


def _preset_dir(kind: str) -> Path:
    return _PRESETS / kind


def list_presets(kind: str) -> list[str]:
    """Names of the built-in ``models`` or ``clusters`` presets."""
    return sorted(p.name[:-5] for p in _preset_dir(kind).iterdir() if p.name.endswith(".yaml"))


def load_preset(kind: str, name: str) -> dict:
    """Field mapping of a built-in preset (``kind`` is ``models`` or ``clusters``); a fresh copy on every call."""
    return copy.deepcopy(_parsed_preset(kind, name))


@functools.lru_cache(maxsize=256)
def _parsed_preset(kind: str, name: str) -> dict:
    """A built-in preset parsed once per process (the files ship with the package and do not change); callers
    get copies from :func:`load_preset`."""
    path = _preset_dir(kind).joinpath(f"{name}.yaml")
    if not path.is_file():
        field = "model" if kind == "models" else "cluster"
        raise ConfigError(field, f"unknown preset; known: {', '.join(list_presets(kind))}", name)
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    data = {k: v for k, v in data.items() if k not in _PRESET_META}
    data.setdefault("name", name)
    return data


def read_config_file(path: str | Path) -> dict:
    """Parse a YAML or JSON config file into a mapping; errors name the file.

    The file is read under :mod:`flowsim.io_text`'s policy: UTF-8 (a BOM is dropped), JSON without
    ``NaN``/``Infinity`` and without repeated keys, YAML bounded in size and depth.
    """
    from flowsim import io_text

    p = Path(path)
    text = io_text.read_text(p, "config")
    data = io_text.loads_json(text, "config", path) if p.suffix == ".json" else io_text.loads_yaml(text, "config", path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("config", "top level must be a mapping of keys to values", str(path))
    return data


_TYPE_NAMES = {sec: {name: f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
                     for name, f in fields.items()} for sec, fields in _FIELDS.items()}


def _coerce(section: str, key: str, value: Any) -> Any:
    typ = _TYPE_NAMES[section][key]
    if value is None:
        return _FIELDS[section][key].default
    if typ == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, (int,)) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise ConfigError(key, "must be true or false", value)
    if typ == "int":
        if isinstance(value, bool):
            raise ConfigError(key, "must be an integer", value)
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                raise ConfigError(key, "must be an integer", value) from None
        if not isinstance(value, int):
            raise ConfigError(key, "must be an integer", value)
        return value
    if typ == "float":
        if isinstance(value, bool):
            raise ConfigError(key, "must be a number", value)
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(key, "must be a number", value) from None
    if typ == "tuple":
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not all(isinstance(v, str) for v in items):
            raise ConfigError(key, "must be a list of names or a comma-separated string", value)
        return tuple(v.strip().lower() for v in items if v.strip())
    if typ == "str":
        if isinstance(value, int) and not isinstance(value, bool) and key == "selective_ac_option":
            return str(value)
        if not isinstance(value, str):
            raise ConfigError(key, "must be a string", value)
        case_kept = ("gpu", "name", "calibration", "pipeline_model_parallel_layout")  # E, L differ from e, l
        return value.strip().lower() if key not in case_kept else value.strip()
    return value


def _once(seen: dict, key: str, raw_key: str) -> None:
    """Refuse a key given twice in one source (an alias and its full name, or a flat and a nested copy)."""
    if key in seen:
        raise ConfigError(key, "given twice in one source; keep one", f"{seen[key]!r} and {raw_key!r}")
    seen[key] = raw_key


def _flatten(data: Mapping, into: dict) -> None:
    """Put every key of ``data`` into ``into`` under its section; nested section mappings allowed.

    A key may appear once per source: ``{'tp': 2, 'tensor_model_parallel_size': 1}`` is an error, not
    whichever comes last.
    """
    seen: dict = {}
    for raw_key, value in data.items():
        key = _canonical(str(raw_key))
        if not (key in ("model", "cluster", "training") and isinstance(value, Mapping)):
            _once(seen, key, str(raw_key))
        if key in ("model", "cluster") and isinstance(value, str):
            into.setdefault("_presets", {})[key] = value
        elif key in ("model", "cluster", "training") and isinstance(value, Mapping):
            sub = dict(value)
            preset = sub.pop("preset", None)
            if preset is not None:
                into.setdefault("_presets", {})[key] = preset
            for raw, v in sub.items():
                k = _canonical(str(raw))
                if k != "name":
                    _once(seen, k, f"{key}.{raw}")
                if k == "name":
                    into.setdefault(key, {})["name"] = v
                    continue
                sec = _section_of(k)
                into.setdefault(sec, {})[k] = v
        elif key == "swiglu":
            if value:
                into.setdefault("model", {})["activation"] = "swiglu"
        elif key == "name":
            continue
        else:
            sec = _section_of(key)
            into.setdefault(sec, {})[key] = value


def _apply_profile(values: dict, explicit: dict) -> tuple:
    """Fill the framework profile's defaults (:mod:`flowsim.config.profiles`) into ``values`` wherever the
    config sources did not set the key (``explicit``: the merged user keys per section; preset values yield to
    the profile); returns the ``(key, value)`` pairs filled."""
    t = values["training"]
    if not t.get("framework"):
        return ()
    from flowsim.config.profiles import canonical_framework, profile

    t["framework"] = canonical_framework(t["framework"])
    prof = profile(t["framework"], t.get("framework_version", ""))
    t["framework_version"] = prof.framework_version
    applied = []
    for sec, key, value in prof.defaults:
        if key not in explicit[sec]:
            values[sec][key] = _coerce(sec, key, value)
            applied.append((key, values[sec][key]))
    return tuple(applied)


def build_config(*sources: Mapping | str | Path | None, **overrides: Any) -> SimConfig:
    """Merge config sources left to right, then ``overrides``; resolve presets; validate.

    Each source is a mapping or the path of a YAML/JSON file. Keys are Megatron-LM argument names,
    their aliases (:data:`ALIASES`), ``model`` / ``cluster`` preset names, or nested ``model:``,
    ``cluster:``, ``training:`` mappings. Later values win. ``None`` values in ``overrides`` are ignored.

    Raises
    ------
    ConfigError
        For an unknown key or preset, a value of the wrong type, or a broken rule.
    """
    layers: list[dict] = []
    for src in sources:
        if src is None:
            continue
        layers.append(read_config_file(src) if isinstance(src, (str, Path)) else dict(src))
    layers.append({k: v for k, v in overrides.items() if v is not None})

    merged: dict = {"model": {}, "cluster": {}, "training": {}, "_presets": {}}
    for layer in layers:
        flat: dict = {}
        _flatten(layer, flat)
        merged["_presets"].update(flat.pop("_presets", {}))
        for sec in _SECTIONS:
            merged[sec].update(flat.get(sec, {}))

    presets = merged.pop("_presets")
    if "model" not in presets and "num_layers" not in merged["model"]:
        raise ConfigError("model", "required: a preset name or the model fields (num_layers, hidden_size, ...)")
    if "cluster" not in presets and "gpu" not in merged["cluster"]:
        raise ConfigError("cluster", "required: a preset name or the cluster fields (gpu, num_gpus, ...)")

    values = {}
    for sec, kind in (("model", "models"), ("cluster", "clusters"), ("training", None)):
        base = {}
        if kind and sec in presets:
            base = load_preset(kind, str(presets[sec]))
            for k in base:
                if k not in _FIELDS[sec]:
                    raise ConfigError(k, f"unknown key in {sec} preset {presets[sec]}")
        base.update(merged[sec])
        values[sec] = {k: _coerce(sec, k, v) for k, v in base.items()}
    applied = _apply_profile(values, merged)

    if "num_gpus" not in values["cluster"]:
        t = values["training"]
        ways = 1
        for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                  "data_parallel_size"):
            ways *= t.get(k, 1) or 1
        values["cluster"]["num_gpus"] = ways
    try:
        model = ModelConfig(**values["model"])
        cluster = ClusterConfig(**values["cluster"])
        training = TrainingConfig(**values["training"])
    except TypeError as e:  # a required field is missing
        missing = str(e).split("'")[1] if "'" in str(e) else str(e)
        raise ConfigError(missing, "required field is missing") from None
    cfg = SimConfig(model=model, cluster=cluster, training=training, framework_defaults=applied)
    model.validate()
    training.validate()
    cluster.validate()
    cfg = cfg.resolved()  # a new training config; the model and cluster are the ones just checked
    cfg.training.validate()
    cfg.validate_across()
    return cfg
