"""h3render.queue.workers: "is any worker alive?" against a real Redis and a real worker process.

About 10 s (one worker process starts and stops).
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import time

from test_worker_integration import env, start_worker, stop, wait_for  # noqa: F401 - env is a fixture

from h3render.comfy_bridge.client import Bridge, BridgeSettings
from h3render.queue import workers


def test_no_worker_then_a_live_one_then_a_silent_one(env, redis_conn, h3_settings):
    assert workers.workers(redis_conn, h3_settings) == []
    assert not workers.any_worker_alive(redis_conn, h3_settings)
    p = start_worker(env)  # not burst: it idles, heartbeating every gate poll (1 s here)
    try:
        wait_for(lambda: workers.any_worker_alive(redis_conn, h3_settings), 60, "a live worker")
        # rq registers a worker before it installs its signal handlers; once idle (dequeuing)
        # a SIGTERM is a clean stop, so the deregistration below is checkable
        wait_for(lambda: [w.state for w in workers.workers(redis_conn, h3_settings)] == ["idle"], 60, "idle")
        (w,) = workers.live_workers(redis_conn, h3_settings)
        assert w.hostname == socket.gethostname() and w.pid == p.pid
        assert 0 <= w.age_s <= workers.DEFAULT_SILENCE_S and w.to_dict()["name"] == w.name
        # the ComfyUI bridge asks the same function
        assert Bridge(redis_conn, h3_settings, BridgeSettings()).live_workers() == [w.name]
        # silent for longer than silence_s (as a SIGKILLed worker would be): registered, not alive
        later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=workers.DEFAULT_SILENCE_S + 60)
        assert [x.name for x in workers.workers(redis_conn, h3_settings, now=later)] == [w.name]
        assert workers.live_workers(redis_conn, h3_settings, now=later) == []
        assert workers.live_workers(redis_conn, h3_settings, silence_s=1e9, now=later) != []
    finally:
        t0 = time.monotonic()
        out = stop(p)
    # a worker that stopped cleanly deregisters itself
    assert p.returncode == 0, f"worker exit {p.returncode} after {time.monotonic() - t0:.1f} s:\n{out}"
    assert not workers.workers(redis_conn, h3_settings), out
    assert not workers.any_worker_alive(redis_conn, h3_settings)
    assert os.environ.get("H3RENDER_REDIS_URL") == h3_settings.redis_url  # this test's Redis, not 6379
