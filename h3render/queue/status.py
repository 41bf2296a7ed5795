"""Status queries: one row per job (state, progress, ETA, output), sweep summaries, worker health.

State comes from two sources that can disagree for a moment: rq's status (queued,
started, finished, failed, canceled, ...) and the render task's meta["h3r"]["state"]
(JobPhase). `job_state` is the one place that reconciles them; a started job whose
worker is gone is shown as abandoned (h3render.queue.liveness), with no step or ETA.

Rows are read with one pipeline of HMGET of the few fields a row needs (`read_jobs`),
never rq's Job.fetch per job, so a page of a 10,000-job sweep costs a page of reads.
Sweep counts and pages come from the sweep's index (h3render.queue.sweepstatus).
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

from h3render.keys import HEALTH_KEY, SWEEP_JOBS_KEY, SWEEP_KEY, SWEEPS_KEY
from h3render.queue.enqueue import queue
from h3render.queue.errors import NotFoundError
from h3render.queue.job import JobPhase
from h3render.settings import Settings


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
    output_dir: str | None  # a finished job's folder (None for any other state)
    error: str | None  # why a job failed, was canceled or abandoned; a queued job's last error
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
    if meta == JobPhase.abandoned:  # a display state; never trusted from a record
        meta = None
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


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def make_row(job_id: str, rq_status: str | None, meta: dict[str, Any], *, label: str = "",
             retries_left: int | None = None, enqueued_at: float | None = None,
             ended_at: float | None = None, rq_error: str | None = None,
             abandoned: str | None = None) -> JobRow:
    """One row from what rq and the task recorded. `rq_error` is the last line of rq's
    traceback (a reason when the task recorded none); `abandoned` says why the job's
    worker is gone, for a started job (liveness.abandoned)."""
    state = job_state(rq_status, meta.get("state"))
    if abandoned and rq_status == JobStatus.STARTED:
        state = JobPhase.abandoned
    step, steps = _int(meta.get("step")), _int(meta.get("steps"))
    estimate = (meta.get("estimate") or {}).get("seconds") if isinstance(meta.get("estimate"), dict) else None
    progress = None
    if state == JobPhase.finished:
        progress = 1.0
    elif state != JobPhase.abandoned and step is not None and steps:
        progress = min(1.0, max(0.0, step / steps))
    eta = meta.get("eta_s") if not state.terminal and state not in (JobPhase.queued, JobPhase.abandoned) else None
    if state == JobPhase.queued:
        eta = estimate
    error = meta.get("error") if isinstance(meta.get("error"), str) else None
    if state == JobPhase.failed:
        error = error or rq_error or f"no reason recorded (rq status {rq_status})"
    elif state == JobPhase.abandoned:
        error = abandoned
    elif state not in (JobPhase.canceled, JobPhase.queued):
        error = None
    if state == JobPhase.abandoned:
        step = steps = None
    out = meta.get("output_dir") if state == JobPhase.finished else None
    sweep = meta.get("sweep_id")
    return JobRow(
        id=job_id,
        state=state.value,
        rq_status=rq_status or "unknown",
        step=step,
        steps=steps,
        progress=progress,
        eta_s=float(eta) if isinstance(eta, (int, float)) and not isinstance(eta, bool) else None,
        estimate_s=float(estimate) if isinstance(estimate, (int, float)) and not isinstance(estimate, bool) else None,
        output_dir=out if isinstance(out, str) else None,
        error=error,
        label=label,
        sweep_id=sweep if isinstance(sweep, str) else None,
        preview=bool(meta.get("preview")),
        retries_left=retries_left,
        enqueued_at=enqueued_at,
        ended_at=ended_at,
        preview_step=_int(meta.get("preview_step")),
    )


def row_from_job(job: Job) -> JobRow:
    """A row from an rq Job already in hand (no liveness check: use read_jobs for that)."""
    meta = (job.meta or {}).get("h3r") or {}
    status = job.get_status(refresh=False)
    rq_error = None
    if status == JobStatus.FAILED and not meta.get("error"):
        res = job.latest_result()
        rq_error = _last_line(res.exc_string if res is not None else None)
    return make_row(job.id, status.value if status else None, meta, label=job.description or "",
                    retries_left=job.retries_left, enqueued_at=_ts(job.enqueued_at), ended_at=_ts(job.ended_at),
                    rq_error=rq_error)


def _last_line(text: str | None) -> str | None:
    lines = (text or "").strip().splitlines()
    return lines[-1][:300] if lines else None


@dataclass
class JobRead:
    """One job as read by read_jobs: its row, its meta["h3r"], rq's raw status and, when asked,
    the payload. phase is the state without the abandoned check (what the sweep index holds)."""

    row: JobRow
    meta: dict[str, Any]
    phase: str
    worker: str | None
    origin: str | None
    payload: dict[str, Any] | None = None


_FIELDS = ("status", "meta", "description", "retries_left", "enqueued_at", "ended_at", "worker_name", "origin")
MAX_DATA_BYTES = 1 << 20  # a job's payload decompressed; more is a hostile record, read as none


def _text(v: Any) -> str | None:
    return v.decode("utf-8", errors="replace") if isinstance(v, bytes) else None


def _rq_time(v: Any) -> float | None:
    """rq's UTC time text ("2026-05-09T07:35:25.123456Z") as epoch seconds; None if it is not one."""
    from datetime import datetime, timezone

    from rq.utils import utcparse

    t = _text(v)
    if not t:
        return None
    try:  # fromisoformat is ~10x faster than rq's strptime; rq's other format falls through
        return datetime.fromisoformat(t[:-1] if t.endswith("Z") else t).replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        pass
    try:
        return utcparse(t).timestamp()
    except (ValueError, OverflowError):
        return None


