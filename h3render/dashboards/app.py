"""The dashboard's Flask app: our pages, rq-dashboard under /rq, auth, CSRF and headers.

    app = create_app(settings, redis_conn=r, redis_url=url, auth=Auth(token="..."))

One Redis connection is passed in (a thread-safe pool) and used by every page.
rq-dashboard makes its own connection from RQ_DASHBOARD_REDIS_URL, which must be
in the config before `setup_rq_connection`; it reads jobs with rq's
JSONSerializer, the only serializer h3render uses.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from flask import Flask, Response, g, redirect, render_template, request
from markupsafe import escape
from rq.serializers import JSONSerializer

from h3render.dashboards.security import (
    CSRF_COOKIE,
    CSRF_FIELD,
    CSRF_HEADER,
    TOKEN_COOKIE,
    Auth,
    Csrf,
    trusted_hosts,
)
from h3render.settings import Settings

HERE = Path(__file__).parent
RQ_PREFIX = "/rq"
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
# Our own pages: scripts and media from this origin only; inline SVG and style attributes.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data:; media-src 'self'; object-src 'none'; base-uri 'none'; "
       "form-action 'self'; frame-ancestors 'none'")


@dataclass
class DashState:
    """What every request needs: app.extensions["h3render"]."""

    r: redis.Redis
    settings: Settings
    auth: Auth
    csrf: Csrf
    redis_url: str


def state() -> DashState:
    from flask import current_app

    return current_app.extensions["h3render"]


def redis_url_for(settings: Settings) -> str:
    """The URL rq-dashboard connects to: H3RENDER_REDIS_URL, else the embedded server's."""
    if settings.redis_url:
        return settings.redis_url
    from h3render.queue.redis_server import embedded

    return embedded(settings).url()


def create_app(settings: Settings | None = None, *, redis_conn: redis.Redis | None = None,
               redis_url: str | None = None, auth: Auth | None = None, host: str = "127.0.0.1",
               secret: str | None = None) -> Flask:
    """The dashboard app. Without redis_conn, connects like every h3render command
    (H3RENDER_REDIS_URL, else the embedded server, started if needed)."""
    settings = settings or Settings()
    auth = auth or Auth()
    if redis_conn is None:
        from h3render.queue.connection import get_redis

        redis_conn = get_redis(settings)
    url = redis_url or redis_url_for(settings)

    app = Flask("h3render.dashboards", root_path=str(HERE), static_folder="static",
                template_folder="templates")
    app.secret_key = secret or secrets.token_urlsafe(32)
    app.config.update(
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Strict",
        MAX_CONTENT_LENGTH=64 * 1024,
        JSON_SORT_KEYS=False,
    )
    if not auth.enabled:
        # Open only on loopback: also refuse Host names that are not loopback (DNS rebinding).
        app.config["TRUSTED_HOSTS"] = trusted_hosts(host)
    app.extensions["h3render"] = DashState(redis_conn, settings, auth, Csrf(app.secret_key), url)

    _mount_rq_dashboard(app, url)
    from h3render.dashboards import filters, views

    filters.register(app)
    app.register_blueprint(views.bp)
    app.before_request(_authenticate)
    app.before_request(_check_csrf)
    app.after_request(_headers)
    app.context_processor(lambda: {"csrf_token": csrf_token, "csrf_field": CSRF_FIELD,
                                   "rq_prefix": RQ_PREFIX})
    return app


def _mount_rq_dashboard(app: Flask, url: str) -> None:
    import rq_dashboard
    from rq_dashboard.web import config as rq_config
    from rq_dashboard.web import setup_rq_connection

    app.config.setdefault("RQ_DASHBOARD_POLL_INTERVAL", 2500)
    app.config["RQ_DASHBOARD_REDIS_URL"] = url  # before setup_rq_connection, which reads it
    rq_config.serializer = JSONSerializer
    app.register_blueprint(rq_dashboard.blueprint, url_prefix=RQ_PREFIX)
    setup_rq_connection(app)


# ---------------------------------------------------------------- request hooks


def csrf_token() -> str:
    """This request's CSRF token (the cookie's when valid, else a fresh one set on the response)."""
    tok = getattr(g, "csrf_token", None)
    if tok is None:
        tok = request.cookies.get(CSRF_COOKIE)
        if not state().csrf.valid(tok):
            tok = state().csrf.new_token()
            g.csrf_set = True
        g.csrf_token = tok
    return tok


