"""The step core's loops: compiled by numba, or run by the interpreter in a process that simulates once.

The step core's hot loops (the pipeline schedule, the compute/communication overlap, the host issue timeline)
are ``numba.njit(cache=True)`` functions over flat arrays: 1-2 ms for a whole step once compiled, which is what
tuning, sweeps and validation need. A process that simulates a single configuration (the CLI's ``estimate``)
pays more for the compiler than for the loops: importing numba and loading its cached kernels takes about
0.5 s, compiling them on a fresh install about 50 s (docs/PERFORMANCE.md), while the same loops run by the
interpreter take about 20 ms for GPT-3 175B on 1,024 GPUs. Such a process calls :func:`interpret` before the
engine is imported: every function decorated with :func:`njit` then stays the plain Python function, the same
code and the same IEEE double arithmetic (tests/test_jit_modes.py compares both modes on random configs).

The flow engine (:mod:`flowsim.network`) always compiles: its event loops run millions of iterations.

``FLOWSIM_JIT=0`` interprets and ``FLOWSIM_JIT=1`` compiles in every process, whatever :func:`interpret` asks.
"""
from __future__ import annotations

import os

from flowsim.errors import ConfigError

ENV = "FLOWSIM_JIT"
_mode = {"interpreted": False, "fixed": False}


def _env_choice() -> bool | None:
    """True (interpret) for ``FLOWSIM_JIT=0``, False (compile) for ``1``, None when unset or empty."""
    value = os.environ.get(ENV, "").strip()
    if value not in ("", "0", "1"):
        raise ConfigError(ENV, "must be 0 (interpret the step core's loops) or 1 (compile them), or unset", value)
    return None if value == "" else value == "0"


def interpret() -> bool:
    """Run the step core's loops in the interpreter in this process (call before the engine is imported).

    Returns whether they will be interpreted: False once a loop was already decorated (compiled and interpreted
    loops do not mix in one process) or when ``FLOWSIM_JIT=1``.
    """
    if not _mode["fixed"]:
        _mode["interpreted"] = True
    return interpreted()


def interpreted() -> bool:
    """Whether this process runs the step core's loops in the interpreter (fixed by the first decoration)."""
    env = _env_choice()
    return env if env is not None else _mode["interpreted"]


def njit(**options):
    """``numba.njit(**options)``, or the function itself when :func:`interpreted` (numba is then not imported)."""
    def decorate(function):
        _mode["fixed"] = True
        if interpreted():
            return function
        from numba import njit as numba_njit

        return numba_njit(**options)(function)
    return decorate
