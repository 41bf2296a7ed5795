"""Who may use the dashboard, and how a state-changing request proves it came from our pages.

Binding
    Loopback (127.0.0.0/8, ::1, localhost) needs no credentials. Any other host
    needs a token or HTTP basic auth: `check_bind` refuses otherwise, with a
    message that says how to fix it. Without auth, requests must also name a
    loopback Host (Flask TRUSTED_HOSTS), so a web page whose DNS name points at
    127.0.0.1 (DNS rebinding) cannot read the dashboard.

Authentication (`Auth`)
    token   `Authorization: Bearer <token>`, or `?token=<token>` once: the
            dashboard then sets an HttpOnly cookie and redirects to the same URL
            without the token, so it does not linger in the address bar.
    basic   user:password, the browser's own login prompt.
    Every comparison is constant time (hmac.compare_digest).

CSRF (double submit, signed)
    Every response carries the cookie `_csrf_token` (SameSite=Strict): a random
    nonce signed with the app's secret. A POST must send the same value in the
    form field `csrf_token` or the header `X-CSRFToken` (rq-dashboard's
    JavaScript already sends that header from that cookie), the signature must
    verify, and an Origin header, when the browser sends one, must be ours.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from urllib.parse import urlsplit

from itsdangerous import BadSignature, URLSafeSerializer
from pydantic import BaseModel, ConfigDict, field_validator

CSRF_COOKIE = "_csrf_token"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "X-CSRFToken"
TOKEN_COOKIE = "h3r_dashboard_token"
TOKEN_ENV = "H3RENDER_DASHBOARD_TOKEN"
BASIC_ENV = "H3RENDER_DASHBOARD_BASIC_AUTH"
MIN_TOKEN_CHARS = 16
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


class DashboardSecurityError(ValueError):
    """A setting that would expose the dashboard, or a bad credential setting."""


class Auth(BaseModel):
    """Credentials the dashboard requires; both None means open (loopback only)."""

    model_config = ConfigDict(frozen=True)

    token: str | None = None
    basic_user: str | None = None
    basic_password: str | None = None

    @field_validator("token")
    @classmethod
    def _token_long(cls, v: str | None) -> str | None:
        if v is not None and len(v) < MIN_TOKEN_CHARS:
            raise ValueError(f"token has {len(v)} characters; use at least {MIN_TOKEN_CHARS} "
                             "(e.g. python -c 'import secrets; print(secrets.token_urlsafe())')")
        return v

    @property
    def enabled(self) -> bool:
        return self.token is not None or self.basic_user is not None

    @classmethod
    def parse(cls, token: str | None = None, basic: str | None = None) -> "Auth":
        """From CLI/env text: token, and basic as "user:password".

        Raises DashboardSecurityError naming the option and what is allowed.
        """
        user = password = None
        if basic is not None:
            user, sep, password = basic.partition(":")
            if not sep or not user or not password:
                raise DashboardSecurityError(
                    f"--basic-auth / {BASIC_ENV}={_mask(basic)!r}: must be USER:PASSWORD with both parts non-empty")
        try:
            return cls(token=token or None, basic_user=user, basic_password=password)
        except ValueError as e:
            msg = e.errors()[0]["msg"] if hasattr(e, "errors") else str(e)
            raise DashboardSecurityError(f"--token / {TOKEN_ENV}: {msg.removeprefix('Value error, ')}") from None

    def check_request(self, authorization, bearer: str | None, cookie: str | None,
                      query_token: str | None) -> bool:
        """True when the request carries valid credentials (or none are required)."""
        if not self.enabled:
            return True
        if self.token is not None:
            for given in (bearer, cookie, query_token):
                if given is not None and hmac.compare_digest(given.encode(), self.token.encode()):
                    return True
        if self.basic_user is not None and authorization is not None and authorization.type == "basic":
            u = (authorization.username or "").encode()
            p = (authorization.password or "").encode()
            ok_user = hmac.compare_digest(u, self.basic_user.encode())
            ok_pass = hmac.compare_digest(p, (self.basic_password or "").encode())
            return ok_user and ok_pass
        return False


def _mask(text: str) -> str:
    user, sep, _ = text.partition(":")
    return f"{user}:***" if sep else "***"


def is_loopback(host: str) -> bool:
    """True for localhost, 127.0.0.0/8 and ::1 (with or without brackets)."""
    h = host.strip().strip("[]").lower()
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def check_bind(host: str, auth: Auth) -> None:
    """Refuse to listen beyond loopback without credentials (DashboardSecurityError)."""
    if is_loopback(host) or auth.enabled:
        return
    what = "every address of this machine" if host.strip("[]") in ("0.0.0.0", "::", "") else f"{host!r}"
    raise DashboardSecurityError(
        f"refusing to serve the dashboard on {host} ({what}) without authentication: anyone who "
        "can reach it could cancel and retry renders and read every prompt. Give --token TOKEN "
        f"(or {TOKEN_ENV}) or --basic-auth USER:PASSWORD (or {BASIC_ENV}), or keep the default "
        "--host 127.0.0.1.")


def trusted_hosts(host: str) -> list[str]:
    """Host header values accepted without auth: the loopback names (any port)."""
    names = list(LOOPBACK_NAMES)
    h = host.strip("[]")
    if h not in names:
        names.append(h)
    return names + ["[::1]"]


# ---------------------------------------------------------------- CSRF


class Csrf:
    """Issue and check signed double-submit tokens with one app secret."""

    def __init__(self, secret: str):
        self._s = URLSafeSerializer(secret, salt="h3render-dashboard-csrf")

    def new_token(self) -> str:
        return self._s.dumps(secrets.token_urlsafe(16))

    def valid(self, token: str | None) -> bool:
        if not token:
            return False
        try:
            self._s.loads(token)
        except BadSignature:
            return False
        return True

    def check(self, cookie: str | None, submitted: str | None, origin: str | None,
              host_url: str) -> str | None:
        """None when the POST may proceed, else why it is refused (for the 403 page)."""
        if origin is not None and origin != "null":
            if _origin_of(origin) != _origin_of(host_url):
                return f"Origin {origin!r} is not this dashboard ({_origin_of(host_url)})"
        if not cookie:
            return "no CSRF cookie (load a dashboard page first, with cookies enabled)"
        if not submitted:
            return f"no CSRF token in the form field {CSRF_FIELD!r} or the {CSRF_HEADER} header"
        if not hmac.compare_digest(cookie.encode(), submitted.encode()):
            return "the CSRF token does not match the cookie (stale page? reload it)"
        if not self.valid(submitted):
            return "the CSRF token was not issued by this dashboard (reload the page)"
        return None


def _origin_of(url: str) -> str:
    p = urlsplit(url)
    return f"{p.scheme}://{p.netloc}".lower()
