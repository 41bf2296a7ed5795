"""Hostile job records: the worker fails the job naming the field, never stops, and goes on.

One real `h3render worker --burst` drains a queue in which every job but the last two
carries one corruption from CORRUPTIONS (a field of its rq:job:<id> hash rewritten
straight in Redis), plus queue entries no job can be made of (ODD_ENTRIES). Then:
the worker exited 0 and said nothing of an unhandled exception; every corrupted job
is failed, readable again by rq and by `status`, with its field and value in the
reason; every odd entry is gone from the queue and listed in REJECTED_KEY; the good
jobs enqueued after them finished, each once.

Also here: Redis refusing writes (OOM under maxmemory, a read-only replica) closes the
gate with that reason and the worker resumes once writes go through; a wrong Redis
password ends the worker at once, exit 1, one line, the password not in it; and the
password of a worker's Redis URL is on no process's command line while it renders.

About 40 s on 2 cores (one burst worker, a long-running one, two short private Redis
servers).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import zlib
from pathlib import Path

import pytest
import redis
from rq.job import JobStatus

from faults.harness import (SMALL, fetch, h3meta, pids_with_cmdline, run_cli, start_worker, stop,
                            wait_for)
from h3render.keys import HEALTH_HISTORY_KEY, REJECTED_KEY
from h3render.queue.enqueue import enqueue, enqueue_planned, plan
from h3render.queue.status import job_status

pytestmark = pytest.mark.slow

BOMB = zlib.compress(b"[" + b" " * (20 * 1024**2) + b"]", 9)  # 20 MiB from ~20 KiB
HUGE_META = b'{"x": "' + b"m" * (5 * 1024**2) + b'"}'

# (field, bad value); None deletes the field. Every field rq's Job.restore reads or the
# worker relies on, with bad dates, bad JSON, wrong types, NUL, non-UTF-8, huge values.
CORRUPTIONS: list[tuple[str, bytes | None]] = [
    ("created_at", b"garbage"), ("created_at", b"2024-13-45T99:99:99.000000Z"),
    ("created_at", b"\xff\xfe"), ("created_at", b"9" * 100_000), ("created_at", b"2024-01-01"),
    ("created_at", b"1700000000"),
    ("enqueued_at", b"garbage"), ("enqueued_at", b"\x00"),
    ("started_at", b"yesterday"), ("ended_at", b"not-a-date"), ("last_heartbeat", b"x" * 5000),
    ("status", b"garbage"), ("status", b"FINISHED"), ("status", b"\xff"), ("status", b""),
    ("status", b"finished"), ("status", b"started"), ("status", b"queued\x00"),
    ("timeout", b"garbage"), ("timeout", b"-5"), ("timeout", b"0"),
    ("timeout", b"99999999999999999999999999"), ("timeout", b"1.5"), ("timeout", b"\xff"),
    ("timeout", b"10y"),
    ("retries_left", b"garbage"), ("retries_left", b"-1"), ("retries_left", b"1e9"),
    ("retries_left", b"9" * 5000), ("retries_left", b"3.0"),
    ("number_of_retries", b"x"),
    ("retry_intervals", b"garbage"), ("retry_intervals", b"[]"), ("retry_intervals", b'"abc"'),
    ("retry_intervals", b"[1, -5]"), ("retry_intervals", b'{"a": 1}'),
    ("retry_intervals", b"[" * 100_000), ("retry_intervals", b"[1.5]"),
    ("meta", b"{not json"), ("meta", b"[1, 2]"), ("meta", b"5"), ("meta", b'{"h3r": 5}'),
    ("meta", b'{"h3r": [1]}'), ("meta", b"\xff\xfe"), ("meta", HUGE_META), ("meta", b'"string"'),
    ("data", b"garbage"), ("data", zlib.compress(b"not json")), ("data", zlib.compress(b'{"a": 1}')),
    ("data", zlib.compress(b"[1, 2, 3]")), ("data", BOMB), ("data", None),
    ("data", zlib.compress(b'[5, null, "args", {}]')),
    ("description", b"\xff\xfe bad utf-8"), ("description", b"d" * 100_000),
    ("result_ttl", b"garbage"), ("result_ttl", b"-7"),
    ("failure_ttl", b"garbage"), ("failure_ttl", b"0"),
    ("ttl", b"garbage"), ("ttl", b"-3"),
    ("origin", b"other-queue"), ("origin", b"\xff"), ("origin", b""),
    ("worker_name", b"\xff\xfe"), ("worker_name", b"w" * 1000),
    ("dependency_ids", b"garbage"), ("dependency_ids", b'{"a": 1}'),
    ("dependency_ids", b'["ok", "bad:id"]'), ("dependency_ids", b"[1, 2]"),
    ("dependency_id", b"\xff"), ("group_id", b"\xff"),
    ("enqueue_at_front", b"garbage"), ("enqueue_at_front", b""),
    ("allow_dependency_failures", b"maybe"), ("enqueue_at_front_on_retry", b"yes"),
    ("success_callback_timeout", b"soon"), ("failure_callback_name", b"\xff"),
    ("exc_info", b"\xff\xfe"), ("repeats_left", b"many"), ("repeat_intervals", b"[oops"),
    (b"\xff\xfe".decode("latin-1"), b"a field whose name is not UTF-8"),
]

# Queue entries no rq job can be made of: (label, raw id); "{good}" is a good job's id.
ODD_ENTRIES = [
    ("non-UTF-8 id", b"\xff\xfe\xfd"), ("huge id", b"j" * 10_000), ("empty id", b""),
    ("id with NUL", b"j-abc\x00def"), ("id with ':'", b"{good}:evil"),
    ("id with a space", b"j- spaced"), ("missing record", b"j-no-such-record"),
    ("record not a hash", b"j-not-a-hash"),
]


def _plant(r: redis.Redis, job_id: str, field: str, value: bytes | None) -> None:
    key = f"rq:job:{job_id}"
    if value is None:
        r.hdel(key, field)
    elif field == b"\xff\xfe".decode("latin-1"):
        r.hset(key, b"\xff\xfe", value)
    else:
        r.hset(key, field, value)


def _named(field: str) -> str:
    return "field (field name" if field == b"\xff\xfe".decode("latin-1") else f"field {field}="


def _good_record() -> dict:
    """A record as rq 2.12 writes it for a render job (bytes -> bytes)."""
    import zlib as z

    return {b"created_at": b"2026-01-31T12:00:00.000000Z", b"enqueued_at": b"2026-01-31T12:00:00.100000Z",
            b"started_at": b"", b"ended_at": b"", b"last_heartbeat": b"", b"status": b"queued",
            b"timeout": b"1841", b"result_ttl": b"2592000", b"failure_ttl": b"2592000",
            b"retries_left": b"3", b"retry_intervals": b"[30, 120, 600]", b"origin": b"h3render",
            b"description": b"tiny-wan/f32 64x64x17", b"worker_name": b"", b"group_id": b"",
            b"success_callback_name": b"", b"failure_callback_name": b"", b"stopped_callback_name": b"",
            b"meta": b'{"h3r": {"state": "queued"}}',
            b"data": z.compress(b'["h3render.worker.render.render_job", null, [], {"job": {}}]')}


@pytest.mark.parametrize("field,value", CORRUPTIONS, ids=[f"{f[:12]}-{i}" for i, (f, _) in enumerate(CORRUPTIONS)])
def test_each_corruption_is_named_and_its_repair_loads(field, value):
    """Pure: the check names the field; after the repairs rq's own loader reads the record."""
    from rq.job import Job

    from h3render.worker import records

    assert records.check_record(_good_record(), "h3render", ("queued",)) == []
    raw = _good_record()
    key = b"\xff\xfe" if field == b"\xff\xfe".decode("latin-1") else field.encode()
    if value is None:
        raw.pop(key)
    else:
        raw[key] = value
    problems = records.check_record(raw, "h3render", ("queued",))
    assert problems and any(_named(field) in p.message for p in problems), problems
    assert all(len(p.message) < 600 for p in problems)
    for p in problems:
        if p.repair is None:
            raw.pop(p.hash_field, None)
        else:
            raw[p.hash_field] = p.repair
    assert records.check_record(raw, "h3render", None) == []
    Job(id="j-x", connection=redis.Redis(port=1)).restore(raw)  # rq loads it again (no I/O)