def _authenticate() -> Response | None:
    auth = state().auth
    if not auth.enabled:
        return None
    bearer = None
    header = request.headers.get("Authorization", "")
    if header.lower().startswith("bearer "):
        bearer = header[7:].strip()
    query = request.args.get("token")
    if auth.check_request(request.authorization, bearer, request.cookies.get(TOKEN_COOKIE), query):
        if query is not None and request.method == "GET" and auth.token is not None:
            # Trade the token in the URL for a cookie, and drop it from the address bar.
            args = request.args.to_dict(flat=False)
            args.pop("token", None)
            from urllib.parse import urlencode

            target = request.path + ("?" + urlencode(args, doseq=True) if args else "")
            resp = redirect(target, code=303)
            resp.set_cookie(TOKEN_COOKIE, query, httponly=True, samesite="Strict",
                            secure=request.is_secure)
            return resp
        return None
    headers = {}
    if auth.basic_user is not None:
        headers["WWW-Authenticate"] = 'Basic realm="h3render dashboard", charset="UTF-8"'
    body = render_template("error.html", code=401, title="Authentication required",
                           message="This dashboard needs credentials: open it with ?token=<token> "
                                   "(or an Authorization: Bearer header), or log in with the "
                                   "dashboard's user name and password.")
    return Response(body, 401, headers)


def _check_csrf() -> Response | None:
    if request.method in SAFE_METHODS:
        return None
    submitted = request.headers.get(CSRF_HEADER) or request.form.get(CSRF_FIELD)
    why = state().csrf.check(request.cookies.get(CSRF_COOKIE), submitted,
                             request.headers.get("Origin"), request.host_url)
    if why is None:
        return None
    body = render_template("error.html", code=403, title="Request refused (CSRF check)",
                           message=f"{why}. Nothing was changed.")
    return Response(body, 403)


# rq-dashboard 0.9.0 inserts some JSON fields into the page as raw HTML with underscore's
# `<%= %>`: every field of the job view (description, metadata, exc_info: our prompts are in
# them) and the worker list's call string and names. Those responses are escaped here.
_RQ_JOB_JSON = re.compile(rf"^{RQ_PREFIX}/\d+/data/job/[^/]+\.json$")
_RQ_WORKERS_JSON = re.compile(rf"^{RQ_PREFIX}/\d+/data/workers\.json$")


def _escape_all(v: Any) -> Any:
    if isinstance(v, str):
        return str(escape(v))
    if isinstance(v, list):
        return [_escape_all(x) for x in v]
    if isinstance(v, dict):
        return {k: _escape_all(x) for k, x in v.items()}
    return v


def _escape_rq_json(resp: Response) -> Response:
    path = request.path
    job_view = bool(_RQ_JOB_JSON.match(path))
    if not (job_view or _RQ_WORKERS_JSON.match(path)) or resp.mimetype != "application/json":
        return resp
    doc = json.loads(resp.get_data())
    if job_view:
        doc = _escape_all(doc)
    else:
        for w in doc.get("workers") or []:
            for k in ("name", "queues", "state"):
                if k in w:
                    w[k] = _escape_all(w[k])
            cur = w.get("current_job")
            if isinstance(cur, dict) and "call_string" in cur:  # its description is escaped by the page
                cur["call_string"] = _escape_all(cur["call_string"])
    resp.set_data(json.dumps(doc))
    return resp


def _headers(resp: Response) -> Response:
    resp = _escape_rq_json(resp)
    tok = csrf_token()
    if getattr(g, "csrf_set", False):
        # Readable by scripts on purpose: rq-dashboard's JavaScript sends it back as X-CSRFToken.
        resp.set_cookie(CSRF_COOKIE, tok, httponly=False, samesite="Strict", secure=request.is_secure)
    resp.headers.setdefault("X-Content-Type-Options", "nosniff")
    resp.headers.setdefault("Referrer-Policy", "same-origin")
    resp.headers.setdefault("X-Frame-Options", "DENY")
    if not request.path.startswith(RQ_PREFIX + "/") and request.path != RQ_PREFIX:
        resp.headers.setdefault("Content-Security-Policy", CSP)
    return resp
