"""The service's default limits, in one place without heavy imports (the CLI reads them for its option defaults)."""
from __future__ import annotations

from dataclasses import dataclass

MAX_BODY_BYTES = 16 * 2**20  # request size limit: 16 MiB (a large runs CSV or a trimmed Kineto trace)
MAX_ACTIVE_JOBS = 20  # per-user limit of queued + running jobs
LEASE_S = 30.0  # a job not heartbeaten for this long is requeued (3 missed heartbeats)


@dataclass(frozen=True)
class Limits:
    """Per-request and per-user limits: ``max_body_bytes`` (413 beyond) and ``max_active_jobs`` (429)."""

    max_body_bytes: int = MAX_BODY_BYTES
    max_active_jobs: int = MAX_ACTIVE_JOBS
