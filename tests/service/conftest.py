"""Fixtures of the service tests: databases (SQLite always; PostgreSQL when ``FLOWSIM_TEST_POSTGRES_DSN`` names a
server, as ``.ci/run`` sets it: each test gets a database of its own, dropped afterwards)."""
from __future__ import annotations

import os
import uuid

import pytest

PG_ENV = "FLOWSIM_TEST_POSTGRES_DSN"


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'service.sqlite'}"


@pytest.fixture
def postgres_url():
    dsn = os.environ.get(PG_ENV)
    if not dsn:
        pytest.skip(f"no PostgreSQL: set {PG_ENV} (.ci/run starts a server and sets it)")
    import psycopg

    name = f"flowsim_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = dsn.rpartition("/")
    yield f"{base}/{name}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request) -> str:
    """Each durability test runs on SQLite and on PostgreSQL (skipped without a server)."""
    return request.getfixturevalue(f"{'sqlite' if request.param == 'sqlite' else 'postgres'}_url")


@pytest.fixture(autouse=True)
def _no_worker_outlives_its_test():
    """Stop the workers a test started, whatever the test's outcome."""
    yield
    from harness import stop_all_workers

    stop_all_workers()
