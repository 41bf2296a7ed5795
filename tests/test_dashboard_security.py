"""The dashboard's locks, without a browser: every route's methods, 405 on GET for every state
change, per-action CSRF tokens and their HttpOnly cookie, the CSP on every response, the
rq-dashboard templates we override, no pickle on any /rq route, and the HTTP server.
Real Redis, Flask's test client. (In Chromium: tests/faults/test_browser_xss.py.) About 5 s.
"""

from __future__ import annotations

import pickle
import re
import threading
import urllib.request
from pathlib import Path

import pytest
from rq import Queue, Worker
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry
from rq.serializers import JSONSerializer

from h3render.dashboards import rqdash
from h3render.dashboards.security import CSRF_COOKIE

SMALL = {"prompt": "a red ball", "model": "tiny-wan", "width": 64, "height": 64, "frames": 17, "steps": 2}
# Every GET route of ours, each of which only reads.
OUR_READ_ONLY = {"dash.sweeps", "dash.sweep", "dash.job", "dash.workers", "dash.media", "dash.sweep_json",
                 "dash.job_json", "dash.favicon", "static"}


@pytest.fixture
def app(redis_server, redis_conn, h3_settings):
    from h3render.dashboards.app import create_app

    a = create_app(h3_settings, redis_conn=redis_conn, redis_url=redis_server.url)
    a.testing = True
    return a


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def failed(redis_conn, h3_settings):
    """A sweep of two jobs, both failed the way a worker leaves them, and one queued single job."""
    from h3render.queue.enqueue import enqueue, enqueue_sweep, queue
    from h3render.queue.jobstate import save_h3r

    res = enqueue_sweep(redis_conn, SMALL, {"seed": [1, 2]}, h3_settings)
    q = queue(redis_conn, h3_settings)
    for jid in res.job_ids:
        job = Job.fetch(jid, connection=redis_conn, serializer=JSONSerializer)
        q.remove(job)
        job.set_status(JobStatus.FAILED)
        FailedJobRegistry(queue=q).add(job, exc_string="RuntimeError: boom")
        save_h3r(job, state="failed", error="boom")
    single = enqueue(redis_conn, SMALL, h3_settings).job_ids[0]
    return res, single


def state_of(r, ids) -> dict:
    out = {"failed": sorted(FailedJobRegistry("h3render", connection=r).get_job_ids(cleanup=False)),
           "queued": Queue("h3render", connection=r, serializer=JSONSerializer).get_job_ids()}
    for jid in ids:
        out[jid] = (Job.fetch(jid, connection=r, serializer=JSONSerializer).get_status().value
                    if Job.exists(jid, connection=r) else "gone")
    return out


# ---------------------------------------------------------------- routes and methods


def test_every_get_route_is_a_known_reader_and_every_rq_route_is_accounted_for(app):
    import rq_dashboard.web as web

    rq_endpoints = set()
    for rule in app.url_map.iter_rules():
        if rule.endpoint.startswith("rq_dashboard."):
            rq_endpoints.add(rule.endpoint)
        elif "GET" in rule.methods:
            assert rule.endpoint in OUR_READ_ONLY, f"{rule} takes GET: is {rule.endpoint} read only?"
    # every view function rq-dashboard defines is a route we have looked at
    views = {f"rq_dashboard.{n}" for n, f in vars(web).items()
             if callable(f) and getattr(f, "__module__", "") == web.__name__ and n in
             {r.endpoint.split(".", 1)[1] for r in app.url_map.iter_rules() if r.endpoint.startswith("rq_dashboard.")}}
    assert views <= rq_endpoints
    mutating = rq_endpoints - rqdash.READ_ONLY
    assert mutating == {"rq_dashboard.delete_job_view", "rq_dashboard.requeue_job_view",
                        "rq_dashboard.requeue_all", "rq_dashboard.empty_queue", "rq_dashboard.compact_queue"}
    # the ones that read jobs with rq's default serializer (pickle) are ours now
    for name in ("job_view", "list_workers", "delete_job_view", "empty_queue", "requeue_job_view", "requeue_all"):
        assert app.view_functions[f"rq_dashboard.{name}"].__module__ == rqdash.__name__, name


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_no_get_changes_state(client, failed, redis_conn, method):
    res, single = failed
    jid = res.job_ids[0]
    urls = ["/rq/requeue/h3render", "/rq/queue/h3render/failed/empty", "/rq/queue/h3render/queued/empty",
            "/rq/queue/h3render/compact", f"/rq/job/{jid}/requeue", f"/rq/job/{jid}/delete",
            f"/jobs/{jid}/retry", f"/jobs/{single}/cancel", f"/sweeps/{res.sweep_id}/retry",
            f"/sweeps/{res.sweep_id}/cancel"]
    ids = [*res.job_ids, single]
    before = state_of(redis_conn, ids)
    assert len(before["failed"]) == 2
    for u in urls:
        r = client.open(u, method=method)
        assert r.status_code == 405, (u, r.status_code)
        assert "POST" in r.headers["Allow"], u
        if method == "GET":
            assert "would change the queue" in r.get_data(as_text=True), u
    assert state_of(redis_conn, ids) == before


