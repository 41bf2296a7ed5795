"""Sweep status from the sweep's index: counts, paging, since-polling, abandoned jobs, failure reasons.

Against a real redis-server (tests/redis_fixture.py). Jobs are moved on the way rq's worker
moves them (rq's own calls: _handle_success, _handle_failure, prepare_for_execution
and Execution.create), with the sweep index kept by jobstate where h3render's writers keep
it, and behind its back where rq acts alone. Speed is measured in bench/bench_status.py,
not here. About 10 s.
"""

from __future__ import annotations

import json
import re
import time

import pytest
from click.testing import CliRunner
from rq import Worker
from rq.executions import Execution
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry, FinishedJobRegistry
from rq.serializers import JSONSerializer

from h3render.keys import SWEEP_CHANGED_KEY, SWEEP_FACTS_KEY, SWEEP_STATES_KEY
from h3render.queue import jobstate, liveness, status, sweepstatus
from h3render.queue.engine_info import publish_engine_info
from h3render.queue.enqueue import enqueue, enqueue_sweep, queue

from test_queue_job import INFO

SMALL = {"prompt": "a red ball", "model": "tiny-wan", "width": 64, "height": 64, "frames": 17}


@pytest.fixture
def r(redis_conn):
    publish_engine_info(redis_conn, "tiny-wan", INFO)
    return redis_conn


def fetch(r, job_id) -> Job:
    return Job.fetch(job_id, connection=r, serializer=JSONSerializer)


def finish(r, settings, job_id, index=True):
    """As the worker ends a job well: meta (through jobstate unless index=False), then rq's success."""
    job = fetch(r, job_id)
    out = f"{settings.home}/renders/{job_id}"
    if index:
        jobstate.save_h3r(job, state="finished", output_dir=out)
    else:
        job.meta["h3r"].update(state="finished", output_dir=out)
        job.save_meta()
    queue(r, settings).remove(job)
    with r.pipeline() as pipe:
        job._handle_success(result_ttl=3600, pipeline=pipe, worker_name="test")
        pipe.execute()


def fail(r, settings, job_id, error: str | None = "EngineInternalError: crash at step 1", index=True):
    """As the worker fails a job for good; the empty output folder stays in meta, as it did."""
    job = fetch(r, job_id)
    fields = {"state": "failed", "output_dir": f"{settings.home}/renders/{job_id}"}
    if error:
        fields["error"] = error
    if index:
        jobstate.save_h3r(job, **fields)
    else:
        job.meta["h3r"].update(fields)
        job.save_meta()
    q = queue(r, settings)
    q.remove(job)
    with r.pipeline() as pipe:
        job.set_status(JobStatus.FAILED, pipeline=pipe)
        job._handle_failure("Traceback ...\nRuntimeError: engine died", pipe, worker_name="test")
        pipe.execute()


def start(r, settings, job_id, worker: str, step=21, steps=200, ttl=90):
    """As a worker takes a job: rq's started status and registry entry, and a denoising meta."""
    job = fetch(r, job_id)
    queue(r, settings).remove(job)
    with r.pipeline() as pipe:
        job.prepare_for_execution(worker, pipe)
        Execution.create(job, ttl, pipe, worker_name=worker)
        pipe.execute()
    jobstate.save_h3r(fetch(r, job_id), state="denoising", step=step, steps=steps, eta_s=1.0)


def live_worker(r, settings, name: str) -> Worker:
    w = Worker([queue(r, settings)], connection=r, name=name)
    w.register_birth()
    return w


def cli(*args):
    from h3render.cli import cli as root

    return CliRunner().invoke(root, list(args), env={"COLUMNS": "300"})  # rich folds at the width


# ---------------------------------------------------------------- counts and paging


