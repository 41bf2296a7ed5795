"""Is anyone rendering? The rq workers that serve the h3render queue, and which are alive.

A worker counts as alive when it is registered in rq for our queue and its last
heartbeat is at most `silence_s` old. h3render's worker heartbeats while it
renders (rq's job monitoring) and while its health gate holds, so a machine that
waits for memory or to cool down still counts; a killed worker stops counting once
its heartbeat is older than `silence_s` (rq drops its record later, at its TTL).
Front ends (the ComfyUI bridge, the CLI) ask here instead of reading rq themselves.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass

import redis
from rq import Worker

from h3render.queue.enqueue import queue
from h3render.settings import Settings

DEFAULT_SILENCE_S = 120.0  # a worker silent this long counts as dead


@dataclass(frozen=True)
class WorkerInfo:
    name: str
    hostname: str | None
    pid: int | None
    state: str
    last_heartbeat: float | None  # unix time
    age_s: float | None  # seconds since the last heartbeat

    def to_dict(self) -> dict:
        return asdict(self)


def _utc(t: dt.datetime | None) -> dt.datetime | None:
    if t is None:
        return None
    return t.replace(tzinfo=dt.timezone.utc) if t.tzinfo is None else t


def workers(r: redis.Redis, settings: Settings, now: dt.datetime | None = None) -> list[WorkerInfo]:
    """Every rq worker registered for the h3render queue, alive or not, by name."""
    now = now or dt.datetime.now(dt.timezone.utc)
    out = []
    for w in Worker.all(connection=r, queue=queue(r, settings)):
        beat = _utc(w.last_heartbeat)
        try:
            state = str(w.get_state())
        except redis.RedisError:
            state = "unknown"
        out.append(WorkerInfo(name=w.name, hostname=w.hostname, pid=w.pid, state=state,
                              last_heartbeat=beat.timestamp() if beat else None,
                              age_s=max(0.0, (now - beat).total_seconds()) if beat else None))
    return sorted(out, key=lambda w: w.name)


def live_workers(r: redis.Redis, settings: Settings, silence_s: float = DEFAULT_SILENCE_S,
                 now: dt.datetime | None = None) -> list[WorkerInfo]:
    """The workers whose last heartbeat is at most silence_s old."""
    return [w for w in workers(r, settings, now) if w.age_s is not None and w.age_s <= silence_s]


def any_worker_alive(r: redis.Redis, settings: Settings, silence_s: float = DEFAULT_SILENCE_S) -> bool:
    """True when at least one worker serves the h3render queue now (see live_workers)."""
    return bool(live_workers(r, settings, silence_s))
