"""Benchmark: `h3render status <sweep>`, the sweep page and its polling, for a 10,000-job sweep.

    python bench/bench_status.py [--jobs 10000] [--rounds 5] [--other-tree DIR]

Starts a private redis-server (AOF on, as in production) on a free port in a temp dir,
enqueues one sweep through enqueue_planned (seed x steps), and moves part of it on as
workers would leave it in Redis: 3,000 finished, 100 failed, 5 running (their worker
gone, so shown abandoned); the rest queued. Then, in alternating rounds, it times

    status             `h3render status <sweep>` (summary and 50 rows), in this process
    status --json      the same as JSON
    status --all       every row (a table of all jobs)
    status (process)   `h3render status <sweep>` as a new process, interpreter start included
    page               GET /sweeps/<id> (a window of at most 200 cells)
    poll since         GET /api/sweeps/<id>.json?since=T after 20 jobs changed
    poll full          GET /api/sweeps/<id>.json (every job: the page's first load never asks it)
    old status rows    rq's Job.fetch_many of every job, as status read a sweep before
    stale index        the first read after rq moved 1,000 jobs behind the index's back
    legacy sweep       the first read of a sweep enqueued before the index (built once)

and prints the median and spread (min-max) of each. --other-tree DIR also times
`h3render status <sweep>` as a process with DIR (another checkout, e.g. `git archive`
of an older commit) first on the path, against the same Redis. Nothing is asserted on time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from click.testing import CliRunner  # noqa: E402
from rq.job import Job  # noqa: E402
from rq.registry import FailedJobRegistry, FinishedJobRegistry, StartedJobRegistry  # noqa: E402
from rq.serializers import JSONSerializer  # noqa: E402
from rq.utils import now as rq_now, utcformat  # noqa: E402

from bench_enqueue import TINY_INFO  # noqa: E402
from h3render.keys import SWEEP_CHANGED_KEY, SWEEP_FACTS_KEY, SWEEP_STATES_KEY  # noqa: E402
from h3render.queue import jobstate, sweepstatus  # noqa: E402
from h3render.queue.engine_info import publish_engine_info  # noqa: E402
from h3render.queue.enqueue import enqueue_planned, plan, queue  # noqa: E402
from h3render.queue.job import new_sweep_id  # noqa: E402
from h3render.queue.redis_server import EmbeddedRedis  # noqa: E402
from h3render.queue.sweep import expand  # noqa: E402
from h3render.settings import Settings  # noqa: E402

CLI = "import sys; from h3render.cli import main; sys.argv[0] = 'h3render'; main()"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def enqueue_sweep(r, settings: Settings, n_jobs: int) -> tuple[str, list[str]]:
    publish_engine_info(r, "tiny-wan", TINY_INFO)
    side = max(1, int(n_jobs ** 0.5))
    axes = {"seed": list(range(1, side + 1)), "steps": list(range(1, n_jobs // side + 1))}
    planned = plan(r, expand({"prompt": "a red fox in snow", "model": "tiny-wan"}, axes), settings)
    sweep_id = new_sweep_id()
    res = enqueue_planned(r, planned, settings, sweep_id=sweep_id, sweep_record={"axes": axes, "fixed": {
        "prompt": "a red fox in snow", "model": "tiny-wan"}})
    return sweep_id, res.job_ids


def advance(r, settings: Settings, sweep_id: str, ids: list[str], how: str, index: bool = True) -> None:
    """Leave these jobs in Redis as a worker would: finished, failed or running (worker gone).
    index=False skips the sweep index, as rq does when it moves a job on its own."""
    q = queue(r, settings)
    pipe = r.pipeline(transaction=False)
    for j in ids:
        pipe.hget(Job.key_for(j), "meta")
    metas = pipe.execute()
    t = time.time()
    stamp = utcformat(rq_now())
    pipe = r.pipeline(transaction=False)
    for j, raw in zip(ids, metas):
        meta = json.loads(raw)
        h = meta["h3r"]
        key = Job.key_for(j)
        pipe.lrem(q.key, 1, j)
        if how == "finished":
            h.update(state="finished", output_dir=f"/renders/{sweep_id}/{j}", timings={"total": 4.2})
            pipe.hset(key, mapping={"status": "finished", "ended_at": stamp, "meta": json.dumps(meta)})
            pipe.zadd(FinishedJobRegistry(q.name, connection=r).key, {j: t + 86400})
        elif how == "failed":
            h.update(state="failed", output_dir=f"/renders/{sweep_id}/{j}",
                     error="EngineInternalError: crash at step 1")
            pipe.hset(key, mapping={"status": "failed", "ended_at": stamp, "meta": json.dumps(meta)})
            pipe.zadd(FailedJobRegistry(q.name, connection=r).key, {j: t + 86400})
        else:
            h.update(state="denoising", step=21, steps=200, eta_s=1.0)
            pipe.hset(key, mapping={"status": "started", "worker_name": "bench-worker-gone",
                                    "meta": json.dumps(meta), "last_heartbeat": stamp})
            pipe.zadd(StartedJobRegistry(q.name, connection=r).key, {f"{j}:e1": t + 90})
        if index:
            jobstate.record_state(pipe, sweep_id, j, h["state"], t)
    pipe.execute()


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--other-tree", type=Path, default=None, help="also time `status` of this source tree")
    args = ap.parse_args()
    most = (args.jobs - 3125) // 1040  # each round moves 1,040 more jobs on; 3,125 are moved outside rounds
    if args.jobs < 4200 or not 1 <= args.rounds <= most:
        ap.error(f"--jobs {args.jobs} allows --rounds 1 to {max(most, 0)} (at least 4200 jobs)")
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedRedis(Path(tmp) / "redis", free_port())
        (Path(tmp) / "redis").mkdir()
        r = server.start()
        try:
            return run(r, server, Path(tmp), args)
        finally:
            server.stop(hard=True)


def run(r, server: EmbeddedRedis, home: Path, args) -> int:
    from h3render.cli import cli as root
    from h3render.dashboards.app import create_app

    settings = Settings(redis_url=server.url(), home=home)
    os.environ.update(H3RENDER_REDIS_URL=server.url(), H3RENDER_HOME=str(home))
    t0 = time.perf_counter()
    sweep_id, ids = enqueue_sweep(r, settings, args.jobs)
    print(f"enqueued {len(ids)} jobs in {time.perf_counter() - t0:.1f} s")
    advance(r, settings, sweep_id, ids[:3000], "finished")
    advance(r, settings, sweep_id, ids[3000:3100], "failed")
    advance(r, settings, sweep_id, ids[3100:3105], "running")
    st = sweepstatus.sweep_state(r, sweep_id)  # builds the facts once
    print("states:", json.dumps(st.summary["states"], sort_keys=True))
    app = create_app(settings, redis_conn=r, redis_url=server.url())
    app.testing = True
    client = app.test_client()
    runner = CliRunner()
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]) + os.pathsep
               + os.environ.get("PYTHONPATH", ""))

    def cli(*a):
        res = runner.invoke(root, list(a))
        assert res.exit_code == 0, res.output
        return res.output

    def page():
        resp = client.get(f"/sweeps/{sweep_id}")
        assert resp.status_code == 200
        return resp

    since_box = {}

    def poll_since():
        resp = client.get(f"/api/sweeps/{sweep_id}.json?since={since_box['t']!r}")
        assert resp.status_code == 200
        return resp.get_json()

    def poll_full():
        resp = client.get(f"/api/sweeps/{sweep_id}.json")
        assert resp.status_code == 200
        return resp.get_json()

    def old_rows():
        from h3render.queue.status import row_from_job

        return [row_from_job(j) for j in Job.fetch_many(ids, connection=r, serializer=JSONSerializer) if j]

    def process(tree: Path | None = None):
        e = env if tree is None else dict(env, PYTHONPATH=str(tree.resolve()))
        # cwd: `python -c` puts the working directory first on the path
        p = subprocess.run([sys.executable, "-c", CLI, "status", sweep_id], env=e, capture_output=True, text=True,
                           cwd=home)
        assert p.returncode == 0, p.stderr

    cases = {
        "status": lambda: cli("status", sweep_id),
        "status --json": lambda: cli("status", sweep_id, "--json"),
        "status --all": lambda: cli("status", sweep_id, "--all"),
        "status (process)": process,
        "page": page,
        "poll since": poll_since,
        "poll full": poll_full,
        "old status rows": old_rows,
    }
    if args.other_tree:
        cases[f"status (process, {args.other_tree.name})"] = lambda: process(args.other_tree)
    times: dict[str, list[float]] = {k: [] for k in cases}
    times["stale index"], times["legacy sweep"] = [], []
    moved = 3105
    for k in range(args.rounds):
        # 20 jobs change state through the index before each poll
        since_box["t"] = time.time() - 1e-3
        advance(r, settings, sweep_id, ids[moved:moved + 20], "finished")
        moved += 20
        order = list(cases) if k % 2 == 0 else list(cases)[::-1]
        for name in order:
            if name == "poll since":
                since_box["t"] = time.time()
                advance(r, settings, sweep_id, ids[moved:moved + 20], "finished")
                moved += 20
            times[name].append(timed(cases[name]))
        # rq moves 1,000 jobs on without the index: the next read finds and corrects them
        advance(r, settings, sweep_id, ids[moved:moved + 1000], "finished", index=False)
        moved += 1000
        times["stale index"].append(timed(lambda: sweepstatus.sweep_state(r, sweep_id)))
        # the same sweep as if enqueued before the index and the facts existed
        r.delete(SWEEP_STATES_KEY.format(id=sweep_id), SWEEP_CHANGED_KEY.format(id=sweep_id),
                 SWEEP_FACTS_KEY.format(id=sweep_id))
        times["legacy sweep"].append(timed(lambda: sweepstatus.sweep_state(r, sweep_id)))
    since_box["t"] = time.time()
    advance(r, settings, sweep_id, ids[moved:moved + 20], "finished")
    doc = poll_since()
    assert len(doc["jobs"]) == 20 and len(doc["live"]) == 5, (len(doc["jobs"]), len(doc["live"]))
    st = sweepstatus.sweep_state(r, sweep_id)
    assert st.summary["jobs"] == len(ids) and st.summary["states"].get("abandoned") == 5, st.summary
    print(f"\n{cpu_model()}; Python {platform.python_version()}; redis-server {r.info()['redis_version']}; "
          f"{len(ids)} jobs, {args.rounds} alternating rounds, seconds: median (min-max)\n")
    print("| case | s |\n| --- | ---: |")
    for name, vs in times.items():
        print(f"| {name} | {spread(vs)} |")
    r.config_resetstat()  # what one read of the index costs Redis itself (it blocks other clients)
    for _ in range(5):
        sweepstatus.sweep_state(r, sweep_id)
    script_ms = r.info("commandstats")["cmdstat_evalsha"]["usec_per_call"] / 1000
    print(f"\nthe index read's script: {script_ms:.1f} ms of Redis time per status or poll")
    page_html = page().get_data(as_text=True)
    print(f"page: {page_html.count('data-job-id=')} cells, {len(page_html) // 1024} KiB; poll since: "
          f"{len(doc['jobs'])} changed + {len(doc['live'])} live rows; final counts "
          f"{json.dumps(st.summary['states'], sort_keys=True)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
