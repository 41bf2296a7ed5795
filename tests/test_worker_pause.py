"""A running job pauses between denoising steps while the machine is hot, and resumes.

Real redis-server (tests/redis_fixture.py), a real `h3render worker --burst`
process and its spawned render process, the built-in tiny model. The readings
come from the worker's test-only readings file (H3RENDER_ENABLE_TEST_TRIGGERS=1),
built as tests/test_gate.py builds them from the real recorded samples in
tests/fixtures/probe-samples/: "cool" is the normal Linux box (idle PSI, zones at
their recorded temperatures, plugged in); "hot" is the same with
linux-thermal-zone-grep-01's x86_pkg_temp zone raised from its recorded 25 °C to
104 °C against its real 107 °C trip (no recorded sample is hot).

Takes about 15 s on 2 shared cores.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from rq.job import JobStatus

from h3render.queue.enqueue import enqueue
from h3render.worker import probes as P
from test_probes import SAMPLES, body
from test_worker_integration import env, fetch, h3, start_worker, stop, wait_for, write_readings  # noqa: F401

# The render reads the sensors at most once per render.THERMAL_CHECK_MIN_S (2 s),
# so heat is noticed within ~2 s plus one step. A step of the tiny model at
# 128x128x17 (320 tokens) takes ~7 ms here, meta saved each step included, so
# 1000 steps (the model's limit; ~7 s) leave room to catch the job mid-render.
STEPS = 1000
JOB = {"prompt": "a red ball", "model": "tiny-wan", "width": 128, "height": 128, "frames": 17, "steps": STEPS}
HELD_S = 2.0  # how long we keep it hot after the pause is seen, checking no step advances


@pytest.fixture(autouse=True)
def _need_samples():
    if not SAMPLES.is_dir():
        pytest.fail(f"probe samples folder {SAMPLES} is absent: the repo ships them in "
                    "tests/fixtures/probe-samples (H3RENDER_PROBE_SAMPLES overrides it)")


def readings(hot: bool):
    from test_gate import linux

    zones = body("linux-thermal-zone-grep-01.txt")
    if hot:
        zones = zones.replace("zone0/temp:25000", "zone0/temp:104000")
        assert "zone0/temp:104000" in zones  # the recorded line we substitute is still there
    zones += "/sys/class/thermal/thermal_zone0/type:x86_pkg_temp\n"
    return linux(zones=P.parse_thermal_grep(zones))


def test_hot_machine_pauses_running_job_between_steps(env, redis_conn, h3_settings):
    path = Path(env["_readings"])
    write_readings(path, readings(hot=False))
    env = {**env, "H3RENDER_THERMAL_PAUSE_POLL_S": "0.2"}
    jid = enqueue(redis_conn, JOB, h3_settings).job_ids[0]
    p = start_worker(env, "--burst")
    try:
        wait_for(lambda: (h3(redis_conn, jid).get("step") or 0) >= 3, 60, "denoising")
        write_readings(path, readings(hot=True))
        m = wait_for(lambda: (lambda m: m.get("state") == "paused_thermal" and m)(h3(redis_conn, jid)),
                     15, "meta state paused_thermal")
        paused_at = m["step"]
        assert 0 < paused_at < STEPS, m
        assert len(m["pauses"]) == 1 and "end" not in m["pauses"][0], m["pauses"]
        assert "x86_pkg_temp at 104.0 °C" in m["reason"], m["reason"]
        assert fetch(redis_conn, jid).get_status() == JobStatus.STARTED
        time.sleep(HELD_S)
        m = h3(redis_conn, jid)
        assert m["state"] == "paused_thermal" and m["step"] == paused_at, (m["state"], m["step"])

        write_readings(path, readings(hot=False))
        wait_for(lambda: (h3(redis_conn, jid).get("step") or 0) > paused_at, 15, "the job to resume")
        assert h3(redis_conn, jid)["state"] != "paused_thermal"
        p.wait(timeout=60)
        assert p.returncode == 0
    finally:
        out = stop(p)
    job = fetch(redis_conn, jid)
    m = job.meta["h3r"]
    assert job.get_status() == JobStatus.FINISHED, (job.get_status(), m.get("error"), out)
    assert m["state"] == "finished" and m["step"] == STEPS and m["reason"] is None
    [pause] = m["pauses"]
    assert pause["step"] == paused_at and "x86_pkg_temp at 104.0 °C" in pause["reason"]
    assert pause["end"] > pause["start"] and pause["seconds"] >= HELD_S, pause
    doc = json.loads((Path(m["output_dir"]) / "meta.json").read_text())
    assert doc["pauses"] == m["pauses"]
    # the pause is not step time: no recorded step is anywhere near as long
    assert max(doc["step_times_s"]) < pause["seconds"] / 2, max(doc["step_times_s"])
    assert len(doc["step_times_s"]) == STEPS  # from step 0 to each of 1..STEPS
    # health samples around the pause are in meta.json too (hot, then cool)
    assert len(doc["health"]) >= 3


# ---------------------------------------------------------------- the job timeout during a pause


def test_pause_holds_the_job_timeout_alarm(tmp_path, monkeypatch):
    """rq arms SIGALRM in the render process for the job's timeout. A pause longer
    than what is left must not time the job out; the alarm is re-armed after it."""
    import os
    import signal
    import threading

    from h3render.settings import Settings
    from h3render.worker import render

    path = tmp_path / "readings.json"
    write_readings(path, readings(hot=True))
    monkeypatch.setenv("H3RENDER_ENABLE_TEST_TRIGGERS", "1")
    monkeypatch.setenv("H3RENDER_TEST_READINGS", str(path))
    settings = Settings(redis_url="redis://unused", thermal_pause_poll_s=0.1)

    class Timeout(Exception):
        pass

    def on_alarm(signum, frame):
        raise Timeout("the job timed out during the pause")

    cool = threading.Timer(2.5, lambda: write_readings(path, readings(hot=False)))
    old = signal.signal(signal.SIGALRM, on_alarm)
    state = {"last_thermal": 0.0, "prev_readings": None, "step_t": None, "canceled": False}
    pauses: list[dict] = []
    try:
        signal.alarm(1)  # 1 s of job time left; the pause lasts ~2.5 s
        cool.start()
        render._thermal_pause(settings, render._Meta(None), state, pauses, [], None, os.getppid())
        left = signal.alarm(0)
    finally:
        cool.cancel()
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    [pause] = pauses
    assert pause["seconds"] >= 2.4 and not state["canceled"], pause
    assert left == 1  # re-armed with what was left when the pause began


def test_worker_moves_the_timeout_on_by_recorded_pauses(redis_conn, h3_settings):
    from rq.serializers import JSONSerializer

    from h3render.worker.worker import AllowlistJob, extend_timeout_by_pauses

    job = AllowlistJob.create("h3render.worker.render.render_job", kwargs={"job": {}},
                              connection=redis_conn, serializer=JSONSerializer, timeout=600)
    job.save()
    base: dict[str, int] = {}
    extend_timeout_by_pauses(job, base)
    assert job.timeout == 600
    now = time.time()
    job.meta["h3r"] = {"pauses": [{"start": now - 100, "end": now - 40}, {"start": now - 10}]}
    job.save_meta()
    extend_timeout_by_pauses(job, base)
    assert 670 <= job.timeout <= 672, job.timeout  # 60 s closed + ~10 s open pause
    extend_timeout_by_pauses(job, base)  # idempotent: from the starting timeout, not cumulative
    assert 670 <= job.timeout <= 672, job.timeout
