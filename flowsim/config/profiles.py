"""Framework profiles: the defaults a framework release runs with, from ``data/framework_profiles.csv``.

One row per framework release (``framework``, ``framework_version``), each default citing the framework's
source file at that release (``sources`` column). ``framework`` (and optionally ``framework_version``) in a
config select a row; :func:`flowsim.config.build_config` fills every key of the row the config does not set
itself (explicit keys always win; the profile wins over a model preset, which describes the model, not the
run). An empty cell means the release has no single default (it differs by model recipe or workload): the
key keeps flowsim's own default. Without ``framework_version`` the framework's newest release in the file is
used (rows are in release order). A release the file does not list takes the nearest listed release of its
line (:func:`nearest_release`: ``nemo-24.12`` -> ``nemo-24.07``, the newest not newer), with a warning, so a job
on a newer or older container keeps its framework's defaults, kernel stack and calibration family.

Columns and the config keys they set (``data/pipeline_profiles.csv`` holds the last two, per release):

* ``attention_impl`` (``flash`` / ``unfused``) -> ``use_flash_attn``;
* ``attention_dropout``, ``hidden_dropout`` -> the model keys of the same names;
* ``kernel_fusion`` (``fused``: Megatron / Transformer Engine kernels, ``eager``: plain PyTorch modules);
* ``overlap_grad_reduce``, ``overlap_param_gather``, ``tp_comm_overlap`` (0/1);
* ``cuda_graphs`` (``none``, ``layer``, ``full_iteration``), ``grad_reduce_dtype`` (``fp32``, ``bf16``, ``fp16``);
* ``host_overhead``: the host-cost mode (:mod:`flowsim.model.host_costs`);
* ``fsdp_version`` (1: flat-buffer FSDP / ZeRO-3, 2: FSDP2 per-parameter sharding);
* ``fp8_recipe`` (``delayed``, ``tensorwise``, ``rowwise``, ``blockwise``, ``mxfp8``);
* ``cross_entropy_impl`` (``fused``, ``megatron``, ``fp32_upcast``: :mod:`flowsim.model.loss`);
* ``optimizer_impl`` (``fused``, ``foreach``, ``for_loop``: :mod:`flowsim.step.optimizer`);
* ``cp_comm_type`` (``p2p``, ``all_gather``: Transformer Engine's context parallelism; ``torch``: PyTorch's);
* ``tp_overlap_impl`` (``userbuffers``: Transformer Engine; ``symm_mem``: PyTorch's async TP);
* ``flash_attn_unpad`` (0/1): FlashAttention on unpadded copies of q, k, v (llm-foundry's ``flash_attn_fn``);
* ``fused_qkv``, ``fused_gate_up`` (0/1): one GEMM for the q, k, v projections / a gated MLP's gate and up
  projections (empty: flowsim's default, fused as Megatron-LM runs them), or separate linear layers;
* ``fp8_tp_gather`` (0/1): torchao's float8 tensor parallelism (FP8 sequence-parallel all-gathers, tensorwise);
* ``p2p_sync`` (``off``, ``on``, ``batched``): the CPU waits for the GPU at every pipeline send and receive;
* ``pipeline_engine`` (``megatron``, ``deepspeed``, ``deepspeed-0.6``): what runs the pipeline schedule.
"""
from __future__ import annotations

import csv
import functools
import re
import warnings
from importlib import resources
from typing import NamedTuple

from flowsim.errors import ConfigError, FlowsimWarning

FRAMEWORK_ALIASES = {"nemo": "megatron-core", "megatron-bridge": "megatron-core"}
"""Names accepted for ``framework`` besides the file's own: NeMo and Megatron-Bridge run Megatron-core."""

PROFILE_KEYS = {
    # column: (config section, config key, cell -> value)
    "attention_impl": ("training", "use_flash_attn", lambda v: {"flash": True, "unfused": False}[v]),
    "attention_dropout": ("model", "attention_dropout", float),
    "hidden_dropout": ("model", "hidden_dropout", float),
    "kernel_fusion": ("training", "kernel_fusion", str),
    "overlap_grad_reduce": ("training", "overlap_grad_reduce", lambda v: bool(int(v))),
    "overlap_param_gather": ("training", "overlap_param_gather", lambda v: bool(int(v))),
    "tp_comm_overlap": ("training", "tp_comm_overlap", lambda v: bool(int(v))),
    "cuda_graphs": ("training", "cuda_graphs", str),
    "grad_reduce_dtype": ("training", "grad_reduce_dtype", str),
    "host_overhead": ("training", "host_overhead", str),
    "fsdp_version": ("training", "fsdp_version", int),
    "fp8_recipe": ("training", "fp8_recipe", str),
    "cross_entropy_impl": ("training", "cross_entropy_impl", str),
    "optimizer_impl": ("training", "optimizer_impl", str),
    "cp_comm_type": ("training", "cp_comm_type", str),
    "tp_overlap_impl": ("training", "tp_overlap_impl", str),
    "flash_attn_unpad": ("training", "flash_attn_unpad", lambda v: bool(int(v))),
    "fused_qkv": ("training", "fused_qkv", lambda v: bool(int(v))),
    "fused_gate_up": ("training", "fused_gate_up", lambda v: bool(int(v))),
    "fp8_tp_gather": ("training", "fp8_tp_gather", lambda v: bool(int(v))),
}
"""Profile columns -> (config section, key, conversion of a non-empty cell)."""