def test_counts_pick_and_pages_come_from_the_index(r, h3_settings):
    res = enqueue_sweep(r, SMALL, {"seed": list(range(1, 7)), "steps": [2, 3, 4, 5]}, h3_settings)
    ids = res.job_ids
    for j in ids[:5]:
        finish(r, h3_settings, j)
    fail(r, h3_settings, ids[5])
    live_worker(r, h3_settings, "w-live")
    start(r, h3_settings, ids[6], "w-live")
    start(r, h3_settings, ids[7], "w-dead")  # never registered: its worker is gone
    st = sweepstatus.sweep_state(r, res.sweep_id)
    assert st.summary["states"] == {"finished": 5, "failed": 1, "denoising": 1, "abandoned": 1, "queued": 16}
    assert (st.summary["jobs"], st.summary["done"]) == (24, 6)
    assert st.reread == 2 and st.corrected == 0  # only the two live jobs were read
    assert st.summary["remaining_s"] > 0
    # the jobs worth a look first: abandoned, running, failed, then queued and finished in run order
    assert sweepstatus.pick(st, limit=4) == [ids[7], ids[6], ids[5], ids[8]]
    assert sweepstatus.pick(st, limit=10, page=2) == ids[20:24]
    assert sweepstatus.pick(st, limit=None, states=["finished"]) == ids[:5]
    assert sweepstatus.pick(st, limit=None) == sorted(ids, key=lambda j: (
        [ids[7], ids[6], ids[5]] + ids[8:] + ids[:5]).index(j))
    rows = {j.row.id: j.row for j in sweepstatus.page_rows(r, st, [ids[0], ids[5], ids[6], ids[7]])}
    assert rows[ids[6]].state == "denoising" and rows[ids[6]].step == 21 and rows[ids[6]].eta_s == 1.0
    dead = rows[ids[7]]
    assert (dead.state, dead.step, dead.steps, dead.eta_s, dead.progress) == ("abandoned", None, None, None, None)
    assert "w-dead" in dead.error
    assert rows[ids[5]].error == "EngineInternalError: crash at step 1" and rows[ids[5]].output_dir is None
    assert rows[ids[0]].output_dir.endswith(ids[0])


def test_status_cli_shows_counts_a_limited_page_and_the_failure_reason(r, h3_settings):
    res = enqueue_sweep(r, SMALL, {"seed": list(range(1, 13))}, h3_settings)
    ids = res.job_ids
    finish(r, h3_settings, ids[0])
    fail(r, h3_settings, ids[1])
    fail(r, h3_settings, ids[2], error=None)  # the task recorded no reason: rq's traceback gives it
    out = cli("status", res.sweep_id, "--limit", "4")
    assert out.exit_code == 0, out.output
    text = out.output
    assert "EngineInternalError: crash at step 1" in text and "RuntimeError: engine died" in text
    assert f"renders/{ids[1]}" not in text  # the failed job's empty folder is not its output
    assert "showing 4 of 12 jobs" in text and "3/12 done" in text
    doc = json.loads(cli("status", res.sweep_id, "--json", "--limit", "4").output)
    jobs = {j["id"]: j for j in doc["jobs"]}
    assert [j["id"] for j in doc["jobs"]] == [ids[1], ids[2], ids[3], ids[4]]  # failed first
    assert jobs[ids[1]]["error"] == "EngineInternalError: crash at step 1" and jobs[ids[1]]["output_dir"] is None
    assert jobs[ids[2]]["error"] == "RuntimeError: engine died"
    assert doc["summary"]["states"] == {"finished": 1, "failed": 2, "queued": 9}
    assert doc["shown"] == {"jobs": 4, "of": 12, "page": None, "limit": 4, "states": []}
    every = json.loads(cli("status", res.sweep_id, "--json", "--all").output)
    assert sorted(j["id"] for j in every["jobs"]) == sorted(ids)
    finished = next(j for j in every["jobs"] if j["id"] == ids[0])
    assert finished["output_dir"].endswith(ids[0]) and finished["error"] is None
    page = json.loads(cli("status", res.sweep_id, "--json", "--limit", "5", "--page", "2").output)
    assert [j["id"] for j in page["jobs"]] == ids[10:12]
    only = json.loads(cli("status", res.sweep_id, "--json", "--state", "failed").output)
    assert [j["id"] for j in only["jobs"]] == [ids[1], ids[2]]
    bad = cli("status", res.sweep_id, "--state", "faild")
    assert bad.exit_code == 2 and "--state 'faild'" in bad.output and "nearest: failed" in bad.output
    one = json.loads(cli("status", ids[1], "--json").output)
    assert one["job"]["error"] == "EngineInternalError: crash at step 1" and one["job"]["output_dir"] is None


