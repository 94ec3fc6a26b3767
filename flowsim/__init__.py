"""flowsim: fast, NCCL-faithful performance model of distributed LLM training.

>>> import flowsim
>>> r = flowsim.simulate({"model": "llama3-8b", "cluster": "dgx-h100", "tp": 1, "dp": 8, "gbs": 64})
>>> r.step_time_s  # doctest: +SKIP

The public names load on first use (PEP 562), so ``import flowsim.gpu_specs`` or ``import flowsim.nccl_models``
loads neither numba nor the engine. Old module paths (``flowsim.topology`` ...) still import, with a
DeprecationWarning (:mod:`flowsim._moved`).
"""
import sys
import types

from flowsim import _moved, _numba_cache  # noqa: F401 -- _numba_cache: numba's cache outside the package

_PUBLIC = {
    "__version__": "flowsim._version",
    "ConfigError": "flowsim.errors",
    "FlowsimWarning": "flowsim.errors",
    "SimConfig": "flowsim.config",
    "build_config": "flowsim.config",
    "Result": "flowsim.step.result",
    "simulate": "flowsim.step.simulate",
    "simulate_many": "flowsim.explore.runner",
}
"""Public name -> the module that defines it."""

__all__ = ["ConfigError", "FlowsimWarning", "Result", "SimConfig", "__version__", "build_config", "simulate",
           "simulate_many"]


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'flowsim' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))


class _Front(types.ModuleType):
    """The package module: a submodule import never replaces a public name (``import flowsim.simulate``, the
    old path of :mod:`flowsim.step.simulate`, leaves ``flowsim.simulate`` the function)."""

    def __setattr__(self, name, value):
        if name in _PUBLIC and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Front
_moved.install()