def test_corrupt_records_fail_their_job_and_the_worker_goes_on(worker_env, redis_conn, h3_settings,
                                                               fault_table):
    r = redis_conn
    assert len(CORRUPTIONS) >= 60
    planned = plan(r, [dict(SMALL, seed=i) for i in range(len(CORRUPTIONS))], h3_settings)
    bad_ids = enqueue_planned(r, planned, h3_settings).job_ids
    for jid, (field, value) in zip(bad_ids, CORRUPTIONS):
        _plant(r, jid, field, value)
    good = [enqueue(r, dict(SMALL, seed=1000 + i, steps=2), h3_settings).job_ids[0] for i in range(2)]
    queue_key = f"rq:queue:{h3_settings.queue_name}"
    r.lrem(queue_key, 0, good[1])  # the second good job runs after the odd entries
    r.set("rq:job:j-not-a-hash", "a string, not a hash")
    for _, raw in ODD_ENTRIES:
        r.rpush(queue_key, raw.replace(b"{good}", good[0].encode()))
    r.rpush(queue_key, good[1])

    t0 = time.time()
    p = run_cli(worker_env, "worker", "--burst", timeout=110)
    took = time.time() - t0
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert "unhandled exception" not in out and "Traceback" not in out, out[-3000:]

    held, misses = 0, []
    for jid, (field, value) in zip(bad_ids, CORRUPTIONS):
        try:
            job = fetch(r, jid)  # readable by rq again
            m = job.meta.get("h3r") or {}
            row = job_status(r, jid)  # and by the status views
            ok = (job.get_status() == JobStatus.FAILED and m.get("state") == "failed"
                  and _named(field) in (m.get("error") or "") and getattr(row.state, "value", row.state) == "failed"
                  and _named(field) in (row.error or "") and m.get("retryable") is False)
        except Exception as e:  # noqa: BLE001 - counted, and shown below
            ok, m = False, {"exception": repr(e)}
        held += ok
        if not ok:
            misses.append((field, value[:40] if value else value, m.get("error") or m))
    # every reason quotes the value cut short: no reason carries a huge value
    longest = max(len(h3meta(r, j).get("error") or "") for j in bad_ids)

    rejected = [json.loads(x) for x in r.lrange(REJECTED_KEY, 0, -1)]
    queue_left = r.lrange(queue_key, 0, -1) + r.lrange(queue_key + ":intermediate", 0, -1)
    odd_held = sum(1 for _, raw in ODD_ENTRIES
                   if raw.replace(b"{good}", good[0].encode()) not in queue_left)
    good_done = [fetch(r, j).get_status() == JobStatus.FINISHED and len(
        [x for x in fetch(r, j).results() if x.type.name == "SUCCESSFUL"]) == 1 for j in good]

    row = fault_table("records", "corrupt job record fields", tried=len(CORRUPTIONS), held=held,
                      lost=good_done.count(False),
                      bound="0 worker exits; each job failed naming its field",
                      note=f"one burst worker, {took:.0f} s; longest reason {longest} chars")
    odd = fault_table("records", "odd ids and missing records in the queue", tried=len(ODD_ENTRIES),
                      held=min(odd_held, len(rejected)), lost=good_done.count(False),
                      bound="0 worker exits; each entry removed and listed with its reason")
    assert not misses, misses
    assert row.ok and odd.ok, (row, odd, rejected)
    assert longest < 2000
    assert len(rejected) >= len(ODD_ENTRIES)
    assert all(d["reason"] for d in rejected)
    assert any("job id" in d["reason"] and "':'" in d["reason"] for d in rejected)
    assert any("is missing" in d["reason"] for d in rejected)
    assert any("not a hash" in d["reason"] for d in rejected)


