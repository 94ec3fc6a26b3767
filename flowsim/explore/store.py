"""The results store: every evaluated design point in an embedded SQLite database.

One row per point, keyed by :func:`flowsim.explore.point.config_key` (SHA-256 of the full normalised config and
the flowsim version), so a rerun or a resumed, interrupted sweep finds what was already computed.
Rows are written inside transactions (a row is either wholly there or not at all) in WAL mode, so a
process killed mid-sweep leaves every committed row intact and readable.

A file that is not a flowsim store (not SQLite, or SQLite without flowsim's marker table) is refused
with a one-line :class:`~flowsim.ConfigError` before anything is written to it.

Schema (version 1)::

    flowsim_meta(name TEXT PRIMARY KEY, value TEXT)        -- ('schema', 'flowsim-results'), ('schema_version', '1')
    points(key TEXT PRIMARY KEY, flowsim_version TEXT, created_s REAL, study TEXT, model TEXT, gpu TEXT,
           num_gpus INTEGER, step_time_s REAL, tokens_per_s REAL, mfu REAL, memory_bytes_per_gpu REAL,
           fits_memory INTEGER, config_json TEXT, point_json TEXT)
    memory_pruned(key TEXT PRIMARY KEY, memory_bytes_per_gpu REAL)  -- configs found not to fit (not simulated)
"""
from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

import pandas as pd

from flowsim._version import __version__
from flowsim.errors import ConfigError
from flowsim.config import SimConfig
from flowsim.explore.point import PointResult, config_json
from flowsim.io_text import check_output_file

SCHEMA = "flowsim-results"
SCHEMA_VERSION = "1"
_SQLITE_MAGIC = b"SQLite format 3\x00"  # first 16 bytes of every SQLite 3 file (sqlite.org/fileformat.html)
# How long one statement waits for another process's lock (sqlite3.connect timeout), and how often an
# operation that SQLite answers with SQLITE_BUSY at once (journal-mode switch) is retried: generous, since a
# sweep's writers hold the lock only for one short transaction each.
BUSY_TIMEOUT_S = 60.0
BUSY_RETRIES = 50
_COLUMNS = ("key", "flowsim_version", "created_s", "study", "model", "gpu", "num_gpus", "step_time_s",
            "tokens_per_s", "mfu", "memory_bytes_per_gpu", "fits_memory", "config_json", "point_json")


def _retry_busy(action, attempts: int = BUSY_RETRIES):
    """Run ``action()``, again after a short pause while SQLite reports the file busy or locked
    (``SQLITE_BUSY``: a concurrent opener switching the journal mode, where the busy timeout does not wait)."""
    for i in range(attempts):
        try:
            return action()
        except sqlite3.OperationalError as e:
            if i == attempts - 1 or not any(w in str(e) for w in ("locked", "busy")):
                raise
            time.sleep(0.05 * (i + 1))


def default_path() -> Path:
    """``$FLOWSIM_DB`` if set, else ``$XDG_CACHE_HOME/flowsim/results.sqlite`` (``~/.cache`` by default)."""
    if os.environ.get("FLOWSIM_DB"):
        return Path(os.environ["FLOWSIM_DB"])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "flowsim" / "results.sqlite"


def _check_foreign(path: Path) -> None:
    """Raise ConfigError unless ``path`` is absent, empty or starts like an SQLite file."""
    if not path.exists():
        return
    if path.is_dir():
        raise ConfigError("db", "is a directory, not a flowsim results database", str(path))
    with open(path, "rb") as f:
        head = f.read(len(_SQLITE_MAGIC))
    if head and head != _SQLITE_MAGIC:
        raise ConfigError("db", "is not a flowsim results database (not SQLite); nothing was written to it",
                          str(path))


