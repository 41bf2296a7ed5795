"""Acknowledged means stored: a full AOF disk and a Redis SIGKILL lose no acknowledged job.

Each case runs its own embedded redis-server (the package's EmbeddedRedis, appendfsync
always) on a free port: on a size-limited tmpfs for the full disk, on the test's temp
dir for the kills. About 30 s for the file on 2 cores.
"""

from __future__ import annotations

import errno
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from rq import Queue
from rq.serializers import JSONSerializer

from faults.harness import REPO, run_cli, wait_for
from h3render.keys import SWEEPS_KEY
from h3render.queue import durability
from h3render.queue.engine_info import publish_engine_info
from h3render.queue.enqueue import enqueue_sweep
from h3render.queue.errors import NotStoredError
from h3render.queue.redis_server import EmbeddedRedis
from h3render.settings import Settings
from redis_fixture import free_port
from test_queue_job import INFO

TINY = {"prompt": "a red ball", "model": "tiny-wan", "steps": 2}
pytestmark = pytest.mark.slow


def fill(directory: Path) -> Path:
    """Write one file into `directory` until its filesystem has no byte left."""
    path = directory / "filler"
    with open(path, "wb", buffering=0) as f:  # unbuffered: the last short write is ours to see
        for chunk in (1 << 20, 1 << 16, 1 << 12, 1 << 9, 1):
            block = b"\0" * chunk
            while True:
                try:
                    f.write(block)
                except OSError as e:
                    assert e.errno == errno.ENOSPC, e
                    break
    return path


def cli_env(home: Path, port: int) -> dict:
    """`h3render` on the embedded server of `home` (no URL: the CLI finds, or starts, it)."""
    e = {k: v for k, v in os.environ.items() if k != "H3RENDER_REDIS_URL"}
    e.update(PYTHONPATH=str(REPO) + os.pathsep + e.get("PYTHONPATH", ""), H3RENDER_HOME=str(home),
             H3RENDER_REDIS_PORT=str(port))
    return e


def present(r, job_ids) -> int:
    return sum(bool(r.exists(f"rq:job:{j}")) for j in job_ids)


# ---------------------------------------------------------------- the AOF on a full disk


