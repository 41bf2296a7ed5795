"""No way in, in a real Chromium: hostile text from Redis runs nowhere, and no GET or other
origin changes anything.

Case 1 plants hostile text straight into Redis, where a person who can write to Redis (or
a job's own prompt) would put it: queue names, worker names, versions and hostnames, job
descriptions, meta, tracebacks (exc_info), prompts, errors and sweep ids and axis names.
Each payload, if it ever runs, sets window.__pwned, retitles the page and logs a marker
to the console. Chromium (tests/browser) opens every page, ours and rq-dashboard's under
/rq, waits for its scripts to draw, and checks: no marker set, no marker in the console,
no element carrying an on* handler, an inline script or a javascript: link, the CSRF
cookie unreadable by script, and the planted text shown literally (so the page did draw
it). CSP violations in the console are allowed: they are the policy blocking something.

Case 2 serves attack pages from a second http.server on another 127.0.0.1 port (the same
"site" to the browser, so even SameSite=Strict cookies go along): <img> GETs of every
state-changing URL, auto-submitted forms with a forged token, and no-cors fetch POSTs.
The dashboard's request log proves each request arrived; the queue's state before and
after proves none changed anything.

The dashboard runs in this process on a real HTTP server (h3render.dashboards.server:
waitress when installed, else werkzeug), so its requests can be recorded. About 60 s.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from contextlib import contextmanager
from functools import partial

import pytest
from rq import Queue, Worker
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry
from rq.results import Result
from rq.serializers import JSONSerializer

from browser import Browser, needs_browser
from faults.harness import SMALL
from h3render.keys import RENDER_FUNC, SWEEP_JOBS_KEY, SWEEP_KEY, SWEEPS_KEY

# Every test here drives Chromium: without one each is skipped on its own, with what to install.
pytestmark = needs_browser()

MARK = "h3r-pwned"


def _js(name: str) -> str:
    return f"window.__pwned='{name}';document.title='PWNED';console.error('{MARK}-{name}')"


PAYLOADS = {
    "img": f'<img src=x onerror="{_js("img")}">',
    "script": f"</script><script>{_js('script')}</script>",
    "svg": f'"><svg onload="{_js("svg")}">',
    "jsurl": f"javascript:{_js('jsurl')}",
    "template": f"<%= (function(){{{_js('template')}}})() %>{{{{ 7*7 }}}}",
}


# ---------------------------------------------------------------- the dashboard, in this process


class Recorder:
    """WSGI middleware: every request's method, path, status and where it came from."""

    def __init__(self, app):
        self.app, self.seen, self.lock = app, [], threading.Lock()

    def __call__(self, environ, start_response):
        entry = {"method": environ["REQUEST_METHOD"], "path": environ.get("PATH_INFO", ""),
                 "origin": environ.get("HTTP_ORIGIN"), "referer": environ.get("HTTP_REFERER"),
                 "site": environ.get("HTTP_SEC_FETCH_SITE")}

        def start(status, headers, exc_info=None):
            entry["status"] = int(status.split()[0])
            with self.lock:
                self.seen.append(entry)
            return start_response(status, headers, exc_info)

        return self.app(environ, start)

    def from_origin(self, origin: str) -> list[dict]:
        with self.lock:
            return [e for e in self.seen if (e["origin"] or e["referer"] or "").startswith(origin)]


@contextmanager
def serving(app_or_handler, *, wsgi: bool = True):
    if wsgi:
        from h3render.dashboards.server import make_server

        srv = make_server(app_or_handler, "127.0.0.1", 0)
        t = threading.Thread(target=srv.serve_forever, daemon=True)
        t.start()
        try:
            yield srv.port, srv.kind
        finally:
            srv.stop()
            t.join(10)
            srv.close()
    else:
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), app_or_handler)
        t = threading.Thread(target=srv.serve_forever, daemon=True)
        t.start()
        try:
            yield srv.server_address[1], "http.server"
        finally:
            srv.shutdown()
            srv.server_close()


# ---------------------------------------------------------------- hostile Redis


def _fail(r, q: Queue, job: Job, text: str) -> None:
    """Move a job to failed the way a worker would, with `text` as its traceback and error."""
    from h3render.queue.jobstate import save_h3r

    q.remove(job)
    job.set_status(JobStatus.FAILED)
    FailedJobRegistry(queue=q).add(job, exc_string=text)
    Result.create_failure(job, ttl=3600, exc_string=text)
    save_h3r(job, state="failed", error=text, engine_error=text)


