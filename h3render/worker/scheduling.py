"""Retries on time and no job left behind: the worker's scheduler process and its sweep of the started registry.

    H3Scheduler     rq's scheduler (it moves due retries from the scheduled registry to
                    the queue), changed in three ways:
                    - it outlives a Redis restart: a Redis error is logged and the loop
                      goes on (rq's scheduler process exits on the first one, and rq
                      starts a new one only in its 10-minute maintenance, so retries
                      stalled for up to 10 minutes);
                    - it dies with its worker: on Linux PR_SET_PDEATHSIG sends it SIGTERM
                      when the worker dies, however it dies (SIGKILL included), and every
                      loop checks that its parent is still the worker (the portable
                      fallback); it then releases its locks and exits, so no orphan holds
                      rq's scheduler lock;
                    - each due job's record is checked before rq loads it
                      (h3render.worker.intake.load): one bad record is failed, not a
                      crash of the scheduler.
                    The worker checks every dequeue slice that its scheduler process is
                    alive and starts it again at once when it is not (`ensure_scheduler`).
    sweep_started   the started registry of every queue, for jobs whose worker is gone:
                    its record was removed or marks its death, its pid is dead on this
                    host, or it has been silent for `stale_after_s` (another host). Such
                    a job goes back to the front of its queue at once (one retry of its
                    budget: the worker died, not the job, so no retry interval) or is
                    failed when no retry is left, with the reason, unless its
                    render process still runs on this host (that process notices its
                    worker is gone within a step and ends the job itself) or it was asked
                    to stop (then it ends canceled). The worker runs it every
                    `sweep_every_s`, not only when it takes over a dead worker's lock.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import time
from datetime import timezone
from multiprocessing import get_context

import redis
from rq import Queue
from rq.job import JobStatus
from rq.registry import StartedJobRegistry
from rq.scheduler import SCHEDULER_KEY_TEMPLATE, SCHEDULER_LOCKING_KEY_TEMPLATE, RQScheduler
from rq.utils import current_timestamp

from h3render.procs import pid_alive
from h3render.queue.job import JobPhase
from h3render.queue.jobstate import record_state
from h3render.worker import intake
from h3render.worker.outage import classify

log = logging.getLogger("h3render.worker")



def beat_s(settings) -> float:
    """Longest time between two heartbeats of a live worker: its dequeue slices, its job
    monitoring interval and its closed-gate polls are all at most this."""
    return float(max(1, min(30, settings.gate_poll_s)))


def stale_after_s(settings) -> float:
    """A worker on another host silent this long is dead: three missed heartbeats."""
    return max(10.0, 3 * beat_s(settings))


def sweep_every_s(settings) -> float:
    """How often a worker sweeps the started registry (15 s at the default 15 s gate poll)."""
    return max(2.0, min(15.0, 2 * beat_s(settings)))

PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int, sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send `sig` to this process when its parent dies (Linux), and exit
    now if the parent is already gone (it may die before the request takes effect)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        except (OSError, AttributeError) as e:
            log.warning("scheduler: no PR_SET_PDEATHSIG (%s); relying on the parent check", e)
    if os.getppid() != parent:
        os._exit(0)


# ---------------------------------------------------------------- the scheduler


class H3Scheduler(RQScheduler):
    """See the module doc. `job_class` loads due jobs (the worker's AllowlistJob)."""

    def __init__(self, *args, job_class=None, worker_name: str = "", **kwargs):
        super().__init__(*args, **kwargs)
        self.job_class = job_class
        self.worker_name = worker_name
        self.parent_pid = os.getpid()

    def start(self):
        self._status = self.Status.STARTED
        self._connection = None  # a fresh connection in the child
        self.parent_pid = os.getpid()
        self._process = get_context("fork").Process(target=_run, args=(self,), name="Scheduler")
        self._process.start()
        return self._process

    def alive(self) -> bool:
        return bool(self._process and self._process.is_alive())

    def work(self):
        self._install_signal_handlers()
        born, failing = False, None
        while not self._stop_requested and os.getppid() == self.parent_pid:
            try:
                if not born:
                    self.register_birth()
                    born = True
                if self.should_reacquire_locks:
                    self.acquire_locks()
                self.heartbeat()
                self.enqueue_scheduled_jobs()
                if failing:
                    log.warning("scheduler: Redis is back (%s)", failing)
                failing = None
            except redis.RedisError as e:
                kind = classify(e) or "error"
                if failing != kind:
                    log.error("scheduler: %s (%s); retrying every %s s", e, kind, self.interval)
                failing = kind
                born = born and kind != "connection"  # its record may be gone with the data
            except Exception:  # noqa: BLE001 - one bad job must not end the scheduler
                log.exception("scheduler: unexpected error; going on")
            time.sleep(self.interval)
        if os.getppid() != self.parent_pid:
            log.warning("scheduler: its worker (pid %s) is gone; stopping", self.parent_pid)
        try:
            self.stop()
        except redis.RedisError as e:
            log.error("scheduler: could not release its locks (%s); they expire by themselves", e)

    def enqueue_scheduled_jobs(self):
        """rq's, with each due record checked first (intake.load) and ids read as bytes."""
        self._status = self.Status.WORKING
        if not self._scheduled_job_registries and self._acquired_locks:
            self.prepare_registries()
        r = self.connection
        for registry in self._scheduled_job_registries:
            due = r.zrangebyscore(registry.key, 0, current_timestamp(), start=0, num=1000)
            if not due:
                continue
            queue = Queue(registry.name, connection=r, serializer=self.serializer, job_class=self.job_class)
            for raw_id in due:
                found = intake.Found(registry.key, [raw_id], is_list=False)
                job = intake.load(r, registry.name, raw_id, worker=self.worker_name or self.name,
                                  job_class=self.job_class or queue.job_class, serializer=self.serializer,
                                  found=found, canceled_why="before its retry")
                if job is None:
                    continue
                with r.pipeline() as pipe:
                    queue._enqueue_job(job, pipeline=pipe, at_front=job.should_enqueue_at_front())
                    registry.remove(job.id, pipeline=pipe)
                    pipe.execute()
        self._status = self.Status.STARTED


def _run(scheduler: H3Scheduler) -> None:
    die_with_parent(scheduler.parent_pid)
    log.info("scheduler for %s started with pid %s", ", ".join(scheduler._queue_names), os.getpid())
    scheduler.work()
    log.info("scheduler with pid %s has stopped", os.getpid())


def clear_dead_scheduler_locks(r: redis.Redis, queues, host: str) -> None:
    """Drop rq scheduler locks whose holder is a dead process on this host (or has no
    record), so a new scheduler starts now instead of after the lock's TTL."""
    for q in queues:
        key = SCHEDULER_LOCKING_KEY_TEMPLATE % q.name
        holder = r.get(key)
        if not holder:
            continue
        info = r.hgetall(SCHEDULER_KEY_TEMPLATE % holder.decode(errors="replace"))
        h = (info.get(b"hostname") or b"").decode(errors="replace")
        try:
            pid = int(info.get(b"pid") or 0)
        except ValueError:
            pid = 0
        if not info or (h == host and pid and not pid_alive(pid)):
            r.delete(key)
            log.warning("removed the scheduler lock of a dead scheduler (pid %s)", pid)


def ensure_scheduler(worker) -> bool:
    """Start the worker's scheduler process again if it is gone and its lock is free
    (or held by a dead scheduler here). True when a new process was started."""
    s = worker.scheduler
    if s is None or s.alive():
        return False
    if s._process is not None:
        s._process.join(timeout=0)
        log.warning("the scheduler process (pid %s) is gone; starting it again", s._process.pid)
        s._process = None
    clear_dead_scheduler_locks(worker.connection, worker.queues, worker.host)
    s.acquire_locks(auto_start=True)
    return s.alive()


# ---------------------------------------------------------------- jobs of dead workers


def _ts(raw: bytes | None) -> float | None:
    if not raw:
        return None
    try:
        from rq.utils import utcparse

        return utcparse(raw.decode()).replace(tzinfo=timezone.utc).timestamp()
    except (ValueError, UnicodeDecodeError):
        return None


def worker_gone(r: redis.Redis, name: str, host: str, stale_s: float, now: float | None = None) -> str | None:
    """Why the rq worker `name` is dead, or None while it may be alive (silent for at most
    stale_s when it runs on another host)."""
    now = time.time() if now is None else now
    info = r.hgetall(f"rq:worker:{name}")
    if not info:
        return f"its worker {name} is gone (no worker record)"
    if info.get(b"death"):
        return f"its worker {name} has stopped"
    wh = (info.get(b"hostname") or b"").decode(errors="replace")
    try:
        pid = int(info.get(b"pid") or 0)
    except ValueError:
        pid = 0
    if wh == host and pid and not pid_alive(pid):
        return f"its worker {name} (pid {pid}) died"
    beat = _ts(info.get(b"last_heartbeat"))
    if wh != host and (beat is None or now - beat > stale_s):
        return f"its worker {name} on {wh or '?'} has been silent for {now - (beat or 0):.0f} s"
    return None


def _entry_worker(r: redis.Redis, member: bytes) -> str | None:
    name = r.hget(b"rq:execution:" + member, "worker_name")
    return name.decode(errors="replace") if name else None


def sweep_started(worker, only_worker: str | None = None, reason: str | None = None) -> list[str]:
    """Recover the jobs of dead workers from every queue's started registry (see the
    module doc). only_worker/reason: the jobs of that worker, known dead (lock takeover).
    Returns the ids it settled."""
    r, settled = worker.connection, []
    now = time.time()
    for q in worker.queues:
        reg = StartedJobRegistry(q.name, connection=r, serializer=worker.serializer)
        by_job: dict[bytes, list[tuple[bytes, float]]] = {}
        for m, score in r.zrange(reg.key, 0, -1, withscores=True):
            by_job.setdefault(m.split(b":", 1)[0], []).append((m, score))
        running = worker.execution.composite_key.encode() if worker.execution is not None else None
        for raw_id, entries in by_job.items():
            members = [m for m, _ in entries]
            if running in members:
                continue  # this worker's own job in flight
            names = {n for n in (_entry_worker(r, m) for m in members) if n}
            if not names:
                job_worker = r.hget(b"rq:job:" + raw_id, "worker_name") if raw_id else None
                names = {job_worker.decode(errors="replace")} if job_worker else set()
            why = None
            if only_worker is not None:
                why = reason if only_worker in names else None
            elif worker.name in names:
                why = f"its worker {worker.name} (this one) no longer runs it"
            else:
                for n in names:
                    why = worker_gone(r, n, worker.host, stale_after_s(worker.settings), now)
                    if why:
                        break
                if not names and all(score < now for _, score in entries):
                    why = "its heartbeat expired and no worker is named"
            if why is None:
                continue
            if recover(worker, q, reg, raw_id, members, why):
                settled.append(raw_id.decode(errors="replace"))
    return settled


def recover(worker, q: Queue, reg: StartedJobRegistry, raw_id: bytes, members: list[bytes],
            why: str) -> bool:
    """Retry (retry budget) or fail one job of a dead worker; True when settled here."""
    r = worker.connection
    found = intake.Found(reg.key, members, is_list=False)
    job = intake.load(r, q.name, raw_id, worker=worker.name, job_class=worker.job_class,
                      serializer=worker.serializer, found=found, canceled_why="while its worker was gone")
    if job is None:
        return True
    h = dict(job.meta.get("h3r") or {})
    try:
        pid = int(h.get("pid") or 0)
    except (TypeError, ValueError):
        pid = 0
    if pid and h.get("host") == worker.host and pid_alive(pid):
        return False  # its render process fails it itself within a step
    err = f"worker lost: {why}"
    retry = bool(job.retries_left and job.retries_left > 0)
    state = JobPhase.queued if retry else JobPhase.failed
    h.update(state=state.value, error=err, engine_error=h.get("engine_error", ""), retryable=True)
    job.meta["h3r"] = h
    with r.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(reg.key)
            present = [m for m in members if pipe.zscore(reg.key, m) is not None]
            if len(present) != len(members):
                return False  # settled meanwhile (its render process, another worker)
            pipe.multi()
            for m in members:
                pipe.zrem(reg.key, m)
                pipe.delete(b"rq:execution:" + m)
            pipe.hset(job.key, "meta", job.serializer.dumps(job.meta))
            record_state(pipe, h.get("sweep_id"), job.id, state)
            if retry:  # at once, at the front: the worker died, not the job
                job.retries_left -= 1
                q._enqueue_job(job, pipeline=pipe, at_front=True)
            else:
                job.set_status(JobStatus.FAILED, pipeline=pipe)
                job._handle_failure(err, pipe, worker_name=worker.name)
            pipe.execute()
        except redis.WatchError:
            return False
    log.warning("job %s: %s; %s", job.id, err, "requeued" if retry else "failed (no retries left)")
    return True

