"""Enqueue, sweeps, status, cancel and retry against a real redis-server (tests/redis_fixture.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner
from rq import Queue
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry
from rq.serializers import JSONSerializer

from h3render.queue import control, status
from h3render.queue.engine_info import publish_engine_info
from h3render.queue.enqueue import SWEEP_JOBS_KEY, SWEEP_KEY, enqueue, enqueue_sweep, queue
from h3render.queue.job import RENDER_FUNC

from test_queue_job import INFO

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def r(redis_conn):
    publish_engine_info(redis_conn, "tiny-wan", INFO)  # what a worker serving tiny-wan publishes
    return redis_conn


def raw_job_data(r, job_id) -> list:
    """The job's stored call, decoded without rq: zlib-compressed JSON, never a pickle."""
    return json.loads(zlib.decompress(r.hget(f"rq:job:{job_id}", "data")))


def test_enqueue_stores_json_call_of_the_render_function(r, h3_settings):
    res = enqueue(r, {"prompt": "a fox", "steps": 4}, h3_settings)
    (job_id,) = res.job_ids
    assert re.fullmatch(r"j-[0-9a-f]{12}", job_id)
    func, instance, args, kwargs = raw_job_data(r, job_id)
    assert (func, instance, args) == (RENDER_FUNC, None, [])
    payload = kwargs["job"]
    assert payload["prompt"] == "a fox" and isinstance(payload["seed"], int)  # random seed recorded
    job = Job.fetch(job_id, connection=r, serializer=JSONSerializer)
    assert job.result_ttl == job.failure_ttl == 30 * 24 * 3600
    assert job.timeout >= h3_settings.job_timeout_min_s and job.timeout != 180
    assert (job.retries_left, job.retry_intervals) == (3, [30, 120, 600])
    assert job.meta["h3r"]["state"] == "queued" and job.meta["h3r"]["estimate"]["seconds"] > 0
    assert queue(r, h3_settings).job_ids == [job_id]


PICKLE_USE = re.compile(
    r"^\s*(import|from)\s+(c?pickle|dill|cloudpickle|_pickle)\b"  # importing a pickler
    r"|\b(c?pickle|dill|cloudpickle)\.(loads?|dumps?|Unpickler|Pickler)\b"  # calling one
    r"|allow_pickle\s*=\s*True|DefaultSerializer|PickleSerializer",  # numpy / rq's pickle paths
    re.M,
)


def test_no_pickle_anywhere_in_the_package():
    """Anyone who can write to Redis must not be able to run code: no pickle use in h3render/.
    (Mentions such as a docstring saying so, or np.load(allow_pickle=False), are fine.)"""
    hits = {str(p.relative_to(ROOT)): m.group(0).strip() for p in sorted((ROOT / "h3render").rglob("*.py"))
            for m in [PICKLE_USE.search(p.read_text())] if m}
    assert hits == {}, f"pickle used in {hits}"
    assert PICKLE_USE.search("import pickle\n") and PICKLE_USE.search("x = pickle.loads(b)")
    assert not PICKLE_USE.search("np.load(path, allow_pickle=False)")


def test_10000_jobs_in_one_pipeline(r, h3_settings):
    """~3 s here (plan 0.4 s, enqueue 2.3 s): one MULTI/EXEC carries every job and the sweep record."""
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_enqueue import run

    figures = run(r, h3_settings, 10_000)
    print("bench_enqueue:", figures)
    assert figures["jobs"] == figures["queued"] == 10_000
    assert figures["exec_calls"] == 1