def parse_meta(v: Any) -> dict[str, Any]:
    """meta["h3r"] from rq's meta field (JSON); {} for anything else (a hostile record)."""
    try:
        m = json.loads(v) if v else {}
    except (ValueError, UnicodeDecodeError, RecursionError):
        return {}
    h = m.get("h3r") if isinstance(m, dict) else None
    return h if isinstance(h, dict) else {}


def decode_payload(data: Any) -> dict[str, Any] | None:
    """The job payload (kwargs["job"]) from rq's `data` field (zlib JSON), or None."""
    import zlib

    if not isinstance(data, bytes):
        return None
    try:
        d = zlib.decompressobj()
        raw = d.decompress(data, MAX_DATA_BYTES)
        if d.unconsumed_tail:
            return None
    except zlib.error:
        raw = data  # rq also reads uncompressed data
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if isinstance(doc, list) and len(doc) == 4 and isinstance(doc[3], dict) and isinstance(doc[3].get("job"), dict):
        return doc[3]["job"]
    return None


def read_jobs(r: redis.Redis, ids: Iterable[str], payload: bool = False, now: float | None = None) -> list[JobRead]:
    """Rows of these jobs, in order, skipping ids whose job expired or never existed.

    One pipeline of HMGET for all of them, then (only for the started ones and the
    failed ones without a recorded reason) one more for their workers and rq's results."""
    from h3render.queue import liveness

    ids = list(ids)
    if not ids:
        return []
    fields = _FIELDS + (("data",) if payload else ())
    pipe = r.pipeline(transaction=False)
    for i in ids:
        pipe.hmget(Job.key_for(i), *fields)
    raw = pipe.execute()
    parsed = []
    for job_id, vals in zip(ids, raw):
        if all(v is None for v in vals):
            continue
        f = dict(zip(fields, vals))
        parsed.append((job_id, f, _text(f["status"]), parse_meta(f["meta"])))
    started = [(j, _text(f["worker_name"]) or "", _text(f["origin"]) or "")
               for j, f, s, _ in parsed if s == JobStatus.STARTED.value]
    gone = liveness.abandoned(r, started, now)
    need_exc = [j for j, f, s, m in parsed if s == JobStatus.FAILED.value and not m.get("error")]
    exc: dict[str, str | None] = {}
    if need_exc:
        from rq.results import Result

        pipe = r.pipeline(transaction=False)
        for j in need_exc:
            pipe.xrevrange(Result.get_key(j), "+", "-", count=1)
        for j, entries in zip(need_exc, pipe.execute()):
            exc[j] = _exc_line(entries)
    out = []
    for job_id, f, status, meta in parsed:
        try:
            retries = int(f["retries_left"]) if f["retries_left"] is not None else None
        except ValueError:
            retries = None
        row = make_row(job_id, status, meta, label=_text(f["description"]) or "", retries_left=retries,
                       enqueued_at=_rq_time(f["enqueued_at"]), ended_at=_rq_time(f["ended_at"]),
                       rq_error=exc.get(job_id), abandoned=gone.get(job_id))
        out.append(JobRead(row, meta, job_state(status, meta.get("state")).value, _text(f["worker_name"]) or None,
                           _text(f["origin"]) or None, decode_payload(f.get("data")) if payload else None))
    return out


