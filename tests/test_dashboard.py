"""Dashboard without a browser: the grid and chart functions, auth, CSRF, escaping, the CLI's
refusals, and every page through Flask's test client on a real Redis with real queued jobs.
(The browser tests, with a rendered sweep, are in test_dashboard_browser.py.) About 5 s.
"""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from h3render.dashboards.grid import LayoutError, axis_values, build_grid, choose_layout
from h3render.dashboards.plots import Band, Chart, Series, line_chart, nice_ticks
from h3render.dashboards.security import (
    Auth,
    Csrf,
    DashboardSecurityError,
    check_bind,
    is_loopback,
)

EVIL = '<script>alert("x")</script><img src=x onerror=alert(1)> & co'
SMALL = {"model": "tiny-wan", "width": 64, "height": 64, "frames": 17, "steps": 2}
TOKEN = "t0ken-t0ken-t0ken-t0ken"


# ---------------------------------------------------------------- grid (pure)


def _params(**kw):
    return dict(kw)


def test_layout_defaults_last_axis_columns_then_rows_then_pages():
    assert choose_layout(["prompt", "seed", "steps"]) == choose_layout(["prompt", "seed", "steps"], ["seed"],
                                                                       ["steps"], ["prompt"])
    lay = choose_layout(["prompt", "seed", "steps"])
    assert (lay.rows, lay.cols, lay.pages) == (("seed",), ("steps",), ("prompt",))
    lay = choose_layout(["a", "b", "c"], rows=["a", "c"])
    assert (lay.rows, lay.cols, lay.pages) == (("a", "c"), ("b",), ())
    assert choose_layout([]).rows == ()


@pytest.mark.parametrize("kw, msg", [
    ({"rows": ["nope"]}, "rows='nope': not an axis of this sweep; axes: seed, steps"),
    ({"rows": ["seed"], "cols": ["seed"]}, "cols='seed': already used for rows"),
])
def test_layout_errors_name_the_side_and_axis(kw, msg):
    with pytest.raises(LayoutError, match=re.escape(msg)):
        choose_layout(["seed", "steps"], **kw)


def test_grid_places_every_job_once_with_labels():
    jobs = [(_params(seed=s, steps=n, prompt=p), f"{p}{s}{n}") for p in "xy" for s in (1, 2, 3) for n in (20, 30)]
    values = axis_values(["prompt", "seed", "steps"], [p for p, _ in jobs])
    assert values == {"prompt": ["x", "y"], "seed": [1, 2, 3], "steps": [20, 30]}
    lay = choose_layout(["prompt", "seed", "steps"])
    seen = []
    for page in range(2):
        g = build_grid(jobs, values, lay, page)
        assert g.rows == ["seed=1", "seed=2", "seed=3"] and g.cols == ["steps=20", "steps=30"]
        assert g.pages == ["prompt=x", "prompt=y"] and g.page == page
        assert g.elsewhere == 6
        for (r, c), items in g.cells.items():
            assert len(items) == 1
            assert items[0] == f"{'xy'[page]}{[1, 2, 3][r]}{[20, 30][c]}"
            seen.append(items[0])
    assert sorted(seen) == sorted(i for _, i in jobs)
    # two axes on one side combine; a page past the end shows the last page
    g = build_grid(jobs, values, choose_layout(["prompt", "seed", "steps"], rows=["prompt", "seed"]), 7)
    assert g.rows[0] == "prompt=x · seed=1" and len(g.rows) == 6 and g.page == 0 and not g.elsewhere


# ---------------------------------------------------------------- charts (pure)


def test_chart_escapes_text_and_says_when_empty():
    svg = line_chart(Chart("<b>t</b>", "GiB", [Series("<i>s</i>", [(0.0, 1.0), (1.0, None), (2.0, 3.0)])],
                           [Band(0.5, 1.5, "<u>band</u>")]), 0.0, 2.0)
    assert "<b>" not in svg and "<i>" not in svg and "<u>" not in svg
    assert "&lt;b&gt;t&lt;/b&gt;" in svg and "&lt;u&gt;band&lt;/u&gt;" in svg
    assert svg.count("M") >= 2  # the None sample breaks the line into two pieces
    assert "no samples" in line_chart(Chart("empty", "", [Series("s", [])]), 0.0, 1.0)
    assert nice_ticks(0, 10) == [0, 2.5, 5, 7.5, 10] and nice_ticks(0, 23.5, 4)[-1] == 20


