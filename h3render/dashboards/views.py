"""The dashboard's pages, actions and JSON for live updates.

    GET  /                          sweeps list (and recent single jobs)
    GET  /sweeps/<id>               the X/Y grid (?rows=a,b&cols=c&pages=d&page=N), a window of
                                    at most data.MAX_CELLS cells (&rpart=N&cpart=M)
    GET  /jobs/<id>                 one job: parameters, engine, timings, health plot, log
    GET  /workers                   each host's gate now, its rq workers, a history plot
    POST /jobs/<id>/retry|cancel    (CSRF) via h3render.queue.control
    POST /sweeps/<id>/retry|cancel  (CSRF) retry failed jobs / cancel the rest
    GET  /media/<job>/<name>        video.mp4, poster.png, meta.json of a job (Range requests)
    GET  /api/sweeps/<id>.json, /api/jobs/<id>.json   progress for the pages' scripts; a sweep's
                                    takes ?since=T and answers only the jobs changed after T
"""

from __future__ import annotations

import math
import time
from urllib.parse import urlsplit

from flask import Blueprint, abort, flash, jsonify, redirect, render_template, request, send_file, url_for

from h3render.dashboards import charts, data
from h3render.dashboards.context import state
from h3render.dashboards.grid import LayoutError, choose_layout, label
from h3render.dashboards.plots import Series, bar_segments
from h3render.queue import control
from h3render.queue import status as st
from h3render.queue import sweepstatus
from h3render.queue.errors import NotFoundError
from h3render.queue.job import JobPhase

bp = Blueprint("dash", __name__)
ID_RE = r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}"
TERMINAL = {p.value for p in JobPhase if p.terminal}


@bp.app_errorhandler(NotFoundError)
def _not_found(e: NotFoundError):
    return render_template("error.html", code=404, title="Not found", message=str(e)), 404


@bp.app_errorhandler(404)
def _404(e):
    return render_template("error.html", code=404, title="Not found",
                           message=f"No page at {request.path}."), 404


def _check_id(ident: str) -> str:
    import re

    if not re.fullmatch(ID_RE, ident):
        abort(404)
    return ident


# ---------------------------------------------------------------- pages


@bp.get("/")
def sweeps():
    s = state()
    infos = data.all_sweeps(s.r)
    singles = [i for i in data.job_items(s.r, st.recent_job_ids(s.r, s.settings, limit=30)) if not i.row.sweep_id]
    live = any(info.live for info in infos) or any(i.row.state not in TERMINAL for i in singles)
    return render_template("sweeps.html", sweeps=infos, singles=singles, live=live, now=time.time())


def _split(name: str) -> list[str]:
    return [x for x in request.args.get(name, "").split(",") if x]


def _int_arg(name: str) -> int:
    try:
        return int(request.args.get(name, "0"))
    except ValueError:
        return 0


@bp.get("/sweeps/<sweep_id>")
def sweep(sweep_id: str):
    s = state()
    info = data.sweep_info(s.r, _check_id(sweep_id))
    names = info.axis_names
    rows, cols, pages = _split("rows"), _split("cols"), _split("pages")
    for a in names:  # the picker form sends side_<axis>=rows|cols|pages
        side = request.args.get(f"side_{a}")
        if side in ("rows", "cols", "pages") and a not in rows + cols + pages:
            {"rows": rows, "cols": cols, "pages": pages}[side].append(a)
    error = None
    try:
        layout = choose_layout(names, rows, cols, pages)
    except LayoutError as e:
        error = str(e)
        layout = choose_layout(names)
    win = data.sweep_view(s.r, info, layout, _int_arg("page"), _int_arg("rpart"), _int_arg("cpart"))
    grid = win.grid
    base = {"rows": ",".join(layout.rows), "cols": ",".join(layout.cols), "pages": ",".join(layout.pages)}
    page_links = [url_for("dash.sweep", sweep_id=info.id, **base, page=i) for i in range(len(grid.page_keys))]

    def part_link(rpart: int, cpart: int) -> str:
        return url_for("dash.sweep", sweep_id=info.id, **base, page=grid.page, rpart=rpart, cpart=cpart)

    return render_template("sweep.html", info=info, grid=grid, win=win, part_link=part_link, layout=layout,
                           names=names, values=data.grid_values(info), page_links=page_links, error=error,
                           live=info.live, label=label,
                           live_url=url_for("dash.sweep_json", sweep_id=info.id,
                                            since=repr(info.state.next_since())),
                           here=request.full_path.rstrip("?"))


@bp.get("/jobs/<job_id>")
def job(job_id: str):
    s = state()
    d = data.job_detail(s.r, s.settings, _check_id(job_id))
    item = d.item
    timings = dict(item.meta.get("timings") or d.meta_json.get("timings_s") or {})
    phases = [(k, float(timings[k])) for k in charts.PHASES if isinstance(timings.get(k), (int, float))]
    t0, t1 = data.job_window(item)
    samples = list(d.health) + [x for x in (d.meta_json.get("health") or []) if isinstance(x, dict)]
    extra = []
    if item.peak_rss and t0 is not None:
        extra.append(Series("render peak RSS", [(t1, item.peak_rss / charts.GIB)]))
    est_bytes = (item.meta.get("estimate") or {}).get("bytes")
    if isinstance(est_bytes, (int, float)) and t0 is not None:
        extra.append(Series("admission estimate", [(t0, est_bytes / charts.GIB), (t1, est_bytes / charts.GIB)]))
    pauses = [charts.Band(p["start"], p.get("end") or t1, f"paused: {p.get('reason')}", "#fdba74")
              for p in item.meta.get("pauses") or [] if isinstance(p, dict) and isinstance(p.get("start"), (int, float))]
    plots = []
    if t0 is not None:
        times = [x["time"] for x in samples if isinstance(x.get("time"), (int, float))]
        x0, x1 = min([t0, *times]), max([t1, *times])
        markers = [charts.Marker(t0, "job started"), *charts.phase_markers(t0, timings)]
        plots = charts.health_charts(samples, x0, x1, extra, pauses, markers,
                                     f"seconds from {time.strftime('%H:%M:%S', time.localtime(x0))}")
    steps = d.meta_json.get("step_times_s") or []
    return render_template("job.html", d=d, item=item, params=item.params, meta=item.meta,
                           timings=timings, bar=bar_segments(phases), plots=plots, n_samples=len(samples),
                           steps=steps, live=item.row.state not in TERMINAL,
                           live_url=url_for("dash.job_json", job_id=item.id),
                           here=request.path)


