"""rq-dashboard 0.9.0 under /rq: nothing read from Redis runs as script, and no GET changes state.

    install(app, redis_url)   mount the blueprint, replace the views below, refuse GET on the rest

rq-dashboard's own pages insert Redis text (queue names, worker names and versions, job
descriptions, metadata, tracebacks) into the page as HTML through underscore's `<%= %>`,
from templates compiled with `new Function` inside inline scripts: none of that can run
under our Content-Security-Policy (script-src 'self', no 'unsafe-eval'). So every page
template it renders is overridden in templates/rq_dashboard/ (base, navbar, queues,
workers, jobs, job) with no inline script and no template strings; static/rqdash.js
fetches the same JSON and builds every row with textContent. Its JSON stays raw data.

Every route of rq_dashboard/web.py, and what happens to it here:

    kept, GET, read only    queues_overview, workers_overview, jobs_overview, list_queues,
                            job_info, favicon, static
    kept, JSON extended     list_jobs: each job gets the URL and CSRF token of its
                            requeue and delete actions (the buttons rqdash.js builds); its
                            helper get_queue_registry_jobs_count is swapped for one that
                            lists a record that does not parse as such, where rq-dashboard's
                            failed the whole list (one bad created_at: a 500 for every job)
    kept, guarded           job_info: a record that does not parse answers with the reason
    replaced                job_view, list_workers: rq-dashboard reads the job (and a
                            worker's current job) with rq's default serializer, pickle
    replaced, POST only     delete_job_view, empty_queue (pickle, as above),
                            requeue_job_view, requeue_all (also took GET): a requeue goes
                            through h3render.queue.control.retry, failed jobs only
    kept, POST only         compact_queue
    any other endpoint      POST only: a route a later rq-dashboard adds is refused on GET
                            (405) until it is looked at and listed in READ_ONLY

Every POST also passes the app's CSRF check (app._check_csrf) before it gets here.
"""

from __future__ import annotations

from flask import Flask, Response, current_app, jsonify, render_template, request, url_for
from rq import Worker
from rq.exceptions import NoSuchJobError
from rq.job import Job
from rq.registry import (
    CanceledJobRegistry,
    DeferredJobRegistry,
    FailedJobRegistry,
    FinishedJobRegistry,
    ScheduledJobRegistry,
    StartedJobRegistry,
)
from rq.serializers import JSONSerializer

from h3render.dashboards.app import RQ_PREFIX, csrf_token, method_not_allowed, state
from h3render.queue.errors import NotFoundError

BP = "rq_dashboard"
# The only rq-dashboard endpoints a GET may reach; each reads and changes nothing.
READ_ONLY = frozenset(f"{BP}.{name}" for name in (
    "queues_overview", "workers_overview", "jobs_overview", "job_view", "list_queues", "list_jobs",
    "job_info", "list_workers", "favicon", "static"))
REGISTRIES = {"failed": FailedJobRegistry, "deferred": DeferredJobRegistry, "started": StartedJobRegistry,
              "finished": FinishedJobRegistry, "canceled": CanceledJobRegistry,
              "scheduled": ScheduledJobRegistry}
# The rq-dashboard templates overridden in templates/rq_dashboard/ (its own would run inline scripts).
TEMPLATES = ("base.html", "navbar.html", "queues.html", "workers.html", "jobs.html", "job.html")


def install(app: Flask, redis_url: str) -> None:
    import rq_dashboard
    import rq_dashboard.web as web
    from rq_dashboard.web import config as rq_config
    from rq_dashboard.web import setup_rq_connection

    app.config.setdefault("RQ_DASHBOARD_POLL_INTERVAL", 2500)
    app.config["RQ_DASHBOARD_REDIS_URL"] = redis_url  # before setup_rq_connection, which reads it
    rq_config.serializer = JSONSerializer
    app.register_blueprint(rq_dashboard.blueprint, url_prefix=RQ_PREFIX)
    setup_rq_connection(app)
    views = app.view_functions
    views[f"{BP}.job_view"] = job_view
    views[f"{BP}.list_workers"] = list_workers
    views[f"{BP}.delete_job_view"] = delete_job
    views[f"{BP}.empty_queue"] = empty_queue
    views[f"{BP}.requeue_job_view"] = requeue_job
    views[f"{BP}.requeue_all"] = requeue_all
    original_list_jobs = views[f"{BP}.list_jobs"]
    views[f"{BP}.list_jobs"] = lambda **kw: list_jobs(original_list_jobs, **kw)
    original_job_info = views[f"{BP}.job_info"]
    views[f"{BP}.job_info"] = lambda **kw: job_info(original_job_info, **kw)
    web.get_queue_registry_jobs_count = registry_jobs
    # The app registers post_only as a request hook after its authentication.


