"""The function allowlist holds at every place a job's named functions could run.

    refusal()          the pure check: the function, instance, arguments, callbacks,
                       webhooks and unreadable data
    render process     the job is swapped in Redis after the worker's check and
                       before the spawned render process fetches it: that process
                       checks again and refuses (real H3Worker, real spawn, real Redis)
    callbacks          a render job carrying a failure callback is refused by the
                       worker; rq's abandoned-job cleanup (which runs failure
                       callbacks inside the worker) runs none
The end-to-end refusal by a worker subprocess is in test_worker_integration.py.

About 5 s (one spawned render process).
"""

from __future__ import annotations

import pytest
from rq import Queue
from rq.job import Callback, Job, JobStatus
from rq.registry import StartedJobRegistry, clean_registries
from rq.serializers import JSONSerializer

from h3render.worker.render import ALLOWED_FUNC, refusal
from h3render.worker.worker import AllowlistJob, H3Worker

PAYLOAD = {"prompt": "a red ball", "width": 64, "height": 64, "frames": 17, "steps": 2}
CALLED_KEY = "allowlist-test:called"


def record_call(job, connection, *exc_info):
    """A failure callback that leaves a mark in Redis when rq runs it."""
    connection.set(CALLED_KEY, job.id)


@pytest.fixture
def conn_job(redis_conn):
    def build(func=ALLOWED_FUNC, **kw) -> Job:
        kw.setdefault("kwargs", {"job": dict(PAYLOAD)})
        return Job.create(func, serializer=JSONSerializer, connection=redis_conn, **kw)
    return build


# ---------------------------------------------------------------- the pure check


def test_render_job_with_its_payload_is_allowed(conn_job):
    assert refusal(conn_job()) is None
    assert refusal(conn_job(args=[dict(PAYLOAD)], kwargs={})) is None  # positional payload


@pytest.mark.parametrize("kw, expected", [
    (dict(func="os.system", args=["touch x"], kwargs={}),
     "names function 'os.system'; this worker runs only h3render.worker.render.render_job"),
    (dict(args=[dict(PAYLOAD)]), "passes args="),  # payload twice
    (dict(kwargs={"job": "not a dict"}), "allowed: the payload only"),
    (dict(kwargs={"job": {}, "extra": 1}), "allowed: the payload only"),
    (dict(on_failure=Callback("os.system")), "names failure callback 'os.system'"),
    (dict(on_success=Callback("os.system")), "names success callback 'os.system'"),
    (dict(on_stopped=Callback("os.system")), "names stopped callback 'os.system'"),
])
def test_refusals_name_what_is_wrong(conn_job, kw, expected):
    why = refusal(conn_job(**kw))
    assert why is not None and why.startswith("refused: job ") and expected in why, why


def test_instance_and_unreadable_data_are_refused(conn_job):
    job = conn_job()
    job._instance = "a string standing in for an instance"
    assert "on an instance (str)" in refusal(job)
    job = conn_job()
    job.data = b"\x80 not JSON"
    assert "cannot be read as a JSON job" in refusal(job)


def test_allowlist_job_resolves_no_other_function(conn_job, redis_conn):
    evil = AllowlistJob.create("os.system", args=["true"], connection=redis_conn,
                               serializer=JSONSerializer)
    with pytest.raises(RuntimeError, match="names function 'os.system'"):
        evil.func
    ok = AllowlistJob.create(ALLOWED_FUNC, kwargs={"job": dict(PAYLOAD)}, connection=redis_conn,
                             serializer=JSONSerializer)
    from h3render.worker.render import render_job

    assert ok.func is render_job


# ---------------------------------------------------------------- the render process


