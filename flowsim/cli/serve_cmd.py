"""``flowsim serve`` (the HTTP service), ``flowsim serve token create`` and ``flowsim worker``.

Needs the ``service`` extra (``pip install "flowsim[service]"``); see docs/SERVICE.md.
"""
from __future__ import annotations

import os
import sys

import click

from flowsim.cli.common import user_errors
from flowsim.errors import ConfigError
from flowsim.service.limits import LEASE_S, MAX_ACTIVE_JOBS, MAX_BODY_BYTES, Limits

DB_HELP = ("Database URL: sqlite:///PATH (default $FLOWSIM_SERVICE_DB or ~/.cache/flowsim/service.sqlite) or "
           "postgresql://USER:PASSWORD@HOST/DB.")


def _service():
    """Import the service package, or a one-line error naming the extra to install."""
    import importlib.util

    missing = [m for m in ("fastapi", "uvicorn", "sqlalchemy", "alembic") if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError("serve", f"needs the service extra: pip install \"flowsim[service]\" ({missing[0]} is "
                          "missing)")


def _workers(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition(":")
    try:
        lo_i, hi_i = int(lo), int(hi if sep else lo)
    except ValueError:
        raise ConfigError("--workers", "must be MIN:MAX (integers, 0 <= MIN <= MAX)", text) from None
    if not 0 <= lo_i <= hi_i:
        raise ConfigError("--workers", "must be MIN:MAX (integers, 0 <= MIN <= MAX)", text)
    return lo_i, hi_i


@click.group(invoke_without_command=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="TCP port.")
@click.option("--db", help=DB_HELP)
@click.option("--workers", default=f"1:{os.cpu_count() or 1}", show_default=True,
              help="Embedded worker processes MIN:MAX, scaled with the queue (0:0: none; run `flowsim worker`).")
@click.option("--max-body-mb", type=click.FloatRange(min=0, min_open=True), default=MAX_BODY_BYTES / 2**20,
              show_default=True,
              help="Largest request body, MiB (413 beyond).")
@click.option("--max-jobs", type=click.IntRange(min=1), default=MAX_ACTIVE_JOBS, show_default=True,
              help="Queued + running jobs per user (429 beyond).")
@click.option("--lease-s", type=click.FloatRange(min=0.5), default=LEASE_S, show_default=True,
              help="Lease of an embedded worker's job, seconds (requeued when not renewed in time).")
@click.pass_context
@user_errors
def serve(ctx, host, port, db, workers, max_body_mb, max_jobs, lease_s):
    """Start the HTTP service: API (docs at /docs), web page, job queue and embedded workers.

    With no options: http://127.0.0.1:8000 on an embedded SQLite database. On a database without users an
    admin token is created and printed once. Example:

    \b
        flowsim serve --port 8000 --workers 1:4
    """
    if ctx.invoked_subcommand:
        return
    _service()
    import uvicorn

    from flowsim.service.app import create_app
    from flowsim.service.auth import create_token, has_users
    from flowsim.service.db import default_url, open_db
    from flowsim.service.worker import WorkerPool

    lo, hi = _workers(workers)
    url = db or default_url()
    engine = open_db(url)
    if not has_users(engine):
        click.echo(f"first start: admin token (shown once): {create_token(engine, 'admin', admin=True)}", err=True)
    app = create_app(engine, Limits(max_body_bytes=int(max_body_mb * 2**20), max_active_jobs=max_jobs))
    pool = WorkerPool(engine, url, lo, hi, lease_s) if hi else None
    if pool:
        pool.start()
    click.echo(f"flowsim serve: http://{host}:{port} (database {engine.url.render_as_string(hide_password=True)}, "
               f"workers {lo}:{hi})", err=True)
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        if pool:
            pool.stop()


@serve.group()
def token():
    """API tokens."""


@token.command("create")
@click.argument("name")
@click.option("--admin", is_flag=True, help="The user sees and manages every user's jobs.")
@click.option("--db", help=DB_HELP)
@user_errors
def token_create(name, admin, db):
    """Create a token for user NAME (created if new); the token is printed on the last line, once."""
    _service()
    from flowsim.service.auth import create_token
    from flowsim.service.db import open_db

    click.echo(create_token(open_db(db), name, admin=admin))


@click.command()
@click.option("--db", help=DB_HELP)
@click.option("--lease-s", type=click.FloatRange(min=0.5), default=LEASE_S, show_default=True,
              help="Lease of each job, seconds: renewed 3 times per lease; requeued when not renewed in time.")
@click.option("--scheduler", metavar="dask://HOST:PORT", help="Fan tune and sweep jobs out to this Dask cluster.")
@click.option("--max-jobs", type=click.IntRange(min=1), help="Exit after this many jobs.")
@click.option("--exit-when-idle", is_flag=True, help="Exit when the queue is empty.")
@user_errors
def worker(db, lease_s, scheduler, max_jobs, exit_when_idle):
    """Process jobs from the service's queue (SIGTERM: finish the job in hand, then exit). Logs one line per
    job on stderr: ``job ID KIND OUTCOME SECONDS``. Example:

    \b
        flowsim worker --db postgresql://flowsim:secret@db/flowsim
    """
    _service()
    import logging
    import signal

    from flowsim.service.db import open_db
    from flowsim.service.worker import WorkerLoop

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    job_log = logging.getLogger("flowsim.service.worker")
    job_log.addHandler(handler)
    job_log.setLevel(logging.INFO)
    loop = WorkerLoop(open_db(db), lease_s=lease_s, scheduler=scheduler)
    signal.signal(signal.SIGTERM, loop.stop)
    signal.signal(signal.SIGINT, loop.stop)
    n = loop.run(max_jobs=max_jobs, exit_when_idle=exit_when_idle)
    click.echo(f"worker {loop.id}: {n} jobs", err=True)
