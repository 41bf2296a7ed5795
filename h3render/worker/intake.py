"""Taking a job from Redis without trusting its record: the worker's dequeue and what it does with bad records.

    pop(...)           the worker's dequeue: rq's LMOVE into the queue's intermediate list
                       (so a dequeued job is never only in this process's memory), then the
                       id and the raw record are checked (h3render.worker.records) before rq
                       loads anything. A bad entry is dealt with here and the next one taken.
    load(...)          the same checks for a job found anywhere else (the scheduled and the
                       started registries): returns the loaded Job, or None when it was dealt
                       with.

What a bad entry becomes:
    odd id, or no readable record     removed from where it was found, logged, and listed
                                      in REJECTED_KEY (no rq job can be made of it)
    fields rq cannot load             each bad field repaired (records.Problem.repair) so
                                      rq, the status views and the dashboards can read the
                                      job again, then failed without retry: rq's failed
                                      registry, and meta["h3r"] state failed with an error
                                      naming every field and its value (cut), the values
                                      also under meta["h3r"]["corrupt"]
    a cancel request                  ended canceled (rq's canceled registry), never run

Every write goes through one pipeline per job, together with its removal from where
it was found. Redis errors are left to the caller (the worker waits and retries).
"""

from __future__ import annotations

import json
import logging
import time
import zlib
from dataclasses import dataclass, field

import redis
from rq.job import Job, JobStatus
from rq.registry import CanceledJobRegistry, FailedJobRegistry, ScheduledJobRegistry, StartedJobRegistry
from rq.utils import now

from h3render.keys import CANCEL_KEY, REJECTED_KEY, SWEEP_STATES_KEY, SWEEPS_KEY
from h3render.queue.job import JobPhase
from h3render.queue.jobstate import record_state, save_h3r
from h3render.worker import records

log = logging.getLogger("h3render.worker")

REJECTED_KEEP = 1000
DEFAULT_FAILURE_TTL_S = 30 * 24 * 3600  # when the record's own failure_ttl is unreadable


@dataclass
class Found:
    """Where an entry was found, so it can be removed in the same pipeline that settles it:
    a list member (a queue, its intermediate list) or sorted-set members (registries)."""

    key: str
    members: list[bytes] = field(default_factory=list)
    is_list: bool = True

    def drop(self, pipe) -> None:
        for m in self.members:
            if self.is_list:
                pipe.lrem(self.key, 1, m)
            else:
                pipe.zrem(self.key, m)


def job_key(job_id: str) -> str:
    return Job.key_for(job_id)


def cancel_requested(r: redis.Redis, job_id: str) -> bool:
    return bool(r.exists(CANCEL_KEY.format(id=job_id)))


# ---------------------------------------------------------------- what cannot be a job


def reject(r: redis.Redis, queue_name: str, raw_id: bytes | str, reason: str, worker: str,
           found: Found | None = None) -> None:
    """Log an entry no job can be made of, list it in REJECTED_KEY and remove it."""
    doc = {"time": time.time(), "queue": queue_name, "id": records.shown(raw_id), "reason": reason,
           "worker": worker}
    log.error("queue %s: entry %s rejected: %s", queue_name, doc["id"], reason)
    with r.pipeline(transaction=True) as pipe:
        pipe.rpush(REJECTED_KEY, json.dumps(doc))
        pipe.ltrim(REJECTED_KEY, -REJECTED_KEEP, -1)
        if found is not None:
            found.drop(pipe)
        pipe.execute()


def rejected(r: redis.Redis, limit: int = 100) -> list[dict]:
    """The latest rejected entries, newest last."""
    out = []
    for raw in r.lrange(REJECTED_KEY, -limit, -1):
        try:
            out.append(json.loads(raw))
        except ValueError:
            continue
    return out


# ---------------------------------------------------------------- a record rq cannot load


def sweep_of(r: redis.Redis, job_id: str, limit: int = 10000) -> str | None:
    """The sweep a job belongs to, from the sweeps' state indexes (when its meta is lost)."""
    for i, sid in enumerate(r.smembers(SWEEPS_KEY)):
        if i >= limit:
            break
        s = sid.decode(errors="replace")
        if r.hexists(SWEEP_STATES_KEY.format(id=s), job_id):
            return s
    return None