@bp.get("/workers")
def workers():
    s = state()
    hosts = data.worker_hosts(s.r)
    plots = {}
    now = time.time()
    for h in hosts:
        if h.history:
            t0 = float(h.history[0]["time"])
            plots[h.host] = charts.health_charts(h.history, t0, max(now, t0 + 1), x_label=(
                f"seconds from {time.strftime('%H:%M:%S', time.localtime(t0))}"))
    return render_template("workers.html", hosts=hosts, plots=plots, now=now)


# ---------------------------------------------------------------- actions (POST + CSRF)


def _back(default: str):
    nxt = request.form.get("next", "")
    p = urlsplit(nxt)
    if nxt.startswith("/") and not nxt.startswith("//") and not p.scheme and not p.netloc:
        return redirect(nxt, code=303)
    return redirect(default, code=303)


def _report(what: str, outcome: control.Outcome) -> None:
    if outcome.done:
        flash(f"{what}: {len(outcome.done)} job(s): {', '.join(outcome.done[:10])}"
              f"{' ...' if len(outcome.done) > 10 else ''}", "ok")
    for jid, why in list(outcome.skipped.items())[:10]:
        flash(f"{what} skipped {jid}: {why}", "warn")
    if not outcome.done and not outcome.skipped:
        flash(f"{what}: nothing to do", "warn")


@bp.post("/jobs/<job_id>/retry")
def job_retry(job_id: str):
    s = state()
    _report("retried", control.retry(s.r, _check_id(job_id), s.settings))
    return _back(url_for("dash.job", job_id=job_id))


@bp.post("/jobs/<job_id>/cancel")
def job_cancel(job_id: str):
    s = state()
    _report("cancel requested", control.cancel(s.r, _check_id(job_id)))
    return _back(url_for("dash.job", job_id=job_id))


@bp.post("/sweeps/<sweep_id>/retry")
def sweep_retry(sweep_id: str):
    s = state()
    _report("retried", control.retry_sweep(s.r, _check_id(sweep_id), s.settings, failed_only=True))
    return _back(url_for("dash.sweep", sweep_id=sweep_id))


@bp.post("/sweeps/<sweep_id>/cancel")
def sweep_cancel(sweep_id: str):
    s = state()
    _report("cancel requested", control.cancel_sweep(s.r, _check_id(sweep_id)))
    return _back(url_for("dash.sweep", sweep_id=sweep_id))


# ---------------------------------------------------------------- media and JSON


@bp.get("/media/<job_id>/<name>")
def media(job_id: str, name: str):
    s = state()
    if name not in data.MEDIA_NAMES:
        abort(404)
    items = data.job_items(s.r, [_check_id(job_id)])
    path = data.media_file(s.settings, items[0], name) if items else None
    if path is None:
        abort(404)
    resp = send_file(path, conditional=True, max_age=0)
    resp.headers["Cache-Control"] = "private, no-cache"
    return resp


def _row_json(i: data.JobItem) -> dict:
    return {"id": i.id, "state": i.row.state, "step": i.row.step, "steps": i.row.steps,
            "progress": i.row.progress, "eta_s": i.row.eta_s,
            "phase": None if i.row.state == JobPhase.abandoned.value else i.phase,  # its last phase is over
            "error": i.row.error, "peak_rss": i.peak_rss, "render_s": i.render_s}


@bp.get("/api/sweeps/<sweep_id>.json")
def sweep_json(sweep_id: str):
    """Counts and rows for the sweep page's polling. ?since=T (the next_since of the previous
    answer): `jobs` holds only the jobs whose state changed after T; without it, every job.
    `live` holds the running and abandoned jobs not in `jobs` (their progress moves without
    a state change)."""
    s = state()
    since = None
    if "since" in request.args:
        text = request.args["since"]
        try:
            since = float(text)
        except ValueError:
            since = math.nan
        if not math.isfinite(since):
            return jsonify(error=f"since={text[:40]!r}: not a time; give a number of seconds since the epoch, "
                                 "the next_since of the previous answer (e.g. since=0 for every change)"), 400
    p = sweepstatus.poll(s.r, _check_id(sweep_id), since)
    return jsonify(sweep_id=sweep_id, summary=p.state.summary, since=since, next_since=p.next_since,
                   jobs=[_read_json(j) for j in p.changed], live=[_read_json(j) for j in p.live])


def _read_json(j: st.JobRead) -> dict:
    return _row_json(data.JobItem(j.row, {}, j.meta))


@bp.get("/api/jobs/<job_id>.json")
def job_json(job_id: str):
    s = state()
    items = data.job_items(s.r, [_check_id(job_id)])
    if not items:
        raise NotFoundError(f"job {job_id!r} not found")
    return jsonify(_row_json(items[0]))


@bp.get("/favicon.ico")
def favicon():
    return redirect(url_for("static", filename="favicon.ico"), code=301)
