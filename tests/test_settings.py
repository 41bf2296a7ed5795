"""Settings from the environment: REDIS_URL as the fallback, and errors that name the variable."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from h3render.settings import Settings, SettingsError, load_settings

H3RENDER = [sys.executable, "-c", "import sys; from h3render.cli import main; sys.argv[0] = 'h3render'; main()"]


@pytest.fixture
def clean_env(monkeypatch):
    for k in list(os.environ):
        if k.startswith("H3RENDER_") or k == "REDIS_URL":
            monkeypatch.delenv(k)
    return monkeypatch


def test_redis_url_is_the_fallback_after_h3render_redis_url(clean_env):
    assert Settings().redis_url is None
    clean_env.setenv("REDIS_URL", "redis://elsewhere:6400/1")
    assert Settings().redis_url == "redis://elsewhere:6400/1"
    clean_env.setenv("H3RENDER_REDIS_URL", "redis://ours:6401/0")
    assert Settings().redis_url == "redis://ours:6401/0"
    assert Settings(redis_url="redis://given:1/0").redis_url == "redis://given:1/0"


def test_bad_settings_name_variable_value_rule_and_default(clean_env):
    clean_env.setenv("H3RENDER_GATE_POLL_S", "abc")
    clean_env.setenv("H3RENDER_REDIS_PORT", "99999")
    with pytest.raises(SettingsError) as e:
        load_settings()
    lines = str(e.value).splitlines()
    assert len(lines) == 2
    port = next(x for x in lines if x.startswith("H3RENDER_REDIS_PORT="))
    assert "'99999'" in port and "<= 65535" in port and "default 6391" in port
    poll = next(x for x in lines if x.startswith("H3RENDER_GATE_POLL_S="))
    assert "'abc'" in poll and "a number > 0" in poll and "default 15.0" in poll


def test_the_cli_reports_bad_settings_in_one_line_each_with_exit_2(clean_env, tmp_path):
    env = {**os.environ, "H3RENDER_HOME": str(tmp_path), "H3RENDER_RETRY_INTERVALS_S": "[0]",
           "H3RENDER_ADMISSION_HEADROOM_FRACTION": "1.5"}
    out = subprocess.run([*H3RENDER, "health"], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2, out
    assert "Traceback" not in out.stderr and "pydantic" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines[0] == "error: bad settings:"
    assert any(x.startswith("H3RENDER_RETRY_INTERVALS_S=[0]: ") and "positive seconds" in x for x in lines)
    assert any(x.startswith("H3RENDER_ADMISSION_HEADROOM_FRACTION='1.5': ") and "< 1" in x for x in lines)


def test_an_unreachable_redis_url_is_reported_without_its_password(clean_env):
    from h3render.queue.connection import get_redis
    from h3render.queue.errors import RedisUnavailableError
    from redis_fixture import free_port

    url = f"redis://:hunter2-secret@127.0.0.1:{free_port()}/0"
    with pytest.raises(RedisUnavailableError) as e:
        get_redis(Settings(redis_url=url))
    assert "hunter2-secret" not in str(e.value) and ":***@127.0.0.1" in str(e.value)