def test_aof_on_a_full_tmpfs_refuses_clearly_and_keeps_every_acknowledged_job(tmpfs, fault_table):
    disk = tmpfs(48 * 1024**2)
    home, port = disk / "home", free_port()
    server = EmbeddedRedis(home / "redis", port)
    settings = Settings(home=home, redis_port=port, redis_url=None)
    env = cli_env(home, port)
    r = server.start()
    try:
        publish_engine_info(r, "tiny-wan", INFO)  # what a worker serving tiny-wan publishes
        acked: list[str] = []
        sweeps: list[str] = []
        for k in range(3):
            res = enqueue_sweep(r, TINY, {"seed": list(range(20 * k, 20 * k + 20))}, settings)
            assert res.stored == "fsynced"
            acked += res.job_ids
            sweeps.append(res.sweep_id)
        for prompt in ("first", "second"):
            out = run_cli(env, "enqueue", "--prompt", prompt, "--model", "tiny-wan", "--steps", "2")
            assert out.returncode == 0, out.stderr
            acked.append(out.stdout.split()[0])
        queued_before = Queue("h3render", connection=r, serializer=JSONSerializer).count
        assert queued_before == len(acked)

        filler = fill(disk)
        assert durability.disk_free(home) < durability.ROOM_RESERVE_BYTES

        # 1. The CLI sees the full disk before it writes: exit 1, the cause and the free bytes.
        refused = []
        for args in (["enqueue", "--prompt", "third", "--model", "tiny-wan", "--steps", "2"],
                     ["sweep", "--prompt", "more", "--model", "tiny-wan", "--steps", "2", "--seed", "1-50"]):
            out = run_cli(env, *args)
            refused.append(out.returncode == 1 and "not queued: Redis cannot persist" in out.stderr
                           and "disk of Redis's AOF is full" in out.stderr and "bytes free on the disk" in out.stderr
                           and not out.stdout.strip())
            assert refused[-1], (args, out.returncode, out.stdout, out.stderr)
        out = run_cli(env, "enqueue", "--prompt", "third", "--model", "tiny-wan", "--json")
        assert out.returncode == 1, out.stderr
        doc = json.loads(out.stdout)
        refused.append(isinstance(doc["free_bytes"], int) and doc["free_bytes"] < durability.ROOM_RESERVE_BYTES
                       and "full" in doc["cause"])
        assert refused[-1], doc
        assert server._ping() is not None, "a refused enqueue must not stop the server"
        assert Queue("h3render", connection=r, serializer=JSONSerializer).count == queued_before

        # 2. When the write itself fails in Redis (another writer took the last bytes: here the
        # room check is skipped), Redis exits rather than acknowledge, and enqueue says why.
        mp = pytest.MonkeyPatch()
        mp.setattr(durability, "check_room", lambda p, n: None)
        try:
            with pytest.raises(NotStoredError) as e:
                enqueue_sweep(r, TINY, {"seed": list(range(1000, 1100))}, settings)
        finally:
            mp.undo()
        inside = e.value
        assert "closed the connection before acknowledging" in inside.cause and "AOF" in inside.cause, inside
        assert inside.free_bytes is not None and inside.free_bytes < durability.ROOM_RESERVE_BYTES
        wait_for(lambda: server._ping() is None, 10, "redis-server to exit on the failed AOF write")

        # 3. The next command restarts the server on the full disk, and refuses the same way.
        out = run_cli(env, "enqueue", "--prompt", "fourth", "--model", "tiny-wan", "--steps", "2")
        restarted_refuses = out.returncode == 1 and "bytes free on the disk" in out.stderr
        assert restarted_refuses, (out.returncode, out.stderr)

        # 4. Room again, restart: every acknowledged job is there, nothing refused is.
        filler.unlink()
        server.stop()
        r = server.start()
        kept = present(r, acked)
        q = Queue("h3render", connection=r, serializer=JSONSerializer)
        ids = q.job_ids
        assert kept == len(acked), f"acknowledged {len(acked)}, present {kept}"
        assert sorted(ids) == sorted(acked) and len(ids) == len(set(ids))
        assert sorted(x.decode() for x in r.smembers(SWEEPS_KEY)) == sorted(sweeps)
    finally:
        server.stop(hard=True)
    row = fault_table("durability", "AOF on a full tmpfs: enqueue/sweep via the CLI", tried=len(refused),
                      held=sum(refused), lost=len(acked) - kept,
                      bound="exit 1 naming the cause and the free bytes; nothing queued; 0 acknowledged lost",
                      note=f"acknowledged {len(acked)}, present {kept} after a restart with room")
    assert row.ok
    row = fault_table("durability", "AOF write fails inside Redis (appendfsync always)", tried=2,
                      held=int(isinstance(inside, NotStoredError)) + int(restarted_refuses),
                      lost=len(acked) - kept,
                      bound="Redis exits instead of acknowledging; enqueue names the cause and free bytes",
                      note=f"cause: {inside.cause[:90]}")
    assert row.ok


# ---------------------------------------------------------------- Redis SIGKILL mid-sweep

CLIENT = r"""
import os, sys, time
import redis
from h3render.queue.enqueue import enqueue, enqueue_sweep
from h3render.queue.errors import QueueError
from h3render.settings import Settings

settings = Settings()
r = redis.Redis.from_url(settings.redis_url, socket_connect_timeout=1, socket_timeout=5)
i = 0
while not os.path.exists(sys.argv[1]):
    i += 1
    try:
        if i % 3:
            res = enqueue(r, {"prompt": f"job {i}", "model": "tiny-wan", "steps": 2}, settings)
        else:
            res = enqueue_sweep(r, {"prompt": f"sweep {i}", "model": "tiny-wan", "steps": 2},
                                {"seed": list(range(25))}, settings)
        print("ack", *res.job_ids, flush=True)
    except (QueueError, redis.RedisError, OSError) as e:
        print("err", type(e).__name__, str(e)[:300].replace("\n", " "), flush=True)
        time.sleep(0.02)
"""