# ---------------------------------------------------------------- CSRF


def _rq_actions(client, queue="h3render", registry="failed") -> dict:
    jobs = client.get(f"/rq/0/data/jobs/{queue}/{registry}/8/asc/1.json").get_json()["jobs"]
    return {j["id"]: j["actions"] for j in jobs}


def test_csrf_cookie_is_httponly_and_tokens_work_for_one_action_only(client, failed, redis_conn):
    res, _ = failed
    a, b = res.job_ids
    r = client.get("/rq/")
    cookie = next(h for h in r.headers.getlist("Set-Cookie") if h.startswith(CSRF_COOKIE + "="))
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    actions = _rq_actions(client)
    # a's delete token opens neither b's delete nor a's requeue
    for url in (f"/rq/job/{b}/delete", f"/rq/job/{a}/requeue"):
        r = client.post(url, data={"csrf_token": actions[a]["delete"]["token"]})
        assert r.status_code == 403 and "token for POST" in r.get_data(as_text=True), url
    assert state_of(redis_conn, [a, b])[a] == "failed"
    # the same token from another browser (another cookie) is refused too
    other = client.application.test_client()
    other.get("/rq/")
    assert other.post(f"/rq/job/{a}/delete", data={"csrf_token": actions[a]["delete"]["token"]}).status_code == 403
    r = client.post(f"/rq/job/{a}/requeue", headers={"X-CSRFToken": actions[a]["requeue"]["token"]})
    assert r.status_code == 200 and r.get_json()["status"] == "OK"
    assert state_of(redis_conn, [a])[a] == "queued"


def test_same_site_and_cross_site_posts_are_refused_even_with_a_token(client, failed, redis_conn):
    res, _ = failed
    a = res.job_ids[0]
    tok = _rq_actions(client)[a]["requeue"]["token"]
    for site in ("same-site", "cross-site"):
        r = client.post(f"/rq/job/{a}/requeue", data={"csrf_token": tok}, headers={"Sec-Fetch-Site": site})
        assert r.status_code == 403 and f"Sec-Fetch-Site: {site}" in r.get_data(as_text=True)
    assert state_of(redis_conn, [a])[a] == "failed"
    r = client.post(f"/rq/job/{a}/requeue", data={"csrf_token": tok}, headers={"Sec-Fetch-Site": "same-origin"})
    assert r.status_code == 200


def test_rq_page_forms_carry_the_token_of_their_own_action(client, failed):
    res, _ = failed
    body = client.get("/rq/0/view/jobs/h3render/failed/8/asc/1").get_data(as_text=True)
    forms = re.findall(r'<form class="rq-action" method="post" action="([^"]+)"[^>]*>\s*'
                       r'<input type="hidden" name="csrf_token" value="([^"]+)"', body)
    assert {u for u, _ in forms} == {"/rq/queue/h3render/failed/empty", "/rq/requeue/h3render"}
    nonce = client.get_cookie(CSRF_COOKIE).value
    csrf = client.application.extensions["h3render"].csrf
    for url, tok in forms:
        assert tok == csrf.token(nonce, url)
    r = client.post("/rq/requeue/h3render", data={"csrf_token": dict(forms)["/rq/requeue/h3render"]})
    assert r.status_code == 200 and r.get_json()["count"] == 2


