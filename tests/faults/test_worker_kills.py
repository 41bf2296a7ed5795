"""kill -9 at random steps: of the render process, 10 times, and of the worker, 10 times, in one sweep.

The test is the supervisor: it runs one worker, watches the job in flight, and at a
random denoising step SIGKILLs either that job's render process or the worker itself
(then starts a new worker, as a service manager would). Each job is killed at most
twice (its retry budget is 3). Afterwards every job of the sweep must have finished,
exactly one attempt of each must have reached "finished" (a killed attempt that was
retried is not a duplicate), each job folder holds video.mp4, poster.png and meta.json
only, and no temporary or staging file is left anywhere under renders/.

About 100 s on 2 cores (20 jobs of 120 steps, 20 kills, 10 worker starts).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from rq.job import JobStatus

from faults.harness import CLI, SMALL, clean_env, fetch, h3meta, kill_group, temp_files, wait_for
from h3render.procs import pid_alive
from h3render.queue.enqueue import enqueue_sweep

pytestmark = pytest.mark.slow

KILLS_EACH = 10
JOBS = 20
STEPS = 120  # ~1.5 s of denoising: time to be killed mid-denoise


def start_logged_worker(env: dict, log: Path) -> subprocess.Popen:
    """`h3render worker` writing to a file (a killed worker's pipe would need draining)."""
    f = open(log, "a")
    p = subprocess.Popen([sys.executable, "-c", CLI, "worker"], env=clean_env(env), stdout=f,
                         stderr=subprocess.STDOUT, start_new_session=True)
    f.close()
    return p


def running(r) -> tuple[str, dict] | None:
    """(job id, meta) of the job a render process is denoising now."""
    for entry in r.zrange("rq:wip:h3render", 0, -1):
        jid = entry.decode().split(":")[0]
        m = h3meta(r, jid)
        if m.get("state") == "denoising" and m.get("pid") and pid_alive(int(m["pid"])):
            return jid, m
    return None


def all_ended(r, ids) -> bool:
    return all(fetch(r, j).get_status() in (JobStatus.FINISHED, JobStatus.FAILED) for j in ids)


def dump(r, ids) -> str:
    """Where every job is, for a failure message."""
    lines = [f"queue {r.lrange('rq:queue:h3render', 0, -1)} intermediate "
             f"{r.lrange('rq:queue:h3render:intermediate', 0, -1)} wip {r.zrange('rq:wip:h3render', 0, -1)} "
             f"scheduled {r.zrange('rq:scheduled:h3render', 0, -1, withscores=True)} now {time.time():.0f}"]
    for j in ids:
        m = h3meta(r, j)
        lines.append(f"{j} {fetch(r, j).get_status()} {m.get('state')} attempt {m.get('attempt')} "
                     f"step {m.get('step')} {m.get('error')}")
    return "\n".join(lines)


def test_kill_9_worker_and_render_at_random_steps(worker_env, redis_conn, h3_settings, tmp_path,
                                                  fault_table):
    r = redis_conn
    seed = int(os.environ.get("H3RENDER_KILLS_SEED", time.time()))
    rng = random.Random(seed)
    settings = h3_settings.model_copy(update={"retry_max": 3, "retry_intervals_s": [1, 1, 1]})
    res = enqueue_sweep(r, dict(SMALL, steps=STEPS), {"seed": list(range(JOBS))}, settings)
    ids = list(res.job_ids)
    plan = ["render"] * KILLS_EACH + ["worker"] * KILLS_EACH
    rng.shuffle(plan)
    log = tmp_path / "workers.log"
    worker = start_logged_worker(worker_env, log)
    killed: dict[str, list[str]] = {"render": [], "worker": []}
    per_job: Counter = Counter()
    deadline = time.time() + 300
    try:
        while plan and time.time() < deadline:
            got = wait_for(lambda: running(r) or all_ended(r, ids), 60, "a job denoising",
                           every=0.02)
            if got is True:  # a busy machine missed its moments: more jobs to kill, not fewer kills
                ids += enqueue_sweep(r, dict(SMALL, steps=STEPS), {"seed": list(range(100, 105))},
                                     settings).job_ids
                continue
            jid, m = got
            if per_job[jid] >= 2:  # within its retry budget; let this one finish
                wait_for(lambda: (running(r) or ("", {}))[0] != jid, 60, "the next job")
                continue
            target, attempt = rng.randint(2, STEPS - 2), m.get("attempt")
            try:
                m = wait_for(lambda: (lambda x: x if (x.get("step") or 0) >= target
                                      or x.get("attempt") != attempt else None)(h3meta(r, jid)),
                             30, f"step {target}", every=0.01)
            except AssertionError:
                continue
            if m.get("attempt") != attempt or m.get("state") != "denoising":
                continue  # that attempt ended meanwhile
            what = plan.pop()
            per_job[jid] += 1
            killed[what].append(f"{jid}@{m.get('step')}")
            if what == "render":
                os.kill(int(m["pid"]), signal.SIGKILL)
            else:
                os.kill(worker.pid, signal.SIGKILL)  # the worker; its scheduler follows it
                worker.wait(timeout=10)
                worker = start_logged_worker(worker_env, log)  # the service manager's restart
        wait_for(lambda: all_ended(r, ids), 180, "every job of the sweep ended")
    except AssertionError:
        print(dump(r, ids))
        raise
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                kill_group(worker.pid)
                worker.wait()
    out = log.read_text()
    assert not plan, (f"only {2 * KILLS_EACH - len(plan)} kills done (seed {seed})", out[-3000:])

    renders = Path(h3_settings.renders_dir())
    finished_once, lost, twice = {}, [], []
    for j in ids:
        job = fetch(r, j)
        done = [x for x in job.results() if x.type.name == "SUCCESSFUL"]
        folder = renders / (job.meta.get("h3r") or {}).get("sweep_id", res.sweep_id) / j
        whole = folder.is_dir() and {p.name for p in folder.iterdir()} == {"video.mp4", "poster.png",
                                                                           "meta.json"}
        if job.get_status() != JobStatus.FINISHED or not whole:
            lost.append((j, job.get_status(), (job.meta.get("h3r") or {}).get("error")))
        if len(done) > 1:
            twice.append((j, len(done)))
        finished_once[j] = job.get_status() == JobStatus.FINISHED and len(done) == 1 and whole
    leftovers = temp_files(renders)
    clean = not leftovers
    rows = []
    for what in ("render", "worker"):
        jobs = [k.split("@")[0] for k in killed[what]]
        rows.append(fault_table(
            "kills", f"kill -9 of the {'render process' if what == 'render' else 'worker'} at a random step",
            tried=len(jobs), held=sum(finished_once[j] and clean for j in jobs), lost=len(lost),
            bound="0 lost, 0 run twice, 0 temp files",
            note=f"{len(ids)} jobs of {STEPS} steps, seed {seed}; steps " +
                 ", ".join(k.split("@")[1] for k in killed[what])))
    assert not lost and not twice and not leftovers, (lost, twice, leftovers, out[-3000:])
    assert all(row.ok for row in rows), rows
