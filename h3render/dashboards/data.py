"""What each page shows, read from Redis (through h3render.queue) and the renders folder.

The thin I/O layer of the dashboard: every function takes the Redis connection
and the Settings, and returns plain dataclasses/dicts that templates render.
Charts are built from the records by `h3render.dashboards.charts` (pure).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from rq import Worker
from rq.job import Job
from rq.serializers import JSONSerializer

from h3render.dashboards.grid import PASS_AXIS, axis_values
from h3render.queue import status as st
from h3render.queue.enqueue import SWEEP_KEY
from h3render.queue.job import JobPhase
from h3render.settings import Settings
from h3render.keys import ENGINE_KEY, HEALTH_HISTORY_KEY

MEDIA_NAMES = ("video.mp4", "poster.png", "meta.json")
LOG_TAIL_LINES = 60
HISTORY_POINTS = 720  # worker page: the last this many health readings


@dataclass
class JobItem:
    """One job as the grid and the job page need it."""

    row: st.JobRow
    params: dict[str, Any]
    meta: dict[str, Any]

    @property
    def id(self) -> str:
        return self.row.id

    @property
    def render_s(self) -> float | None:
        t = self.meta.get("timings") or {}
        if isinstance(t.get("total"), (int, float)):
            return float(t["total"])
        a, b = self.meta.get("started_at"), self.meta.get("finished_at") or self.row.ended_at
        return b - a if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b >= a else None

    @property
    def peak_rss(self) -> int | None:
        v = self.meta.get("peak_rss")
        return int(v) if isinstance(v, (int, float)) else None

    @property
    def phase(self) -> str | None:
        return self.meta.get("phase")


def _item(job: Job) -> JobItem:
    payload = (job.kwargs or {}).get("job") if isinstance(job.kwargs, dict) else None
    meta = dict((job.meta or {}).get("h3r") or {})
    params = dict(payload) if isinstance(payload, dict) else {}
    params[PASS_AXIS] = "preview" if meta.get("preview") else "full"
    return JobItem(st.row_from_job(job), params, meta)


def job_items(r: redis.Redis, ids: list[str]) -> list[JobItem]:
    """Items for these ids in order; expired jobs are skipped."""
    jobs = Job.fetch_many(ids, connection=r, serializer=JSONSerializer) if ids else []
    return [_item(j) for j in jobs if j is not None]


# ---------------------------------------------------------------- sweeps


@dataclass
class SweepInfo:
    id: str
    record: dict[str, Any]
    axes: dict[str, list[Any]]  # name -> values, from the record
    fixed: dict[str, Any]
    summary: dict[str, Any]
    prompts: list[str]
    created_at: float | None
    elapsed_s: float | None
    items: list[JobItem] = field(default_factory=list)

    @property
    def axis_names(self) -> list[str]:
        names = list(self.axes)
        if self.record.get("preview") in ("1", 1, True) and PASS_AXIS not in names:
            names.append(PASS_AXIS)
        return names

    @property
    def progress(self) -> float:
        n = self.summary.get("jobs") or 0
        return (self.summary.get("done") or 0) / n if n else 0.0


def _record(r: redis.Redis, sweep_id: str) -> dict[str, Any]:
    raw = r.hgetall(SWEEP_KEY.format(id=sweep_id))
    rec: dict[str, Any] = {k.decode(): v.decode() for k, v in raw.items()}
    for k in ("axes", "fixed"):
        try:
            rec[k] = json.loads(rec.get(k) or "{}")
        except ValueError:
            rec[k] = {}
    return rec


def sweep_info(r: redis.Redis, sweep_id: str, now: float | None = None) -> SweepInfo:
    """A sweep with every job's row, parameters and meta. NotFoundError for an unknown id."""
    ids = st.sweep_job_ids(r, sweep_id)
    rec = _record(r, sweep_id)
    items = job_items(r, ids)
    axes = rec.get("axes") if isinstance(rec.get("axes"), dict) else {}
    fixed = rec.get("fixed") if isinstance(rec.get("fixed"), dict) else {}
    prompts = [str(p) for p in axes.get("prompt", [])] or ([str(fixed["prompt"])] if "prompt" in fixed else [])
    if not prompts:
        prompts = sorted({str(i.params.get("prompt")) for i in items if i.params.get("prompt")})
    summary = st.summarize([i.row for i in items])
    created = _float(rec.get("created_at"))
    now = time.time() if now is None else now
    elapsed = None
    if created is not None:
        ends = [i.row.ended_at for i in items if i.row.ended_at]
        all_done = items and summary["done"] == len(items)
        elapsed = (max(ends) if all_done and ends else now) - created
    return SweepInfo(sweep_id, rec, axes, fixed, summary, prompts, created, elapsed, items)


