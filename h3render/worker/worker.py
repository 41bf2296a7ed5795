"""The h3render worker: rq's SpawnWorker with a health gate, an allowlist and a host lock.

    gate        `check_for_suspension` runs before every dequeue: read sensors,
                decide (h3render.worker.health), publish the decision, and while the
                gate is closed keep heartbeating with the reason as the worker's
                state; it reopens by itself. Idle dequeues are cut into gate_poll_s
                slices so a worker waiting for jobs re-checks the machine too.
    allowlist   a job the allowlist refuses (h3render.worker.render.refusal: another
                function, extra arguments, callbacks or webhooks) is failed without
                spawning anything (no retry). The render process is our own
                (`horse_main`, not rq's spawn script): it fetches the job from Redis
                again and checks it again before running it, since anyone who can
                write to Redis could swap the job between the two reads. Jobs are
                AllowlistJob everywhere in the worker, so rq's own paths (the
                abandoned-job cleanup runs failure callbacks in the worker process)
                never import a function a job names unless it is the allowed one.
    one per host  "h3render:worker-lock:<host>" holds {name, pid}; a second worker on
                the same host and Redis refuses to start unless forced. A lock whose
                pid is dead is stale: the new worker takes it and recovers the jobs
                the dead worker left in the started registry (retry or fail with a
                reason), instead of waiting for their heartbeats to expire.
    at start    after taking the lock, the engine info of every installed model is
                published for validating clients (h3render.worker.publish; a bad
                model directory is logged and skipped).
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
from rq import Queue
from rq.connections import get_connection_kwargs
from rq.exceptions import InvalidJobOperation
from rq.job import Job, JobStatus
from rq.registry import StartedJobRegistry
from rq.serializers import JSONSerializer
from rq.worker import SpawnWorker, Worker

from h3render.procs import pid_alive
from h3render.queue.job import JobPhase
from h3render.settings import Settings
from h3render.worker.health import Decision, Readings, decide
from h3render.worker.render import refusal
from h3render.worker.sensors import read_readings
from h3render.keys import HEALTH_HISTORY_KEY, HEALTH_KEY, LOCK_KEY

log = logging.getLogger("h3render.worker")


class WorkerLockedError(RuntimeError):
    """Another live worker holds this host's lock."""


class RefusedJobError(RuntimeError):
    """A job the allowlist refuses was about to be run (see render.refusal)."""


class AllowlistJob(Job):
    """rq's Job that resolves no function but ALLOWED_FUNC and no callbacks at all.

    rq imports whatever a job names when it reads `func` or a callback property
    (the worker's abandoned-job cleanup calls failure callbacks in the worker
    process itself). Here `func` raises RefusedJobError unless `refusal(job)` is
    None, callbacks resolve to None (logged), and webhooks are never sent.
    """

    @property
    def func(self):
        why = refusal(self)
        if why:
            raise RefusedJobError(why)
        return super().func

    def _no_callback(self, kind: str, name: str | None):
        if name:
            log.error("job %s names %s callback %r; not run (render jobs carry no callbacks)",
                      self.id, kind, name)
        return None

    @property
    def success_callback(self):
        return self._no_callback("success", self._success_callback_name)

    @property
    def failure_callback(self):
        return self._no_callback("failure", self._failure_callback_name)

    @property
    def stopped_callback(self):
        return self._no_callback("stopped", self._stopped_callback_name)

    def send_webhooks(self, status, *, exc_string=None) -> None:
        if self.webhooks:
            log.error("job %s carries webhooks; not sent (render jobs carry none)", self.id)


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


def fail_refused(worker: Worker, job: Job, queue: Queue, msg: str) -> None:
    """Fail `job` without retry, with `msg` as its error in meta and in rq's failure.
    The worker must already have prepared the execution (prepare_execution)."""
    log.error(msg)
    job.retries_left = 0
    h = dict(job.meta.get("h3r") or {})
    h.update(state=JobPhase.failed.value, error=msg, retryable=False, failed_at=time.time())
    job.meta["h3r"] = h
    job.save_meta()
    worker.handle_job_failure(job, queue=queue, exc_string=msg)


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


