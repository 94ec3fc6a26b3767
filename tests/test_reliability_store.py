"""The results store under concurrent processes, and sweep workers that end with their parent (issue 21)."""
from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import flowsim
from flowsim.explore.point import PointResult, config_dict
from flowsim.explore.store import ResultStore

REPO = Path(__file__).resolve().parents[1]
JOB = {"model": "llama3-8b", "cluster": "dgx-h100", "gpus": 8, "gbs": 64}
WRITERS, PUTS, ROWS_PER_PUT = 10, 5, 4


def _writer(path: str, writer: int, cfg: dict, point: PointResult, barrier, errors) -> None:
    try:
        barrier.wait(timeout=60)  # all ten open the new store at the same moment
        with ResultStore(path) as store:
            for p in range(PUTS):
                items = [(cfg, dataclasses.replace(point, key=f"w{writer}-p{p}-r{r}")) for r in range(ROWS_PER_PUT)]
                assert store.put(items, f"writer{writer}") == ROWS_PER_PUT
    except BaseException as e:  # noqa: BLE001 -- reported to the parent
        errors.put(f"{type(e).__name__}: {e}")
        raise SystemExit(1)


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
def test_ten_processes_create_and_write_one_new_store(tmp_path):
    cfg = flowsim.build_config(JOB)
    point = PointResult.of(cfg, flowsim.simulate(cfg))
    path = str(tmp_path / "new.sqlite")
    ctx = multiprocessing.get_context("fork")
    barrier, errors = ctx.Barrier(WRITERS), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(path, w, config_dict(cfg), point, barrier, errors))
             for w in range(WRITERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    failures = []
    while not errors.empty():
        failures.append(errors.get())
    assert failures == [] and [p.exitcode for p in procs] == [0] * WRITERS
    with ResultStore(path, create=False) as store:
        assert len(store) == WRITERS * PUTS * ROWS_PER_PUT  # 0 lost rows
        assert store.keys() == {f"w{w}-p{p}-r{r}" for w in range(WRITERS) for p in range(PUTS)
                                for r in range(ROWS_PER_PUT)}


def test_no_folder_is_created_for_a_store(tmp_path):
    with pytest.raises(flowsim.ConfigError) as e:
        ResultStore(tmp_path / "nonexistent" / "x.sqlite")
    assert str(e.value).startswith("db: folder does not exist (flowsim creates no folders you did not name)")
    assert not (tmp_path / "nonexistent").exists()


# --- sweep workers --------------------------------------------------------------------------------------------

def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid`` (from /proc)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(d.name))
    return out


def _wait(predicate, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_stopping_a_sweep_leaves_no_worker_behind(tmp_path, sig):
    env = {**os.environ, "FLOWSIM_DB": str(tmp_path / "r.sqlite")}
    cmd = [sys.executable, "-c", "from flowsim.cli import main; main()", "sweep",
           str(REPO / "examples" / "study_h100_nics.yaml"), "--jobs", "2", "--no-progress"]
    proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    pgid = proc.pid
    try:
        # the sweep and its two pool workers are running
        assert _wait(lambda: len(_group_members(pgid)) >= 3, 120), proc.stderr.read1().decode() if proc.poll() else ""
        os.kill(proc.pid, sig)
        proc.wait(timeout=60)
        assert _wait(lambda: _group_members(pgid) == [], 20), _group_members(pgid)
    finally:
        for pid in _group_members(pgid):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("args", [
    ["sweep", str(REPO / "examples" / "study_h100_nics.yaml"), "--plot", "{tmp}/nonexistent/p.png"],
    ["tune", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--gbs", "64", "--plot",
     "{tmp}/nonexistent/p.png"],
    ["sweep", str(REPO / "examples" / "study_h100_nics.yaml"), "--db", "{tmp}/nonexistent/r.sqlite"],
])
def test_output_paths_of_sweep_and_tune_are_checked_first(tmp_path, args):
    from click.testing import CliRunner

    from flowsim.cli import main

    r = CliRunner().invoke(main, [a.format(tmp=tmp_path) for a in args])
    assert r.exit_code == 2, r.output
    assert r.output.count("\n") == 1 and "folder does not exist (flowsim creates no folders you did not name)" \
        in r.output
    assert not (tmp_path / "nonexistent").exists()
