"""The one way to reach Redis: H3RENDER_REDIS_URL when set, else the embedded server.

Clients keep decode_responses=False because rq stores bytes. `single_attempt(r)` is for
writes that must not run twice: redis-py re-sends a whole MULTI/EXEC after a lost
reply by default, and a sweep whose first EXEC did commit would then be queued twice.
"""

from __future__ import annotations

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from h3render.queue.errors import RedisUnavailableError
from h3render.queue.redis_server import embedded
from h3render.settings import Settings


def get_redis(settings: Settings | None = None, start: bool = True) -> redis.Redis:
    """A connected client. With no URL, starts the embedded server if needed (unless start=False).

    Raises RedisUnavailableError naming the URL or port when nothing answers.
    """
    settings = settings or Settings()
    if settings.redis_url:
        probe = redis.Redis.from_url(settings.redis_url, socket_connect_timeout=5, retry=Retry(NoBackoff(), 0))
        try:
            probe.ping()  # once, without redis-py's retry backoff, so a wrong URL fails fast
        except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
            raise RedisUnavailableError(
                f"H3RENDER_REDIS_URL={redacted_url(settings.redis_url)!r} does not answer: {e}") from e
        except redis.ResponseError:
            pass  # it answers: a server that cannot persist (MISCONF) refuses PING too
        finally:
            probe.close()
        return redis.Redis.from_url(settings.redis_url, socket_connect_timeout=5)
    server = embedded(settings)
    if start:
        return server.start()
    r = server._ping()
    if r is None:
        raise RedisUnavailableError(
            f"the embedded Redis on 127.0.0.1:{settings.redis_port} is not running (start it with any h3render "
            "queue command, or set H3RENDER_REDIS_URL)"
        )
    return r


def single_attempt(r: redis.Redis) -> redis.Redis:
    """A client for r's server whose commands are sent once: a lost reply raises instead of
    re-sending. Its own pool; close it with `.connection_pool.disconnect()`.

    For pools of another kind (Sentinel, cluster) r itself is returned."""
    pool = r.connection_pool
    if type(pool) not in (redis.ConnectionPool, redis.BlockingConnectionPool):
        return r
    kw = dict(pool.connection_kwargs)
    kw["retry"] = Retry(NoBackoff(), 0)
    kw.pop("retry_on_error", None)
    kw.pop("retry_on_timeout", None)
    return redis.Redis(connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **kw))


def redacted_url(url: str) -> str:
    """The URL with its password replaced by ***, for messages and logs (never print a secret)."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
