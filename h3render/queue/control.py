"""Cancel and retry, for one job or a whole sweep.

Cancel sets "h3render:cancel:<job id>" (kept a day) first, whatever the job's state,
so every later reader sees the request: the render task polls it at every step and
while it waits (memory, disk, heat), and the worker never runs or retries a job that
has one. A job no worker holds is then canceled in rq at once, which takes it out of
wherever it waits, in one transaction with its meta and its sweep's index:

    queued (also: behind a closed gate)   out of the queue
    deferred (rq dependencies)            out of the deferred registry
    scheduled (a retry waiting for its interval, or rq's enqueue_at)
                                          out of the scheduled registry
A running job (loading, waiting for memory or disk, paused for heat, denoising, ...)
ends canceled by its render task; the worker files it in rq's canceled registry.

Retry puts failed (and, unless failed_only, canceled) jobs back on the queue with a
fresh retry budget; finished, queued and running jobs are left alone. Requeueing
failed jobs (failed_only: `retry --failed`, the dashboards' requeue buttons) never
brings back a job someone canceled: a failed job with a cancel request (a render
killed by a worker shutdown after the cancel, say) is moved to the canceled registry
instead, so no requeue of the failed registry finds it again. Only an explicit retry
of a canceled job, by id or sweep without failed_only, requeues it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import redis
from rq.exceptions import InvalidJobOperation
from rq.job import Job, JobStatus
from rq.registry import CanceledJobRegistry, FailedJobRegistry

from h3render.keys import CANCEL_KEY
from h3render.queue.enqueue import queue
from h3render.queue.job import JobPhase
from h3render.queue.jobstate import record_state
from h3render.queue.status import fetch_job, sweep_job_ids
from h3render.queue.validation import check_id
from h3render.settings import Settings

CANCEL_TTL_S = 24 * 3600
# Where a job waits that no worker holds, and what its record says once canceled there.
_WAITING = {
    JobStatus.QUEUED: "canceled while queued",
    JobStatus.SCHEDULED: "canceled while scheduled (for a retry, or to start later)",
    JobStatus.DEFERRED: "canceled while deferred (waiting for the jobs it depends on)",
    JobStatus.CREATED: "canceled before it was queued",
}
_ENDED = (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.CANCELED, JobStatus.STOPPED)


@dataclass
class Outcome:
    """What a cancel or retry did to each job it looked at."""

    done: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # job id -> why

    def to_dict(self) -> dict:
        return {"done": self.done, "skipped": self.skipped}


def cancel_requested(r: redis.Redis, job_id: str) -> bool:
    """For the render task's progress callback: has someone asked to stop this job?"""
    return bool(r.exists(CANCEL_KEY.format(id=job_id)))


def _stage_meta(pipe, job: Job, **fields) -> None:
    """Queue job.meta["h3r"] updated with `fields` (and its sweep index, for a state) on pipe."""
    h = dict(job.meta.get("h3r") or {})
    h.update({k: (v.value if isinstance(v, JobPhase) else v) for k, v in fields.items()})
    job.meta["h3r"] = h
    pipe.hset(job.key, "meta", job.serializer.dumps(job.meta))
    if "state" in fields:
        record_state(pipe, h.get("sweep_id"), job.id, h["state"])


def _end_canceled(r: redis.Redis, job: Job, why: str, failed: bool = False) -> None:
    """Cancel `job` in rq (status, out of its queue or registry, into the canceled registry)
    and record it in its meta and sweep index: one transaction."""
    with r.pipeline(transaction=True) as pipe:
        if failed:  # rq's cancel does not look in the failed registry
            FailedJobRegistry(job.origin, connection=r, serializer=job.serializer).remove(job, pipeline=pipe)
        job.cancel(pipeline=pipe)
        _stage_meta(pipe, job, state=JobPhase.canceled, error=why, canceled_at=time.time(), eta_s=None)
        pipe.execute()


