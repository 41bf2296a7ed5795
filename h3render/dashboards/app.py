"""The dashboard's Flask app: our pages, rq-dashboard under /rq, auth, CSRF and headers.

    app = create_app(settings, redis_conn=r, redis_url=url, auth=Auth(token="..."))

One Redis connection is passed in (a thread-safe pool) and used by every page.
rq-dashboard makes its own connection from RQ_DASHBOARD_REDIS_URL; rqdash.py mounts
it, reading jobs with rq's JSONSerializer only (the only serializer h3render uses).

Every response, /rq's included, carries the same Content-Security-Policy: scripts
only from our static files, no inline script, no eval. Under /rq it also requires
Trusted Types, so even a DOM sink that rqdash.js might misuse (innerHTML) throws.
Templates get `csrf_token(action_url)`: the token for a POST to that URL only.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import redis
from flask import Flask, Response, g, redirect, render_template, request

from h3render.dashboards import filters, views
from h3render.dashboards.context import DashState, state  # noqa: F401 - state is re-exported for rqdash
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
# Every page: scripts and media from this origin only; inline SVG and style attributes.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data:; media-src 'self'; connect-src 'self'; object-src 'none'; "
       "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
# /rq's pages: rqdash.js never hands a string to an HTML sink, so Chromium may refuse them all.
CSP_RQ = CSP + "; require-trusted-types-for 'script'; trusted-types 'none'"


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

    from h3render.dashboards import rqdash  # it reads this module's helpers: imported once they exist

    rqdash.install(app, url)
    filters.register(app)
    app.register_blueprint(views.bp)
    app.before_request(_authenticate)
    app.before_request(rqdash.post_only)
    app.before_request(_check_csrf)
    app.after_request(_headers)
    app.register_error_handler(405, lambda e: method_not_allowed(e.valid_methods or ["POST"]))
    app.context_processor(lambda: {"csrf_token": csrf_token, "csrf_field": CSRF_FIELD,
                                   "rq_prefix": RQ_PREFIX})
    return app


# ---------------------------------------------------------------- request hooks


def _csrf_nonce() -> str:
    """This browser's CSRF nonce (its cookie's when well formed, else a fresh one set on the response)."""
    nonce = getattr(g, "csrf_nonce", None)
    if nonce is None:
        nonce = request.cookies.get(CSRF_COOKIE)
        if not state().csrf.valid_nonce(nonce):
            nonce = state().csrf.new_nonce()
            g.csrf_set = True
        g.csrf_nonce = nonce
    return nonce


def csrf_token(action: str) -> str:
    """The token a form (or button) that POSTs to `action` must send: valid for that path only."""
    return state().csrf.token(_csrf_nonce(), action)


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


def method_not_allowed(allowed: list[str]) -> Response:
    """Our 405 page: a state change was asked for with GET (or another wrong method)."""
    body = render_template("error.html", code=405, title="Method not allowed",
                           message=f"{request.method} {request.path} would change the queue: it takes a POST "
                                   "from the dashboard's own button, with its CSRF token. Nothing was changed.")
    return Response(body, 405, {"Allow": ", ".join(sorted(set(allowed)))})


def _check_csrf() -> Response | None:
    if request.method in SAFE_METHODS:
        return None
    submitted = request.headers.get(CSRF_HEADER) or request.form.get(CSRF_FIELD)
    why = state().csrf.check(request.cookies.get(CSRF_COOKIE), submitted, request.script_root + request.path,
                             origin=request.headers.get("Origin"),
                             fetch_site=request.headers.get("Sec-Fetch-Site"), host_url=request.host_url)
    if why is None:
        return None
    body = render_template("error.html", code=403, title="Request refused (CSRF check)",
                           message=f"{why}. Nothing was changed.")
    return Response(body, 403)


def _headers(resp: Response) -> Response:
    nonce = _csrf_nonce()
    if getattr(g, "csrf_set", False):
        # HttpOnly: no page script ever needs it; forms carry their own per-action token.
        resp.set_cookie(CSRF_COOKIE, nonce, httponly=True, samesite="Strict", secure=request.is_secure,
                        path="/")
    resp.headers.setdefault("X-Content-Type-Options", "nosniff")
    resp.headers.setdefault("Referrer-Policy", "same-origin")
    resp.headers.setdefault("X-Frame-Options", "DENY")
    rq = request.path == RQ_PREFIX or request.path.startswith(RQ_PREFIX + "/")
    resp.headers["Content-Security-Policy"] = CSP_RQ if rq else CSP
    return resp