def plant(r, settings) -> dict:
    """Hostile text in every field the dashboard shows; returns what was planted where."""
    from h3render.queue.enqueue import enqueue_sweep, queue

    q = queue(r, settings)
    prompts = list(PAYLOADS.values())
    res = enqueue_sweep(r, {k: v for k, v in SMALL.items() if k != "prompt"}, {"prompt": prompts}, settings)
    jobs = {}
    for (name, text), jid in zip(PAYLOADS.items(), res.job_ids):
        job = Job.fetch(jid, connection=r, serializer=JSONSerializer)
        job.description = text
        job.meta["note"] = text
        job.save()
        _fail(r, q, job, f"Traceback (most recent call last):\n  {text}\nRuntimeError: {text}")
        jobs[name] = jid
    queued = enqueue_sweep(r, {**SMALL, "prompt": "a queued sweep"}, {"seed": [1, 2]}, settings)

    for name, text in PAYLOADS.items():
        # a queue named by the payload, holding one job described by it
        hq = Queue(text, connection=r, serializer=JSONSerializer)
        hq.enqueue_call(RENDER_FUNC, kwargs={"job": {**SMALL, "prompt": text}}, description=text,
                        job_id=f"j-xss-queue-{name}")
        # a worker named by it, whose version, Python version and hostname are the payload
        w = Worker([q, hq], connection=r, name=f"w-{name}-{text}", serializer=JSONSerializer)
        w.register_birth()
        r.hset(w.key, mapping={"hostname": text, "version": text, "python_version": text,
                               "current_job": jobs[name]})
        # a sweep whose id and axis are the payload (ids like this never pass our own checks)
        sid = f"s-{text}"
        r.sadd(SWEEPS_KEY, sid)
        r.hset(SWEEP_KEY.format(id=sid), mapping={
            "axes": json.dumps({text: [text, 1]}), "fixed": json.dumps({"prompt": text}),
            "created_at": str(time.time()), "jobs": "1"})
        r.rpush(SWEEP_JOBS_KEY.format(id=sid), jobs[name])
    return {"sweep": res.sweep_id, "jobs": jobs, "queued_sweep": queued.sweep_id,
            "queued_jobs": queued.job_ids}


@pytest.fixture(scope="module")
def world(redis_server, tmp_path_factory):
    from h3render.dashboards.app import create_app
    from h3render.settings import Settings

    r = redis_server.start()
    r.flushdb()
    settings = Settings(redis_url=redis_server.url, home=tmp_path_factory.mktemp("xss-home"), retry_max=0)
    planted = plant(r, settings)
    app = create_app(settings, redis_conn=r, redis_url=redis_server.url)
    app.config["RQ_DASHBOARD_POLL_INTERVAL"] = 500
    rec = Recorder(app.wsgi_app)
    app.wsgi_app = rec
    with serving(app) as (port, kind):
        print(f"dashboard on 127.0.0.1:{port} ({kind})")
        b = Browser()
        try:
            yield {"r": r, "settings": settings, "base": f"http://127.0.0.1:{port}", "browser": b,
                   "recorder": rec, **planted}
        finally:
            b.close()
    r.flushdb()


# ---------------------------------------------------------------- case 1: nothing runs


# Evaluated in the page: what ran, what markup got in, and what text is shown.
PAGE_CHECK = """
var found = [];
document.querySelectorAll('*').forEach(function (e) {
  for (var i = 0; i < e.attributes.length; i++) {
    var a = e.attributes[i];
    if (/^on/i.test(a.name)) { found.push(e.tagName + ' ' + a.name); }
    if (/^\\s*javascript:/i.test(a.value) && /^(href|src|action|formaction|xlink:href)$/i.test(a.name)) {
      found.push(e.tagName + ' ' + a.name + '=javascript:');
    }
  }
  if (e.tagName === 'SCRIPT' && !e.src) { found.push('inline script'); }
  if (e.tagName === 'IFRAME' || e.tagName === 'OBJECT' || e.tagName === 'EMBED') { found.push(e.tagName); }
});
var shown = [document.body.innerText];
document.querySelectorAll('[title]').forEach(function (e) { shown.push(e.getAttribute('title')); });
document.querySelectorAll('input, option').forEach(function (e) { shown.push(e.value); });
return {pwned: window.__pwned === undefined ? null : String(window.__pwned), title: document.title,
        markup: found, shown: shown.join('\\n'), cookie: document.cookie};
"""