def _exc_line(entries) -> str | None:
    import base64
    import binascii
    import zlib

    for _, fields in entries or []:
        v = fields.get(b"exc_string")
        if not v:
            continue
        try:
            return _last_line(zlib.decompressobj().decompress(base64.b64decode(v), 64 * 1024).decode(errors="replace"))
        except (binascii.Error, zlib.error, ValueError):
            return None
    return None


def job_rows(r: redis.Redis, ids: Iterable[str]) -> list[JobRow]:
    """Rows for these ids, in order; ids whose job expired or never existed are skipped."""
    return [j.row for j in read_jobs(r, ids)]


def fetch_job(r: redis.Redis, job_id: str) -> Job:
    from rq.exceptions import NoSuchJobError

    try:
        return Job.fetch(job_id, connection=r, serializer=JSONSerializer)
    except NoSuchJobError:
        raise NotFoundError(f"job {job_id!r} not found (wrong id, or its 30-day record expired)") from None


def read_job(r: redis.Redis, job_id: str, payload: bool = False) -> JobRead:
    found = read_jobs(r, [job_id], payload=payload)
    if not found:
        raise NotFoundError(f"job {job_id!r} not found (wrong id, or its 30-day record expired)")
    return found[0]


def job_status(r: redis.Redis, job_id: str) -> JobRow:
    return read_job(r, job_id).row


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


def sweep_record(r: redis.Redis, sweep_id: str) -> dict[str, Any]:
    """The sweep's record hash, with its JSON fields (axes, fixed) decoded; NotFoundError if none."""
    raw = r.hgetall(SWEEP_KEY.format(id=sweep_id))
    if not raw:
        raise NotFoundError(f"sweep {sweep_id!r} not found")
    return parse_record(raw)


def parse_record(raw: dict) -> dict[str, Any]:
    rec: dict[str, Any] = {k.decode(errors="replace"): v.decode(errors="replace") for k, v in raw.items()}
    for k in ("axes", "fixed"):
        try:
            v = json.loads(rec.get(k) or "{}")
        except ValueError:
            v = {}
        rec[k] = v if isinstance(v, dict) else {}
    return rec


def sweep_status(r: redis.Redis, sweep_id: str) -> dict[str, Any]:
    """The record, a summary and every job's row (in run order). For counts and a page of
    rows of a large sweep, h3render.queue.sweepstatus reads far less."""
    record = sweep_record(r, sweep_id)
    rows = job_rows(r, sweep_job_ids(r, sweep_id))
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
    # count=1000: a few SCAN round trips even with a 10,000-job sweep in the keyspace
    for key in sorted(r.scan_iter(match=HEALTH_KEY.format(host="*"), count=1000)):
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