def test_a_stale_index_is_corrected_once(r, h3_settings):
    res = enqueue_sweep(r, SMALL, {"seed": list(range(1, 11))}, h3_settings)
    ids = res.job_ids
    for j in ids[:3]:
        finish(r, h3_settings, j, index=False)  # rq alone: the index still says queued
    fail(r, h3_settings, ids[3], index=False)
    assert r.hget(SWEEP_STATES_KEY.format(id=res.sweep_id), ids[0]) == b"queued"
    st = sweepstatus.sweep_state(r, res.sweep_id)
    assert st.summary["states"] == {"finished": 3, "failed": 1, "queued": 6}
    assert st.corrected == 4
    assert r.hget(SWEEP_STATES_KEY.format(id=res.sweep_id), ids[0]) == b"finished"
    again = sweepstatus.sweep_state(r, res.sweep_id)
    assert (again.summary, again.corrected, again.reread) == (st.summary, 0, 0)
    # a failed job put back on the queue by hand (no index write): queued again
    job = fetch(r, ids[3])
    FailedJobRegistry(queue=queue(r, h3_settings)).requeue(job)
    assert sweepstatus.sweep_state(r, res.sweep_id).summary["states"] == {"finished": 3, "queued": 7}


def test_registries_larger_than_the_sweep_are_asked_per_job(r, h3_settings):
    for _ in range(4):  # the finished registry now holds more jobs than the sweep has
        finish(r, h3_settings, enqueue(r, SMALL, h3_settings).job_ids[0])
    res = enqueue_sweep(r, SMALL, {"seed": [1, 2]}, h3_settings)
    finish(r, h3_settings, res.job_ids[0], index=False)
    st = sweepstatus.sweep_state(r, res.sweep_id)
    assert st.summary["states"] == {"finished": 1, "queued": 1} and st.corrected == 1


def test_a_sweep_from_before_the_index_gets_one_built(r, h3_settings):
    res = enqueue_sweep(r, SMALL, {"seed": list(range(1, 9))}, h3_settings)
    ids = res.job_ids
    finish(r, h3_settings, ids[0])
    fail(r, h3_settings, ids[1])
    for key in (SWEEP_STATES_KEY, SWEEP_CHANGED_KEY, SWEEP_FACTS_KEY):
        r.delete(key.format(id=res.sweep_id))
    st = sweepstatus.sweep_state(r, res.sweep_id)
    assert st.summary["states"] == {"finished": 1, "failed": 1, "queued": 6}
    assert st.reread == 8 and st.corrected == 8
    stored = {k.decode(): v.decode() for k, v in r.hgetall(SWEEP_STATES_KEY.format(id=res.sweep_id)).items()}
    assert stored == {j: s for j, s in zip(ids, ["finished", "failed"] + ["queued"] * 6)}
    assert r.zcard(SWEEP_CHANGED_KEY.format(id=res.sweep_id)) == 8 and r.exists(SWEEP_FACTS_KEY.format(id=res.sweep_id))
    again = sweepstatus.sweep_state(r, res.sweep_id)
    assert again.summary == st.summary and (again.reread, again.corrected) == (0, 0)
    assert sweepstatus.sweep_state(r, res.sweep_id).facts.params[ids[2]] == {"seed": 3, "pass": "full"}


def test_a_compare_and_set_never_overwrites_a_newer_state(r, h3_settings):
    res = enqueue_sweep(r, SMALL, {"seed": [1, 2]}, h3_settings)
    a, b = res.job_ids
    assert jobstate.correct_states(r, res.sweep_id, {a: ("queued", "failed"), b: ("denoising", "failed")}) == 1
    states = r.hgetall(SWEEP_STATES_KEY.format(id=res.sweep_id))
    assert states == {a.encode(): b"failed", b.encode(): b"queued"}


