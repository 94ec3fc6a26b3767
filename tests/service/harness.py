"""Helpers of the service tests: a real server (uvicorn in a subprocess, on loopback), workers, tokens."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx

MAIN = "import sys; from flowsim.cli import main; sys.exit(main())"
START_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def flowsim_cmd(*args) -> list:
    return [sys.executable, "-c", MAIN, *args]


class Server:
    """``flowsim serve`` in a subprocess on 127.0.0.1 (no embedded workers unless ``workers`` says so)."""

    def __init__(self, db_url: str, workers: str = "0:0", *extra):
        self.db_url, self.workers, self.extra = db_url, workers, extra
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def start(self) -> "Server":
        self.proc = subprocess.Popen(flowsim_cmd("serve", "--db", self.db_url, "--port", str(self.port),
                                                 "--workers", self.workers, "--lease-s", "2", *self.extra),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        deadline = time.time() + START_TIMEOUT_S
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.proc.stderr.read().decode()[-2000:]}")
            try:
                if httpx.get(self.base + "/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.2)
        raise RuntimeError("server did not start")

    def kill9(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def client(self, token: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.base, headers=headers, timeout=60)


_STARTED: list = []
"""Every worker process a test started (stopped after the test by the autouse fixture in conftest.py)."""


def start_worker(db_url: str, *extra) -> subprocess.Popen:
    proc = subprocess.Popen(flowsim_cmd("worker", "--db", db_url, "--lease-s", "2", *extra),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    _STARTED.append(proc)
    return proc


def stop_all_workers() -> None:
    """Kill every worker a test started and left running (a failed assertion skips the test's own stop), so
    none outlives its test."""
    while _STARTED:
        stop_worker(_STARTED.pop(), signal.SIGKILL)


def stop_worker(proc: subprocess.Popen, sig=signal.SIGTERM) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def make_token(db_url: str, name: str, admin: bool = False) -> str:
    from flowsim.service.auth import create_token
    from flowsim.service.db import open_db

    engine = open_db(db_url)
    try:
        return create_token(engine, name, admin=admin)
    finally:
        engine.dispose()


def wait_for(pred, timeout_s: float, what: str, every_s: float = 0.2):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out waiting for {what}")


