"""The config as pydantic v2 models and JSON Schema, derived from the config dataclasses.

The dataclasses (:class:`~flowsim.config.ModelConfig`, :class:`~flowsim.config.ClusterConfig`,
:class:`~flowsim.config.TrainingConfig`) stay the one definition: each section's pydantic model has one
optional field per dataclass field, typed by it, with ``Literal`` choices taken from the tuple its
``validate()`` checks it against (``self.<field> not in <TUPLE>``), a lower bound from its ``check_ints`` calls,
and the description from the class docstring's Attributes section. Cross-field rules stay in
:func:`flowsim.build_config`, which :func:`validate` calls after the typed check.

>>> from flowsim.config.schema import json_schema
>>> json_schema()["$defs"]["ModelConfigSection"]["properties"]["normalization"]["anyOf"][0]["enum"]
['layernorm', 'rmsnorm']
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import sys
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from flowsim.config.cluster import ClusterConfig
from flowsim.config.model import ModelConfig
from flowsim.config.training import TrainingConfig
from flowsim.errors import ConfigError, did_you_mean

SECTIONS = {"model": ModelConfig, "cluster": ClusterConfig, "training": TrainingConfig}
_TYPES = {"int": int, "float": float, "bool": bool, "str": str, "tuple": list}
_CHOICE = re.compile(r"self\.(\w+) not in ([A-Z_]+)\b")
_INTS = re.compile(r"check_ints\(self,\s*\(([^)]*)\),\s*(\d+)\)")


def _rules(cls) -> tuple[dict, dict]:
    """``({field: choices}, {field: minimum})`` read from ``cls.validate``'s checks."""
    module = sys.modules[cls.__module__]
    src = inspect.getsource(cls.validate)
    choices = {f: tuple(getattr(module, t)) for f, t in _CHOICE.findall(src) if hasattr(module, t)}
    minimum = {}
    for names, low in _INTS.findall(src):
        for name in re.findall(r"\"(\w+)\"", names):
            minimum[name] = int(low)
    return choices, minimum


def _descriptions(cls) -> dict:
    """``{field: text}`` from the numpydoc Attributes section of ``cls``'s docstring."""
    out, names, lines = {}, [], []
    doc = re.sub(r",\n\s*", ", ", inspect.cleandoc(cls.__doc__ or ""))  # names listed over several lines
    body = doc.split("Attributes\n----------\n", 1)[-1]
    for line in body.splitlines() + ["end : x"]:
        m = re.match(r"^([a-z_][\w, ]*) : .+$", line)
        if m:
            for n in names:
                out[n] = " ".join(lines)
            names, lines = [n.strip() for n in m.group(1).split(",")], []
        elif names and line.strip():
            lines.append(line.strip())
    return out


def _section_model(name: str, cls) -> type[BaseModel]:
    choices, minimum = _rules(cls)
    docs = _descriptions(cls)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        typ = _TYPES.get(f.type if isinstance(f.type, str) else f.type.__name__, Any)
        if f.name in choices:
            lit = Literal[choices[f.name]]  # type: ignore[valid-type]
            typ = list[lit] if typ is list else lit
        elif typ is list:
            typ = list[str]
        kw = {"description": docs.get(f.name)}
        if f.name in minimum and typ is int:
            kw["ge"] = minimum[f.name]
        fields[f.name] = (Optional[typ], Field(default=None, **kw))
    fields["preset"] = (Optional[str], Field(default=None, description=f"A built-in {name} preset to start from."))
    doc = inspect.cleandoc(cls.__doc__ or "").splitlines()[0]
    return create_model(f"{cls.__name__}Section", __config__=ConfigDict(extra="forbid"), __doc__=doc, **fields)


@functools.lru_cache(maxsize=1)
def request_model() -> type[BaseModel]:
    """The pydantic model of a whole config: ``model``, ``cluster`` (a preset name or a section) and
    ``training``."""
    model = _section_model("model", ModelConfig)
    cluster = _section_model("cluster", ClusterConfig)
    training = _section_model("training", TrainingConfig)
    return create_model(
        "FlowsimConfig", __config__=ConfigDict(extra="forbid"),
        __doc__="One training job for flowsim: model, cluster and training settings (Megatron-LM names).",
        model=(Union[model, str], Field(description="A model preset name or the model fields.")),
        cluster=(Union[cluster, str], Field(description="A cluster preset name or the cluster fields.")),
        training=(Optional[training], Field(default=None, description="Parallel layout and step settings.")))


def json_schema() -> dict:
    """JSON Schema (draft 2020-12) of a nested config, as :func:`validate` accepts it."""
    return request_model().model_json_schema()


def validate(data: dict):
    """Check ``data`` against the schema, then build the :class:`~flowsim.config.SimConfig`.

    Raises
    ------
    ConfigError
        ``<section>.<field>: <pydantic's rule> (got <value>)`` for the first typed error, or the cross-field
        errors of :func:`flowsim.build_config`.
    """
    from flowsim.config.loader import build_config

    try:
        req = request_model().model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith(("FlowsimConfig", "str", "function")))
        loc = re.sub(r"\.?(Model|Cluster|Training)ConfigSection", "", loc)
        rule = err["msg"]
        if err["type"] == "extra_forbidden":
            section, _, key = loc.rpartition(".")
            known = SECTIONS[section].__dataclass_fields__ if section in SECTIONS else SECTIONS
            rule = f"unknown key{did_you_mean(key, known)}"
        raise ConfigError(loc or "config", rule, err.get("input") if err["type"] != "missing" else None) \
            from None
    return build_config(req.model_dump(exclude_unset=True))