def test_redis_sigkill_mid_enqueue_loses_no_acknowledged_job(tmp_path, fault_table):
    server = EmbeddedRedis(tmp_path / "redis", free_port())
    r = server.start()
    publish_engine_info(r, "tiny-wan", INFO)
    stop_file = tmp_path / "stop"
    env = {k: v for k, v in os.environ.items()}
    env.update(PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""), H3RENDER_HOME=str(tmp_path / "home"),
               H3RENDER_REDIS_URL=server.url())
    client = subprocess.Popen([sys.executable, "-c", CLIENT, str(stop_file)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(client.stdout.readline, "")), daemon=True)
    reader.start()
    rng = random.Random()
    kills = 0
    try:
        for _ in range(3):
            seen = sum(ln.startswith("ack") for ln in lines)
            wait_for(lambda: sum(ln.startswith("ack") for ln in lines) >= seen + 10, 60, "10 more acknowledged enqueues")
            time.sleep(rng.uniform(0.0, 0.4))
            server.stop(hard=True)  # SIGKILL, wherever the client is
            kills += 1
            time.sleep(0.3)
            server.start()
        seen = sum(ln.startswith("ack") for ln in lines)
        wait_for(lambda: sum(ln.startswith("ack") for ln in lines) >= seen + 5, 60, "enqueues after the last restart")
    finally:
        stop_file.touch()
        try:
            client.wait(timeout=30)
        except subprocess.TimeoutExpired:
            client.kill()
        reader.join(timeout=5)
    try:
        server.stop(hard=True)  # once more, with the client gone: the AOF is all there is
        r = server.start()
        acked = [j for ln in lines if ln.startswith("ack ") for j in ln.split()[1:]]
        errors = [ln for ln in lines if ln.startswith("err ")]
        kept = present(r, acked)
        queued = Queue("h3render", connection=r, serializer=JSONSerializer).job_ids
    finally:
        server.stop(hard=True)
    assert acked and errors, (len(acked), lines[-5:])
    row = fault_table("durability", "Redis SIGKILL mid-enqueue (singles and 25-job sweeps)", tried=kills,
                      held=kills if kept == len(acked) else 0, lost=len(acked) - kept,
                      bound="0 acknowledged jobs lost, none queued twice",
                      note=f"acknowledged {len(acked)}, present {kept}; {len(errors)} calls refused while down; "
                           f"{len(queued) - len(set(queued))} duplicated")
    assert kept == len(acked), f"acknowledged {len(acked)}, present {kept}"
    assert len(queued) == len(set(queued)), "a job id is on the queue twice"
    assert row.ok


# ---------------------------------------------------------------- other servers' promises


def test_everysec_server_on_a_full_disk_is_caught_after_the_write(tmpfs, fault_table):
    """A Redis with appendfsync everysec (an external server, say) replies before its AOF write
    fails; the check after the EXEC turns that reply into a refusal, and the next enqueue is
    refused before it writes."""
    disk = tmpfs(16 * 1024**2)
    server = EmbeddedRedis(disk / "redis", free_port())
    settings = Settings(home=disk / "home", redis_url=server.url())
    r = server.start()
    try:
        r.config_set("appendfsync", "everysec")
        publish_engine_info(r, "tiny-wan", INFO)
        acked = enqueue_sweep(r, TINY, {"seed": list(range(10))}, settings)
        assert acked.stored == "written" and any("power cut" in w for w in acked.warnings)
        filler = fill(disk)
        mp = pytest.MonkeyPatch()
        mp.setattr(durability, "check_room", lambda p, n: None)  # the disk of a remote server is not ours to see
        try:
            with pytest.raises(NotStoredError) as after:
                enqueue_sweep(r, TINY, {"seed": list(range(100, 150))}, settings)
        finally:
            mp.undo()
        with pytest.raises(NotStoredError) as before:
            enqueue_sweep(r, TINY, {"seed": list(range(200, 210))}, settings)
        held = ["could not write them to its AOF" in after.value.cause,
                # refused by Redis while planning (MISCONF), or by the check before the EXEC
                ("MISCONF" in before.value.cause or "last AOF write failed" in before.value.cause)
                and before.value.free_bytes is not None]
        filler.unlink()
        server.stop()
        r = server.start()
        kept = present(r, acked.job_ids)
    finally:
        server.stop(hard=True)
    assert held[0], after.value
    assert held[1], before.value
    row = fault_table("durability", "everysec Redis on a full disk (external-server path)", tried=len(held),
                      held=sum(held), lost=len(acked.job_ids) - kept,
                      bound="the write Redis replied to is refused once INFO shows the failed AOF write",
                      note=f"acknowledged {len(acked.job_ids)}, present {kept}")
    assert row.ok