def fail_corrupt(r: redis.Redis, queue_name: str, job_id: str, problems: list[records.Problem],
                 worker: str, job_class=Job, serializer=None, found: Found | None = None) -> str:
    """Repair the fields rq cannot load, then fail the job without retry, naming them.
    Returns the reason written."""
    reason = "corrupt job record: " + "; ".join(p.message for p in problems)
    key = job_key(job_id)
    with r.pipeline(transaction=True) as pipe:
        for p in problems:
            if p.repair is None:
                pipe.hdel(key, p.hash_field)
            else:
                pipe.hset(key, p.hash_field, p.repair)
        pipe.execute()
    corrupt = [{"field": p.field, "value": p.value} for p in problems]
    try:
        job = job_class.fetch(job_id, connection=r, serializer=serializer)
        _ = job.meta.get  # a repaired meta is an object
    except Exception as e:  # noqa: BLE001 - something records does not know about
        log.error("job %s: still unreadable after repair (%s: %s); writing its failure directly",
                  job_id, type(e).__name__, e)
        _fail_raw(r, queue_name, job_id, reason, corrupt, found)
        return reason
    extra = {}
    if any(p.field == "meta" for p in problems) and not (job.meta.get("h3r") or {}).get("sweep_id"):
        extra["sweep_id"] = sweep_of(r, job_id)
    job.retries_left = 0
    save_h3r(job, state=JobPhase.failed, error=reason, retryable=False, failed_at=time.time(),
             corrupt=corrupt, **extra)
    with r.pipeline(transaction=True) as pipe:
        job.ended_at = now()
        job.set_status(JobStatus.FAILED, pipeline=pipe)
        _remove_everywhere(pipe, job, queue_name)
        job._handle_failure(reason, pipe, worker_name=worker)
        if found is not None:
            found.drop(pipe)
        pipe.execute()
    log.error("job %s failed: %s", job_id, reason)
    return reason


def _fail_raw(r: redis.Redis, queue_name: str, job_id: str, reason: str, corrupt: list[dict],
              found: Found | None) -> None:
    """The failure written without rq's loader: status, error, meta and the failed registry."""
    sweep_id = sweep_of(r, job_id)
    h = {"state": JobPhase.failed.value, "error": reason, "retryable": False,
         "failed_at": time.time(), "corrupt": corrupt, "sweep_id": sweep_id}
    with r.pipeline(transaction=True) as pipe:
        pipe.hset(job_key(job_id), mapping={
            "status": JobStatus.FAILED.value, "meta": json.dumps({"h3r": h}),
            "exc_info": zlib.compress(reason.encode()), "retries_left": 0,
            "origin": queue_name, "data": records.DATA_PLACEHOLDER})
        pipe.zadd(FailedJobRegistry(queue_name, connection=r).key,
                  {job_id: time.time() + DEFAULT_FAILURE_TTL_S})
        record_state(pipe, sweep_id, job_id, JobPhase.failed)
        if found is not None:
            found.drop(pipe)
        pipe.execute()
    log.error("job %s failed: %s", job_id, reason)


def _remove_everywhere(pipe, job: Job, queue_name: str) -> None:
    """Take the job out of every place it could be run from (queue, scheduled, started)."""
    from rq import Queue

    q = Queue(queue_name, connection=job.connection)
    pipe.lrem(q.key, 0, job.id)
    pipe.lrem(q.intermediate_queue_key, 0, job.id)
    pipe.zrem(ScheduledJobRegistry(queue_name, connection=job.connection).key, job.id)
    started = StartedJobRegistry(queue_name, connection=job.connection).key
    for m in started_entries(job.connection, started, job.id):
        pipe.zrem(started, m)


def started_entries(r: redis.Redis, key: str, job_id: str) -> list[bytes]:
    """Members <job id>:<execution id> of a started registry for this job."""
    prefix = job_id.encode() + b":"
    return [m for m in r.zrange(key, 0, -1) if m.startswith(prefix) or m == job_id.encode()]


# ---------------------------------------------------------------- canceled


def end_canceled(r: redis.Redis, job: Job, why: str, found: Found | None = None) -> None:
    """End a job that was asked to stop: meta state canceled, rq's canceled registry, out of
    every queue and registry it could run from. Never retried after this."""
    save_h3r(job, state=JobPhase.canceled, canceled_at=time.time(), error=f"canceled {why}",
             retryable=False)
    with r.pipeline(transaction=True) as pipe:
        job.set_status(JobStatus.CANCELED, pipeline=pipe)
        _remove_everywhere(pipe, job, job.origin)
        pipe.zrem(FailedJobRegistry(job.origin, connection=r).key, job.id)
        CanceledJobRegistry(job.origin, connection=r, serializer=job.serializer).add(job, pipeline=pipe)
        if found is not None:
            found.drop(pipe)
        pipe.execute()
    log.warning("job %s canceled %s", job.id, why)


