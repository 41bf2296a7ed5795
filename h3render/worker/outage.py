"""When Redis, not a job, is the problem: which Redis errors the worker waits out and which end it.

    classify(exc)    "auth"        the server refuses this worker's credentials or
                                   commands (NOAUTH, WRONGPASS, NOPERM): no job can fix
                                   it, the worker exits non-zero with one line
                     "connection"  the server is gone, restarting or loading its data:
                                   the worker waits for it
                     "write"       it answers but refuses writes (MISCONF after a failed
                                   save, OOM under maxmemory, READONLY replica, too few
                                   replicas): the gate closes with that reason until a
                                   write goes through again
                     None          any other error: not Redis's state
    write_problem    one probe write (WRITE_PROBE_KEY): None when Redis accepts writes
    wait_until_usable  the wait itself: polls until a probe write succeeds, calling back
                     with the reason so the worker can show it as its state and in its
                     health record (best effort: a refused write cannot be published
                     until Redis accepts writes again)
"""

from __future__ import annotations

import logging
import re
import time
from typing import Callable

import redis

from h3render.keys import WRITE_PROBE_KEY

log = logging.getLogger("h3render.worker")

WRITE_MARKERS = ("MISCONF", "OOM ", "READONLY", "NOREPLICAS", "EXECABORT", "LOADING", "UNBLOCKED",
                 "read only replica", "command not allowed when used memory")
AUTH_MARKERS = ("NOAUTH", "WRONGPASS", "NOPERM", "invalid password", "invalid username-password")


class FatalWorkerError(RuntimeError):
    """What no job can fix: the worker stops with `exit_code` and this one-line message."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(one_line(message))
        self.exit_code = exit_code


def one_line(text: object, limit: int = 300) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[:limit - 3] + "..."


def classify(exc: BaseException) -> str | None:
    msg = str(exc)
    if isinstance(exc, (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError)) or (
            isinstance(exc, redis.RedisError) and any(m in msg for m in AUTH_MARKERS)):
        return "auth"
    if isinstance(exc, (redis.exceptions.OutOfMemoryError, redis.exceptions.ReadOnlyError)):
        return "write"  # redis-py drops the OOM / READONLY prefix from these messages
    if isinstance(exc, redis.ResponseError) and any(m in msg for m in WRITE_MARKERS):
        return "write" if "LOADING" not in msg else "connection"
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError, ConnectionError, TimeoutError)):
        return "connection"
    return None


def _bare(exc: BaseException) -> str:
    """The server's message without redis-py's "Command # n (...) of pipeline caused error: "."""
    return re.sub(r"^Command # \d+ \(.*?\) of pipeline caused error: ", "", one_line(exc, 2000))


def describe(exc: BaseException) -> str:
    """The gate's reason for an outage, one line."""
    kind, text = classify(exc), _bare(exc)
    if kind == "write":
        return f"Redis refuses writes: {one_line(text, 200)}"
    if kind == "connection":
        return f"Redis unavailable: {one_line(text, 200)}"
    return one_line(text, 200)


def write_problem(r: redis.Redis, host: str) -> BaseException | None:
    """None when a small write succeeds; else the error (auth errors are raised as fatal)."""
    try:
        r.set(WRITE_PROBE_KEY.format(host=host), repr(time.time()), ex=120)
        return None
    except redis.RedisError as e:
        if classify(e) == "auth":
            raise FatalWorkerError(f"Redis refuses this worker: {e}") from e
        return e


def wait_until_usable(r: redis.Redis, host: str, exc: BaseException, *,
                      stop: Callable[[], bool], on_wait: Callable[[str], None],
                      sleep: Callable[[float], None] = time.sleep, poll_s: float = 1.0,
                      max_poll_s: float = 5.0) -> float:
    """Block until Redis accepts a write again (or stop() is true). `on_wait(reason)` runs
    whenever the reason changes. Returns the seconds waited. Raises FatalWorkerError for
    auth errors."""
    if classify(exc) == "auth":
        raise FatalWorkerError(f"Redis refuses this worker: {exc}") from exc
    t0 = time.time()
    reason = describe(exc)
    log.error("%s; waiting for Redis", reason)
    on_wait(reason)
    delay = poll_s
    while not stop():
        sleep(delay)
        problem = write_problem(r, host)
        if problem is None:
            log.warning("Redis accepts writes again after %.1f s", time.time() - t0)
            return time.time() - t0
        now_reason = describe(problem)
        if now_reason != reason:
            reason = now_reason
            log.error("%s; waiting for Redis", reason)
            on_wait(reason)
        delay = min(max_poll_s, delay * 1.5)
    return time.time() - t0
