"""Acknowledged means stored: what Redis promises for a write, checked around each enqueue.

An enqueue or a sweep is one MULTI/EXEC (h3render.queue.enqueue). Around it:

    probe(r)            before: one INFO and one CONFIG GET -> Persistence (version, AOF on or
                        off, fsync policy, and where the AOF and the log are when the server
                        runs on this machine)
    check_room(p, n)    before: refuse when the AOF's disk (on this machine) cannot take the n
                        bytes of the write plus a reserve. With appendfsync always Redis exits
                        on a failed AOF write rather than acknowledge it; a full disk that can
                        be seen coming should not take the server down for every client.
    confirm(wr, p)      after: the write is on disk as far as this server can say, or
                        NotStoredError; returns warnings (a failed AOF rewrite, ...)
    not_stored(exc, p)  the error for a write Redis refused (MISCONF, OOM, READONLY) or never
                        acknowledged (it exited), with its cause and the disk's free bytes

What an acknowledged write is, per server (docs/RELIABILITY.md, "What can be lost, and when"):

    AOF on, Redis >= 7.2        WAITAOF 1 0 after the EXEC: the server says it fsynced  FSYNCED
    AOF on, appendfsync always  the reply comes after the fsync, and Redis exits rather
                                than reply when the write or the fsync fails            FSYNCED
    AOF on, everysec or no      written to the AOF file before the reply (normally),
                                fsynced about once a second (everysec) or when the OS
                                likes (no)                                              WRITTEN
    AOF off                     in memory, and in the next RDB snapshot if any          MEMORY
    AOF on, CONFIG refused      the policy cannot be read                               UNKNOWN
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import redis

from h3render.queue.errors import NotStoredError

MiB = 1024**2
# Room kept free beyond the write itself: the AOF's manifest and the server's log also live
# there, and a 4 KiB-page filesystem rounds every append up.
ROOM_RESERVE_BYTES = 1 * MiB
WAITAOF_TIMEOUT_MS = 5000
WAITAOF_VERSION = (7, 2, 0)
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
# Lines of the server's log that say why it stopped persisting (or stopped).
_LOG_CAUSE = re.compile(r"AOF|fsync|No space|Exiting|MISCONF|OOM|out of memory|write error", re.I)
_LOG_PREFIX = re.compile(r"^\d+:[A-Z] \d+ \w+ \d+ [\d:.]+ [#*.-] ")


class Stored(str, Enum):
    """What an acknowledged enqueue is, on this server."""

    fsynced = "fsynced"
    written = "written"
    memory = "memory"
    unknown = "unknown"

    @property
    def text(self) -> str:
        return _PROMISES[self]


_PROMISES = {
    Stored.fsynced: "on disk (fsynced before the reply)",
    Stored.written: "in Redis's AOF file, fsynced about once a second: a Redis crash loses nothing, "
                    "a power cut or an OS crash can lose the last second or two",
    Stored.memory: "in Redis's memory only (its AOF is off): a Redis restart loses what was queued "
                   "since its last RDB snapshot",
    Stored.unknown: "in Redis's AOF, with an fsync policy Redis does not disclose (CONFIG is disabled)",
}


@dataclass(frozen=True)
class Persistence:
    """How the server persists, as read before a write."""

    version: tuple[int, ...]
    aof_enabled: bool
    appendfsync: str | None  # always | everysec | no; None when CONFIG is refused
    write_status: str  # INFO persistence aof_last_write_status
    bgrewrite_status: str  # aof_last_bgrewrite_status
    bgsave_status: str  # rdb_last_bgsave_status
    local: bool  # the server runs on this machine (loopback or a unix socket)
    aof_dir: Path | None = None  # where its AOF is, when local
    logfile: Path | None = None  # its log, when local and it logs to a file

    @property
    def waitaof(self) -> bool:
        return self.aof_enabled and self.version >= WAITAOF_VERSION

    @property
    def stored(self) -> Stored:
        if not self.aof_enabled:
            return Stored.memory
        if self.waitaof or self.appendfsync == "always":
            return Stored.fsynced
        if self.appendfsync in ("everysec", "no"):
            return Stored.written
        return Stored.unknown

    def summary(self) -> str:
        """What INFO said, for a server whose disk cannot be seen from here."""
        return (f"Redis {'.'.join(map(str, self.version))}, aof_enabled={int(self.aof_enabled)}, "
                f"appendfsync={self.appendfsync or '?'}, aof_last_write_status={self.write_status}, "
                f"aof_last_bgrewrite_status={self.bgrewrite_status}, "
                f"rdb_last_bgsave_status={self.bgsave_status}")


def _text(v) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else "" if v is None else str(v)


def _version(text: str) -> tuple[int, ...]:
    parts = [int(x) for x in re.findall(r"\d+", text)[:3]]
    return tuple(parts + [0] * (3 - len(parts)))


def is_local(r: redis.Redis) -> bool:
    """True when r talks to a server on this machine (so its paths are ours to read)."""
    kw = r.connection_pool.connection_kwargs
    if kw.get("path"):
        return True
    host = _text(kw.get("host", "localhost"))
    return host in LOCAL_HOSTS or host.startswith("127.")


def _config(r: redis.Redis, names: tuple[str, ...]) -> dict[str, str]:
    try:
        raw = r.config_get(*names)  # several patterns at once: Redis >= 7.0
    except redis.ResponseError:
        raw = {}
        for name in names:  # an older server, or CONFIG renamed away: each alone, best effort
            try:
                raw.update(r.config_get(name))
            except redis.ResponseError:
                pass
    return {_text(k): _text(v) for k, v in raw.items()}


def from_info(info: dict, conf: dict[str, str], local: bool) -> Persistence:
    """Persistence from INFO (default sections) and CONFIG GET output. Pure."""
    aof_dir = logfile = None
    if local and conf.get("dir"):
        base = Path(conf["dir"])
        aof_dir = base / conf["appenddirname"] if conf.get("appenddirname") else base
        if conf.get("logfile"):
            logfile = Path(conf["logfile"]) if Path(conf["logfile"]).is_absolute() else base / conf["logfile"]
    policy = conf.get("appendfsync") or None
    return Persistence(
        version=_version(_text(info.get("redis_version", "0"))),
        aof_enabled=bool(int(info.get("aof_enabled", 0) or 0)),
        appendfsync=policy,
        write_status=_text(info.get("aof_last_write_status", "ok")),
        bgrewrite_status=_text(info.get("aof_last_bgrewrite_status", "ok")),
        bgsave_status=_text(info.get("rdb_last_bgsave_status", "ok")),
        local=local, aof_dir=aof_dir, logfile=logfile,
    )


def probe(r: redis.Redis) -> Persistence:
    """How r's server persists now (two round trips)."""
    return from_info(r.info(), _config(r, ("appendfsync", "dir", "appenddirname", "logfile")), is_local(r))


