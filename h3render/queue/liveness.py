"""Is a started job's worker still there? A job rq calls started whose worker is gone is abandoned.

rq marks a job started when a worker takes it and only notices that the worker died
when the job's entry in the started registry ("rq:wip:<queue>") expires: up to the
heartbeat interval plus 60 s, and then only in some worker's periodic maintenance.
Until then the job's meta still says "denoising 21/200, ETA 1s". status, the sweep
page and the sweep counts show such a job as abandoned instead, when

    its worker's key (rq:worker:<name>) is gone, or the worker recorded its death; or
    its next heartbeat is more than HEARTBEAT_GRACE_S late.

A live worker heartbeats a running job every job_monitoring_interval seconds (h3render's
worker: at most 30) and each heartbeat moves the job's started-registry score to
now + min(time left, interval) + 60, so score - 60 is when the next heartbeat is due.
A job whose worker was killed is therefore shown abandoned at most interval +
HEARTBEAT_GRACE_S (45 s) after its last heartbeat. The check compares the worker's
clock (the scores) with this machine's: clocks further apart than the grace give a
false reading.

A started job that names no worker was not started by an rq worker (a test, a hand
edit); it is shown as its meta says. Reads only: the worker re-runs abandoned jobs.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import redis
from rq.registry import StartedJobRegistry
from rq.worker import Worker

HEARTBEAT_GRACE_S = 15.0
RQ_HEARTBEAT_MARGIN_S = 60  # rq adds this to every started-registry TTL (Worker.get_heartbeat_ttl)


def _text(v) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v or "")


def abandoned(r: redis.Redis, started: Iterable[tuple[str, str, str]], now: float | None = None) -> dict[str, str]:
    """{job id: why} for the (job id, worker name, queue name) of started jobs whose worker is
    gone; jobs whose worker is alive are left out. Two round trips for any number of jobs."""
    started = [(j, w, q) for j, w, q in started if w]
    if not started:
        return {}
    now = time.time() if now is None else now
    queues = sorted({q for _, _, q in started if q})
    workers = sorted({w for _, w, _ in started})
    pipe = r.pipeline(transaction=False)
    for q in queues:
        pipe.zrange(StartedJobRegistry(q, connection=r).key, 0, -1, withscores=True)
    for w in workers:
        pipe.hmget(Worker.redis_worker_namespace_prefix + w, "birth", "death")
    out = pipe.execute()
    due: dict[tuple[str, str], float] = {}  # (queue, job id) -> when its next heartbeat is due
    for q, entries in zip(queues, out[: len(queues)]):
        for member, score in entries:
            job_id = _text(member).rpartition(":")[0] or _text(member)
            key = (q, job_id)
            due[key] = max(due.get(key, float("-inf")), float(score) - RQ_HEARTBEAT_MARGIN_S)
    state = {}
    for w, (birth, death) in zip(workers, out[len(queues):]):
        state[w] = "gone" if birth is None and death is None else ("stopped" if death is not None else "alive")
    why: dict[str, str] = {}
    for job_id, w, q in started:
        if state[w] == "gone":
            why[job_id] = f"its worker {w} is gone"
        elif state[w] == "stopped":
            why[job_id] = f"its worker {w} has stopped"
        else:
            d = due.get((q, job_id))
            if d is not None and now > d + HEARTBEAT_GRACE_S:
                why[job_id] = f"no heartbeat from its worker {w} for {now - d:.0f} s past due"
    return why


def abandoned_in_queue(r: redis.Redis, queue_name: str, now: float | None = None) -> dict[str, str]:
    """{job id: why} of every job in the queue's started registry whose worker is gone."""
    ids = [_text(m).rpartition(":")[0] or _text(m)
           for m in r.zrange(StartedJobRegistry(queue_name, connection=r).key, 0, -1)]
    if not ids:
        return {}
    from rq.job import Job

    pipe = r.pipeline(transaction=False)
    for j in ids:
        pipe.hmget(Job.key_for(j), "status", "worker_name")
    started = [(j, _text(w), queue_name) for j, (s, w) in zip(ids, pipe.execute()) if _text(s) == "started"]
    return abandoned(r, started, now)
