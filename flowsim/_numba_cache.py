"""Where numba keeps flowsim's compiled kernels: a per-user cache folder, never inside the installed package.

numba's default (``cache=True``) writes ``*.nbi``/``*.nbc`` files into ``__pycache__`` beside each source file.
For a non-editable install that is ``site-packages/flowsim/__pycache__``; a later ``pip install -e`` of the same
distribution removes the package's files but not those cache files, and the folder left behind makes ``flowsim``
an empty namespace package (issue 21: the README's two quick-start commands in one venv). So unless the user
chose a folder with ``NUMBA_CACHE_DIR``, flowsim sets it to ``$XDG_CACHE_HOME/flowsim/numba`` (``~/.cache``
by default) before numba is imported; numba keys each file there by the source's full path, so installs and
checkouts never share entries.

Imported first by :mod:`flowsim` (``flowsim/__init__.py``); importing it does not import numba.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path


def cache_dir() -> Path:
    """The per-user numba cache folder flowsim uses when ``NUMBA_CACHE_DIR`` is not set."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "flowsim" / "numba"


def configure() -> None:
    """Set ``NUMBA_CACHE_DIR`` to :func:`cache_dir` unless the user set it (or the folder cannot be made, when
    numba's own fallbacks apply); also applied to an already imported numba."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    try:
        path = cache_dir()
        path.mkdir(parents=True, exist_ok=True)
    except (OSError, RuntimeError):  # no home folder, or it is read-only
        return
    os.environ["NUMBA_CACHE_DIR"] = str(path)
    config = sys.modules.get("numba.core.config")
    if config is not None:  # numba came first: its config was read already
        config.CACHE_DIR = str(path)


configure()