def test_expired_jobs_leave_the_counts(r, h3_settings):
    res = enqueue_sweep(r, SMALL, {"seed": [1, 2, 3]}, h3_settings)
    finish(r, h3_settings, res.job_ids[0])
    # its 30-day record ran out: the hash expires and rq's cleanup drops the registry entry
    r.delete(Job.key_for(res.job_ids[0]))
    r.zrem(FinishedJobRegistry(h3_settings.queue_name, connection=r).key, res.job_ids[0])
    st = sweepstatus.sweep_state(r, res.sweep_id)
    assert st.summary["states"] == {"queued": 2} and st.summary["jobs"] == 2
    assert r.hget(SWEEP_STATES_KEY.format(id=res.sweep_id), res.job_ids[0]) == jobstate.EXPIRED.encode()
    assert sweepstatus.sweep_state(r, res.sweep_id).reread == 0


def test_hostile_index_and_list_entries_are_read_past(r, h3_settings):
    res = enqueue_sweep(r, SMALL, {"seed": [1, 2, 3]}, h3_settings)
    a, b, c = res.job_ids
    r.hset(SWEEP_STATES_KEY.format(id=res.sweep_id), b, "not-a-state")
    fail(r, h3_settings, c)
    st = sweepstatus.sweep_state(r, res.sweep_id)
    assert st.summary["states"] == {"queued": 2, "failed": 1}
    assert r.hget(SWEEP_STATES_KEY.format(id=res.sweep_id), b) == b"queued"  # corrected
    r.rpush(f"h3render:sweep:{res.sweep_id}:jobs", "j-bad\nid", "j-nul\x00")  # ids no job has
    st = sweepstatus.sweep_state(r, res.sweep_id)
    assert st.summary["states"] == {"queued": 2, "failed": 1} and len(st.ids) == 5
    assert sweepstatus.sweep_state(r, res.sweep_id).summary == st.summary


# ---------------------------------------------------------------- abandoned


def test_abandoned_when_the_worker_is_gone_stopped_or_silent(r, h3_settings):
    ids = [enqueue(r, SMALL, h3_settings).job_ids[0] for _ in range(5)]
    live_worker(r, h3_settings, "w-alive")
    live_worker(r, h3_settings, "w-stopped").register_death()
    live_worker(r, h3_settings, "w-silent")
    start(r, h3_settings, ids[0], "w-alive")
    start(r, h3_settings, ids[1], "w-gone")
    start(r, h3_settings, ids[2], "w-stopped")
    start(r, h3_settings, ids[3], "w-silent", ttl=60 + 1)  # its next heartbeat was due in 1 s
    rows = {row.id: row for row in status.job_rows(r, ids[:4])}
    assert rows[ids[0]].state == "denoising" and rows[ids[3]].state == "denoising"
    assert [rows[j].state for j in ids[1:3]] == ["abandoned"] * 2
    assert "w-gone is gone" in rows[ids[1]].error and "w-stopped has stopped" in rows[ids[2]].error
    later = time.time() + 1 + liveness.HEARTBEAT_GRACE_S + 1  # the silent worker's heartbeat is overdue
    late = {j.row.id: j.row for j in status.read_jobs(r, ids[:4], now=later)}
    assert late[ids[3]].state == "abandoned" and "no heartbeat" in late[ids[3]].error
    assert late[ids[0]].state == "denoising"
    assert liveness.abandoned_in_queue(r, h3_settings.queue_name).keys() == {ids[1], ids[2]}
    # a job rq calls started that names no worker was not started by one: shown as its meta says
    job = fetch(r, ids[4])
    queue(r, h3_settings).remove(job)
    job.set_status(JobStatus.STARTED)
    jobstate.save_h3r(job, state="denoising", step=2, steps=4, eta_s=3.5)
    assert status.job_status(r, ids[4]).state == "denoising"
    assert status.job_status(r, ids[1]).eta_s is None


# ---------------------------------------------------------------- the dashboard


@pytest.fixture
def client(redis_server, redis_conn, h3_settings):
    from h3render.dashboards.app import create_app

    app = create_app(h3_settings, redis_conn=redis_conn, redis_url=redis_server.url)
    app.testing = True
    return app.test_client()


