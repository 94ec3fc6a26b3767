"""Every endpoint of the service over real HTTP on loopback: auth, limits, errors, jobs of each kind, uploads."""
from __future__ import annotations

import csv
import io
import json

import pytest
from click.testing import CliRunner
from harness import Server, make_token, start_worker

from flowsim.cli import main

MAX_BODY_MB = 0.25  # the server's body limit in these tests (262,144 bytes)
MAX_JOBS = 6  # the server's per-user limit of active jobs in these tests
SMALL = {"model": "llama3-8b", "cluster": "dgx-h100", "gpus": 8, "gbs": 64}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('api') / 'service.sqlite'}"
    srv = Server(url, "0:0", "--max-body-mb", str(MAX_BODY_MB), "--max-jobs", str(MAX_JOBS)).start()
    srv.tokens = {"alice": make_token(url, "alice"), "bob": make_token(url, "bob"),
                  "root": make_token(url, "root", admin=True)}
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def alice(server):
    with server.client(server.tokens["alice"]) as c:
        yield c


@pytest.fixture(scope="module")
def bob(server):
    with server.client(server.tokens["bob"]) as c:
        yield c


def run_queue(server) -> None:
    """Run a worker until the queue is empty."""
    proc = start_worker(server.db_url, "--exit-when-idle")
    assert proc.wait(240) == 0, proc.stderr.read().decode()[-2000:]


def cancel_all(client) -> None:
    for j in client.get("/v1/jobs", params={"limit": 200}).json()["jobs"]:
        if j["state"] in ("queued", "running"):
            client.delete(f"/v1/jobs/{j['id']}")


def test_ops_endpoints_docs_and_page(server):
    with server.client(None) as c:
        assert c.get("/healthz").json()["status"] == "ok"
        assert c.get("/readyz").json() == {"status": "ready"}
        metrics = c.get("/metrics")
        assert metrics.headers["content-type"].startswith("text/plain")
        assert 'flowsim_queue_depth{kind="tune"}' in metrics.text
        assert "flowsim_job_latency_seconds_bucket" in metrics.text and "flowsim_workers" in metrics.text
        spec = c.get("/openapi.json").json()
        assert {"/v1/estimate", "/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/result", "/v1/presets",
                "/v1/measurements"} <= set(spec["paths"])
        assert "swagger" in c.get("/docs").text.lower()
        page = c.get("/")
        assert page.status_code == 200 and "<form" in page.text
        assert c.get("/static/app.js").status_code == 200


@pytest.mark.parametrize("path", ["/v1/presets", "/v1/jobs", "/v1/measurements"])
def test_no_or_unknown_token_is_401(server, path):
    with server.client(None) as c:
        r = c.get(path)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"].startswith("authorization: needs 'Bearer TOKEN'")
        assert c.post("/v1/estimate", json=SMALL).status_code == 401
    with server.client("fs_not-a-token") as c:
        assert c.get(path).json() == {"error": "authorization: unknown token"}


def test_presets(alice):
    r = alice.get("/v1/presets")
    assert r.status_code == 200, r.text
    p = r.json()
    assert "llama3-8b" in p["models"] and "dgx-h100" in p["clusters"] and "h100-sxm" in p["gpus"]
    assert set(p["job_kinds"]) == {"estimate", "tune", "sweep", "validate", "collective", "calibrate"}
    assert "megatron-core" in p["frameworks"] and p["frameworks"]["megatron-core"]


def test_estimate_is_the_cli_json(alice):
    r = alice.post("/v1/estimate", json={**SMALL, "tp": 2, "sp": True})
    assert r.status_code == 200
    cli = CliRunner().invoke(main, ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8",
                                    "--gbs", "64", "--tp", "2", "--sp", "--json"])
    assert cli.exit_code == 0
    assert r.json() == json.loads(cli.output)


def test_bad_config_is_422_with_the_cli_line(alice):
    cli = CliRunner().invoke(main, ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8",
                                    "--tp", "3", "--gbs", "64"])
    assert cli.exit_code == 2
    line = cli.output.strip().splitlines()[-1]
    assert line.startswith("Error: ")
    r = alice.post("/v1/estimate", json={**SMALL, "tp": 3})
    assert r.status_code == 422 and r.json() == {"error": line[len("Error: "):]}
    r = alice.post("/v1/jobs", json={"kind": "estimate", "config": {**SMALL, "tp": 3}})
    assert r.status_code == 422 and r.json() == {"error": line[len("Error: "):]}
    r = alice.post("/v1/estimate", json={**SMALL, "model": "gpt-9"})
    assert r.status_code == 422 and r.json()["error"].startswith("model: ")


