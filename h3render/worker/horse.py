"""The render process: what runs one job, in a fresh Python spawned by the worker.

The worker (H3Worker.fork_work_horse) spawns `python -c "...horse_main(<fd>, ...)"`.
The Redis connection (password included) travels through an inherited pipe whose
number is the only thing on the command line: every local user can read any
process's command line, not its pipes. The process fetches the job again and checks
the allowlist again before running it (someone who can write to Redis could swap
the job between the two reads).

Its failure handling differs from rq's in two ways:
  - a job with a cancel request is never retried: it ends canceled;
  - a job another worker has already recovered (its execution is no longer in the
    started registry: this attempt's worker was found dead) is left to that worker,
    so one lost attempt is not retried twice.
"""

from __future__ import annotations

import ast
import logging
import os
import sys
import time

import redis
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer
from rq.worker import Worker

from h3render.queue.job import JobPhase
from h3render.queue.jobstate import save_h3r
from h3render.worker import intake
from h3render.worker.render import refusal

log = logging.getLogger("h3render.worker")
MAX_KWARGS_BYTES = 60000  # under a pipe's buffer, so the worker's write never blocks


def fail_refused(worker: Worker, job: Job, queue: Queue, msg: str) -> None:
    """Fail `job` without retry, with `msg` as its error in meta and in rq's failure.
    The worker must already have prepared the execution (prepare_execution)."""
    log.error(msg)
    job.retries_left = 0
    save_h3r(job, state=JobPhase.failed, error=msg, retryable=False, failed_at=time.time())
    worker.handle_job_failure(job, queue=queue, exc_string=msg)


class CancelAwareFailures:
    """handle_job_failure for the worker and the render process: a job asked to stop ends
    canceled, whatever else went wrong, instead of going back through rq's retry."""

    def handle_job_failure(self, job: Job, queue: Queue, started_job_registry=None, exc_string=""):
        try:
            canceled = intake.cancel_requested(self.connection, job.id)
        except redis.RedisError:
            canceled = False
        if canceled:
            intake.end_canceled(self.connection, job,
                                "instead of a retry" if job.should_retry else "as asked")
            with self.connection.pipeline() as pipe:
                self.cleanup_execution(job, pipeline=pipe)
                pipe.execute()
            return
        super().handle_job_failure(job, queue, started_job_registry=started_job_registry,
                                   exc_string=exc_string)


class HorseWorker(CancelAwareFailures, Worker):
    """The worker as seen from inside the render process: rq's Worker whose
    perform_job re-checks the allowlist on the job this process fetched."""

    def perform_job(self, job: Job, queue: Queue) -> bool:
        why = refusal(job)
        if why:
            fail_refused(self, job, queue, why + " (checked again by the render process)")
            return False
        return super().perform_job(job, queue)

    def handle_job_failure(self, job: Job, queue: Queue, started_job_registry=None, exc_string=""):
        ex = self.execution
        if ex is not None:
            try:
                gone = self.connection.zscore(job.started_job_registry.key, ex.composite_key) is None
            except redis.RedisError:
                gone = False
            if gone:
                log.warning("job %s: recovered by another worker while this attempt ran; its "
                            "failure is left to that recovery (%s)", job.id, exc_string.strip()[-200:])
                return
        super().handle_job_failure(job, queue, started_job_registry=started_job_registry,
                                   exc_string=exc_string)


def send_connection(kwargs: dict) -> int:
    """A pipe's read end (inheritable) holding repr(kwargs); the caller closes it after
    spawning. repr, read back with ast.literal_eval: plain values only, nothing runs."""
    text = repr(kwargs).encode()
    if len(text) > MAX_KWARGS_BYTES:
        raise ValueError(f"Redis connection settings of {len(text)} bytes do not fit a pipe")
    rfd, wfd = os.pipe()
    try:
        view = memoryview(text)
        while view:
            view = view[os.write(wfd, view):]
    finally:
        os.close(wfd)
    os.set_inheritable(rfd, True)
    return rfd


def receive_connection(fd: int) -> dict:
    with os.fdopen(fd, "rb", closefd=True) as f:
        return ast.literal_eval(f.read().decode())


def horse_main(connection, worker_key: str, job_id: str, queue_name: str) -> None:
    """Entry point of the render process spawned by H3Worker.fork_work_horse.

    `connection` is the pipe fd of send_connection (or the kwargs themselves). Rebuilds
    the worker, job, queue and execution from Redis as rq's SpawnWorker script does,
    then runs the job through HorseWorker. Exits the process: 0 when the job ran or was
    refused and recorded, 1 when the worker record is gone or the job failed to be
    handled (rq's main_work_horse)."""
    from rq.executions import Execution

    from h3render.worker.allowlist import AllowlistJob

    kwargs = receive_connection(connection) if isinstance(connection, int) else dict(connection)
    conn = redis.Redis(**kwargs)
    worker = HorseWorker.find_by_key(worker_key, connection=conn, job_class=AllowlistJob,
                                     serializer=JSONSerializer)
    if not worker:
        sys.exit(1)
    job = AllowlistJob.fetch(job_id, connection=conn, serializer=JSONSerializer)
    queue = Queue(queue_name, connection=conn, serializer=JSONSerializer, job_class=AllowlistJob)
    worker.execution = Execution.fetch(os.environ["RQ_EXECUTION_ID"], job.id, connection=conn)
    os.setpgrp()
    worker._is_horse = True
    worker.main_work_horse(job, queue)
