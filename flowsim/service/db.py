"""The service database: SQLAlchemy 2 models, the engine and the Alembic migrations.

One database holds everything the service knows: users and their hashed tokens, jobs (the queue itself),
results (one row per config hash, written once), the design points tune and sweep jobs evaluate, uploaded
measurements and the live workers. Times are Unix seconds (float, ``*_s`` columns).

URLs: ``sqlite:///path`` (the default, embedded; opened in WAL mode so that readers never block the writer
and a killed process loses no committed row) or ``postgresql://user:pass@host/db`` (many workers; driven by
psycopg 3). The schema is created and upgraded by the Alembic migrations shipped in
``flowsim/service/migrations`` (:func:`migrate`), run by ``flowsim serve`` and ``flowsim worker`` on start.
"""
from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import (Boolean, Float, ForeignKey, Index, Integer, LargeBinary, String, Text, create_engine,
                        event, text)
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from flowsim.errors import ConfigError

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
SQLITE_BUSY_TIMEOUT_S = 30.0  # how long a writer waits for SQLite's write lock before failing
PG_MIGRATION_LOCK = 0x666C6F77  # pg_advisory_lock id held while migrating ("flow" in ASCII)


class Base(DeclarativeBase):
    """Declarative base of the service's tables."""


class User(Base):
    """A person or robot that owns jobs, results and uploads."""

    __tablename__ = "users"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created_s: Mapped[float] = mapped_column(Float)


class Token(Base):
    """An API token: only its SHA-256 is stored (:mod:`flowsim.service.auth`)."""

    __tablename__ = "tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_s: Mapped[float] = mapped_column(Float)


class Job(Base):
    """A queued, running or finished job.

    ``state`` is ``queued``, ``running``, ``done``, ``failed`` or ``cancelled``. A running job is leased to
    ``lease_owner`` until ``lease_expires_s``; a lease not renewed in time puts the job back in the queue.
    ``key`` is the hash of what the job computes: its result is the ``results`` row of that key.
    """

    __tablename__ = "jobs"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    kind: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16))
    params_json: Mapped[str] = mapped_column(Text)
    key: Mapped[str] = mapped_column(String(64))
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    message: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_s: Mapped[float] = mapped_column(Float)
    started_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    lease_owner: Mapped[str | None] = mapped_column(String(64), nullable=True)
    lease_expires_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    reused: Mapped[bool] = mapped_column(Boolean, default=False)
    __table_args__ = (Index("jobs_state_created", "state", "created_s"), Index("jobs_owner", "owner_id"),
                      Index("jobs_key", "key"))


class Result(Base):
    """The result of one computation, keyed by its config hash and written once (never updated)."""

    __tablename__ = "results"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    job_id: Mapped[str] = mapped_column(String(32))
    result_json: Mapped[str] = mapped_column(Text)
    created_s: Mapped[float] = mapped_column(Float)


class Point(Base):
    """One design point evaluated by a tune or sweep job (the service's twin of the local results store)."""

    __tablename__ = "points"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    study: Mapped[str] = mapped_column(String(128))
    config_json: Mapped[str] = mapped_column(Text)
    point_json: Mapped[str] = mapped_column(Text)
    created_s: Mapped[float] = mapped_column(Float)


class MemoryPruned(Base):
    """A config found not to fit in GPU memory (not simulated), with its peak bytes."""

    __tablename__ = "memory_pruned"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    memory_bytes_per_gpu: Mapped[float] = mapped_column(Float)


class Measurement(Base):
    """An uploaded measurement file (runs CSV, nccl-tests log or Kineto trace), stored by id."""

    __tablename__ = "measurements"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    kind: Mapped[str] = mapped_column(String(16))
    filename: Mapped[str] = mapped_column(String(255))
    sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(Integer)
    content: Mapped[bytes] = mapped_column(LargeBinary)
    summary_json: Mapped[str] = mapped_column(Text)
    created_s: Mapped[float] = mapped_column(Float)


class Worker(Base):
    """A worker process that heartbeats while alive (for the worker-count metric)."""

    __tablename__ = "workers"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    started_s: Mapped[float] = mapped_column(Float)
    last_seen_s: Mapped[float] = mapped_column(Float)


