"""How a render attempt fails: permanent or retryable, and what a failure leaves behind.

`classify` maps any exception of a render to a JobError: permanent ones (bad input,
a broken model, a numeric failure, a job that can never fit) are not retried;
transient ones (a crash, out of memory, heat, a lost worker) keep rq's Retry.

`record_failure` writes the attempt's end: the job's state (queued when rq will
retry it, else failed), the reason, and for a job that failed for good its folder
with meta.json alone (h3render.worker.staging). The attempt's staging folder is
always removed.

A full disk (ENOSPC or EDQUOT from any write of the outputs, `disk_full`) is its
own case. Retrying it on rq's intervals would spend the job's retries in minutes
on a disk that is still full. Failing it for good would lose a job that only
needed space. So the job goes back to the queue without spending a retry (one is
added back before rq takes one off), at most disk_full_requeues_max times: the
worker's disk gate then keeps it from being dequeued while less than the margin
is free, and admission waits until its own output estimate fits, so it runs again
only once the disk has room for it. The reason names the free bytes, the folder
and what the job needs.
"""

from __future__ import annotations

import errno
import socket
import time

from h3render.queue.job import JobPhase
from h3render.settings import Settings
from h3render.worker import staging
from h3render.worker.health import format_bytes
from h3render.worker.sensors import read_disk

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class JobError(Exception):
    """A render failed; `retryable` says whether rq may try again."""

    retryable = True

    def __init__(self, message: str, engine_error: str = ""):
        super().__init__(message)
        self.engine_error = engine_error


class PermanentJobError(JobError):
    retryable = False


class RetryableJobError(JobError):
    retryable = True


class NotEnoughMemory(RetryableJobError):
    pass


class ThermalAbort(RetryableJobError):
    pass


class WorkerLost(RetryableJobError):
    pass


class NotEnoughDisk(RetryableJobError):
    pass


class DiskFull(RetryableJobError):
    """The disk filled up while the outputs were written (see the module doc)."""


def classify(exc: BaseException, engine_error: str = "") -> JobError:
    """Map any exception from a render to a permanent or retryable JobError."""
    from h3render.engine import exceptions as E

    if isinstance(exc, JobError):
        return exc
    msg = f"{type(exc).__name__}: {exc}"
    if disk_full(exc):
        return DiskFull("disk full: " + msg)
    permanent = (E.NumericError, E.InvalidRequestError, E.ModelFileError, E.UnsupportedError)
    if isinstance(exc, permanent):
        return PermanentJobError(msg, engine_error)
    if isinstance(exc, (E.EngineOutOfMemoryError, MemoryError)):
        return RetryableJobError("out of memory: " + msg, engine_error)
    return RetryableJobError(msg, engine_error)


def disk_full(exc: BaseException | None) -> bool:
    """Whether `exc`, or an exception it was raised from, says the disk is full."""
    seen = 0
    while exc is not None and seen < 10:
        if getattr(exc, "errno", None) in DISK_FULL_ERRNOS:
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def record_failure(exc: BaseException, rq_job, settings: Settings, meta, files, payload,
                   peak_rss: int) -> JobError:
    """Record a failed attempt: discard its files, say whether rq retries it, and give a
    job that failed for good its folder with meta.json (the reason) and nothing else."""
    err = classify(exc, meta.data.get("engine_error", ""))
    extra: dict = {}
    if isinstance(err, DiskFull):
        err, extra = _disk_full(err, rq_job, settings, meta)
    staging.discard(files.staging)
    files.staging = None
    if rq_job is not None and not err.retryable:
        rq_job.retries_left = 0  # rq's handle_job_failure reads this: no retry
    again = err.retryable and rq_job is not None and (rq_job.retries_left or 0) > 0
    now = time.time()
    meta.update(state=JobPhase.queued if again else JobPhase.failed, error=str(err),
                retryable=err.retryable,
                engine_error=err.engine_error or meta.data.get("engine_error", ""),
                failed_at=now, peak_rss=peak_rss, **extra)
    if not again and files.final is not None:
        staging.publish_failure(files.final, files.attempt, {
            "job_id": rq_job.id if rq_job else None, "sweep_id": meta.data.get("sweep_id"),
            "state": JobPhase.failed.value, "error": str(err), "retryable": err.retryable,
            "engine_error": meta.data.get("engine_error", ""), "attempt": files.attempt,
            "host": socket.gethostname(), "failed_at": now,
            "parameters": payload if isinstance(payload, dict) else None})
    return err


def _disk_full(err: JobError, rq_job, settings: Settings, meta) -> tuple[JobError, dict]:
    """The reason of a full disk, with its figures, and the requeue that does not spend a
    retry (rq's retry takes one off retries_left; one is added back first)."""
    disk = read_disk(settings)  # before this attempt's files are removed: what was left
    free = "an unknown amount" if disk.free_bytes is None else format_bytes(disk.free_bytes)
    msg = f"disk full: {free} free under {disk.path}"
    need = meta.data.get("output_estimate")
    if need:
        msg += (f"; this job needs up to {format_bytes(int(need))} for its outputs plus the "
                f"{format_bytes(settings.gate_min_free_bytes)} margin (H3RENDER_GATE_MIN_FREE_BYTES)")
    extra = {"write_error": str(err)[:500]}
    n = int(meta.data.get("disk_full_requeues") or 0)
    if rq_job is not None and n < settings.disk_full_requeues_max:
        rq_job.retries_left = (rq_job.retries_left or 0) + 1
        extra["disk_full_requeues"] = n + 1
        msg += (f"; back to the queue without spending a retry ({n + 1} of "
                f"{settings.disk_full_requeues_max}): it runs again once the disk has room")
    return DiskFull(msg, err.engine_error), extra