# ---------------------------------------------------------------- security (pure)


def test_bind_beyond_loopback_needs_auth():
    for host in ("127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.2"):
        assert is_loopback(host)
        check_bind(host, Auth())
    for host in ("0.0.0.0", "::", "192.168.1.4", "nas.local"):
        assert not is_loopback(host)
        with pytest.raises(DashboardSecurityError, match="refusing to serve the dashboard on .* without "
                                                         "authentication.*--token TOKEN.*--basic-auth"):
            check_bind(host, Auth())
        check_bind(host, Auth(token=TOKEN))
        check_bind(host, Auth.parse(basic="me:secret"))


@pytest.mark.parametrize("token, basic, msg", [
    ("short", None, "--token / H3RENDER_DASHBOARD_TOKEN: token has 5 characters; use at least 16"),
    (None, "nopassword", "--basic-auth / H3RENDER_DASHBOARD_BASIC_AUTH='***': must be USER:PASSWORD"),
    (None, "me:", "H3RENDER_DASHBOARD_BASIC_AUTH='me:***': must be USER:PASSWORD"),
])
def test_bad_credentials_settings_are_named(token, basic, msg):
    with pytest.raises(DashboardSecurityError, match=re.escape(msg)):
        Auth.parse(token, basic)


def test_csrf_tokens_are_per_action_and_bound_to_the_cookie_nonce():
    c = Csrf("secret")
    nonce = c.new_nonce()
    tok = c.token(nonce, "/jobs/j-1/retry")
    here = "http://127.0.0.1:9181/"
    assert c.check(nonce, tok, "/jobs/j-1/retry", host_url=here) is None
    assert c.check(nonce, tok, "/jobs/j-1/retry", origin="http://127.0.0.1:9181", host_url=here) is None
    assert "Origin 'http://evil.example'" in c.check(nonce, tok, "/jobs/j-1/retry", origin="http://evil.example",
                                                     host_url=here)
    assert "no CSRF token" in c.check(nonce, None, "/jobs/j-1/retry", host_url=here)
    assert "no CSRF cookie" in c.check(None, tok, "/jobs/j-1/retry", host_url=here)
    assert "not this browser's token for POST /jobs/j-1/cancel" in c.check(nonce, tok, "/jobs/j-1/cancel",
                                                                          host_url=here)
    assert c.check(c.new_nonce(), tok, "/jobs/j-1/retry", host_url=here) is not None  # another browser
    assert Csrf("other").check(nonce, tok, "/jobs/j-1/retry", host_url=here) is not None


# ---------------------------------------------------------------- the app on a real Redis


@pytest.fixture
def queued(redis_conn, h3_settings):
    """A queued sweep (seed 1,2 x steps 2,3) whose prompt is hostile markup, and one single job."""
    from h3render.queue.enqueue import enqueue, enqueue_sweep

    res = enqueue_sweep(redis_conn, {**SMALL, "prompt": EVIL}, {"seed": [1, 2], "steps": [2, 3]}, h3_settings)
    single = enqueue(redis_conn, {**SMALL, "prompt": EVIL}, h3_settings).job_ids[0]
    return res, single


def make_client(redis_server, redis_conn, h3_settings, **kw):
    from h3render.dashboards.app import create_app

    app = create_app(h3_settings, redis_conn=redis_conn, redis_url=redis_server.url, **kw)
    app.testing = True
    return app.test_client()


@pytest.fixture
def client(redis_server, redis_conn, h3_settings):
    return make_client(redis_server, redis_conn, h3_settings)


def status(r, job_id) -> JobStatus:
    return Job.fetch(job_id, connection=r, serializer=JSONSerializer).get_status()


