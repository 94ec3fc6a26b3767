"""Capture a user's training script: ``flowsim capture --world-size N -- python train.py ARGS``.

The script runs in this process (``runpy``, ``sys.argv = [train.py, *ARGS]``, its folder first on
``sys.path``) once per captured rank, inside a capture session (:func:`flowsim.capture.recorder.session`):

* the environment a launcher (torchrun) sets: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
  ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``, and ``FLOWSIM_CAPTURE=1`` (a
  script may read it, e.g. to run fewer steps or skip checkpoints);
* torch.distributed already initialised on the fake process group; the script's ``init_process_group``
  (any backend) and ``destroy_process_group()`` do nothing, and ``new_group`` makes fake groups whatever
  backend it names;
* tensors fake, CUDA requests on the CPU (:mod:`flowsim.capture.devices`);
* after each rank, frameworks that keep process groups in module globals forget them
  (:data:`FRAMEWORK_RESETS`: Megatron-core's ``parallel_state``), so the next rank's run builds its own.

What is recorded: the ops of the steps the script marks with :func:`step` (the last one, or the
``step``-th, after which the script is stopped), or, in a script with no marker, everything it runs.
DDP's buckets are rebuilt after each marked step (as after the warm-up steps of
:func:`flowsim.capture.capture`), so a second marked step has the steady-state buckets.
"""
from __future__ import annotations

import contextlib
import os
import runpy
import sys
import traceback

from flowsim.capture.data import merge_stages
from flowsim.capture.devices import cpu_for_cuda
from flowsim.capture.recorder import patched, session
from flowsim.errors import ConfigError

ENV_FLAG = "FLOWSIM_CAPTURE"
FRAMEWORK_RESETS = {"megatron.core.parallel_state": "destroy_model_parallel"}
"""Module -> its function that forgets the process groups it keeps in module globals. Every captured rank runs
the script in this process, and the groups of the previous rank belong to its closed session: after each rank
the function of every such module the script imported is called (Megatron refuses a second
``initialize_model_parallel`` otherwise)."""
_active = None
"""The script capture running now (a :class:`_ScriptRun`), which :func:`step` reports to."""


class _StopScript(BaseException):
    """Ends the script after the requested step (a BaseException, so ``except Exception`` lets it pass)."""


@contextlib.contextmanager
def step():
    """Mark one training step of a script (forward, backward, optimizer) for ``flowsim capture``.

    Outside a capture it does nothing, so a script keeps it::

        for batch in loader:
            with flowsim.capture.step():
                train_step(batch)
    """
    run = _active
    if run is None:
        yield
        return
    run.begin_step()
    yield
    run.end_step()


class _ScriptRun:
    """The marked steps of one run of a script under a capture session."""

    def __init__(self, sess, wanted):
        self.sess, self.wanted = sess, wanted
        self.steps = []  # (ops, unknown op names) of each finished marked step
        sess.recorder.paused = False  # record the whole run until a marker shows up

    def begin_step(self) -> None:
        self.sess.recorder.reset()
        self.sess.recorder.paused = False

    def end_step(self) -> None:
        rec = self.sess.recorder
        rec.paused = True
        self.steps.append((rec.ops, rec.unknown))
        self.sess.settle_ddp()
        if len(self.steps) == self.wanted:
            raise _StopScript

    def select(self) -> None:
        """Leave the recorder holding the ops to keep: the chosen marked step, or the whole run."""
        if not self.steps:
            if self.wanted is not None:
                raise ConfigError("step", "needs flowsim.capture.step() markers in the script (it ran none)",
                                  self.wanted)
            return
        if self.wanted is not None and self.wanted > len(self.steps):
            raise ConfigError("step", f"must be at most the {len(self.steps)} marked steps the script ran",
                              self.wanted)
        self.sess.recorder.ops, self.sess.recorder.unknown = self.steps[(self.wanted or len(self.steps)) - 1]


def capture_script(argv: list, *, world_size: int, ranks=(0,), step: int | None = None,
                   local_world_size: int = 8, label: str = "", progress: bool = False):
    """Run a training script for each of ``ranks`` of a ``world_size`` job and record what it issues.

    Parameters
    ----------
    argv : list of str
        ``["python", "train.py", *args]``, ``["train.py", *args]`` or ``["python", "-m", "pkg.train", *args]``.
    world_size : int
        Ranks of the job.
    ranks : sequence of int, optional
        Ranks to capture, one per pipeline stage in stage order (default: rank 0 alone).
    step : int, optional
        Record the ``step``-th (1-based) :func:`step` block and stop the script after it (default: the
        last block, or the whole run in a script without markers).
    local_world_size : int, optional
        Ranks per node, for ``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE`` (default 8, at most ``world_size``).
    label : str, optional
        Stored with the workload (default: the script's arguments).
    progress : bool, optional
        A progress bar on stderr over the ranks, when there are several (default off).

    Returns
    -------
    CapturedWorkload
        One stage per entry of ``ranks``.

    Raises
    ------
    ConfigError
        A target that is not a Python file or module, a script that raises (``script: <type>: <message>
        (at <file>:<line>)``) or exits non-zero, a ``step`` the script did not reach, or a run that
        recorded nothing.
    """
    target = _target(argv)
    if step is not None and (not isinstance(step, int) or isinstance(step, bool) or step < 1):
        raise ConfigError("step", "must be a positive integer", step)
    from flowsim.explore.runner import Progress

    bar = Progress(len(ranks), "capture", progress and len(ranks) > 1, unit="rank")
    stages = []
    for r in ranks:
        stages.append(_capture_rank(target, world_size, r, step, local_world_size))
        bar.advance(1)
    bar.close()
    return merge_stages(stages, label or " ".join(argv))


