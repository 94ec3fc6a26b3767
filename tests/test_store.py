"""Results store: round trip, foreign files refused untouched, and resume after a real kill."""
import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import flowsim
from flowsim.cli import main
from flowsim.explore.point import PointResult, config_key, config_dict
from flowsim.explore.store import ResultStore, results_frame
from flowsim.explore.study import load_study
from flowsim.explore.sweep import run_study

JOB = {"model": "llama2-7b", "cluster": "dgx-h100", "gpus": 8, "gbs": 16, "tp": 2, "sp": True}


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_round_trip_and_insert_keeps_the_first_row(tmp_path):
    cfg = flowsim.build_config(JOB)
    point = PointResult.of(cfg, flowsim.simulate(cfg))
    assert point.key == config_key(cfg) == config_key(flowsim.build_config(JOB))
    assert point.key != config_key(flowsim.build_config(JOB, tp=4))
    with ResultStore(tmp_path / "r.sqlite") as store:
        assert store.put([(config_dict(cfg), point)], "s") == 1
        first = store.created()[point.key]
        assert store.put([(config_dict(cfg), point)], "s") == 0
        assert store.created()[point.key] == first
        assert store.get([point.key, "missing"]) == {point.key: point}
    with ResultStore(tmp_path / "r.sqlite") as store:  # reopened
        assert len(store) == 1 and store.keys() == {point.key}
    df = results_frame(tmp_path / "r.sqlite")
    assert list(df["tp"]) == [2] and df["step_time_s"][0] == point.step_time_s and df["nics_per_node"][0] == 8
    assert sqlite3.connect(tmp_path / "r.sqlite").execute("PRAGMA journal_mode").fetchone()[0] == "wal"


@pytest.mark.parametrize("kind", ["text", "sqlite"])
def test_foreign_file_is_refused_and_left_untouched(tmp_path, kind):
    path = tmp_path / "other.db"
    if kind == "text":
        path.write_text("name,value\nnot,a database\n")
    else:
        db = sqlite3.connect(path)
        db.execute("CREATE TABLE invoices(id INTEGER, total REAL)")
        db.execute("INSERT INTO invoices VALUES (1, 9.5)")
        db.commit()
        db.close()
    before = _digest(path)
    with pytest.raises(flowsim.ConfigError, match="^db: is (not a flowsim|an SQLite database that flowsim)"):
        ResultStore(path)
    assert _digest(path) == before
    r = CliRunner().invoke(main, ["results", "--db", str(path)])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and r.output.startswith("Error: db:")
    assert _digest(path) == before


def test_results_cli(tmp_path):
    db = tmp_path / "r.sqlite"
    cfg = flowsim.build_config(JOB)
    with ResultStore(db) as store:
        store.put([(config_dict(cfg), PointResult.of(cfg, flowsim.simulate(cfg)))], "mine")
    runner = CliRunner()
    r = runner.invoke(main, ["results", "--db", str(db)])
    assert r.exit_code == 0 and "mine" in r.output and "llama2-7b" in r.output
    r = runner.invoke(main, ["results", "--db", str(db), "--json"])
    assert json.loads(r.output)["points"][0]["study"] == "mine"
    r = runner.invoke(main, ["results", "--db", str(db), "--csv", "--study", "other"])
    assert r.exit_code == 0 and r.output.strip() == ""
    r = runner.invoke(main, ["results", "--db", str(db), "--sort", "nope"])
    assert r.exit_code == 2 and "--sort: unknown column" in r.output
    r = runner.invoke(main, ["results", "--db", str(tmp_path / "none.sqlite")])
    assert r.exit_code == 2 and "db: no results database here yet" in r.output
    assert not (tmp_path / "none.sqlite").exists()


STUDY = """
name: killme
token_budget: 1e9
job: {model: llama2-7b, cluster: dgx-h100, gpus: 8, gbs: 32}
hardware:
  - {name: 400G, nic_gbps: 400}
  - {name: 100G, nic_gbps: 100}
tune: {max_vpp: 2, cp: [1], mbs: [1, 2], recompute: [none, full], zero: [0, 1, 3]}
"""


def test_killed_sweep_resumes_without_recomputing(tmp_path):
    study_file = tmp_path / "study.yaml"
    study_file.write_text(STUDY)
    db = tmp_path / "r.sqlite"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-c", "from flowsim.cli import main; main()", "sweep", str(study_file), "--db", str(db),
           "--jobs", "1", "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        rows = 0
        deadline = time.monotonic() + 120
        while rows < 40 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
            if db.exists():
                try:
                    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as ro:
                        rows = ro.execute("SELECT COUNT(*) FROM points").fetchone()[0]
                except sqlite3.OperationalError:  # schema not created yet
                    rows = 0
        assert proc.poll() is None, f"the sweep ended before it could be killed: {proc.stderr.read().decode()}"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    with ResultStore(db) as store:
        stored_before = store.created()
        for p in store.get(stored_before).values():  # every row whole: its JSON parses, its figures are set
            assert p.step_time_s > 0
    n_before = len(stored_before)
    assert n_before >= 40
    study = load_study(study_file)
    with ResultStore(db) as store:
        res = run_study(study, store=store, jobs=1)
        after = store.created()
    assert res.reused == n_before
    assert res.evaluated == len(after) - n_before > 0
    assert all(after[k] == t for k, t in stored_before.items())  # not rewritten
    with ResultStore(db) as store:
        again = run_study(study, store=store, jobs=1)
    assert again.evaluated == 0 and [r.best.key for r in again.rows] == [r.best.key for r in res.rows]