def all_sweeps(r: redis.Redis, now: float | None = None) -> list[SweepInfo]:
    """Every sweep, newest first."""
    out = []
    for sid in st.sweeps(r):
        try:
            out.append(sweep_info(r, sid, now))
        except st.NotFoundError:
            continue  # removed between the two reads
    return sorted(out, key=lambda s: s.created_at or 0.0, reverse=True)


def grid_values(info: SweepInfo) -> dict[str, list[Any]]:
    return axis_values(info.axis_names, [i.params for i in info.items])


def _float(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


# ---------------------------------------------------------------- files


def output_dir(settings: Settings, item: JobItem) -> Path | None:
    """The job's output folder inside this machine's renders folder, or None.

    The meta's output_dir is trusted only when it lies inside renders_dir (the
    worker may run elsewhere); else renders/<sweep or any>/<job id> is looked up.
    """
    root = settings.renders_dir().resolve()
    cand = item.meta.get("output_dir")
    if isinstance(cand, str) and cand:
        p = Path(cand).resolve()
        if p.is_relative_to(root) and p.is_dir():
            return p
    sweep = item.meta.get("sweep_id")
    if isinstance(sweep, str) and "/" not in sweep and not sweep.startswith("."):
        p = root / sweep / item.id
        if p.is_dir():
            return p
    if root.is_dir() and "/" not in item.id and not item.id.startswith("."):
        for p in root.glob(f"*/{item.id}"):
            if p.is_dir():
                return p
    return None


def media_file(settings: Settings, item: JobItem, name: str) -> Path | None:
    """One of MEDIA_NAMES in the job's folder, if it exists; any other name is None."""
    if name not in MEDIA_NAMES:
        return None
    d = output_dir(settings, item)
    if d is None:
        return None
    p = d / name
    return p if p.is_file() else None


def read_meta_json(settings: Settings, item: JobItem) -> dict[str, Any]:
    p = media_file(settings, item, "meta.json")
    if p is None:
        return {}
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


# ---------------------------------------------------------------- one job


@dataclass
class JobDetail:
    item: JobItem
    job: Job
    meta_json: dict[str, Any]
    engine: dict[str, Any]
    health: list[dict[str, Any]]  # host health records over the job's life
    log: list[str]
    media: dict[str, bool]


def job_detail(r: redis.Redis, settings: Settings, job_id: str) -> JobDetail:
    """Everything the job page shows. NotFoundError for an unknown id."""
    job = st.fetch_job(r, job_id)
    item = _item(job)
    doc = read_meta_json(settings, item)
    engine = doc.get("engine") if isinstance(doc.get("engine"), dict) else {}
    if not engine:
        raw = r.get(ENGINE_KEY.format(model=item.params.get("model", "")))
        try:
            engine = json.loads(raw) if raw else {}
        except ValueError:
            engine = {}
        engine = {**engine, **(item.meta.get("engine") or {})}
    t0, t1 = job_window(item)
    host = item.meta.get("host")
    health = health_history(r, host, t0 - 30, t1 + 30) if host and t0 is not None else []
    media = {n: media_file(settings, item, n) is not None for n in MEDIA_NAMES}
    return JobDetail(item, job, doc, engine, health, log_lines(item, job, doc), media)


def job_window(item: JobItem) -> tuple[float | None, float]:
    """(start, end) of the job's life: started (else enqueued) to ended (else now)."""
    m = item.meta
    start = _float(m.get("started_at")) or _float(m.get("enqueued_at")) or item.row.enqueued_at
    end = (_float(m.get("finished_at")) or _float(m.get("failed_at")) or _float(m.get("canceled_at"))
           or item.row.ended_at or time.time())
    return start, max(end, start or end)


def log_lines(item: JobItem, job: Job, doc: dict[str, Any]) -> list[str]:
    """The job's log: its recorded events in time order, then the tail of the traceback."""
    m = item.meta
    ev: list[tuple[float, str]] = []

    def add(t: Any, text: str) -> None:
        if isinstance(t, (int, float)):
            ev.append((float(t), text))

    add(m.get("enqueued_at"), f"enqueued by {m.get('enqueued_by', '?')}")
    for i, a in enumerate(m.get("attempts") or []):
        if isinstance(a, dict):
            ev.append((0.0, f"earlier attempt {i + 1}: {a.get('state')} {a.get('error') or ''}".rstrip()))
    start = m.get("started_at")
    add(start, f"started on {m.get('host', '?')} (pid {m.get('pid', '?')}, attempt {m.get('attempt', '?')})")
    if m.get("admission"):
        add(start, f"admission: {m['admission']}")
    t = _float(start)
    timings = m.get("timings") or doc.get("timings_s") or {}
    if t is not None:
        for ph in ("admission", "load", "encode", "denoise", "decode", "write"):
            if isinstance(timings.get(ph), (int, float)):
                t += timings[ph]
                add(t, f"{ph} done in {timings[ph]:.2f} s")
    for p in m.get("pauses") or []:
        if isinstance(p, dict):
            add(p.get("start"), f"paused at step {p.get('step')}: {p.get('reason')}")
            add(p.get("end"), "resumed")
    if m.get("state") not in (JobPhase.finished.value, JobPhase.failed.value, JobPhase.canceled.value):
        if m.get("step") is not None:
            add(time.time(), f"now {m.get('state')}: step {m.get('step')}/{m.get('steps')}")
    # rq's end time (else its last heartbeat) when the task could not record one itself (a crash)
    ended = item.row.ended_at or (job.last_heartbeat.timestamp() if job.last_heartbeat else None)
    if ended is None and item.row.state in (JobPhase.failed.value, JobPhase.canceled.value):
        ended = max((t for t, _ in ev), default=None)
    add(m.get("finished_at"), f"finished: {m.get('output_dir', '')}")
    add(m.get("canceled_at") or (ended if item.row.state == JobPhase.canceled.value else None), "canceled")
    failed_at = m.get("failed_at") or (ended if item.row.state == JobPhase.failed.value else None)
    add(failed_at, f"failed: {item.row.error or m.get('error') or ''}")
    if m.get("engine_error"):
        add(failed_at or ended or time.time(), f"engine: {m['engine_error']}")
    lines = [f"{_clock(ts)}  {text}" if ts else f"{'':8}  {text}" for ts, text in sorted(ev, key=lambda e: e[0])]
    exc = None
    try:
        res = job.latest_result()
        exc = res.exc_string if res is not None else None
    except Exception:  # noqa: BLE001 - rq's result records may have expired
        exc = None
    if exc:
        lines.append("--- traceback (last lines) ---")
        lines.extend(exc.rstrip().splitlines()[-25:])
    return lines[-LOG_TAIL_LINES:]


def _clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))