# ---------------------------------------------------------------- before the write


def write_bytes(commands) -> int:
    """Bytes the staged pipeline commands take in the AOF (its RESP form, plus MULTI/EXEC)."""
    total = 32
    for args, _options in commands:
        total += len(f"*{len(args)}\r\n")
        for a in args:
            n = len(a) if isinstance(a, (bytes, bytearray, memoryview)) else len(str(a).encode())
            total += len(f"${n}\r\n") + n + 2
    return total


def disk_free(path: Path) -> int | None:
    """Free bytes of the filesystem holding `path` (its nearest existing parent), or None."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def _disk(p: Persistence) -> tuple[int | None, str]:
    if p.aof_dir is not None:
        free = disk_free(p.aof_dir)
        if free is not None:
            return free, str(p.aof_dir)
    if p.local:
        return None, f"its AOF directory is unknown (CONFIG GET dir refused); {p.summary()}"
    return None, f"the server is on another machine; its INFO says {p.summary()}"


def check_room(p: Persistence, nbytes: int) -> None:
    """Raise NotStoredError when the server says it cannot persist, or when the local disk of
    its AOF cannot take `nbytes` plus ROOM_RESERVE_BYTES."""
    if p.aof_enabled and p.write_status != "ok":
        free, where = _disk(p)
        raise NotStoredError(f"Redis reports that its last AOF write failed (aof_last_write_status:"
                             f"{p.write_status}) and refuses writes until one succeeds", free, where)
    if not p.aof_enabled or p.aof_dir is None:
        return
    free = disk_free(p.aof_dir)
    if free is not None and free < nbytes + ROOM_RESERVE_BYTES:
        raise NotStoredError(f"the disk of Redis's AOF is full: this write needs about {nbytes} bytes "
                             f"and {ROOM_RESERVE_BYTES} more are kept in reserve", free, str(p.aof_dir))


# ---------------------------------------------------------------- after the write


def confirm(wr: redis.Redis, p: Persistence) -> list[str]:
    """After an acknowledged EXEC on `wr` (a client that does not retry): raise NotStoredError
    unless the write is stored as p.stored says; return warnings worth showing."""
    if p.waitaof:
        try:
            numlocal = int(wr.execute_command("WAITAOF", 1, 0, WAITAOF_TIMEOUT_MS)[0])
        except (redis.ConnectionError, redis.TimeoutError) as e:
            raise NotStoredError(f"Redis acknowledged the write but the connection was lost before it "
                                 f"confirmed the fsync (WAITAOF): {e}; the jobs may be queued: check "
                                 "`h3render status` before queueing them again", *_disk(p)) from None
        except redis.ResponseError as e:
            raise not_stored(e, p) from None
        if numlocal < 1:
            raise NotStoredError(f"Redis did not fsync the write within {WAITAOF_TIMEOUT_MS} ms (WAITAOF); "
                                 "the jobs are in its memory and may be queued: check `h3render status` "
                                 "before queueing them again", *_disk(p))
    try:
        info = wr.info("persistence")
    except (redis.ConnectionError, redis.TimeoutError):
        if p.stored == Stored.fsynced:
            return []  # the EXEC's reply came after its fsync: nothing left to confirm
        return ["Redis acknowledged the jobs, then could not be asked whether it wrote them to its AOF"]
    if p.aof_enabled and _text(info.get("aof_last_write_status", "ok")) != "ok":
        free, where = _disk(p)
        raise NotStoredError("Redis accepted the jobs into memory but could not write them to its AOF "
                             "(aof_last_write_status:err): they are lost if Redis restarts, and run if "
                             "Redis manages to write them later; check `h3render status` before "
                             "queueing them again", free, where)
    warnings = []
    if p.aof_enabled and _text(info.get("aof_last_bgrewrite_status", "ok")) != "ok":
        free, where = _disk(p)
        room = f" ({free} bytes free on {where})" if free is not None else ""
        warnings.append(f"Redis's last AOF rewrite failed{room}: the jobs are stored, but its AOF "
                        "keeps growing until a rewrite succeeds")
    if not p.aof_enabled and _text(info.get("rdb_last_bgsave_status", "ok")) != "ok":
        warnings.append("Redis's last RDB snapshot failed and its AOF is off: the jobs are in memory only")
    return warnings


# Replies of a server that refuses writes it could not keep (rather than a bad command).
REFUSALS = ("MISCONF", "READONLY", "OOM", "NOREPLICAS", "NOTENOUGHREPLICAS")


def is_refusal(exc: Exception) -> bool:
    """True for a ResponseError saying the server cannot take writes now (MISCONF, OOM, ...)."""
    return isinstance(exc, redis.ResponseError) and str(exc).split(" ", 1)[0] in REFUSALS


def not_stored(exc: Exception, p: Persistence) -> NotStoredError:
    """The NotStoredError for an EXEC that Redis refused or never acknowledged."""
    free, where = _disk(p)
    if isinstance(exc, redis.ResponseError):
        return NotStoredError(f"Redis refused the write: {exc}", free, where)
    logged = log_cause(p.logfile) if p.logfile is not None else ""
    how = f"its log says: {logged}" if logged else str(exc) or type(exc).__name__
    return NotStoredError(f"Redis closed the connection before acknowledging the write ({how}); "
                          "the sweep is one transaction, so it is stored whole or not at all", free, where)


def log_cause(logfile: Path, tail_bytes: int = 8192) -> str:
    """The last lines of a Redis log, since the server last started, that say why it stopped
    persisting (or stopped), or ""."""
    try:
        with open(logfile, "rb") as f:
            f.seek(0, 2)
            f.seek(max(f.tell() - tail_bytes, 0))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    starts = [i for i, ln in enumerate(lines) if "Ready to accept connections" in ln]
    run = lines[starts[-1] + 1:] if starts else lines[-30:]  # this run's lines, not an old incident's
    picked = [_LOG_PREFIX.sub("", ln).strip() for ln in run if _LOG_CAUSE.search(ln)]
    return " / ".join(f"'{ln}'" for ln in picked[-2:])
