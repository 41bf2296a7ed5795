"""The HTTP server under the dashboard: waitress when it is installed, else werkzeug's.

    server = make_server(app, "127.0.0.1", 9181)   # OSError when the address is taken
    server.port, server.kind                        # the bound port; "waitress" or "werkzeug"
    server.serve_forever()                          # until stop() (from another thread) or Ctrl-C
    server.close()                                  # after serve_forever returned

waitress is a production WSGI server (a fixed pool of threads, request size and
header limits, no debugger, X-Forwarded-* ignored unless a proxy is trusted).
werkzeug's server is a development server: it is kept only as the fallback, with a
warning, so the dashboard still starts where waitress is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

THREADS = 8
FALLBACK_WARNING = ("waitress is not installed: serving with werkzeug's development server "
                    "(pip install waitress for a production server)")


def waitress_available() -> bool:
    try:
        import waitress  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass
class Server:
    kind: str
    port: int
    serve_forever: Callable[[], None]
    stop: Callable[[], None]  # from another thread, while serve_forever runs
    close: Callable[[], None]  # once serve_forever has returned
    impl: Any


def make_server(app, host: str, port: int, *, prefer_waitress: bool = True) -> Server:
    """Bind `host:port` (port 0: any free port) and return the server, not yet serving."""
    h = host.strip("[]")
    if prefer_waitress and waitress_available():
        from waitress.server import create_server

        listen = f"[{h}]:{port}" if ":" in h else f"{h}:{port}"
        # ident: the Server header names no version; url_scheme stays as the socket says
        srv = create_server(app, listen=listen, threads=THREADS, ident="h3render",
                            clear_untrusted_proxy_headers=True, max_request_body_size=1 << 20)
        return Server("waitress", srv.effective_port, srv.run, srv.close, srv.close, srv)
    from werkzeug.serving import WSGIRequestHandler
    from werkzeug.serving import make_server as werkzeug_server

    class NoQueryLog(WSGIRequestHandler):
        # The access log would print ?token=... (the dashboard's login link): paths only.
        def log_request(self, code: Any = "-", size: Any = "-") -> None:
            self.log("info", '"%s %s" %s', self.command, self.path.split("?", 1)[0], code)

    srv = werkzeug_server(h, port, app, threaded=True, request_handler=NoQueryLog)
    return Server("werkzeug", srv.server_port, srv.serve_forever, srv.shutdown, srv.server_close, srv)
