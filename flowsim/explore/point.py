"""One evaluated design point: the config's identity (a hash), its layout and the figures a study ranks by.

:func:`evaluate` is the unit of work that the local process pool and Dask workers run: it checks memory
first (cheap: the workload tables and :func:`flowsim.step.memory.stage_memory`, no timing) and only simulates
configs that fit. It calls nothing but the public :func:`flowsim.simulate` to time a step, so a later
engine (flow-level network simulation) plugs in unchanged.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

from flowsim._version import __version__
from flowsim.config import SimConfig
from flowsim.gpu_specs import get_gpu
from flowsim.explore.time_limit import time_limit
from flowsim.step.simulate import simulate, stage_memories
from flowsim.explore.space import Layout
from flowsim.model.workload import build_workload

_NOT_BREAKDOWN = ("step_time_s", "tokens_per_s")  # the other ``*_s`` keys of to_dict() are breakdown components


def config_dict(cfg: SimConfig) -> dict:
    """The full normalised config ``cfg`` as a plain mapping (resolved: dp, sequence length and batch filled in)."""
    return {"model": dataclasses.asdict(cfg.model), "cluster": dataclasses.asdict(cfg.cluster),
            "training": dataclasses.asdict(cfg.training)}


_ATOMS = (str, int, float, bool, type(None))
# JSON text of the model and cluster sections, by identity: the configs of a sweep or tune share a handful of
# section objects (immutable frozen dataclasses; kept here so that their ids stay theirs). Not by value: 400 and
# 400.0 are equal fields with different JSON, hence different keys.
_SECTION_JSON: dict = {}
_SECTION_JSON_SIZE = 64


# '"name": <value JSON>' of a field, by _item_key, for the values whose JSON the key fixes (atoms and tuples of
# atoms other than NaN): the configs of a tune differ in a few of their ~50 training fields
_ITEM_JSON: dict = {}
_ITEM_JSON_SIZE = 1 << 16
_EXACT_TYPES = (str, int, bool, type(None))
_FIELD_NAMES: dict = {}  # a section class's field names, sorted


def _item_key(name: str, value) -> tuple:
    """The key of a field's text: name, type and value, and what equality leaves out of the value's JSON: a float
    zero's sign (0.0 == -0.0), a tuple's element types ((1, 2) == (1.0, 2))."""
    t = type(value)
    if t is tuple:
        return name, t, value, tuple(map(type, value))
    return (name, t, value) if t is not float or value else (name, t, value, str(value))


def _item_json(name: str, value) -> str:
    """``'"name": <value JSON>'``, kept when its key fixes it (so that a lookup by an equal key can only find the
    same text): a str, int, bool or None, a float other than NaN, a tuple of str, int, bool or None."""
    text = f"{json.dumps(name)}: {json.dumps(value, default=str)}"
    t = type(value)
    if (t in _EXACT_TYPES or (t is float and value == value)
            or (t is tuple and all(type(x) in _EXACT_TYPES for x in value))):
        if len(_ITEM_JSON) >= _ITEM_JSON_SIZE:
            _ITEM_JSON.clear()
        _ITEM_JSON[_item_key(name, value)] = text
    return text


def _section_json(obj) -> str:
    """``json.dumps(dataclasses.asdict(obj), sort_keys=True, default=str)`` for a config section ``obj``: when every
    field is an atom or a tuple of atoms (as in every shipped config section), the items in sorted order, each
    item's text built once per value (:func:`_item_json`), else the dump of ``asdict``."""
    names = _FIELD_NAMES.get(type(obj))
    if names is None:
        names = _FIELD_NAMES[type(obj)] = tuple(sorted(f.name for f in dataclasses.fields(obj)))
    get, items = _ITEM_JSON.get, []
    for n in names:
        v = getattr(obj, n)
        try:
            text = get(_item_key(n, v))  # a hit is an atom or a tuple of atoms: only those are kept
        except TypeError:  # unhashable: a list or a mapping
            text = None
        if text is None:
            if not (isinstance(v, _ATOMS) or (type(v) is tuple and all(isinstance(x, _ATOMS) for x in v))):
                return json.dumps(dataclasses.asdict(obj), sort_keys=True, default=str)
            text = _item_json(n, v)
        items.append(text)
    return "{" + ", ".join(items) + "}"


def _shared_section_json(obj) -> str:
    """:func:`_section_json` of ``obj``, computed once per object."""
    hit = _SECTION_JSON.get(id(obj))
    if hit is not None and hit[0] is obj:
        return hit[1]
    text = _section_json(obj)
    if len(_SECTION_JSON) >= _SECTION_JSON_SIZE:
        _SECTION_JSON.clear()
    _SECTION_JSON[id(obj)] = (obj, text)
    return text


def config_json(cfg: SimConfig) -> str:
    """``json.dumps(config_dict(cfg), sort_keys=True, default=str)``, assembled from the JSON of each section
    (keys in sorted order), the model's and cluster's built once per object: the text the results store keeps."""
    return (f'{{"cluster": {_shared_section_json(cfg.cluster)}, "model": {_shared_section_json(cfg.model)}, '
            f'"training": {_section_json(cfg.training)}}}')


def config_key(cfg: SimConfig) -> str:
    """SHA-256 (hex) of the normalised config ``cfg`` and the flowsim version: the results store's key.

    It hashes ``json.dumps({"config": config_dict(cfg), "flowsim": __version__}, sort_keys=True, default=str)``
    (built from :func:`config_json`).
    """
    text = f'{{"config": {config_json(cfg)}, "flowsim": {json.dumps(__version__)}}}'
    return hashlib.sha256(text.encode()).hexdigest()