def test_sweep_record_order_and_preview_first(r, h3_settings):
    res = enqueue_sweep(r, {"prompt": "a fox", "model": "tiny-wan", "width": 64, "height": 48},
                        {"seed": [1, 2], "quant": ["q8_0", "q4_0"], "steps": [4, 6]}, h3_settings, preview=True)
    assert len(res.job_ids) == 16 and len(res.preview_ids) == 8
    ids = [i.decode() for i in r.lrange(SWEEP_JOBS_KEY.format(id=res.sweep_id), 0, -1)]
    assert ids == res.job_ids == queue(r, h3_settings).job_ids  # run order = sweep order
    assert r.sismember("h3render:sweeps", res.sweep_id)
    rec = r.hgetall(SWEEP_KEY.format(id=res.sweep_id))
    assert json.loads(rec[b"axes"])["seed"] == [1, 2] and int(rec[b"jobs"]) == 16
    payloads = [raw_job_data(r, i)[3]["job"] for i in ids]
    assert all(p["width"] == 32 and p["frames"] == 5 for p in payloads[:8])  # previews: small, short
    assert all(p["width"] == 64 for p in payloads[8:])
    assert [p["quant"] for p in payloads[8:]] == ["q8_0"] * 4 + ["q4_0"] * 4  # weights stay loaded
    metas = [Job.fetch(i, connection=r, serializer=JSONSerializer).meta["h3r"] for i in ids]
    assert all(m["sweep_id"] == res.sweep_id for m in metas)
    assert [m["preview_of"] for m in metas[:8]] == ids[8:]


def test_high_priority_goes_first_in_order(r, h3_settings):
    low = enqueue(r, {"prompt": "later"}, h3_settings).job_ids
    res = enqueue_sweep(r, {"prompt": "now", "priority": "high"}, {"seed": [1, 2, 3]}, h3_settings)
    assert queue(r, h3_settings).job_ids == res.job_ids + low


def test_invalid_sweep_enqueues_nothing_and_names_each_problem_once(r, h3_settings):
    from h3render.queue.errors import JobValidationError

    with pytest.raises(JobValidationError) as e:
        enqueue_sweep(r, {"prompt": "x", "frames": 20}, {"seed": [1, 2, 3], "steps": [0, 4]}, h3_settings)
    fields = [p.field for p in e.value.problems]
    assert sorted(fields) == ["frames", "steps"]  # 6 jobs, one problem each
    assert queue(r, h3_settings).count == 0


def test_unknown_model_is_an_input_error(r, h3_settings, monkeypatch):
    from h3render.queue.errors import JobValidationError

    monkeypatch.setattr("h3render.queue.engine_info.local_info",
                        lambda m: (_ for _ in ()).throw(FileNotFoundError(f"no model {m}")))
    with pytest.raises(JobValidationError) as e:
        enqueue(r, {"prompt": "x", "model": "tiny-wam"}, h3_settings)
    (p,) = e.value.problems
    assert (p.field, p.nearest) == ("model", "tiny-wan")


def test_estimate_uses_measured_timings_of_finished_jobs(r, h3_settings):
    first = enqueue(r, {"prompt": "x", "quant": "f16"}, h3_settings)
    assert first.time_source == "default"
    # Finish the job as a worker would (rq's own success path), with measured timings in meta.
    q = queue(r, h3_settings)
    job = Job.fetch(first.job_ids[0], connection=r, serializer=JSONSerializer)
    job.meta["h3r"].update(state="finished", timings={"load": 1, "encode": 1, "denoise": 10.0, "decode": 2})
    job.save_meta()
    q.remove(job)
    with r.pipeline() as pipe:
        job._handle_success(result_ttl=3600, pipeline=pipe, worker_name="test")
        pipe.execute()
    second = enqueue(r, {"prompt": "x", "quant": "f16"}, h3_settings)
    assert second.time_source == "measured from 1 job"
    assert second.seconds == pytest.approx(2 + 10.0 + 2, rel=1e-6)  # same job: the same timings


def fail(r, settings, job_id, msg="EngineInternalError: crash"):
    """Move a queued job to failed the way rq's worker does (no retry left)."""
    q = queue(r, settings)
    job = Job.fetch(job_id, connection=r, serializer=JSONSerializer)
    q.remove(job)
    job.meta["h3r"].update(state="failed", error=msg, engine_error="test_crash_at_step=2")
    job.save_meta()
    with r.pipeline() as pipe:
        job.set_status(JobStatus.FAILED, pipeline=pipe)
        FailedJobRegistry(queue=q).add(job, ttl=3600, exc_string=msg, pipeline=pipe)
        pipe.execute()


