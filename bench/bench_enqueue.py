"""Benchmark: enqueue a 10,000-job sweep in one Redis pipeline.

    python bench/bench_enqueue.py [--jobs 10000] [--url redis://...]

Without --url it starts a private redis-server (AOF on, as in production) on a
free port in a temp dir and stops it afterwards. It times the two halves of
`h3render sweep` separately: planning (validate, resolve, estimate every job)
and the enqueue itself (one MULTI/EXEC), counts the EXEC calls Redis served to
prove there was one, and checks every job is on the queue.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from h3render.queue.engine_info import publish_engine_info  # noqa: E402
from h3render.queue.enqueue import enqueue_planned, plan, queue  # noqa: E402
from h3render.queue.job import new_sweep_id  # noqa: E402
from h3render.queue.redis_server import EmbeddedRedis  # noqa: E402
from h3render.queue.sweep import expand  # noqa: E402
from h3render.settings import Settings  # noqa: E402

# The limits of the tiny Wan model, as a worker publishes them.
TINY_INFO = {
    "quant_levels": ["f32", "f16", "q8_0", "q4_0"],
    "size_multiple": 16,
    "frame_rule": {"multiple": 4, "offset": 1},
    "max_pixels": 0,
    "defaults": {"width": 64, "height": 48, "frames": 5, "steps": 4, "quant": "f16"},
    "vae_stride": [4, 8, 8],
    "patch_size": [1, 2, 2],
    "fps": 16,
}


def exec_calls(r) -> int:
    return int((r.info("commandstats").get("cmdstat_exec") or {}).get("calls", 0))


def run(r, settings: Settings, n_jobs: int) -> dict:
    """Plan and enqueue an n_jobs sweep (seeds 1..n over two quant levels); measured figures."""
    publish_engine_info(r, "tiny-wan", TINY_INFO)
    axes = {"quant": ["q8_0", "q4_0"], "seed": list(range(1, n_jobs // 2 + 1))}
    before_len = queue(r, settings).count
    t0 = time.perf_counter()
    planned = plan(r, expand({"prompt": "a red fox in snow"}, axes), settings)
    t1 = time.perf_counter()
    execs = exec_calls(r)
    res = enqueue_planned(r, planned, settings, sweep_id=new_sweep_id(), sweep_record={"axes": axes})
    t2 = time.perf_counter()
    execs = exec_calls(r) - execs
    return {
        "jobs": len(res.job_ids),
        "plan_s": round(t1 - t0, 3),
        "enqueue_s": round(t2 - t1, 3),
        "jobs_per_s": round(len(res.job_ids) / (t2 - t1), 1),
        "exec_calls": execs,
        "queued": queue(r, settings).count - before_len,
        "used_memory_human": r.info("memory").get("used_memory_human"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--url", default=None, help="use this Redis (its queue 'h3render-bench' is emptied)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = None
        if args.url:
            settings = Settings(redis_url=args.url, home=Path(tmp), queue_name="h3render-bench")
            import redis

            r = redis.Redis.from_url(args.url)
        else:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            server = EmbeddedRedis(Path(tmp) / "redis", port)
            r = server.start()
            settings = Settings(redis_url=server.url(), home=Path(tmp))
        try:
            queue(r, settings).empty()
            figures = run(r, settings, args.jobs)
        finally:
            if server is not None:
                server.stop()
    print(json.dumps(figures, indent=1))
    ok = figures["queued"] == figures["jobs"] == args.jobs // 2 * 2 and figures["exec_calls"] == 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
