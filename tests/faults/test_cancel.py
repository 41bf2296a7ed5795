"""Cancel works in every state a job can be in, and a canceled job never comes back.

Real redis-server, real `h3render worker` processes and their render processes, the
built-in tiny model. The gate, memory and heat figures come from the worker's test
readings file (H3RENDER_TEST_READINGS), which the test rewrites while the worker runs.

    before a worker holds it   queued, deferred (rq dependencies), waiting behind a
                               closed gate, scheduled for a retry: canceled in rq at once
    held by a render           waiting for memory, paused hot (admission and pause polls
                               of 30 s, so only the render's own cancel poll makes the
                               bound), denoising (within one step)
    never back                 through rq's Retry scheduler (past the interval), a worker
                               killed or shut down right after the cancel, a requeue of
                               failed jobs (control.retry failed_only, `retry --failed`)

Each case measures the seconds from `cancel` to rq status canceled with meta state
canceled. About 45 s on 2 shared cores.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from rq import Queue, Worker
from rq.job import JobStatus
from rq.registry import CanceledJobRegistry, FailedJobRegistry, ScheduledJobRegistry
from rq.serializers import JSONSerializer

from faults.harness import SMALL, fetch, h3meta, run_cli, start_worker, stop, wait_for, write_readings
from h3render.keys import RENDER_FUNC
from h3render.queue import control
from h3render.queue.enqueue import enqueue, plan
from h3render.worker.health import MemoryReading, PowerReading, Readings, ThermalReading, ZoneReading

GiB = 1024**3
WAITING_BOUND_S = 2.0  # the promise in every waiting state
SLOW_POLL = "30"  # admission and heat polls far above the bound
LONG = {**SMALL, "width": 128, "height": 128, "steps": 1000}  # ~7 ms a step: time to catch it mid-render
HOT = ThermalReading(zones=[ZoneReading(name="x86_pkg_temp", temp_c=104.0, limit_c=107.0)])

pytestmark = pytest.mark.slow


def machine(total=8 * GiB, available=6 * GiB, **kw) -> Readings:
    return Readings(platform="test", memory=MemoryReading(total_bytes=total, available_bytes=available), **kw)


def ended_canceled(r, jid: str) -> bool:
    return fetch(r, jid).get_status() == JobStatus.CANCELED and h3meta(r, jid).get("state") == "canceled"


def cancel_and_time(r, jid: str, timeout: float = 30) -> float:
    """Seconds from control.cancel to rq status canceled with meta state canceled."""
    t0 = time.time()
    assert control.cancel(r, jid).done == [jid]
    wait_for(lambda: ended_canceled(r, jid), timeout, f"job {jid} to end canceled")
    return time.time() - t0


def wait_state(r, jid: str, state: str, timeout: float = 60) -> dict:
    return wait_for(lambda: (lambda m: m.get("state") == state and m)(h3meta(r, jid)), timeout,
                    f"meta state {state}")


def filed_canceled(r, q: str, jid: str) -> bool:
    """In rq's canceled registry, and in no registry a requeue of failed jobs reads."""
    return (jid in CanceledJobRegistry(q, connection=r).get_job_ids()
            and jid not in FailedJobRegistry(q, connection=r).get_job_ids()
            and jid not in ScheduledJobRegistry(q, connection=r).get_job_ids())


def record(fault_table, case: str, seconds: float, bound_s: float | None, held: bool, bound: str, note: str = ""):
    ok = held and (bound_s is None or seconds <= bound_s)
    row = fault_table("cancel", case, tried=1, held=int(ok), lost=0, bound=bound,
                      note=f"{seconds:.2f} s from cancel to canceled" + (f"; {note}" if note else ""))
    return row


# ---------------------------------------------------------------- before a worker holds it