@pytest.mark.parametrize("body, error", [
    ({"kind": "teleport"}, "kind: must be one of estimate, tune, sweep, validate, collective, calibrate"),
    ({"kind": "estimate"}, "config: must be a non-empty mapping"),
    ({"kind": "estimate", "config": SMALL, "extra": 1}, "extra: unknown job field"),
    ({"kind": "tune", "config": {**SMALL, "tp": 2}}, "tp: is chosen by the tuner"),
    ({"kind": "tune", "config": SMALL, "space": {"warp": [1]}}, "space.warp: unknown"),
    ({"kind": "validate", "measurement": "nope"}, "measurement: no such upload of yours"),
    ({"kind": "collective", "config": {"op": "allreduce", "cluster": "dgx-h100", "sizes": "1Q"}}, "--sizes: "),
])
def test_bad_jobs_are_422(alice, body, error):
    r = alice.post("/v1/jobs", json=body)
    assert r.status_code == 422 and r.json()["error"].startswith(error), r.json()


def test_calibrate_only_when_available(alice):
    from flowsim.service.kinds import calibrate_available

    r = alice.post("/v1/jobs", json={"kind": "calibrate", "measurement": "nope"})
    if calibrate_available():
        assert r.status_code == 422 and r.json()["error"].startswith("measurement: no such upload of yours")
        r = alice.post("/v1/jobs", json={"kind": "calibrate", "measurement": "nope", "grid": 2})
        assert r.status_code == 422 and r.json()["error"].startswith("grid: must be an integer in 3..25")
    else:
        assert r.status_code == 422 and r.json()["error"].startswith("kind: calibrate is not available")


