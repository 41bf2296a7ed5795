"""`h3render worker` (run the one worker of this machine) and `h3render health`."""

from __future__ import annotations

import json
import sys

import click
from h3render.cli.console import console as make_console


@click.command()
@click.option("--burst", is_flag=True, help="Quit when the queue is empty.")
@click.option("--max-jobs", type=click.IntRange(1, None), default=None,
              help="Quit after this many jobs.")
@click.option("--force", is_flag=True,
              help="Start even if another worker runs on this host with this Redis.")
@click.option("--name", default=None, help="Worker name (default: rq's, host-based).")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]))
def worker(burst: bool, max_jobs: int | None, force: bool, name: str | None,
           log_level: str) -> None:
    """Render queued jobs, one at a time, when the machine is fit for it.

    Exit status: 0 when it stopped on request (or, with --burst/--max-jobs, when done);
    1 when Redis cannot be used (it refuses this worker's credentials, or does not answer
    at start); 2 when another live worker holds this host's lock. Nothing a job does ends
    the worker; a lost Redis is waited for."""
    import redis

    from h3render.queue.connection import get_redis
    from h3render.queue.errors import RedisUnavailableError
    from h3render.settings import Settings
    from h3render.worker.outage import FatalWorkerError, one_line
    from h3render.worker.worker import H3Worker, WorkerLockedError

    settings = Settings()
    secrets = _passwords(settings.redis_url)

    def fail(code: int, msg: object) -> None:
        text = one_line(msg)
        for secret in secrets:
            text = text.replace(secret, "***")
        click.echo(f"error: {text}", err=True)
        sys.exit(code)

    try:
        r = get_redis(settings)
    except RedisUnavailableError as e:
        cause = e.__cause__
        if isinstance(cause, (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError)):
            fail(1, f"Redis refuses this worker's credentials ({cause}); check the password in "
                    "H3RENDER_REDIS_URL")
        fail(1, e)
    from rq.logutils import setup_loghandlers

    setup_loghandlers(log_level, name="h3render")  # h3render's own log lines beside rq's, same format
    try:
        w = H3Worker.create(r, settings, force=force, name=name)
        w.run(burst=burst, max_jobs=max_jobs, logging_level=log_level)
    except WorkerLockedError as e:
        fail(2, e)
    except FatalWorkerError as e:
        fail(e.exit_code, e)
    except redis.RedisError as e:  # at start, before the worker's own loop waits out outages
        fail(1, f"Redis: {e}")
    except Exception as e:  # noqa: BLE001 - a bug of ours: the traceback in the log, then one line, exit 1
        import logging

        logging.getLogger("h3render.worker").exception("the worker stopped on an unexpected error")
        fail(1, f"the worker stopped on an unexpected error: {type(e).__name__}: {e}")


def _passwords(url: str | None) -> list[str]:
    """The password in a redis:// URL, as written and decoded, so no message prints it."""
    if not url:
        return []
    from urllib.parse import unquote, urlsplit

    try:
        pw = urlsplit(url).password
    except ValueError:
        return []
    return sorted({pw, unquote(pw)}, key=len, reverse=True) if pw else []


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the decision and readings as JSON.")
def health(as_json: bool) -> None:
    """Show what the worker's health gate sees on this machine now."""
    from h3render.settings import Settings
    from h3render.worker.health import decide
    from h3render.worker.sensors import read_readings

    settings = Settings()
    d = decide(read_readings(settings), settings)
    if as_json:
        click.echo(json.dumps(d.model_dump(mode="json"), indent=2))
        return
    from rich.table import Table

    c = make_console()
    c.print(f"gate: [bold {'green' if d.open else 'red'}]{d.state}[/]", highlight=False)
    r = d.readings
    if r is not None:
        t = Table(show_header=True, header_style="bold")
        t.add_column("reading")
        t.add_column("value")
        for group in ("memory", "thermal", "power", "disk"):
            for k, v in getattr(r, group).model_dump(mode="json").items():
                if v not in (None, [], {}):
                    t.add_row(f"{group}.{k}", _fmt(k, v))
        c.print(t)
    for n in d.notes:
        c.print(f"note: {n}", highlight=False)


def _fmt(key: str, v) -> str:
    if isinstance(v, int) and key.endswith("bytes"):
        return f"{v / 1024**3:.2f} GiB"
    if isinstance(v, list):
        return "; ".join(f"{z['name']} {z['temp_c']:.1f}°C" + (f" (trip {z['limit_c']:.0f})"
                                                                if z.get("limit_c") else "")
                         for z in v if isinstance(z, dict)) or str(v)
    return str(v)
