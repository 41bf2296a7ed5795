"""The worker's upkeep between jobs: its scheduler process, the started-registry sweep and rq's registry cleanup.

A mixin of H3Worker (h3render.worker.worker), kept apart from the job loop:

    _start_scheduler  rq's, with h3render.worker.scheduling.H3Scheduler (burst: due
                      retries moved once, no process)
    tick              between dequeue slices: re-register if Redis lost the worker's
                      record, keep the scheduler process alive, sweep the started
                      registry when due. A Redis outage is raised to the loop; any
                      other error is logged, never raised.
    clean_registries  rq's maintenance, after our own sweep of the started registry
                      and of the intermediate list, so rq never loads a record that
                      was not checked (h3render.worker.intake), one step at a time
    requeue_stuck     ids a dying worker left in the intermediate list go back to the
                      front of the queue (the job never ran)
"""

from __future__ import annotations

import logging
import os
import signal
import time

import redis
from rq import Queue, worker_registration
from rq.exceptions import StopRequested
from rq.intermediate_queue import IntermediateQueue
from rq.registry import clean_registries
from rq.utils import now

from h3render.worker import intake, scheduling
from h3render.worker.outage import classify, one_line
from h3render.worker.staging import sweep_staging

log = logging.getLogger("h3render.worker")


class Upkeep:
    def _start_scheduler(self, burst: bool = False, logging_level="INFO", date_format=None,
                         log_format=None):
        """rq's, with our scheduler (h3render.worker.scheduling.H3Scheduler)."""
        scheduling.clear_dead_scheduler_locks(self.connection, self.queues, self.host)
        kw = {k: v for k, v in (("date_format", date_format), ("log_format", log_format)) if v}
        self.scheduler = scheduling.H3Scheduler(
            self.queues, connection=self.connection, logging_level=logging_level or "INFO",
            serializer=self.serializer, job_class=self.job_class, worker_name=self.name, **kw)
        self.scheduler.acquire_locks()
        if not self.scheduler.acquired_locks:
            return
        if burst:
            try:
                self.scheduler.register_birth()
                self.scheduler.enqueue_scheduled_jobs()
            finally:
                self.scheduler.release_locks()
                self.scheduler.register_death()
        else:
            self.scheduler.start()

    def stop_scheduler(self):
        p = self.scheduler._process
        if p is not None and p.pid:
            try:
                os.kill(p.pid, signal.SIGTERM)
            except OSError:
                pass
            p.join(timeout=10)

    def tick(self) -> None:
        """Between dequeue slices: the host lock, the scheduler process, the started-registry
        sweep. A Redis outage is raised to the loop; any other error is logged only."""
        self._each((("registration", self._reregister_if_lost),
                    ("scheduler", self._keep_scheduler),
                    ("sweep", self._sweep_if_due)), "")

    def _each(self, steps, where: str) -> None:
        """Run each (name, step): a stop or a Redis outage is raised to the loop; any other
        error is logged and the next step runs."""
        for what, step in steps:
            try:
                step()
            except StopRequested:
                raise
            except Exception as e:  # noqa: BLE001
                if classify(e) is not None:
                    raise
                log.exception("worker %s: %s%s: %s", self.name, what, where, one_line(e))

    def _keep_scheduler(self) -> None:
        if not self._burst and self.scheduler is not None:
            scheduling.ensure_scheduler(self)

    def _sweep_if_due(self, force: bool = False) -> None:
        if force or time.monotonic() - self._last_sweep >= scheduling.sweep_every_s(self.settings):
            self._last_sweep = time.monotonic()
            scheduling.sweep_started(self)
            # a render killed when its job had no retry left leaves its staging folder behind
            sweep_staging(self.settings.renders_dir())

    # ------------------------------------------------------------ maintenance

    def run_maintenance_tasks(self):
        self.clean_registries()

    def clean_registries(self):
        """rq's registry cleanup, after our own sweep of the started registry and of the
        intermediate list (so rq never loads a record unchecked), one step at a time."""
        self.last_cleaned_at = now()
        for queue in self.queues:
            if not queue.acquire_maintenance_lock():
                continue
            try:
                self._each((("cleaning started", lambda: self._sweep_if_due(force=True)),
                            ("cleaning intermediate", lambda: self.requeue_stuck(queue)),
                            ("cleaning registries", lambda: clean_registries(queue, self._exc_handlers)),
                            ("cleaning workers", lambda: worker_registration.clean_worker_registry(queue))),
                           f" of {queue.name}")
            finally:
                try:
                    queue.release_maintenance_lock()
                except redis.RedisError:
                    pass

    def requeue_stuck(self, queue: Queue) -> None:
        """Ids left in the queue's intermediate list by a worker that died between its
        dequeue and the start of the job: checked, and put back at the front of the queue
        after a minute (the job never ran)."""
        inter = IntermediateQueue(queue.key, self.connection)
        started = queue.started_job_registry.key
        for raw in self.connection.lrange(inter.key, 0, -1):
            found = intake.Found(inter.key, [raw])
            job = intake.load(self.connection, queue.name, raw, worker=self.name, job_class=self.job_class,
                              serializer=self.serializer, found=found)
            if job is None or intake.started_entries(self.connection, started, job.id):
                continue
            if inter.set_first_seen(job.id) or not inter.should_be_cleaned_up(job.id):
                continue
            with self.connection.pipeline(transaction=True) as pipe:
                pipe.lrem(inter.key, 1, raw)
                pipe.lpush(queue.key, raw)
                pipe.execute()
            log.warning("job %s was stuck in %s; put back at the front of the queue", job.id, inter.key)