def test_requeue_from_rq_goes_through_our_retry_and_never_revives_a_canceled_job(client, failed, redis_conn,
                                                                                 h3_settings):
    from h3render.queue.jobstate import save_h3r

    res, _ = failed
    a, b = res.job_ids
    job_b = Job.fetch(b, connection=redis_conn, serializer=JSONSerializer)
    save_h3r(job_b, state="canceled")  # failed in rq, but canceled by a person
    listed = _rq_actions(client)  # also sets the cookie
    assert set(listed) == {a, b}
    body = client.get("/rq/0/view/jobs/h3render/failed/8/asc/1").get_data(as_text=True)
    token = re.search(r'action="/rq/requeue/h3render"[^>]*>\s*<input type="hidden" name="csrf_token" '
                      r'value="([^"]+)"', body).group(1)
    doc = client.post("/rq/requeue/h3render", data={"csrf_token": token}).get_json()
    assert doc["count"] == 1 and b in doc["skipped"] and "canceled" in doc["skipped"][b]
    job_a = Job.fetch(a, connection=redis_conn, serializer=JSONSerializer)
    assert job_a.get_status() == JobStatus.QUEUED and job_a.meta["h3r"]["state"] == "queued"
    assert job_a.retries_left == h3_settings.retry_max
    # never requeued: filed where it belongs, with the canceled jobs (queue.control.retry)
    assert Job.fetch(b, connection=redis_conn, serializer=JSONSerializer).get_status() == JobStatus.CANCELED


# ---------------------------------------------------------------- CSP and templates


def test_every_response_carries_the_strict_csp(client, failed):
    res, single = failed
    urls = ["/", f"/sweeps/{res.sweep_id}", f"/jobs/{single}", "/workers", f"/api/jobs/{single}.json",
            "/static/dash.js", "/nope", "/rq/", "/rq/0/view/workers", "/rq/0/view/jobs",
            f"/rq/0/view/job/{single}", "/rq/0/data/queues.json", "/rq/0/data/workers.json",
            "/rq/static/css/main.css", "/rq/requeue/h3render"]
    for u in urls:
        r = client.get(u)
        csp = r.headers.get("Content-Security-Policy", "")
        script = re.search(r"script-src ([^;]*)", csp)
        assert script and script.group(1).strip() == "'self'", (u, csp)
        assert "unsafe-eval" not in csp and "object-src 'none'" in csp and "frame-ancestors 'none'" in csp, u
        assert r.headers["X-Content-Type-Options"] == "nosniff", u
        if u.startswith("/rq"):
            assert "require-trusted-types-for 'script'" in csp, u
    r = client.post("/rq/requeue/h3render")  # a refusal is a response too
    assert r.status_code == 403 and "script-src 'self'" in r.headers["Content-Security-Policy"]


def test_every_rq_dashboard_page_template_is_ours_with_no_inline_script():
    import rq_dashboard.web as web

    ours = Path(rqdash.__file__).parent / "templates" / "rq_dashboard"
    rendered = set(re.findall(r'render_template\(\s*"rq_dashboard/([^"]+)"', Path(web.__file__).read_text()))
    assert rendered and rendered <= {p.name for p in ours.iterdir()}, rendered
    for name in set(rqdash.TEMPLATES) | rendered:
        text = (ours / name).read_text()
        assert "<%" not in text and "{% include \"rq_dashboard/scripts" not in text, name
        for tag in re.findall(r"<script[^>]*>", text):
            assert re.fullmatch(r'<script src="[^"]+">', tag), (name, tag)
    js = (Path(rqdash.__file__).parent / "static" / "rqdash.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
                 "_.template"):
        assert sink not in js, sink


# ---------------------------------------------------------------- no pickle