def _target(argv: list) -> tuple:
    """``(kind, name, args)``: kind ``"path"`` (a .py file) or ``"module"`` (``-m``) from a command line."""
    argv = list(argv)
    if argv and os.path.basename(argv[0]).startswith("python") and not argv[0].endswith(".py"):
        argv = argv[1:]
    if len(argv) >= 2 and argv[0] == "-m":
        return "module", argv[1], argv[2:]
    if not argv or not argv[0].endswith(".py") or not os.path.isfile(argv[0]):
        raise ConfigError("script", "must be an existing .py file, 'python FILE.py ARGS' or 'python -m MODULE "
                                    "ARGS'", " ".join(argv) or "nothing")
    return "path", argv[0], argv[1:]


def _capture_rank(target: tuple, world_size: int, rank: int, wanted, local_world_size: int):
    """Single-stage workload of one run of ``target`` as rank ``rank``."""
    global _active
    lws = max(1, min(local_world_size, world_size))
    with session(world_size, rank) as sess, contextlib.ExitStack() as stack:
        stack.enter_context(_environ(_launcher_env(world_size, rank, lws)))
        _process_group_patches(stack)
        stack.enter_context(cpu_for_cuda(rank % lws, lws))
        run = _ScriptRun(sess, wanted)
        _active = run
        try:
            _run(target)
        except _StopScript:
            pass
        finally:
            _active = None
            sess.recorder.paused = True
            _reset_frameworks()
        run.select()
    if not sess.recorder.ops:
        raise ConfigError("script", "recorded no op (no torch op ran in the recorded part)", target[1])
    return sess.workload()


def _reset_frameworks() -> None:
    """Call the reset function of every :data:`FRAMEWORK_RESETS` module that is imported."""
    for module, function in FRAMEWORK_RESETS.items():
        if module in sys.modules:
            getattr(sys.modules[module], function)()


def _launcher_env(world_size: int, rank: int, local_world_size: int) -> dict:
    """The variables torchrun sets for ``rank`` (one node per ``local_world_size`` ranks)."""
    return {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank % local_world_size),
            "LOCAL_WORLD_SIZE": str(local_world_size), "GROUP_RANK": str(rank // local_world_size),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", ENV_FLAG: "1"}


@contextlib.contextmanager
def _environ(values: dict):
    """Set environment variables within the block, restoring the old values after."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _process_group_patches(stack) -> None:
    """The script's init_process_group joins the capture's fake group, its new groups are fake whatever
    backend they ask for (a gloo group on the fake store would fail), and destroying the default group
    waits for the end of the capture."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    destroy, new_group = c10d.destroy_process_group, c10d.new_group

    def init_process_group(*args, **kwargs):
        return None

    def fake_new_group(ranks=None, timeout=None, backend=None, pg_options=None, **kwargs):
        return new_group(ranks, timeout, **kwargs)

    def destroy_process_group(group=None):
        return None if group is None else destroy(group)

    for module in (dist, c10d):
        stack.enter_context(patched(module, "init_process_group", init_process_group))
        stack.enter_context(patched(module, "new_group", fake_new_group))
        stack.enter_context(patched(module, "destroy_process_group", destroy_process_group))


def _run(target: tuple) -> None:
    """Run the script or module as ``__main__`` with its ``sys.argv``; its failures become ConfigErrors."""
    kind, name, args = target
    first = os.path.dirname(os.path.abspath(name)) if kind == "path" else os.getcwd()  # as python puts it
    with patched(sys, "argv", [name, *args]), patched(sys, "path", [first, *sys.path]):
        try:
            if kind == "path":
                runpy.run_path(name, run_name="__main__")
            else:
                runpy.run_module(name, run_name="__main__", alter_sys=True)
        except SystemExit as e:
            if e.code not in (None, 0):
                raise ConfigError("script", "must exit with status 0", e.code) from None
        except Exception as e:  # noqa: BLE001 - any failure of the user's script is reported as bad input
            text = str(e).strip()
            raise ConfigError("script", f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"
                                        f" (at {_where(e, name)})") from e


def _where(exc: BaseException, name: str) -> str:
    """``file:line`` of the deepest frame of the traceback in the script (else the deepest frame)."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if os.path.abspath(f.filename) == os.path.abspath(name)] if name.endswith(".py") else []
    f = (mine or frames)[-1]
    return f"{f.filename}:{f.lineno}"