def post_only() -> Response | None:
    """405 for anything but POST on an rq-dashboard endpoint that is not known to be read only."""
    endpoint = request.endpoint or ""
    if not endpoint.startswith(BP + ".") or endpoint in READ_ONLY or request.method == "POST":
        return None
    return method_not_allowed(["POST"])


def _json(doc: dict):
    return jsonify(doc), {"Cache-Control": "no-store"}


def _conn():
    return current_app.redis_conn


def _fetch(job_id: str) -> Job:
    return Job.fetch(job_id, connection=_conn(), serializer=JSONSerializer)


# ---------------------------------------------------------------- pages and JSON


def job_view(instance_number: int, job_id: str):
    from rq_dashboard.web import escape_format_instance_list, rq_dashboard_version, rq_version

    if not Job.exists(job_id, connection=_conn()):
        raise NotFoundError(f"job {job_id!r} not found (wrong id, or its record expired)")
    enable_delete = not current_app.config.get("RQ_DASHBOARD_DISABLE_DELETE")
    body = render_template(
        "rq_dashboard/job.html", current_instance=instance_number, id=job_id,
        instance_list=escape_format_instance_list(current_app.config.get("RQ_DASHBOARD_REDIS_URL")),
        rq_url_prefix=url_for(f"{BP}.queues_overview"), rq_dashboard_version=rq_dashboard_version,
        rq_version=rq_version, deprecation_options_usage=current_app.config.get("DEPRECATED_OPTIONS", False),
        enable_delete=enable_delete, active_tab="jobs",
        requeue_url=url_for(f"{BP}.requeue_job_view", job_id=job_id),
        delete_url=url_for(f"{BP}.delete_job_view", job_id=job_id))
    return Response(body, 200, {"Cache-Control": "no-store"})


def _current_job(w: Worker):
    from rq_dashboard.web import serialize_current_job

    jid = w.get_current_job_id()
    if not jid:
        return "idle"
    try:
        return serialize_current_job(w.get_current_job())
    except Exception as e:  # a job record that does not parse still leaves the worker listed
        return {"job_id": jid, "description": None, "created_at": None,
                "call_string": f"(job record unreadable: {type(e).__name__}: {e})"}


def list_workers(instance_number: int):
    workers = [dict(name=w.name, pid=w.pid, queues=[q.name for q in w.queues], state=str(w.get_state()),
                    current_job=_current_job(w), last_heartbeat=w.last_heartbeat, birth_date=w.birth_date,
                    successful_job_count=w.successful_job_count, failed_job_count=w.failed_job_count,
                    total_working_time=w.total_working_time, version=getattr(w, "version", ""),
                    python_version=getattr(w, "python_version", ""), hostname=w.hostname)
               for w in Worker.all(connection=_conn(), serializer=JSONSerializer)]
    workers.sort(key=lambda w: (w["state"], w["queues"], w["name"]))
    return _json({"workers": workers})


def list_jobs(original, **kw):
    doc = original.__wrapped__(**kw)  # rq-dashboard's view before its jsonify decorator
    delete = not current_app.config.get("RQ_DASHBOARD_DISABLE_DELETE")
    for j in doc.get("jobs") or []:
        urls = {"requeue": url_for(f"{BP}.requeue_job_view", job_id=j["id"])}
        if delete:
            urls["delete"] = url_for(f"{BP}.delete_job_view", job_id=j["id"])
        j["actions"] = {name: {"url": u, "token": csrf_token(u)} for name, u in urls.items()}
    return _json(doc)


def _unreadable(job_id: str, e: Exception) -> dict:
    why = f"job record unreadable: {type(e).__name__}: {e}"
    return {"id": job_id, "status": "unreadable", "description": why, "exc_info": None, "created_at": None,
            "enqueued_at": None, "started_at": None, "ended_at": None, "origin": None, "result": None,
            "metadata": "{}"}