def test_pages_answer_and_never_render_prompt_markup(client, queued, redis_conn):
    res, single = queued
    for url in ("/", f"/sweeps/{res.sweep_id}", f"/jobs/{res.job_ids[0]}", f"/jobs/{single}", "/workers",
                f"/sweeps/{res.sweep_id}?pages=seed&page=1"):
        resp = client.get(url)
        assert resp.status_code == 200, url
        body = resp.get_data(as_text=True)
        assert "<script>alert" not in body and "<img src=x" not in body, url
        assert "default-src 'self'" in resp.headers["Content-Security-Policy"]
    body = client.get(f"/sweeps/{res.sweep_id}").get_data(as_text=True)
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt; &amp; co" in body
    assert body.count('class="cell s-queued"') == 4
    assert [m for m in re.findall(r'class="col-label" scope="col">([^<]*)<', body)] == ["steps=2", "steps=3"]
    doc = client.get(f"/api/sweeps/{res.sweep_id}.json").get_json()
    assert [j["id"] for j in doc["jobs"]] == res.job_ids and doc["summary"]["states"] == {"queued": 4}


def test_layout_error_is_shown_and_unknown_ids_are_404(client, queued):
    res, _ = queued
    body = client.get(f"/sweeps/{res.sweep_id}?rows=nope").get_data(as_text=True)
    assert "rows=&#39;nope&#39;: not an axis of this sweep; axes: seed, steps" in body
    r = client.get("/jobs/j-000000000000")
    assert r.status_code == 404 and "not found" in r.get_data(as_text=True)
    assert client.get("/sweeps/s-000000000000").status_code == 404
    assert client.get("/jobs/..%2f..%2fetc").status_code == 404


def test_media_serves_only_the_job_files(client, queued):
    res, _ = queued
    jid = res.job_ids[0]
    assert client.get(f"/media/{jid}/video.mp4").status_code == 404  # not rendered yet
    assert client.get(f"/media/{jid}/redis.conf").status_code == 404
    assert client.get(f"/media/{jid}/..%2F..%2Fredis%2Fredis.conf").status_code == 404


def form_token(client, page: str, action: str) -> str:
    """The CSRF token of the form on `page` that posts to `action` (as a browser would find it)."""
    body = client.get(page).get_data(as_text=True)
    m = re.search(r'<form[^>]*action="' + re.escape(action) + r'"[^>]*>\s*<input type="hidden" '
                  r'name="csrf_token" value="([^"]+)"', body)
    assert m, f"no form posting to {action} on {page}"
    return m.group(1)


def test_post_without_a_valid_csrf_token_is_refused(client, queued, redis_conn):
    res, single = queued
    r = client.post(f"/jobs/{single}/cancel", data={"next": "/"})
    assert r.status_code == 403 and "CSRF" in r.get_data(as_text=True)
    tok = form_token(client, f"/jobs/{single}", f"/jobs/{single}/cancel")  # also sets the cookie
    for data, headers, why in [
        ({"next": "/"}, {}, "no CSRF token"),
        ({"csrf_token": "x" + tok, "next": "/"}, {}, "token for POST /jobs/"),
        ({"csrf_token": tok}, {"Origin": "http://evil.example"}, "is not this dashboard"),
    ]:
        r = client.post(f"/jobs/{single}/cancel", data=data, headers=headers)
        assert r.status_code == 403 and why in r.get_data(as_text=True)
        assert status(redis_conn, single) == JobStatus.QUEUED  # nothing changed
    r = client.post(f"/jobs/{single}/cancel", data={"csrf_token": tok, "next": f"/jobs/{single}"},
                    headers={"Origin": "http://localhost"})
    assert r.status_code == 303 and r.headers["Location"] == f"/jobs/{single}"
    assert status(redis_conn, single) == JobStatus.CANCELED
    # an off-site "next" is ignored
    tok = form_token(client, f"/jobs/{single}", f"/jobs/{single}/retry")
    r = client.post(f"/jobs/{single}/retry", data={"csrf_token": tok, "next": "//evil.example/x"})
    assert r.status_code == 303 and r.headers["Location"] == f"/jobs/{single}"
    assert status(redis_conn, single) == JobStatus.QUEUED


