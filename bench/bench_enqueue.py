"""Benchmark: enqueue a 10,000-job sweep in one Redis pipeline, and what fsyncing the AOF costs.

    python bench/bench_enqueue.py [--jobs 10000] [--url redis://...]
    python bench/bench_enqueue.py --fsync [--rounds 5] [--singles 200] [--sweep 1000] [--dir DIR]

Without --url it starts a private redis-server (AOF on, as in production) on a
free port in a temp dir and stops it afterwards. It times the two halves of
`h3render sweep` separately: planning (validate, resolve, estimate every job)
and the enqueue itself (one MULTI/EXEC), counts the EXEC calls Redis served to
prove there was one, and checks every job is on the queue.

--fsync compares the AOF fsync policies on one server and one disk (--dir, default
a temp dir; its filesystem is printed, since an fsync on tmpfs costs nothing):
`appendfsync everysec` (Redis replies before the fsync) and `always` (the embedded
server's: it fsyncs before it replies). Each round runs both, in alternating order,
switched with CONFIG SET on the same server; each run times --singles one-job
enqueues (the whole `enqueue` path: plan, durability probe, EXEC, confirm) and
the enqueue of a planned --sweep-job sweep (planning excluded: it does not touch
the disk). The table shows the median and the range over the rounds.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from h3render.queue.engine_info import publish_engine_info  # noqa: E402
from h3render.queue.enqueue import enqueue, enqueue_planned, plan, queue  # noqa: E402
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


def fsync_run(r, settings: Settings, policy: str, singles: int, sweep: int) -> dict:
    """One run at `policy`: singles one-job enqueues, then the enqueue of a planned sweep."""
    r.config_set("appendfsync", policy)
    r.flushdb()
    publish_engine_info(r, "tiny-wan", TINY_INFO)
    t0 = time.perf_counter()
    for i in range(singles):
        enqueue(r, {"prompt": f"job {i}", "model": "tiny-wan"}, settings)
    t1 = time.perf_counter()
    planned = plan(r, expand({"prompt": "a red fox in snow", "model": "tiny-wan"}, {"seed": list(range(sweep))}),
                   settings)
    t2 = time.perf_counter()
    enqueue_planned(r, planned, settings, sweep_id=new_sweep_id(), sweep_record={})
    t3 = time.perf_counter()
    assert queue(r, settings).count == singles + sweep
    return {"per_s": singles / (t1 - t0), "sweep_s": t3 - t2}


def filesystem_of(path: Path) -> str:
    """'<fstype> at <mount point>' of the filesystem holding path (Linux /proc/mounts), else '?'."""
    best = ("", "?")
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            _dev, mnt, fstype, *_ = line.split()
            if str(path.resolve()).startswith(mnt.rstrip("/") + "/") and len(mnt) > len(best[0]):
                best = (mnt, fstype)
    except OSError:
        return "?"
    return f"{best[1]} at {best[0]}"


def spread(values: list[float], fmt: str) -> str:
    return f"{format(statistics.median(values), fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def fsync_table(server: EmbeddedRedis, r, settings: Settings, rounds: int, singles: int, sweep: int) -> list[str]:
    runs: dict[str, list[dict]] = {"everysec": [], "always": []}
    for k in range(rounds):
        for policy in (("everysec", "always") if k % 2 == 0 else ("always", "everysec")):
            runs[policy].append(fsync_run(r, settings, policy, singles, sweep))
    r.config_set("appendfsync", "always")
    lines = [f"AOF in {server.dir} ({filesystem_of(server.dir)}); {rounds} alternating rounds, "
             "median (min-max)", "",
             f"| appendfsync | one-job enqueues/s | sweep of {sweep}: enqueue s |", "| --- | ---: | ---: |"]
    for policy, rs in runs.items():
        lines.append(f"| {policy} | {spread([x['per_s'] for x in rs], '.0f')} | "
                     f"{spread([x['sweep_s'] for x in rs], '.3f')} |")
    ratio_e = statistics.median(x["per_s"] for x in runs["always"]) / statistics.median(x["per_s"] for x in runs["everysec"])
    ratio_s = statistics.median(x["sweep_s"] for x in runs["always"]) / statistics.median(x["sweep_s"] for x in runs["everysec"])
    lines.append(f"| always / everysec | {ratio_e:.2f}x | {ratio_s:.2f}x |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--url", default=None, help="use this Redis (its queue 'h3render-bench' is emptied)")
    ap.add_argument("--fsync", action="store_true", help="compare appendfsync everysec and always instead")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--singles", type=int, default=200, help="one-job enqueues per --fsync run")
    ap.add_argument("--sweep", type=int, default=1000, help="jobs of the sweep per --fsync run")
    ap.add_argument("--dir", default=None, help="parent of the --fsync server's directory (its disk is measured)")
    args = ap.parse_args()
    if args.fsync:
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            server = EmbeddedRedis(Path(tmp) / "redis", port)
            r = server.start()
            settings = Settings(redis_url=server.url(), home=Path(tmp), queue_name="h3render-bench")
            try:
                lines = fsync_table(server, r, settings, args.rounds, args.singles, args.sweep)
            finally:
                server.stop(hard=True)
        print("\n".join(lines))
        return 0
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
