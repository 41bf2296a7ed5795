"""Status queries: one row per job (state, progress, ETA, output), sweep summaries, worker health.

State comes from two sources that can disagree for a moment: rq's status (queued,
started, finished, failed, canceled, ...) and the render task's meta["h3r"]["state"]
(JobPhase). `job_state` is the one place that reconciles them.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import redis
from rq.job import Job, JobStatus
from rq.registry import (
    CanceledJobRegistry,
    DeferredJobRegistry,
    FailedJobRegistry,
    FinishedJobRegistry,
    ScheduledJobRegistry,
    StartedJobRegistry,
)
from rq.serializers import JSONSerializer

from h3render.queue.enqueue import SWEEP_JOBS_KEY, SWEEP_KEY, SWEEPS_KEY, queue
from h3render.queue.errors import NotFoundError
from h3render.queue.job import JobPhase
from h3render.settings import Settings
from h3render.keys import HEALTH_KEY


@dataclass
class JobRow:
    id: str
    state: str
    rq_status: str
    step: int | None
    steps: int | None
    progress: float | None  # 0..1 over the whole job when known
    eta_s: float | None
    estimate_s: float | None
    output_dir: str | None
    error: str | None
    label: str
    sweep_id: str | None
    preview: bool
    retries_left: int | None
    enqueued_at: float | None
    ended_at: float | None
    preview_step: int | None = None  # the step of the latest preview in meta (job_preview reads it)

    def to_dict(self) -> dict:
        return asdict(self)


def job_state(rq_status: str | None, meta_state: str | None) -> JobPhase:
    """The state status shows, from rq's status and the task's meta state.

    rq decides whether the job is waiting, running or over; the meta refines
    "running" into a phase and tells a canceled job from a failed one (the task may
    end a canceled render by raising, which rq records as failed).
    """
    meta = JobPhase(meta_state) if meta_state in JobPhase._value2member_map_ else None
    if rq_status in (JobStatus.QUEUED, JobStatus.SCHEDULED, JobStatus.DEFERRED, JobStatus.CREATED, None):
        return JobPhase.queued
    if rq_status == JobStatus.STARTED:
        return meta if meta is not None and not meta.terminal else JobPhase.loading
    if rq_status == JobStatus.FINISHED:
        return JobPhase.canceled if meta == JobPhase.canceled else JobPhase.finished
    if rq_status in (JobStatus.CANCELED, JobStatus.STOPPED):
        return JobPhase.canceled
    if rq_status == JobStatus.FAILED:
        return JobPhase.canceled if meta == JobPhase.canceled else JobPhase.failed
    return meta or JobPhase.queued


def _ts(dt) -> float | None:
    return dt.timestamp() if dt else None


def row_from_job(job: Job) -> JobRow:
    meta = (job.meta or {}).get("h3r") or {}
    status = job.get_status(refresh=False)
    state = job_state(status.value if status else None, meta.get("state"))
    step, steps = meta.get("step"), meta.get("steps")
    estimate = (meta.get("estimate") or {}).get("seconds")
    progress = None
    if state == JobPhase.finished:
        progress = 1.0
    elif isinstance(step, int) and isinstance(steps, int) and steps > 0:
        progress = min(1.0, step / steps)
    eta = meta.get("eta_s") if state not in (JobPhase.queued,) and not state.terminal else None
    if state == JobPhase.queued:
        eta = estimate
    error = meta.get("error")
    if state == JobPhase.failed and not error and job.exc_info:
        error = job.exc_info.strip().splitlines()[-1][:300]
    return JobRow(
        id=job.id,
        state=state.value,
        rq_status=status.value if status else "unknown",
        step=step if isinstance(step, int) else None,
        steps=steps if isinstance(steps, int) else None,
        progress=progress,
        eta_s=float(eta) if isinstance(eta, (int, float)) else None,
        estimate_s=float(estimate) if isinstance(estimate, (int, float)) else None,
        output_dir=meta.get("output_dir"),
        error=error if state in (JobPhase.failed, JobPhase.canceled, JobPhase.queued) else None,
        label=job.description or "",
        sweep_id=meta.get("sweep_id"),
        preview=bool(meta.get("preview")),
        retries_left=job.retries_left,
        enqueued_at=_ts(job.enqueued_at),
        ended_at=_ts(job.ended_at),
        preview_step=meta.get("preview_step") if isinstance(meta.get("preview_step"), int) else None,
    )


def job_rows(r: redis.Redis, ids: Iterable[str]) -> list[JobRow]:
    """Rows for these ids, in order; ids whose job expired or never existed are skipped."""
    ids = list(ids)
    jobs = Job.fetch_many(ids, connection=r, serializer=JSONSerializer) if ids else []
    return [row_from_job(j) for j in jobs if j is not None]


def fetch_job(r: redis.Redis, job_id: str) -> Job:
    from rq.exceptions import NoSuchJobError

    try:
        return Job.fetch(job_id, connection=r, serializer=JSONSerializer)
    except NoSuchJobError:
        raise NotFoundError(f"job {job_id!r} not found (wrong id, or its 30-day record expired)") from None


def job_status(r: redis.Redis, job_id: str) -> JobRow:
    return row_from_job(fetch_job(r, job_id))


def job_preview(r: redis.Redis, job_id: str) -> tuple[int, bytes] | None:
    """(step, PNG bytes) of the job's latest preview frame (meta "preview_step" and
    "preview_png", base64), or None when it has none (yet)."""
    import base64
    import binascii

    meta = (fetch_job(r, job_id).meta or {}).get("h3r") or {}
    step, png = meta.get("preview_step"), meta.get("preview_png")
    if not isinstance(step, int) or not isinstance(png, str):
        return None
    try:
        return step, base64.b64decode(png, validate=True)
    except (binascii.Error, ValueError):
        return None


def sweep_job_ids(r: redis.Redis, sweep_id: str) -> list[str]:
    if not r.exists(SWEEP_KEY.format(id=sweep_id)):
        raise NotFoundError(f"sweep {sweep_id!r} not found")
    return [i.decode() for i in r.lrange(SWEEP_JOBS_KEY.format(id=sweep_id), 0, -1)]


def summarize(rows: list[JobRow]) -> dict[str, Any]:
    """Counts per state, done fraction and the remaining time of a set of jobs."""
    counts = Counter(row.state for row in rows)
    remaining = 0.0
    for row in rows:
        if row.state == JobPhase.queued.value:
            remaining += row.estimate_s or 0.0
        elif not JobPhase(row.state).terminal:
            remaining += row.eta_s if row.eta_s is not None else (row.estimate_s or 0.0)
    done = sum(counts[s.value] for s in JobPhase if s.terminal)
    return {"jobs": len(rows), "done": done, "states": dict(counts), "remaining_s": round(remaining, 1)}


def sweep_status(r: redis.Redis, sweep_id: str) -> dict[str, Any]:
    rows = job_rows(r, sweep_job_ids(r, sweep_id))
    record = {k.decode(): v.decode() for k, v in r.hgetall(SWEEP_KEY.format(id=sweep_id)).items()}
    for k in ("axes", "fixed"):
        if k in record:
            record[k] = json.loads(record[k])
    return {"sweep_id": sweep_id, "record": record, "summary": summarize(rows), "rows": rows}


def recent_job_ids(r: redis.Redis, settings: Settings, limit: int = 50) -> list[str]:
    """Ids of running, queued and recently ended jobs: running first, then queued, then ended."""
    q = queue(r, settings)
    kw = {"queue": q}
    started = StartedJobRegistry(**kw).get_job_ids()
    queued = q.get_job_ids(0, limit - 1)
    waiting = ScheduledJobRegistry(**kw).get_job_ids() + DeferredJobRegistry(**kw).get_job_ids()
    ended = []
    for reg in (FinishedJobRegistry(**kw), FailedJobRegistry(**kw), CanceledJobRegistry(**kw)):
        ended += reg.get_job_ids(-limit, -1)
    seen: dict[str, None] = {}
    for i in started + queued + waiting + ended[::-1]:
        seen.setdefault(i, None)
    return list(seen)[:limit]


def find(r: redis.Redis, ident: str) -> str:
    """"job" or "sweep" for an id; NotFoundError if neither."""
    if r.exists(SWEEP_KEY.format(id=ident)):
        return "sweep"
    if r.exists(Job.key_for(ident)):
        return "job"
    raise NotFoundError(f"{ident!r} is neither a job nor a sweep id known to this Redis")


def sweeps(r: redis.Redis) -> list[str]:
    return sorted(i.decode() for i in r.smembers(SWEEPS_KEY))


def worker_health(r: redis.Redis) -> list[dict[str, Any]]:
    """The latest health each worker published ("h3render:health:<host>"), its age, and whether
    an rq worker on that host is still registered (a gate reading outlives its worker)."""
    from rq import Worker

    live_hosts = {w.hostname for w in Worker.all(connection=r)}
    out = []
    for key in sorted(r.scan_iter(match=HEALTH_KEY.format(host="*"))):
        name = key.decode()
        if name.endswith(":history") or r.type(key) != b"string":
            continue
        try:
            health = json.loads(r.get(key) or b"{}")
        except ValueError:
            health = {"raw": (r.get(key) or b"").decode(errors="replace")}
        host = name.split(":", 2)[2]
        ts = health.get("time")
        age = time.time() - float(ts) if isinstance(ts, (int, float)) else None
        out.append({"host": host, "age_s": age, "worker_running": host in live_hosts, "health": health})
    return out


def health_line(entry: dict[str, Any]) -> str:
    """One line per worker: host, gate open/held and why, and how old the reading is."""
    h = entry["health"]
    gate = h.get("gate") if isinstance(h.get("gate"), dict) else h
    is_open = gate.get("open", gate.get("ok"))
    reasons = gate.get("reasons") or gate.get("reason") or []
    if isinstance(reasons, str):
        reasons = [reasons]
    reasons = [x.get("message") or x.get("code") if isinstance(x, dict) else x for x in reasons]
    state = "open" if is_open else ("held: " + "; ".join(map(str, reasons)) if is_open is not None else "unknown")
    age = f", {entry['age_s']:.0f} s ago" if entry.get("age_s") is not None else ""
    stale = "" if entry.get("worker_running") else " (no worker running there now)"
    return f"worker {entry['host']}: gate {state}{age}{stale}"