MIDRUN = [("status", b"garbage"), ("meta", b"{not json"), ("created_at", b"garbage"),
          ("retries_left", b"many"), (b"\xff\xfe".decode("latin-1"), b"x")]


def test_record_corrupted_while_its_job_runs(worker_env, redis_conn, h3_settings, fault_table):
    """The render process and the worker both read and write the record while the job
    runs; a corruption then ends that job (finished, or failed naming the field), never
    the worker."""
    r = redis_conn
    ids = [enqueue(r, dict(SMALL, steps=150, seed=i), h3_settings).job_ids[0] for i in range(len(MIDRUN))]
    good = enqueue(r, dict(SMALL, steps=2, seed=99), h3_settings).job_ids[0]
    p = start_worker(worker_env, "--burst")
    try:
        for jid, (field, value) in zip(ids, MIDRUN):
            wait_for(lambda: (h3meta(r, jid).get("step") or 0) >= 5, 60, f"{jid} denoising")
            _plant(r, jid, field, value)
        p.wait(timeout=120)
    finally:
        out = stop(p)
    held, ends = 0, []
    for jid, (field, _) in zip(ids, MIDRUN):
        job, row = fetch(r, jid), job_status(r, jid)
        err = (job.meta.get("h3r") or {}).get("error") or ""
        st = job.get_status()
        ok = st == JobStatus.FINISHED or (st == JobStatus.FAILED and _named(field) in err)
        held += ok and getattr(row.state, "value", row.state) in ("finished", "failed")
        ends.append(f"{field if field.isascii() else 'a non-UTF-8 field name'}: {st.value}")
    good_done = fetch(r, good).get_status() == JobStatus.FINISHED
    row = fault_table("records", "record corrupted while its job runs", tried=len(MIDRUN), held=held,
                      lost=int(not good_done), bound="0 worker exits; the job ends, readable",
                      note=", ".join(ends))
    assert p.returncode == 0 and "unhandled exception" not in out, out[-3000:]
    assert row.ok, (row, out[-3000:])