class H3Worker(SpawnWorker):
    """See the module doc. Build with `H3Worker.create(connection, settings, ...)`."""

    def __init__(self, *args, settings: Settings | None = None, host: str | None = None,
                 force: bool = False, **kwargs):
        kwargs.setdefault("serializer", JSONSerializer)
        super().__init__(*args, **kwargs)
        self.settings = settings or Settings()
        self.host = host or socket.gethostname()
        self.force = force
        self._last_decision: Decision | None = None
        self._prev_readings: Readings | None = None
        self._lock_held = False
        self._gate_state: str | None = None
        self._timeout_base: dict[str, int] = {}  # job id -> its timeout before any pause

    @classmethod
    def create(cls, connection: redis.Redis, settings: Settings, *, force: bool = False,
               name: str | None = None) -> "H3Worker":
        q = Queue(settings.queue_name, connection=connection, serializer=JSONSerializer,
                  job_class=AllowlistJob)
        w = cls([q], connection=connection, serializer=JSONSerializer, job_class=AllowlistJob,
                settings=settings,
                force=force, name=name, default_result_ttl=settings.result_ttl_s,
                job_monitoring_interval=max(1, min(30, int(settings.gate_poll_s))))
        return w

    # ------------------------------------------------------------ host lock

    def acquire_host_lock(self) -> list[str]:
        """Take this host's lock, or raise WorkerLockedError. Returns ids of jobs
        recovered from a dead predecessor on this host."""
        key = LOCK_KEY.format(host=self.host)
        mine = json.dumps({"name": self.name, "pid": os.getpid(), "since": time.time()})
        ttl = self.settings.worker_lock_ttl_s
        if self.connection.set(key, mine, nx=True, ex=ttl):
            self._lock_held = True
            return []
        raw = self.connection.get(key)
        try:
            other = json.loads(raw) if raw else {}
        except ValueError:
            other = {}
        pid, name = int(other.get("pid", 0) or 0), other.get("name", "?")
        alive = pid > 0 and pid_alive(pid)
        if alive and not self.force:
            raise WorkerLockedError(
                f"another h3render worker ({name}, pid {pid}) already runs on {self.host} "
                f"with this Redis; one worker per machine. Stop it, or pass --force to run a "
                "second one anyway")
        self.connection.set(key, mine, ex=ttl)
        self._lock_held = True
        if alive:
            return []
        log.warning("worker %s (pid %s) on %s is gone; taking over its lock", name, pid, self.host)
        self.clear_dead_scheduler_locks()
        return self.recover_jobs_of(name, f"worker {name} (pid {pid}) died while running it")

    def clear_dead_scheduler_locks(self) -> None:
        """Drop rq scheduler locks held by a dead scheduler process on this host, so
        this worker's scheduler (retry intervals) starts now rather than after the
        lock's TTL plus rq's 10-minute maintenance interval."""
        from rq.scheduler import SCHEDULER_KEY_TEMPLATE, SCHEDULER_LOCKING_KEY_TEMPLATE

        for q in self.queues:
            key = SCHEDULER_LOCKING_KEY_TEMPLATE % q.name
            holder = self.connection.get(key)
            if not holder:
                continue
            info = self.connection.hgetall(SCHEDULER_KEY_TEMPLATE % holder.decode())
            host = (info.get(b"hostname") or b"").decode()
            pid = int(info.get(b"pid") or 0)
            if not info or (host == self.host and pid and not pid_alive(pid)):
                self.connection.delete(key)
                log.warning("removed the scheduler lock of a dead scheduler (pid %s)", pid)

    def refresh_host_lock(self) -> None:
        if not self._lock_held:
            return
        key = LOCK_KEY.format(host=self.host)
        raw = self.connection.get(key)
        try:
            holder = json.loads(raw).get("name") if raw else None
        except ValueError:
            holder = None
        if holder in (None, self.name):
            mine = json.dumps({"name": self.name, "pid": os.getpid(), "since": time.time()})
            self.connection.set(key, mine, ex=self.settings.worker_lock_ttl_s)

    def release_host_lock(self) -> None:
        if not self._lock_held:
            return
        key = LOCK_KEY.format(host=self.host)
        raw = self.connection.get(key)
        try:
            if raw and json.loads(raw).get("name") == self.name:
                self.connection.delete(key)
        except (ValueError, redis.RedisError):
            pass
        self._lock_held = False

    def recover_jobs_of(self, dead_worker: str, reason: str) -> list[str]:
        """Jobs a dead worker left started: retry them (if retries are left) or fail
        them with `reason`, unless their render process is still alive on this host
        (it notices its worker died, within a step, and fails the job itself)."""
        recovered = []
        for q in self.queues:
            reg = StartedJobRegistry(q.name, connection=self.connection, serializer=JSONSerializer)
            for job_id in reg.get_job_ids(cleanup=False):
                try:
                    job = Job.fetch(job_id, connection=self.connection, serializer=JSONSerializer)
                except Exception:  # noqa: BLE001 - vanished job
                    continue
                if job.worker_name != dead_worker:
                    continue
                h = dict(job.meta.get("h3r") or {})
                pid = int(h.get("pid") or 0)
                if pid and h.get("host") == self.host and pid_alive(pid):
                    continue
                h.update(error=f"worker lost: {reason}", engine_error=h.get("engine_error", ""),
                         state=JobPhase.queued.value if job.retries_left else JobPhase.failed.value)
                job.meta["h3r"] = h
                job.save_meta()
                with self.connection.pipeline() as pipe:
                    for eid in [e for e in self.connection.zrange(reg.key, 0, -1)
                                if e.decode().split(":")[0] == job_id]:
                        pipe.zrem(reg.key, eid)
                    if job.retries_left and job.retries_left > 0:
                        job.retry(q, pipe)
                    else:
                        job.set_status(JobStatus.FAILED, pipeline=pipe)
                        job._handle_failure(f"worker lost: {reason}", pipe, worker_name=self.name)
                    pipe.execute()
                recovered.append(job_id)
                log.warning("recovered job %s of dead worker %s", job_id, dead_worker)
        return recovered

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
            log.error("could not publish health: %s", e)
        return d

    def check_for_suspension(self, burst: bool) -> None:
        """rq's suspension (`rq suspend`), then the health gate: block here, never
        holding a job, until the gate opens or a stop is requested."""
        super().check_for_suspension(burst)
        before = None
        while not self._stop_requested:
            d = self.evaluate_gate()
            if d.open:
                break
            try:
                if before is None:
                    before = self.get_state()
                self.set_state(d.state[:200])
                self.heartbeat()
            except redis.ConnectionError as e:  # Redis restarting: keep waiting, do not quit
                log.error("Redis unavailable while the gate is closed: %s", e)
            self._sleep(self.settings.gate_poll_s)
        if before is not None:
            self.set_state(before)

    def _sleep(self, seconds: float) -> None:
        end = time.time() + seconds
        while not self._stop_requested and time.time() < end:
            time.sleep(min(0.5, max(end - time.time(), 0)))

    def dequeue_job_and_maintain_ttl(self, timeout, max_idle_time=None):
        """Burst: rq's non-blocking dequeue. Otherwise block at most gate_poll_s at a
        time, re-running the gate between slices."""
        if timeout is None:
            return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
        slice_s = max(1, int(self.settings.gate_poll_s))
        while True:
            result = super().dequeue_job_and_maintain_ttl(slice_s, max_idle_time=slice_s)
            if result is not None or self._stop_requested:
                return result
            self.refresh_host_lock()
            self.check_for_suspension(False)
            if self._stop_requested:
                return None

    def heartbeat(self, timeout=None, pipeline=None):
        super().heartbeat(timeout, pipeline)
        if pipeline is None:
            try:
                self.refresh_host_lock()
            except redis.RedisError:
                pass

    # ------------------------------------------------------------ jobs

    def execute_job(self, job: Job, queue: Queue):
        why = refusal(job)
        if why:
            self.refuse_job(job, queue, why)
            return
        super().execute_job(job, queue)
        self._after_job(job)

    def refuse_job(self, job: Job, queue: Queue, msg: str) -> None:
        self.prepare_execution(job)
        fail_refused(self, job, queue, msg)
        self.set_state("idle")

    def fork_work_horse(self, job: Job, queue: Queue):
        """Spawn the render process: a fresh Python running `horse_main`, which
        fetches the job again and re-checks the allowlist before running it
        (rq's own spawn script would run whatever the fetched job names)."""
        os.environ["RQ_WORKER_ID"] = self.name
        os.environ["RQ_EXECUTION_ID"] = self.execution.id
        kw = get_connection_kwargs(self.connection)
        for k in ("retry", "driver_info"):  # not rebuildable from their repr (as rq drops them)
            kw.pop(k, None)
        code = ("from h3render.worker.worker import horse_main; "
                f"horse_main({kw!r}, {self.key!r}, {job.id!r}, {queue.name!r})")
        self._horse_pid = os.spawnv(os.P_NOWAIT, sys.executable, [sys.executable, "-c", code])
        self.procline(f"Spawned {self._horse_pid} at {time.time()}")

    def _after_job(self, job: Job) -> None:
        self._timeout_base.pop(job.id, None)
        try:
            job.refresh()
        except Exception:  # noqa: BLE001 - the job may have expired
            return
        h = job.meta.get("h3r") or {}
        if h.get("state") == JobPhase.canceled.value and job.get_status() != JobStatus.CANCELED:
            try:
                job.cancel()
            except InvalidJobOperation:
                pass

    def maintain_heartbeats(self, job: Job):
        """rq's heartbeats while the render process runs, with the job's timeout
        first moved on by the time it has spent paused for heat (meta "pauses"): a
        pause is bounded by thermal_pause_max_s, not by the job's timeout, and the
        render process holds its own timeout alarm while paused (render._thermal_pause).
        rq kills a horse past timeout + 60 s and sizes heartbeat TTLs from it."""
        try:
            extend_timeout_by_pauses(job, self._timeout_base)
        except (redis.RedisError, ValueError, TypeError) as e:
            log.error("job %s: could not read its pauses: %s", job.id, e)
        try:  # the machine record outlives a long render (it expires without a refresh)
            from h3render.worker.publish import publish_machine

            publish_machine(self.connection, self.host, self.name, self.settings)
        except redis.RedisError as e:
            log.error("could not publish the machine's memory: %s", e)
        super().maintain_heartbeats(job)

    def handle_work_horse_killed(self, job, retpid, ret_val, rusage):
        """The render process died (engine crash, OOM killer): record it in meta."""
        sig = os.WTERMSIG(ret_val) if ret_val and os.WIFSIGNALED(ret_val) else None
        name = signal.Signals(sig).name if sig else None
        try:
            job.refresh()
        except Exception:  # noqa: BLE001
            pass
        h = dict(job.meta.get("h3r") or {})
        where = h.get("phase") or h.get("state") or "start"
        if h.get("step") is not None and h.get("phase") == "denoise":
            where = f"denoise step {h.get('step')}/{h.get('steps')}"
        what = f"signal {sig} ({name})" if sig else f"exit status {ret_val}"
        h.update(state=JobPhase.failed.value if not job.retries_left else JobPhase.queued.value,
                 error=f"engine crash: the render process died with {what} during {where}",
                 engine_error=h.get("engine_error") or f"render process killed by {what}",
                 retryable=True, crashes=int(h.get("crashes", 0)) + 1)
        job.meta["h3r"] = h
        job.save_meta()
        log.error("job %s: %s", job.id, h["error"])

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
        """Take the host lock, recover a dead predecessor's jobs, publish the installed
        models' engine info, work, release."""
        self.acquire_host_lock()
        try:
            from h3render.worker.staging import sweep_staging  # renders killed before this start

            sweep_staging(self.settings.renders_dir())
            self.publish_models()
            return self.work(burst=burst, max_jobs=max_jobs, with_scheduler=with_scheduler,
                             logging_level=logging_level)
        finally:
            self.release_host_lock()


# ---------------------------------------------------------------- the render process


class HorseWorker(Worker):
    """The worker as seen from inside the render process: rq's Worker whose
    perform_job re-checks the allowlist on the job this process fetched."""

    def perform_job(self, job: Job, queue: Queue) -> bool:
        why = refusal(job)
        if why:
            fail_refused(self, job, queue, why + " (checked again by the render process)")
            return False
        return super().perform_job(job, queue)


def horse_main(redis_kwargs: dict, worker_key: str, job_id: str, queue_name: str) -> None:
    """Entry point of the render process spawned by H3Worker.fork_work_horse.

    Rebuilds the worker, job, queue and execution from Redis as rq's SpawnWorker
    script does, then runs the job through HorseWorker (allowlist re-checked on
    the job as fetched here). Exits the process: 0 when the job ran or was
    refused and recorded, 1 when the worker record is gone or the job failed to
    be handled (rq's main_work_horse)."""
    from rq.executions import Execution

    conn = redis.Redis(**redis_kwargs)
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