def test_job_swapped_after_the_workers_check_is_refused_by_the_render_process(
        redis_conn, h3_settings, tmp_path):
    marker = tmp_path / "pwned"
    q = Queue(h3_settings.queue_name, connection=redis_conn, serializer=JSONSerializer)
    q.enqueue(ALLOWED_FUNC, kwargs={"job": dict(PAYLOAD)}, job_id="j-swapped")
    w = H3Worker.create(redis_conn, h3_settings)
    w.register_birth()
    try:
        job, queue = w.dequeue_job_and_maintain_ttl(None)
        assert job.id == "j-swapped" and refusal(job) is None  # what the worker checks
        # Someone with write access to Redis swaps the job's function and arguments
        # now, after the check and before the render process reads the job.
        evil = Job.create("os.system", args=[f"touch {marker}"], connection=redis_conn,
                          serializer=JSONSerializer)
        redis_conn.hset(job.key, "data", evil.to_dict()["data"])
        w.execute_job(job, queue)  # spawns the render process (horse_main)
    finally:
        w.register_death()
    assert not marker.exists()
    job = Job.fetch("j-swapped", connection=redis_conn, serializer=JSONSerializer)
    assert job.func_name == "os.system"  # the swap did land in Redis
    assert job.get_status() == JobStatus.FAILED
    err = job.meta["h3r"]["error"]
    assert "names function 'os.system'" in err and "checked again by the render process" in err
    assert job.meta["h3r"]["retryable"] is False and job.retries_left == 0
    assert "checked again by the render process" in job.latest_result().exc_string


# ---------------------------------------------------------------- callbacks


def test_render_job_with_a_failure_callback_is_refused_by_the_worker(redis_conn, h3_settings):
    q = Queue(h3_settings.queue_name, connection=redis_conn, serializer=JSONSerializer)
    q.enqueue(ALLOWED_FUNC, kwargs={"job": dict(PAYLOAD)}, job_id="j-callback",
              on_failure=Callback(f"{__name__}.record_call"))
    w = H3Worker.create(redis_conn, h3_settings)
    w.register_birth()
    try:
        job, queue = w.dequeue_job_and_maintain_ttl(None)
        w.execute_job(job, queue)  # refused before anything is spawned
    finally:
        w.register_death()
    job = Job.fetch("j-callback", connection=redis_conn, serializer=JSONSerializer)
    assert job.get_status() == JobStatus.FAILED
    assert f"names failure callback '{__name__}.record_call'" in job.meta["h3r"]["error"]
    assert not redis_conn.exists(CALLED_KEY)


def test_abandoned_job_cleanup_runs_no_callback(redis_conn, h3_settings):
    """rq's registry cleanup (run by the worker's maintenance) calls the failure
    callback of every job it finds abandoned, in the worker process."""
    def abandoned(queue: Queue, job_id: str) -> None:
        job = Job.create(ALLOWED_FUNC, kwargs={"job": dict(PAYLOAD)}, id=job_id,
                         connection=redis_conn, serializer=JSONSerializer, origin=queue.name,
                         on_failure=Callback(f"{__name__}.record_call"))
        job.save()
        reg = StartedJobRegistry(queue.name, connection=redis_conn, serializer=JSONSerializer)
        redis_conn.zadd(reg.key, {f"{job_id}:exec-1": 1})  # expired long ago

    # rq's plain Job does run it: the test can see a call
    plain = Queue("plain", connection=redis_conn, serializer=JSONSerializer)
    abandoned(plain, "j-plain")
    clean_registries(plain)
    assert redis_conn.get(CALLED_KEY) == b"j-plain"
    redis_conn.delete(CALLED_KEY)
    # the worker's queues use AllowlistJob
    w = H3Worker.create(redis_conn, h3_settings)
    queue = w.queues[0]
    assert queue.job_class is AllowlistJob and w.job_class is AllowlistJob
    abandoned(queue, "j-abandoned")
    clean_registries(queue)
    assert not redis_conn.exists(CALLED_KEY)
    assert Job.fetch("j-abandoned", connection=redis_conn,
                     serializer=JSONSerializer).get_status() == JobStatus.FAILED
