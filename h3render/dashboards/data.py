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

from h3render.dashboards.grid import PASS_AXIS, Grid, Layout, build_grid
from h3render.queue import status as st
from h3render.queue import sweepstatus as ss
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


def _params(payload: dict[str, Any] | None, meta: dict[str, Any]) -> dict[str, Any]:
    params = dict(payload) if isinstance(payload, dict) else {}
    params[PASS_AXIS] = "preview" if meta.get("preview") else "full"
    return params


def job_items(r: redis.Redis, ids: list[str]) -> list[JobItem]:
    """Items for these ids in order (one pipelined read); expired jobs are skipped."""
    return [JobItem(j.row, _params(j.payload, j.meta), j.meta) for j in st.read_jobs(r, ids, payload=True)]


# ---------------------------------------------------------------- sweeps

MAX_CELLS = 200  # cells of the grid one view shows: a 10,000-job sweep is paged, not drawn whole
MAX_COLS = 20


@dataclass
class SweepInfo:
    """A sweep's record and counts (from its index: no job is read), and the items of one view."""

    id: str
    record: dict[str, Any]
    axes: dict[str, list[Any]]  # name -> values, from the record
    fixed: dict[str, Any]
    summary: dict[str, Any]
    prompts: list[str]
    created_at: float | None
    elapsed_s: float | None
    state: ss.SweepState
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

    @property
    def live(self) -> bool:
        return self.summary["done"] < self.summary["jobs"]


def sweep_info(r: redis.Redis, sweep_id: str, now: float | None = None) -> SweepInfo:
    """A sweep's record, counts and remaining time. NotFoundError for an unknown id."""
    state = ss.sweep_state(r, sweep_id, now)
    rec = state.record
    axes, fixed = rec.get("axes") or {}, rec.get("fixed") or {}
    prompts = [str(p) for p in axes.get("prompt", [])] or ([str(fixed["prompt"])] if "prompt" in fixed else [])
    prompts = prompts or list(state.facts.prompts)
    created = _float(rec.get("created_at"))
    summary = state.summary
    elapsed = None
    if created is not None:
        all_done = summary["jobs"] and summary["done"] == summary["jobs"]
        end = state.last_change if all_done and state.last_change else state.now
        elapsed = max(0.0, end - created)
    return SweepInfo(sweep_id, rec, axes, fixed, summary, prompts, created, elapsed, state)


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
    """Each axis's values over the sweep's jobs, in order of first appearance (from the facts)."""
    params = info.state.facts.params
    out: dict[str, dict[Any, None]] = {a: {} for a in info.axis_names}
    for j in info.state.ids:
        p = params.get(j)
        if p is None or j not in info.state.states:
            continue
        for a, seen in out.items():
            seen.setdefault(p.get(a), None)
    return {a: list(v) for a, v in out.items()}


@dataclass
class Window:
    """The part of a grid page one view shows: at most MAX_CELLS cells."""

    grid: Grid
    rpart: int
    cpart: int
    rparts: int
    cparts: int
    rows: tuple[int, int, int]  # first, last (1-based) and total rows
    cols: tuple[int, int, int]


def sweep_view(r: redis.Redis, info: SweepInfo, layout: Layout, page: int, rpart: int = 0,
               cpart: int = 0) -> Window:
    """The grid page `page` of the layout, cut to a window of rows and columns; only the
    window's jobs are read, and its cells hold their JobItems."""
    params = info.state.facts.params
    placed = [(params[j], j) for j in info.state.ids if j in params and j in info.state.states]
    full = build_grid(placed, grid_values(info), layout, page)
    nr, nc = len(full.row_keys), len(full.col_keys)
    cw = max(1, min(nc, MAX_COLS))
    rh = max(1, MAX_CELLS // cw)
    rparts, cparts = max(1, -(-nr // rh)), max(1, -(-nc // cw))
    rpart, cpart = min(max(rpart, 0), rparts - 1), min(max(cpart, 0), cparts - 1)
    r0, c0 = rpart * rh, cpart * cw
    cells = {(a - r0, b - c0): v for (a, b), v in full.cells.items() if r0 <= a < r0 + rh and c0 <= b < c0 + cw}
    ids = [j for v in cells.values() for j in v]
    by_id = {j.row.id: JobItem(j.row, params.get(j.row.id, {}), j.meta) for j in ss.page_rows(r, info.state, ids)}
    grid = Grid(layout, full.page_keys, full.page, full.row_keys[r0:r0 + rh], full.col_keys[c0:c0 + cw],
                {k: [by_id[j] for j in v if j in by_id] for k, v in cells.items()}, full.elsewhere)
    info.items = list(by_id.values())
    return Window(grid, rpart, cpart, rparts, cparts, (r0 + 1, min(r0 + rh, nr), nr), (c0 + 1, min(c0 + cw, nc), nc))


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
    j = st.read_job(r, job_id, payload=True)
    item = JobItem(j.row, _params(j.payload, j.meta), j.meta)
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