def test_cancel_before_a_worker_holds_the_job(worker_env, redis_conn, h3_settings, fault_table):
    r, qn = redis_conn, h3_settings.queue_name
    readings = Path(worker_env["_readings"])
    parent = enqueue(r, SMALL, h3_settings).job_ids[0]
    (child_plan,) = plan(r, [SMALL], h3_settings)
    child = Queue.prepare_data(RENDER_FUNC, kwargs={"job": child_plan.job.payload()}, job_id="j-deferred0001",
                               depends_on=[parent], meta={"h3r": {"state": "queued"}})
    Queue(qn, connection=r, serializer=JSONSerializer).enqueue_many([child])
    assert fetch(r, child.job_id).get_status() == JobStatus.DEFERRED
    queued = enqueue(r, SMALL, h3_settings).job_ids[0]
    gated = enqueue(r, SMALL, h3_settings).job_ids[0]

    times = {"queued": cancel_and_time(r, queued), "deferred": cancel_and_time(r, child.job_id)}
    write_readings(readings, Readings(platform="test", power=PowerReading(on_battery=True, battery_percent=90.0)))
    p = start_worker(worker_env, "--burst")
    try:
        wait_for(lambda: any("gate closed" in (w.get_state() or "") for w in Worker.all(connection=r)), 60,
                 "the worker to hold at its gate")
        assert fetch(r, gated).get_status() == JobStatus.QUEUED
        times["waiting for the gate"] = cancel_and_time(r, gated)
        write_readings(readings, Readings(platform="test"))  # plugged in: the gate opens
        p.wait(timeout=120)  # the parent runs; the canceled ones do not
    finally:
        out = stop(p)
    assert fetch(r, parent).get_status() == JobStatus.FINISHED, out[-2000:]
    for state, jid in (("queued", queued), ("deferred", child.job_id), ("waiting for the gate", gated)):
        m = h3meta(r, jid)
        held = ended_canceled(r, jid) and "started_at" not in m and filed_canceled(r, qn, jid)
        row = record(fault_table, f"cancel while {state}", times[state], WAITING_BOUND_S, held,
                     "canceled within 2 s, never run", note=m.get("error", ""))
        assert row.ok, (state, times[state], m, out[-2000:])


def test_cancel_while_scheduled_for_a_retry(worker_env, redis_conn, h3_settings, fault_table):
    """A render that crashed waits in rq's ScheduledJobRegistry for its retry interval; a cancel
    then must take it out for good, past the interval, with the scheduler running."""
    r, qn = redis_conn, h3_settings.queue_name
    interval = 4
    settings = h3_settings.model_copy(update={"retry_max": 2, "retry_intervals_s": [interval]})
    jid = enqueue(r, {**SMALL, "engine_options": {"test_crash_at_step": 1}}, settings).job_ids[0]
    p = start_worker(worker_env)
    try:
        wait_for(lambda: fetch(r, jid).get_status() == JobStatus.SCHEDULED
                 and jid in ScheduledJobRegistry(qn, connection=r).get_job_ids(), 90,
                 "the crashed job to wait in the scheduled registry for its retry")
        took = cancel_and_time(r, jid)
        time.sleep(interval + 3)  # the retry would be due and taken by now
        m = h3meta(r, jid)
        held = ended_canceled(r, jid) and m.get("attempt") == 1 and filed_canceled(r, qn, jid)
    finally:
        out = stop(p)
    row = record(fault_table, "cancel while scheduled for a retry", took, WAITING_BOUND_S, held,
                 "canceled within 2 s; never retried past its interval",
                 note=f"attempts {m.get('attempt')}, crashes {m.get('crashes')}")
    assert row.ok, (took, m, out[-2000:])


# ---------------------------------------------------------------- held by a render


