"""Refusals: payloads that are not a job object, and NUL bytes, get the clear refusal of any bad field.

Through every door a payload comes in: RenderJob.parse (what the render task calls),
enqueue() and enqueue_sweep() (the API the CLI, dashboard and nodes use), `h3render
enqueue --file` (JSON), cancel/retry by id, and a real worker that finds such
payloads on its queue. Never a raw TypeError, never a retry. About 40 s on 2 cores
(the worker half spawns a render process per payload that passes the allowlist).
"""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner
from rq import Queue, Retry
from rq.job import JobStatus
from rq.serializers import JSONSerializer

from faults.harness import fetch, h3meta, start_worker, stop
from h3render.keys import RENDER_FUNC
from h3render.queue import control
from h3render.queue.engine_info import publish_engine_info
from h3render.queue.enqueue import enqueue, enqueue_sweep, queue
from h3render.queue.errors import JobValidationError
from h3render.queue.job import RenderJob
from test_queue_job import INFO

# 18 payloads that are not a job object, or hold a field of a type no field has.
NOT_A_JOB = {
    "list": [1, 2],
    "empty list": [],
    "text": "a red ball",
    "empty text": "",
    "integer": 7,
    "float": 1.5,
    "boolean": True,
    "null": None,
    "list of a job": [{"prompt": "a red ball"}],
    "prompt is a list": {"prompt": ["a red ball"]},
    "prompt is an object": {"prompt": {"text": "a red ball"}},
    "engine_options is a list": {"prompt": "x", "engine_options": [1, 2]},
    "engine_options is a text": {"prompt": "x", "engine_options": "steps=3"},
    "an option holds a list": {"prompt": "x", "engine_options": {"a": [1, {"b": 2}]}},
    "seed is an object": {"prompt": "x", "seed": {"value": 1}},
    "width is a list": {"prompt": "x", "width": [64]},
    "guidance is a word": {"prompt": "x", "guidance": "five"},
    "prompt null, steps an object": {"prompt": None, "steps": {"n": 3}},
}
# A NUL byte in each text a job carries.
NUL = {
    "prompt": ({"prompt": "a red\x00ball"}, "prompt"),
    "negative_prompt": ({"prompt": "x", "negative_prompt": "blur\x00"}, "negative_prompt"),
    "model": ({"prompt": "x", "model": "tiny-wan\x00"}, "model"),
    "option value": ({"prompt": "x", "engine_options": {"mode": "a\x00b"}}, "engine_options.mode"),
    "option name": ({"prompt": "x", "engine_options": {"mo\x00de": 1}}, "engine_options.'mo\\x00de' (name)"),
    "field name": ({"prompt": "x", "st\x00eps": 3}, "'st\\x00eps'"),
}


@pytest.fixture
def r(redis_conn):
    publish_engine_info(redis_conn, "tiny-wan", INFO)
    return redis_conn


def refused_as(payload, *fields_ok: str) -> bool:
    """True when RenderJob.parse refuses `payload` with a JobValidationError naming one of fields_ok
    (any field when none is given)."""
    try:
        RenderJob.parse(payload)
    except JobValidationError as e:
        return not fields_ok or any(p.field in fields_ok for p in e.problems)
    return False


def test_payloads_that_are_not_a_job_are_refused_everywhere(r, h3_settings, tmp_path, fault_table):
    held, seen = 0, []
    runner = CliRunner()
    from h3render.cli import cli

    for name, payload in NOT_A_JOB.items():
        doors = {}
        not_dict = not isinstance(payload, dict)
        doors["parse"] = refused_as(payload, *(("job",) if not_dict else ()))
        try:
            enqueue(r, payload, h3_settings)
            doors["enqueue"] = False
        except JobValidationError as e:
            doors["enqueue"] = not not_dict or e.problems[0].field == "job"
        try:
            enqueue_sweep(r, payload, {"fps": [8, 16]}, h3_settings)  # an axis no kind sets
            doors["sweep"] = False
        except JobValidationError:
            doors["sweep"] = True
        f = tmp_path / "job.json"
        f.write_text(json.dumps(payload))
        res = runner.invoke(cli, ["enqueue", "--file", str(f)])
        doors["cli --file"] = (res.exit_code == 2 and "invalid job" in res.output
                               and "TypeError" not in res.output and "Traceback" not in res.output
                               and (not not_dict or "job=" in res.output))
        seen.append((name, doors, res.output.strip().splitlines()[-1:] if res.output else []))
        held += all(doors.values())
    bad = [s for s in seen if not all(s[1].values())]
    assert not bad, bad
    assert queue(r, h3_settings).count == 0  # nothing refused reached the queue
    row = fault_table("refusals", "payloads that are not a job object (parse, enqueue, sweep, CLI --file)",
                      tried=len(NOT_A_JOB), held=held, lost=0,
                      bound="JobValidationError naming the field (\"job\" for a non-object), exit 2, nothing queued",
                      note=f"{len(NOT_A_JOB)} kinds x 4 doors")
    assert not bad, bad
    assert row.ok


