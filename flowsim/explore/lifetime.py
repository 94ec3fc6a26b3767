"""Worker processes that end with their parent.

A sweep's pool workers must not outlive the process that started them: when it is stopped with SIGTERM its
pool is shut down (:func:`sigterm_as_exit` turns the signal into ``SystemExit``, so ``finally`` blocks run),
and when it is killed outright (SIGKILL, an OOM kill) each worker notices by itself: on Linux the kernel sends
it SIGKILL when its parent dies (``prctl(PR_SET_PDEATHSIG)``), and everywhere a watchdog thread checks the
parent's pid every :data:`WATCH_INTERVAL_S` and exits the worker once it has been re-parented.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time

WATCH_INTERVAL_S = 0.5
"""How often a worker checks that its parent is alive, seconds (an orphan lingers at most this long plus
the kernel call it is in)."""
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _set_parent_death_signal() -> None:
    """Linux: have the kernel SIGKILL this process when its parent thread exits (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl in this libc: the watchdog still covers it
        pass


def _watch(parent_pid: int) -> None:
    while True:
        if os.getppid() != parent_pid:
            os._exit(1)  # orphaned: the parent died without shutting the pool down
        time.sleep(WATCH_INTERVAL_S)


def bind_to_parent(parent_pid: int) -> None:
    """Call in a freshly started worker: it ends when the process ``parent_pid`` (its parent) dies.

    Parameters
    ----------
    parent_pid : int
        The pid of the process that started the pool, taken in that process before the workers start.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a forked worker must not inherit sigterm_as_exit's handler
    _set_parent_death_signal()
    if os.getppid() != parent_pid:  # the parent died before this worker got here
        os._exit(1)
    threading.Thread(target=_watch, args=(parent_pid,), name="flowsim-parent-watch", daemon=True).start()


def terminate_workers(executor) -> None:
    """SIGTERM every live worker process of a ``concurrent.futures.ProcessPoolExecutor`` (its running tasks
    are abandoned; ``shutdown`` then returns at once instead of waiting for them)."""
    for proc in list((getattr(executor, "_processes", None) or {}).values()):
        if proc.is_alive():
            proc.terminate()


@contextlib.contextmanager
def sigterm_as_exit():
    """Within the block, SIGTERM raises ``SystemExit(143)`` (128 + SIGTERM, the shell's convention) in the main
    thread, so ``finally`` blocks (a pool's shutdown) run; the previous handler is restored after. Outside the
    main thread it does nothing (only the main thread may set signal handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _exit(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
