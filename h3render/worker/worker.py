"""The h3render worker: rq's SpawnWorker that outlives any job, with a health gate, an allowlist and a host lock.

    its own loop  `work` is rq's loop with one change of rule: nothing a job or its
                record does ends the worker. The worker exits only for what no job can
                fix (FatalWorkerError: Redis refuses its credentials, another live
                worker took this host's lock, its name is taken), non-zero, with one
                line. Redis errors are outages (h3render.worker.outage): a lost
                connection is waited out; refused writes (MISCONF, OOM, READONLY)
                close the gate with that reason until a write goes through. Any other
                error outside a job is logged and the loop goes on after a pause.
    dequeue     h3render.worker.intake.pop: the id and the raw record are checked
                before rq loads them (h3render.worker.records); a bad one is failed
                (naming the field and the value) or rejected, and the next one taken.
                Idle dequeues are cut into slices of at most IDLE_SLICE_S; between
                slices the worker refreshes its host lock, keeps its scheduler process
                alive and sweeps the started registry for jobs of dead workers
                (h3render.worker.upkeep, h3render.worker.scheduling), and re-runs the
                gate.
    around a job  any exception while a job is prepared, spawned, monitored or
                settled is caught here: once Redis is usable again the render process
                (if still running) is watched to its end, and a job left unsettled is
                failed with the error as its reason (retry budget). A job with a cancel
                request ends canceled, never through a retry.
    gate        `check_for_suspension` runs before every dequeue: a probe write, then
                sensors, decide (h3render.worker.health), publish the decision, and
                while the gate is closed keep heartbeating with the reason as the
                worker's state; it reopens by itself.
    allowlist   a job the allowlist refuses (h3render.worker.render.refusal) is failed
                without spawning anything (no retry). The render process is our own
                (h3render.worker.horse): it checks the job again before running it.
                Jobs are AllowlistJob (h3render.worker.allowlist) everywhere in the
                worker, so rq's own paths never import a function a job names unless
                it is the allowed one.
    one per host  h3render.worker.hostlock. A dead predecessor's jobs are recovered at
                once when its lock is taken over.
    at start    the engine info of every installed model is published for validating
                clients (h3render.worker.publish); stale staging folders are swept.
    after each job  a job the render task ended as canceled is moved to rq's
                canceled registry; a horse killed by a signal (engine crash) is
                recorded in the job's meta with the signal and the last phase.

Jobs are JSON (rq's JSONSerializer), never a binary Python serialization.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import time

import redis
from rq import Queue, worker_registration
from rq.connections import get_connection_kwargs
from rq.exceptions import InvalidJobOperation, StopRequested
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer
from rq.utils import get_version, now
from rq.worker import SpawnWorker, WorkerStatus

from h3render.keys import HEALTH_HISTORY_KEY, HEALTH_KEY
from h3render.queue.job import JobPhase
from h3render.queue.jobstate import save_h3r
from h3render.settings import Settings
from h3render.worker import intake, records, scheduling
from h3render.worker.allowlist import AllowlistJob, RefusedJobError  # noqa: F401 - re-exported
from h3render.worker.health import Check, Decision, Readings, Reason, decide
from h3render.worker.horse import CancelAwareFailures, fail_refused, horse_main, send_connection  # noqa: F401
from h3render.worker.hostlock import HostLock, WorkerLockedError  # noqa: F401 - re-exported
from h3render.worker.outage import FatalWorkerError, classify, one_line, wait_until_usable, write_problem
from h3render.worker.render import refusal
from h3render.worker.sensors import read_readings
from h3render.worker.upkeep import Upkeep

log = logging.getLogger("h3render.worker")

IDLE_SLICE_S = 5  # longest blocking dequeue between two looks at locks, scheduler and sweep
ERROR_PAUSE_MAX_S = 30.0


def paused_seconds(pauses: list[dict], now: float) -> float:
    """Seconds spent in the pauses recorded in meta (an open pause counts up to now)."""
    return sum(max(0.0, float(p.get("end") or now) - float(p["start"])) for p in pauses or [])


def extend_timeout_by_pauses(job: Job, base: dict[str, int]) -> None:
    """Set job.timeout (in memory) to its timeout at start plus the paused seconds in
    its meta, read fresh from Redis. `base` remembers each job's starting timeout."""
    if not job.timeout or job.timeout < 0:
        return
    start = base.setdefault(job.id, int(job.timeout))
    h = (job.get_meta(refresh=True).get("h3r") or {})
    job.timeout = start + int(paused_seconds(h.get("pauses") or [], time.time()) + 0.999)


