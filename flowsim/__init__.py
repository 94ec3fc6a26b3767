"""flowsim: fast, NCCL-faithful performance model of distributed LLM training.

>>> import flowsim
>>> r = flowsim.simulate({"model": "llama3-8b", "cluster": "dgx-h100", "tp": 1, "dp": 8, "gbs": 64})
>>> r.step_time_s  # doctest: +SKIP
"""
from flowsim._version import __version__
from flowsim.config import SimConfig, build_config
from flowsim.errors import ConfigError, FlowsimWarning
from flowsim.step.result import Result
from flowsim.step.simulate import simulate
from flowsim.explore.runner import simulate_many  # noqa: E402 -- after simulate: runner builds on it

__all__ = ["ConfigError", "FlowsimWarning", "Result", "SimConfig", "__version__", "build_config", "simulate",
           "simulate_many"]