def pages(w) -> list[tuple[str, str | None, list[str]]]:
    """(path, CSS selector that appears once the page's script has drawn, payloads it shows)."""
    everything = list(PAYLOADS)
    out = [("/", None, everything), (f"/sweeps/{w['sweep']}", None, everything), ("/workers", None, everything)]
    out += [(f"/jobs/{jid}", None, [name]) for name, jid in w["jobs"].items()]
    out += [("/rq/", "tr[data-role=queue]", everything),
            ("/rq/0/view/workers", "tr[data-role=worker]", everything),
            ("/rq/0/view/jobs", "#jobs tbody tr:not([data-role=loading-placeholder])", []),
            ("/rq/0/view/jobs/h3render/failed/8/asc/1", "tr[data-role=job]", everything),
            ("/rq/0/view/jobs/h3render/queued/8/asc/1", "tr[data-role=job]", [])]
    out += [(f"/rq/0/view/job/{jid}", "[data-field=status]:not(:empty)", [name]) for name, jid in w["jobs"].items()]
    # the payload queues' own job lists, where the name routes (a "/" in it cannot)
    from urllib.parse import quote

    out += [(f"/rq/0/view/jobs/{quote(text, safe='')}/queued/8/asc/1", "tr[data-role=job]", [name])
            for name, text in PAYLOADS.items() if "/" not in text]
    return out


def test_hostile_redis_text_runs_on_no_page(world, fault_table):
    from selenium.common.exceptions import TimeoutException

    b: Browser = world["browser"]
    b.open(world["base"] + "/")  # the CSRF cookie, before anything is checked
    tried = held = executed = 0
    problems, csp_reports = [], 0
    for path, ready, expect in pages(world):
        b.open(world["base"] + path)
        drawn = True
        if ready:
            try:
                b.wait(lambda d: d.find_elements("css selector", ready), 20, f"{path} to draw")
            except TimeoutException:
                drawn = False
        time.sleep(0.7)  # a poll or two more: what the page draws later is checked too
        got = b.js(PAGE_CHECK)
        logs = b.driver.get_log("browser")
        ran = [e["message"] for e in logs if MARK in e["message"] and "Content Security Policy" not in e["message"]
               and "Refused" not in e["message"]]
        csp_reports += sum("Content Security Policy" in e["message"] for e in logs)
        missing = [n for n in expect if PAYLOADS[n] not in got["shown"]]
        page_ok = got["pwned"] is None and got["title"] != "PWNED" and not ran and drawn
        for name in PAYLOADS:
            tried += 1
            fired = got["pwned"] == name or any(f"{MARK}-{name}" in m for m in ran)
            executed += fired
            held += (not fired) and page_ok and not got["markup"] and name not in missing
        if not page_ok or got["markup"] or missing or "h3r_csrf" in got["cookie"]:
            problems.append({"page": path, "drawn": drawn, "pwned": got["pwned"], "title": got["title"], "console": ran,
                             "markup": got["markup"][:5], "not shown literally": missing,
                             "cookie": got["cookie"]})
    n_pages = len(pages(world))
    row = fault_table("security", "hostile Redis text on every page", tried=tried, held=held, lost=executed,
                      bound="no planted text runs as script or becomes markup, on our pages and /rq",
                      note=f"{n_pages} pages x {len(PAYLOADS)} payloads; {csp_reports} CSP reports")
    assert not problems, json.dumps(problems, indent=1)
    assert row.ok, row


# ---------------------------------------------------------------- case 2: GET and other origins


def snapshot(w) -> dict:
    """What a state change would move: every planted job's status and existence, the queue,
    the failed registry and the canceled-flags."""
    r = w["r"]
    ids = list(w["jobs"].values()) + list(w["queued_jobs"])
    out = {"failed": FailedJobRegistry("h3render", connection=r).get_job_ids(cleanup=False),
           "queued": Queue("h3render", connection=r, serializer=JSONSerializer).get_job_ids(),
           "cancel_flags": sorted(k.decode() for k in r.scan_iter("h3render:cancel:*"))}
    for jid in ids:
        job = Job.fetch(jid, connection=r, serializer=JSONSerializer) if Job.exists(jid, connection=r) else None
        out[jid] = job.get_status().value if job else "gone"
    return out


def targets(w) -> list[str]:
    failed = w["jobs"]["img"]
    queued = w["queued_jobs"][0]
    return ["/rq/requeue/h3render", "/rq/queue/h3render/failed/empty", "/rq/queue/h3render/queued/empty",
            "/rq/queue/h3render/compact", f"/rq/job/{failed}/requeue", f"/rq/job/{failed}/delete",
            f"/jobs/{failed}/retry", f"/jobs/{queued}/cancel", f"/sweeps/{w['sweep']}/retry",
            f"/sweeps/{w['queued_sweep']}/cancel"]


