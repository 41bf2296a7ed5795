"""pytest plugin: a private redis-server for the test session (real Redis, never port 6379).

Loaded from tests/conftest.py with `pytest_plugins = ["redis_fixture"]`.

Fixtures
    redis_server   (session) a RedisServer: AOF on, a free port, its own temp dir;
                   .url, .port, .client(), .stop(), .kill(), .start(), .restart()
    redis_conn     (function) a client on a flushed database
    h3_settings    (function) Settings pointing at redis_server, with HOME in a temp dir

The server is the package's own embedded server class (h3render.queue.redis_server),
so the same start/stop code that users run is exercised by every Redis test.
"""

from __future__ import annotations

import shutil
import socket

import pytest


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A private redis-server with AOF (appendfsync always) in `directory`."""

    def __init__(self, directory, port: int):
        from h3render.queue.redis_server import EmbeddedRedis

        self.server = EmbeddedRedis(directory, port)
        self.port = port
        self.dir = directory
        self.url = self.server.url()

    def start(self):
        return self.server.start()

    def client(self):
        return self.server.client()

    def stop(self) -> None:
        """Clean SHUTDOWN: the AOF is flushed."""
        self.server.stop()

    def kill(self) -> None:
        """SIGKILL: what a crash does; nothing acknowledged is lost (appendfsync always)."""
        self.server.stop(hard=True)

    def restart(self, hard: bool = False):
        self.kill() if hard else self.stop()
        return self.start()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (apt install redis-server); .ci/run installs it")
    srv = RedisServer(tmp_path_factory.mktemp("redis"), free_port())
    srv.start()
    yield srv
    try:
        srv.kill()
    except Exception as e:  # the server may already be gone after a test stopped it
        print(f"redis fixture teardown: {e}")


@pytest.fixture
def redis_conn(redis_server):
    r = redis_server.start()  # restarts it if a previous test stopped it
    r.flushdb()
    yield r
    r.close()


@pytest.fixture
def h3_settings(redis_server, redis_conn, tmp_path, monkeypatch):
    from h3render.settings import Settings

    home = tmp_path / "h3home"
    monkeypatch.setenv("H3RENDER_HOME", str(home))
    monkeypatch.setenv("H3RENDER_REDIS_URL", redis_server.url)
    return Settings(redis_url=redis_server.url, home=home)
