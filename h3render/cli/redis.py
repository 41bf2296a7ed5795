"""`h3render redis start|status|stop`: the embedded redis-server under $H3RENDER_HOME/redis/."""

from __future__ import annotations

import json

import click

from h3render.cli.jobs import handle_errors


def _embedded():
    from h3render.queue.redis_server import embedded
    from h3render.settings import Settings

    settings = Settings()
    return settings, embedded(settings)


@click.group("redis")
def redis_group() -> None:
    """The embedded Redis (ignored when H3RENDER_REDIS_URL is set)."""


@redis_group.command()
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def status(as_json: bool) -> None:
    """Is it running, where, with AOF, how many keys. Exit 1 when not running."""
    from h3render.queue import durability

    settings, server = _embedded()
    if settings.redis_url:
        from h3render.queue.connection import get_redis

        r = get_redis(settings)
        info = r.info()
        data = {"url": settings.redis_url, "running": True, "version": info.get("redis_version"),
                "aof_enabled": bool(info.get("aof_enabled")), "keys": r.dbsize()}
    else:
        data = server.status().to_dict()
        r = server._ping() if data["running"] else None
    if r is not None:  # what an acknowledged enqueue means on this server (durability.Stored)
        p = durability.probe(r)
        data.update(appendfsync=p.appendfsync, stored=p.stored.value, stored_means=p.stored.text)
    if as_json:
        click.echo(json.dumps(data))
    elif settings.redis_url:
        click.echo(f"using H3RENDER_REDIS_URL={settings.redis_url}: Redis {data['version']}, "
                   f"AOF {'on' if data['aof_enabled'] else 'off'}, {data['keys']} keys; "
                   f"an acknowledged enqueue is {data['stored_means']}")
    elif data["running"]:
        click.echo(f"embedded Redis {data['version']} running: 127.0.0.1:{data['port']} pid {data['pid']}, "
                   f"AOF {'on' if data['aof_enabled'] else 'off'}, {data['keys']} keys, "
                   f"{data['used_memory_human']}, dir {data['dir']}; an acknowledged enqueue is "
                   f"{data['stored_means']}")
    else:
        click.echo(f"embedded Redis not running (port {data['port']}, dir {data['dir']}); "
                   "any queue command starts it")
    if not data["running"]:
        raise SystemExit(1)


@redis_group.command()
@handle_errors
def start() -> None:
    """Start the embedded server now (queue commands also start it on demand)."""
    settings, server = _embedded()
    if settings.redis_url:
        raise click.UsageError("H3RENDER_REDIS_URL is set: h3render starts only its embedded server")
    server.start()
    click.echo(f"embedded Redis running on {server.url()} (dir {server.dir})")


@redis_group.command()
@handle_errors
def stop() -> None:
    """Stop the embedded server cleanly (the AOF is flushed)."""
    settings, server = _embedded()
    if settings.redis_url:
        raise click.UsageError("H3RENDER_REDIS_URL is set: h3render stops only its embedded server")
    click.echo("stopped" if server.stop() else "not running")