def test_aof_off_is_reported_as_memory_only(tmp_path):
    server = EmbeddedRedis(tmp_path / "redis", free_port())
    r = server.start()
    try:
        r.config_set("appendonly", "no")
        publish_engine_info(r, "tiny-wan", INFO)
        res = enqueue_sweep(r, TINY, {"seed": [1, 2]}, Settings(home=tmp_path, redis_url=server.url()))
    finally:
        server.stop(hard=True)
    assert res.stored == "memory"
    assert any("memory only" in w for w in res.warnings), res.warnings


@pytest.mark.parametrize("version, aof, conf, stored, waitaof", [
    ("7.0.15", 1, {"appendfsync": "always"}, "fsynced", False),
    ("7.0.15", 1, {"appendfsync": "everysec"}, "written", False),
    ("6.2.14", 1, {"appendfsync": "no"}, "written", False),
    ("7.0.15", 1, {}, "unknown", False),  # CONFIG refused
    ("7.2.4", 1, {"appendfsync": "everysec"}, "fsynced", True),  # WAITAOF confirms each write
    ("7.4.0", 1, {}, "fsynced", True),
    ("7.4.0", 0, {"appendfsync": "always"}, "memory", False),  # WAITAOF needs the AOF on
])
def test_what_an_acknowledgement_means_per_server(version, aof, conf, stored, waitaof):
    p = durability.from_info({"redis_version": version, "aof_enabled": aof}, conf, local=False)
    assert (p.stored.value, p.waitaof) == (stored, waitaof)
    assert p.aof_dir is None  # a server on another machine: its paths are not ours


class _Redis72:
    """What Redis >= 7.2 answers to WAITAOF (no such server here: 7.0 is installed)."""

    def __init__(self, numlocal: int):
        self.numlocal = numlocal
        self.calls: list[tuple] = []

    def execute_command(self, *args):
        self.calls.append(args)
        return [self.numlocal, 0]

    def info(self, section):
        return {"aof_last_write_status": "ok", "aof_last_bgrewrite_status": "ok"}


def test_waitaof_confirms_the_fsync_from_redis_7_2():
    p = durability.from_info({"redis_version": "7.2.4", "aof_enabled": 1}, {"appendfsync": "everysec"}, False)
    fake = _Redis72(numlocal=1)
    assert durability.confirm(fake, p) == []
    assert fake.calls == [("WAITAOF", 1, 0, durability.WAITAOF_TIMEOUT_MS)]
    with pytest.raises(NotStoredError, match="did not fsync the write"):
        durability.confirm(_Redis72(numlocal=0), p)


def test_the_log_names_why_redis_exited(tmp_path):
    log = tmp_path / "redis.log"
    log.write_text(
        "1:M 01 Dec 2026 10:00:00.000 # Short write while writing to the AOF file: (nwritten=1, expected=9)\n"
        "1:M 01 Dec 2026 10:00:01.000 * Ready to accept connections\n"  # an earlier incident, then a restart
        "1:M 01 Dec 2026 11:00:00.000 * Background saving started\n"
        "1:M 01 Dec 2026 11:00:01.000 # Error writing to the AOF file: No space left on device\n"
        "1:M 01 Dec 2026 11:00:01.000 # Can't recover from AOF write error when the AOF fsync policy is "
        "'always'. Exiting...\n")
    cause = durability.log_cause(log)
    assert cause == ("'Error writing to the AOF file: No space left on device' / 'Can't recover from AOF write "
                     "error when the AOF fsync policy is 'always'. Exiting...'")
    assert durability.log_cause(tmp_path / "absent.log") == ""


def test_write_bytes_is_the_resp_size():
    assert durability.write_bytes([(("SET", "k", b"vv"), {})]) == 32 + len(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\nvv\r\n")
