"""What every importer returns, and the architecture keys none of them may default silently."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Mapping

ARCHITECTURE_KEYS = ("activation", "normalization", "position_embedding", "add_bias_linear",
                     "untie_embeddings_and_output_weights", "hidden_dropout", "num_query_groups", "kv_channels",
                     "vocab_size")
"""Model fields whose default in :class:`flowsim.config.ModelConfig` (GPT-3 style) is wrong for most current
models: an importer either reads them from its file or fills them from the model family and says so."""


@dataclass(frozen=True)
class Imported:
    """A config read from another framework's file, ready for :func:`flowsim.build_config`.

    Attributes
    ----------
    config : dict
        flowsim keys: nested ``model`` (and ``training``, ``cluster`` where the file has them) mappings,
        usable as a source of :func:`flowsim.build_config`.
    source : str
        The file (or ``<args>``) it was read from.
    defaults : tuple[tuple[str, object, str], ...]
        ``(key, value, whose)``: fields the file does not give, filled from its model family's or
        framework's values (``whose`` names them, e.g. ``Megatron-LM arguments.py``).
    ignored : tuple[str, ...]
        Keys of the file with no effect on the step estimate (optimizer, data, logging...).
    """

    config: dict
    source: str
    defaults: tuple = field(default_factory=tuple)
    ignored: tuple = field(default_factory=tuple)

    def notes(self) -> list[str]:
        """At most two lines for stderr: which values came from the family's defaults, what was ignored."""
        out = []
        if self.defaults:
            by_whose: dict = {}
            for key, value, whose in self.defaults:
                by_whose.setdefault(whose, []).append(f"{key}={_show(value)}")
            out.append("not in " + self.source + ", used " + "; ".join(
                f"{whose}: {', '.join(items)}" for whose, items in by_whose.items()))
        if self.ignored:
            out.append(f"ignored (no effect on the step estimate): {', '.join(self.ignored)}")
        return out

    def defaulted(self) -> dict:
        """``{key: value}`` of the fields filled from defaults."""
        return {k: v for k, v, _ in self.defaults}


def _show(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def fill(model: dict, family: dict, whose: str, keys=ARCHITECTURE_KEYS) -> list:
    """Put ``family[k]`` into ``model`` for every key of ``keys`` the model lacks; returns the defaults used."""
    used = []
    for k in keys:
        if k not in model and k in family:
            model[k] = family[k]
            used.append((k, family[k], whose))
    return used


def unstated_architecture(*sources: Mapping) -> dict:
    """``{key: flowsim's default}`` of the :data:`ARCHITECTURE_KEYS` a hand-written model leaves out.

    ``sources`` are the mappings :func:`flowsim.build_config` merges (a config file's contents, flags). Empty
    when any of them names a model preset (the preset holds every such key) or gives no model fields at all.
    ``num_query_groups`` and ``kv_channels`` are left out: their defaults (one group per head, hidden / heads)
    follow from the other fields.
    """
    from flowsim.config.loader import ALIASES
    from flowsim.config.model import ModelConfig

    given: set = set()
    for src in sources:
        for raw, value in src.items():
            key = ALIASES.get(str(raw).strip().replace("-", "_"), str(raw).strip().replace("-", "_"))
            if key == "model" and isinstance(value, str):
                return {}
            if key == "model" and isinstance(value, Mapping):
                if "preset" in value:
                    return {}
                given |= {ALIASES.get(str(k).replace("-", "_"), str(k).replace("-", "_")) for k in value}
            elif value is not None:
                given.add("activation" if key == "swiglu" else key)
    if "num_layers" not in given:
        return {}
    defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    return {k: defaults[k] for k in ARCHITECTURE_KEYS
            if k not in given and k not in ("num_query_groups", "kv_channels")}