class ResultStore:
    """A results database (use as a context manager, or call :meth:`close`).

    Parameters
    ----------
    path : str or Path, optional
        Database file. Default :func:`default_path`.
    create : bool
        Create the file (and its folder) if absent; else a missing file is an error.

    Raises
    ------
    ConfigError
        ``db`` is not a flowsim results database (another SQLite file, or not SQLite at all), the file
        cannot be opened, or it is missing and ``create`` is false.
    """

    def __init__(self, path: str | Path | None = None, create: bool = True):
        self.path = Path(path) if path is not None else default_path()
        if not create and not self.path.exists():
            raise ConfigError("db", "no results database here yet (flowsim tune and sweep create it)", str(self.path))
        _check_foreign(self.path)
        if path is None:  # the default location: its cache folder is ours to make
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise ConfigError("db", f"cannot create the cache folder: {e.strerror}", str(self.path)) from None
        elif not self.path.exists():
            check_output_file(self.path, "db")  # a folder the user named must exist: none is created
        try:
            self._db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S)
        except (OSError, sqlite3.Error) as e:
            raise ConfigError("db", f"cannot open: {e}", str(self.path)) from None
        try:
            _retry_busy(self._init_schema)
        except ConfigError:
            self._db.close()
            raise
        except sqlite3.DatabaseError as e:
            self._db.close()
            raise ConfigError("db", f"is not a usable flowsim results database ({e})", str(self.path)) from None

    def _tables(self) -> set:
        return {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")}

    def _init_schema(self) -> None:
        """Check the store's schema, creating it in one write transaction if it is missing.

        Safe under concurrent openers of a new file: WAL is set first (retried while another opener holds the
        file), then ``BEGIN IMMEDIATE`` takes the write lock (waiting up to the busy timeout), the tables are
        looked up again inside it and created with ``IF NOT EXISTS``, and the marker rows are written in the
        same transaction, so no opener ever sees the tables without their schema rows.
        """
        db = self._db
        self._refuse_foreign(self._tables())  # before anything is written, the journal mode included
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: committed rows survive a killed process
        if not {"flowsim_meta", "points", "memory_pruned"} <= self._tables():
            db.execute("BEGIN IMMEDIATE")
            try:
                self._create_schema()
            except BaseException:
                db.rollback()
                raise
            db.commit()
        meta = dict(db.execute("SELECT name, value FROM flowsim_meta"))
        if meta.get("schema") != SCHEMA or meta.get("schema_version") != SCHEMA_VERSION:
            raise ConfigError("db", f"has schema {meta.get('schema')} v{meta.get('schema_version')}, "
                              f"expected {SCHEMA} v{SCHEMA_VERSION}", str(self.path))

    def _refuse_foreign(self, tables: set) -> None:
        if tables and "flowsim_meta" not in tables:
            raise ConfigError("db", "is an SQLite database that flowsim did not create (tables: "
                              f"{', '.join(sorted(tables))}); nothing was written to it", str(self.path))

    def _create_schema(self) -> None:
        """Inside the open write transaction: refuse a foreign database, else create what is missing."""
        db = self._db
        tables = self._tables()
        self._refuse_foreign(tables)
        if not tables:
            db.execute("CREATE TABLE IF NOT EXISTS flowsim_meta(name TEXT PRIMARY KEY, value TEXT NOT NULL)")
            db.executemany("INSERT OR IGNORE INTO flowsim_meta VALUES (?, ?)",
                           [("schema", SCHEMA), ("schema_version", SCHEMA_VERSION)])
            db.execute("CREATE TABLE IF NOT EXISTS points(key TEXT PRIMARY KEY, flowsim_version TEXT NOT NULL, "
                       "created_s REAL NOT NULL, study TEXT, model TEXT, gpu TEXT, num_gpus INTEGER, "
                       "step_time_s REAL NOT NULL, tokens_per_s REAL, mfu REAL, "
                       "memory_bytes_per_gpu REAL, fits_memory INTEGER, config_json TEXT NOT NULL, "
                       "point_json TEXT NOT NULL)")
            db.execute("CREATE INDEX IF NOT EXISTS points_study ON points(study)")
        # added to schema v1 after its first release: created in older stores on open
        db.execute("CREATE TABLE IF NOT EXISTS memory_pruned(key TEXT PRIMARY KEY, "
                   "memory_bytes_per_gpu REAL NOT NULL)")

    def close(self) -> None:
        """Close the connection (committed rows are already on disk)."""
        self._db.close()

    def __enter__(self) -> "ResultStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def keys(self) -> frozenset:
        """Keys of every stored point."""
        return frozenset(r[0] for r in self._db.execute("SELECT key FROM points"))

    def __len__(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM points").fetchone()[0]

    def put(self, items: list, study: str = "") -> int:
        """Store ``items``, a list of (config, :class:`PointResult`) pairs, labelled ``study``, in one
        transaction; each config a :class:`~flowsim.config.SimConfig` or its
        :func:`~flowsim.explore.point.config_dict` (the same row either way).

        Points already stored are left as they are (their ``created_s`` too). Returns the rows added.
        """
        now = time.time()
        rows = []
        for cfg, p in items:
            if isinstance(cfg, SimConfig):
                head = (cfg.model.name, cfg.cluster.gpu, cfg.cluster.num_gpus)
                text = config_json(cfg)
            else:
                head = (cfg["model"].get("name"), cfg["cluster"]["gpu"], cfg["cluster"]["num_gpus"])
                text = json.dumps(cfg, sort_keys=True, default=str)
            rows.append((p.key, __version__, now, study, *head, p.step_time_s, p.tokens_per_s, p.mfu,
                         p.memory_bytes_per_gpu, int(p.fits_memory), text, json.dumps(p.to_dict())))
        before = self._db.total_changes
        with self._db:  # one transaction: all rows or none
            self._db.executemany(f"INSERT OR IGNORE INTO points VALUES ({', '.join('?' * len(_COLUMNS))})", rows)
        return self._db.total_changes - before

    def put_memory_pruned(self, items: dict) -> None:
        """Record configs that do not fit in memory (``items``: key -> peak bytes), in one transaction."""
        with self._db:
            self._db.executemany("INSERT OR IGNORE INTO memory_pruned VALUES (?, ?)", list(items.items()))

    def memory_pruned(self) -> dict:
        """Peak memory bytes of every config recorded as not fitting, by key."""
        return dict(self._db.execute("SELECT key, memory_bytes_per_gpu FROM memory_pruned"))

    def get(self, keys) -> dict:
        """Stored :class:`PointResult` of each of ``keys`` found, by key."""
        keys = list(keys)
        out = {}
        for i in range(0, len(keys), 900):  # SQLite's default limit on host parameters is 999
            chunk = keys[i:i + 900]
            q = f"SELECT key, point_json FROM points WHERE key IN ({', '.join('?' * len(chunk))})"
            for key, text in self._db.execute(q, chunk):
                out[key] = PointResult.from_dict(json.loads(text))
        return out

    def created(self) -> dict:
        """``created_s`` (Unix time the row was written) of every stored point, by key."""
        return dict(self._db.execute("SELECT key, created_s FROM points"))

    def frame(self, study: str | None = None) -> pd.DataFrame:
        """Every stored point (of ``study`` if given) as a DataFrame: one row per point, the columns of
        :meth:`PointResult.to_dict` plus ``study``, ``model``, ``gpu``, ``num_gpus``, ``flowsim_version``,
        ``created_s`` and the cluster fields of the config (``gpus_per_node``, ``nics_per_node``,
        ``nic_gbps``, ``oversubscription``, ``network``)."""
        q = "SELECT study, model, gpu, num_gpus, flowsim_version, created_s, config_json, point_json FROM points"
        args = ()
        if study is not None:
            q += " WHERE study = ?"
            args = (study,)
        rows = [point_row(json.loads(cfg_text), json.loads(pt_text), study=st, model=model, gpu=gpu, num_gpus=n,
                          flowsim_version=ver, created_s=created)
                for st, model, gpu, n, ver, created, cfg_text, pt_text in self._db.execute(q + " ORDER BY created_s",
                                                                                          args)]
        return pd.DataFrame(rows)


CLUSTER_COLUMNS = ("gpus_per_node", "nics_per_node", "nic_gbps", "oversubscription", "network")
"""Cluster fields of a point's config that :meth:`ResultStore.frame` shows as columns."""


def point_row(config: dict, point: dict, **meta) -> dict:
    """One row of a results frame: ``meta`` (study, model, gpu, ..., in column order), the cluster fields of the
    point's ``config`` (:data:`CLUSTER_COLUMNS`) and the point's own fields (:meth:`PointResult.to_dict`). The
    service's database (:func:`flowsim.service.store.points_frame`) builds its rows here too."""
    cluster = config["cluster"]
    return {**meta, **{k: cluster[k] for k in CLUSTER_COLUMNS}, **point}


def results_frame(db: str | Path | None = None, study: str | None = None) -> pd.DataFrame:
    """The pandas view of the results store ``db`` (default path if None), only ``study``'s points if given
    (see :meth:`ResultStore.frame`)."""
    with ResultStore(db, create=False) as store:
        return store.frame(study)