def test_nul_bytes_are_refused_not_stored(r, h3_settings, tmp_path, fault_table):
    from h3render.cli import cli

    runner = CliRunner()
    results = {}
    for name, (payload, field) in NUL.items():
        try:
            enqueue(r, payload, h3_settings)
            api = False
        except JobValidationError as e:
            api = [p.field for p in e.problems] == [field] and "\\x00" in str(e)
        f = tmp_path / "job.json"
        f.write_text(json.dumps(payload))
        res = runner.invoke(cli, ["enqueue", "--file", str(f)])
        results[name] = api and refused_as(payload, field) and res.exit_code == 2 and "invalid job" in res.output
    for field, call in {
        "job_id": lambda: control.cancel(r, "j-12\x0034"),
        "job_id ": lambda: control.retry(r, "j-12\x0034", h3_settings),
        "sweep_id": lambda: control.cancel_sweep(r, "s-ab\x00cd"),
        "sweep_id ": lambda: control.retry_sweep(r, "s-ab\x00cd", h3_settings),
    }.items():
        try:
            call()
            results[f"{field.strip()} ({'retry' if field.endswith(' ') else 'cancel'})"] = False
        except JobValidationError as e:
            p = e.problems[0]
            results[f"{field.strip()} ({'retry' if field.endswith(' ') else 'cancel'})"] = (
                p.field == field.strip() and "NUL" in p.rule and "\x00" not in str(p.nearest))
    assert queue(r, h3_settings).count == 0
    row = fault_table("refusals", "NUL byte in a prompt, model, option, field name, job id or sweep id",
                      tried=len(results), held=sum(results.values()), lost=0,
                      bound="refused with the field named and the value shown escaped; nothing queued",
                      note="API, CLI --file and cancel/retry by id")
    assert all(results.values()), results
    assert row.ok


def test_a_worker_refuses_them_without_a_retry(r, h3_settings, worker_env, fault_table):
    """What reaches the queue some other way (redis-cli, an old client) fails once, with the reason."""
    q = Queue(h3_settings.queue_name, connection=r, serializer=JSONSerializer)
    cases = {**{f"not a job: {k}": v for k, v in NOT_A_JOB.items()},
             **{f"NUL in {k}": v for k, (v, _) in NUL.items()}}
    ids = {}
    for i, (name, payload) in enumerate(cases.items()):
        data = Queue.prepare_data(RENDER_FUNC, kwargs={"job": payload}, job_id=f"j-refuse{i:04d}",
                                  retry=Retry(max=2, interval=1), meta={"h3r": {"state": "queued"}})
        q.enqueue_many([data])
        ids[name] = data.job_id
    p = start_worker(worker_env, "--burst")
    try:
        p.wait(timeout=300)
    finally:
        out = stop(p)
    time.sleep(1.5)  # a retry, if one were scheduled, would be due by now
    outcome = {}
    for name, jid in ids.items():
        job = fetch(r, jid)
        why = (h3meta(r, jid).get("error") or "") + " " + (job.latest_result().exc_string
                                                           if job.latest_result() else "")
        # FAILED, not SCHEDULED: a retry would be in the scheduled registry (the burst worker is gone)
        outcome[name] = (job.get_status() == JobStatus.FAILED
                         and ("invalid job" in why or why.lstrip().startswith("refused"))
                         and "TypeError" not in why)
    row = fault_table("refusals", "not-a-job and NUL payloads on the queue, run by a worker",
                      tried=len(outcome), held=sum(outcome.values()), lost=0,
                      bound="failed once with the reason (invalid job / refused), never retried",
                      note=f"worker exit {p.returncode}")
    assert all(outcome.values()), ({k: v for k, v in outcome.items() if not v}, out[-2000:])
    assert row.ok


def test_a_nul_in_a_jobs_sweep_id_fails_it_once(r, h3_settings, worker_env, fault_table):
    """A hostile record: a valid payload whose meta names a sweep id with a NUL. The sweep id
    becomes a folder name, so the job must fail with the reason, not be retried."""
    q = Queue(h3_settings.queue_name, connection=r, serializer=JSONSerializer)
    payload = RenderJob.parse({"prompt": "a red ball", "model": "tiny-wan", "width": 64, "height": 64,
                               "frames": 17, "steps": 2, "seed": 1, "negative_prompt": "", "guidance": 5.0,
                               "shift": 3.0, "sampler": "unipc", "quant": "f16", "fps": 16}).payload()
    data = Queue.prepare_data(RENDER_FUNC, kwargs={"job": payload}, job_id="j-nulsweep0001",
                              retry=Retry(max=2, interval=1),
                              meta={"h3r": {"state": "queued", "sweep_id": "s-ab\x00cd"}})
    q.enqueue_many([data])
    p = start_worker(worker_env, "--burst")
    try:
        p.wait(timeout=180)
    finally:
        out = stop(p)
    time.sleep(1.5)
    job = fetch(r, data.job_id)
    m = h3meta(r, data.job_id)
    held = job.get_status() == JobStatus.FAILED and "sweep" in (m.get("error") or "") and m.get("attempt", 1) == 1
    row = fault_table("refusals", "NUL in a job record's sweep id (hostile record), run by a worker", tried=1,
                      held=int(held), lost=0, bound="failed once naming the sweep id, never retried",
                      note=f"status {job.get_status()}, attempt {m.get('attempt')}, error {str(m.get('error'))[:60]!r}")
    assert held, (job.get_status(), m, out[-1500:])
    assert row.ok
