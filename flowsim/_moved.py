"""Old import paths of moved modules and names: they keep working for one release, with a DeprecationWarning.

:data:`MOVED` is the one table of modules (old module -> new module). :func:`install` puts a finder at the front of
``sys.meta_path`` (``flowsim/__init__.py`` calls it); importing an old path warns, naming the new one, and
gives the new module itself (``import flowsim.topology`` and ``import flowsim.network.topology`` are the same
object), so nothing is loaded twice. Names that moved out of a module that stays are in :data:`MOVED_NAMES`;
the module sets ``__getattr__ = module_getattr(__name__)``. Remove an entry one release after the move.

Layer 0: imports nothing from flowsim (it names modules only as strings).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings

MOVED = {
    # commit 912f241 "Regroup the engine into subpackages"
    "flowsim.captured": "flowsim.capture.program",
    "flowsim.plots": "flowsim.explore.plots",
    "flowsim.point": "flowsim.explore.point",
    "flowsim.cost": "flowsim.explore.pricing",
    "flowsim.runner": "flowsim.explore.runner",
    "flowsim.search": "flowsim.explore.search",
    "flowsim.space": "flowsim.explore.space",
    "flowsim.store": "flowsim.explore.store",
    "flowsim.study": "flowsim.explore.study",
    "flowsim.sweep": "flowsim.explore.sweep",
    "flowsim.tune": "flowsim.explore.tune",
    "flowsim.breakdown": "flowsim.export.breakdown",
    "flowsim.chakra": "flowsim.export.chakra",
    "flowsim.trace": "flowsim.export.trace",
    "flowsim.memory": "flowsim.step.memory",
    "flowsim.fusion": "flowsim.model.fusion",
    "flowsim.moe": "flowsim.model.moe",
    "flowsim.recompute": "flowsim.model.recompute",
    "flowsim.workload": "flowsim.model.workload",
    "flowsim.collective_flows": "flowsim.network.collective_flows",
    "flowsim.comm_layout": "flowsim.network.comm_layout",
    "flowsim.maxmin": "flowsim.network.maxmin",
    "flowsim.net_heap": "flowsim.network.net_heap",
    "flowsim.netsim": "flowsim.network.netsim",
    "flowsim.routing": "flowsim.network.routing",
    "flowsim.topology": "flowsim.network.topology",
    "flowsim.step_flows": "flowsim.step.flows",
    "flowsim.result": "flowsim.step.result",
    "flowsim.schedule": "flowsim.step.schedule",
    "flowsim.simulate": "flowsim.step.simulate",
    # issue 14: layers at import time
    "flowsim.model.device_memory": "flowsim.step.memory",
    "flowsim.model.profiles": "flowsim.config.profiles",
    "flowsim.validation.trace_events": "flowsim.kernels.trace_events",
}
"""Old dotted module path -> the module that holds it now."""

MOVED_NAMES = {
    "flowsim.model.workload": {"CommOp": "flowsim.model.ops", "FP8_CAST_BYTES_PER_ELEM": "flowsim.model.ops",
                               "FP8_TRANSPOSE_BYTES_PER_ELEM": "flowsim.model.ops"},
    "flowsim.model.recompute": {"MEGATRON_MODULES": "flowsim.config.training"},
    "flowsim.network.collective_flows": {"flow_comparison": "flowsim.validation.nccl_flows"},
    "flowsim.nccl_models.plans": {name: "flowsim.nccl_models.rank_orders" for name in (
        "btree_parent", "distinct_rings", "dtree_parent", "walecki_rings", "zigzag_path")}
    | {"SWITCH": "flowsim.nccl_models.switch_plans", "nvls_heads": "flowsim.nccl_models.switch_plans"},
}
"""Module -> {public name that moved out of it: the module that defines it now} (issue 14)."""


def module_getattr(module: str):
    """A PEP 562 ``__getattr__`` for ``module`` that gives its moved names (:data:`MOVED_NAMES`) with a
    DeprecationWarning naming their new module."""
    table = MOVED_NAMES[module]

    def __getattr__(name: str):
        if name not in table:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(f"{module}.{name} is deprecated; import it from {table[name]}", DeprecationWarning,
                      stacklevel=2)
        return getattr(importlib.import_module(table[name]), name)

    return __getattr__


class _Alias(importlib.abc.Loader):
    """Loads an old path as the new module, warning once per interpreter (the alias then sits in sys.modules)."""

    def __init__(self, new: str):
        self.new = new
        self._spec = None

    def create_module(self, spec):
        # stacklevel 2: the importing code (warnings skips the import system's own frames)
        warnings.warn(f"{spec.name} is deprecated; import {self.new}", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(self.new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module) -> None:
        module.__spec__ = self._spec  # the import system set the alias's spec on the shared module object


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(new))


_FINDER = _Finder()


def install() -> None:
    """Put the finder of :data:`MOVED` at the front of ``sys.meta_path`` (once)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