# ---------------------------------------------------------------- Redis refusing writes


def _health_reasons(r: redis.Redis) -> list[str]:
    import socket

    out = []
    for raw in r.lrange(HEALTH_HISTORY_KEY.format(host=socket.gethostname()), 0, -1):
        doc = json.loads(raw)
        out += [x["code"] for x in doc.get("reasons") or []]
    return out


def test_refused_writes_close_the_gate_and_the_worker_resumes(worker_env, redis_conn, redis_server,
                                                              h3_settings, fault_table):
    r = redis_conn
    p = start_worker(worker_env)
    cases, held, notes = 0, 0, []
    try:
        first = enqueue(r, dict(SMALL, steps=2), h3_settings).job_ids[0]
        wait_for(lambda: fetch(r, first).get_status() == JobStatus.FINISHED, 60, "the first job")
        for name, refuse, lift in (
            ("OOM under maxmemory", lambda: (r.config_set("maxmemory-policy", "noeviction"),
                                             r.config_set("maxmemory", "1")),
             lambda: r.config_set("maxmemory", "0")),
            ("read-only replica", lambda: r.replicaof("127.0.0.1", _dead_port()),
             lambda: r.replicaof("NO", "ONE")),
        ):
            cases += 1
            before = len(_health_reasons(r))
            refuse()
            try:
                time.sleep(4)  # a few gate polls while Redis refuses every write
                alive_during = p.poll() is None
            finally:
                lift()
            t_lift = time.time()
            jid = enqueue(r, dict(SMALL, steps=2, seed=cases), h3_settings).job_ids[0]
            wait_for(lambda: fetch(r, jid).get_status() == JobStatus.FINISHED, 60,
                     f"a job after {name} was lifted")
            resumed = time.time() - t_lift
            recorded = "redis_writes" in _health_reasons(r)[before:]
            ok = alive_during and p.poll() is None and recorded
            held += ok
            notes.append(f"{name}: job done {resumed:.1f} s after lifting")
    finally:
        r.config_set("maxmemory", "0")
        try:
            r.replicaof("NO", "ONE")
        except redis.RedisError:
            pass
        out = stop(p)
    assert marker_logged(out, ("Redis refuses writes", "maxmemory", "read only replica")), out[-3000:]
    row = fault_table("records", "Redis refuses writes (OOM, read-only replica)", tried=cases,
                      held=held, lost=0, bound="gate closed with the reason; resumes when lifted",
                      note="; ".join(notes))
    assert row.ok, (row, out[-3000:])


