"""The dashboard in a real headless Chromium, against a real Redis holding a real sweep.

The module renders one sweep of the built-in tiny model (64x64, 17 frames) with a
real burst worker (`h3render worker --burst`, rq SpawnWorker, the C engine): seed
1,2 x steps 2,3, where the (seed=2, steps=3) job carries the engine's gated crash
trigger, so the sweep ends with 3 finished jobs and 1 failed (SIGSEGV in a step).
Then `h3render dashboard` serves it and Chromium (Debian's chromium +
chromium-driver through selenium) opens every page, checks the grid, plays a clip,
clicks Retry, follows a running job live and cancels it.

Screenshots of each page go to a temporary folder; to refresh the ones docs/DASHBOARD.md
shows, run with H3RENDER_SCREENSHOTS=<repo>/docs/screenshots.

Slow: about 1-2 minutes on 2 shared cores (each job is a fresh Python process).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from redis_fixture import free_port
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from browser import Browser, needs_browser
from faults.harness import wait_for

REPO = Path(__file__).resolve().parents[1]
# Not docs/screenshots by default: a test run must not rewrite committed files.
SHOTS = Path(os.environ.get("H3RENDER_SCREENSHOTS") or Path(tempfile.gettempdir()) / "h3render-screenshots")
CLI = "import sys; from h3render.cli import main; sys.argv[0] = 'h3render'; main()"
DASH = "import sys; from h3render.cli.dashboard import dashboard; sys.argv[0] = 'h3render dashboard'; dashboard()"
PROMPT = 'a red <b>ball</b> & "quotes" <script>window.__pwned = 1</script><img src=x onerror="window.__pwned=1">'
SMALL = {"prompt": PROMPT, "model": "tiny-wan", "width": 64, "height": 64, "frames": 17}
AXES = {"seed": [1, 2], "steps": [2, 3]}
CRASH_AT = (2, 3)  # (seed, steps) of the job that crashes

pytestmark = pytest.mark.slow


# Each test that drives Chromium is skipped on its own, with what to install, when there
# is none; the others (plain HTTP) run regardless.
BROWSER = needs_browser()


def fetch(r, job_id) -> Job:
    return Job.fetch(job_id, connection=r, serializer=JSONSerializer)


class World:
    """The rendered sweep, the dashboard serving it, and what the tests need to reach both."""

    def __init__(self, r, settings, env, sweep_id, job_ids, base):
        self.r, self.settings, self.env = r, settings, env
        self.sweep_id, self.job_ids, self.base = sweep_id, job_ids, base

    def params(self, job_id: str) -> dict:
        return fetch(self.r, job_id).kwargs["job"]

    def failed_id(self) -> str:
        return next(j for j in self.job_ids if (self.params(j)["seed"], self.params(j)["steps"]) == CRASH_AT)

    def start_worker(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", CLI, "worker", *args], env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def stop(p: subprocess.Popen) -> str:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)
    return p.stdout.read() if p.stdout else ""


@pytest.fixture(scope="module")
def world(redis_server, tmp_path_factory):
    from h3render.queue.enqueue import enqueue_sweep_planned, plan
    from h3render.queue.sweep import expand
    from h3render.settings import Settings

    r = redis_server.start()
    r.flushdb()
    home = tmp_path_factory.mktemp("dash-home")
    settings = Settings(redis_url=redis_server.url, home=home, retry_max=0)
    import h3render
    from h3render.engine.binding import library_path

    env = dict(os.environ)
    # The subprocesses import the same h3render as this process (installed, or the source tree)
    # and load the same engine library.
    pkg_root = Path(h3render.__file__).resolve().parents[1]
    if library_path().is_file():
        env["H3RENDER_LIB"] = str(library_path())
    env.update(PYTHONPATH=str(pkg_root) + os.pathsep + env.get("PYTHONPATH", ""), H3RENDER_HOME=str(home),
               H3RENDER_REDIS_URL=redis_server.url, H3RENDER_RETRY_MAX="0", H3RENDER_GATE_POLL_S="1",
               H3RENDER_ENABLE_TEST_TRIGGERS="1")
    # A real sweep through the queue API; one job gets the engine's test trigger (a crash at
    # step 1), which a sweep's fixed fields cannot give a single job, so it is set on the plan.
    old = os.environ.get("H3RENDER_HOME")
    os.environ["H3RENDER_HOME"] = str(home)
    try:
        planned = plan(r, expand(SMALL, AXES), settings)
        for p in planned:
            if (p.job.seed, p.job.steps) == CRASH_AT:
                p.job = p.job.model_copy(update={"engine_options": {"test_crash_at_step": 1}})
        res = enqueue_sweep_planned(r, planned, SMALL, AXES, settings, preview=False)
    finally:
        if old is None:
            os.environ.pop("H3RENDER_HOME", None)
        else:
            os.environ["H3RENDER_HOME"] = old
    t = time.time()
    out = subprocess.run([sys.executable, "-c", CLI, "worker", "--burst"], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    print(f"rendered the sweep in {time.time() - t:.1f} s")
    states = {j: fetch(r, j).get_status() for j in res.job_ids}
    assert sorted(s.value for s in states.values()) == ["failed", "finished", "finished", "finished"], states

    port = free_port()
    dash = subprocess.Popen([sys.executable, "-c", DASH, "--port", str(port)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"

    def up():
        try:
            return urllib.request.urlopen(base + "/", timeout=2).status == 200
        except (urllib.error.URLError, OSError):
            assert dash.poll() is None, dash.stdout.read()
            return False

    try:
        wait_for(up, 60, "the dashboard to answer", every=0.3)
        yield World(r, settings, env, res.sweep_id, res.job_ids, base)
    finally:
        print(stop(dash)[-3000:])


@pytest.fixture(scope="module")
def browser(world):
    b = Browser()
    yield b
    b.close()


def visit(browser: Browser, url: str, shot: str | None = None) -> None:
    """Open a page, check it has no console errors, optionally save a screenshot."""
    browser.open(url)
    errors = browser.console_errors()
    assert not errors, f"console errors on {url}: {json.dumps(errors, indent=1)}"
    assert browser.js("return window.__pwned === undefined"), "prompt text ran as script"
    if shot:
        size = browser.screenshot(SHOTS / shot)
        assert 0 < size <= 300 * 1024, (shot, size)


# ---------------------------------------------------------------- pages


@BROWSER
def test_sweeps_list(world, browser):
    visit(browser, world.base + "/", "sweeps.png")
    row = browser.one(f'tr.sweep-row[data-sweep-id="{world.sweep_id}"]')
    text = row.text
    assert "3 finished" in text and "1 failed" in text and "4 / 4" in text
    assert "seed × 2" in text and "steps × 2" in text
    prompt = row.find_element("css selector", ".prompt")
    assert prompt.text == PROMPT  # shown literally, as text
    assert prompt.find_elements("css selector", "b, script") == []  # never as markup


@BROWSER
def test_sweep_grid_has_one_cell_per_job_with_axis_labels(world, browser):
    visit(browser, f"{world.base}/sweeps/{world.sweep_id}", "sweep-grid.png")
    assert [th.text for th in browser.css("th.col-label")] == ["steps=2", "steps=3"]
    assert [th.text for th in browser.css("th.row-label")] == ["seed=1", "seed=2"]
    cells = browser.css(".cell[data-job-id]")
    assert sorted(c.get_attribute("data-job-id") for c in cells) == sorted(world.job_ids)
    for c in cells:
        p = world.params(c.get_attribute("data-job-id"))
        assert c.get_attribute("data-row") == f"seed={p['seed']}"
        assert c.get_attribute("data-col") == f"steps={p['steps']}"
        # the cell sits in its row and column: row header of its <tr>, column header by index
        col_index = browser.js("return arguments[0].closest('td').cellIndex", c)
        row_head = browser.js("return arguments[0].closest('tr').querySelector('th').textContent", c)
        assert row_head.strip() == f"seed={p['seed']}"
        assert browser.css("thead th")[col_index].text == f"steps={p['steps']}"
    failed = browser.one(f'.cell[data-job-id="{world.failed_id()}"]')
    assert failed.get_attribute("data-state") == "failed"
    assert "SIGSEGV" in failed.find_element("css selector", ".reason").text
    assert failed.find_elements("css selector", "button.retry")
    finished = [c for c in cells if c.get_attribute("data-state") == "finished"]
    assert len(finished) == 3
    for c in finished:
        stats = c.find_element("css selector", ".stats").text
        assert re.fullmatch(r"[\d.]+ (ms|s) \S \d+ MiB", stats), stats  # render time and peak memory


@BROWSER
def test_clip_plays_on_hover(world, browser):
    from selenium.webdriver.common.action_chains import ActionChains

    browser.open(f"{world.base}/sweeps/{world.sweep_id}")
    video = browser.css(".cell[data-state=finished] video.clip")[0]
    assert browser.js("return arguments[0].paused", video)
    ActionChains(browser.driver).move_to_element(video).perform()
    browser.wait(lambda d: d.execute_script("return arguments[0].currentTime > 0 && !arguments[0].paused "
                                            "&& arguments[0].videoWidth === 64", video), 20, "the clip to play")
    # away from the clip onto the page heading: a fixed offset can leave the window
    ActionChains(browser.driver).move_to_element(browser.css("h1, h2")[0]).perform()
    browser.wait(lambda d: d.execute_script("return arguments[0].paused", video), 10, "the clip to pause")
    assert browser.console_errors() == []


@BROWSER
def test_layout_picker_swaps_rows_and_columns(world, browser):
    from selenium.webdriver.support.ui import Select

    browser.open(f"{world.base}/sweeps/{world.sweep_id}")
    Select(browser.one("select[name=side_seed]")).select_by_value("cols")
    browser.wait(lambda d: "side_seed=cols" in d.current_url, 20, "the picker to submit")
    # seed moved to the columns; steps, left alone, keeps the rows it was given by default
    browser.wait(lambda d: [t.text for t in browser.css("th.col-label")] == ["seed=1", "seed=2"], 20, "new layout")
    assert [t.text for t in browser.css("th.row-label")] == ["steps=2", "steps=3"]
    assert len(browser.css(".cell[data-job-id]")) == 4
    browser.open(f"{world.base}/sweeps/{world.sweep_id}?pages=seed&cols=steps&rows=")
    assert [a.text for a in browser.css("nav.pages a")] == ["seed=1", "seed=2"]
    assert len(browser.css(".cell[data-job-id]")) == 2
    assert browser.console_errors() == []


@BROWSER
def test_job_page(world, browser):
    jid = next(j for j in world.job_ids if j != world.failed_id())
    visit(browser, f"{world.base}/jobs/{jid}", "job.png")
    params = {tr.find_element("css selector", "th").text: tr.find_element("css selector", "td").text
              for tr in browser.css("table.params tr")}
    p = world.params(jid)
    for k in ("seed", "steps", "width", "height", "frames", "sampler", "quant", "model"):
        assert params[k] == str(p[k]), (k, params[k], p[k])
    assert params["prompt"] == PROMPT
    engine = {tr.find_element("css selector", "th").text for tr in browser.css("table.engine tr")}
    assert {"engine", "abi", "quant_levels"} <= engine, engine
    timings = browser.one("table.timings").text
    for phase in ("load", "denoise", "decode", "write", "peak memory"):
        assert phase in timings
    charts = browser.css("svg.chart")
    assert [c.get_attribute("aria-label") for c in charts] == ["memory", "memory pressure", "thermal", "power"]
    assert browser.css("svg.chart path.line, svg.chart circle")  # at least one sample drawn
    log = browser.one("pre.log").text
    assert "started on" in log and "finished:" in log
    assert browser.js("return document.querySelector('video.big').readyState >= 1")


@BROWSER
def test_failed_job_page(world, browser):
    visit(browser, f"{world.base}/jobs/{world.failed_id()}", "job-failed.png")
    assert "SIGSEGV" in browser.one(".summary .reason").text
    assert "failed:" in browser.one("pre.log").text
    assert browser.css(".actions button.retry") and not browser.css(".actions button.cancel")


@BROWSER
def test_worker_page(world, browser):
    visit(browser, world.base + "/workers", "workers.png")
    host = os.uname().nodename
    section = browser.one(f'section.host[data-host="{host}"]')
    assert "gate open" in section.text
    assert "available" in section.text
    assert len(section.find_elements("css selector", "svg.chart")) == 4
    n = world.r.llen(f"h3render:health:{host}:history")
    assert f"History ({n} readings)" in section.text


@BROWSER
def test_rq_dashboard_answers(world, browser):
    visit(browser, world.base + "/rq/", "rq.png")
    browser.wait(lambda d: "h3render" in d.find_element("css selector", "body").text, 20, "queue list")
    browser.open(f"{world.base}/rq/0/view/jobs/h3render/failed/8/asc/1")
    browser.wait(lambda d: world.failed_id() in d.find_element("css selector", "body").text, 20,
                 "the failed job in rq-dashboard's list")
    assert browser.console_errors() == []
    # its job view puts the description (with our prompt) into the page as HTML: escaped by the app
    browser.open(f"{world.base}/rq/0/view/job/{world.failed_id()}")
    browser.wait(lambda d: "<b>ball</b>" in d.find_element("css selector", "body").text, 20,
                 "the job's description as text")
    assert browser.css(".description-scroll b, .description-scroll img") == []
    assert browser.js("return window.__pwned === undefined")
    assert browser.console_errors() == []


# ---------------------------------------------------------------- actions


def test_post_without_csrf_is_refused(world):
    jid = world.failed_id()
    req = urllib.request.Request(f"{world.base}/jobs/{jid}/retry", data=b"next=/", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 403
    assert b"CSRF" in e.value.read()
    assert fetch(world.r, jid).get_status() == JobStatus.FAILED  # nothing changed


@BROWSER
def test_retry_failed_job_from_the_grid(world, browser):
    jid = world.failed_id()
    browser.open(f"{world.base}/sweeps/{world.sweep_id}")
    browser.one(f'.cell[data-job-id="{jid}"] button.retry').click()
    browser.wait(lambda d: d.find_elements("css selector", ".flash.ok"), 20, "the retry confirmation")
    assert jid in browser.one(".flash.ok").text
    job = fetch(world.r, jid)
    assert job.get_status() == JobStatus.QUEUED
    assert jid in world.r.lrange("rq:queue:h3render", 0, -1)[-1].decode()
    assert job.meta["h3r"]["state"] == "queued" and job.meta["h3r"]["attempts"][-1]["state"] == "failed"
    cell = browser.one(f'.cell[data-job-id="{jid}"]')
    assert cell.get_attribute("data-state") == "queued"
    assert browser.console_errors() == []


@BROWSER
def test_running_job_is_live_and_cancel_stops_it(world, browser):
    from h3render.queue.enqueue import enqueue_sweep

    # 160x160x33 (900 tokens, ~11x the small jobs) so 1000 steps outlast the clicks below
    long = {**SMALL, "prompt": "a long render", "steps": 1000, "width": 160, "height": 160, "frames": 33}
    res = enqueue_sweep(world.r, long, {"seed": [7, 8]}, world.settings)
    worker = world.start_worker("--burst")
    try:
        jid = res.job_ids[0]
        wait_for(lambda: (fetch(world.r, jid).meta.get("h3r", {}).get("step") or 0) >= 3, 180, "denoising")
        browser.open(f"{world.base}/sweeps/{res.sweep_id}")
        cell = browser.one(f'.cell[data-job-id="{jid}"]')
        assert cell.get_attribute("data-state") == "denoising"
        browser.js("window.__same_page = true")
        first = cell.find_element("css selector", ".live-text").text
        assert first.startswith("step ") and "/ 1000" in first
        browser.wait(lambda d: cell.find_element("css selector", ".live-text").text != first, 20,
                     "the progress text to move")
        assert browser.js("return window.__same_page === true")  # updated in place, no reload
        browser.screenshot(SHOTS / "sweep-running.png")
        browser.open(f"{world.base}/jobs/{jid}")
        assert browser.one(".summary .live-text").text.startswith("step ")
        browser.one(".actions button.cancel").click()
        browser.wait(lambda d: d.find_elements("css selector", ".flash.ok"), 20, "the cancel confirmation")
        wait_for(lambda: fetch(world.r, jid).get_status() == JobStatus.CANCELED, 60, "the job to stop")
        m = fetch(world.r, jid).meta["h3r"]
        assert m["state"] == "canceled" and m["step"] < 1000  # stopped, did not run out
        assert browser.console_errors() == []
        from h3render.queue import control

        control.cancel_sweep(world.r, res.sweep_id)  # the second long job, still queued
        worker.wait(timeout=120)
    finally:
        out = stop(worker)
    assert worker.returncode == 0, out[-3000:]