def publish_health(r: redis.Redis, host: str, decision: Decision, worker: str,
                   history_len: int) -> dict:
    """Latest decision as JSON, and the same appended to a capped history list."""
    doc = {
        "time": decision.time, "host": host, "worker": worker, "open": decision.open,
        "state": decision.state,
        "reasons": [r.model_dump(mode="json") for r in decision.reasons],
        "notes": decision.notes,
        "readings": decision.readings.model_dump(mode="json") if decision.readings else None,
    }
    text = json.dumps(doc)
    pipe = r.pipeline()
    pipe.set(HEALTH_KEY.format(host=host), text)
    pipe.rpush(HEALTH_HISTORY_KEY.format(host=host), text)
    pipe.ltrim(HEALTH_HISTORY_KEY.format(host=host), -history_len, -1)
    pipe.execute()
    return doc


class H3Worker(CancelAwareFailures, Upkeep, SpawnWorker):
    """See the module doc. Build with `H3Worker.create(connection, settings, ...)`."""

    def __init__(self, *args, settings: Settings | None = None, host: str | None = None,
                 force: bool = False, **kwargs):
        kwargs.setdefault("serializer", JSONSerializer)
        super().__init__(*args, **kwargs)
        self.settings = settings or Settings()
        self.host = host or socket.gethostname()
        self.force = force
        self.lock = HostLock(self.connection, self.host, self.name, self.settings.worker_lock_ttl_s, force)
        self._last_decision: Decision | None = None
        self._prev_readings: Readings | None = None
        self._timeout_base: dict[str, int] = {}  # job id -> its timeout before any pause
        self._burst = False
        self._last_sweep = 0.0
        self._errors = 0  # unexpected errors in a row outside any job
        self._lmove: bool | None = None

    @classmethod
    def create(cls, connection: redis.Redis, settings: Settings, *, force: bool = False,
               name: str | None = None) -> "H3Worker":
        q = Queue(settings.queue_name, connection=connection, serializer=JSONSerializer,
                  job_class=AllowlistJob)
        return cls([q], connection=connection, serializer=JSONSerializer, job_class=AllowlistJob,
                   settings=settings, force=force, name=name, default_result_ttl=settings.result_ttl_s,
                   job_monitoring_interval=max(1, min(30, int(settings.gate_poll_s))))

    # ------------------------------------------------------------ host lock

    def acquire_host_lock(self) -> list[str]:
        """Take this host's lock (WorkerLockedError if a live worker holds it). Returns ids
        of jobs recovered from a dead predecessor on this host."""
        dead = self.lock.acquire()
        return self._took_over(dead) if dead else []

    def _took_over(self, dead: tuple[str, int]) -> list[str]:
        name, pid = dead
        scheduling.clear_dead_scheduler_locks(self.connection, self.queues, self.host)
        return scheduling.sweep_started(self, only_worker=name,
                                        reason=f"worker {name} (pid {pid}) died while running it")

    def refresh_host_lock(self) -> None:
        dead = self.lock.refresh()
        if dead:
            self._took_over(dead)
        if self.lock.lost and not self._stop_requested:
            self._stop_requested = True  # after the current job; run() then raises

    def release_host_lock(self) -> None:
        self.lock.release()

    # ------------------------------------------------------------ the loop

    def work(self, burst: bool = False, logging_level: str | None = "INFO", date_format=None,
             log_format=None, max_jobs: int | None = None, max_idle_time: int | None = None,
             with_scheduler: bool = True, dequeue_strategy="default") -> bool:
        """rq's work loop, where only FatalWorkerError, StopRequested and SystemExit end it."""
        from rq.defaults import DEFAULT_LOGGING_DATE_FORMAT, DEFAULT_LOGGING_FORMAT

        date_format = date_format or DEFAULT_LOGGING_DATE_FORMAT
        log_format = log_format or DEFAULT_LOGGING_FORMAT
        self._burst = burst
        try:
            self._until_ok(lambda: self.bootstrap(logging_level, date_format, log_format))
        except ValueError as e:  # rq: "There exists an active worker named ... already"
            raise FatalWorkerError(str(e), 1) from e
        self._dequeue_strategy = dequeue_strategy
        completed = 0
        if with_scheduler:
            self._until_ok(lambda: self._start_scheduler(burst, logging_level, date_format, log_format))
        self._install_signal_handlers()
        try:
            while not self._stop_requested:
                try:
                    self.check_for_suspension(burst)
                    if self.should_run_maintenance_tasks:
                        self.run_maintenance_tasks()
                    if self._stop_requested:
                        break
                    result = self.dequeue_job_and_maintain_ttl(None if burst else self.dequeue_timeout,
                                                               max_idle_time)
                    if result is None:
                        if burst or max_idle_time is not None or self._stop_requested:
                            break
                        continue
                    job, queue = result
                    self.execute_job(job, queue)
                    self.heartbeat()
                    self._errors = 0
                    completed += 1
                    if max_jobs is not None and completed >= max_jobs:
                        log.info("worker %s: finished %d jobs, quitting", self.name, completed)
                        break
                except (StopRequested, FatalWorkerError, SystemExit, KeyboardInterrupt) as e:
                    if isinstance(e, StopRequested):
                        break
                    raise
                except Exception as e:  # noqa: BLE001 - see the module doc
                    self._outlast_or_pause(e)
        finally:
            self._teardown_quietly()
        if self.lock.lost:
            raise FatalWorkerError(self.lock.lost, 2)
        return bool(completed)

    def _until_ok(self, fn):
        """fn(), again after each Redis outage; other errors are raised."""
        while True:
            try:
                return fn()
            except redis.RedisError as e:
                if classify(e) is None:
                    raise
                self.outlast(e)
                if self._stop_requested:
                    raise StopRequested() from e

    def _outlast_or_pause(self, exc: BaseException) -> None:
        try:
            self.outlast(exc)
        except (StopRequested, FatalWorkerError, SystemExit, KeyboardInterrupt):
            raise
        except Exception:  # noqa: BLE001 - never out of the loop for this
            log.exception("worker %s: while handling %r", self.name, exc)
            self._sleep(1.0)

    def outlast(self, exc: BaseException) -> None:
        """Wait out a Redis outage; log anything else and pause (longer when it repeats)."""
        if classify(exc) is None:
            self._errors += 1
            pause = min(ERROR_PAUSE_MAX_S, 0.5 * 2 ** min(self._errors, 6))
            log.error("worker %s: error outside any job (%s); going on in %.0f s", self.name,
                      one_line(f"{type(exc).__name__}: {exc}"), pause, exc_info=True)
            self._sleep(pause)
            return
        waited = wait_until_usable(self.connection, self.host, exc, stop=lambda: self._stop_requested,
                                   on_wait=self._show_outage, sleep=self._sleep)
        if self._stop_requested:
            return
        try:
            self._after_outage(waited)
        except redis.RedisError as e:  # Redis went again: the loop meets it at its next call
            log.error("worker %s: after the outage: %s", self.name, one_line(e))

    def _show_outage(self, reason: str) -> None:
        code = "redis_writes" if reason.startswith("Redis refuses writes") else "redis_down"
        self._last_decision = Decision(open=False, reasons=[Reason(check=Check.redis, code=code,
                                                                   message=reason)])
        try:
            self.set_state(self._last_decision.state[:200])
            publish_health(self.connection, self.host, self._last_decision, self.name,
                           self.settings.health_history_len)
        except redis.RedisError:
            pass  # the reason is published once Redis takes writes again (_after_outage)

    def _after_outage(self, waited: float) -> None:
        """Redis takes writes again: record the closed gate (it could not be published while
        closed), re-register if Redis lost our record, and have the scheduler running."""
        d = self._last_decision
        if d is not None and not d.open:
            d = d.model_copy(update={"notes": [*d.notes, f"lasted {waited:.0f} s"]})
            publish_health(self.connection, self.host, d, self.name, self.settings.health_history_len)
        self._reregister_if_lost()
        if not self._burst and self.scheduler is not None:
            scheduling.ensure_scheduler(self)

    def _reregister_if_lost(self) -> None:
        if self.birth_date is None or self.last_heartbeat is None:
            return  # Redis went away during bootstrap, before the first registration: bootstrap redoes it
        if self.connection.hexists(self.key, "birth"):
            return
        log.warning("worker %s: its record was lost with Redis's data; registering again", self.name)
        with self.connection.pipeline() as pipe:
            pipe.hset(self.key, mapping=self.serialize())
            worker_registration.register(self, pipe)
            pipe.expire(self.key, self.worker_ttl + 60)
            pipe.execute()

    def _teardown_quietly(self) -> None:
        for step in (lambda: self.stop_scheduler() if self.scheduler else None, self.register_death,
                     self.unsubscribe):
            try:
                step()
            except Exception as e:  # noqa: BLE001 - going away anyway
                log.error("worker %s: at exit: %s", self.name, one_line(e))

    # ------------------------------------------------------------ gate

    def evaluate_gate(self) -> Decision:
        readings = read_readings(self.settings)
        d = decide(readings, self.settings, self._prev_readings)
        self._prev_readings = readings
        prev = self._last_decision
        if prev is None or prev.open != d.open or prev.state != d.state:
            (log.info if d.open else log.warning)("health gate: %s", d.state)
        self._last_decision = d
        try:
            publish_health(self.connection, self.host, d, self.name,
                           self.settings.health_history_len)
            from h3render.worker.publish import publish_machine  # total/usable memory, for enqueue

            publish_machine(self.connection, self.host, self.name, self.settings, readings=readings)
        except redis.RedisError as e:
            if classify(e) is not None:
                raise
            log.error("could not publish health: %s", e)
        return d

    def check_for_suspension(self, burst: bool) -> None:
        """rq's suspension (`rq suspend`), then a probe write (a refused write is an outage,
        waited out by the loop), then the health gate: block here, never holding a job,
        until the gate opens or a stop is requested."""
        super().check_for_suspension(burst)
        before = None
        while not self._stop_requested:
            problem = write_problem(self.connection, self.host)
            if problem is not None:
                raise problem
            d = self.evaluate_gate()
            if d.open:
                break
            if before is None:
                before = self.get_state()
            self.set_state(d.state[:200])
            self.heartbeat()
            self._sleep(self.settings.gate_poll_s)
        if before is not None:
            self.set_state(before)

    def _sleep(self, seconds: float) -> None:
        end = time.time() + seconds
        while not self._stop_requested and time.time() < end:
            time.sleep(min(0.5, max(end - time.time(), 0)))

    def dequeue_job_and_maintain_ttl(self, timeout, max_idle_time=None):
        """The next runnable job (intake.pop), or None: at once when the queue is empty and
        timeout is None (burst), else after max_idle_time or a stop. Blocks at most
        IDLE_SLICE_S at a time; `tick` and the gate run between slices."""
        self.set_state(WorkerStatus.IDLE)
        self.procline("Listening on " + ",".join(self.queue_names()))
        idle_since = time.monotonic()
        slice_s = max(1, min(IDLE_SLICE_S, int(self.settings.gate_poll_s)))
        if self._lmove is None:
            self._lmove = get_version(self.connection) >= (6, 2, 0)
        while True:
            self.heartbeat()
            self.tick()
            block = None if timeout is None else slice_s
            if block is not None and max_idle_time is not None:
                block = max(1, min(block, max_idle_time - (time.monotonic() - idle_since)))
            result = intake.pop(self.connection, self._ordered_queues, block, worker=self.name,
                                job_class=self.job_class, serializer=self.serializer, use_lmove=self._lmove)
            if result is not None:
                job, queue = result
                job.redis_server_version = self.get_redis_server_version()
                log.info("worker %s: %s: %s (%s)", self.name, queue.name, job.description, job.id)
                self.heartbeat()
                return result
            if timeout is None or self._stop_requested:
                return None
            if max_idle_time is not None and time.monotonic() - idle_since >= max_idle_time:
                return None
            self.check_for_suspension(False)
            if self._stop_requested:
                return None

    def heartbeat(self, timeout=None, pipeline=None):
        super().heartbeat(timeout, pipeline)
        if pipeline is None:
            try:
                self.refresh_host_lock()
            except StopRequested:
                raise
            except Exception as e:  # noqa: BLE001 - the next heartbeat tries again
                log.error("could not refresh the host lock: %s", one_line(e))

    # ------------------------------------------------------------ jobs

    def execute_job(self, job: Job, queue: Queue):
        """Run one job; whatever goes wrong around it settles that job, not the worker."""
        try:
            why = refusal(job)
            if why:
                self.refuse_job(job, queue, why)
            else:
                super().execute_job(job, queue)
        except (StopRequested, SystemExit, KeyboardInterrupt, FatalWorkerError):
            raise
        except BaseException as e:  # noqa: BLE001 - see the module doc
            self._settle(job, queue, e)
        try:
            self._after_job(job, queue)
        except Exception as e:  # noqa: BLE001
            log.error("job %s: after the job: %s", job.id, one_line(e))

    def refuse_job(self, job: Job, queue: Queue, msg: str) -> None:
        self.prepare_execution(job)
        fail_refused(self, job, queue, msg)
        self.connection.lrem(queue.intermediate_queue_key, 0, job.id)
        self.set_state("idle")

    def _settle(self, job: Job, queue: Queue, exc: BaseException) -> None:
        """After an error around `job`: wait out a Redis outage, watch a still running
        render process to its end, then fail the job if nothing else settled it."""
        err = one_line(f"{type(exc).__name__}: {exc}")
        log.error("job %s: the worker hit an error around it: %s", job.id, err,
                  exc_info=classify(exc) is None)
        for attempt in range(5):
            try:
                if classify(exc) is not None:
                    self.outlast(exc)
                if self._horse_pid:
                    self.monitor_work_horse(job, queue)
                    self._horse_pid = 0
                self._fail_unsettled(job, queue, f"the worker hit an error while running it: {err}")
                return
            except (StopRequested, SystemExit, KeyboardInterrupt, FatalWorkerError):
                raise
            except Exception as e:  # noqa: BLE001 - try again after the next outage
                exc = e
                if classify(e) is None:
                    log.exception("job %s: settling it failed (attempt %d)", job.id, attempt + 1)
                    self._sleep(1.0)
        log.error("job %s: left for the started-registry sweep", job.id)

    def _failed_as_corrupt(self, job: Job, queue: Queue) -> bool:
        """Fail the job if its record went bad while it ran (someone wrote to it): True
        when it was. The render may have finished; the record must be readable again."""
        raw = self.connection.hgetall(job.key)
        problems = records.check_record(raw, queue.name) if raw else []
        if problems:
            intake.fail_corrupt(self.connection, queue.name, job.id, problems, self.name,
                                self.job_class, self.serializer)
        return bool(problems)

    def _fail_unsettled(self, job: Job, queue: Queue, reason: str) -> None:
        r = self.connection
        if self._failed_as_corrupt(job, queue):
            return
        status = job.get_status(refresh=True)
        started = intake.started_entries(r, queue.started_job_registry.key, job.id)
        r.lrem(queue.intermediate_queue_key, 0, job.id)
        if status in (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.CANCELED, JobStatus.STOPPED,
                      JobStatus.SCHEDULED) and not started:
            return  # the render process (or rq) settled it
        retry = bool(job.retries_left and job.retries_left > 0)
        save_h3r(job, state=JobPhase.queued if retry else JobPhase.failed, error=reason, retryable=True)
        job.ended_at = now()
        self.handle_job_failure(job, queue, exc_string=reason)
        for m in intake.started_entries(r, queue.started_job_registry.key, job.id):
            r.zrem(queue.started_job_registry.key, m)

    def fork_work_horse(self, job: Job, queue: Queue):
        """Spawn the render process (h3render.worker.horse): the Redis connection goes
        through an inherited pipe, never on its command line."""
        os.environ["RQ_WORKER_ID"] = self.name
        os.environ["RQ_EXECUTION_ID"] = self.execution.id
        kw = get_connection_kwargs(self.connection)
        for k in ("retry", "driver_info"):  # not rebuildable from their repr (as rq drops them)
            kw.pop(k, None)
        fd = send_connection(kw)
        code = ("from h3render.worker.horse import horse_main; "
                f"horse_main({fd}, {self.key!r}, {job.id!r}, {queue.name!r})")
        try:
            self._horse_pid = os.spawnv(os.P_NOWAIT, sys.executable, [sys.executable, "-c", code])
        finally:
            os.close(fd)
        self.procline(f"Spawned {self._horse_pid} at {time.time()}")

    def _after_job(self, job: Job, queue: Queue) -> None:
        self._timeout_base.pop(job.id, None)
        try:
            job.refresh()
        except Exception:  # noqa: BLE001 - the job may have expired, or its record broke
            self._failed_as_corrupt(job, queue)
            return
        h = job.meta.get("h3r") or {}
        if h.get("state") == JobPhase.canceled.value and job.get_status() != JobStatus.CANCELED:
            try:
                job.cancel()
            except InvalidJobOperation:
                pass
            save_h3r(job, state=JobPhase.canceled)  # the sweep's index too

    def maintain_heartbeats(self, job: Job):
        """rq's heartbeats while the render process runs, with the job's timeout
        first moved on by the time it has spent paused for heat (meta "pauses"): a
        pause is bounded by thermal_pause_max_s, not by the job's timeout, and the
        render process holds its own timeout alarm while paused (render._thermal_pause).
        rq kills a horse past timeout + 60 s and sizes heartbeat TTLs from it. A Redis
        error here is logged, never raised: the render process keeps running."""
        try:
            extend_timeout_by_pauses(job, self._timeout_base)
        except (redis.RedisError, ValueError, TypeError) as e:
            log.error("job %s: could not read its pauses: %s", job.id, e)
        try:  # the machine record outlives a long render (it expires without a refresh)
            from h3render.worker.publish import publish_machine

            publish_machine(self.connection, self.host, self.name, self.settings)
        except redis.RedisError as e:
            log.error("could not publish the machine's memory: %s", e)
        try:
            super().maintain_heartbeats(job)
        except redis.RedisError as e:
            log.error("job %s: heartbeat failed (%s); the render process goes on", job.id, one_line(e))

    def handle_work_horse_killed(self, job, retpid, ret_val, rusage):
        """The render process died (engine crash, OOM killer): record it in meta."""
        sig = os.WTERMSIG(ret_val) if ret_val and os.WIFSIGNALED(ret_val) else None
        name = signal.Signals(sig).name if sig else None
        try:
            job.refresh()
        except Exception:  # noqa: BLE001
            pass
        h = dict(job.meta.get("h3r") or {}) if isinstance(job.meta, dict) else {}
        where = h.get("phase") or h.get("state") or "start"
        if h.get("step") is not None and h.get("phase") == "denoise":
            where = f"denoise step {h.get('step')}/{h.get('steps')}"
        what = f"signal {sig} ({name})" if sig else f"exit status {ret_val}"
        if not isinstance(job.meta, dict):
            job.meta = {}
        save_h3r(job, state=JobPhase.failed if not job.retries_left else JobPhase.queued,
                 error=f"engine crash: the render process died with {what} during {where}",
                 engine_error=h.get("engine_error") or f"render process killed by {what}",
                 retryable=True, crashes=int(h.get("crashes", 0) or 0) + 1)
        log.error("job %s: engine crash: the render process died with %s during %s", job.id, what, where)

    # ------------------------------------------------------------ lifetime

    def publish_models(self) -> dict[str, str]:
        """Publish every installed model's Engine.info(); never fatal (see h3render.worker.publish)."""
        from h3render.worker.publish import publish_installed

        try:
            return publish_installed(self.connection)
        except Exception as e:  # noqa: BLE001 - a broken models dir must not stop the worker
            log.error("could not publish the installed models' engine info: %s", e)
            return {}

    def run(self, *, burst: bool = False, max_jobs: int | None = None,
            with_scheduler: bool = True, logging_level: str = "INFO") -> bool:
        """Take the host lock, recover a dead predecessor's jobs, sweep stale staging
        folders, publish the installed models' engine info, work, release."""
        self._until_ok(self.acquire_host_lock)
        try:
            from h3render.worker.staging import sweep_staging  # renders killed before this start

            try:
                sweep_staging(self.settings.renders_dir())
            except OSError as e:
                log.error("could not sweep stale staging folders: %s", e)
            self.publish_models()
            return self.work(burst=burst, max_jobs=max_jobs, with_scheduler=with_scheduler,
                             logging_level=logging_level)
        finally:
            self.release_host_lock()
