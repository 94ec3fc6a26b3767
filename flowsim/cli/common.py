"""Shared pieces of the command-line interface: error mapping and output helpers."""
from __future__ import annotations

import functools
import json
import math
import sys

import click

from flowsim.errors import ConfigError
from flowsim.step.invariants import InvariantError


class UserError(click.ClickException):
    """Bad input: printed as one line ``Error: <field>: <rule>`` and exit code 2."""

    exit_code = 2


def user_errors(func):
    """Turn ConfigError (and ValueError from input checks) raised by ``func`` into a one-line exit 2."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except ConfigError as e:
            raise UserError(str(e)) from None
        except InvariantError as e:  # flowsim's own bug: one line, exit 1
            raise click.ClickException(str(e)) from None

    return wrapper


def _jsonable(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return _jsonable(obj.item())
    return obj


OUTPUT_SCHEMA_VERSION = "1"
"""Version of the ``--json`` output contract: keys carry their unit (``_s``, ``_bytes``, ``_gb``); a key is renamed
or removed only with a new version (the old key kept for one release). Schema of ``estimate --json``:
``flowsim/cli/estimate.schema.json``."""


def echo_json(obj) -> None:
    """Print exactly one JSON object on stdout (non-finite floats become null), headed by ``schema_version`` and
    ``flowsim_version``."""
    from flowsim._version import __version__

    if isinstance(obj, dict):
        obj = {"schema_version": OUTPUT_SCHEMA_VERSION, "flowsim_version": __version__, **obj}
    click.echo(json.dumps(_jsonable(obj), indent=2, sort_keys=False))


def format_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """Render ``rows`` as a fixed-width text table.

    ``columns`` holds (key, header, format spec) triples; the header carries the unit.
    """
    cells = [[h for _, h, _ in columns]]
    for r in rows:
        line = []
        for key, _, fmt in columns:
            v = r.get(key)
            if v is None or (isinstance(v, float) and not math.isfinite(v)):
                line.append("-")
            else:
                line.append(format(v, fmt) if fmt else str(v))
        cells.append(line)
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    out = []
    for j, row in enumerate(cells):
        out.append("  ".join(c.rjust(w) if j and _numeric(c) else c.ljust(w) for c, w in zip(row, widths)).rstrip())
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def _numeric(s: str) -> bool:
    try:
        float(s.replace("%", "").replace("+", ""))
        return True
    except ValueError:
        return False


FIRST_COMPILE_NOTE = ("note: compiling flowsim's numba kernels on first use (about a minute on 2 cores, once: "
                      "they are cached afterwards)")
"""Printed when numba starts compiling; 51 s measured for `flowsim estimate` with an empty cache on this
project's 2-core machine (NUMBA_CACHE_DIR pointed at an empty folder)."""


_COMPILE_NOTICE: list = []  # the listener, once registered in this process


def notice_first_compile() -> None:
    """Print :data:`FIRST_COMPILE_NOTE` on stderr the first time numba compiles a kernel in this process
    (numba's ``numba:compile`` event; a warm cache compiles nothing and prints nothing)."""
    if _COMPILE_NOTICE:
        return
    from numba.core import event

    class _Notice(event.Listener):
        printed = False

        def on_start(self, ev):
            if not self.printed:
                self.printed = True
                click.echo(FIRST_COMPILE_NOTE, err=True)

        def on_end(self, ev):
            pass

    _COMPILE_NOTICE.append(_Notice())
    event.register("numba:compile", _COMPILE_NOTICE[0])


def warn(msg: str) -> None:
    """Print a warning line on stderr."""
    click.echo(f"warning: {msg}", err=True)
    sys.stderr.flush()