def test_cancel_while_the_render_waits_or_runs(worker_env, redis_conn, h3_settings, fault_table):
    r, qn = redis_conn, h3_settings.queue_name
    readings = Path(worker_env["_readings"])
    env = {**worker_env, "H3RENDER_ADMISSION_POLL_S": SLOW_POLL, "H3RENDER_ADMISSION_WAIT_LIMIT_S": "600",
           "H3RENDER_THERMAL_PAUSE_POLL_S": SLOW_POLL}
    results = {}
    p = start_worker(env)
    try:
        # 64 of 512 MiB available: the gate's 10% is met, the job (~0.08 GiB plus headroom) waits
        write_readings(readings, machine(total=GiB // 2, available=GiB // 16))
        jid = enqueue(r, SMALL, h3_settings).job_ids[0]
        wait_state(r, jid, "waiting_memory")
        results["waiting for memory"] = (jid, cancel_and_time(r, jid), WAITING_BOUND_S, "")

        write_readings(readings, machine())
        jid = enqueue(r, LONG, h3_settings).job_ids[0]
        wait_for(lambda: (h3meta(r, jid).get("step") or 0) >= 3, 60, "denoising")
        write_readings(readings, machine(thermal=HOT))
        wait_state(r, jid, "paused_thermal", timeout=20)
        results["paused hot"] = (jid, cancel_and_time(r, jid), WAITING_BOUND_S, "")
        write_readings(readings, machine())

        jid = enqueue(r, LONG, h3_settings).job_ids[0]
        wait_for(lambda: (h3meta(r, jid).get("step") or 0) >= 5, 60, "denoising")
        t0 = time.time()
        control.cancel(r, jid)
        # the step saved once the cancel key is set: the render reads the key after every step,
        # so at most the step in flight then completes
        seen = h3meta(r, jid)["step"]
        wait_for(lambda: ended_canceled(r, jid), 30, "the running job to end canceled")
        took = time.time() - t0
        last = h3meta(r, jid)["step"]
        results["denoising"] = (jid, took, None, f"step {seen} when the cancel was set, {last} when it stopped")
        within_a_step = last <= seen + 1
    finally:
        out = stop(p)
    for state, (jid, took, bound_s, note) in results.items():
        held = ended_canceled(r, jid) and filed_canceled(r, qn, jid) and (state != "denoising" or within_a_step)
        row = record(fault_table, f"cancel while {state}", took, bound_s, held,
                     "canceled within 2 s" if bound_s else "canceled within one step", note)
        assert row.ok, (state, took, h3meta(r, jid), out[-2000:])


# ---------------------------------------------------------------- never back


def _horse_of(r, jid: str) -> int:
    return wait_for(lambda: h3meta(r, jid).get("pid"), 30, "the render process's pid")


def test_a_canceled_job_never_comes_back(worker_env, redis_conn, h3_settings, fault_table):
    """The worker goes away right after the cancel, before the render could read it (its
    render process is stopped first), by SIGKILL and by SIGTERM; a new worker takes over. Then
    every requeue of failed jobs is asked to bring the canceled jobs back."""
    r, qn = redis_conn, h3_settings.queue_name
    cases, canceled = {}, []
    for how in (signal.SIGKILL, signal.SIGTERM):
        jid = enqueue(r, LONG, h3_settings).job_ids[0]
        canceled.append(jid)
        horse = None
        p = start_worker(worker_env)
        try:
            wait_for(lambda: (h3meta(r, jid).get("step") or 0) >= 3, 90, "denoising")
            horse = _horse_of(r, jid)
            os.kill(horse, signal.SIGSTOP)  # it cannot read the cancel key now
            t0 = time.time()
            control.cancel(r, jid)
            if how == signal.SIGKILL:
                os.killpg(p.pid, signal.SIGKILL)
                os.kill(horse, signal.SIGKILL)
            else:
                p.send_signal(signal.SIGTERM)  # a warm shutdown waits for the render ...
                time.sleep(1.0)
                os.kill(horse, signal.SIGCONT)  # ... which reads the cancel at its next step
            p.wait(timeout=60)
        finally:
            stop(p)
            if horse is not None:
                try:
                    os.kill(horse, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        q = start_worker(worker_env)  # takes the dead worker's lock and its jobs
        try:
            wait_for(lambda: ended_canceled(r, jid), 90, f"job {jid} to end canceled after the {how.name}")
            took = time.time() - t0
            time.sleep(3)  # a retry (1 s intervals here) would have started by now
            m = h3meta(r, jid)
        finally:
            out = stop(q)
        cases[f"worker {how.name} right after the cancel"] = (
            ended_canceled(r, jid) and m.get("attempt") == 1 and filed_canceled(r, qn, jid), took,
            f"attempts {m.get('attempt')}: {m.get('error')}", out)

    # a failed job with a cancel request (its render killed after the cancel, no retry left)
    from test_queue_enqueue import fail

    late = enqueue(r, SMALL, h3_settings).job_ids[0]
    fail(r, h3_settings, late)
    r.set(f"h3render:cancel:{late}", 1)
    canceled.append(late)
    t0 = time.time()
    refused = []
    for jid in canceled:
        out = run_cli(worker_env, "retry", jid, "--failed")  # the CLI's requeue of failed jobs
        again = control.retry(r, jid, h3_settings, failed_only=True)  # the dashboards' (and /rq's) requeue
        refused.append(out.returncode == 1 and "canceled" in out.stderr and not again.done
                       and "canceled" in again.skipped.get(jid, ""))
    cases["requeue of failed jobs (retry --failed, dashboards)"] = (
        all(refused) and all(filed_canceled(r, qn, j) and ended_canceled(r, j) for j in canceled)
        and Queue(qn, connection=r).count == 0, time.time() - t0,
        f"{sum(refused)}/{len(canceled)} skipped; the failed one now: {h3meta(r, late).get('error')}", "")
    for case, (held, took, note, log) in cases.items():
        row = fault_table("cancel", f"never back: {case}", tried=1, held=int(held), lost=0,
                          bound="ends canceled, in the canceled registry; never run again",
                          note=f"{took:.1f} s; {note}"[:160])
        assert row.ok, (case, note, log[-2000:])