def _dead_port() -> int:
    from redis_fixture import free_port

    return free_port()


def marker_logged(out: str, markers) -> bool:
    return all(m in out for m in markers)


# ---------------------------------------------------------------- a password-protected Redis


@pytest.fixture
def password_redis(tmp_path):
    """A private redis-server with requirepass: (url with the password, password)."""
    from redis_fixture import free_port

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    port, pw = free_port(), "pw-" + __import__("uuid").uuid4().hex
    d = tmp_path / "pwredis"
    d.mkdir()
    conf = d / "redis.conf"  # the password in a file: a command line would show it to everyone
    conf.write_text(f'port {port}\nbind 127.0.0.1\nrequirepass {pw}\nsave ""\nappendonly no\n'
                    f'dir "{d}"\n')
    proc = subprocess.Popen(["redis-server", str(conf)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port, password=pw)
    wait_for(lambda: _pings(client), 10, "the password Redis")
    yield f"redis://:{pw}@127.0.0.1:{port}/0", pw, client
    proc.kill()
    proc.wait()


def _pings(c: redis.Redis) -> bool:
    try:
        return c.ping()
    except redis.RedisError:
        return False


def test_wrong_password_ends_the_worker_with_one_line(worker_env, password_redis, fault_table):
    url, pw, _ = password_redis
    bad = url.replace(pw, "not-the-" + pw)
    p = run_cli({**worker_env, "H3RENDER_REDIS_URL": bad}, "worker", "--burst", timeout=60)
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    ok = (p.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: ")
          and "credentials" in lines[0] and pw not in p.stderr + p.stdout)
    row = fault_table("records", "wrong Redis password", tried=1, held=int(ok), lost=0,
                      bound="exit 1, one line, no password in it", note=lines[-1][:80] if lines else "")
    assert row.ok, (p.returncode, p.stdout, p.stderr)


def test_no_secret_on_any_command_line(worker_env, password_redis, h3_settings, fault_table):
    url, pw, client = password_redis
    env = {**worker_env, "H3RENDER_REDIS_URL": url}
    settings = h3_settings.model_copy(update={"redis_url": url})
    jid = enqueue(client, dict(SMALL, steps=400), settings).job_ids[0]
    p = start_worker(env, "--burst")
    try:
        wait_for(lambda: (fetch(client, jid).meta.get("h3r") or {}).get("step", 0) >= 2, 60,
                 "the render process denoising")
        horse = (fetch(client, jid).meta.get("h3r") or {}).get("pid")
        scans, found = 0, []
        for _ in range(5):  # the worker, its scheduler, the render process, while it renders
            found += pids_with_cmdline(pw)
            scans += 1
            time.sleep(0.2)
        alive = bool(horse) and Path(f"/proc/{horse}").exists()
    finally:
        from faults.harness import kill_group

        kill_group(p.pid)
        if horse:
            kill_group(horse)
        out = stop(p)
    assert pw not in out  # nor in its log
    row = fault_table("secrets", "no secret in /proc/*/cmdline", tried=scans,
                      held=0 if found else scans, lost=0,
                      bound="the Redis password on no process's command line",
                      note="worker, scheduler and render process scanned while rendering")
    assert alive and not found and row.ok, (found, alive)
