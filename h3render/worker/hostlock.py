"""One worker per host and Redis: the lock "h3render:worker-lock:<host>" holding {name, pid, since}.

    acquire   free: taken. Held by a live worker: WorkerLockedError, unless forced; a
              forced worker then runs beside it *without* the lock, which stays with its
              holder (so the holder keeps refreshing it, and a third worker is refused
              while the holder lives). Held by a dead pid: taken over; the caller then
              recovers the dead worker's jobs.
    refresh   every heartbeat: our own lock is renewed; a lock that expired or whose
              holder died is taken (a forced worker inherits it when the holder is
              gone); a lock another live worker took from us (ours expired during a long
              Redis outage) is reported, and the worker stops after its current job.
    release   deletes the lock only when this worker holds it.
"""

from __future__ import annotations

import json
import logging
import os
import time

import redis

from h3render.keys import LOCK_KEY
from h3render.procs import pid_alive

log = logging.getLogger("h3render.worker")


class WorkerLockedError(RuntimeError):
    """Another live worker holds this host's lock."""


def _holder(raw: bytes | None) -> tuple[str | None, int]:
    if not raw:
        return None, 0
    try:
        doc = json.loads(raw)
        return str(doc.get("name")), int(doc.get("pid") or 0)
    except (ValueError, TypeError, AttributeError):
        return "?", 0


class HostLock:
    def __init__(self, r: redis.Redis, host: str, name: str, ttl_s: int, force: bool = False):
        self.r, self.host, self.name, self.ttl_s, self.force = r, host, name, ttl_s, force
        self.held = False
        self.lost: str | None = None  # why the lock was taken from us, once it was
        self.key = LOCK_KEY.format(host=host)

    def _mine(self) -> str:
        return json.dumps({"name": self.name, "pid": os.getpid(), "since": time.time()})

    def acquire(self) -> tuple[str, int] | None:
        """Take the lock (see the module doc). Returns (name, pid) of a dead holder whose
        lock was taken over, else None. Raises WorkerLockedError."""
        if self.r.set(self.key, self._mine(), nx=True, ex=self.ttl_s):
            self.held = True
            return None
        name, pid = _holder(self.r.get(self.key))
        alive = pid > 0 and pid_alive(pid)
        if alive and not self.force:
            raise WorkerLockedError(
                f"another h3render worker ({name}, pid {pid}) already runs on {self.host} "
                f"with this Redis; one worker per machine. Stop it, or pass --force to run a "
                "second one anyway")
        if alive:
            log.warning("--force: running beside worker %s (pid %s); the host lock stays with it",
                        name, pid)
            return None
        self.r.set(self.key, self._mine(), ex=self.ttl_s)
        self.held = True
        log.warning("worker %s (pid %s) on %s is gone; taking over its lock", name, pid, self.host)
        return (name or "?", pid)

    def refresh(self) -> tuple[str, int] | None:
        """Renew or take the lock; (name, pid) of a dead holder taken over, else None."""
        raw = self.r.get(self.key)
        name, pid = _holder(raw)
        if raw is None:
            if self.r.set(self.key, self._mine(), nx=True, ex=self.ttl_s):
                self.held = True
            return None
        if name == self.name:
            self.r.set(self.key, self._mine(), ex=self.ttl_s)
            self.held = True
            return None
        if pid > 0 and pid_alive(pid):
            if self.held and not self.force and self.lost is None:
                self.lost = (f"another h3render worker ({name}, pid {pid}) took this host's lock; "
                             "one worker per machine")
                log.error("%s: stopping after the current job", self.lost)
            self.held = False
            return None
        self.r.set(self.key, self._mine(), ex=self.ttl_s)
        self.held = True
        log.warning("worker %s (pid %s) on %s is gone; taking over its lock", name, pid, self.host)
        return (name or "?", pid)

    def release(self) -> None:
        if not self.held:
            return
        try:
            name, _ = _holder(self.r.get(self.key))
            if name == self.name:
                self.r.delete(self.key)
        except redis.RedisError as e:
            log.error("could not release the host lock (%s); it expires by itself", e)
        self.held = False