# ---------------------------------------------------------------- workers


def health_history(r: redis.Redis, host: str, t0: float | None = None, t1: float | None = None,
                   last: int = HISTORY_POINTS) -> list[dict[str, Any]]:
    """The host's published health records (oldest first), within [t0, t1] when given."""
    raw = r.lrange(HEALTH_HISTORY_KEY.format(host=host), -last if t0 is None else 0, -1)
    out = []
    for x in raw:
        try:
            d = json.loads(x)
        except ValueError:
            continue
        ts = d.get("time") if isinstance(d, dict) else None
        if not isinstance(ts, (int, float)):
            continue
        if (t0 is not None and ts < t0) or (t1 is not None and ts > t1):
            continue
        out.append(d)
    return out


@dataclass
class HostView:
    host: str
    entry: dict[str, Any]  # status.worker_health entry: host, age_s, worker_running, health
    line: str
    workers: list[dict[str, Any]]  # rq workers on this host: name, state, job
    history: list[dict[str, Any]]


def worker_hosts(r: redis.Redis) -> list[HostView]:
    """Each host that published health: its latest record, its rq workers and its history."""
    by_host: dict[str, list[dict[str, Any]]] = {}
    for w in Worker.all(connection=r):
        jid = w.get_current_job_id()
        cur = None
        if jid:
            items = job_items(r, [jid])
            cur = items[0] if items else None
        by_host.setdefault(w.hostname or "?", []).append(
            {"name": w.name, "state": w.get_state(), "job_id": jid, "job": cur,
             "successful": w.successful_job_count, "failed": w.failed_job_count})
    out = []
    entries = {e["host"]: e for e in st.worker_health(r)}
    for host in sorted(set(entries) | set(by_host)):
        e = entries.get(host, {"host": host, "age_s": None, "worker_running": True, "health": {}})
        out.append(HostView(host, e, st.health_line(e) if e.get("health") else f"worker {host}: no health "
                            "record yet", by_host.get(host, []), health_history(r, host)))
    return out