def registry_jobs(queue_name, registry_name, offset, per_page, order, connection):
    """rq-dashboard's get_queue_registry_jobs_count, one job at a time: (total, serialized jobs)."""
    from rq import Queue
    from rq_dashboard.web import serialize_job

    queue = Queue(queue_name, serializer=JSONSerializer, connection=connection)
    if registry_name == "queued":
        total = queue.count
    elif registry_name in REGISTRIES:
        registry = REGISTRIES[registry_name](queue_name, connection=connection)
        total = registry.get_job_count(cleanup=False)
    else:
        return 0, []
    # rows [first, last] of the page, counted from the end for "dsc"
    if order == "dsc":
        last = total - offset - 1
        first = max(0, last - per_page + 1)
    else:
        first, last = offset, offset + per_page - 1
    if last < first:
        ids = []
    elif registry_name == "queued":
        ids = queue.get_job_ids(first, last - first + 1)  # offset, length
    else:
        ids = registry.get_job_ids(first, last, cleanup=False)  # inclusive range
    if order == "dsc":
        ids.reverse()
    jobs = []
    for job_id in ids:
        try:
            job = _fetch(job_id) if Job.exists(job_id, connection=connection) else None
            if job is not None:
                jobs.append(serialize_job(job))
        except Exception as e:  # listed with its reason, not a 500 for the whole list
            jobs.append(_unreadable(job_id, e))
    return total, jobs


def job_info(original, **kw):
    job_id = kw.get("job_id", "")
    try:
        return original(**kw)
    except NoSuchJobError:
        return jsonify({"id": job_id, "status": "gone", "error": f"no job {job_id!r}"}), 404
    except Exception as e:
        return _json(_unreadable(job_id, e))


# ---------------------------------------------------------------- actions (POST + CSRF)


def _delete_one(job_id: str, registry=None) -> str:
    try:
        _fetch(job_id).delete()
    except NoSuchJobError:
        if registry is not None:
            registry.remove(job_id)
        return "ERROR"
    return "OK"


def delete_job(job_id: str):
    if current_app.config.get("RQ_DASHBOARD_DISABLE_DELETE"):
        return _json({"status": "DISABLED"})
    return _json({"status": _delete_one(job_id)})


def empty_queue(queue_name: str, registry_name: str):
    from rq import Queue

    if current_app.config.get("RQ_DASHBOARD_DISABLE_DELETE"):
        return _json({"status": "DISABLED"})
    if registry_name == "queued":
        Queue(queue_name, connection=_conn(), serializer=JSONSerializer).empty()
    elif registry_name in REGISTRIES:
        registry = REGISTRIES[registry_name](queue_name, connection=_conn())
        for job_id in registry.get_job_ids(cleanup=False):
            _delete_one(job_id, registry)
    else:
        return _json({"status": "ERROR", "error": f"registry {registry_name!r} is not one of queued, "
                                                    + ", ".join(REGISTRIES)})
    return _json({"status": "OK"})


def _requeue(job_id: str) -> str | None:
    """None when requeued, else why not. h3render's jobs go through control.retry (fresh retry
    budget, the job's state in its meta); a canceled job is not brought back this way."""
    from rq import requeue_job as rq_requeue

    from h3render.queue import control

    s = state()
    try:
        job = _fetch(job_id)
    except NoSuchJobError:
        return "no such job"
    if job.origin != s.settings.queue_name:
        rq_requeue(job_id, connection=_conn(), serializer=JSONSerializer)
        return None
    out = control.retry(_conn(), job_id, s.settings, failed_only=True)
    return None if job_id in out.done else out.skipped.get(job_id, "not requeued")


def _requeue_or_why(job_id: str) -> str | None:
    try:
        return _requeue(job_id)
    except Exception as e:  # a record that does not parse (e.g. its meta) is reported, not a 500
        return f"{type(e).__name__}: {e}"


def requeue_job(job_id: str):
    why = _requeue_or_why(job_id)
    return _json({"status": "OK"} if why is None else {"status": "SKIPPED", "reason": why})


def requeue_all(queue_name: str):
    ids = FailedJobRegistry(queue_name, connection=_conn()).get_job_ids(cleanup=False)
    skipped = {}
    for job_id in ids:
        why = _requeue_or_why(job_id)
        if why is not None:
            skipped[job_id] = why
    return _json({"status": "OK", "count": len(ids) - len(skipped), "skipped": skipped})
