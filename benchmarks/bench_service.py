"""Load on the service, loopback only and bounded; figures go to docs/PERFORMANCE.md ("Service").

1. ``POST /v1/estimate`` from 32 concurrent clients (asyncio + httpx), :data:`REQUESTS_PER_CLIENT` requests each
   over :data:`N_CONFIGS` distinct configs: requests/s, p50 and p99 latency.
2. 1,000 distinct estimate jobs submitted over HTTP (32 concurrent clients), then drained by 2 ``flowsim
   worker`` processes: submissions/s and the time from the workers' start to the last job done.

The server is ``flowsim serve --workers 0:0`` on 127.0.0.1 in a subprocess, on a fresh SQLite file (default)
or a PostgreSQL database given with ``--db`` (it must be empty). Every loop is bounded in count and time
(:data:`DEADLINE_S`).

Run: ``python benchmarks/bench_service.py [--db postgresql://...]``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx
import numpy as np

CLIENTS = 32
REQUESTS_PER_CLIENT = 20
N_CONFIGS = 64  # distinct configs the estimate load cycles through
N_JOBS = 1000
N_WORKERS = 2
DEADLINE_S = 600.0  # no phase runs longer than this
MAIN = "import sys; from flowsim.cli import main; sys.exit(main())"


def _config(i: int) -> dict:
    """The i-th distinct config: llama3-8b on 8 H100, global batch 8 * (i + 1)."""
    return {"model": "llama3-8b", "cluster": "dgx-h100", "gpus": 8, "tp": 1, "gbs": 8 * (i + 1)}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _load(base: str, token: str, requests: list, clients: int) -> tuple[list, float]:
    """Send ``requests`` ((method, path, json) triples) from ``clients`` concurrent clients; latencies, wall s."""
    todo = list(enumerate(requests))
    latencies = [0.0] * len(requests)

    async def client():
        async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {token}"},
                                     timeout=DEADLINE_S) as c:
            while todo and time.perf_counter() < deadline:
                i, (method, path, body) = todo.pop()
                t = time.perf_counter()
                r = await c.request(method, path, json=body)
                r.raise_for_status()
                latencies[i] = time.perf_counter() - t

    deadline = time.perf_counter() + DEADLINE_S
    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return latencies, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", help="empty PostgreSQL database URL (default: a fresh SQLite file)")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="flowsim-bench-service-")
    url = args.db or f"sqlite:///{tmp}/service.sqlite"
    from flowsim.service.auth import create_token
    from flowsim.service.db import Job, open_db, session
    from sqlalchemy import func, select

    engine = open_db(url)
    token = create_token(engine, "bench")
    port = _port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-c", MAIN, "serve", "--db", url, "--port", str(port), "--workers",
                               "0:0", "--max-jobs", str(N_JOBS)], stderr=subprocess.DEVNULL, start_new_session=True)
    workers = []
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        warm = [("POST", "/v1/estimate", _config(i)) for i in range(N_CONFIGS)]
        asyncio.run(_load(base, token, warm, 1))  # JIT and caches warm before timing
        load = [("POST", "/v1/estimate", _config(i % N_CONFIGS)) for i in range(CLIENTS * REQUESTS_PER_CLIENT)]
        lat, wall = asyncio.run(_load(base, token, load, CLIENTS))
        est = {"clients": CLIENTS, "requests": len(lat), "wall_s": wall, "requests_per_s": len(lat) / wall,
               "p50_ms": 1e3 * float(np.percentile(lat, 50)), "p99_ms": 1e3 * float(np.percentile(lat, 99))}

        jobs = [("POST", "/v1/jobs", {"kind": "estimate", "config": _config(N_CONFIGS + i)}) for i in range(N_JOBS)]
        sub_lat, sub_wall = asyncio.run(_load(base, token, jobs, CLIENTS))
        start = time.perf_counter()
        workers = [subprocess.Popen([sys.executable, "-c", MAIN, "worker", "--db", url, "--exit-when-idle"],
                                    stderr=subprocess.DEVNULL, start_new_session=True) for _ in range(N_WORKERS)]
        first_done = None
        while time.perf_counter() - start < DEADLINE_S:
            with session(engine) as s:
                done = s.scalar(select(func.count()).select_from(Job).where(Job.state == "done"))
            if done and first_done is None:
                first_done = time.perf_counter() - start
            if done >= N_JOBS:
                break
            time.sleep(0.25)
        drain = time.perf_counter() - start
        print(json.dumps({"database": engine.dialect.name, "cpus": os.cpu_count(), "estimate": est,
                          "queue": {"jobs": N_JOBS, "workers": N_WORKERS, "submit_per_s": N_JOBS / sub_wall,
                                    "submit_p50_ms": 1e3 * float(np.percentile(sub_lat, 50)),
                                    "first_done_s": first_done, "drain_s": drain, "done": done,
                                    "jobs_per_s_after_first": (done - 1) / (drain - first_done)
                                    if first_done and drain > first_done else None}}, indent=2))
    finally:
        for p in [*workers, server]:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
            p.wait(60)


if __name__ == "__main__":
    main()
