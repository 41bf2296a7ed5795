"""The worker end to end: real redis-server (tests/redis_fixture.py), real worker
processes (`h3render worker`), rq's SpawnWorker horses, the real engine and the
built-in tiny model (64x64, 17 frames; a step takes a few ms).

Slow-ish: the whole file takes about 1-2 minutes on 2 cores (each job spawns a
fresh Python process).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rq import Queue
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from faults.harness import fetch, start_worker, stop, wait_for, worker_environment, write_readings  # noqa: F401
from h3render.queue import control
from h3render.queue.enqueue import enqueue, enqueue_sweep
from h3render.queue.status import job_status
from h3render.worker.health import MemoryReading, PowerReading, Readings

CLI = "import importlib.util, sys; from h3render.cli import main; sys.argv[0] = 'h3render'; main()"
SMALL = {"prompt": "a red ball", "model": "tiny-wan", "width": 64, "height": 64, "frames": 17, "steps": 3}

pytestmark = pytest.mark.slow


@pytest.fixture
def env(h3_settings, tmp_path):
    """Environment of worker processes (faults.harness.worker_environment)."""
    return worker_environment(h3_settings, tmp_path / "readings.json")


def run_worker(env: dict, *args: str, timeout: float = 120) -> str:
    p = start_worker(env, *args)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        raise AssertionError(f"worker did not finish in {timeout} s; output:\n{out}") from None
    assert p.returncode == 0, out
    return out


def h3(r, job_id) -> dict:
    return fetch(r, job_id).meta.get("h3r") or {}


# ---------------------------------------------------------------- the sweep


def test_sweep_of_8_runs_end_to_end(env, redis_conn, h3_settings):
    res = enqueue_sweep(redis_conn, {**SMALL, "prompt": "a red ball"},
                        {"seed": [1, 2, 3, 4], "steps": [2, 3]}, h3_settings)
    assert len(res.job_ids) == 8
    run_worker(env, "--burst")
    for jid in res.job_ids:
        row = job_status(redis_conn, jid)
        assert row.state == "finished", (jid, row)
        out = Path(h3(redis_conn, jid)["output_dir"])
        assert out == h3_settings.renders_dir() / res.sweep_id / jid
        assert {p.name for p in out.iterdir()} == {"video.mp4", "poster.png", "meta.json"}
        meta = json.loads((out / "meta.json").read_text())
        assert meta["parameters"]["seed"] in (1, 2, 3, 4) and meta["parameters"]["steps"] in (2, 3)
        assert meta["engine"]["quant_levels"] and meta["peak_rss"] > 0
        assert {"admission", "denoise", "decode", "write", "total"} <= set(meta["timings_s"])
        assert meta["health"] and meta["estimate"]["bytes"] > 0
    from h3render.queue.engine_info import published_info

    assert published_info(redis_conn, "tiny-wan")["text_len"] > 0  # the worker published limits
    # status --json through the CLI agrees
    e = {k: v for k, v in env.items() if not k.startswith("_")}
    out = subprocess.run([sys.executable, "-c", CLI, "status", res.sweep_id, "--json"], env=e,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count('"finished"') >= 8


# ---------------------------------------------------------------- refusals


def test_payload_naming_another_function_is_refused(env, redis_conn, h3_settings, tmp_path):
    marker = tmp_path / "pwned"
    q = Queue(h3_settings.queue_name, connection=redis_conn, serializer=JSONSerializer)
    job = q.enqueue("os.system", f"touch {marker}", job_id="j-evil")
    run_worker(env, "--burst")
    job = fetch(redis_conn, job.id)
    assert job.get_status() == JobStatus.FAILED
    assert "refused" in job.meta["h3r"]["error"] and "'os.system'" in job.meta["h3r"]["error"]
    assert not marker.exists()


def test_too_big_job_is_never_started(env, redis_conn, h3_settings):
    # 100 MiB available (no total: the gate's fraction check cannot fire); the tiny
    # model needs ~0.3 GiB with the fixed process overhead.
    write_readings(Path(env["_readings"]), Readings(
        platform="test", memory=MemoryReading(available_bytes=100 * 1024**2)))
    env = {**env, "H3RENDER_ADMISSION_WAIT_LIMIT_S": "1", "H3RENDER_ADMISSION_POLL_S": "0.3",
           "H3RENDER_RETRY_MAX": "0"}
    no_retry = h3_settings.model_copy(update={"retry_max": 0})
    jid = enqueue(redis_conn, SMALL, no_retry).job_ids[0]
    run_worker(env, "--burst")
    m = h3(redis_conn, jid)
    assert fetch(redis_conn, jid).get_status() == JobStatus.FAILED
    assert m["error"].startswith("not enough memory: needs 0.")
    assert "GiB, 0.1 GiB available (headroom 20%)" in m["error"]
    assert m["retryable"] is True
    assert "engine" not in m and "output_dir" not in m  # the engine never opened


# ---------------------------------------------------------------- gate


def test_gate_holds_on_battery_then_resumes(env, redis_conn, h3_settings):
    readings = Path(env["_readings"])
    write_readings(readings, Readings(platform="test", power=PowerReading(on_battery=True,
                                                                          battery_percent=95.0)))
    jid = enqueue(redis_conn, SMALL, h3_settings).job_ids[0]
    p = start_worker(env, "--burst")
    try:
        def held():
            raw = redis_conn.get(f"h3render:health:{os.uname().nodename}")
            return raw and not json.loads(raw)["open"] and json.loads(raw)
        doc = wait_for(held, 60, "a closed-gate health record")
        assert doc["reasons"][0]["code"] == "battery"
        states = wait_for(lambda: [w.get_state() for w in
                                   __import__("rq").Worker.all(connection=redis_conn)
                                   if "gate closed" in w.get_state()], 20, "worker state")
        assert "on battery power (95%)" in states[0]
        time.sleep(2)
        assert fetch(redis_conn, jid).get_status() == JobStatus.QUEUED  # never dequeued
        write_readings(readings, Readings(platform="test"))  # plugged in again
        p.wait(timeout=90)
        assert p.returncode == 0
    finally:
        stop(p)
    assert fetch(redis_conn, jid).get_status() == JobStatus.FINISHED
    hist = redis_conn.lrange(f"h3render:health:{os.uname().nodename}:history", 0, -1)
    opens = [json.loads(x)["open"] for x in hist]
    assert False in opens and opens[-1] is True


def test_second_worker_on_the_host_is_refused(env, redis_conn):
    first = start_worker(env)
    try:
        wait_for(lambda: redis_conn.exists(f"h3render:worker-lock:{os.uname().nodename}"), 30,
                 "the first worker's lock")
        e = {k: v for k, v in env.items() if not k.startswith("_")}
        second = subprocess.run([sys.executable, "-c", CLI, "worker", "--burst"], env=e,
                                capture_output=True, text=True, timeout=60)
        assert second.returncode == 2
        assert "one worker per machine" in second.stderr and "--force" in second.stderr
        forced = subprocess.run([sys.executable, "-c", CLI, "worker", "--burst", "--force"],
                                env=e, capture_output=True, text=True, timeout=60)
        assert forced.returncode == 0, forced.stderr
    finally:
        stop(first)


# ---------------------------------------------------------------- failures


def test_engine_crash_is_recorded_retried_and_worker_survives(env, redis_conn, h3_settings):
    env = {**env, "H3RENDER_RETRY_MAX": "1"}
    settings = h3_settings.model_copy(update={"retry_max": 1, "retry_intervals_s": [1]})
    bad = enqueue(redis_conn, {**SMALL, "engine_options": {"test_crash_at_step": 1}},
                  settings).job_ids[0]
    good = enqueue(redis_conn, SMALL, settings).job_ids[0]
    # two attempts of the crashing job plus the good one
    run_worker(env, "--max-jobs", "3", timeout=180)
    job = fetch(redis_conn, bad)
    m = job.meta["h3r"]
    assert job.get_status() == JobStatus.FAILED
    assert m["crashes"] == 2  # first attempt and its retry
    assert "signal 11 (SIGSEGV)" in m["error"] and "denoise step 1/3" in m["error"]
    assert m["engine_error"]
    assert fetch(redis_conn, good).get_status() == JobStatus.FINISHED


def test_cancel_running_job_stops_within_a_step(env, redis_conn, h3_settings):
    jid = enqueue(redis_conn, {**SMALL, "steps": 1000}, h3_settings).job_ids[0]
    p = start_worker(env, "--burst")
    try:
        wait_for(lambda: (h3(redis_conn, jid).get("step") or 0) >= 5, 60, "denoising")
        control.cancel(redis_conn, jid)
        seen = h3(redis_conn, jid)["step"]
        p.wait(timeout=60)
    finally:
        stop(p)
    job = fetch(redis_conn, jid)
    m = job.meta["h3r"]
    assert job.get_status() == JobStatus.CANCELED and m["state"] == "canceled"
    # the callback reads the cancel key at every step: at most the step in flight
    # when we looked, plus the one the key was set during, completes
    assert m["step"] <= seen + 2, (m["step"], seen)
    assert not m.get("output_dir")  # a canceled job has no folder
    assert not list(h3_settings.renders_dir().glob(f"*/{jid}")), "a canceled job left a folder"


def test_kill_9_mid_job_then_a_new_worker_reruns_it(env, redis_conn, h3_settings):
    jid = enqueue(redis_conn, {**SMALL, "steps": 600}, h3_settings).job_ids[0]
    p = start_worker(env)
    wait_for(lambda: (h3(redis_conn, jid).get("step") or 0) >= 3, 60, "denoising")
    horse = h3(redis_conn, jid)["pid"]
    os.killpg(p.pid, signal.SIGKILL)  # the worker (with its scheduler) dies ...
    os.kill(horse, signal.SIGKILL)  # ... and so does its render process (own group)
    p.wait(timeout=10)
    assert fetch(redis_conn, jid).get_status() == JobStatus.STARTED
    out = run_worker(env, "--max-jobs", "1", timeout=180)
    assert "taking over its lock" in out
    job = fetch(redis_conn, jid)
    assert job.get_status() == JobStatus.FINISHED, job.meta
    assert job.meta["h3r"]["attempt"] == 2


def test_redis_restart_mid_sweep_keeps_queued_jobs(env, redis_conn, redis_server, h3_settings):
    res = enqueue_sweep(redis_conn, SMALL, {"seed": [1, 2, 3, 4], "steps": [2, 3]}, h3_settings)
    run_worker(env, "--burst", "--max-jobs", "2")
    before = {j: fetch(redis_conn, j).get_status() for j in res.job_ids}
    assert sum(s == JobStatus.FINISHED for s in before.values()) == 2
    redis_server.stop()
    r = redis_server.start()
    after = {j: Job.fetch(j, connection=r, serializer=JSONSerializer).get_status()
             for j in res.job_ids}
    assert after == before
    q = Queue(h3_settings.queue_name, connection=r, serializer=JSONSerializer)
    assert sorted(q.job_ids) == sorted(j for j, s in before.items() if s == JobStatus.QUEUED)
    run_worker(env, "--burst")
    assert all(Job.fetch(j, connection=r, serializer=JSONSerializer).get_status()
               == JobStatus.FINISHED for j in res.job_ids)