class _Marker:
    """Unpickling this creates a file: proof that a pickle from Redis ran."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_no_rq_route_unpickles_what_redis_holds(client, failed, redis_conn, tmp_path):
    res, _ = failed
    a, b = res.job_ids
    marker = tmp_path / "unpickled"
    for jid in (a, b):
        redis_conn.hset(f"rq:job:{jid}", "meta", pickle.dumps(_Marker(marker)))
    # the payload is live: rq's default serializer runs it
    Job.fetch(a, connection=redis_conn)
    assert marker.exists()
    marker.unlink()
    w = Worker([Queue("h3render", connection=redis_conn)], connection=redis_conn, name="w-pickle")
    w.register_birth()
    redis_conn.hset(w.key, "current_job", a)

    actions = _rq_actions(client)
    for u in ["/rq/", "/rq/0/view/workers", "/rq/0/data/workers.json", f"/rq/0/view/job/{a}",
              "/rq/0/view/jobs/h3render/failed/8/asc/1"]:
        assert client.get(u).status_code == 200, u
    workers = client.get("/rq/0/data/workers.json").get_json()["workers"]
    assert workers[0]["current_job"]["job_id"] == a
    r = client.post(f"/rq/job/{a}/requeue", data={"csrf_token": actions[a]["requeue"]["token"]})
    assert r.status_code == 200 and r.get_json()["status"] == "SKIPPED"  # its meta does not parse: said so
    assert client.post(f"/rq/job/{b}/delete", data={"csrf_token": actions[b]["delete"]["token"]}).status_code == 200
    assert not marker.exists(), "a /rq route unpickled a job record"
    assert not Job.exists(b, connection=redis_conn)


# ---------------------------------------------------------------- the HTTP server


def _serve_once(app, **kw):
    from h3render.dashboards.server import make_server

    srv = make_server(app, "127.0.0.1", 0, **kw)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/rq/", timeout=10) as r:
            return srv.kind, r.status, dict(r.headers)
    finally:
        srv.stop()
        t.join(10)
        srv.close()


def test_werkzeug_fallback_serves_and_logs_no_query_string(app, caplog):
    import logging

    kind, code, headers = _serve_once(app, prefer_waitress=False)
    assert (kind, code) == ("werkzeug", 200) and "script-src 'self'" in headers["Content-Security-Policy"]
    from h3render.dashboards.server import make_server

    srv = make_server(app, "127.0.0.1", 0, prefer_waitress=False)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        with caplog.at_level(logging.INFO, logger="werkzeug"):
            urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/workers?token=s3cret-s3cret-s3cret", timeout=10)
    finally:
        srv.stop()
        t.join(10)
        srv.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "werkzeug"]
    assert any("GET /workers" in ln for ln in lines) and not any("s3cret" in ln for ln in lines), lines


def test_waitress_serves_when_installed(app):
    from h3render.dashboards.server import waitress_available

    if not waitress_available():
        pytest.skip("waitress is not installed in this environment (pyproject depends on it; "
                    "make install brings it)")
    kind, code, headers = _serve_once(app)
    assert (kind, code) == ("waitress", 200) and headers["Server"] == "h3render"
    assert "script-src 'self'" in headers["Content-Security-Policy"]


# ---------------------------------------------------------------- hostile records on /rq


def test_rq_job_lists_page_in_order_and_list_unreadable_records_with_the_reason(client, redis_conn):
    q = Queue("h3render", connection=redis_conn, serializer=JSONSerializer)
    ids = [q.enqueue_call("h3render.worker.render.render_job", kwargs={"job": {}}, job_id=f"j-p{i:02d}").id
           for i in range(10)]
    failed = FailedJobRegistry("h3render", connection=redis_conn)
    for i, jid in enumerate(ids):
        redis_conn.zadd(failed.key, {jid: 4_000_000_000 + i})  # the same ids, in the same order

    def listed(registry, order, page):
        doc = client.get(f"/rq/0/data/jobs/h3render/{registry}/4/{order}/{page}.json").get_json()
        return [j["id"] for j in doc["jobs"]]

    for registry in ("queued", "failed"):
        assert listed(registry, "asc", 1) == ids[0:4], registry
        assert listed(registry, "asc", 3) == ids[8:10], registry
        assert listed(registry, "dsc", 1) == ids[6:10][::-1], registry
        assert listed(registry, "dsc", 3) == ids[0:2][::-1], registry
    bad = {"created_at": "garbage", "meta": "{not json", "status": "weird", "timeout": "abc",
           "enqueued_at": "zz", "ended_at": "qq"}
    for jid, (field, value) in zip(ids, bad.items()):
        redis_conn.hset(f"rq:job:{jid}", field, value)
    for registry in ("queued", "failed"):
        r = client.get(f"/rq/0/data/jobs/h3render/{registry}/20/asc/1.json")
        assert r.status_code == 200, registry
        jobs = {j["id"]: j for j in r.get_json()["jobs"]}
        assert set(jobs) == set(ids)  # every record is listed, readable or not
        assert "job record unreadable: ValueError" in jobs[ids[0]]["description"]  # created_at
    for jid in ids[:len(bad)]:
        r = client.get(f"/rq/0/data/job/{jid}.json")
        assert r.status_code == 200 and r.get_json()["id"] == jid, jid
    doc = client.get(f"/rq/0/data/job/{ids[0]}.json").get_json()
    assert doc["status"] == "unreadable" and "garbage" in doc["description"]
    assert client.get("/rq/0/data/job/j-nothere.json").status_code == 404
