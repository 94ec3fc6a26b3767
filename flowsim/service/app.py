"""The HTTP API (FastAPI) and the web page of ``flowsim serve``.

Versioned under ``/v1``; OpenAPI docs at ``/docs``. Every ``/v1`` call needs ``Authorization: Bearer TOKEN``
(``flowsim serve token create NAME``): no or an unknown token is 401; another user's job or upload is 404
(an admin sees everyone's). Errors are ``{"error": "<one line>"}``: 422 for a bad config with the line the
CLI prints after ``Error:``, 413 for a body over the limit, 429 over the per-user limit of active jobs.

``POST /v1/estimate`` runs synchronously and returns what ``flowsim estimate --json`` prints; everything else
is a job (``POST /v1/jobs``, 202) run by the workers (:mod:`flowsim.service.worker`).
"""
from __future__ import annotations

import io
import json
import time
from pathlib import Path

from fastapi import Body, Depends, FastAPI, File, Form, HTTPException, Request, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles
from sqlalchemy import func, select, text
from sqlalchemy.engine import Engine

from flowsim._version import __version__
from flowsim.errors import ConfigError
from flowsim.service import kinds, queue, uploads
from flowsim.service.auth import Caller, caller_of
from flowsim.service.db import Job, Measurement, Result, User, session
from flowsim.service.limits import Limits
from flowsim.service.metrics import metrics_text

STATIC = Path(__file__).resolve().parent / "static"
PAGE_MAX = 200  # most jobs one GET /v1/jobs page returns


