"""`h3render dashboard`: serve the sweep gallery, job and worker pages, and rq-dashboard under /rq.

Served by waitress when it is installed (h3render depends on it), else by werkzeug's
development server with a warning; on 127.0.0.1 unless --host says otherwise.
"""

from __future__ import annotations

import sys

import click

from h3render.dashboards.security import BASIC_ENV, TOKEN_ENV


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but loopback needs --token or --basic-auth.")
@click.option("--port", default=9181, show_default=True, type=click.IntRange(1, 65535))
@click.option("--token", envvar=TOKEN_ENV, default=None, show_envvar=True,
              help="Require this token (open the dashboard once with ?token=..., or send "
                   "Authorization: Bearer ...). At least 16 characters.")
@click.option("--basic-auth", "basic", envvar=BASIC_ENV, default=None, show_envvar=True,
              metavar="USER:PASSWORD", help="Require HTTP basic auth.")
def dashboard(host: str, port: int, token: str | None, basic: str | None) -> None:
    """Serve the dashboards: sweeps, sweep grids, jobs, workers, and rq-dashboard at /rq."""
    from h3render.dashboards.security import Auth, DashboardSecurityError, check_bind

    try:
        auth = Auth.parse(token, basic)
        check_bind(host, auth)
    except DashboardSecurityError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)

    from h3render.dashboards.app import create_app
    from h3render.queue.connection import get_redis
    from h3render.queue.errors import RedisUnavailableError
    from h3render.settings import Settings

    settings = Settings()
    try:
        r = get_redis(settings)
    except RedisUnavailableError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    app = create_app(settings, redis_conn=r, auth=auth, host=host)

    from h3render.dashboards.server import FALLBACK_WARNING, make_server

    try:
        server = make_server(app, host, port)
    except OSError as e:
        click.echo(f"error: cannot listen on {host}:{port}: {e.strerror or e}", err=True)
        sys.exit(1)
    if server.kind != "waitress":
        click.echo(f"warning: {FALLBACK_WARNING}", err=True)
    h = host.strip("[]")
    shown = f"[{h}]" if ":" in h else h
    how = " (token required)" if auth.token else " (basic auth)" if auth.basic_user else ""
    click.echo(f"h3render dashboard on http://{shown}:{server.port}/{how} ({server.kind}); rq-dashboard "
               "at /rq; Ctrl-C stops", err=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


if __name__ == "__main__":  # python -m h3render.cli.dashboard (tests, before the command is registered)
    dashboard()