def test_cancel_queued_job_and_retry(r, h3_settings):
    res = enqueue_sweep(r, {"prompt": "x"}, {"seed": [1, 2, 3]}, h3_settings)
    a, b, c = res.job_ids
    out = control.cancel(r, a)
    assert out.done == [a]
    assert r.exists(f"h3render:cancel:{a}") and r.ttl(f"h3render:cancel:{a}") > 3600
    assert status.job_status(r, a).state == "canceled"
    assert a not in queue(r, h3_settings).job_ids
    fail(r, h3_settings, b)
    row = status.job_status(r, b)
    assert (row.state, row.error) == ("failed", "EngineInternalError: crash")
    # --failed retries only b; a plain retry of the sweep also brings a back
    out = control.retry_sweep(r, res.sweep_id, h3_settings, failed_only=True)
    assert out.done == [b] and "canceled" in out.skipped[a] and "queued" in out.skipped[c]
    out = control.retry_sweep(r, res.sweep_id, h3_settings)
    assert out.done == [a]
    assert set(queue(r, h3_settings).job_ids) == {a, b, c}
    assert not r.exists(f"h3render:cancel:{a}")
    meta = Job.fetch(b, connection=r, serializer=JSONSerializer).meta["h3r"]
    assert meta["state"] == "queued" and meta["attempts"][-1]["error"] == "EngineInternalError: crash"
    summary = status.sweep_status(r, res.sweep_id)["summary"]
    assert summary["states"] == {"queued": 3}


def test_cancel_running_job_sets_the_key_only(r, h3_settings):
    (job_id,) = enqueue(r, {"prompt": "x"}, h3_settings).job_ids
    job = Job.fetch(job_id, connection=r, serializer=JSONSerializer)
    queue(r, h3_settings).remove(job)
    job.set_status(JobStatus.STARTED)
    job.meta["h3r"].update(state="denoising", step=2, steps=4, eta_s=3.5)
    job.save_meta()
    row = status.job_status(r, job_id)
    assert (row.state, row.step, row.steps, row.progress, row.eta_s) == ("denoising", 2, 4, 0.5, 3.5)
    assert control.cancel(r, job_id).done == [job_id]
    assert control.cancel_requested(r, job_id)
    assert Job.fetch(job_id, connection=r, serializer=JSONSerializer).get_status() == JobStatus.STARTED


def test_job_state_reconciles_rq_and_meta():
    from h3render.queue.status import job_state

    assert job_state("started", "paused_thermal").value == "paused_thermal"
    assert job_state("failed", "canceled").value == "canceled"  # ended by the cancel path
    assert job_state("scheduled", "failed").value == "queued"  # waiting for a retry interval
    assert job_state("started", "finished").value == "loading"  # stale meta of an earlier attempt
    assert job_state("stopped", None).value == "canceled"


def test_queued_jobs_survive_redis_stop_and_kill(redis_server, r, h3_settings):
    res = enqueue_sweep(r, {"prompt": "x"}, {"seed": list(range(1, 21))}, h3_settings)
    redis_server.restart()  # clean SHUTDOWN
    r2 = redis_server.client()
    assert queue(r2, h3_settings).job_ids == res.job_ids
    redis_server.restart(hard=True)  # SIGKILL at once: appendfsync always fsyncs before it replies
    r3 = redis_server.client()
    assert queue(r3, h3_settings).job_ids == res.job_ids
    assert [row.state for row in status.job_rows(r3, res.job_ids)] == ["queued"] * 20


# ---- the CLI ---------------------------------------------------------------------------------


def cli(*args):
    from h3render.cli import cli as root

    return CliRunner().invoke(root, list(args))