PIPELINE_KEYS = {
    "p2p_sync": ("training", "p2p_sync", str),
    "pipeline_engine": ("training", "pipeline_engine", str),
}
"""Columns of ``data/pipeline_profiles.csv`` (how a release runs its pipeline, one row per release of
``framework_profiles.csv``, with its own ``sources``) -> (config section, key, conversion)."""


class Profile(NamedTuple):
    """One framework release.

    Attributes
    ----------
    framework, framework_version : str
        The row's keys.
    defaults : tuple[tuple[str, str, object], ...]
        ``(section, key, value)`` for every non-empty cell, in column order.
    sources : str
        Where each default comes from (file and release of the framework's code or configs).
    """

    framework: str
    framework_version: str
    defaults: tuple
    sources: str


def _table(name: str) -> list:
    text = resources.files("flowsim.config").joinpath(f"data/{name}").read_text(encoding="utf-8")
    return list(csv.DictReader(text.splitlines()))


def _cells(r: dict, keys: dict) -> tuple:
    return tuple((sec, key, conv(r[col].strip())) for col, (sec, key, conv) in keys.items() if r[col].strip())


@functools.lru_cache(maxsize=1)
def _rows() -> tuple:
    pipe = {(r["framework"], r["framework_version"]): r for r in _table("pipeline_profiles.csv")}
    out = []
    for r in _table("framework_profiles.csv"):
        p = pipe.get((r["framework"], r["framework_version"]))
        defaults = _cells(r, PROFILE_KEYS) + (_cells(p, PIPELINE_KEYS) if p else ())
        out.append(Profile(r["framework"], r["framework_version"], defaults,
                           r["sources"] + (f"; {p['sources']}" if p else "")))
    return tuple(out)


def frameworks() -> tuple:
    """Framework names of the data file, in file order (aliases: :data:`FRAMEWORK_ALIASES`)."""
    return tuple(dict.fromkeys(p.framework for p in _rows()))


def releases(framework: str) -> tuple:
    """Releases of ``framework`` in the data file, oldest first."""
    name = canonical_framework(framework)
    return tuple(p.framework_version for p in _rows() if p.framework == name)


def canonical_framework(framework: str) -> str:
    """The data file's name of ``framework`` (an alias resolved); ConfigError naming the allowed values."""
    name = FRAMEWORK_ALIASES.get(framework, framework)
    if name not in frameworks():
        allowed = ", ".join(frameworks() + tuple(FRAMEWORK_ALIASES))
        raise ConfigError("framework", f"unknown framework; known: {allowed}", framework)
    return name


def profile(framework: str, framework_version: str = "") -> Profile:
    """The profile of a release (the framework's newest one when ``framework_version`` is empty).

    Raises
    ------
    ConfigError
        For an unknown framework, or a release the file does not list for it (the message lists the known ones).
    """
    name = canonical_framework(framework)
    rows = [p for p in _rows() if p.framework == name]
    if not framework_version:
        return rows[-1]
    found = _resolve(framework_version, rows)
    if found is None:
        raise ConfigError("framework_version", f"unknown release of {name}; known: {', '.join(releases(name))} "
                          "(or a later or earlier release of one of their lines, e.g. nemo-24.12)", framework_version)
    return found


def find_release(framework_version: str) -> Profile | None:
    """The profile of this release name, whatever its framework: the listed release itself, else the nearest
    listed release of its line (:func:`nearest_release`), else, for a bare framework name (the runs schema's
    ``framework_version`` when a source names no release), that framework's newest release (both with a
    warning); None if none of these."""
    name = FRAMEWORK_ALIASES.get(framework_version, framework_version)
    rows = [p for p in _rows() if p.framework == name] if name in frameworks() else list(_rows())
    return _resolve(framework_version, rows)


def _resolve(framework_version: str, rows) -> Profile | None:
    for p in rows:
        if p.framework_version == framework_version:
            return p
    if FRAMEWORK_ALIASES.get(framework_version, framework_version) == rows[0].framework:
        warnings.warn(f"framework_version {framework_version} names no release; using {rows[-1].framework_version}, "
                      "the newest listed release of that framework", FlowsimWarning, stacklevel=3)
        return rows[-1]
    near = nearest_release(framework_version, [p.framework_version for p in rows])
    if near is None:
        return None
    warnings.warn(f"framework_version {framework_version}: no profile of this release; using {near[0]}, the "
                  f"nearest {near[1]} release of its line", FlowsimWarning, stacklevel=3)
    return next(p for p in rows if p.framework_version == near[0])


_NUMBER = re.compile(r"\d+")


def release_line(name: str) -> tuple:
    """``(line, version)`` of a release name: the text before its first number, and its numbers in order
    (``nemo-24.03.01`` -> ``("nemo-", (24, 3, 1))``, ``mlperf-v3.1-nemo`` -> ``("mlperf-v", (3, 1))``); a name
    without a number is its own line with version ``()``."""
    first = _NUMBER.search(name)
    if first is None:
        return name, ()
    return name[:first.start()], tuple(int(n) for n in _NUMBER.findall(name))


def nearest_release(requested: str, known) -> tuple | None:
    """The release of ``known`` on ``requested``'s line (:func:`release_line`) nearest to it: the newest one not
    newer (its defaults are what the requested release inherited unless it changed them), else the oldest newer
    one. Returns ``(release, "older" | "newer")``, or None when ``requested`` has no version or no listed
    release shares its line."""
    line, version = release_line(requested.strip().lower())
    if not version:
        return None
    same = sorted((v, k) for k, (ln, v) in ((k, release_line(k)) for k in known) if ln == line and v)
    older = [k for v, k in same if v <= version]
    if older:
        return older[-1], "older"
    return (same[0][1], "newer") if same else None