def test_rq_dashboard_is_mounted_with_the_json_serializer_and_csrf(client, queued, redis_conn):
    res, single = queued
    assert client.get("/rq/").status_code == 200
    queues = client.get("/rq/0/data/queues.json").get_json()["queues"]
    assert {q["name"]: q["count"] for q in queues}["h3render"] == 5
    job = client.get(f"/rq/0/data/job/{single}.json").get_json()  # read with the JSON serializer
    assert job["id"] == single and job["status"] == "queued" and job["origin"] == "h3render"
    # raw data: rq-dashboard's pages (ours, templates/rq_dashboard) put it in as text
    assert '<script>alert("x")' in job["description"] and '"h3r"' in job["metadata"]
    assert client.post(f"/rq/job/{single}/delete").status_code == 403  # no token: refused
    assert Job.exists(single, connection=redis_conn)
    listed = client.get("/rq/0/data/jobs/h3render/queued/8/asc/1.json").get_json()["jobs"]
    delete = next(j for j in listed if j["id"] == single)["actions"]["delete"]
    assert delete["url"] == f"/rq/job/{single}/delete"
    assert client.post(delete["url"], headers={"X-CSRFToken": delete["token"]}).status_code == 200
    assert not Job.exists(single, connection=redis_conn)


def test_token_auth(redis_server, redis_conn, h3_settings, queued):
    c = make_client(redis_server, redis_conn, h3_settings, auth=Auth(token=TOKEN), host="0.0.0.0")
    assert c.get("/").status_code == 401
    assert c.get("/rq/").status_code == 401
    assert c.get("/?token=wrong-wrong-wrong-wrong").status_code == 401
    r = c.get(f"/workers?token={TOKEN}")
    assert r.status_code == 303 and r.headers["Location"] == "/workers"  # token leaves the URL
    assert c.get("/workers").status_code == 200  # via the HttpOnly cookie
    fresh = make_client(redis_server, redis_conn, h3_settings, auth=Auth(token=TOKEN), host="0.0.0.0")
    assert fresh.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert fresh.get("/", headers={"Host": "nas.local:9181", "Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_basic_auth(redis_server, redis_conn, h3_settings, queued):
    import base64

    c = make_client(redis_server, redis_conn, h3_settings, auth=Auth.parse(basic="me:s3cret"), host="0.0.0.0")
    r = c.get("/")
    assert r.status_code == 401 and r.headers["WWW-Authenticate"].startswith("Basic ")
    bad = base64.b64encode(b"me:wrong").decode()
    assert c.get("/", headers={"Authorization": f"Basic {bad}"}).status_code == 401
    good = base64.b64encode(b"me:s3cret").decode()
    assert c.get("/", headers={"Authorization": f"Basic {good}"}).status_code == 200


def test_without_auth_only_loopback_host_names_are_served(client, queued):
    assert client.get("/", headers={"Host": "127.0.0.1:9181"}).status_code == 200
    assert client.get("/", headers={"Host": "attacker.example"}).status_code == 400  # DNS rebinding


def test_cli_refuses_all_interfaces_without_auth(monkeypatch):
    from h3render.cli.dashboard import dashboard

    monkeypatch.delenv("H3RENDER_DASHBOARD_TOKEN", raising=False)
    monkeypatch.delenv("H3RENDER_DASHBOARD_BASIC_AUTH", raising=False)
    r = CliRunner().invoke(dashboard, ["--host", "0.0.0.0"])
    assert r.exit_code == 2
    assert "refusing to serve the dashboard on 0.0.0.0 (every address of this machine) without " \
           "authentication" in r.output
    r = CliRunner().invoke(dashboard, ["--host", "0.0.0.0", "--token", "short"])
    assert r.exit_code == 2 and "use at least 16" in r.output
    monkeypatch.setenv("H3RENDER_DASHBOARD_BASIC_AUTH", "nopass")
    r = CliRunner().invoke(dashboard, ["--host", "0.0.0.0"])
    assert r.exit_code == 2 and "must be USER:PASSWORD" in r.output
