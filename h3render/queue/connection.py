"""The one way to reach Redis: H3RENDER_REDIS_URL when set, else the embedded server.

Clients keep decode_responses=False because rq stores bytes.
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
            raise RedisUnavailableError(f"H3RENDER_REDIS_URL={settings.redis_url!r} does not answer: {e}") from e
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