def _error(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


class BodyLimit:
    """ASGI middleware: 413 for a request whose body exceeds ``limit`` bytes, by Content-Length or as streamed."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        message = f"body: must be at most {self.limit} bytes"
        too_big = _error(413, message)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await too_big(scope, receive, send)
        seen = [0]
        started = [False]

        async def counted_receive():
            event = await receive()
            if event["type"] == "http.request":
                seen[0] += len(event.get("body", b""))
                if seen[0] > self.limit:
                    raise _TooBig(413, message)  # an HTTPException, so FastAPI's body parser passes it on
            return event

        async def tracked_send(message):
            if message["type"] == "http.response.start":
                started[0] = True
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except _TooBig:
            if not started[0]:
                await too_big(scope, receive, send)


class _TooBig(HTTPException):
    pass


def _job_view(job: Job, owner: str | None = None) -> dict:
    wait = (job.started_s - job.created_s) if job.started_s else None
    run = (job.finished_s - job.started_s) if job.finished_s and job.started_s else None
    return {"id": job.id, "kind": job.kind, "state": job.state, "progress": job.progress, "owner": owner,
            "created_s": job.created_s, "started_s": job.started_s, "finished_s": job.finished_s,
            "queue_wait_s": wait, "run_s": run, "attempts": job.attempts, "reused": bool(job.reused),
            "message": job.message, "params": json.loads(job.params_json),
            "result_url": f"/v1/jobs/{job.id}/result" if job.state == "done" else None}


def create_app(engine: Engine, limits: Limits = Limits()) -> FastAPI:
    """The FastAPI application on the (migrated) database ``engine``."""
    app = FastAPI(title="flowsim", version=__version__,
                  description="Predict the step time, MFU and memory of distributed LLM training.")
    app.add_middleware(BodyLimit, limit=limits.max_body_bytes)

    @app.exception_handler(ConfigError)
    async def _config_error(_req, e: ConfigError):
        return _error(422, str(e))

    @app.exception_handler(HTTPException)
    async def _http_error(_req, e: HTTPException):
        return _error(e.status_code, str(e.detail), getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(_req, e: Exception):
        text_ = str(e).strip().splitlines()
        return _error(500, f"{type(e).__name__}: {text_[0] if text_ else 'unexpected failure'}")

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_req, e: RequestValidationError):
        err = e.errors()[0] if e.errors() else {"loc": ("body",), "msg": "is invalid"}
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        if where == "body":
            return _error(422, "body: must be a JSON object sent with Content-Type: application/json "
                               f"({err.get('msg', 'is invalid')})")
        return _error(422, f"{where}: {err.get('msg', 'is invalid')}")

    def caller(request: Request) -> Caller:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise HTTPException(401, "authorization: needs 'Bearer TOKEN' (flowsim serve token create NAME)",
                                headers={"WWW-Authenticate": "Bearer"})
        who = caller_of(engine, token.strip())
        if who is None:
            raise HTTPException(401, "authorization: unknown token", headers={"WWW-Authenticate": "Bearer"})
        return who

    def own_job(job_id: str, who: Caller) -> tuple[Job, str]:
        with session(engine) as s:
            row = s.execute(select(Job, User.name).join(User, User.id == Job.owner_id)
                            .where(Job.id == job_id)).first()
        if row is None or (row[0].owner_id != who.id and not who.is_admin):
            raise HTTPException(404, f"job: no such job of yours (got {job_id})")
        return row[0], row[1]

    def measurement_kind(who: Caller):
        def kind_of(mid: str) -> str | None:
            with session(engine) as s:
                row = s.execute(select(Measurement.kind, Measurement.owner_id).where(Measurement.id == mid)).first()
            return row.kind if row is not None and (row.owner_id == who.id or who.is_admin) else None
        return kind_of

    @app.get("/", include_in_schema=False)
    def index():
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/healthz", tags=["ops"])
    def healthz():
        """The process is up."""
        return {"status": "ok", "version": __version__}

    @app.get("/readyz", tags=["ops"])
    def readyz():
        """The database answers (503 otherwise)."""
        try:
            with session(engine) as s:
                s.execute(text("SELECT 1"))
        except Exception as e:
            return _error(503, f"database: unreachable ({type(e).__name__})")
        return {"status": "ready"}

    @app.get("/metrics", tags=["ops"], response_class=PlainTextResponse)
    def metrics():
        """Prometheus text: queue depth by kind, jobs by state, job latency, simulations, workers."""
        return Response(metrics_text(engine), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/presets", tags=["config"])
    def presets(who: Caller = Depends(caller)):
        """Model and cluster presets, GPU datasheets, framework releases (their profiles' defaults) and the choices
        of the config's enumerated keys."""
        from flowsim.config import list_presets
        from flowsim.config.training import KERNEL_FUSIONS, PRECISIONS, RECOMPUTE, SCHEDULES
        from flowsim.gpu_specs import gpu_keys
        from flowsim.config.profiles import frameworks, releases

        return {"models": list_presets("models"), "clusters": list_presets("clusters"), "gpus": list(gpu_keys()),
                "frameworks": {f: list(releases(f)) for f in frameworks()},
                "precisions": list(PRECISIONS), "recompute": list(RECOMPUTE),
                "schedules": list(SCHEDULES), "kernel_fusion": list(KERNEL_FUSIONS), "job_kinds": list(kinds.KINDS),
                "calibrate_available": kinds.calibrate_available(), "measurement_kinds": list(uploads.KINDS)}

    @app.post("/v1/estimate", tags=["estimate"])
    def estimate(config: dict = Body(..., description="A config mapping (Megatron names, aliases, presets)."),
                 who: Caller = Depends(caller)):
        """One training step, synchronously: what ``flowsim estimate --json`` prints."""
        return kinds.estimate_json(config)

    @app.post("/v1/jobs", tags=["jobs"], status_code=202)
    def submit(body: dict = Body(..., description='{"kind": ..., "config": {...}} (see flowsim.service.kinds)'),
               who: Caller = Depends(caller)):
        """Queue a job; 202 with its id (a job whose result is already known is done at once)."""
        kind, params, key = kinds.prepare(body, measurement_kind(who))
        job = queue.submit(engine, who.id, kind, params, key, limits.max_active_jobs)
        if job is None:
            raise HTTPException(429, f"jobs: at most {limits.max_active_jobs} queued or running jobs per user; "
                                "wait for some to finish or cancel them", headers={"Retry-After": "10"})
        return _job_view(job, who.name)

    @app.get("/v1/jobs", tags=["jobs"])
    def list_jobs(limit: int = 50, offset: int = 0, state: str | None = None, who: Caller = Depends(caller)):
        """The caller's jobs (an admin's: everyone's), newest first, ``limit`` per page from ``offset``."""
        if not 1 <= limit <= PAGE_MAX:
            raise ConfigError("limit", f"must be in 1..{PAGE_MAX}", limit)
        if offset < 0:
            raise ConfigError("offset", "must be >= 0", offset)
        q = queue.visible(select(Job, User.name).join(User, User.id == Job.owner_id), who)
        n = queue.visible(select(func.count()).select_from(Job), who)
        if state is not None:
            if state not in ("queued", "running", "done", "failed", "cancelled"):
                raise ConfigError("state", "must be queued, running, done, failed or cancelled", state)
            q, n = q.where(Job.state == state), n.where(Job.state == state)
        with session(engine) as s:
            rows = s.execute(q.order_by(Job.created_s.desc(), Job.id).limit(limit).offset(offset)).all()
            total = s.scalar(n)
        return {"jobs": [_job_view(j, name) for j, name in rows], "total": total, "limit": limit, "offset": offset}

    @app.get("/v1/jobs/{job_id}", tags=["jobs"])
    def get_job(job_id: str, who: Caller = Depends(caller)):
        """State, progress and timings of one job."""
        return _job_view(*own_job(job_id, who))

    @app.get("/v1/jobs/{job_id}/result", tags=["jobs"])
    def get_result(job_id: str, format: str = "json", who: Caller = Depends(caller)):
        """The result of a done job: JSON (``format=json``) or its main table as CSV (``format=csv``)."""
        job, _ = own_job(job_id, who)
        if format not in ("json", "csv"):
            raise ConfigError("format", "must be json or csv", format)
        if job.state != "done":
            raise HTTPException(409, f"job: is {job.state}, not done" + (f" ({job.message})" if job.message else ""))
        with session(engine) as s:
            text_ = s.scalar(select(Result.result_json).where(Result.key == job.key))
        result = json.loads(text_)
        if format == "csv":
            buf = io.StringIO()
            kinds.result_frame(job.kind, result).to_csv(buf, index=False)
            return Response(buf.getvalue(), media_type="text/csv",
                            headers={"Content-Disposition": f'attachment; filename="{job.kind}-{job.id}.csv"'})
        return {"job": job.id, "kind": job.kind, "key": job.key, "result": result}

    @app.delete("/v1/jobs/{job_id}", tags=["jobs"])
    def cancel_job(job_id: str, who: Caller = Depends(caller)):
        """Cancel a queued or running job (409 if it has finished)."""
        job, owner = own_job(job_id, who)
        if not queue.cancel(engine, job.id):
            raise HTTPException(409, f"job: is {job.state}, nothing to cancel")
        return _job_view(*own_job(job_id, who))

    @app.post("/v1/measurements", tags=["measurements"], status_code=201)
    async def upload(kind: str = Form(..., description="runs, nccl-tests or kineto"), file: UploadFile = File(...),
                     who: Caller = Depends(caller)):
        """Store a measurement file after its reader accepted it (422 with the reason otherwise)."""
        content = await file.read()
        summary = await run_in_threadpool(uploads.parse, kind, file.filename or "", content)
        m = Measurement(id=queue.new_id(), owner_id=who.id, kind=kind, filename=uploads.label(file.filename),
                        sha256=uploads.sha256(content), size_bytes=len(content), content=content,
                        summary_json=json.dumps(kinds.jsonable(summary)), created_s=time.time())
        with session(engine, write=True) as s:
            s.add(m)
        return _measurement_view(m)

    @app.get("/v1/measurements", tags=["measurements"])
    def list_measurements(who: Caller = Depends(caller)):
        """The caller's uploads (an admin's: everyone's), newest first."""
        q = select(Measurement)
        if not who.is_admin:
            q = q.where(Measurement.owner_id == who.id)
        with session(engine) as s:
            return {"measurements": [_measurement_view(m) for m in s.scalars(q.order_by(Measurement.created_s.desc()))]}

    @app.get("/v1/measurements/{mid}", tags=["measurements"])
    def get_measurement(mid: str, who: Caller = Depends(caller)):
        """One upload's kind, size, hash and summary."""
        with session(engine) as s:
            m = s.get(Measurement, mid)
        if m is None or (m.owner_id != who.id and not who.is_admin):
            raise HTTPException(404, f"measurement: no such upload of yours (got {mid})")
        return _measurement_view(m)

    return app


def _measurement_view(m: Measurement) -> dict:
    return {"id": m.id, "kind": m.kind, "filename": m.filename, "size_bytes": m.size_bytes, "sha256": m.sha256,
            "created_s": m.created_s, "summary": json.loads(m.summary_json)}
