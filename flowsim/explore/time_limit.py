"""A wall-clock limit on one simulation, so that one slow config cannot stall a batch (``validate``, sweeps).

The limit is a POSIX interval timer (``SIGALRM``): when it fires, :class:`TimeLimitExceeded` is raised in the
main thread at the next Python bytecode, i.e. as soon as the running JIT kernel returns (each runs well under
a second for configs within :mod:`flowsim.config.bounds`). Outside the main thread, or where ``setitimer``
does not exist (Windows), the block runs without a limit.
"""
from __future__ import annotations

import contextlib
import signal
import threading


class TimeLimitExceeded(Exception):
    """A simulation ran past its wall-clock limit (the message says which limit)."""


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise :class:`TimeLimitExceeded` if the block runs longer than ``seconds`` (0 or less: no limit).

    Parameters
    ----------
    seconds : float
        Wall-clock limit, seconds.
    """
    usable = (seconds and seconds > 0 and hasattr(signal, "setitimer")
              and threading.current_thread() is threading.main_thread())
    if not usable:
        yield
        return

    def _expire(signum, frame):
        raise TimeLimitExceeded(f"simulation took longer than the {seconds:g} s limit")

    previous = signal.signal(signal.SIGALRM, _expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