def attack_pages(base: str, paths: list[str]) -> dict[str, str]:
    imgs = "\n".join(f'<img src="{base}{p}" alt="">' for p in paths)
    forms = "\n".join(
        f'<iframe name="f{i}"></iframe><form target="f{i}" method="post" action="{base}{p}">'
        f'<input name="csrf_token" value="forged"><input name="next" value="/"></form>'
        for i, p in enumerate(paths))
    urls = json.dumps([base + p for p in paths])
    return {
        "img.html": f"<!DOCTYPE html><title>img</title>{imgs}",
        "form.html": f"<!DOCTYPE html><title>form</title>{forms}<script>"
                     "document.querySelectorAll('form').forEach(function (f) { f.submit(); });</script>",
        "fetch.html": f"<!DOCTYPE html><title>fetch</title><script>{urls}.forEach(function (u) {{"
                      "var b = new FormData(); b.append('csrf_token', 'forged');"
                      "fetch(u, {method: 'POST', mode: 'no-cors', credentials: 'include', body: b})"
                      ".catch(function () {}); });</script>",
    }


def test_get_and_cross_origin_requests_change_nothing(world, tmp_path, fault_table):
    b: Browser = world["browser"]
    paths = targets(world)
    site = tmp_path / "attacker"
    site.mkdir()
    for name, html in attack_pages(world["base"], paths).items():
        (site / name).write_text(html)
    b.open(world["base"] + "/rq/")  # a signed-in victim: the dashboard's cookies are in the browser
    before = snapshot(world)
    assert len(before["failed"]) == len(PAYLOADS) and len(before["queued"]) == 2, before
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *a: None
    tried = held = 0
    answers = {}
    with serving(handler, wsgi=False) as (evil_port, _):
        evil = f"http://127.0.0.1:{evil_port}"
        for page in ("img.html", "form.html", "fetch.html"):
            rec = world["recorder"]
            start = len(rec.from_origin(evil))
            b.open(f"{evil}/{page}")
            b.wait(lambda d: len(rec.from_origin(evil)) - start >= len(paths), 20,
                   f"every request of {page} to reach the dashboard")
            time.sleep(0.3)
            got = rec.from_origin(evil)[start:]
            after = snapshot(world)
            for e in got:
                tried += 1
                held += e["status"] in (403, 405) and after == before
                answers[f"{page} {e['method']} {e['path']}"] = e["status"]
    after = snapshot(world)
    changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
    row = fault_table("security", "GET and cross-origin state changes", tried=tried, held=held,
                      lost=len(changed), bound="no GET and no other origin's request changes a job",
                      note=f"{len(paths)} URLs x img GET, form POST, no-cors fetch POST from another port")
    assert not changed, changed
    assert all(s in (403, 405) for s in answers.values()), answers
    assert all(answers[f"img.html GET {p}"] == 405 for p in paths), answers
    assert row.ok and tried >= 3 * len(paths), (row, answers)


# ---------------------------------------------------------------- and the buttons still work


def test_rq_buttons_post_with_their_own_token(world):
    """The same browser, on the dashboard itself: Requeue in rq's failed list and Delete on a
    job page go through (a confirm dialog, then a POST with the button's token)."""
    b: Browser = world["browser"]
    r = world["r"]
    jid, gone = world["jobs"]["svg"], world["jobs"]["template"]
    b.console_errors()  # drop what earlier pages logged (the attack pages' framing refusals)
    b.open(world["base"] + "/rq/0/view/jobs/h3render/failed/8/asc/1")
    row = f'tr[data-job-id="{jid}"]'
    b.wait(lambda d: d.find_elements("css selector", row), 20, "the failed list")
    b.one(f"{row} button.btn-outline-warning").click()  # Requeue: no confirm
    b.wait(lambda d: Job.fetch(jid, connection=r, serializer=JSONSerializer).get_status() == JobStatus.QUEUED,
           20, "the job to be requeued")
    assert Job.fetch(jid, connection=r, serializer=JSONSerializer).meta["h3r"]["state"] == "queued"
    b.open(f"{world['base']}/rq/0/view/job/{gone}")
    b.wait(lambda d: d.find_elements("css selector", "[data-field=status]:not(:empty)"), 20, "the job page")
    b.one("#delete-job-btn").click()
    b.wait(lambda d: d.switch_to.alert, 10, "the confirm dialog").accept()
    b.wait(lambda d: not Job.exists(gone, connection=r), 20, "the job to be deleted")
    b.wait(lambda d: d.find_elements("css selector", "table#queues tr[data-role=queue]"), 20, "the queues page")
    assert "h3r_csrf" not in b.js("return document.cookie")
    assert not [e for e in b.console_errors() if "Content Security Policy" in e["message"]]