# ---------------------------------------------------------------- load and pop


def load(r: redis.Redis, queue_name: str, raw_id: bytes, *, worker: str, job_class=Job,
         serializer=None, statuses: tuple[str, ...] | None = None, found: Found | None = None,
         canceled_why: str = "before it ran") -> Job | None:
    """The job `raw_id` names, checked; None when it could not be run and was settled here
    (rejected, failed as corrupt, or ended canceled), `found` removed with it."""
    problem = records.check_job_id(raw_id)
    if problem is not None:
        reject(r, queue_name, raw_id, problem.message, worker, found)
        return None
    job_id = raw_id.decode() if isinstance(raw_id, bytes) else raw_id
    try:
        raw = r.hgetall(job_key(job_id))
    except redis.ResponseError as e:
        if "WRONGTYPE" not in str(e):
            raise
        reject(r, queue_name, job_id, f"its record {job_key(job_id)} is not a hash ({e})", worker, found)
        return None
    if not raw:
        reject(r, queue_name, job_id, f"its record {job_key(job_id)} is missing", worker, found)
        return None
    problems = records.check_record(raw, queue_name, statuses)
    # a canceled job left in a queue is not corrupt: it lost a race with the cancel
    problems_ = [p for p in problems
                 if not (p.field == "status" and raw.get(b"status") == JobStatus.CANCELED.value.encode())]
    if problems_:
        fail_corrupt(r, queue_name, job_id, problems_, worker, job_class, serializer, found)
        return None
    if raw.get(b"status") == JobStatus.CANCELED.value.encode():  # canceled already, by cancel
        with r.pipeline(transaction=True) as pipe:
            if found is not None:
                found.drop(pipe)
            pipe.execute()
        log.info("job %s was canceled; dropped from %s", job_id, found.key if found else "where it was")
        return None
    job = job_class(job_id, connection=r, serializer=serializer)
    try:
        job.restore(raw)
    except Exception as e:  # noqa: BLE001 - a field records does not check
        p = records.Problem("record", records.shown(str(e)), f"cannot be loaded by rq ({type(e).__name__})",
                            "a record rq writes")
        fail_corrupt(r, queue_name, job_id, [p], worker, job_class, serializer, found)
        return None
    if cancel_requested(r, job_id):
        end_canceled(r, job, canceled_why, found)
        return None
    return job


def pop(r: redis.Redis, queues, timeout: float | None, *, worker: str, job_class=Job,
        serializer=None, use_lmove: bool = True):
    """(job, queue) of the next runnable job, or None when the queues stay empty for
    `timeout` seconds (None: do not block). Bad entries on the way are settled (`load`)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        block = None if deadline is None else deadline - time.monotonic()
        got = _pop_id(r, queues, block if block is None or block > 0.05 else None, use_lmove)
        if got is None:
            return None
        queue, raw_id, found = got
        job = load(r, queue.name, raw_id, worker=worker, job_class=job_class, serializer=serializer,
                   statuses=(JobStatus.QUEUED.value,), found=found)
        if job is not None:
            return job, queue


def _pop_id(r: redis.Redis, queues, block: float | None, use_lmove: bool):
    """(queue, raw id, Found) or None. One queue: LMOVE into its intermediate list, as rq
    does (a worker that dies here leaves the id where maintenance finds it)."""
    if len(queues) == 1 and use_lmove:
        q = queues[0]
        inter = q.intermediate_queue_key
        raw = r.blmove(q.key, inter, block) if block else r.lmove(q.key, inter)
        return None if raw is None else (q, raw, Found(inter, [raw]))
    if block:
        got = r.blpop([q.key for q in queues], block)
        if got is None:
            return None
        key, raw = got
        q = next(q for q in queues if q.key.encode() == key or q.key == key)
        return q, raw, Found(q.key, [])
    for q in queues:
        raw = r.lpop(q.key)
        if raw is not None:
            return q, raw, Found(q.key, [])
    return None