def default_url() -> str:
    """``$FLOWSIM_SERVICE_DB`` if set, else SQLite at ``$XDG_CACHE_HOME/flowsim/service.sqlite``."""
    if os.environ.get("FLOWSIM_SERVICE_DB"):
        return os.environ["FLOWSIM_SERVICE_DB"]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return f"sqlite:///{cache / 'flowsim' / 'service.sqlite'}"


def _driver_url(url: str):
    """``url`` as an SQLAlchemy URL with the driver flowsim uses (psycopg 3 for PostgreSQL)."""
    try:
        u = make_url(url)
    except ArgumentError:
        raise ConfigError("--db", "must be sqlite:///PATH or postgresql://USER:PASSWORD@HOST/DB", url) from None
    if u.get_backend_name() == "sqlite":
        if not u.database or u.database == ":memory:":
            raise ConfigError("--db", "SQLite needs a file (processes share it): sqlite:///PATH", url)
        return u.set(drivername="sqlite+pysqlite")
    if u.get_backend_name() == "postgresql":
        return u.set(drivername="postgresql+psycopg")
    raise ConfigError("--db", "must be sqlite:///PATH or postgresql://USER:PASSWORD@HOST/DB", url)


def make_engine(url: str) -> Engine:
    """An engine for ``url``; on SQLite, WAL mode and ``BEGIN IMMEDIATE`` for write transactions.

    A connection run with the execution option ``write=True`` (see :func:`session`) takes SQLite's write
    lock when its transaction begins, so two writers queue on the busy timeout instead of failing when a read
    would have to become a write (SQLite's ``SQLITE_BUSY_SNAPSHOT`` in WAL mode).
    """
    u = _driver_url(url)
    if u.get_backend_name() != "sqlite":
        return create_engine(u, pool_pre_ping=True, pool_size=5, max_overflow=10)
    Path(u.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(u, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves (pysqlite's own is deferred)
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a killed process loses no committed row
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("write") else "BEGIN")

    return engine


def is_postgres(engine: Engine) -> bool:
    """True when ``engine`` is a PostgreSQL database."""
    return engine.dialect.name == "postgresql"


@contextmanager
def session(engine: Engine, write: bool = False):
    """A session in one transaction, committed on success and rolled back on error.

    ``write=True`` takes the write lock up front on SQLite (see :func:`make_engine`).
    """
    bind = engine.execution_options(write=True) if write else engine
    with Session(bind, expire_on_commit=False) as s:
        with s.begin():
            yield s


def _alembic_config(engine: Engine):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["engine"] = engine
    return cfg


@contextmanager
def _migration_lock(engine: Engine):
    """Only one process migrates at a time: a PostgreSQL advisory lock, or a lock file beside SQLite's."""
    if is_postgres(engine):
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": PG_MIGRATION_LOCK})
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": PG_MIGRATION_LOCK})
        return
    lock_path = Path(engine.url.database).expanduser().with_suffix(".migrate.lock")
    with open(lock_path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def migrate(engine: Engine) -> None:
    """Create or upgrade the schema to the newest migration (safe to call from many processes at once)."""
    from alembic import command

    with _migration_lock(engine):
        command.upgrade(_alembic_config(engine), "head")


def open_db(url: str | None = None) -> Engine:
    """Engine of the service database at ``url`` (default :func:`default_url`), migrated to the newest schema.

    Raises
    ------
    ConfigError
        ``url`` is not an SQLite or PostgreSQL URL, or the database cannot be reached.
    """
    from sqlalchemy.exc import OperationalError

    url = url or default_url()
    engine = make_engine(url)
    try:
        migrate(engine)
    except OperationalError as e:
        raise ConfigError("--db", f"cannot open the database ({str(e.orig).strip().splitlines()[0]})",
                          engine.url.render_as_string(hide_password=True)) from None
    return engine


def insert_ignore(engine: Engine, model):
    """An INSERT into ``model``'s table that leaves rows whose primary key exists as they are."""
    if is_postgres(engine):
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert(model).on_conflict_do_nothing()