def peak_memory_bytes(cfg: SimConfig) -> float:
    """Peak memory of the most loaded GPU of ``cfg``, bytes (the figure :func:`flowsim.simulate` reports).

    The stage memories go to :func:`flowsim.simulate`'s own cache (same key, same builder), so a config that
    passes the memory check is not accounted a second time when it is simulated.
    """
    return max(m.total_bytes for m in stage_memories(cfg, build_workload(cfg)))


@dataclass(frozen=True)
class PointResult:
    """The figures of one simulated config that sweeps store and rank.

    Attributes
    ----------
    key : str
        :func:`config_key` of the config.
    layout : Layout
        Its parallel layout.
    step_time_s : float
        Seconds per optimizer step.
    tokens_per_s : float
        Job throughput, tokens per second.
    mfu : float
        Model FLOPs utilisation (fraction; convention of :class:`flowsim.Result`).
    memory_bytes_per_gpu, memory_capacity_bytes : float
        Peak memory of the most loaded GPU and its capacity, bytes.
    fits_memory : bool
        ``memory_bytes_per_gpu <= memory_capacity_bytes``.
    breakdown : dict[str, float]
        Critical pipeline stage's seconds per step by component (``compute_s``, ``tp_comm_s``, ...,
        ``bubble_s``, ``optimizer_s``: the seconds entries of :meth:`flowsim.Result.breakdown`).
    """

    key: str
    layout: Layout
    step_time_s: float
    tokens_per_s: float
    mfu: float
    memory_bytes_per_gpu: float
    memory_capacity_bytes: float
    fits_memory: bool
    breakdown: dict

    @property
    def exposed_comm_share(self) -> float:
        """Exposed (not hidden) communication of the critical stage (every ``*_comm_s`` component) / step time."""
        return sum(v for k, v in self.breakdown.items() if k.endswith("_comm_s")) / self.step_time_s

    @classmethod
    def of(cls, cfg: SimConfig, result, key: str | None = None) -> "PointResult":
        """Summarise ``result``, the :class:`flowsim.Result` of ``cfg`` (``key``: its config_key, computed if None)."""
        b = result.breakdown()
        return cls(key=key or config_key(cfg), layout=Layout.of(cfg), step_time_s=result.step_time_s,
                   tokens_per_s=result.tokens_per_s, mfu=result.mfu,
                   memory_bytes_per_gpu=result.memory_bytes_per_gpu,
                   memory_capacity_bytes=result.memory_capacity_bytes, fits_memory=result.fits_memory,
                   breakdown={k: float(v) for k, v in b.items() if k.endswith("_s")})

    def to_dict(self) -> dict:
        """Flat JSON view: layout fields, figures, breakdown components and the exposed-comm share."""
        d = {"key": self.key, **self.layout.to_dict()}
        d.update(step_time_s=self.step_time_s, tokens_per_s=self.tokens_per_s, mfu=self.mfu,
                 memory_bytes_per_gpu=self.memory_bytes_per_gpu, memory_capacity_bytes=self.memory_capacity_bytes,
                 fits_memory=self.fits_memory, exposed_comm_share=self.exposed_comm_share)
        d.update(self.breakdown)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "PointResult":
        """Inverse of :meth:`to_dict`."""
        layout = Layout(**{f.name: d[f.name] for f in dataclasses.fields(Layout)})
        return cls(key=d["key"], layout=layout, step_time_s=d["step_time_s"], tokens_per_s=d["tokens_per_s"],
                   mfu=d["mfu"], memory_bytes_per_gpu=d["memory_bytes_per_gpu"],
                   memory_capacity_bytes=d["memory_capacity_bytes"], fits_memory=bool(d["fits_memory"]),
                   breakdown={k: v for k, v in d.items() if k.endswith("_s") and k not in _NOT_BREAKDOWN})


@dataclass(frozen=True)
class Outcome:
    """What :func:`evaluate` did with one config.

    Attributes
    ----------
    index : int
        Position of the config in the batch submitted.
    status : str
        ``evaluated``, ``stored`` (its key was already in the store: not recomputed) or ``memory``
        (pruned: does not fit).
    key : str
        :func:`config_key` of the config.
    point : PointResult or None
        The figures when ``status`` is ``evaluated``.
    memory_bytes : float
        Peak memory per GPU of the config, bytes (NaN when ``stored``).
    """

    index: int
    status: str
    key: str
    point: PointResult | None = None
    memory_bytes: float = float("nan")


def evaluate(batch: list, stored_keys=frozenset(), prune_memory: bool = True, known_pruned=None,
             time_limit_s: float = 0.0) -> list:
    """Evaluate ``batch``, a list of (index, SimConfig) pairs; returns one :class:`Outcome` each.

    Configs whose key is in ``stored_keys`` are skipped (status ``stored``); with ``prune_memory`` a config
    that does not fit in GPU memory is not simulated (status ``memory``), and one whose key is in
    ``known_pruned`` (a mapping of key to peak memory bytes from an earlier check) is not even re-checked.
    ``time_limit_s`` > 0 bounds each simulation's wall time (:func:`flowsim.explore.time_limit.time_limit`).
    """
    out = []
    for index, cfg in batch:
        key = config_key(cfg)
        if key in stored_keys:
            out.append(Outcome(index, "stored", key))
            continue
        if prune_memory and known_pruned and key in known_pruned:
            out.append(Outcome(index, "memory", key, memory_bytes=known_pruned[key]))
            continue
        if prune_memory:
            mem = peak_memory_bytes(cfg)
            if mem > get_gpu(cfg.cluster.gpu).hbm_bytes:
                out.append(Outcome(index, "memory", key, memory_bytes=mem))
                continue
        with time_limit(time_limit_s):
            result = simulate(cfg)
        point = PointResult.of(cfg, result, key)
        out.append(Outcome(index, "evaluated", key, point, point.memory_bytes_per_gpu))
    return out
