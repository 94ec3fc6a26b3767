"""Where the time of a step goes: one stage's compute split by kernel and kind, next to its other components.

:meth:`flowsim.Result.breakdown` gives the critical stage's seconds by component (compute, TP/CP/EP/PP/DP
communication, bubble, optimizer). This module opens up its ``compute_s``: every kernel of the op tables
(:mod:`flowsim.model.workload`) times how often one GPU of the stage runs it per step, so that the rows add up to
the stage's compute seconds.
"""
from __future__ import annotations

import pandas as pd

from flowsim.step.result import Result
from flowsim.export.trace import timeline_of

PHASES = ("fwd", "bwd", "recompute")
KIND_NAMES = {"gemm": "GEMM", "attn_fwd": "attention", "attn_bwd": "attention", "memory": "memory-bound"}


def kernel_seconds(result: Result, stage: int | None = None) -> pd.DataFrame:
    """Seconds per step of every kernel one GPU of ``stage`` runs, largest first.

    Parameters
    ----------
    result : Result
        From :func:`flowsim.simulate`.
    stage : int, optional
        Pipeline stage; default the critical one (:meth:`Result.breakdown`).

    Returns
    -------
    pandas.DataFrame
        Columns ``block`` (layer, moe_layer, embedding, head), ``name``, ``kind``, ``phase``, ``runs``
        (launches per step), ``time_s`` (one launch, seconds), ``total_s`` (seconds per step), ``share``
        (of the stage's compute seconds).

    Raises
    ------
    ValueError
        When ``result`` has no timeline, or ``stage`` is not a stage of it.
    """
    tl = timeline_of(result)
    s = result.breakdown()["stage"] if stage is None else stage
    if not 0 <= s < len(result.stages):
        raise ValueError(f"stage: must be in [0, {len(result.stages)}) (got {stage})")
    frames = []
    for block, sl in tl.spans.items():
        ops = tl.ops.iloc[sl]
        per_phase = dict(zip(PHASES, tl.block_runs[block][s]))
        runs = ops["phase"].map(per_phase).to_numpy() * ops["count"].to_numpy()
        frames.append(pd.DataFrame({"block": block, "name": ops["name"].to_numpy(), "kind": ops["kind"].to_numpy(),
                                    "phase": ops["phase"].to_numpy(), "runs": runs,
                                    "time_s": tl.op_time_s[sl]}))
    out = pd.concat(frames, ignore_index=True)
    out["total_s"] = out["runs"] * out["time_s"]
    out = out[out["runs"] > 0].sort_values("total_s", ascending=False, ignore_index=True)
    out["share"] = out["total_s"] / out["total_s"].sum()
    return out


def compute_by_kind(result: Result, stage: int | None = None) -> dict:
    """Seconds per step of ``stage``'s compute by kind (GEMM, attention, memory-bound); see
    :func:`kernel_seconds`."""
    k = kernel_seconds(result, stage)
    return k.groupby(k["kind"].map(KIND_NAMES))["total_s"].sum().sort_values(ascending=False).to_dict()
