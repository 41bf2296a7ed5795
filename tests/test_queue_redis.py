"""The embedded Redis (a real redis-server): start on demand, reuse, outlive its starter, AOF, stop."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from redis_fixture import free_port


@pytest.fixture
def embedded_env(tmp_path, monkeypatch):
    """A fresh H3RENDER_HOME and port for the embedded server; stopped afterwards."""
    from h3render.queue.redis_server import embedded
    from h3render.settings import Settings

    monkeypatch.delenv("H3RENDER_REDIS_URL", raising=False)
    monkeypatch.setenv("H3RENDER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("H3RENDER_REDIS_PORT", str(free_port()))
    settings = Settings()
    yield settings
    embedded(settings).stop(hard=True)


def test_started_on_demand_outlives_its_process_and_is_reused(embedded_env):
    from h3render.queue.connection import get_redis
    from h3render.queue.redis_server import embedded

    server = embedded(embedded_env)
    assert not server.status().running
    # A separate process starts it and exits; the server must still be there afterwards.
    code = "from h3render.queue.connection import get_redis; get_redis().set('h3r:test', 'kept')"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)
    st = server.status()
    assert st.running and st.aof_enabled and st.port == embedded_env.redis_port
    conf = server.conf_path.read_text()
    for line in ("bind 127.0.0.1", "appendonly yes", "appendfsync always", f"port {embedded_env.redis_port}"):
        assert line in conf
    assert server.pid_path.is_file() and server.log_path.is_file()
    pid = st.pid
    r = get_redis(embedded_env)  # reused, not restarted
    assert r.get("h3r:test") == b"kept" and server.status().pid == pid


def test_aof_keeps_data_across_a_hard_kill(embedded_env):
    from h3render.queue.redis_server import embedded

    server = embedded(embedded_env)
    r = server.start()
    r.rpush("h3r:list", *range(100))
    server.stop(hard=True)  # at once: appendfsync always fsyncs before it replies

    assert not server.status().running
    assert server.start().llen("h3r:list") == 100


def test_refuses_a_foreign_redis_on_its_port(embedded_env, redis_server):
    from h3render.queue.errors import RedisUnavailableError
    from h3render.queue.redis_server import EmbeddedRedis

    impostor = EmbeddedRedis(embedded_env.redis_dir(), redis_server.port)  # port held by the session server
    with pytest.raises(RedisUnavailableError, match="held by another Redis"):
        impostor.start()


def test_cli_redis_status_start_stop(embedded_env):
    from h3render.cli import cli

    runner = CliRunner()
    res = runner.invoke(cli, ["redis", "status"])
    assert res.exit_code == 1 and "not running" in res.output
    res = runner.invoke(cli, ["redis", "start"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(cli, ["redis", "status", "--json"])
    assert res.exit_code == 0 and '"aof_enabled": true' in res.output
    assert '"appendfsync": "always"' in res.output and '"stored": "fsynced"' in res.output
    res = runner.invoke(cli, ["redis", "stop"])
    assert res.exit_code == 0 and "stopped" in res.output
    assert runner.invoke(cli, ["redis", "status"]).exit_code == 1


def test_unreachable_url_fails_fast_with_the_url(monkeypatch):
    from h3render.queue.connection import get_redis
    from h3render.queue.errors import RedisUnavailableError
    from h3render.settings import Settings

    url = f"redis://127.0.0.1:{free_port()}/0"
    t0 = time.monotonic()
    with pytest.raises(RedisUnavailableError, match="does not answer"):
        get_redis(Settings(redis_url=url))
    assert time.monotonic() - t0 < 3.0  # no retry backoff on the first probe
