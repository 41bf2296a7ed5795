"""`h3render worker` (run the one worker of this machine) and `h3render health`."""

from __future__ import annotations

import json
import sys

import click


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
    """Render queued jobs, one at a time, when the machine is fit for it."""
    from h3render.queue.connection import get_redis
    from h3render.queue.errors import RedisUnavailableError
    from h3render.settings import Settings
    from h3render.worker.worker import H3Worker, WorkerLockedError

    settings = Settings()
    try:
        r = get_redis(settings)
    except RedisUnavailableError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    from rq.logutils import setup_loghandlers

    setup_loghandlers(log_level, name="h3render")  # h3render's own log lines beside rq's, same format
    w = H3Worker.create(r, settings, force=force, name=name)
    try:
        w.run(burst=burst, max_jobs=max_jobs, logging_level=log_level)
    except WorkerLockedError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)


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
    from rich.console import Console
    from rich.table import Table

    c = Console()
    c.print(f"gate: [bold {'green' if d.open else 'red'}]{d.state}[/]", highlight=False)
    r = d.readings
    if r is not None:
        t = Table(show_header=True, header_style="bold")
        t.add_column("reading")
        t.add_column("value")
        for group in ("memory", "thermal", "power"):
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
