"""Invariants every simulation result must hold, checked after the step is priced.

A result that breaks one is flowsim's bug, not the user's: it is refused with :class:`InvariantError`, whose
one-line message names the broken invariant and the config that produced it, instead of a wrong number
being printed. Checked (``Result`` conventions, :mod:`flowsim.step.result`):

* step time, tokens/s, FLOPs and memory are finite; the step time is > 0;
* ``0 < mfu <= hfu <= r``: hardware FLOPs include recompute, so they are never below the model FLOPs, and no
  GPU runs above its dense peak: ``r`` = 1 for 16-bit GEMMs, the FP8 (FP4) peak over the 16-bit one for FP8
  (FP4) GEMMs, since MFU divides by the 16-bit peak (:func:`gemm_peak_ratio`). With token-drop routing (``moe_expert_capacity_factor`` > 0) the model FLOPs
  count every routed token, dropped or not (Megatron-LM's ``num_floating_point_operations``), so there only
  ``mfu <= 1`` and ``hfu <= 1`` are checked;
* every stage component (compute, exposed communication, bubble, optimizer) is finite, >= 0 and not longer
  than the step; every collective's time is finite and >= 0.
"""
from __future__ import annotations

import dataclasses
import math

# Relative slack for float rounding: the quantities are sums of many float64 terms (~1e-16 each).
RTOL = 1e-9

COMPONENTS = ("compute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s", "pp_comm_s", "dp_comm_s", "bubble_s",
              "optimizer_s")


class InvariantError(RuntimeError):
    """A simulation result broke an invariant (a flowsim bug); the message names the config."""


def config_label(config: dict) -> str:
    """The fields of a resolved config (``Result.config``) that differ from their defaults, ``key=value``."""
    from flowsim.config import ClusterConfig, ModelConfig, TrainingConfig

    parts = []
    for section, cls in (("model", ModelConfig), ("cluster", ClusterConfig), ("training", TrainingConfig)):
        values = config.get(section, {})
        for f in dataclasses.fields(cls):
            if f.name not in values:
                continue
            default = f.default if f.default is not dataclasses.MISSING else None
            v = values[f.name]
            if v != default:
                parts.append(f"{f.name}={','.join(map(str, v)) if isinstance(v, (list, tuple)) else v}")
    return " ".join(parts)


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


LOW_PRECISION_PEAK = {"fp8": "fp8", "nvfp4": "fp4", "mxfp4": "fp4"}
"""Precision of the GEMMs -> the datasheet peak they run against (bf16 and fp16 GEMMs: the MFU peak itself)."""


def gemm_peak_ratio(result) -> float:
    """Largest MFU/HFU a step can reach: the GEMMs' dense peak over the 16-bit peak MFU divides by (1 for
    bf16/fp16; FP8 and FP4 GEMMs run at up to 2x and 4x the FLOP rate, so their MFU may exceed 1)."""
    from flowsim.gpu_specs import get_gpu

    precision = result.config.get("training", {}).get("precision", "bf16")
    if precision not in LOW_PRECISION_PEAK:
        return 1.0
    gpu = get_gpu(result.config["cluster"]["gpu"])
    return max(1.0, gpu.peak(LOW_PRECISION_PEAK[precision]) / result.peak_flop_per_s)


def violations(result) -> list[str]:
    """Every invariant ``result`` (a :class:`flowsim.Result`) breaks, as short texts; empty when all hold."""
    out = []
    step = result.step_time_s
    if not (_finite(step) and step > 0):
        return [f"step_time_s must be finite and > 0 (got {step})"]
    for name in ("tokens_per_s", "model_flops", "hardware_flops", "tflops_per_gpu", "memory_bytes_per_gpu"):
        v = getattr(result, name)
        if not (_finite(v) and v >= 0):
            out.append(f"{name} must be finite and >= 0 (got {v})")
    mfu, hfu = result.mfu, result.hfu
    drops = bool(result.config.get("model", {}).get("moe_expert_capacity_factor"))
    top = gemm_peak_ratio(result)
    if not (_finite(mfu) and _finite(hfu) and 0 < mfu <= top * (1 + RTOL) and 0 < hfu <= top * (1 + RTOL)
            and (drops or mfu <= hfu * (1 + RTOL))):
        out.append(f"0 < MFU <= HFU <= {top:.3g} must hold (got MFU {mfu:.4g}, HFU {hfu:.4g})")
    limit = step * (1 + RTOL)
    for s in result.stages:
        for name in COMPONENTS:
            v = getattr(s, name)
            if not (_finite(v) and -step * RTOL <= v <= limit):
                out.append(f"stage {s.stage} {name} must be finite, >= 0 and <= the step time {step:.6g} s "
                           f"(got {v})")
        if not (_finite(s.memory_bytes) and s.memory_bytes >= 0):
            out.append(f"stage {s.stage} memory_bytes must be finite and >= 0 (got {s.memory_bytes})")
    for c in result.collectives:
        if not (_finite(c.time_s) and c.time_s >= 0):
            out.append(f"collective {c.group} {c.op} time_s must be finite and >= 0 (got {c.time_s})")
    return out


def check_result(result) -> None:
    """Raise :class:`InvariantError` if ``result`` breaks an invariant (see the module docstring).

    The message is one line: ``internal error: <first broken invariant> [and N more]; config: <non-default
    fields>``.
    """
    broken = violations(result)
    if broken:
        more = f" [and {len(broken) - 1} more]" if len(broken) > 1 else ""
        raise InvariantError(f"internal error: {broken[0]}{more}; config: {config_label(result.config)} "
                             "(a flowsim bug: please report it with this line)")