def test_malformed_bodies(alice):
    r = alice.post("/v1/estimate", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and "\n" not in r.json()["error"]
    r = alice.post("/v1/estimate", content=b"[1, 2]", headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["error"].startswith("body: must be a JSON object")


def test_oversized_body_is_413(alice):
    big = {**SMALL, "padding": "x" * int(MAX_BODY_MB * 2**20)}
    r = alice.post("/v1/estimate", json=big)
    assert r.status_code == 413 and r.json() == {"error": f"body: must be at most {int(MAX_BODY_MB * 2**20)} bytes"}

    def chunks():  # no Content-Length: counted as it streams
        for _ in range(64):
            yield b"x" * 8192

    r = alice.post("/v1/estimate", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json() == {"error": f"body: must be at most {int(MAX_BODY_MB * 2**20)} bytes"}


def test_jobs_owner_admin_cancel_and_paging(server, alice, bob):
    ids = []
    for tp in (1, 2, 4):
        r = alice.post("/v1/jobs", json={"kind": "estimate", "config": {**SMALL, "tp": tp, "gbs": 32}})
        assert r.status_code == 202 and r.json()["state"] == "queued"
        ids.append(r.json()["id"])
    job = alice.get(f"/v1/jobs/{ids[0]}").json()
    assert job["kind"] == "estimate" and job["owner"] == "alice" and job["params"]["config"]["tp"] == 1
    assert alice.get(f"/v1/jobs/{ids[0]}/result").status_code == 409
    for path in (f"/v1/jobs/{ids[0]}", f"/v1/jobs/{ids[0]}/result"):
        r = bob.get(path)
        assert r.status_code == 404 and r.json()["error"].startswith("job: no such job of yours")
    assert bob.delete(f"/v1/jobs/{ids[0]}").status_code == 404
    assert bob.get("/v1/jobs").json()["total"] == 0
    page = alice.get("/v1/jobs", params={"limit": 2}).json()
    assert page["total"] == 3 and [j["id"] for j in page["jobs"]] == ids[::-1][:2]
    assert [j["id"] for j in alice.get("/v1/jobs", params={"limit": 2, "offset": 2}).json()["jobs"]] == ids[:1]
    assert alice.get("/v1/jobs", params={"limit": 0}).status_code == 422
    with server.client(server.tokens["root"]) as root:
        assert {j["id"] for j in root.get("/v1/jobs").json()["jobs"]} >= set(ids)
        assert root.get(f"/v1/jobs/{ids[1]}").json()["owner"] == "alice"
        assert root.delete(f"/v1/jobs/{ids[1]}").json()["state"] == "cancelled"
    assert alice.delete(f"/v1/jobs/{ids[2]}").json()["state"] == "cancelled"
    assert alice.delete(f"/v1/jobs/{ids[2]}").status_code == 409
    assert alice.get("/v1/jobs", params={"state": "cancelled"}).json()["total"] == 2
    cancel_all(alice)


def test_over_the_per_user_limit_is_429(alice, bob):
    for i in range(MAX_JOBS):
        r = alice.post("/v1/jobs", json={"kind": "estimate", "config": {**SMALL, "gbs": 8 * (i + 1)}})
        assert r.status_code == 202
    r = alice.post("/v1/jobs", json={"kind": "estimate", "config": {**SMALL, "gbs": 512}})
    assert r.status_code == 429 and r.json()["error"].startswith(f"jobs: at most {MAX_JOBS} queued or running")
    assert "retry-after" in r.headers
    assert bob.post("/v1/jobs", json={"kind": "estimate", "config": SMALL}).status_code == 202  # per user
    cancel_all(alice)
    cancel_all(bob)
    assert alice.post("/v1/jobs", json={"kind": "estimate", "config": {**SMALL, "gbs": 512}}).status_code == 202
    cancel_all(alice)


def _runs_csv(shared_data, rows: int = 4) -> bytes:
    lines = (shared_data / "curated" / "training_runs_public.csv").read_text().splitlines()
    return ("\n".join(lines[:rows + 1]) + "\n").encode()


@pytest.mark.parametrize("kind, name, content, error", [
    ("runs", "x.csv", b"", "file: is empty"),
    ("runs", "x.csv", b"\xff\xfe\x00garbage", "file: is not UTF-8 text"),
    ("runs", "../../etc/passwd", b"a,b\n1,2\n", "id: required column of runs schema v1 is missing (got passwd)"),
    ("nccl-tests", "log.txt", b"hello\nworld\n", "log: "),
    ("kineto", "t.json", b"{\"traceEvents\": 3", "trace"),
    ("kineto", "deep.json", b"[" * 100_000, ""),  # the reader's or our own line, naming the client's file
    ("pdf", "x.pdf", b"%PDF", "kind: must be one of runs, nccl-tests, kineto"),
])
def test_malformed_uploads_rejected_in_one_line(alice, kind, name, content, error):
    r = alice.post("/v1/measurements", data={"kind": kind}, files={"file": (name, content)})
    assert r.status_code == 422, r.text
    msg = r.json()["error"]
    assert "\n" not in msg and "/tmp" not in msg and "upload." not in msg and msg.startswith(error), msg
    assert error or name in msg


def test_upload_without_file_is_422(alice):
    r = alice.post("/v1/measurements", data={"kind": "runs"})
    assert r.status_code == 422 and r.json()["error"].startswith("file: ")


def test_measurements_and_every_job_kind_complete(server, alice, bob, shared_data):
    runs = alice.post("/v1/measurements", data={"kind": "runs"},
                      files={"file": ("runs.csv", _runs_csv(shared_data))})
    assert runs.status_code == 201, runs.text
    m = runs.json()
    assert m["summary"]["rows"] == 4 and m["filename"] == "runs.csv"
    log = (shared_data / "nccl-tests" / "h100_8gpu_allreduce_ring_together.txt").read_bytes()
    nccl = alice.post("/v1/measurements", data={"kind": "nccl-tests"}, files={"file": ("ar.txt", log)})
    assert nccl.status_code == 201 and nccl.json()["summary"]["rows"] > 10
    trace = {"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1.0, "dur": 2.0}]}
    kin = alice.post("/v1/measurements", data={"kind": "kineto"},
                     files={"file": ("t.json", json.dumps(trace).encode())})
    assert kin.status_code == 201 and kin.json()["summary"]["events"] == 1
    assert {x["id"] for x in alice.get("/v1/measurements").json()["measurements"]} == \
        {m["id"], nccl.json()["id"], kin.json()["id"]}
    assert bob.get(f"/v1/measurements/{m['id']}").status_code == 404
    assert bob.post("/v1/jobs", json={"kind": "validate", "measurement": m["id"]}).status_code == 422
    r = alice.post("/v1/jobs", json={"kind": "validate", "measurement": nccl.json()["id"]})
    assert r.status_code == 422 and "validate needs a runs CSV" in r.json()["error"]

    bodies = {
        "estimate": {"kind": "estimate", "config": {**SMALL, "tp": 8}},
        "tune": {"kind": "tune", "config": SMALL, "space": {"tp": [1, 2], "pp": [1], "cp": [1], "mbs": [1, 2],
                                                             "recompute": ["none"], "zero": [0, 1]}, "top": 3},
        "sweep": {"kind": "sweep", "config": {"name": "nics", "token_budget": 1e9, "job": SMALL,
                                              "layout": {"tp": 1}, "grid": {"nic_gbps": [200, 400]}}},
        "validate": {"kind": "validate", "measurement": m["id"]},
        "collective": {"kind": "collective", "config": {"op": "allreduce", "cluster": "dgx-h100", "nodes": 2,
                                                        "sizes": "1M:4M"}},
    }
    from flowsim.service.kinds import calibrate_available

    if calibrate_available():
        bodies["calibrate"] = {"kind": "calibrate", "measurement": m["id"], "grid": 3}
    ids = {}
    for kind, body in bodies.items():
        r = alice.post("/v1/jobs", json=body)
        assert r.status_code == 202, r.text
        ids[kind] = r.json()["id"]
    run_queue(server)
    for kind, jid in ids.items():
        job = alice.get(f"/v1/jobs/{jid}").json()
        assert job["state"] == "done" and job["progress"] == 1.0 and job["run_s"] >= 0, job
        res = alice.get(f"/v1/jobs/{jid}/result").json()
        assert res["kind"] == kind
        table = alice.get(f"/v1/jobs/{jid}/result", params={"format": "csv"})
        assert table.headers["content-type"].startswith("text/csv")
        assert kind == "calibrate" or list(csv.DictReader(io.StringIO(table.text))), kind
    est = alice.get(f"/v1/jobs/{ids['estimate']}/result").json()["result"]
    assert est == alice.post("/v1/estimate", json={**SMALL, "tp": 8}).json()
    tune = alice.get(f"/v1/jobs/{ids['tune']}/result").json()["result"]
    assert tune["fitting"] == len(tune["ranked"]) >= 1 and len(tune["top"]) <= 3
    assert [p["step_time_s"] for p in tune["ranked"]] == sorted(p["step_time_s"] for p in tune["ranked"])
    assert len(alice.get(f"/v1/jobs/{ids['sweep']}/result").json()["result"]["points"]) == 2
    assert len(alice.get(f"/v1/jobs/{ids['collective']}/result").json()["result"]["rows"]) == 3
    assert alice.get(f"/v1/jobs/{ids['validate']}/result").json()["result"]["summary"]["n"] >= 1
    assert alice.get(f"/v1/jobs/{ids['tune']}/result", params={"format": "xml"}).status_code == 422
    if "calibrate" in ids:  # the upload fed a calibration: flowsim calibrate's figures and its profile
        cal = alice.get(f"/v1/jobs/{ids['calibrate']}/result").json()["result"]
        assert cal["errors"]["runs"] == 4 and "parameters" in cal["profile"]

    again = alice.post("/v1/jobs", json=bodies["estimate"]).json()  # the same config: no second simulation
    assert again["state"] == "done" and again["reused"] is True
    assert alice.get(f"/v1/jobs/{again['id']}/result").json()["result"] == est
    metrics = alice.get("/metrics").text
    assert f'flowsim_jobs{{state="done"}} {len(ids) + 1}.0' in metrics


def test_token_create_prints_the_token_last(tmp_path):
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    r = CliRunner().invoke(main, ["serve", "token", "create", "carol", "--admin", "--db", url])
    assert r.exit_code == 0
    token = r.output.strip().splitlines()[-1]
    from flowsim.service.auth import caller_of
    from flowsim.service.db import open_db

    who = caller_of(open_db(url), token)
    assert who.name == "carol" and who.is_admin
    bad = CliRunner().invoke(main, ["serve", "token", "create", "dave", "--db", "mysql://x"])
    assert bad.exit_code == 2 and bad.output.startswith("Error: --db: must be sqlite:///PATH or postgresql://")
    bad = CliRunner().invoke(main, ["serve", "--workers", "3:1", "--db", url])
    assert bad.exit_code == 2 and "--workers: must be MIN:MAX" in bad.output


def test_first_start_prints_an_admin_token(tmp_path):
    server = Server(f"sqlite:///{tmp_path / 'fresh.sqlite'}", "0:0").start()
    try:
        first = server.proc.stderr.readline().decode()
        assert first.startswith("first start: admin token (shown once): fs_")
        with server.client(first.split()[-1]) as admin:
            assert admin.get("/v1/jobs").json() == {"jobs": [], "total": 0, "limit": 50, "offset": 0}
            r = admin.post("/v1/jobs", json={"kind": "estimate", "config": SMALL})
            assert r.status_code == 202 and r.json()["owner"] == "admin"
        assert server.proc.stderr.readline().decode().startswith(f"flowsim serve: http://127.0.0.1:{server.port}")
    finally:
        server.stop()
