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

CSRF (`Csrf`: per-action tokens bound to an HttpOnly cookie)
    The browser holds a random nonce in the cookie `h3r_csrf` (HttpOnly,
    SameSite=Strict): no page script can read it. Each form (and each action
    button that rq-dashboard's pages build from JSON) carries a token for one
    action: HMAC-SHA256(app secret, nonce + "POST" + the action's path). A POST
    must send that token in the form field `csrf_token` or the header
    `X-CSRFToken`; it is checked against the cookie's nonce and the path the
    POST goes to. A token copied out of one page is worthless without the
    cookie, and works for no other action. An `Origin` header, when sent, must
    be ours, and a `Sec-Fetch-Site` of same-site or cross-site is refused: SameSite
    cookies are sent from another port of 127.0.0.1, which is the same "site".
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import re
import secrets
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, ConfigDict, field_validator

CSRF_COOKIE = "h3r_csrf"
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
#
# Our own scheme rather than Flask-WTF's CSRFProtect, which would be a new dependency
# for less: its one token per session is valid for every form, while ours is valid for
# one action path only; it knows nothing of Sec-Fetch-Site, and its refusals do not
# come as our error page naming the cause. Both keep the secret half in an HttpOnly
# cookie and compare in constant time.

_NONCE_RE = re.compile(r"[A-Za-z0-9_-]{32}")
_REFUSED_FETCH_SITES = ("cross-site", "same-site")


def action_path(url: str) -> str:
    """The path a form's action URL posts to, as the server sees it (percent-decoded)."""
    return unquote(urlsplit(url).path)


class Csrf:
    """Issue and check per-action tokens bound to a cookie nonce, with one app secret."""

    def __init__(self, secret: str):
        self._key = hmac.new(secret.encode(), b"h3render-dashboard-csrf", hashlib.sha256).digest()

    @staticmethod
    def new_nonce() -> str:
        return secrets.token_urlsafe(24)  # 32 characters

    @staticmethod
    def valid_nonce(nonce: str | None) -> bool:
        return bool(nonce) and _NONCE_RE.fullmatch(nonce) is not None

    def token(self, nonce: str, action: str) -> str:
        """The token a POST to `action` (a path, or a URL) must carry with this nonce."""
        msg = f"{nonce}\0POST\0{action_path(action)}".encode()
        mac = hmac.new(self._key, msg, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()

    def check(self, nonce: str | None, submitted: str | None, action: str, *, origin: str | None = None,
              fetch_site: str | None = None, host_url: str = "") -> str | None:
        """None when a POST to `action` may proceed, else why it is refused (for the 403 page)."""
        if origin is not None and origin != "null":
            if _origin_of(origin) != _origin_of(host_url):
                return f"Origin {origin!r} is not this dashboard ({_origin_of(host_url)})"
        if fetch_site in _REFUSED_FETCH_SITES:
            return (f"the browser says this request came from another page's site (Sec-Fetch-Site: "
                    f"{fetch_site}); use the dashboard's own buttons")
        if not self.valid_nonce(nonce):
            return "no CSRF cookie (load a dashboard page first, with cookies enabled)"
        if not submitted:
            return f"no CSRF token in the form field {CSRF_FIELD!r} or the {CSRF_HEADER} header"
        if not hmac.compare_digest(submitted.encode(), self.token(nonce, action).encode()):
            return (f"the CSRF token is not this browser's token for POST {action_path(action)} "
                    "(stale page? reload it)")
        return None


def _origin_of(url: str) -> str:
    p = urlsplit(url)
    return f"{p.scheme}://{p.netloc}".lower()