def test_since_polling_returns_exactly_the_jobs_changed(r, h3_settings, client):
    res = enqueue_sweep(r, SMALL, {"seed": list(range(1, 21))}, h3_settings)
    ids = res.job_ids
    start(r, h3_settings, ids[0], "w-dead")
    first = client.get(f"/api/sweeps/{res.sweep_id}.json").get_json()
    assert [j["id"] for j in first["jobs"]] == ids and first["live"] == []  # the full snapshot
    since = time.time()
    time.sleep(0.01)
    changed = [ids[3], ids[7], ids[12]]
    finish(r, h3_settings, ids[3])
    fail(r, h3_settings, ids[7])
    finish(r, h3_settings, ids[12])
    doc = client.get(f"/api/sweeps/{res.sweep_id}.json?since={since!r}").get_json()
    assert [j["id"] for j in doc["jobs"]] == changed
    assert [j["id"] for j in doc["live"]] == [ids[0]] and doc["live"][0]["state"] == "abandoned"
    assert doc["live"][0]["eta_s"] is None and doc["live"][0]["step"] is None
    by_id = {j["id"]: j for j in doc["jobs"]}
    assert by_id[ids[7]]["state"] == "failed" and by_id[ids[7]]["error"].startswith("EngineInternalError")
    assert doc["summary"]["states"] == {"abandoned": 1, "finished": 2, "failed": 1, "queued": 16}
    assert since <= doc["next_since"] <= time.time()
    nothing = client.get(f"/api/sweeps/{res.sweep_id}.json?since={time.time()!r}").get_json()
    assert nothing["jobs"] == [] and [j["id"] for j in nothing["live"]] == [ids[0]]
    bad = client.get(f"/api/sweeps/{res.sweep_id}.json?since=yesterday")
    assert bad.status_code == 400 and "since='yesterday': not a time" in bad.get_json()["error"]
    assert client.get(f"/api/sweeps/{res.sweep_id}.json?since=nan").status_code == 400


def test_the_sweep_page_shows_a_window_of_a_large_grid(r, h3_settings, client):
    res = enqueue_sweep(r, SMALL, {"seed": list(range(1, 31)), "steps": list(range(2, 32))}, h3_settings)
    fail(r, h3_settings, res.job_ids[0])
    start(r, h3_settings, res.job_ids[1], "w-dead")
    seen: list[str] = []
    windows = 0
    for rpart in range(3):  # 30 x 30 cells: 20 columns and 10 rows a window (200 cells at most)
        for cpart in range(2):
            body = client.get(f"/sweeps/{res.sweep_id}?rpart={rpart}&cpart={cpart}").get_data(as_text=True)
            cells = re.findall(r'class="cell s-[a-z_]+" data-job-id="([^"]+)"', body)
            assert len(cells) == (200 if cpart == 0 else 100)
            assert ("next rows" in body) == (rpart < 2) and ("next columns" in body) == (cpart < 1)
            seen += cells
            windows += 1
    assert sorted(seen) == sorted(res.job_ids) and windows == 6  # every job in exactly one window
    first = client.get(f"/sweeps/{res.sweep_id}").get_data(as_text=True)
    assert "rows 1–10 of 30" in first and "columns 1–20 of 30" in first
    assert 'class="badge s-abandoned">abandoned</span>' in first and "w-dead" in first
    assert "2 failed" not in first and "1 failed" in first  # counts of the whole sweep
    assert "EngineInternalError: crash at step 1" in first


def test_the_sweeps_list_counts_without_reading_every_job(r, h3_settings, client):
    res = enqueue_sweep(r, SMALL, {"seed": list(range(1, 5))}, h3_settings)
    fail(r, h3_settings, res.job_ids[0])
    single = enqueue(r, SMALL, h3_settings).job_ids[0]
    body = client.get("/").get_data(as_text=True)
    assert f'data-sweep-id="{res.sweep_id}"' in body and "1 failed" in body and "3 queued" in body
    assert single in body and body.count(res.job_ids[1]) == 0  # sweep jobs are not listed as singles
