"""Where numba keeps flowsim's compiled kernels: a per-user cache folder, never inside the installed package,
keyed by the kernels' sources.

numba's default (``cache=True``) writes ``*.nbi``/``*.nbc`` files into ``__pycache__`` beside each source file.
For a non-editable install that is ``site-packages/flowsim/__pycache__``; a later ``pip install -e`` of the same
distribution removes the package's files but not those cache files, and the folder left behind makes ``flowsim``
an empty namespace package (issue 21: the README's two quick-start commands in one venv). So unless the user
chose a folder with ``NUMBA_CACHE_DIR``, flowsim sets it to
``$XDG_CACHE_HOME/flowsim/numba/<checkout>/<sources>`` (``~/.cache`` by default) before numba is imported.

The last two parts exist because numba checks a cached function against its own source file only (the file's
modification time and size): a kernel that calls, and so compiles in, a kernel of another file (the event loop
of ``network/netsim.py`` and the max-min kernels of ``network/maxmin_kernels.py``, the step core's loops and
``step/sums.py``) stays cached after that other file changes, and runs the old code. ``<checkout>`` is a digest of
the package's folder (installs and worktrees keep their own entries), ``<sources>`` a digest of the path, size and
modification time of every module of :data:`JIT_PACKAGES`: a change to any of them starts an empty folder (the
kernels compile again, as after an install). The folders of this checkout's earlier sources are removed once
nothing was written in them for :data:`STALE_S` (a process started before the change may still be compiling into
its own).

Imported first by :mod:`flowsim` (``flowsim/__init__.py``); importing it does not import numba.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
JIT_PACKAGES = ("network", "step")  # the sub-packages whose modules define numba kernels (and _jit.py beside them)
STALE_S = 3600.0  # seconds without a write after which an earlier sources' folder is removed


def sources_digest(package: Path = PACKAGE) -> str:
    """16 hex digits over (relative path, size, mtime in ns) of ``_jit.py`` and every ``.py`` file of
    :data:`JIT_PACKAGES` under ``package``; files that cannot be read are left out."""
    h = hashlib.blake2b(digest_size=8)
    paths = [package / "_jit.py"]
    for sub in JIT_PACKAGES:
        try:
            paths += sorted(p for p in (package / sub).iterdir() if p.suffix == ".py")
        except OSError:
            continue
    for p in paths:
        try:
            st = p.stat()
        except OSError:
            continue
        h.update(f"{p.relative_to(package)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def cache_dir(package: Path = PACKAGE) -> Path:
    """The per-user numba cache folder flowsim uses when ``NUMBA_CACHE_DIR`` is not set (see the module
    docstring)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    checkout = hashlib.blake2b(str(package).encode(), digest_size=8).hexdigest()
    return base / "flowsim" / "numba" / checkout / sources_digest(package)


def _remove_stale(path: Path) -> None:
    """Remove the sibling folders of ``path`` (earlier sources of this checkout: never read again) in which
    nothing was written for :data:`STALE_S` seconds (numba writes one level down, a folder per source folder)."""
    now = time.time()
    for old in path.parent.iterdir():
        try:
            if old == path or not old.is_dir():
                continue
            newest = max([old.stat().st_mtime] + [p.stat().st_mtime for p in old.iterdir()])
        except OSError:
            continue
        if now - newest > STALE_S:
            shutil.rmtree(old, ignore_errors=True)


def configure() -> None:
    """Set ``NUMBA_CACHE_DIR`` to :func:`cache_dir` unless the user set it (or the folder cannot be made, when
    numba's own fallbacks apply), removing the folders of this checkout's earlier sources; also applied to an
    already imported numba."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    try:
        path = cache_dir()
        if not path.is_dir():
            path.mkdir(parents=True, exist_ok=True)
            _remove_stale(path)
    except (OSError, RuntimeError):  # no home folder, or it is read-only
        return
    os.environ["NUMBA_CACHE_DIR"] = str(path)
    config = sys.modules.get("numba.core.config")
    if config is not None:  # numba came first: its config was read already
        config.CACHE_DIR = str(path)


configure()