def cancel(r: redis.Redis, job_id: str, outcome: Outcome | None = None) -> Outcome:
    """Ask a job to stop; cancel it in rq at once if no worker holds it."""
    check_id("job_id", job_id)
    outcome = outcome or Outcome()
    job = fetch_job(r, job_id)
    status = job.get_status()
    if status in _ENDED:
        outcome.skipped[job_id] = f"already {status.value}"
        return outcome
    r.set(CANCEL_KEY.format(id=job_id), 1, ex=CANCEL_TTL_S)  # first: a worker dequeuing it now sees it
    if status in _WAITING:
        try:
            _end_canceled(r, job, _WAITING[status])
        except InvalidJobOperation:
            pass  # canceled meanwhile
    outcome.done.append(job_id)
    return outcome


def cancel_sweep(r: redis.Redis, sweep_id: str) -> Outcome:
    check_id("sweep_id", sweep_id)
    outcome = Outcome()
    for job_id in sweep_job_ids(r, sweep_id):
        try:
            cancel(r, job_id, outcome)
        except Exception as e:  # an expired job must not stop the rest of the sweep
            outcome.skipped[job_id] = str(e)
    return outcome


def retry(r: redis.Redis, job_id: str, settings: Settings, failed_only: bool = False,
          outcome: Outcome | None = None) -> Outcome:
    """Requeue a failed (or canceled) job with a fresh retry budget and no cancel request."""
    check_id("job_id", job_id)
    outcome = outcome or Outcome()
    job = fetch_job(r, job_id)
    status = job.get_status()
    if status not in (JobStatus.FAILED, JobStatus.CANCELED, JobStatus.STOPPED):
        outcome.skipped[job_id] = f"is {status.value if status else 'unknown'}, not failed or canceled"
        return outcome
    meta_state = (job.meta.get("h3r") or {}).get("state")
    asked_to_stop = meta_state == JobPhase.canceled.value or cancel_requested(r, job_id)
    if failed_only and (status != JobStatus.FAILED or asked_to_stop):
        if status == JobStatus.FAILED:  # failed after its cancel: it belongs with the canceled ones
            try:
                _end_canceled(r, job, "canceled (it was asked to stop, then failed: "
                              f"{(job.meta.get('h3r') or {}).get('error') or 'no reason recorded'})", failed=True)
            except InvalidJobOperation:
                pass
        outcome.skipped[job_id] = "canceled (--failed retries failed jobs only)"
        return outcome
    q = queue(r, settings)
    registry_cls = CanceledJobRegistry if status == JobStatus.CANCELED else FailedJobRegistry
    r.delete(CANCEL_KEY.format(id=job_id))
    job.retries_left = settings.retry_max
    meta = dict(job.meta.get("h3r") or {})
    attempts = list(meta.get("attempts") or [])
    attempts.append({k: meta.get(k) for k in ("state", "error", "engine_error")})
    meta.update(state=JobPhase.queued.value, error=None, engine_error=None, step=None, eta_s=None,
                attempts=attempts[-10:])
    job.meta["h3r"] = meta
    job.save()
    try:
        registry_cls(queue=q).requeue(job, at_front=False)
    except InvalidJobOperation:  # not in the registry any more (cleaned up): enqueue directly
        with r.pipeline() as pipe:
            q._enqueue_job(job, pipeline=pipe)
            pipe.execute()
    with r.pipeline(transaction=True) as pipe:
        record_state(pipe, meta.get("sweep_id"), job_id, JobPhase.queued)
        pipe.execute()
    outcome.done.append(job_id)
    return outcome


def retry_sweep(r: redis.Redis, sweep_id: str, settings: Settings, failed_only: bool = False) -> Outcome:
    check_id("sweep_id", sweep_id)
    outcome = Outcome()
    for job_id in sweep_job_ids(r, sweep_id):
        try:
            retry(r, job_id, settings, failed_only, outcome)
        except Exception as e:
            outcome.skipped[job_id] = str(e)
    return outcome
