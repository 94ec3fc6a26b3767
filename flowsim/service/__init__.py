"""flowsim as a service: an HTTP API, a durable job queue, workers and a results database.

The top layer of flowsim (DESIGN.md, Revision 2, layer 5): it calls only flowsim's public API
(:func:`flowsim.simulate`, :func:`flowsim.build_config`) and the explore / validation entry points.

Modules, lowest first:

- :mod:`~flowsim.service.db`: SQLAlchemy 2 models (users, tokens, jobs, results, points, measurements,
  workers), the engine (SQLite in WAL mode, or PostgreSQL through psycopg) and the Alembic migrations;
- :mod:`~flowsim.service.auth`: hashed Bearer tokens;
- :mod:`~flowsim.service.queue`: the job queue with leases, heartbeats and results written once;
- :mod:`~flowsim.service.kinds`: what each job kind runs (estimate, tune, sweep, validate, collective, calibrate);
- :mod:`~flowsim.service.uploads`: measurement files, parsed and checked, never executed;
- :mod:`~flowsim.service.worker`: the worker loop (``flowsim worker --db URL``) and the embedded worker pool;
- :mod:`~flowsim.service.metrics`: the Prometheus text of ``GET /metrics``;
- :mod:`~flowsim.service.app`: the FastAPI application and the static web page.

Needs the optional ``service`` extra: ``pip install "flowsim[service]"``.
"""
