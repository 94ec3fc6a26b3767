"""The step core: one optimizer step from a step program, whatever built it (:mod:`flowsim.step.core`).

Its front door, for the adapters above it (captured and SimAI/AICB workloads, trace and collective-log
validation): the collective pricer, the SM-sharing rule, the stream and pipeline timelines. The parametric entry
point is :func:`flowsim.simulate` (:mod:`flowsim.step.simulate`). Names resolve on first use (PEP 562), so
importing this package loads nothing heavy.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "CollectivePricer": "flowsim.step.pricer",
    "PipelineProgram": "flowsim.step.core",
    "PipelineRun": "flowsim.step.core",
    "run_pipeline": "flowsim.step.core",
    "step_end_s": "flowsim.step.core",
    "StreamOp": "flowsim.step.streams",
    "StreamRun": "flowsim.step.streams",
    "run_streams": "flowsim.step.streams",
    "overlapped_s": "flowsim.step.overlap",
    "slowed_end_s": "flowsim.step.overlap",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'flowsim.step' has no attribute {name!r}")
