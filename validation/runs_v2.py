"""Runs schema v2: the optional framework-setting columns and what each filled cell sets in the config.

A ``framework_version`` that flowsim has a profile of (:mod:`flowsim.config.profiles`; else the nearest listed release
of its line, :func:`flowsim.config.profiles.nearest_release`) selects that release's
defaults; every filled :data:`V2_SETTINGS` cell sets its config key and overrides the profile (an empty cell
leaves the profile's default). A cell with a wrong value raises a ConfigError naming the column and the allowed
values, which skips its row. MoE rows also read ``etp`` and ``moe_token_dispatcher`` (:func:`_expert_layout`).
"""
from __future__ import annotations

import math
from typing import Mapping

from flowsim.config.layout import LEGACY_EXPERT_RELEASES
from flowsim.errors import ConfigError
from flowsim.validation.runs_read import _int_or_value, _known


def _flag(column: str, text: str) -> bool:
    if text not in ("0", "1"):
        raise ConfigError(column, "must be 0 or 1", text)
    return text == "1"


def _probability(column: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 <= value < 1.0:
        raise ConfigError(column, "must be a probability in [0, 1)", text)
    return value


def _choice(column: str, text: str, allowed: tuple) -> str:
    if text not in allowed:
        raise ConfigError(column, f"must be one of {', '.join(allowed)}", text)
    return text


V2_SETTINGS = {
    "attention_impl": lambda v: {"use_flash_attn": _choice("attention_impl", v, ("flash", "unfused")) == "flash"},
    "attention_dropout": lambda v: {"attention_dropout": _probability("attention_dropout", v)},
    "hidden_dropout": lambda v: {"hidden_dropout": _probability("hidden_dropout", v)},
    "overlap_grad_reduce": lambda v: {"overlap_grad_reduce": _flag("overlap_grad_reduce", v)},
    "overlap_param_gather": lambda v: {"overlap_param_gather": _flag("overlap_param_gather", v)},
    "tp_comm_overlap": lambda v: {"tp_comm_overlap": _flag("tp_comm_overlap", v)},
    # the schema does not say the scope: per-layer graphs, the smaller of the two savings
    "cuda_graphs": lambda v: {"cuda_graphs": "layer" if _flag("cuda_graphs", v) else "none"},
    # model-level torch.compile: Inductor's fused kernels at its launcher's host cost; 0 leaves the profile's
    "torch_compile": lambda v: {"kernel_fusion": "fused", "host_overhead": "compiled"}
    if _flag("torch_compile", v) else {},
    "grad_reduce_dtype": lambda v: {"grad_reduce_dtype": _choice("grad_reduce_dtype", v, ("fp32", "bf16", "fp16"))},
}
"""Runs schema v2 column -> the config keys a filled cell sets (ConfigError naming the column for a bad cell).
A stated cell overrides the framework profile's default; an empty cell leaves the profile's."""


def _v2_settings(row: Mapping, assumptions: list) -> dict:
    """Config keys of the row's framework profile (``framework`` / ``framework_version``, when flowsim has a
    profile of the release) and of its filled :data:`V2_SETTINGS` cells, with one assumption line saying which
    settings the row states (the profile's defaults are listed after build_config has applied them)."""
    out, stated = {}, []
    release = str(row.get("framework_version", "") or "")
    if release:
        from flowsim.config.profiles import find_release

        prof = find_release(release)
        if prof is not None:
            out.update(framework=prof.framework, framework_version=prof.framework_version)
            if prof.framework_version != release:
                assumptions.append(f"framework_version: no flowsim profile of {release}; the nearest release of "
                                   f"its line, {prof.framework_version}")
        else:
            assumptions.append(f"framework_version: no flowsim profile of {release} (settings from the row only)")
    for column, to_config in V2_SETTINGS.items():
        text = str(row.get(column, "") or "").strip().lower()
        if text:
            out.update(to_config(text))
            stated.append(f"{column}={text}")
    if stated:
        assumptions.append("settings from the row: " + ", ".join(stated))
    return out


def _expert_layout(row: Mapping, assumptions: list) -> dict:
    """Expert tensor parallelism and token dispatcher of a MoE row from the v2 columns ``etp`` and
    ``moe_token_dispatcher`` (empty: ETP 1 and Megatron-LM's default ``alltoall``), each stated in the row's
    assumptions whether read or assumed."""
    etp = row.get("etp", math.nan)
    out = {}
    if _known(etp) and etp != "":
        out["expert_tensor_parallel_size"] = _int_or_value(etp)
        assumptions.append(f"etp: {out['expert_tensor_parallel_size']} (from the CSV)")
    else:
        out["expert_tensor_parallel_size"] = 1
        assumptions.append("etp: empty, assumed 1")
    dispatcher = row.get("moe_token_dispatcher", "") or ""
    if dispatcher in ("alltoall", "allgather"):
        out["moe_token_dispatcher_type"] = dispatcher
        assumptions.append(f"moe_token_dispatcher: {dispatcher} (from the CSV)")
    elif dispatcher == "deepep":
        out.update(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="deepep")
        assumptions.append("moe_token_dispatcher: flex with DeepEP (from the CSV)")
    elif dispatcher == "flex":
        # the runs README: "flex (Megatron flex dispatcher, e.g. HybridEP backend)"
        out.update(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep")
        assumptions.append("moe_token_dispatcher: flex (from the CSV), backend assumed HybridEP")
    elif dispatcher:
        out["moe_token_dispatcher_type"] = dispatcher  # build_config names the allowed values
    else:
        out["moe_token_dispatcher_type"] = "alltoall"
        assumptions.append("moe_token_dispatcher: empty, assumed alltoall (Megatron-LM's default)")
    release = row.get("framework_version", "") or ""
    legacy = release in LEGACY_EXPERT_RELEASES
    out["expert_rank_order"] = "tp-cp-ep-dp-pp" if legacy else "tp-ep-dp-pp"
    assumptions.append(f"expert placement: {out['expert_rank_order']} (" + (
        f"{release} runs {LEGACY_EXPERT_RELEASES[release]}" if legacy else
        f"{release or 'no release stated'}: Megatron-core >= 0.10 order") + ")")
    return out
