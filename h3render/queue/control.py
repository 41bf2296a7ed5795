"""Cancel and retry, for one job or a whole sweep.

Cancel sets "h3render:cancel:<job id>" (kept a day): the render task polls it at
every step and stops the engine within one step, ending the job canceled. A job
that has not started yet is canceled in rq at once, so no worker takes it.

Retry puts failed (and, unless failed_only, canceled) jobs back on the queue with
a fresh retry budget; finished, queued and running jobs are left alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import redis
from rq.exceptions import InvalidJobOperation
from rq.job import Job, JobStatus
from rq.registry import CanceledJobRegistry, FailedJobRegistry
from rq.serializers import JSONSerializer

from h3render.queue.enqueue import queue
from h3render.queue.job import JobPhase
from h3render.queue.status import fetch_job, sweep_job_ids
from h3render.queue.validation import check_id
from h3render.settings import Settings
from h3render.keys import CANCEL_KEY

CANCEL_TTL_S = 24 * 3600
_WAITING = (JobStatus.QUEUED, JobStatus.SCHEDULED, JobStatus.DEFERRED, JobStatus.CREATED)


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


def _set_state(job: Job, state: JobPhase, **extra) -> None:
    meta = dict(job.meta.get("h3r") or {})
    meta.update(state=state.value, **extra)
    job.meta["h3r"] = meta
    job.save_meta()


def cancel(r: redis.Redis, job_id: str, outcome: Outcome | None = None) -> Outcome:
    """Ask a job to stop; cancel it in rq at once if no worker has started it."""
    check_id("job_id", job_id)
    outcome = outcome or Outcome()
    job = fetch_job(r, job_id)
    status = job.get_status()
    if status in (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.CANCELED, JobStatus.STOPPED):
        outcome.skipped[job_id] = f"already {status.value}"
        return outcome
    r.set(CANCEL_KEY.format(id=job_id), 1, ex=CANCEL_TTL_S)
    if status in _WAITING:
        try:
            job.cancel()
        except InvalidJobOperation:
            pass  # canceled meanwhile
        _set_state(job, JobPhase.canceled, error="canceled before it started")
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
    meta_state = (job.meta.get("h3r") or {}).get("state")
    is_canceled = status in (JobStatus.CANCELED, JobStatus.STOPPED) or meta_state == JobPhase.canceled.value
    if status not in (JobStatus.FAILED, JobStatus.CANCELED, JobStatus.STOPPED):
        outcome.skipped[job_id] = f"is {status.value if status else 'unknown'}, not failed or canceled"
        return outcome
    if failed_only and is_canceled:
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