def test_cli_enqueue_sweep_status_cancel(r, h3_settings):
    res = cli("enqueue", "--prompt", "a fox", "--steps", "4", "--seed", "7")
    assert res.exit_code == 0, res.output
    job_id = res.output.split()[0]
    assert re.fullmatch(r"j-[0-9a-f]{12}", job_id)
    res = cli("sweep", "--seed", "1-8", "--steps", "20,30", "--quant", "q8_0,q4_0", "--guidance", "4.5,5.5",
              "--prompt", "A", "--prompt", "B", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["jobs"] == 128 and out["estimate_s"] > 0 and out["axes"]["seed"] == 8
    res = cli("status", out["sweep_id"], "--json")
    data = json.loads(res.output)
    assert data["summary"]["jobs"] == 128 and data["summary"]["states"] == {"queued": 128}
    res = cli("status")
    assert res.exit_code == 0 and job_id in res.output and "no worker has published health" in res.output
    r.set("h3render:health:hostA", json.dumps({"open": False, "time": time.time(),
                                               "reasons": [{"check": "power", "code": "battery",
                                                            "message": "on battery (62%)"}]}))
    assert "worker hostA: gate held: on battery (62%)" in cli("status").output
    res = cli("cancel", "--sweep", out["sweep_id"], "--json")
    assert len(json.loads(res.output)["done"]) == 128
    res = cli("retry", job_id)
    assert res.exit_code == 1 and "not failed or canceled" in res.output


def test_cli_sweep_from_toml_with_preview(r, h3_settings, tmp_path):
    f = tmp_path / "grid.toml"
    f.write_text('prompt = ["a fox", "a lighthouse"]\nseed = "1-2"\nsteps = [4, 6]\npreview = true\n')
    res = cli("sweep", "--file", str(f), "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert (out["jobs"], out["preview_jobs"]) == (16, 8)


@pytest.mark.parametrize("args, field", [
    (["enqueue", "--prompt", "x", "--frames", "20"], "frames=20"),
    (["enqueue", "--prompt", "x", "--steps", "many"], "steps='many'"),
    (["enqueue", "--prompt", "   "], "prompt="),
    (["enqueue", "--prompt", "x", "--model", "../../etc"], "model="),
    (["sweep", "--prompt", "x", "--seed", "8-1"], "seed='8-1'"),
    (["sweep", "--seed", "1-2"], "prompt"),
    (["status", "j-000000000000"], "neither a job nor a sweep"),
    (["cancel"], "exactly one"),
])
def test_cli_bad_input_exit_2_with_message(r, h3_settings, args, field):
    res = cli(*args)
    assert res.exit_code == 2, (res.exit_code, res.output)
    assert field in res.output
    assert queue(r, h3_settings).count == 0


def test_cli_enqueue_wait_reports_the_end(r, h3_settings):
    """--wait polls until the job ends; a worker stand-in finishes it from another process."""
    res = cli("enqueue", "--prompt", "x", "--json")
    job_id = json.loads(res.output)["job_id"]
    code = (
        "import sys, redis; from rq.job import Job; from rq.serializers import JSONSerializer\n"
        f"r = redis.Redis.from_url({h3_settings.redis_url!r}); import time; time.sleep(1.0)\n"
        f"j = Job.fetch({job_id!r}, connection=r, serializer=JSONSerializer)\n"
        "j.meta['h3r'].update(state='finished', output_dir='/renders/x'); j.save_meta()\n"
        "from rq import Queue; Queue('h3render', connection=r, serializer=JSONSerializer).remove(j)\n"
        "p = r.pipeline(); j._handle_success(result_ttl=60, pipeline=p, worker_name='t'); p.execute()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        from h3render.cli.jobs import wait_for

        assert wait_for(r, [job_id], quiet=True, poll_s=0.1) == 0
    finally:
        proc.wait(timeout=30)
    assert status.job_status(r, job_id).output_dir == "/renders/x"


def test_cli_status_watch_ends_when_the_job_ends(r, h3_settings):
    (job_id,) = enqueue(r, {"prompt": "x"}, h3_settings).job_ids
    control.cancel(r, job_id)
    res = cli("status", job_id, "--watch", "--interval", "0.1", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output.splitlines()[-1])["job"]["state"] == "canceled"
    res = cli("status", job_id, "--watch", "--interval", "0.1")
    assert res.exit_code == 0 and "canceled" in res.output
